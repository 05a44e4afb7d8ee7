//! The node's Prometheus metrics.
//!
//! Hot-path counters are plain atomics (per status code: `StatusCounters`,
//! so counting a request is one relaxed add and no label lookup);
//! a collector turns them, and the object cache's own counters, into
//! metric families at scrape time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use switchyard_admin::encode::{counter, gauge, labelled, StatusCounters};

use crate::store::Store;

/// Counters updated by connections.
#[derive(Debug)]
pub struct NodeMetrics {
    status: StatusCounters,
    pub bytes_out: AtomicU64,
    pub sendfile_bytes: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_active: AtomicU64,
    pub timeouts: AtomicU64,
    /// Time from a complete request head to its response handed to the kernel.
    pub response_seconds: Histogram,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        NodeMetrics {
            status: StatusCounters::default(),
            bytes_out: AtomicU64::new(0),
            sendfile_bytes: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_active: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            // 10 µs … ~5 s
            response_seconds: Histogram::new(exponential_buckets(0.000_01, 2.5, 15)),
        }
    }
}

impl NodeMetrics {
    /// Count one response with this status code.
    pub fn count_status(&self, code: u16) {
        self.status.count(code);
    }

    /// Responses sent with `code` so far.
    pub fn status_count(&self, code: u16) -> u64 {
        self.status.get(code)
    }
}

/// Register everything the node exports into `registry`.
pub fn register(registry: &mut Registry, metrics: Arc<NodeMetrics>, store: Arc<Store>) {
    registry.register(
        "switchyard_node_response_seconds",
        "Time from a parsed request to its response handed to the kernel",
        metrics.response_seconds.clone(),
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
            m.status.nonzero(),
        )?;
        counter(
            &mut enc,
            "switchyard_node_bytes_out",
            "Response bytes written, heads and bodies",
            m.bytes_out.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "switchyard_node_sendfile_bytes",
            "Body bytes sent with sendfile",
            m.sendfile_bytes.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "switchyard_node_connections",
            "Client connections accepted",
            m.connections_total.load(Relaxed),
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
        Ok(())
    }
}
