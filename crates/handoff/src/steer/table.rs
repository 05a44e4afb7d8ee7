//! A host's steering table with its set-up and tear-down, and the account of which
//! connection owns each entry.
//!
//! The switch steers the flows it handed off; in cooperative mode across hosts the *entry*
//! node (the node the layer-4 director delivers a client's packets to) steers a flow it
//! cloned to the request's owner until the owner gives the connection back (seed 000 §3.1,
//! socket cloning, with the client's packets arriving at the original node). Both want the
//! same thing: the eBPF backend where it can be set up, nftables otherwise, one entry per
//! 4-tuple that only the connection that installed it may remove (a delayed removal must not
//! take the entry of a newer connection on the same 4-tuple), and the whole set-up removed
//! when the table goes.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Deserialize;

use super::{ebpf, neighbour_mac, nft, Flow, Steering, Target};
use crate::error::{HandoffError, Result};

/// Which backend a steering table uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// tc/eBPF (needs clang and bpftool at set-up); falls back to nftables when it cannot be
    /// set up.
    #[default]
    Ebpf,
    /// An nftables netdev ingress map with `fwd`.
    Nftables,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ebpf" => Ok(Backend::Ebpf),
            "nftables" => Ok(Backend::Nftables),
            _ => Err(format!("steering backend `{s}`: want ebpf or nftables")),
        }
    }
}

/// A steering table on one interface of the calling thread's network namespace.
pub struct Table {
    steering: Arc<dyn Steering>,
    /// The connection that owns each live entry.
    owners: Mutex<HashMap<Flow, u64>>,
    teardown: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("kind", &self.steering.kind())
            .field("live", &self.steering.live())
            .finish()
    }
}

impl Table {
    /// Sets up `backend` on `iface` (an eBPF set-up that fails falls back to nftables);
    /// `instance` keeps the pins and tables of several tables on one machine apart.
    pub fn setup(backend: Backend, iface: &str, instance: &str) -> Result<Table> {
        let tag: String = instance
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let nft = || -> Result<Table> {
            let s = nft::NftSteering::setup(None, iface, &tag)?;
            let tag = tag.clone();
            Ok(Table::with(
                Arc::new(s),
                Box::new(move || nft::NftSteering::teardown(None, &tag)),
            ))
        };
        match backend {
            Backend::Nftables => nft(),
            Backend::Ebpf => {
                let cfg = ebpf::EbpfConfig::new(iface, &tag);
                match ebpf::EbpfSteering::setup(&cfg, None) {
                    Ok(s) => {
                        let (iface, pins) = (iface.to_owned(), cfg.pin_dir.clone());
                        Ok(Table::with(
                            Arc::new(s),
                            Box::new(move || ebpf::EbpfSteering::teardown(None, &iface, &pins)),
                        ))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, iface, "eBPF steering unavailable; trying nftables");
                        nft().map_err(|n| HandoffError::Other(format!("eBPF: {e}; nftables: {n}")))
                    }
                }
            }
        }
    }

    /// A table over an existing backend, with what removes it.
    pub fn with(steering: Arc<dyn Steering>, teardown: Box<dyn FnOnce() + Send>) -> Table {
        Table {
            steering,
            owners: Mutex::new(HashMap::new()),
            teardown: Mutex::new(Some(teardown)),
        }
    }

    /// Sends `flow`'s packets to `to` on behalf of connection `id` (replacing any entry).
    pub fn steer(&self, flow: &Flow, to: &Target, id: u64) -> Result<()> {
        let mut owners = self.owners.lock();
        self.steering.insert(flow, to)?;
        owners.insert(*flow, id);
        Ok(())
    }

    /// Removes `flow`'s entry if connection `id` still owns it; `true` when it did.
    pub fn unsteer(&self, flow: &Flow, id: u64) -> bool {
        let mut owners = self.owners.lock();
        if owners.get(flow) != Some(&id) {
            return false;
        }
        owners.remove(flow);
        if let Err(e) = self.steering.remove(flow) {
            tracing::warn!(error = %e, "steering remove failed");
        }
        true
    }

    /// Entries live now.
    pub fn live(&self) -> usize {
        self.steering.live()
    }

    /// The backend's name.
    pub fn kind(&self) -> &'static str {
        self.steering.kind()
    }

    /// Removes the set-up now (also done when the table drops).
    pub fn shutdown(&self) {
        if let Some(t) = self.teardown.lock().take() {
            t();
        }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Where packets for the host at `ip` go: its address and, from this namespace's neighbour
/// table, its MAC address (known once a connection to it has exchanged packets).
pub fn target_of(ip: Ipv4Addr) -> Option<Target> {
    neighbour_mac(ip).map(|mac| Target { ip, mac })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A backend that only counts.
    #[derive(Default)]
    struct Counting {
        live: Mutex<HashMap<Flow, Target>>,
        removed: AtomicUsize,
    }

    impl Steering for Counting {
        fn insert(&self, flow: &Flow, to: &Target) -> Result<()> {
            self.live.lock().insert(*flow, *to);
            Ok(())
        }
        fn remove(&self, flow: &Flow) -> Result<bool> {
            self.removed.fetch_add(1, Ordering::Relaxed);
            Ok(self.live.lock().remove(flow).is_some())
        }
        fn live(&self) -> usize {
            self.live.lock().len()
        }
        fn kind(&self) -> &'static str {
            "counting"
        }
    }

    #[test]
    fn only_the_owning_connection_removes_an_entry() {
        let backend = Arc::new(Counting::default());
        let torn = Arc::new(AtomicUsize::new(0));
        let t2 = torn.clone();
        let table = Table::with(
            backend.clone(),
            Box::new(move || {
                t2.fetch_add(1, Ordering::Relaxed);
            }),
        );
        let flow = Flow::new(
            "10.0.0.1:4000".parse().unwrap(),
            "10.0.0.100:80".parse().unwrap(),
        )
        .unwrap();
        let to = Target {
            ip: "10.0.0.12".parse().unwrap(),
            mac: [2, 0, 0, 0, 0, 12],
        };
        table.steer(&flow, &to, 1).unwrap();
        // A newer connection on the same 4-tuple takes the entry over.
        table.steer(&flow, &to, 2).unwrap();
        assert!(!table.unsteer(&flow, 1), "a stale removal is ignored");
        assert_eq!(table.live(), 1);
        assert!(table.unsteer(&flow, 2));
        assert_eq!(table.live(), 0);
        assert!(!table.unsteer(&flow, 2));
        assert_eq!(backend.removed.load(Ordering::Relaxed), 1);
        drop(table);
        assert_eq!(
            torn.load(Ordering::Relaxed),
            1,
            "dropping the table tears it down"
        );
    }

    #[test]
    fn backends_parse() {
        assert_eq!("ebpf".parse::<Backend>(), Ok(Backend::Ebpf));
        assert_eq!("nftables".parse::<Backend>(), Ok(Backend::Nftables));
        assert!("ipvs".parse::<Backend>().is_err());
    }
}
