//! Mutual TLS between rescue peers (rustls with the *ring* provider): both sides present a
//! certificate chaining to the configured authorities, and a connection is accepted only from
//! a certificate that names (DNS subject alternative name) a configured peer. An outgoing
//! connection verifies that the server's certificate names the peer it dials.

use std::path::Path;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use switchyard_rescue::{PeerConfig, PeerId, PeeringConfig};

use crate::DriverError;

/// A server's TLS identity and the authorities it trusts for peers.
#[derive(Debug)]
pub struct TlsIdentity {
    /// Its certificate chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
    /// The issuers of peers' certificates.
    pub ca: Vec<CertificateDer<'static>>,
}

impl Clone for TlsIdentity {
    fn clone(&self) -> Self {
        TlsIdentity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            ca: self.ca.clone(),
        }
    }
}

fn pem_err(path: &Path, e: impl std::fmt::Display) -> DriverError {
    DriverError::Tls(format!("{}: {e}", path.display()))
}

impl TlsIdentity {
    /// Reads the PEM files named by `[rescue.peering]`.
    pub fn from_files(p: &PeeringConfig) -> Result<TlsIdentity, DriverError> {
        let certs = |path: &Path| -> Result<Vec<CertificateDer<'static>>, DriverError> {
            let v = CertificateDer::pem_file_iter(path)
                .map_err(|e| pem_err(path, e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pem_err(path, e))?;
            if v.is_empty() {
                return Err(pem_err(path, "no certificate in the file"));
            }
            Ok(v)
        };
        let key = PrivateKeyDer::from_pem_file(&p.key).map_err(|e| pem_err(&p.key, e))?;
        Ok(TlsIdentity {
            chain: certs(&p.cert)?,
            key,
            ca: certs(&p.ca)?,
        })
    }

    fn roots(&self) -> Result<RootCertStore, DriverError> {
        let mut roots = RootCertStore::empty();
        for c in &self.ca {
            roots
                .add(c.clone())
                .map_err(|e| DriverError::Tls(format!("peer authority: {e}")))?;
        }
        Ok(roots)
    }

    /// The configurations of both ends: the server requires a client certificate from the
    /// authorities; the client presents this identity.
    pub(crate) fn configs(&self) -> Result<(Arc<ServerConfig>, Arc<ClientConfig>), DriverError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = Arc::new(self.roots()?);
        let tls = |e: rustls::Error| DriverError::Tls(e.to_string());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| DriverError::Tls(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(tls)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(tls)?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls)?
            .with_root_certificates(roots)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(tls)?;
        Ok((Arc::new(server), Arc::new(client)))
    }
}

/// The configured peer a verified client certificate names, if any. (The chain has already
/// been verified against the authorities by the handshake.)
pub(crate) fn identify(leaf: &CertificateDer<'_>, peers: &[PeerConfig]) -> Option<PeerId> {
    let cert = webpki::EndEntityCert::try_from(leaf).ok()?;
    peers.iter().enumerate().find_map(|(i, p)| {
        let name = ServerName::try_from(p.name.as_str()).ok()?;
        cert.verify_is_valid_for_subject_name(&name)
            .ok()
            .map(|_| PeerId(i as u32))
    })
}
