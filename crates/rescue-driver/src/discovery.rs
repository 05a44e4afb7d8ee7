//! The service registry and DNS round robin behind the driver's [`Candidates`] and
//! [`Directory`] (seed 001 §4.2, §4.5), from `[rescue.registry]` and `[rescue.dns]`.
//!
//! * Candidates: the registry's last search, largest free capacity first, mapped onto the
//!   configured peers by name (a registration's URL host is the site's server name, which is
//!   the name its certificate carries). The registry only says who has capacity and how much;
//!   a site it lists that is not a configured peer is left out, so nobody becomes a peer by
//!   writing to etcd, and every connection is still authenticated by mutual TLS.
//! * Directory: every action goes to [`RescueHook::on_action`]: `Advertise` re-registers
//!   d_free (at once when it changed beyond the threshold, §4.5), `RescuerAdded` and
//!   `RescuerEnded` add and remove the rescue server's address in the round robin of this
//!   site's name, `OriginAdded` adds the A record of the virtual host name it hands out.
//!   The driver calls [`Directory::vhost_expired`] when the virtual host table lets an
//!   expired origin's name go, and its A record is removed then.
//!
//! etcd or the DNS server being unreachable never stops the driver: the registry keeps its
//! last candidates and retries, DNS updates are queued and retried (see `switchyard-registry`).

use parking_lot::Mutex;
use switchyard_registry::{
    DnsMetrics, DnsUpdater, Registry, RegistryMetrics, RescueHook, Site, Snapshot,
};
use switchyard_rescue::{Action, Candidate, PeerConfig, PeerId, RescueConfig};

use crate::{Candidates, Directory, DriverError, LogDirectory};

/// The counters of the registry client and the DNS updater, for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct DiscoveryMetrics {
    /// `rescue_registry_*`.
    pub registry: RegistryMetrics,
    /// `rescue_dns_*`.
    pub dns: DnsMetrics,
}

/// The registry and DNS of one site: its [`Candidates`] and its [`Directory`].
pub struct Discovery {
    hook: Mutex<RescueHook>,
    peers: Vec<PeerConfig>,
    has_registry: bool,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("registry", &self.has_registry)
            .finish_non_exhaustive()
    }
}

impl Discovery {
    /// Starts the registry client (registering this site with `d_free_bytes` and its rescue
    /// protocol on `port_dots` unless `[rescue.registry] port_dots` says otherwise) and the DNS
    /// updater that `cfg` configures. None when it configures neither.
    pub async fn start(
        cfg: &RescueConfig,
        peers: &[PeerConfig],
        d_free_bytes: f64,
        port_dots: u16,
        metrics: &DiscoveryMetrics,
    ) -> Result<Option<Discovery>, DriverError> {
        if cfg.registry.is_none() && cfg.dns.is_none() {
            return Ok(None);
        }
        let registry = match &cfg.registry {
            Some(r) => {
                let mut r = r.clone();
                r.port_dots = r.port_dots.or(Some(port_dots));
                let site = Site::new(cfg, &r, d_free_bytes);
                let reg = Registry::start(&r, Some(site), metrics.registry.clone())
                    .await
                    .map_err(|e| DriverError::Config(format!("[rescue.registry]: {e}")))?;
                if peers.iter().any(|p| p.d_free_kbps.is_some()) {
                    tracing::warn!(
                        "[rescue.registry] is set: the peers' d_free_kbps are ignored, candidates come from the registry"
                    );
                }
                Some(reg)
            }
            None => None,
        };
        let dns = match &cfg.dns {
            Some(d) => Some(
                DnsUpdater::start(d, metrics.dns.clone())
                    .map_err(|e| DriverError::Config(format!("[rescue.dns]: {e}")))?,
            ),
            None => None,
        };
        tracing::info!(
            registry = registry.is_some(),
            dns = dns.is_some(),
            "rescue discovery started"
        );
        let has_registry = registry.is_some();
        Ok(Some(Discovery {
            hook: Mutex::new(RescueHook::new(registry, dns, &cfg.server_name, cfg.web_ip)),
            peers: peers.to_vec(),
            has_registry,
        }))
    }

    /// Whether candidates come from the registry.
    pub fn has_registry(&self) -> bool {
        self.has_registry
    }

    /// What the registry client knows now.
    pub fn registry_snapshot(&self) -> Option<Snapshot> {
        self.hook.lock().registry().map(Registry::snapshot)
    }

    /// What the DNS updater has done.
    pub fn dns_snapshot(&self) -> Option<switchyard_registry::DnsSnapshot> {
        self.hook.lock().dns().map(DnsUpdater::snapshot)
    }

    /// Stops the registry client and withdraws the registration at once (without this, it
    /// expires with its lease).
    pub async fn withdraw(&self) {
        let reg = self.hook.lock().take_registry();
        if let Some(r) = reg {
            r.shutdown().await;
        }
    }

    /// The configured peer a registration belongs to.
    fn peer_of(&self, name: &str) -> Option<PeerId> {
        peer_named(&self.peers, name)
    }
}

/// The index of the peer called `name` (DNS names compare without case).
pub fn peer_named(peers: &[PeerConfig], name: &str) -> Option<PeerId> {
    let name = name.trim_end_matches('.');
    peers
        .iter()
        .position(|p| p.name.trim_end_matches('.').eq_ignore_ascii_case(name))
        .map(|i| PeerId(i as u32))
}

impl Candidates for Discovery {
    fn candidates(&self) -> Vec<Candidate> {
        let hook = self.hook.lock();
        match hook.registry() {
            Some(r) => r.core_candidates(|reg| self.peer_of(reg.name())),
            None => Vec::new(),
        }
    }
}

impl Directory for Discovery {
    fn on_action(&self, action: &Action, peer_name: Option<&str>) {
        LogDirectory.on_action(action, peer_name);
        self.hook.lock().on_action(action);
    }

    fn vhost_expired(&self, alias: &str) {
        tracing::info!(alias, "virtual host name expired: its A record goes");
        self.hook.lock().vhost_expired(alias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn peer(name: &str) -> PeerConfig {
        PeerConfig {
            name: name.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 1)),
            d_free_kbps: None,
            domain: None,
        }
    }

    #[test]
    fn registrations_map_onto_configured_peers_by_name() {
        let peers = [peer("a.test"), peer("B.test")];
        assert_eq!(peer_named(&peers, "a.test"), Some(PeerId(0)));
        assert_eq!(peer_named(&peers, "b.test."), Some(PeerId(1)));
        assert_eq!(peer_named(&peers, "stranger.test"), None);
    }
}
