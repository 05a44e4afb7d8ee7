//! The node's Prometheus metrics.
//!
//! Hot-path counters are plain atomics (per status code: `StatusCounters`,
//! so counting a request is one relaxed add and no label lookup). What every
//! response updates (status, bytes, response time) is kept once per worker
//! ([`PerWorker`]), so the workers never write the same cache lines; a
//! collector adds the workers' counts up and turns them, and the object
//! cache's own counters, into metric families at scrape time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use switchyard_admin::dashboard::{LatencyHistogram, LatencyTotals};
use switchyard_admin::encode::{counter, gauge, labelled, response_times, StatusCounters};
use switchyard_runtime::per_worker::PerWorker;

use crate::store::Store;

/// Counters updated by connections.
#[derive(Debug)]
pub struct NodeMetrics {
    /// What each response adds to, one set per worker.
    responses: PerWorker<ResponseCounters>,
    pub connections_total: AtomicU64,
    pub connections_active: AtomicU64,
    /// Failed accepts and the pauses taken for lack of descriptors or memory.
    pub accepts: switchyard_runtime::accept::AcceptStats,
    pub timeouts: AtomicU64,
    /// Connection handoffs (switch to node) and back-end forwarding.
    pub handoff: HandoffMetrics,
    /// Requests forwarded to the application server (`[dynamic]`).
    pub upstream: UpstreamMetrics,
}

/// Counters of the requests forwarded to the application server (`[dynamic]`).
#[derive(Debug, Default)]
pub struct UpstreamMetrics {
    /// Requests forwarded (each counted once, however it ended).
    pub requests: AtomicU64,
    /// New connections opened to the application server (the others were pooled).
    pub connects: AtomicU64,
    /// Requests sent once more on a new connection: idempotent ones whose pooled connection
    /// turned out closed before a byte of response.
    pub retries: AtomicU64,
    /// Failures by kind: the connection could not be opened (502), a wait timed out (504),
    /// the response was refused by the strict parser (502), the connection broke or closed
    /// (502, or the client's connection closed midway through a response).
    pub errors: [AtomicU64; UpstreamError::COUNT],
}

/// Why a request to the application server failed (the label of
/// `switchyard_node_upstream_errors_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamError {
    /// Connecting failed (refused, unreachable).
    Connect,
    /// Connecting, sending the request or waiting for the response timed out.
    Timeout,
    /// A response head or chunked body the strict parser refused.
    Response,
    /// The connection broke or was closed before the response was complete.
    Broken,
    /// No descriptor or memory here: the application server is not to blame.
    Local,
}

impl UpstreamError {
    /// How many kinds there are.
    pub const COUNT: usize = 5;
    const ALL: [UpstreamError; Self::COUNT] = [
        UpstreamError::Connect,
        UpstreamError::Timeout,
        UpstreamError::Response,
        UpstreamError::Broken,
        UpstreamError::Local,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            UpstreamError::Connect => "connect",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Response => "response",
            UpstreamError::Broken => "broken",
            UpstreamError::Local => "local",
        }
    }
}

impl UpstreamMetrics {
    /// Count one failure.
    pub fn count_error(&self, kind: UpstreamError) {
        self.errors[kind as usize].fetch_add(1, Relaxed);
    }

    /// Failures of `kind` so far.
    pub fn errors_of(&self, kind: UpstreamError) -> u64 {
        self.errors[kind as usize].load(Relaxed)
    }
}

