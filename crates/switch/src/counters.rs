//! The switch's own counters, kept by every task that serves; the `metrics` module exports
//! them. What every response adds to is kept per worker ([`PerWorker`]) and summed when read.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use switchyard_admin::dashboard::{LatencyHistogram, LatencyTotals};
use switchyard_admin::encode::StatusCounters;
use switchyard_runtime::per_worker::PerWorker;

/// Why a request or connection was refused by the switch itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// More client connections than `max_connections`.
    ConnectionLimit,
    /// Every node saturated and the wait queue full.
    QueueFull,
    /// Every node saturated for longer than `queue_timeout_ms`.
    QueueTimeout,
    /// No node is up.
    NoNode,
    /// Malformed or oversized request.
    BadRequest,
}

impl Rejection {
    pub(crate) const ALL: [Rejection; 5] = [
        Rejection::ConnectionLimit,
        Rejection::QueueFull,
        Rejection::QueueTimeout,
        Rejection::NoNode,
        Rejection::BadRequest,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::ConnectionLimit => "connection_limit",
            Rejection::QueueFull => "queue_full",
            Rejection::QueueTimeout => "queue_timeout",
            Rejection::NoNode => "no_node",
            Rejection::BadRequest => "bad_request",
        }
    }
}

/// Counters of the switch.
#[derive(Debug)]
pub struct SwitchMetrics {
    /// What each response adds to, one set per worker.
    responses: PerWorker<ResponseCounters>,
    rejections: [AtomicU64; 5],
    /// Client connections accepted.
    pub connections_total: AtomicU64,
    /// Client connections open.
    pub connections_active: AtomicU64,
    /// Requests sent again to another node.
    pub retries: AtomicU64,
    /// Node connections that failed for lack of local descriptors or memory.
    pub local_errors: AtomicU64,
    /// Client header, idle and send timeouts.
    pub timeouts: AtomicU64,
    /// Configuration reloads.
    pub reloads: AtomicU64,
    /// Nodes going down or coming up.
    pub node_transitions: AtomicU64,
    /// Active health checks run.
    pub health_checks: AtomicU64,
    /// Active health checks failed.
    pub health_failures: AtomicU64,
    /// Load reports applied.
    pub reports: AtomicU64,
    /// Datagrams that were not reports of a known node.
    pub reports_invalid: AtomicU64,
}

/// One worker's counts of the responses sent to clients.
#[derive(Debug, Default)]
struct ResponseCounters {
    status: StatusCounters,
    /// Response body bytes moved with splice(2).
    splice_bytes: AtomicU64,
    /// Time from a parsed request head to its response relayed, in the dashboard's buckets.
    relay_times: LatencyHistogram,
}

impl Default for SwitchMetrics {
    fn default() -> Self {
        SwitchMetrics::new(0)
    }
}

impl SwitchMetrics {
    /// Counters for a switch of `workers` worker threads (0: one per core).
    pub fn new(workers: usize) -> Self {
        SwitchMetrics {
            responses: PerWorker::new(workers),
            rejections: Default::default(),
            connections_total: AtomicU64::new(0),
            connections_active: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            local_errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            node_transitions: AtomicU64::new(0),
            health_checks: AtomicU64::new(0),
            health_failures: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            reports_invalid: AtomicU64::new(0),
        }
    }

    /// Count one response with this status code.
    pub fn count_status(&self, code: u16) {
        self.responses.local().status.count(code);
    }

    /// Count one response relayed from a node, `took` from its parsed request head.
    pub fn count_relayed(&self, code: u16, took: Duration) {
        let r = self.responses.local();
        r.status.count(code);
        r.relay_times.observe(took);
    }

    /// Count response body bytes moved with splice(2).
    pub fn count_spliced(&self, bytes: u64) {
        if bytes > 0 {
            self.responses
                .local()
                .splice_bytes
                .fetch_add(bytes, Relaxed);
        }
    }

    /// Responses sent with `code` so far.
    pub fn status_count(&self, code: u16) -> u64 {
        self.responses.iter().map(|r| r.status.get(code)).sum()
    }

    /// `(code, count)` of every status code sent so far, as label values.
    pub fn statuses(&self) -> Vec<(String, u64)> {
        StatusCounters::nonzero_of(self.responses.iter().map(|r| &r.status))
    }

    /// Response body bytes moved with splice(2) so far.
    pub fn splice_bytes(&self) -> u64 {
        self.responses.sum(|r| &r.splice_bytes)
    }

    /// Relay times so far, every worker's together.
    pub fn relay_times(&self) -> LatencyTotals {
        LatencyTotals::of(self.responses.iter().map(|r| &r.relay_times))
    }

    /// Count a refusal.
    pub fn count_rejection(&self, why: Rejection) {
        self.rejections[why as usize].fetch_add(1, Relaxed);
    }

    /// Refusals for `why` so far.
    pub fn rejections(&self, why: Rejection) -> u64 {
        self.rejections[why as usize].load(Relaxed)
    }
}
