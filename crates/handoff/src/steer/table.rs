//! A host's steering table with its set-up and tear-down, and the account of which
//! connection owns each entry.
//!
//! The switch steers the flows it handed off; in cooperative mode across hosts the *entry*
//! node (the node the layer-4 director delivers a client's packets to) steers a flow it
//! cloned to the request's owner until the owner gives the connection back (seed 000 §3.1,
//! socket cloning, with the client's packets arriving at the original node). Both want the
//! same thing: the eBPF backend where it can be set up, nftables otherwise, one entry per
//! 4-tuple that only the connection that installed it may remove (a delayed removal must not
//! take the entry of a newer connection on the same 4-tuple), entries of ended connections
//! kept for a while and then removed together, and the whole set-up removed when the table
//! goes.
//!
//! The account ([`Ledger`]) is pure bookkeeping with time passed in; [`Table`] applies its
//! decisions to the backend. Lingering entries are removed by [`Table::expire`], which a
//! periodic task of the table's user calls with the current time: the entries due in one
//! call leave the kernel's map in one batch (`BPF_MAP_DELETE_BATCH` with the eBPF backend),
//! instead of one `bpf(2)` call per ended connection.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

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

/// Who owns each steering entry, and which entries linger until when: the decisions of a
/// [`Table`], free of I/O and clocks.
#[derive(Debug, Default)]
pub struct Ledger {
    /// The connection that owns each live entry.
    owners: HashMap<Flow, u64>,
    /// Entries of ended connections, by deadline (then by arrival, to keep equal deadlines
    /// apart): removed when their time is up if their connection still owns them.
    lingering: BTreeMap<(Instant, u64), (Flow, u64)>,
    /// Arrivals in `lingering` so far.
    seq: u64,
}

impl Ledger {
    /// Connection `id` now owns `flow`'s entry (a newer connection on a 4-tuple takes it
    /// over, and an earlier owner's removal then does nothing).
    pub fn steer(&mut self, flow: Flow, id: u64) {
        self.owners.insert(flow, id);
    }

    /// Whether connection `id` owns `flow`'s entry; if so, it is no longer in the account
    /// and the caller removes it from the backend.
    pub fn unsteer(&mut self, flow: &Flow, id: u64) -> bool {
        if self.owners.get(flow) != Some(&id) {
            return false;
        }
        self.owners.remove(flow);
        true
    }

    /// Keep `flow`'s entry until `until`, then remove it if connection `id` still owns it.
    pub fn linger(&mut self, flow: Flow, id: u64, until: Instant) {
        self.seq += 1;
        self.lingering.insert((until, self.seq), (flow, id));
    }

    /// The lingering entries whose time is up at `now` and whose connection still owns them
    /// (those are out of the account: the caller removes them from the backend). Lingering
    /// entries a newer connection took over are forgotten.
    pub fn due(&mut self, now: Instant) -> Vec<Flow> {
        let mut out = Vec::new();
        while let Some(entry) = self.lingering.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (flow, id) = entry.remove();
            if self.unsteer(&flow, id) {
                out.push(flow);
            }
        }
        out
    }

    /// The connection that owns `flow`'s entry.
    pub fn owner(&self, flow: &Flow) -> Option<u64> {
        self.owners.get(flow).copied()
    }

    /// Entries in the account.
    pub fn owned(&self) -> usize {
        self.owners.len()
    }

    /// Entries waiting for their linger time to end.
    pub fn lingering(&self) -> usize {
        self.lingering.len()
    }
}

