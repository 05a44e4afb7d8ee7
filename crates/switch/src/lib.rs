//! `switchyard switch`: the layer-7 web switch that makes a set of nodes look like one web
//! server.
//!
//! The switch accepts client connections, parses every request with the same parser the nodes
//! use (`switchyard-http`, so both sides read message length the same way), asks the dispatching
//! policy (`switchyard-policy`) which node serves it — per request, also for the second and later
//! requests of a keep-alive connection — and relays the request to that node over a pooled
//! persistent connection and the response back (the two-way, TCP-gateway mechanism of seed 002).
//!
//! # The path of one request
//!
//! 1. **Accept** ([`start`], `Worker::accept_loop`). The switch runs thread-per-core, like the
//!    node: `workers` OS threads, each a single-threaded tokio runtime with its own
//!    `SO_REUSEPORT` listener (deep accept queue) on the same address. A client connection lives
//!    on the thread that accepted it, and so do the node connections it uses: every backend
//!    keeps one idle pool per worker thread. Policy, health, metrics and the configuration
//!    generation are shared by all threads. Beyond `max_connections` open client connections a
//!    new one is answered `503` with `Retry-After` and closed (seed 002 §2.2: refused at accept).
//! 2. **Parse** (`relay.rs`, `Client::next_head`). As in the node: an idle connection holds no
//!    buffers; the head must arrive within `header_timeout_ms` (408), limits give 414/431/413,
//!    every request-smuggling shape is 400, and the connection closes after an error.
//! 3. **Select** (`Client::choose`). The policy is asked under a mutex with the time since the
//!    switch started. A node is never chosen when it is down or at its in-flight cap; when every
//!    node is saturated the request waits in a bounded queue (`queue_max`, `queue_timeout_ms`)
//!    and is answered `503` + `Retry-After` if none frees up.
//! 4. **Forward** (`Client::exchange`). An idle pooled connection to the node is taken (one the
//!    node closed meanwhile is recognised without a system call and dropped) or a new one opened;
//!    the request head goes out with only hop-by-hop fields changed (`Connection`, `Keep-Alive`,
//!    ... removed, `X-Forwarded-For` appended, `Connection: keep-alive` for HTTP/1.0,
//!    `X-Switchyard-Relay` asking whether the response comes from the node's cache), then the
//!    body (`Content-Length`, or chunked checked by the strict decoder and forwarded as is).
//! 5. **Relay the response**. The node's head is parsed strictly ([`response`]) and rewritten
//!    for the client; the body follows by its framing. Large bodies move node → pipe → client with
//!    splice(2) (`splice_min_bytes`), smaller ones through a buffer. A node connection goes back
//!    to the pool only when its response was read completely.
//! 6. **Account**: `post_request` to the policy (with the node's `X-Switchyard-Cache` answer,
//!    removed from the client's head), per-node counters, the relay histogram; then
//!    the next request on the connection. Pipelined requests are handled one after the other, so
//!    they are answered in order.
//!
//! # One-way delivery (`mechanism = "handoff"`)
//!
//! With handoff, step 4 changes for a request without a body whose node has a `control`
//! address: instead of relaying, the switch hands the client's connection itself to the node
//! (`handoff.rs`): over the node's Unix control socket as a descriptor (same host), or as
//! `TCP_REPAIR` state over its TCP control connection with a steering entry that sends the
//! client's later packets to the node (another host). The node answers the client directly;
//! the switch learns of each finished request (`Served`, for the policy, saying whether it came
//! from the node's cache), of further requests
//! when persistent connections are routed (`Route` → serve, back-end forwarding or hand back —
//! multiple handoff, which the switch passes on to the next node), and of the end (`Closed`).
//! When a handoff cannot happen — control connection down, no steering, the node refuses, or
//! does not answer in time and then answers the switch's `Cancel` with `Drop` — the switch
//! relays that connection as above and counts the reason. When the answer stays unknown (no
//! answer to the `Cancel` either, or the control connection failed) the switch closes the
//! connection without writing to it (abandoned): the node may be serving it.
//!
//! # Failures, health and load
//!
//! An idempotent request without a body that fails on a node before any response byte reached
//! the client is retried on another node (`retries`); a pooled connection that turns out closed
//! before any response byte is replaced by a fresh one to the same node for an idempotent
//! request, while any other request is answered 502 rather than sent twice. Active health checks (`GET health_path`, any
//! status below 500 is healthy, `health_fall` / `health_rise`) and failed node connections take a
//! node out (`node_down`: its targets are re-assigned) and bring it back. Nodes may push load
//! reports (active connections, disk queue, cache counts) over UDP to `report_listen` on each
//! connection event — the distributed load monitor of seed 004 §2.2; the switch's own in-flight
//! count is the centralized one.
//!
//! # Operating it
//!
//! [`RunningSwitch::reload`] swaps in a new configuration (nodes, policy, limits) without closing
//! a client connection: requests in flight finish on the state they started with, nodes that stay
//! keep their pools and counters. [`RunningSwitch::shutdown`] stops accepting, closes idle client
//! connections, lets busy ones finish their response with `Connection: close` and waits up to a
//! grace period. Metrics (Prometheus, `/metrics` on the admin listener) are listed in
//! [`metrics`]; `/status.json` shows the nodes and the policy. The admin listener's `/` is the
//! live dashboard, fed once a second over server-sent events (`/events`, `/dashboard.json`) by
//! one sampling task (`dashboard`): per-node rates, response times (`Backend::latency`),
//! handoffs, fallbacks, health, the target map and the hottest targets. The page is read-only
//! unless `admin_actions` is set; then it can drain a node or mark it down or up (`actions`).
//!
//! # Modules
//!
//! Dependencies among the modules go one way, each using only those before it:
//!
//! 1. `error` ([`SwitchError`]), [`config`];
//! 2. `counters` (the switch's own counters, exported by [`metrics`]);
//! 3. `control`: one node's control connections, one per worker thread, with the handoffs
//!    waiting on each;
//! 4. `backend`: a node as the switch sees it (pool, health, counters, control connections);
//! 5. `generation`: one configuration in force (nodes, policy, limits, timeouts);
//! 6. `handed`: the shared table of connections living on nodes, steering entries, fallbacks;
//! 7. `state`: `Shared`, what every task of the switch shares;
//! 8. `health`, `report`: active health checks, load reports;
//! 9. `handoff`: offering a connection to a node, and each worker's control connections;
//! 10. `relay`: the client connection loop (hands connections off through `handoff`);
//! 11. [`metrics`]: the Prometheus registry and `/status.json` over the state; `dashboard`: the
//!     live dashboard's samples of the state;
//! 12. this file: wiring — start, reload, shutdown, the worker threads' accept loops, and the
//!     relay loop given to `handoff` for connections given back that no node takes.

