//! The switch's table of connections that live on nodes (one-way delivery), shared by every
//! thread: which node holds each handed-off connection and what it still owes (`Served` per
//! dispatched request), its steering table (`switchyard_handoff::steer::table`, the same
//! table a cooperative node uses: who owns each entry, entries lingering after a connection
//! closed, the set-up and its removal), and the fallback counters. Whatever control
//! connection a node reports on, its reports land here.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use switchyard_handoff::metrics::HandoffMetrics;
use switchyard_handoff::mover;
use switchyard_handoff::steer::table::{self, Table};
use switchyard_handoff::steer::{Flow, Target};
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
            node.count_served(requests.saturating_sub(r), bytes.saturating_sub(b));
        }
        self.counted = (r.max(requests), b.max(bytes));
    }
}

/// Everything the switch keeps for one-way delivery.
pub(crate) struct Handoffs {
    pub metrics: HandoffMetrics,
    pub steering: Option<Table>,
    /// Why there is no steering table, if there is none.
    pub steering_error: Option<String>,
    pub next_id: AtomicU64,
    pub conns: Mutex<HashMap<u64, Handed>>,
}

impl std::fmt::Debug for Handoffs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoffs")
            .field("steering", &self.steering.as_ref().map(|s| s.kind()))
            .field("live", &self.conns.lock().len())
            .finish_non_exhaustive()
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
        let mut steering = None;
        let mut steering_error = None;
        if cross_host {
            let iface = &cfg.steering_iface;
            let backend = match cfg.steering {
                SteeringKind::Ebpf => table::Backend::Ebpf,
                SteeringKind::Nftables => table::Backend::Nftables,
            };
            // An eBPF set-up that fails (no clang or bpftool, an older kernel) falls back to
            // nftables inside `Table::setup`.
            match Table::setup(backend, iface, instance) {
                Ok(t) => {
                    tracing::info!(backend = t.kind(), %iface, "steering ready");
                    steering = Some(t);
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
        }
    }

    /// Remove the entries whose linger time is over at `now` (called periodically by the
    /// switch's linger task; those due together leave in one batch), then refresh the gauge
    /// of live entries.
    pub fn expire_lingering(&self, now: Instant) {
        if let Some(t) = &self.steering {
            t.expire(now);
        }
        self.set_steering_gauge();
    }

    /// Remove the steering setup; connections on nodes keep their entries until then.
    pub fn shutdown(&self) {
        if let Some(t) = &self.steering {
            t.shutdown();
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
        let Some(t) = &self.steering else {
            return false;
        };
        match t.steer(flow, to, id) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "steering insert failed");
                false
            }
        }
    }

    /// Removes `flow`'s entry if connection `id` still owns it.
    pub fn unsteer(&self, flow: &Flow, id: u64) {
        if let Some(t) = &self.steering {
            t.unsteer(flow, id);
        }
    }

    /// Keep `flow`'s entry for `linger` more (the FIN exchange, or a node that may hold the
    /// connection), then remove it if connection `id` still owns it.
    pub fn linger(&self, flow: Flow, id: u64, linger: Duration) {
        if let Some(t) = &self.steering {
            t.linger(flow, id, Instant::now() + linger);
        }
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
