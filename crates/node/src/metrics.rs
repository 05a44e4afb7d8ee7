//! The node's Prometheus metrics.
//!
//! Hot-path counters are plain atomics (one per status code, indexed by
//! number, so counting a request is one relaxed add and no label lookup);
//! a collector turns them, and the object cache's own counters, into
//! metric families at scrape time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::store::Store;

/// Counters updated by connections.
#[derive(Debug)]
pub struct NodeMetrics {
    status: Box<[AtomicU64]>,
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
            status: (0..600).map(|_| AtomicU64::new(0)).collect(),
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
        if let Some(c) = self.status.get(code as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Responses sent with `code` so far.
    pub fn status_count(&self, code: u16) -> u64 {
        self.status
            .get(code as usize)
            .map_or(0, |c| c.load(Relaxed))
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

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = &self.metrics;
        {
            let c = ConstCounter::new(0u64);
            let mut family = enc.encode_descriptor(
                "switchyard_node_requests",
                "Responses sent, by status code",
                None,
                c.metric_type(),
            )?;
            for (code, n) in m.status.iter().enumerate() {
                let n = n.load(Relaxed);
                if n > 0 {
                    let labels = [("status", code.to_string())];
                    ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
                }
            }
        }
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