pub mod config;
pub mod metrics;

pub mod actions;
mod backend;
mod control;
mod counters;
mod dashboard;
mod error;
mod generation;
mod handed;
mod handoff;
mod health;
mod relay;
mod report;
mod rescue;
mod state;

/// The strict node-response parser (kept under its old path).
pub use switchyard_http::upstream as response;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use prometheus_client::registry::Registry;
use switchyard_admin::{Admin, Page};
use switchyard_policy::{NodeId, NodeSpec};
use switchyard_runtime::accept::{accept_loop, AcceptStats, Incoming, Listener, WhenFull};
use switchyard_runtime::listen::{deferral, listen_reuseport};
use switchyard_runtime::per_worker::PerWorker;
use switchyard_runtime::{ClientSocket, Live, Workers};
use switchyard_upstream::splice::send_to_client;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::backend::Backend;
pub use crate::config::{NodeEntry, SwitchArgs, SwitchConfig};
pub use crate::error::SwitchError;
use crate::generation::{limits, timeouts, Generation};
use crate::handoff::ServeHere;
pub use crate::metrics::SwitchMetrics;
use crate::state::Shared;

/// A switch that is serving.
pub struct RunningSwitch {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    report_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    /// The worker threads: accept, relay, drain.
    workers: Workers,
    tasks: Vec<JoinHandle<()>>,
    reload_lock: tokio::sync::Mutex<()>,
}

