//! A back-end node as the switch sees it: its pool of persistent connections, its health and
//! its counters. A `Backend` outlives configuration reloads that keep its address, so its pool,
//! health and counters carry over.
//!
//! The pool ([`switchyard_upstream::Pool`]) keeps idle connections per thread: a tokio
//! connection is registered with the reactor of the runtime that opened it, so a pooled
//! connection is handed out only on the thread that returned it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
pub(crate) use switchyard_admin::dashboard::Hold;
use switchyard_admin::dashboard::{LatencyCounts, LatencyHistogram, LatencyTotals};
use switchyard_policy::LoadReport;
use switchyard_runtime::per_worker::PerWorker;
use switchyard_upstream::{Connection, Pool};

use crate::config::ControlAddr;
use crate::control::Control;

/// One back-end node.
#[derive(Debug)]
pub(crate) struct Backend {
    pub addr: SocketAddr,
    /// Label used in metrics and logs.
    pub label: String,
    /// Idle persistent connections to the node, per thread; at most `pool_max_idle` over all
    /// threads.
    pool: Pool,
    /// In the pool of nodes that may be chosen.
    pub up: AtomicBool,
    /// Held out of service by the operator (0: not held, 1: drained, 2: marked down). Health
    /// checks do not bring a held node back.
    pub held: AtomicU8,
    /// Consecutive failures (health checks and failed node connections).
    pub fails: AtomicU32,
    /// Consecutive successful health checks while down.
    pub rises: AtomicU32,
    /// No longer part of the configuration: its health checker stops.
    pub retired: AtomicBool,
    /// What the node served, counted by each worker apart (every response adds to these).
    served: PerWorker<Served>,
    pub active: AtomicU64,
    pub failures: AtomicU64,
    pub connects: AtomicU64,
    /// Connections handed off to the node (its `Accepted` answers).
    pub handoffs: AtomicU64,
    /// Handoffs to the node that fell back (relayed or abandoned).
    pub fallbacks: AtomicU64,
    pub last_report: Mutex<Option<LoadReport>>,
    /// The node's handoff control connections (one per worker thread), when it has a control
    /// address.
    pub control: Option<std::sync::Arc<Control>>,
}

/// One worker's counts of what a node served.
#[derive(Debug, Default)]
struct Served {
    /// Responses: relayed from the node, or reported served by it on handed-off connections.
    requests: AtomicU64,
    /// Their bytes.
    bytes: AtomicU64,
    /// Responses whose source (memory cache or not) the node reported.
    cache_reported: AtomicU64,
    /// Of those, the ones it answered from its memory cache.
    cache_hits: AtomicU64,
    /// Response times, as the switch sees them: relayed, from the parsed head to the last
    /// byte relayed; handed off, from the dispatch to the node's `Served`.
    latency: LatencyHistogram,
}

impl Backend {
    /// One response the node served in `took`, of `bytes`; its source as the node reported
    /// it (`None`: not reported).
    pub fn count_response(&self, bytes: u64, from_cache: Option<bool>, took: Duration) {
        let s = self.served.local();
        s.requests.fetch_add(1, Relaxed);
        s.bytes.fetch_add(bytes, Relaxed);
        if let Some(hit) = from_cache {
            s.cache_reported.fetch_add(1, Relaxed);
            if hit {
                s.cache_hits.fetch_add(1, Relaxed);
            }
        }
        s.latency.observe(took);
    }

    /// `requests` responses of `bytes` in all that the node served without a time or source
    /// (a redirect's target; those a node served on a handed-off connection without asking).
    pub fn count_served(&self, requests: u64, bytes: u64) {
        let s = self.served.local();
        s.requests.fetch_add(requests, Relaxed);
        s.bytes.fetch_add(bytes, Relaxed);
    }

    /// Responses the node served so far.
    pub fn requests(&self) -> u64 {
        self.served.sum(|s| &s.requests)
    }

    /// Their bytes.
    pub fn bytes(&self) -> u64 {
        self.served.sum(|s| &s.bytes)
    }