/// Counters of connection handoff: connections handed in by a switch, refusals, hand-backs,
/// route queries and back-end forwarding between nodes.
#[derive(Debug)]
pub struct HandoffMetrics {
    /// Connections taken as a passed descriptor (same host).
    pub fd_connections: AtomicU64,
    /// Connections taken as restored `TCP_REPAIR` state (across hosts).
    pub repair_connections: AtomicU64,
    /// Refusals at the connection cap.
    pub refused_busy: AtomicU64,
    /// Refusals while shutting down.
    pub refused_shutting_down: AtomicU64,
    /// Refusals because a restore failed.
    pub refused_restore_failed: AtomicU64,
    /// Refusals because the node lacks CAP_NET_ADMIN.
    pub refused_no_privilege: AtomicU64,
    /// Refusals for any other reason (not a stream socket, registration failed).
    pub refused_other: AtomicU64,
    /// Connections given back to the switch (multiple handoff) or to the peer that cloned them.
    pub hand_backs: AtomicU64,
    /// Clones taken from peers (cooperative mode): one request each, then handed back.
    pub clones_in: AtomicU64,
    /// Hand-backs that failed (the node kept serving the connection or closed it).
    pub hand_back_failures: AtomicU64,
    /// `Route` queries sent.
    pub route_queries: AtomicU64,
    /// `Route` queries left unanswered (timeout or control connection gone).
    pub route_timeouts: AtomicU64,
    /// Requests fetched from another node (back-end forwarding).
    pub forwards: AtomicU64,
    /// Response bytes relayed to clients from other nodes.
    pub forward_bytes: AtomicU64,
    /// Forwards that failed (served locally when nothing had reached the client yet).
    pub forward_failures: AtomicU64,
    /// Control connections open now.
    pub control_connections: AtomicU64,
    /// Time to restore a connection from its `TCP_REPAIR` state.
    pub restore_seconds: Histogram,
}

impl Default for HandoffMetrics {
    fn default() -> Self {
        HandoffMetrics {
            fd_connections: AtomicU64::new(0),
            repair_connections: AtomicU64::new(0),
            refused_busy: AtomicU64::new(0),
            refused_shutting_down: AtomicU64::new(0),
            refused_restore_failed: AtomicU64::new(0),
            refused_no_privilege: AtomicU64::new(0),
            refused_other: AtomicU64::new(0),
            hand_backs: AtomicU64::new(0),
            clones_in: AtomicU64::new(0),
            hand_back_failures: AtomicU64::new(0),
            route_queries: AtomicU64::new(0),
            route_timeouts: AtomicU64::new(0),
            forwards: AtomicU64::new(0),
            forward_bytes: AtomicU64::new(0),
            forward_failures: AtomicU64::new(0),
            control_connections: AtomicU64::new(0),
            // 1 µs … ~30 ms
            restore_seconds: Histogram::new(exponential_buckets(0.000_001, 2.0, 16)),
        }
    }
}

/// One worker's counts of the responses it sent.
#[derive(Debug, Default)]
struct ResponseCounters {
    status: StatusCounters,
    /// Response bytes written, heads and bodies.
    bytes_out: AtomicU64,
    /// Body bytes sent with sendfile.
    sendfile_bytes: AtomicU64,
    /// Time from a complete request head to its response handed to the kernel, in the
    /// dashboard's buckets (Prometheus' histogram takes those two at a time).
    times: LatencyHistogram,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        NodeMetrics::new(0)
    }
}

impl NodeMetrics {
    /// Counters for a node of `workers` worker threads (0: one per core).
    pub fn new(workers: usize) -> Self {
        NodeMetrics {
            responses: PerWorker::new(workers),
            connections_total: AtomicU64::new(0),
            connections_active: AtomicU64::new(0),
            accepts: Default::default(),
            timeouts: AtomicU64::new(0),
            handoff: HandoffMetrics::default(),
            upstream: UpstreamMetrics::default(),
        }
    }

    /// Count one response with this status code.
    pub fn count_status(&self, code: u16) {
        self.responses.local().status.count(code);
    }

    /// Count response bytes written (heads and bodies), `sendfile` of them sent with sendfile.
    pub fn count_bytes(&self, written: u64, sendfile: u64) {
        let r = self.responses.local();
        r.bytes_out.fetch_add(written, Relaxed);
        if sendfile > 0 {
            r.sendfile_bytes.fetch_add(sendfile, Relaxed);
        }
    }

    /// Count the time from a request's complete head to its response handed to the kernel.
    pub fn observe_response(&self, took: Duration) {
        self.responses.local().times.observe(took);
    }

    /// Responses sent so far, whatever their status.
    pub fn responses(&self) -> u64 {
        self.responses.iter().map(|r| r.status.total()).sum()
    }

