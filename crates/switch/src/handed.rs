//! The switch's table of connections that live on nodes (one-way delivery), shared by every
//! thread: which node holds each handed-off connection and what it still owes (`Served` per
//! dispatched request), the steering entries and who owns them, entries lingering after a
//! connection closed, and the fallback counters. Whatever control connection a node reports
//! on, its reports land here.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use switchyard_handoff::metrics::HandoffMetrics;
use switchyard_handoff::mover;
use switchyard_handoff::steer::{self, Flow, Steering, Target};
use switchyard_policy::ConnId;

use crate::config::{ControlAddr, SteeringKind, SwitchConfig};
use crate::generation::Generation;

/// Why a connection was relayed instead of handed off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// The node's control connection is down.
    ControlDown,
    /// No steering table (setup failed: no privileges or tools) for a node on another host.
    NoSteering,
    /// The connection cannot be steered (IPv6) or its node's MAC address is unknown.
    NotSteerable,
    /// The kernel refused to dump the connection (no CAP_NET_ADMIN, not established).
    Dump,
    /// The node answered `Drop`.
    Refused,
    /// The node did not answer in time; it answered the `Cancel` with `Drop`.
    Timeout,
    /// The control connection ended cleanly before the node answered.
    ControlLost,
    /// Neither the `Create` nor the `Cancel` was answered in time, or the control connection
    /// failed before an answer: the switch closed its copy without writing (not relayed).
    Abandoned,
    /// A node gave the connection back and no node took it again.
    HandBack,
    /// The client had sent more than a `Create` carries (pipelined requests beyond 1 MiB).
    TooMuchRead,
    /// A response relayed earlier on the connection was not all sent yet (see
    /// `handoff::all_sent`).
    StillSending,
}

impl Fallback {
    pub(crate) const ALL: [Fallback; 11] = [
        Fallback::ControlDown,
        Fallback::NoSteering,
        Fallback::NotSteerable,
        Fallback::Dump,
        Fallback::Refused,
        Fallback::Timeout,
        Fallback::ControlLost,
        Fallback::Abandoned,
        Fallback::HandBack,
        Fallback::TooMuchRead,
        Fallback::StillSending,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Fallback::ControlDown => "control_down",
            Fallback::NoSteering => "no_steering",
            Fallback::NotSteerable => "not_steerable",
            Fallback::Dump => "dump_failed",
            Fallback::Refused => "refused",
            Fallback::Timeout => "timeout",
            Fallback::ControlLost => "control_lost",
            Fallback::Abandoned => "abandoned",
            Fallback::HandBack => "hand_back",
            Fallback::TooMuchRead => "too_much_read",
            Fallback::StillSending => "still_sending",
        }
    }
}

/// A request dispatched by the switch whose `Served` has not arrived yet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dispatched {
    /// The node it was counted on (its index in the connection's generation).
    pub node: usize,
    /// Whether the policy counted it (a request served locally because the policy refused to
    /// choose is not).
    pub counted: bool,
    /// When it was dispatched (its response time ends with the node's `Served`).
    pub at: Instant,
}

/// A connection that lives on a node.
pub(crate) struct Handed {
    pub gen: Arc<Generation>,
    pub conn: ConnId,
    /// The node that holds it now.
    pub node: usize,
    /// The worker whose control connection to `node` carried the `Create` (the node reports
    /// on that connection; when it is lost, so is the connection's bookkeeping).
    pub link: usize,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub flow: Option<Flow>,
    pub route: switchyard_handoff::proto::Routing,
    pub outstanding: VecDeque<Dispatched>,
    /// Where a connection handed back goes next (decided when its request was routed).
    pub next: Option<usize>,
    /// Requests and response bytes of this connection already counted for its node (each
    /// `Served`); the node's totals in `Closed` and `HandBack` bring the rest, the requests it
    /// served without asking.
    pub counted: (u64, u64),
}