impl RunningSwitch {
    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's address, if one was configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The UDP address that receives node load reports, if one was configured.
    pub fn report_addr(&self) -> Option<SocketAddr> {
        self.report_addr
    }

    /// The switch's counters.
    pub fn metrics(&self) -> &SwitchMetrics {
        &self.shared.metrics
    }

    /// One-way delivery counters: handoffs, hand-backs, back-end forwards, fallbacks by reason,
    /// connections on nodes, steering entries, handoff latency.
    pub fn handoff_metrics(&self) -> &switchyard_handoff::metrics::HandoffMetrics {
        &self.shared.handoffs.metrics
    }

    /// Wait until every node with a handoff control address has its control connections up
    /// (one per worker thread), at most `limit`; false if some are still down then (the
    /// connections of those workers to those nodes are relayed).
    pub async fn wait_for_controls(&self, limit: Duration) -> bool {
        let ready = async {
            loop {
                // Enabled before the check, so a connection that comes up in between wakes it.
                let mut up = std::pin::pin!(self.shared.control_up.notified());
                up.as_mut().enable();
                let g = self.shared.current();
                if g.nodes
                    .iter()
                    .all(|b| b.control.as_ref().is_none_or(|c| c.is_up()))
                {
                    return;
                }
                up.await;
            }
        };
        tokio::time::timeout(limit, ready).await.is_ok()
    }

    /// With `[rescue.peering]`: the site's rescue driver (status, change notifications).
    pub fn rescue_driver(&self) -> Option<Arc<switchyard_rescue_driver::Driver>> {
        self.shared.rescue.as_ref().map(|r| r.driver.clone())
    }

    /// What `/status.json` shows: nodes, policy counters, one-way delivery.
    pub fn status(&self) -> switchyard_admin::status::SwitchStatus {
        metrics::status(&self.shared)
    }

    /// The policy's counters (a snapshot).
    pub fn policy_stats(&self) -> switchyard_policy::PolicyStats {
        self.shared.current().policy.lock().stats()
    }

    /// Install a new configuration without closing a client connection. Nodes, policy, limits,
    /// timeouts, health checks, retries and `max_connections` take effect for requests that start
    /// from now on; requests in flight finish on the old state. `listen`, `admin`,
    /// `dashboard_viewers`, `report_listen`, `workers` and `defer_accept_ms` cannot change (an
    /// error says which). On an error nothing changes.
    pub async fn reload(&self, new: SwitchConfig) -> Result<(), SwitchError> {
        let _serial = self.reload_lock.lock().await;
        new.validate()?;
        let old = self.shared.current();
        if new.listen != old.cfg.listen {
            return Err(SwitchError::NotReloadable("listen"));
        }
        if new.admin != old.cfg.admin {
            return Err(SwitchError::NotReloadable("admin"));
        }
        if new.dashboard_viewers != old.cfg.dashboard_viewers {
            return Err(SwitchError::NotReloadable("dashboard_viewers"));
        }
        if new.report_listen != old.cfg.report_listen {
            return Err(SwitchError::NotReloadable("report_listen"));
        }
        if new.workers != old.cfg.workers {
            return Err(SwitchError::NotReloadable("workers"));
        }
        if new.defer_accept_ms != old.cfg.defer_accept_ms {
            return Err(SwitchError::NotReloadable("defer_accept_ms"));
        }
        let (gen, fresh) = build_generation(&self.shared, &new, Some(&old))?;
        let gen = Arc::new(gen);
        for b in &old.nodes {
            if gen.index_of(b).is_none() {
                b.retired.store(true, Relaxed);
                b.clear_idle();
            }
        }
        self.shared.install(gen.clone());
        // Health may have changed while the generation was built.
        {
            let mut p = gen.policy.lock();
            for (i, b) in gen.nodes.iter().enumerate() {
                if !b.is_up() {
                    p.node_down(NodeId(i as u32), self.shared.now());
                }
            }
        }
        for b in fresh {
            spawn_health(&self.shared, b);
        }
        resize_slots(
            &self.shared,
            old.cfg
                .connection_cap(self.shared.nofile, self.shared.workers),
            new.connection_cap(self.shared.nofile, self.shared.workers),
        );
        self.shared.metrics.reloads.fetch_add(1, Relaxed);
        self.shared.freed.notify_waiters();
        tracing::info!(
            generation = gen.id,
            nodes = gen.nodes.len(),
            policy = %gen.cfg.policy.name,
            "configuration reloaded"
        );
        Ok(())
    }