    /// Responses sent with `code` so far.
    pub fn status_count(&self, code: u16) -> u64 {
        self.responses.iter().map(|r| r.status.get(code)).sum()
    }

    /// Response bytes written so far, heads and bodies.
    pub fn bytes_out(&self) -> u64 {
        self.responses.sum(|r| &r.bytes_out)
    }

    /// Body bytes sent with sendfile so far.
    pub fn sendfile_bytes(&self) -> u64 {
        self.responses.sum(|r| &r.sendfile_bytes)
    }

    /// The response times counted so far, every worker's together.
    pub fn response_times(&self) -> LatencyTotals {
        LatencyTotals::of(self.responses.iter().map(|r| &r.times))
    }
}

/// Register everything the node exports into `registry`.
pub fn register(registry: &mut Registry, metrics: Arc<NodeMetrics>, store: Arc<Store>) {
    registry.register(
        "switchyard_node_handoff_restore_seconds",
        "Time to restore a handed-in connection from its TCP_REPAIR state",
        metrics.handoff.restore_seconds.clone(),
    );
    registry.register_collector(Box::new(NodeCollector { metrics, store }));
}

#[derive(Debug)]
struct NodeCollector {
    metrics: Arc<NodeMetrics>,
    store: Arc<Store>,
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = &self.metrics;
        labelled(
            &mut enc,
            "switchyard_node_requests",
            "Responses sent, by status code",
            "status",
            true,
            StatusCounters::nonzero_of(m.responses.iter().map(|r| &r.status)),
        )?;
        response_times(
            &mut enc,
            "switchyard_node_response_seconds",
            "Time from a parsed request to its response handed to the kernel",
            &m.response_times(),
        )?;
        counter(
            &mut enc,
            "switchyard_node_bytes_out",
            "Response bytes written, heads and bodies",
            m.bytes_out(),
        )?;
        counter(
            &mut enc,
            "switchyard_node_sendfile_bytes",
            "Body bytes sent with sendfile",
            m.sendfile_bytes(),
        )?;
        counter(
            &mut enc,
            "switchyard_node_connections",
            "Client connections accepted",
            m.connections_total.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "switchyard_node_accept_failures",
            "Accepts that failed",
            m.accepts.failures.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "switchyard_node_accept_backoffs",
            "Pauses of an accept loop out of descriptors or memory",
            m.accepts.backoffs.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "switchyard_node_connections_shed",
            "Connections waiting on their clients closed to make room for new ones",
            m.accepts.shed.load(Relaxed),
        )?;
        gauge(
            &mut enc,
            "switchyard_node_connections_active",
            "Client connections open now",
            m.connections_active.load(Relaxed) as i64,
        )?;
        counter(
            &mut enc,
            "switchyard_node_timeouts",
            "Connections closed by a header, idle or send timeout",
            m.timeouts.load(Relaxed),
        )?;
        let s = self.store.cache_stats();
        counter(
            &mut enc,
            "switchyard_node_cache_hits",
            "Object cache hits",
            s.hits,
        )?;
        counter(
            &mut enc,
            "switchyard_node_cache_misses",
            "Object cache misses",
            s.misses,
        )?;
        counter(
            &mut enc,
            "switchyard_node_cache_evictions",
            "Objects evicted from the cache",
            s.evictions,
        )?;
        counter(
            &mut enc,
            "switchyard_node_cache_insertions",
            "Objects inserted into the cache",
            s.insertions,
        )?;
        counter(
            &mut enc,
            "switchyard_node_cache_rejections",
            "Objects too large for the cache",
            s.rejections,
        )?;
        gauge(
            &mut enc,
            "switchyard_node_cache_bytes",
            "Bytes held by the object cache",
            s.bytes as i64,
        )?;
        gauge(
            &mut enc,
            "switchyard_node_cache_objects",
            "Objects held by the object cache",
            s.objects as i64,
        )?;
        gauge(
            &mut enc,
            "switchyard_node_cache_capacity_bytes",
            "Budget of the object cache",
            s.capacity_bytes as i64,
        )?;
        gauge(
            &mut enc,
            "switchyard_node_disk_queue",
            "Emulated disk reads queued or in service",
            self.store.disk_queue() as i64,
        )?;
        let (direct_reads, direct_bytes) = self.store.direct_reads();
        counter(
            &mut enc,
            "switchyard_node_disk_direct_reads",
            "Reads of cache misses with O_DIRECT (disk.o_direct)",
            direct_reads,
        )?;
        counter(
            &mut enc,
            "switchyard_node_disk_direct_read_bytes",
            "Bytes asked for by O_DIRECT reads",
            direct_bytes,
        )?;
        encode_handoff(&mut enc, &m.handoff)?;
        encode_upstream(&mut enc, &m.upstream)
    }
}

