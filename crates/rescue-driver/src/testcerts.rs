//! Certificates made at run time for tests (feature `test-certs`): an authority and the
//! identities it issues, so that no private key is ever stored in the repository.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::TlsIdentity;

/// A certificate authority for peers.
pub struct TestCa {
    cert: Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new authority named `name`.
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("key generation");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = p.self_signed(&key).expect("self-signed authority");
        TestCa { cert, key }
    }

    /// The authority's certificate.
    pub fn cert(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// An identity for the peer `name` (a DNS subject alternative name), trusting this
    /// authority for its peers.
    pub fn identity(&self, name: &str) -> TlsIdentity {
        self.identity_trusting(name, &[self])
    }

    /// An identity for `name` issued by this authority, trusting the authorities `trust`.
    pub fn identity_trusting(&self, name: &str, trust: &[&TestCa]) -> TlsIdentity {
        let key = KeyPair::generate().expect("key generation");
        let cert = self.issue(name, &key);
        TlsIdentity {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            ca: trust.iter().map(|c| c.cert()).collect(),
        }
    }

    /// The authority's certificate as PEM.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes an identity for `name` (trusting this authority) as PEM files `<name>.crt`,
    /// `<name>.key` and `ca.crt` in `dir`; returns their paths.
    pub fn write_identity(
        &self,
        name: &str,
        dir: &std::path::Path,
    ) -> std::io::Result<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)> {
        let key = KeyPair::generate().expect("key generation");
        let cert = self.issue(name, &key);
        let (c, k, a) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
            dir.join("ca.crt"),
        );
        std::fs::write(&c, cert.pem())?;
        std::fs::write(&k, key.serialize_pem())?;
        std::fs::write(&a, self.cert_pem())?;
        Ok((c, k, a))
    }

    fn issue(&self, name: &str, key: &KeyPair) -> Certificate {
        let mut p = CertificateParams::new(vec![name.to_string()]).expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.signed_by(key, &self.cert, &self.key)
            .expect("issued certificate")
    }
}
