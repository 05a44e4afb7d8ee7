//! The state every task of one switch shares: the generation in force, the counters, the
//! connection slots, the table of connections living on nodes, and the node health
//! transitions that the policy must hear of.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_runtime::accept::AcceptStats;
use switchyard_runtime::per_worker::PerWorker;

use parking_lot::{Mutex, RwLock};
use switchyard_admin::dashboard::HotTargets;
use switchyard_policy::NodeId;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::backend::{Backend, Hold};
use crate::config::SwitchConfig;
use crate::counters::SwitchMetrics;
use crate::generation::Generation;
use crate::handed::Handoffs;

/// State shared by every task of one switch.
pub(crate) struct Shared {
    pub origin: Instant,
    pub(crate) gen: RwLock<Arc<Generation>>,
    /// The id of the generation in force, for the tasks that follow reloads (each worker's
    /// control connections).
    pub(crate) gen_id: watch::Sender<u64>,
    /// Worker threads serving client connections (each keeps its own control connections).
    pub workers: usize,
    pub(crate) next_gen: AtomicU64,
    pub metrics: SwitchMetrics,
    pub stop: watch::Receiver<bool>,
    /// Signalled when a request finishes while others wait in the queue, or a node comes up:
    /// queued requests try again.
    pub freed: Notify,
    pub queue_len: AtomicUsize,
    pub next_conn: AtomicU64,
    /// Client connection slots.
    pub slots: Arc<Semaphore>,
    /// Current number of slots in total.
    pub slots_total: AtomicU32,
    /// Small tasks answering connections over the cap.
    pub refusing: AtomicUsize,
    /// Health-check tasks started, one per backend.
    pub(crate) health_tasks: Mutex<Vec<JoinHandle<()>>>,
    /// One-way delivery: control connections' shared state, handed-off connections, steering.
    pub(crate) handoffs: Handoffs,
    /// Signalled whenever a control connection to a node comes up.
    pub control_up: Notify,
    /// The worker threads' accept loops.
    pub accepts: AcceptStats,
    /// Client connections waiting on their clients, to shed for new ones when every slot is
    /// taken.
    pub waiting: Arc<switchyard_runtime::shed::WaitingClients>,
    /// The descriptor limit in force (soft), read at start.
    pub nofile: u64,
    /// The most requested targets since the dashboard's last sample, with their nodes: one
    /// counter per thread that counts ([`Shared::dispatched`]), merged when sampled, so that
    /// no lock or cache line is written by every thread at every request.
    pub hot: PerWorker<Mutex<HotTargets>>,
    /// With `[rescue.peering]`: the rescue driver of the site this switch is the face of.
    pub(crate) rescue: Option<crate::rescue::SiteRescue>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("generation", &self.current().id)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// The generation in force.
    pub fn current(&self) -> Arc<Generation> {
        self.gen.read().clone()
    }

    /// Put `gen` in force.
    pub fn install(&self, gen: Arc<Generation>) {
        let id = gen.id;
        *self.gen.write() = gen;
        self.gen_id.send_replace(id);
    }

    /// Time since the switch started, the policies' clock.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Take a node out: the policy stops choosing it and re-assigns its targets.
    pub fn mark_down(&self, b: &Backend, why: &str) {
        if b.up.swap(false, Relaxed) {
            b.rises.store(0, Relaxed);
            b.clear_idle();
            let g = self.current();
            if let Some(i) = g.index_of(b) {
                g.policy.lock().node_down(NodeId(i as u32), self.now());
            }
            self.metrics.node_transitions.fetch_add(1, Relaxed);
            tracing::warn!(node = %b.addr, reason = why, "node down");
        }
    }

    /// Bring a node back.
    pub fn mark_up(&self, b: &Backend) {
        if !b.up.swap(true, Relaxed) {
            b.fails.store(0, Relaxed);
            let g = self.current();
            if let Some(i) = g.index_of(b) {
                g.policy.lock().node_up(NodeId(i as u32), self.now());
            }
            self.metrics.node_transitions.fetch_add(1, Relaxed);
            self.freed.notify_waiters();
            tracing::info!(node = %b.addr, "node up");
        }
    }

    /// The operator holds `b` out of service: the policy stops choosing it at once; requests
    /// in flight on it finish (neither holding cuts one). Health checks leave it out until
    /// [`release`](Self::release).
    pub fn hold(&self, b: &Backend, how: Hold) {
        b.set_hold(Some(how));
        self.mark_down(
            b,
            match how {
                Hold::Drain => "drained by the operator",
                Hold::Down => "marked down by the operator",
            },
        );
    }

    /// The operator puts `b` back: it is up at once; if it is in fact unreachable, health
    /// checks and failed requests take it out again as for any node.
    pub fn release(&self, b: &Backend) {
        b.set_hold(None);
        b.rises.store(0, Relaxed);
        self.mark_up(b);
    }

    /// A request on `b` failed because of the node. `unreachable`: the node refused or did
    /// not answer a connection attempt. Takes the node out after `health_fall` consecutive
    /// failures (at once when unreachable), when active checks can bring it back.
    pub fn node_failed(&self, b: &Backend, unreachable: bool, cfg: &SwitchConfig) {
        b.failures.fetch_add(1, Relaxed);
        let fails = b.fails.fetch_add(1, Relaxed) + 1;
        if cfg.health_interval_ms > 0 && (unreachable || fails >= cfg.health_fall) {
            self.mark_down(
                b,
                if unreachable {
                    "unreachable"
                } else {
                    "failures"
                },
            );
        }
    }

    /// A request for `target` was dispatched to node `node` (an index of the generation in
    /// force): counted for the dashboard's hot targets.
    pub fn dispatched(&self, target: &str, node: usize) {
        self.hot.local().lock().record(target, node as u32);
    }

    /// A request's node is free again: a request waiting in the queue for one may go. Only
    /// then is the notification touched (it is shared by every thread); a request that joins
    /// the queue counts itself before it asks the policy again, so it either sees the node
    /// free or is counted here.
    pub fn request_done(&self) {
        if self.queue_len.load(SeqCst) != 0 {
            self.freed.notify_one();
        }
    }

    /// A request on `b` succeeded.
    pub fn node_ok(&self, b: &Backend) {
        if b.fails.load(Relaxed) != 0 {
            b.fails.store(0, Relaxed);
        }
    }
}