impl Handed {
    /// The node reports `requests` and `bytes` in all on this connection: count what its
    /// `Served` reports did not for the node that holds it.
    pub fn count_totals(&mut self, requests: u64, bytes: u64) {
        let (r, b) = self.counted;
        if let Some(node) = self.gen.nodes.get(self.node) {
            node.requests.fetch_add(requests.saturating_sub(r), Relaxed);
            node.bytes.fetch_add(bytes.saturating_sub(b), Relaxed);
        }
        self.counted = (r.max(requests), b.max(bytes));
    }
}

/// Everything the switch keeps for one-way delivery.
pub(crate) struct Handoffs {
    pub metrics: HandoffMetrics,
    pub steering: Option<Arc<dyn Steering>>,
    /// Why there is no steering table, if there is none.
    pub steering_error: Option<String>,
    pub next_id: AtomicU64,
    pub conns: Mutex<HashMap<u64, Handed>>,
    /// The connection that owns each live steering entry (a delayed removal must not take
    /// the entry of a newer connection on the same 4-tuple).
    flows: Mutex<HashMap<Flow, u64>>,
    /// Entries of closed connections, removed once their time is up (oldest first; every
    /// connection of a generation lingers equally long, so deadlines stay nearly in order).
    lingering: Mutex<VecDeque<(Instant, Flow, u64)>>,
    /// Removes the steering setup (at shutdown).
    teardown: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Handoffs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoffs")
            .field("steering", &self.steering.as_ref().map(|s| s.kind()))
            .field("live", &self.conns.lock().len())
            .finish_non_exhaustive()
    }
}

impl Drop for Handoffs {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Handoffs {
    /// Set up for `cfg`: a steering table when handoffs cross hosts.
    pub fn new(cfg: &SwitchConfig, instance: &str) -> Self {
        let cross_host = cfg.mechanism == crate::config::Mechanism::Handoff
            && cfg
                .nodes
                .iter()
                .any(|n| matches!(n.control, Some(ControlAddr::Tcp(_))));
        let mut steering: Option<Arc<dyn Steering>> = None;
        let mut steering_error = None;
        let mut teardown: Option<Box<dyn FnOnce() + Send>> = None;
        if cross_host {
            let iface = cfg.steering_iface.clone();
            let tag = instance.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
            let nft = |teardown: &mut Option<Box<dyn FnOnce() + Send>>| {
                steer::nft::NftSteering::setup(None, &iface, &tag).map(|s| {
                    let tag = tag.clone();
                    *teardown = Some(Box::new(move || {
                        steer::nft::NftSteering::teardown(None, &tag)
                    }));
                    Arc::new(s) as Arc<dyn Steering>
                })
            };
            let r: switchyard_handoff::Result<Arc<dyn Steering>> = match cfg.steering {
                SteeringKind::Ebpf => {
                    let ecfg = steer::ebpf::EbpfConfig::new(&iface, instance);
                    let pin_dir = ecfg.pin_dir.clone();
                    let iface2 = iface.clone();
                    match steer::ebpf::EbpfSteering::setup(&ecfg, None) {
                        Ok(s) => {
                            teardown = Some(Box::new(move || {
                                steer::ebpf::EbpfSteering::teardown(None, &iface2, &pin_dir)
                            }));
                            Ok(Arc::new(s) as Arc<dyn Steering>)
                        }
                        // nftables is the fallback when the eBPF program cannot be built or
                        // attached (no clang or bpftool, an older kernel).
                        Err(e) => {
                            tracing::warn!(error = %e, %iface, "eBPF steering unavailable; trying nftables");
                            nft(&mut teardown).map_err(|n| {
                                switchyard_handoff::HandoffError::Other(format!(
                                    "eBPF: {e}; nftables: {n}"
                                ))
                            })
                        }
                    }
                }
                SteeringKind::Nftables => nft(&mut teardown),
            };
            match r {
                Ok(s) => {
                    tracing::info!(backend = s.kind(), %iface, "steering ready");
                    steering = Some(s);
                }
                Err(e) => {
                    tracing::error!(error = %e, %iface,
                        "no steering table: connections for nodes on other hosts will be relayed");
                    steering_error = Some(e.to_string());
                }
            }
        }
        Handoffs {
            metrics: HandoffMetrics::new(),
            steering,
            steering_error,
            next_id: AtomicU64::new(1),
            conns: Mutex::new(HashMap::new()),
            flows: Mutex::new(HashMap::new()),
            lingering: Mutex::new(VecDeque::new()),
            teardown: Mutex::new(teardown),
        }
    }