    /// Responses whose source the node reported, and of those its cache hits.
    pub fn cache_counts(&self) -> (u64, u64) {
        (
            self.served.sum(|s| &s.cache_reported),
            self.served.sum(|s| &s.cache_hits),
        )
    }

    /// The response times counted so far.
    pub fn latency(&self) -> LatencyCounts {
        LatencyTotals::of(self.served.iter().map(|s| &s.latency)).counts
    }

    /// A backend keeping at most `max_idle` idle connections, with a control connection per
    /// worker thread (of `workers`) when it has a control address.
    pub fn new(
        addr: SocketAddr,
        max_idle: usize,
        control: Option<ControlAddr>,
        workers: usize,
    ) -> Self {
        Backend {
            addr,
            label: addr.to_string(),
            pool: Pool::new(max_idle, usize::MAX),
            up: AtomicBool::new(true),
            held: AtomicU8::new(0),
            fails: AtomicU32::new(0),
            rises: AtomicU32::new(0),
            retired: AtomicBool::new(false),
            served: PerWorker::new(workers),
            active: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            handoffs: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            last_report: Mutex::new(None),
            control: control.map(|c| std::sync::Arc::new(Control::new(c, workers))),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    /// Hold the node out (`Some`) or not (`None`).
    pub fn set_hold(&self, how: Option<Hold>) {
        let v = match how {
            None => 0,
            Some(Hold::Drain) => 1,
            Some(Hold::Down) => 2,
        };
        self.held.store(v, Relaxed);
    }

    /// How the operator holds the node out, if they do.
    pub fn hold(&self) -> Option<Hold> {
        match self.held.load(Relaxed) {
            1 => Some(Hold::Drain),
            2 => Some(Hold::Down),
            _ => None,
        }
    }

    /// An idle pooled connection opened on this thread that still looks open, if any.
    pub fn take_idle(&self) -> Option<Connection> {
        self.pool.take(self.addr)
    }

    /// Return a connection whose last response was read completely. At most `max_idle` are
    /// kept per node, over all threads; none while the node is down or retired.
    pub fn put_idle(&self, c: Connection) {
        if !self.is_up() || self.retired.load(Relaxed) {
            return;
        }
        self.pool.put(c);
    }

    /// Change how many idle connections are kept.
    pub fn set_max_idle(&self, max_idle: usize) {
        self.pool.set_max_idle(max_idle);
    }

    /// Close every idle connection of every thread (node went down or left the
    /// configuration).
    pub fn clear_idle(&self) {
        self.pool.clear();
    }

    pub fn idle_count(&self) -> usize {
        self.pool.idle()
    }

    /// Open a new connection to the node.
    pub async fn connect(&self, limit: Duration) -> Result<Connection, switchyard_upstream::Error> {
        self.connects.fetch_add(1, Relaxed);
        switchyard_upstream::connect(self.addr, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A down or retired node's connections are not kept, `max_idle` holds over the node, and
    /// connections are counted as they are opened.
    #[tokio::test]
    async fn pool_follows_the_node_state() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = Backend::new(l.local_addr().unwrap(), 2, None, 1);
        let limit = Duration::from_secs(5);
        for _ in 0..3 {
            let c = b.connect(limit).await.unwrap();
            b.put_idle(c);
        }
        assert_eq!(b.connects.load(Relaxed), 3);
        assert_eq!(b.idle_count(), 2);
        assert!(b.take_idle().is_some_and(|c| c.reused()));
        b.up.store(false, Relaxed);
        b.put_idle(b.connect(limit).await.unwrap());
        assert_eq!(b.idle_count(), 1);
        b.up.store(true, Relaxed);
        b.retired.store(true, Relaxed);
        b.put_idle(b.connect(limit).await.unwrap());
        assert_eq!(b.idle_count(), 1);
        b.clear_idle();
        assert_eq!(b.idle_count(), 0);
        assert!(b.take_idle().is_none());
    }
}