/// A steering table on one interface of the calling thread's network namespace.
pub struct Table {
    steering: Arc<dyn Steering>,
    ledger: Mutex<Ledger>,
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
            ledger: Mutex::new(Ledger::default()),
            teardown: Mutex::new(Some(teardown)),
        }
    }

    /// Sends `flow`'s packets to `to` on behalf of connection `id` (replacing any entry).
    pub fn steer(&self, flow: &Flow, to: &Target, id: u64) -> Result<()> {
        let mut ledger = self.ledger.lock();
        self.steering.insert(flow, to)?;
        ledger.steer(*flow, id);
        Ok(())
    }

    /// Removes `flow`'s entry now if connection `id` still owns it; `true` when it did.
    pub fn unsteer(&self, flow: &Flow, id: u64) -> bool {
        // The lock is held across the removal: a newer connection's entry for the same
        // 4-tuple, installed in between, would otherwise go with it.
        let mut ledger = self.ledger.lock();
        if !ledger.unsteer(flow, id) {
            return false;
        }
        if let Err(e) = self.steering.remove(flow) {
            tracing::warn!(error = %e, "steering remove failed");
        }
        true
    }

    /// Keeps `flow`'s entry until `until` (the FIN exchange, or a taker that may still hold
    /// the connection), then [`Table::expire`] removes it if connection `id` still owns it.
    pub fn linger(&self, flow: Flow, id: u64, until: Instant) {
        self.ledger.lock().linger(flow, id, until);
    }

    /// Removes the lingering entries whose time is up at `now`, in one batch; returns how
    /// many were still in the backend's map (an entry a client's new SYN already deleted in
    /// the packet path is not).
    pub fn expire(&self, now: Instant) -> usize {
        // Held across the removal, as in `unsteer`.
        let mut ledger = self.ledger.lock();
        let due = ledger.due(now);
        if due.is_empty() {
            return 0;
        }
        match self.steering.remove_many(&due) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, entries = due.len(), "steering removal failed");
                0
            }
        }
    }

    /// Entries waiting for their linger time to end.
    pub fn lingering(&self) -> usize {
        self.ledger.lock().lingering()
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
    use proptest::prelude::*;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A backend that only counts.
    #[derive(Default)]
    struct Counting {
        live: Mutex<HashMap<Flow, Target>>,
        /// Removal calls: one per `remove`, one per `remove_many` batch.
        calls: AtomicUsize,
    }

    impl Steering for Counting {
        fn insert(&self, flow: &Flow, to: &Target) -> Result<()> {
            self.live.lock().insert(*flow, *to);
            Ok(())
        }
        fn remove(&self, flow: &Flow) -> Result<bool> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            Ok(self.live.lock().remove(flow).is_some())
        }
        fn remove_many(&self, flows: &[Flow]) -> Result<usize> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let mut live = self.live.lock();
            Ok(flows.iter().filter(|f| live.remove(f).is_some()).count())
        }
        fn live(&self) -> usize {
            self.live.lock().len()
        }
        fn kind(&self) -> &'static str {
            "counting"
        }
    }

    fn flow(port: u16) -> Flow {
        Flow::new(
            format!("10.0.0.1:{port}").parse().unwrap(),
            "10.0.0.100:80".parse().unwrap(),
        )
        .unwrap()
    }

    const TO: Target = Target {
        ip: Ipv4Addr::new(10, 0, 0, 12),
        mac: [2, 0, 0, 0, 0, 12],
    };

    fn counting_table() -> (Arc<Counting>, Table) {
        let backend = Arc::new(Counting::default());
        let table = Table::with(backend.clone(), Box::new(|| {}));
        (backend, table)
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
        let flow = flow(4000);
        table.steer(&flow, &TO, 1).unwrap();
        // A newer connection on the same 4-tuple takes the entry over.
        table.steer(&flow, &TO, 2).unwrap();
        assert!(!table.unsteer(&flow, 1), "a stale removal is ignored");
        assert_eq!(table.live(), 1);
        assert!(table.unsteer(&flow, 2));
        assert_eq!(table.live(), 0);
        assert!(!table.unsteer(&flow, 2));
        assert_eq!(backend.calls.load(Ordering::Relaxed), 1);
        drop(table);
        assert_eq!(
            torn.load(Ordering::Relaxed),
            1,
            "dropping the table tears it down"
        );
    }

    /// Entries of ended connections stay until their time is up, and those due at one
    /// moment leave the backend in one call, whatever order their deadlines came in.
    #[test]
    fn lingering_entries_leave_together_when_due() {
        let (backend, table) = counting_table();
        let t0 = Instant::now();
        for p in 1..=5 {
            table.steer(&flow(p), &TO, p as u64).unwrap();
        }
        // Deadlines out of order: 3 s, 1 s, 2 s, 1 s; port 5 stays steered.
        table.linger(flow(1), 1, t0 + Duration::from_secs(3));
        table.linger(flow(2), 2, t0 + Duration::from_secs(1));
        table.linger(flow(3), 3, t0 + Duration::from_secs(2));
        table.linger(flow(4), 4, t0 + Duration::from_secs(1));
        assert_eq!(table.expire(t0), 0);
        assert_eq!((table.live(), table.lingering()), (5, 4));
        assert_eq!(table.expire(t0 + Duration::from_millis(2500)), 3);
        assert_eq!(backend.calls.load(Ordering::Relaxed), 1, "one batch");
        let live: HashSet<Flow> = backend.live.lock().keys().copied().collect();
        assert_eq!(live, HashSet::from([flow(1), flow(5)]));
        assert_eq!(table.expire(t0 + Duration::from_secs(10)), 1);
        assert_eq!(table.expire(t0 + Duration::from_secs(20)), 0);
        assert_eq!(
            backend.calls.load(Ordering::Relaxed),
            2,
            "nothing due, no call"
        );
        assert_eq!((table.live(), table.lingering()), (1, 0));
    }

    /// A lingering entry that a newer connection on the same 4-tuple took over stays.
    #[test]
    fn a_lingering_entry_taken_over_is_not_removed() {
        let (backend, table) = counting_table();
        let t0 = Instant::now();
        table.steer(&flow(7), &TO, 1).unwrap();
        table.linger(flow(7), 1, t0);
        table.steer(&flow(7), &TO, 2).unwrap();
        assert_eq!(table.expire(t0 + Duration::from_secs(1)), 0);
        assert_eq!(table.live(), 1);
        assert_eq!(backend.calls.load(Ordering::Relaxed), 0);
        assert!(table.unsteer(&flow(7), 2));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Steer(u16, u64),
        Unsteer(u16, u64),
        Linger(u16, u64, u64),
        Expire(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let port = 1u16..6;
        let id = 1u64..6;
        prop_oneof![
            (port.clone(), id.clone()).prop_map(|(p, i)| Op::Steer(p, i)),
            (port.clone(), id.clone()).prop_map(|(p, i)| Op::Unsteer(p, i)),
            (port, id, 0u64..50).prop_map(|(p, i, d)| Op::Linger(p, i, d)),
            (0u64..10).prop_map(Op::Expire),
        ]
    }

    proptest! {
        /// Against a model that removes each entry the moment it may go: the backend holds
        /// exactly the entries whose last owner neither removed it nor let a due linger
        /// lapse, and an entry leaves only through the connection that owns it.
        #[test]
        fn table_matches_the_model(ops in proptest::collection::vec(op(), 0..80)) {
            let (backend, table) = counting_table();
            let t0 = Instant::now();
            let mut now = 0u64;
            // flow -> owner; lingering: (deadline, flow, id)
            let mut owners: HashMap<u16, u64> = HashMap::new();
            let mut lingering: Vec<(u64, u16, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Steer(p, i) => {
                        table.steer(&flow(p), &TO, i).unwrap();
                        owners.insert(p, i);
                    }
                    Op::Unsteer(p, i) => {
                        let owned = owners.get(&p) == Some(&i);
                        prop_assert_eq!(table.unsteer(&flow(p), i), owned);
                        if owned {
                            owners.remove(&p);
                        }
                    }
                    Op::Linger(p, i, d) => {
                        table.linger(flow(p), i, t0 + Duration::from_millis(now + d));
                        lingering.push((now + d, p, i));
                    }
                    Op::Expire(step) => {
                        now += step;
                        let (due, rest): (Vec<_>, Vec<_>) =
                            lingering.iter().partition(|(at, _, _)| *at <= now);
                        lingering = rest;
                        let mut due = due;
                        due.sort();
                        let mut removed = 0;
                        for (_, p, i) in due {
                            if owners.get(&p) == Some(&i) {
                                owners.remove(&p);
                                removed += 1;
                            }
                        }
                        prop_assert_eq!(table.expire(t0 + Duration::from_millis(now)), removed);
                    }
                }
                let live: HashSet<Flow> = backend.live.lock().keys().copied().collect();
                let model: HashSet<Flow> = owners.keys().map(|p| flow(*p)).collect();
                prop_assert_eq!(live, model);
                prop_assert_eq!(table.lingering(), lingering.len());
            }
        }
    }

    #[test]
    fn backends_parse() {
        assert_eq!("ebpf".parse::<Backend>(), Ok(Backend::Ebpf));
        assert_eq!("nftables".parse::<Backend>(), Ok(Backend::Nftables));
        assert!("ipvs".parse::<Backend>().is_err());
    }
}