    /// Stop accepting, close idle client connections, let busy ones finish their current
    /// response (with `Connection: close`), and wait for them up to `grace`; then drop whatever
    /// is left.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(true);
        // Idle connections end now (after the signal: see `close_all`).
        self.shared.waiting.close_all();
        for t in &self.tasks {
            t.abort();
        }
        for t in self.shared.health_tasks.lock().iter() {
            t.abort();
        }
        self.workers.finish(grace).await;
        let g = self.shared.current();
        g.policy.lock().shutdown();
        for b in &g.nodes {
            b.clear_idle();
        }
        self.shared.handoffs.shutdown();
        tracing::info!("switch stopped");
    }
}

fn resize_slots(shared: &Shared, old: usize, new: usize) {
    if new > old {
        shared.slots.add_permits(new - old);
        shared.slots_total.fetch_add((new - old) as u32, Relaxed);
    } else if new < old {
        // Only free slots can be withdrawn; busy ones stay until the next reload or restart.
        let gone = shared.slots.forget_permits(old - new);
        shared.slots_total.fetch_sub(gone as u32, Relaxed);
    }
}

/// Build a generation for `cfg`, reusing the backends of `old` with the same address. Returns
/// the backends that are new (their health checks must start).
fn build_generation(
    shared: &Shared,
    cfg: &SwitchConfig,
    old: Option<&Generation>,
) -> Result<(Generation, Vec<Arc<Backend>>), SwitchError> {
    let mut nodes = Vec::with_capacity(cfg.nodes.len());
    let mut fresh = Vec::new();
    let mut specs = Vec::with_capacity(cfg.nodes.len());
    for (i, e) in cfg.nodes.iter().enumerate() {
        let reused = old.and_then(|g| {
            g.nodes
                .iter()
                .find(|b| {
                    b.addr == e.addr && b.control.as_ref().map(|c| &c.addr) == e.control.as_ref()
                })
                .cloned()
        });
        let b = match reused {
            Some(b) => {
                b.set_max_idle(cfg.pool_max_idle);
                b
            }
            None => {
                let b = Arc::new(Backend::new(
                    e.addr,
                    cfg.pool_max_idle,
                    e.control.clone(),
                    shared.workers,
                ));
                fresh.push(b.clone());
                b
            }
        };
        nodes.push(b);
        let cap = e.max_inflight.or(match cfg.node_max_inflight {
            0 => None,
            n => Some(n),
        });
        let mut spec = NodeSpec::new(i as u32).with_weight(e.weight);
        if let Some(c) = cap {
            spec = spec.with_capacity(c);
        }
        specs.push(spec);
    }
    let mut policy =
        switchyard_policy::build(&cfg.policy).map_err(|e| SwitchError::Config(e.to_string()))?;
    let now = shared.now();
    policy
        .init(&specs, now)
        .map_err(|e| SwitchError::Config(e.to_string()))?;
    for (i, b) in nodes.iter().enumerate() {
        if !b.is_up() {
            policy.node_down(NodeId(i as u32), now);
        }
    }
    Ok((
        Generation {
            id: shared.next_gen.fetch_add(1, Relaxed),
            cfg: cfg.clone(),
            limits: limits(cfg),
            t: timeouts(cfg),
            nodes,
            policy: Mutex::new(policy),
        },
        fresh,
    ))
}