fn encode_upstream(
    enc: &mut DescriptorEncoder,
    u: &UpstreamMetrics,
) -> Result<(), std::fmt::Error> {
    counter(
        enc,
        "switchyard_node_upstream_requests",
        "Requests forwarded to the application server ([dynamic])",
        u.requests.load(Relaxed),
    )?;
    counter(
        enc,
        "switchyard_node_upstream_connects",
        "Connections opened to the application server",
        u.connects.load(Relaxed),
    )?;
    counter(
        enc,
        "switchyard_node_upstream_retries",
        "Idempotent requests sent again after a pooled connection closed unanswered",
        u.retries.load(Relaxed),
    )?;
    labelled(
        enc,
        "switchyard_node_upstream_errors",
        "Requests to the application server that failed, by kind",
        "kind",
        true,
        UpstreamError::ALL.map(|k| (k.name().to_owned(), u.errors_of(k))),
    )
}

fn encode_handoff(enc: &mut DescriptorEncoder, h: &HandoffMetrics) -> Result<(), std::fmt::Error> {
    let get = |a: &AtomicU64| a.load(Relaxed);
    labelled(
        enc,
        "switchyard_node_handoff_connections",
        "Client connections handed in by a switch, by transfer",
        "transfer",
        true,
        [
            ("fd".to_owned(), get(&h.fd_connections)),
            ("repair".to_owned(), get(&h.repair_connections)),
        ],
    )?;
    labelled(
        enc,
        "switchyard_node_handoff_refused",
        "Handed-in connections refused (Drop), by reason",
        "reason",
        true,
        [
            ("busy".to_owned(), get(&h.refused_busy)),
            ("shutting_down".to_owned(), get(&h.refused_shutting_down)),
            ("restore_failed".to_owned(), get(&h.refused_restore_failed)),
            ("no_privilege".to_owned(), get(&h.refused_no_privilege)),
            ("other".to_owned(), get(&h.refused_other)),
        ],
    )?;
    counter(
        enc,
        "switchyard_node_clones_in",
        "Connections cloned to this node by peers to serve one request (cooperative mode)",
        get(&h.clones_in),
    )?;
    counter(
        enc,
        "switchyard_node_handoff_hand_backs",
        "Connections given back to the switch (multiple handoff)",
        get(&h.hand_backs),
    )?;
    counter(
        enc,
        "switchyard_node_handoff_hand_back_failures",
        "Hand-backs that failed; the node kept or closed the connection",
        get(&h.hand_back_failures),
    )?;
    counter(
        enc,
        "switchyard_node_handoff_route_queries",
        "Route queries sent to the switch",
        get(&h.route_queries),
    )?;
    counter(
        enc,
        "switchyard_node_handoff_route_timeouts",
        "Route queries left unanswered; the request was served locally",
        get(&h.route_timeouts),
    )?;
    gauge(
        enc,
        "switchyard_node_handoff_control_connections",
        "Switch control connections open now",
        get(&h.control_connections) as i64,
    )?;
    counter(
        enc,
        "switchyard_node_forwards",
        "Requests fetched from another node (back-end forwarding)",
        get(&h.forwards),
    )?;
    counter(
        enc,
        "switchyard_node_forward_bytes",
        "Response bytes relayed to clients from other nodes",
        get(&h.forward_bytes),
    )?;
    counter(
        enc,
        "switchyard_node_forward_failures",
        "Back-end forwards that failed",
        get(&h.forward_failures),
    )?;
    Ok(())
}
