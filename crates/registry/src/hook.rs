//! Carries out the rescue core's registry and DNS actions: the driver hands every
//! [`Action`] to [`RescueHook::on_action`] (the ones for peers and the redirector it handles
//! itself; they are ignored here).
//!
//! * `Advertise` → the registry's d_free.
//! * Origin: `RescuerAdded` → the rescue server's address joins the round robin of the
//!   origin's own name; `RescuerEnded` → it leaves.
//! * Rescue server: `OriginAdded` → an A record for the virtual host name, pointing at this
//!   server. `OriginEnded` keeps it: the name must go on resolving while the server redirects
//!   the expired origin's clients back (§4.1); the driver calls [`RescueHook::vhost_expired`]
//!   when the virtual host table purges the name.

use std::collections::HashMap;
use std::net::IpAddr;

use switchyard_rescue::{Action, PeerId};
use tracing::warn;

use crate::dns::{DnsUpdater, Op};
use crate::etcd::Registry;

/// A DNS change an action calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsChange {
    /// Round robin of the site's own name.
    RoundRobin(Op, IpAddr),
    /// A virtual host name of this server.
    Vhost(Op, String),
}

/// The DNS part of the mapping, without I/O: remembers which address each rescue server was
/// added with, to remove that one.
#[derive(Debug, Default)]
pub struct DnsPlan {
    rescuers: HashMap<PeerId, IpAddr>,
}

impl DnsPlan {
    /// The change `action` calls for, if any.
    pub fn on_action(&mut self, action: &Action) -> Option<DnsChange> {
        match action {
            Action::RescuerAdded { peer, grant } => {
                let old = self.rescuers.insert(*peer, grant.ip);
                if let Some(old) = old.filter(|o| *o != grant.ip) {
                    warn!(%peer, %old, new = %grant.ip, "dns: a rescue server came back with another address");
                }
                Some(DnsChange::RoundRobin(Op::Add, grant.ip))
            }
            Action::RescuerEnded { peer, .. } => self
                .rescuers
                .remove(peer)
                .map(|ip| DnsChange::RoundRobin(Op::Remove, ip)),
            Action::OriginAdded { alias, .. } => Some(DnsChange::Vhost(Op::Add, alias.clone())),
            _ => None,
        }
    }
}

/// The registry and DNS side of a rescue driver. Either part may be absent (not configured).
pub struct RescueHook {
    registry: Option<Registry>,
    dns: Option<DnsUpdater>,
    own_name: String,
    own_ip: IpAddr,
    plan: DnsPlan,
}

impl RescueHook {
    /// For the site named `own_name` (its round-robin name) whose web server is at `own_ip`.
    pub fn new(
        registry: Option<Registry>,
        dns: Option<DnsUpdater>,
        own_name: &str,
        own_ip: IpAddr,
    ) -> Self {
        RescueHook {
            registry,
            dns,
            own_name: own_name.into(),
            own_ip,
            plan: DnsPlan::default(),
        }
    }

    /// The registry, for its candidates.
    pub fn registry(&self) -> Option<&Registry> {
        self.registry.as_ref()
    }

    /// Takes the registry out (to shut it down); candidates and d_free updates stop.
    pub fn take_registry(&mut self) -> Option<Registry> {
        self.registry.take()
    }

    /// The DNS updater.
    pub fn dns(&self) -> Option<&DnsUpdater> {
        self.dns.as_ref()
    }

    /// Carries out `action`'s registry and DNS part. Never blocks: updates are queued.
    pub fn on_action(&mut self, action: &Action) {
        if let (Action::Advertise { d_free_kbps }, Some(r)) = (action, &self.registry) {
            r.set_d_free(*d_free_kbps);
        }
        let Some(change) = self.plan.on_action(action) else {
            return;
        };
        let Some(dns) = &self.dns else { return };
        let res = match &change {
            DnsChange::RoundRobin(Op::Add, ip) => dns.add_a(&self.own_name, *ip),
            DnsChange::RoundRobin(Op::Remove, ip) => dns.remove_a(&self.own_name, *ip),
            DnsChange::Vhost(Op::Add, name) => dns.add_vhost_a(name, self.own_ip),
            DnsChange::Vhost(Op::Remove, name) => dns.remove_vhost_a(name, self.own_ip),
        };
        if let Err(e) = res {
            warn!(?change, error = %e, "dns: update not queued");
        }
    }

    /// The virtual host table purged `alias`: its A record goes.
    pub fn vhost_expired(&mut self, alias: &str) {
        if let Some(dns) = &self.dns {
            if let Err(e) = dns.remove_vhost_a(alias, self.own_ip) {
                warn!(alias, error = %e, "dns: removal not queued");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_rescue::{EndReason, Grant, Sos};

    #[test]
    fn actions_map_to_dns_changes() {
        let mut p = DnsPlan::default();
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let grant = Grant {
            alias: "www-vh1.rescue.test".into(),
            ip,
            port: 8080,
            d_redi_kbps: 100,
        };
        assert_eq!(
            p.on_action(&Action::RescuerAdded {
                peer: PeerId(1),
                grant
            }),
            Some(DnsChange::RoundRobin(Op::Add, ip))
        );
        let ended = Action::RescuerEnded {
            peer: PeerId(1),
            reason: EndReason::PartialRelease,
        };
        assert_eq!(
            p.on_action(&ended),
            Some(DnsChange::RoundRobin(Op::Remove, ip))
        );
        // Ended twice, or never added: nothing to remove.
        assert_eq!(p.on_action(&ended), None);
        let origin = Sos {
            fqdn: "www.origin.test".into(),
            ip: "10.0.0.1".parse().unwrap(),
            port: 80,
            max_idle_secs: 300,
            want_kbps: None,
        };
        let added = Action::OriginAdded {
            peer: PeerId(2),
            origin,
            alias: "www-vh3.rescue.test".into(),
            d_alloc_kbps: 100.0,
        };
        assert_eq!(
            p.on_action(&added),
            Some(DnsChange::Vhost(Op::Add, "www-vh3.rescue.test".into()))
        );
        assert_eq!(p.on_action(&Action::Advertise { d_free_kbps: 1.0 }), None);
    }
}