/// Start `b`'s health checks. (Its control connections are started by each worker thread,
/// [`handoff::run_worker_links`].)
fn spawn_health(shared: &Arc<Shared>, b: Arc<Backend>) {
    let t = tokio::spawn(health::run(shared.clone(), b));
    let mut tasks = shared.health_tasks.lock();
    tasks.retain(|t| !t.is_finished());
    tasks.push(t);
}

/// The name of a switch's steering state (eBPF pins on the host-wide BPF file system, the
/// nftables table): its network namespace and port. Switches in other namespaces or on other
/// ports keep apart, and a switch started where one was killed (SIGKILL leaves pins, the tc
/// attachment and the table behind) takes the same name, so its setup replaces what its
/// predecessor left instead of adding its own beside it.
fn steering_instance(port: u16) -> String {
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata("/proc/self/ns/net").map_or_else(
        |_| format!("pid{}", std::process::id()),
        |m| m.ino().to_string(),
    );
    format!("switch-{ns}-{port}")
}

/// Bind the switch's listeners and start serving.
///
/// Client connections are served by `workers` threads of their own (one per core by default),
/// each a single-threaded tokio runtime with its own `SO_REUSEPORT` listener; health checks,
/// the load-report receiver and the admin listener run on the caller's runtime.
pub async fn start(cfg: SwitchConfig) -> Result<RunningSwitch, SwitchError> {
    cfg.validate()?;
    let bind_err = |source| SwitchError::Bind {
        addr: cfg.listen,
        source,
    };
    let workers = switchyard_runtime::listen::worker_count(cfg.workers);
    let (addr, listeners) =
        listen_reuseport(cfg.listen, workers, deferral(cfg.defer_accept_ms)).map_err(bind_err)?;
    let (stop, stop_rx) = watch::channel(false);
    let nofile = switchyard_runtime::nofile::raise().map_or(4096 * 2 + 2048, |l| l.soft);
    let max = cfg.connection_cap(nofile, workers);
    tracing::info!(
        max_connections = max,
        descriptors = nofile,
        "client connection cap"
    );
    let placeholder = Generation {
        id: 0,
        cfg: cfg.clone(),
        limits: limits(&cfg),
        t: timeouts(&cfg),
        nodes: Vec::new(),
        policy: Mutex::new(
            switchyard_policy::build(&cfg.policy)
                .map_err(|e| SwitchError::Config(e.to_string()))?,
        ),
    };
    let rescue = match cfg.rescue.as_ref().filter(|r| r.peering.is_some()) {
        Some(r) => {
            Some(rescue::SiteRescue::start(r, cfg.mechanism == config::Mechanism::Handoff).await?)
        }
        None => None,
    };
    let shared = Arc::new(Shared {
        origin: Instant::now(),
        gen: RwLock::new(Arc::new(placeholder)),
        gen_id: watch::Sender::new(0),
        workers,
        next_gen: AtomicU64::new(1),
        metrics: SwitchMetrics::new(workers),
        stop: stop_rx.clone(),
        freed: Notify::new(),
        queue_len: AtomicUsize::new(0),
        next_conn: AtomicU64::new(1),
        slots: Arc::new(Semaphore::new(max)),
        slots_total: AtomicU32::new(max as u32),
        refusing: AtomicUsize::new(0),
        health_tasks: Mutex::new(Vec::new()),
        handoffs: handed::Handoffs::new(&cfg, &steering_instance(addr.port())),
        control_up: Notify::new(),
        accepts: AcceptStats::default(),
        waiting: switchyard_runtime::shed::WaitingClients::new(),
        nofile,
        hot: PerWorker::with(workers, || {
            Mutex::new(switchyard_admin::dashboard::HotTargets::new(
                dashboard::HOT_CAPACITY,
            ))
        }),
        rescue,
    });
    let (gen, fresh) = build_generation(&shared, &cfg, None)?;
    shared.install(Arc::new(gen));
    for b in fresh {
        spawn_health(&shared, b);
    }

    let mut tasks = vec![tokio::spawn(handoff::run_linger(shared.clone()))];
    let report_addr = match cfg.report_listen {
        Some(a) => {
            let sock = tokio::net::UdpSocket::bind(a)
                .await
                .map_err(|source| SwitchError::Bind { addr: a, source })?;
            let bound = sock
                .local_addr()
                .map_err(|source| SwitchError::Bind { addr: a, source })?;
            tasks.push(tokio::spawn(report::receive(
                shared.clone(),
                sock,
                stop_rx.clone(),
            )));
            Some(bound)
        }
        None => None,
    };
    let admin_addr = match cfg.admin {
        Some(a) => {
            let mut registry = Registry::default();
            metrics::register(&mut registry, shared.clone());
            if let Some(r) = &shared.rescue {
                switchyard_rescue_driver::metrics::register(
                    &mut registry,
                    r.driver.status_source(),
                );
            }
            let admin_listener = Admin::bind(a).await?;
            let bound = admin_listener
                .local_addr()
                .map_err(|source| SwitchError::Bind { addr: a, source })?;
            let s = shared.clone();
            let (publisher, feed) = switchyard_admin::dashboard::feed::channel(
                cfg.dashboard_viewers,
                dashboard::HISTORY,
            );
            let latest = feed.clone();
            let admin = Admin::new(registry)
                .route(
                    "/status.json",
                    Arc::new(move || Page {
                        content_type: "application/json",
                        body: metrics::status_json(&s).into_bytes(),
                    }),
                )
                .route("/", Arc::new(switchyard_admin::dashboard::page))
                .route(
                    "/dashboard.json",
                    Arc::new(move || Page {
                        content_type: "application/json",
                        body: latest.latest_json().into_bytes(),
                    }),
                )
                .events("/events", feed)
                .actions({
                    let (on, s) = (shared.clone(), shared.clone());
                    switchyard_admin::actions::Actions::new(
                        Arc::new(move || on.current().cfg.admin_actions),
                        Arc::new(move |rest| actions::run(&s, rest)),
                    )?
                });
            let admin = match &shared.rescue {
                Some(r) => {
                    let src = r.driver.status_source();
                    let path = cfg
                        .rescue
                        .as_ref()
                        .map_or("/dotslash-status", |r| r.status_path.as_str());
                    admin.route_query(
                        path,
                        Arc::new(move |q| {
                            let (content_type, body) =
                                switchyard_rescue_driver::status_page(&src, q);
                            Page { content_type, body }
                        }),
                    )
                }
                None => admin,
            };
            tasks.push(tokio::spawn(dashboard::run(
                shared.clone(),
                publisher,
                stop_rx.clone(),
            )));
            tasks.push(tokio::spawn(admin.serve(admin_listener, stop_rx.clone())));
            Some(bound)
        }
        None => None,
    };

    let accept_shared = shared.clone();
    // A listener on a wildcard address does not say which address a client reached.
    let local = (!addr.ip().is_unspecified()).then_some(addr);
    let spawned = Workers::spawn(
        "sy-switch",
        listeners,
        stop_rx,
        move |index, listener, live| {
            let worker = Worker {
                shared: accept_shared.clone(),
                index,
                local,
            };
            async move {
                // This thread's own control connections to the nodes.
                tokio::spawn(handoff::run_worker_links(
                    worker.shared.clone(),
                    index,
                    serve_here(&worker.shared, index),
                ));
                worker.accept_loop(&listener, &live).await
            }
        },
    );
    let workers_running = match spawned {
        Ok(w) => w,
        Err(e) => {
            // Stop what has started.
            let _ = stop.send(true);
            for t in &tasks {
                t.abort();
            }
            for t in shared.health_tasks.lock().iter() {
                t.abort();
            }
            return Err(SwitchError::Config(format!(
                "cannot start worker thread: {e}"
            )));
        }
    };
    tracing::info!(
        %addr,
        workers,
        nodes = cfg.nodes.len(),
        policy = %cfg.policy.name,
        admin = ?admin_addr,
        reports = ?report_addr,
        "switch serving"
    );
    Ok(RunningSwitch {
        addr,
        admin_addr,
        report_addr,
        shared,
        stop,
        workers: workers_running,
        tasks,
        reload_lock: tokio::sync::Mutex::new(()),
    })
}