    /// Remove the entries whose linger time is over (called periodically by the switch's linger
    /// task), then refresh the gauge of live entries.
    pub fn expire_lingering(&self, now: Instant) {
        loop {
            let next = {
                let mut q = self.lingering.lock();
                match q.front() {
                    Some((at, _, _)) if *at <= now => q.pop_front(),
                    _ => None,
                }
            };
            let Some((_, flow, id)) = next else {
                break;
            };
            self.unsteer(&flow, id);
        }
        self.set_steering_gauge();
    }

    /// Remove the steering setup; connections on nodes keep their entries until then.
    pub fn shutdown(&self) {
        if let Some(t) = self.teardown.lock().take() {
            t();
        }
    }

    /// Fallbacks by reason.
    pub fn fallbacks(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Fallback::ALL
            .iter()
            .map(|f| (f.label(), self.metrics.fallbacks_for(f.label())))
    }

    pub fn count_fallback(&self, why: Fallback) {
        self.metrics.fallback(why.label());
    }

    /// Steering entries live.
    pub fn steering_live(&self) -> usize {
        self.steering.as_ref().map_or(0, |s| s.live())
    }

    /// The steering backend in use, if any.
    pub fn steering_kind(&self) -> Option<&'static str> {
        self.steering.as_ref().map(|s| s.kind())
    }

    /// The gauge of live steering entries, refreshed on each tick of the lingering entries'
    /// expiry rather than on every insert and removal: counting them reads a counter of the
    /// steering program (a `bpf(2)` call), which would add two system calls to every handoff.
    fn set_steering_gauge(&self) {
        self.metrics
            .steering_entries
            .set(self.steering_live() as i64);
    }

    pub fn steer(&self, flow: &Flow, to: &Target, id: u64) -> bool {
        let Some(s) = &self.steering else {
            return false;
        };
        match s.insert(flow, to) {
            Ok(()) => {
                self.flows.lock().insert(*flow, id);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "steering insert failed");
                false
            }
        }
    }

    /// Removes `flow`'s entry if connection `id` still owns it.
    pub fn unsteer(&self, flow: &Flow, id: u64) {
        let Some(s) = &self.steering else {
            return;
        };
        {
            let mut flows = self.flows.lock();
            if flows.get(flow) != Some(&id) {
                return;
            }
            flows.remove(flow);
        }
        if let Err(e) = s.remove(flow) {
            tracing::warn!(error = %e, "steering remove failed");
        }
    }

    /// Keep `flow`'s entry for `linger` more (the FIN exchange, or a node that may hold the
    /// connection), then remove it if connection `id` still owns it.
    pub fn linger(&self, flow: Flow, id: u64, linger: Duration) {
        self.lingering
            .lock()
            .push_back((Instant::now() + linger, flow, id));
    }

    /// A connection nobody may serve any more from here: its table entry goes (returned), its
    /// steering entry stays for the linger time (the node may hold the connection), and it is
    /// counted by reason.
    pub fn abandon(&self, id: u64, why: mover::AbandonReason, linger: Duration) -> Option<Handed> {
        self.count_fallback(Fallback::Abandoned);
        self.metrics.abandon(why.label());
        let c = self.conns.lock().remove(&id)?;
        if let Some(flow) = c.flow {
            self.linger(flow, id, linger);
        }
        Some(c)
    }
}
