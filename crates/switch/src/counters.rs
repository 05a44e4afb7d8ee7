//! The switch's own counters, kept by every task that serves; the `metrics` module exports
//! them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use switchyard_admin::encode::StatusCounters;

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
    pub(crate) status: StatusCounters,
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
    /// Response body bytes moved with splice(2).
    pub splice_bytes: AtomicU64,
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
    /// Time from a parsed request head to its response relayed.
    pub relay_seconds: Histogram,
}

impl Default for SwitchMetrics {
    fn default() -> Self {
        SwitchMetrics {
            status: StatusCounters::default(),
            rejections: Default::default(),
            connections_total: AtomicU64::new(0),
            connections_active: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            local_errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            splice_bytes: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            node_transitions: AtomicU64::new(0),
            health_checks: AtomicU64::new(0),
            health_failures: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            reports_invalid: AtomicU64::new(0),
            // 20 µs … ~20 s
            relay_seconds: Histogram::new(exponential_buckets(0.000_02, 2.5, 16)),
        }
    }
}

impl SwitchMetrics {
    /// Count one response with this status code.
    pub fn count_status(&self, code: u16) {
        self.status.count(code);
    }

    /// Responses sent with `code` so far.
    pub fn status_count(&self, code: u16) -> u64 {
        self.status.get(code)
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