/// The answer to a connection over the cap.
const REFUSE_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 24\r\nRetry-After: 1\r\nConnection: close\r\n\r\n503 Service Unavailable\n";
/// Most connections over the cap being answered at once; beyond it they are closed unanswered.
const MAX_REFUSING: usize = 1024;

/// How worker `worker` serves a connection a node gave back that no other node took: the
/// relay loop.
fn serve_here(shared: &Arc<Shared>, worker: usize) -> ServeHere {
    let shared = shared.clone();
    Arc::new(move |stream, peer, local, pre| {
        Box::pin(relay::serve_with(
            shared.clone(),
            worker,
            stream.into(),
            peer,
            Some(local),
            pre,
        ))
    })
}

/// A worker thread's accept loop: its client connections, the node connections they use and
/// its control connections to the nodes stay on its thread.
struct Worker {
    shared: Arc<Shared>,
    /// The worker's index (of its control connections).
    index: usize,
    /// The listener's address, unless it is a wildcard one.
    local: Option<SocketAddr>,
}

impl Worker {
    async fn accept_loop(&self, listener: &Listener, live: &Live) {
        let shared = &self.shared;
        // Connections beyond the slots are accepted and answered `503`.
        accept_loop(
            listener,
            &shared.slots,
            &shared.waiting,
            WhenFull::Refuse,
            &shared.accepts,
            |incoming| {
                shared.metrics.connections_total.fetch_add(1, Relaxed);
                let (stream, peer, permit) = match incoming {
                    Incoming::Admitted { stream, peer, slot } => (stream, peer, slot),
                    Incoming::Over { stream, .. } => return refuse(shared, stream),
                };
                shared.metrics.connections_active.fetch_add(1, Relaxed);
                let held = Held {
                    shared: shared.clone(),
                    _permit: permit,
                    _live: live.clone(),
                };
                let (index, local) = (self.index, self.local);
                tokio::spawn(async move {
                    relay::serve(held.shared.clone(), index, stream, peer, local).await;
                    drop(held);
                });
            },
        )
        .await;
    }
}

/// What a client connection holds while it is open; released also when the connection is
/// dropped at the end of the grace period.
struct Held {
    shared: Arc<Shared>,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _live: Live,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shared.metrics.connections_active.fetch_sub(1, Relaxed);
    }
}

/// Answer a connection over the cap with 503 and close it, lingering briefly so that the answer
/// is not destroyed by a reset.
fn refuse(shared: &Arc<Shared>, stream: ClientSocket) {
    shared
        .metrics
        .count_rejection(metrics::Rejection::ConnectionLimit);
    shared.metrics.count_status(503);
    if shared.refusing.fetch_add(1, Relaxed) >= MAX_REFUSING {
        shared.refusing.fetch_sub(1, Relaxed);
        return;
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut stream = stream;
        let until = tokio::time::Instant::now() + Duration::from_secs(1);
        let (_, sent) = send_to_client(&mut stream, REFUSE_503, false, until).await;
        if let (Ok(()), Ok(s)) = (sent, stream.registered()) {
            switchyard_runtime::close::linger_until(s, until).await;
        }
        shared.refusing.fetch_sub(1, Relaxed);
    });
}
