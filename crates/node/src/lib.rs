//! `switchyard node`: the cluster's back-end web server.
//!
//! A node serves static files from a document root over HTTP/1.0 and
//! HTTP/1.1 (keep-alive, pipelining, GET and HEAD, validators and 304,
//! single byte ranges), keeps hot files in a byte-bounded object cache
//! with a pluggable replacement policy (`switchyard-cache`), sends files
//! too large for the cache with `sendfile(2)`, can emulate a slow disk for
//! experiments or read misses with `O_DIRECT` past the page cache, and
//! exports Prometheus metrics on an admin listener.
//!
//! The flow of one request: [`start`] binds the listener and accepts;
//! each connection runs in `conn`, which parses request heads with
//! `switchyard-http`, maps the target to a clean path, asks the
//! [`store::Store`] for the body (cache, then disk beneath the root via
//! `openat2(RESOLVE_BENEATH)`), writes the head and body, and loops for the
//! next request on the connection.
//!
//! With `handoff_unix` or `handoff_listen` set, a switch may also hand the
//! node client connections it has accepted (one-way delivery, `handoff`):
//! the node serves them with the same loop, answers the clients directly,
//! and reports to the switch over the control connection.
//!
//! With `[dynamic]` set, requests for its paths are forwarded to an
//! application server on the node's host instead (`conn::dynamic`), on
//! every connection however it arrived.
//!
//! In cooperative mode (`cluster`, seed 000) there is no switch: every node
//! accepts clients, and a request owned by another member moves there with
//! its connection and comes back once answered (`coop`); hot objects are
//! copied to the members that ask for them (`replica`), and the admin
//! listener adds `/status.json` with the cluster as this member sees it,
//! `/member.json` with its own figures, and the whole cluster's live
//! dashboard at `/` (`dashboard`: fed from every member's `/member.json`).
//!
//! # Module order
//!
//! Dependencies among the modules go one way, from the bottom up:
//!
//! 1. `config`, `error`, `fs`, `disk`: configuration, errors, the document
//!    root and the disk model;
//! 2. [`store`] (cache and disk reads), then [`metrics`] and [`report`]
//!    (counters and load reports over the store);
//! 3. `forward`: fetching a response from another node; `rescue`: the rescue server's virtual
//!    hosts and reverse caching proxy (seed 001), whose connection-side part
//!    (`rescue/serve.rs`) is a child module of `conn`;
//! 4. `conn`: the connection loop, with what every connection shares and
//!    the `Router` trait through which a handed-in connection is routed
//!    request by request; it knows nothing of switches or handoffs. Its
//!    child `conn::dynamic` answers dynamic paths from the application
//!    server;
//! 5. `handoff`: the control connections, taking connections in, and the
//!    router that asks the switch; it serves through `conn`;
//! 6. `coop`: cooperative mode — the membership (reloaded on SIGHUP), the owner map, the control connections
//!    to the peers, cloning a connection to the owner of its request and
//!    taking it back; it serves through `conn`, and the peers' clones come
//!    in through `handoff`;
//! 7. `dashboard`: the cooperative cluster's live dashboard, from `coop`'s figures and the
//!    peers' `/member.json`;
//! 8. the crate root: [`start`], the accept loops, [`RunningNode`].

pub mod arena;
pub mod config;
mod conn;
mod coop;
mod dashboard;
pub mod disk;
mod error;
mod forward;
pub mod fs;
mod handoff;
pub mod metrics;
mod replica;
pub mod report;
mod rescue;
pub mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use switchyard_admin::Admin;
use switchyard_handoff::link::ControlAddr;
use switchyard_http::request::Limits;
use switchyard_runtime::accept::{accept_loop, Incoming, Listener, WhenFull};
use switchyard_runtime::listen::{deferral, listen_reuseport};
use switchyard_runtime::park::{Parking, Unparked};
use switchyard_runtime::shed::WaitingClients;
use switchyard_runtime::{ClientSocket, Live, Workers};
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

pub use config::{ClusterConfig, ClusterMechanism, DiskConfig, DynamicConfig, Member, NodeConfig};
use conn::Ctx;
pub use error::NodeError;
pub use metrics::NodeMetrics;
pub use rescue::{RescueHandle, RescueStats};
pub use store::Store;
pub use switchyard_rescue::RescueConfig;

/// A node that is serving.
pub struct RunningNode {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    metrics: Arc<NodeMetrics>,
    store: Arc<Store>,
    stop: watch::Sender<bool>,
    workers: Workers,
    tasks: Vec<JoinHandle<()>>,
    handoff: handoff::Listeners,
    cluster: Option<Arc<coop::Membership>>,
    rescue: Option<Arc<rescue::RescueProxy>>,
    driver: Option<Arc<switchyard_rescue_driver::Driver>>,
    parkings: Arc<std::sync::Mutex<Vec<Parking<Held>>>>,
    /// Connections waiting on their clients: those that stay here are ended by it at
    /// shutdown.
    waiting: Arc<WaitingClients>,
}

impl RunningNode {
    /// On a rescue server (`[rescue]`): the handle that adds and ends the origins it serves.
    pub fn rescue(&self) -> Option<RescueHandle> {
        self.rescue.clone().map(RescueHandle)
    }

    /// With `[rescue.peering]`: the rescue driver (its status, its peering address).
    pub fn rescue_driver(&self) -> Option<Arc<switchyard_rescue_driver::Driver>> {
        self.driver.clone()
    }

    /// The address the web server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's address, if one was configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The bound address of the TCP handoff control listener
    /// (`handoff_listen`), if one was configured.
    pub fn handoff_addr(&self) -> Option<SocketAddr> {
        self.handoff.tcp_addr
    }

    /// The path of the Unix handoff control listener (`handoff_unix`), if
    /// one was configured.
    pub fn handoff_unix(&self) -> Option<&Path> {
        self.handoff.unix_path.as_deref()
    }

    /// Idle keep-alive connections parked without a task of their own, on every worker.
    pub fn parked_connections(&self) -> usize {
        lock(&self.parkings).iter().map(Parking::len).sum()
    }

    /// The node's counters.
    pub fn metrics(&self) -> &Arc<NodeMetrics> {
        &self.metrics
    }

    /// Cooperative mode: wait until the control connection to every peer is up (`false` if
    /// `timeout` passed first, or the node is not in cooperative mode).
    pub async fn wait_for_peers(&self, timeout: Duration) -> bool {
        match &self.cluster {
            Some(c) => coop::wait_for_peers(c, timeout).await,
            None => false,
        }
    }

    /// Cooperative mode: replace the cluster's membership and owner map by `cfg`'s (what
    /// SIGHUP does). Connections accepted from now on follow the new map; open ones finish
    /// with the old. This node's name and control address, and replication's settings, take
    /// a restart.
    pub fn reload_cluster(&self, cfg: &ClusterConfig) -> Result<(), NodeError> {
        match &self.cluster {
            Some(m) => m.reload(cfg),
            None => Err(NodeError::Config(
                "[cluster]: the node was not started in cooperative mode".into(),
            )),
        }
    }

    /// The node's store (cache statistics, disk queue).
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Stop accepting, let open connections finish their current response
    /// (idle ones close at once, but for those whose client's bytes have
    /// already arrived), and wait for them up to `grace`; then
    /// drop whatever is left. Handoff control connections stay open while
    /// the connections drain (a switch's `Create` is refused with
    /// `ShuttingDown` meanwhile) and close afterwards; the Unix control
    /// socket's file is removed.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(true);
        // Idle connections that stay here end now (after the signal: see `close_all`).
        self.waiting.close_all();
        for t in &self.tasks {
            t.abort();
        }
        self.workers.finish(grace).await;
        self.handoff.close().await;
        if let Some(c) = &self.cluster {
            c.current().shutdown_steering();
        }
    }
}

/// Descriptors kept for what is not a client connection: listeners, the admin listener,
/// the runtime's own (epoll, eventfds), handoff control connections, log files, the object
/// arena's memfd.
const RESERVED_DESCRIPTORS: u64 = 1024;
/// Descriptors one client connection may hold at once: its socket and a file it is sent (or a
/// connection to the node it is forwarded from).
const DESCRIPTORS_PER_CONNECTION: u64 = 2;

/// The connection cap: as configured, or derived from the descriptor limit (raised to its
/// hard limit first, [`switchyard_runtime::nofile`]).
fn max_connections(cfg: &NodeConfig) -> Result<usize, NodeError> {
    let limit = switchyard_runtime::nofile::raise().ok();
    let derived = limit.map(|l| {
        switchyard_runtime::nofile::derive_max_connections(
            l.soft,
            RESERVED_DESCRIPTORS,
            DESCRIPTORS_PER_CONNECTION,
        )
    });
    let n = match cfg.max_connections {
        Some(n) => {
            if let (Some(l), Some(d)) = (limit, derived) {
                if n > d {
                    tracing::warn!(
                        max_connections = n,
                        descriptors = l.soft,
                        safe = d,
                        "max_connections is above what the descriptor limit allows"
                    );
                }
            }
            n
        }
        None => derived.unwrap_or(4096),
    };
    if n == 0 || n > u32::MAX as usize {
        return Err(NodeError::Config("max_connections must be positive".into()));
    }
    Ok(n)
}

fn limits(cfg: &NodeConfig) -> Limits {
    Limits {
        max_request_line: cfg.max_request_line,
        max_head_bytes: cfg.max_head_bytes,
        max_body_bytes: cfg.max_body_bytes,
    }
}

/// Bind the node's listeners and start serving.
///
/// The node runs thread-per-core, like the event-loop servers it is
/// measured against: `workers` threads (one per core by default), each a
/// single-threaded tokio runtime with its own `SO_REUSEPORT` listener on
/// the same address. A connection lives and dies on the thread that
/// accepted it, so short connections cost no cross-thread wakeups. The
/// admin listener runs on the caller's runtime.
pub async fn start(mut cfg: NodeConfig) -> Result<RunningNode, NodeError> {
    let max_connections = max_connections(&cfg)?;
    let (stop, stop_rx) = watch::channel(false);
    let store = Arc::new(Store::new(&cfg)?);
    let replication = match &cfg.cluster {
        Some(c) if c.replication.enabled => Some(Arc::new(replica::Replication::new(
            &c.replication,
            Duration::from_millis(cfg.cache_revalidate_ms),
            store.arena(),
        )?)),
        _ => None,
    };
    let cluster = match &cfg.cluster {
        Some(c) => {
            let steering = cross_host_steering(c, &cfg)?;
            let cluster = coop::Membership::start(
                coop::Cluster::new(c)?
                    .replicating(replication.clone())
                    .steering(steering, cfg.handoff_vip),
                stop_rx.clone(),
            );
            // Peers reach this node at its member address.
            match (&c.me().map(|m| m.control.clone()), &cfg.handoff_listen) {
                (Some(ControlAddr::Tcp(a)), None) => cfg.handoff_listen = Some(*a),
                (Some(ControlAddr::Tcp(a)), Some(b)) if a != b => {
                    return Err(NodeError::Config(format!(
                        "[cluster]: this member's control address {a} differs from handoff_listen {b}"
                    )))
                }
                _ => {}
            }
            match (&c.me().map(|m| m.control.clone()), &cfg.handoff_unix) {
                (Some(ControlAddr::Unix(p)), None) => cfg.handoff_unix = Some(p.clone()),
                (Some(ControlAddr::Unix(p)), Some(q)) if p != q => {
                    return Err(NodeError::Config(format!(
                        "[cluster]: this member's control address unix:{} differs from handoff_unix {}",
                        p.display(),
                        q.display()
                    )))
                }
                _ => {}
            }
            Some(cluster)
        }
        None => None,
    };
    let metrics = Arc::new(NodeMetrics::new(cfg.workers));
    let rescue = match &cfg.rescue {
        Some(r) => {
            r.validate()
                .map_err(|e| NodeError::Config(format!("[rescue]: {e}")))?;
            Some(Arc::new(rescue::RescueProxy::new(r.clone())))
        }
        None => None,
    };
    // The rescue control loop, with `[rescue.peering]`: it peers with other sites, redirects
    // this site's requests during a crowd and adds origins to the proxy above.
    let driver = match cfg
        .rescue
        .as_ref()
        .and_then(|r| r.peering.as_ref().map(|p| (r, p)))
    {
        Some((r, p)) => {
            let identity = switchyard_rescue_driver::TlsIdentity::from_files(p)
                .map_err(|e| NodeError::Config(e.to_string()))?;
            let vhosts = rescue.clone().map(|p| {
                Arc::new(RescueHandle(p)) as Arc<dyn switchyard_rescue_driver::VirtualHosts>
            });
            let d =
                switchyard_rescue_driver::Driver::start(switchyard_rescue_driver::DriverParts {
                    config: r.clone(),
                    identity,
                    vhosts,
                    candidates: None,
                    directory: None,
                })
                .await
                .map_err(|e| NodeError::Config(e.to_string()))?;
            Some(Arc::new(d))
        }
        None => None,
    };
    let waiting = WaitingClients::new();
    let ctx = Arc::new(Ctx {
        limits: limits(&cfg),
        store: store.clone(),
        metrics: metrics.clone(),
        header_timeout: Duration::from_millis(cfg.header_timeout_ms),
        idle_timeout: Duration::from_millis(cfg.idle_timeout_ms),
        send_timeout: Duration::from_millis(cfg.send_timeout_ms),
        waiting: waiting.clone(),
        replication,
        rescue: rescue.clone(),
        traffic: driver.as_ref().map(|d| d.traffic()),
        dynamic: cfg.dynamic.as_ref().map(conn::Dynamic::new).transpose()?,
    });
    let bind_err = |source| NodeError::Bind {
        addr: cfg.listen,
        source,
    };
    let workers = switchyard_runtime::listen::worker_count(cfg.workers);
    let (addr, listeners) =
        listen_reuseport(cfg.listen, workers, deferral(cfg.defer_accept_ms)).map_err(bind_err)?;
    let mut tasks = Vec::new();

    let admin_addr = match cfg.admin {
        Some(a) => {
            let mut registry = Registry::default();
            metrics::register(&mut registry, metrics.clone(), store.clone());
            if let Some(c) = &cluster {
                coop::register(&mut registry, c.clone());
            }
            if let Some(r) = &rescue {
                rescue::register(&mut registry, r.clone());
            }
            if let Some(d) = &driver {
                switchyard_rescue_driver::metrics::register(&mut registry, d.status_source());
            }
            let mut admin = Admin::new(registry);
            if let Some(d) = &driver {
                let src = d.status_source();
                admin = admin.route_query(
                    &r_status_path(&cfg),
                    Arc::new(move |q| {
                        let (content_type, body) = switchyard_rescue_driver::status_page(&src, q);
                        switchyard_admin::Page { content_type, body }
                    }),
                );
                if cluster.is_none() {
                    let src = d.status_source();
                    admin = admin.route(
                        "/status.json",
                        Arc::new(move || switchyard_admin::Page {
                            content_type: "application/json",
                            body: serde_json::to_vec(
                                &serde_json::json!({ "rescue": src.status() }),
                            )
                            .unwrap_or_default(),
                        }),
                    );
                }
            }
            let rescue_src = driver.as_ref().map(|d| d.status_source());
            if let (None, Some(src)) = (&cluster, &rescue_src) {
                // A node alone with a rescue driver: a dashboard of itself and its site's
                // rescue.
                let (publisher, feed) = switchyard_admin::dashboard::feed::channel(
                    dashboard::VIEWERS,
                    dashboard::HISTORY,
                );
                let latest = feed.clone();
                admin = admin
                    .route("/", Arc::new(switchyard_admin::dashboard::page))
                    .route(
                        "/dashboard.json",
                        Arc::new(move || switchyard_admin::Page {
                            content_type: "application/json",
                            body: latest.latest_json().into_bytes(),
                        }),
                    )
                    .events("/events", feed);
                tasks.push(tokio::spawn(dashboard::run_alone(
                    addr.to_string(),
                    metrics.clone(),
                    store.clone(),
                    src.clone(),
                    publisher,
                    stop_rx.clone(),
                )));
            }
            if let Some(c) = cluster.clone() {
                // The cluster as this member sees it, and its site's rescue.
                let status = c.clone();
                let src = rescue_src.clone();
                admin = admin.route(
                    "/status.json",
                    Arc::new(move || {
                        let mut st = status.current().status();
                        st.rescue = src.as_ref().and_then(|s| s.status());
                        switchyard_admin::Page {
                            content_type: "application/json",
                            body: serde_json::to_vec(&st).unwrap_or_default(),
                        }
                    }),
                );
                // The whole cluster's dashboard, and this member's figures for the others'.
                let (publisher, feed) = switchyard_admin::dashboard::feed::channel(
                    dashboard::VIEWERS,
                    dashboard::HISTORY,
                );
                let asked = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let (m, s, st) = (c.clone(), metrics.clone(), store.clone());
                let (latest, wants) = (feed.clone(), asked.clone());
                admin = admin
                    .route(
                        "/member.json",
                        Arc::new(move || switchyard_admin::Page {
                            content_type: "application/json",
                            body: serde_json::to_vec(&m.current().member_sample(&s, &st))
                                .unwrap_or_default(),
                        }),
                    )
                    .route("/", Arc::new(switchyard_admin::dashboard::page))
                    .route(
                        "/dashboard.json",
                        Arc::new(move || {
                            wants.store(true, std::sync::atomic::Ordering::Relaxed);
                            switchyard_admin::Page {
                                content_type: "application/json",
                                body: latest.latest_json().into_bytes(),
                            }
                        }),
                    )
                    .events("/events", feed);
                tasks.push(tokio::spawn(dashboard::run(
                    c,
                    metrics.clone(),
                    store.clone(),
                    rescue_src,
                    publisher,
                    asked,
                    stop_rx.clone(),
                )));
            }
            let admin_listener = Admin::bind(a).await?;
            let bound = admin_listener
                .local_addr()
                .map_err(|source| NodeError::Bind { addr: a, source })?;
            tasks.push(tokio::spawn(admin.serve(admin_listener, stop_rx.clone())));
            Some(bound)
        }
        None => None,
    };

    // Load reports to the switch (distributed load monitor), pushed on connection events.
    let reporter = cfg.report_to.map(|target| {
        let (r, task) = report::spawn(
            target,
            addr,
            metrics.clone(),
            store.clone(),
            stop_rx.clone(),
        );
        tasks.push(task);
        r
    });

    let parkings = Arc::new(std::sync::Mutex::new(Vec::new()));
    // The connection cap is shared by all workers.
    let slots = Arc::new(Semaphore::new(max_connections));
    let worker = Arc::new(Worker {
        ctx: ctx.clone(),
        slots: slots.clone(),
        stop: stop_rx.clone(),
        reporter: reporter.clone(),
        cluster: cluster.clone(),
        parkings: parkings.clone(),
    });
    let registry = handoff::WorkerRegistry::default();
    let reg = registry.clone();
    let n_workers = listeners.len();
    let workers = Workers::spawn(
        "sy-node",
        listeners,
        stop_rx.clone(),
        move |_, listener, live| {
            // Handed-in connections are spread over the workers' runtimes.
            reg.register(&live);
            let worker = worker.clone();
            async move { worker.accept_loop(&listener, &live).await }
        },
    )
    .map_err(|e| NodeError::Config(format!("cannot start worker thread: {e}")))?;

    let handoff = start_handoff(
        &cfg,
        handoff::Receiver::new(
            ctx,
            slots,
            stop_rx.clone(),
            reporter,
            // A cooperative member answers its peers' Hello with its member name.
            cluster
                .as_ref()
                .map_or_else(|| addr.to_string(), |c| c.current().name().to_owned()),
            &registry,
        ),
        &registry,
        n_workers,
    )
    .await;
    let handoff = match handoff {
        Ok(h) => h,
        Err(e) => {
            let _ = stop.send(true);
            for t in &tasks {
                t.abort();
            }
            workers.finish(Duration::ZERO).await;
            return Err(e);
        }
    };
    if let Some(m) = &cluster {
        let c = m.current();
        tracing::info!(
            name = c.name(),
            peers = c.peers().count(),
            "cooperative mode"
        );
    }
    tracing::info!(
        %addr,
        max_connections,
        root = %cfg.root.display(),
        admin = ?admin_addr,
        handoff_tcp = ?handoff.tcp_addr,
        handoff_unix = ?handoff.unix_path,
        "node serving"
    );
    Ok(RunningNode {
        addr,
        admin_addr,
        metrics,
        store,
        stop,
        workers,
        tasks,
        handoff,
        cluster,
        rescue,
        driver,
        parkings,
        waiting,
    })
}

/// The rescue status page's path (`[rescue] status_path`).
fn r_status_path(cfg: &NodeConfig) -> String {
    cfg.rescue
        .as_ref()
        .map_or_else(|| "/dotslash-status".to_string(), |r| r.status_path.clone())
}

/// Bind the handoff control listeners that are configured and start
/// accepting switches on them.
async fn start_handoff(
    cfg: &NodeConfig,
    receiver: handoff::Receiver,
    registry: &handoff::WorkerRegistry,
    n_workers: usize,
) -> Result<handoff::Listeners, NodeError> {
    let (done, done_rx) = watch::channel(false);
    let mut out = handoff::Listeners {
        tcp_addr: None,
        unix_path: None,
        done,
        tasks: Vec::new(),
        drop_rule: None,
    };
    if cfg.handoff_unix.is_none() && cfg.handoff_listen.is_none() {
        return Ok(out);
    }
    if let Some(vip) = cfg.handoff_vip {
        // Packets for the VIP that arrive while a connection is being restored find no socket;
        // they must be dropped (the client retransmits), not answered with a reset.
        let SocketAddr::V4(v4) = vip else {
            return Err(NodeError::Config(
                "handoff_vip must be an IPv4 address".into(),
            ));
        };
        let tag = format!("node{}", std::process::id());
        // A cooperative node also accepts clients at the VIP itself: the rule must let their
        // handshakes through.
        let install = if cfg.cluster.is_some() {
            switchyard_handoff::steer::NoSocketDrop::install_beside_listener
        } else {
            switchyard_handoff::steer::NoSocketDrop::install
        };
        let rule = install(None, &tag, *v4.ip(), Some(v4.port())).map_err(|e| {
            NodeError::Config(format!(
                "handoff_vip {vip}: cannot install the drop rule for unmatched VIP packets \
                 (needs CAP_NET_ADMIN and nftables): {e}"
            ))
        })?;
        tracing::info!(%vip, table = rule.table(), "VIP packets without a socket are dropped");
        out.drop_rule = Some(rule);
    }
    if !registry.wait_for(n_workers).await {
        return Err(NodeError::Config("worker threads did not start".into()));
    }
    let receiver = Arc::new(receiver);
    if let Some(path) = &cfg.handoff_unix {
        let l = handoff::bind_unix(path).map_err(|source| NodeError::BindUnix {
            path: path.clone(),
            source,
        })?;
        out.unix_path = Some(path.clone());
        out.tasks.push(handoff::spawn_listener(
            receiver.clone(),
            l,
            done_rx.clone(),
        ));
    }
    if let Some(a) = cfg.handoff_listen {
        let bind = |source| NodeError::Bind { addr: a, source };
        let l = TcpListener::bind(a).await.map_err(bind)?;
        out.tcp_addr = Some(l.local_addr().map_err(bind)?);
        out.tasks
            .push(handoff::spawn_listener(receiver, l, done_rx));
    }
    Ok(out)
}

/// Cooperative mode with members on other hosts: the steering table that sends a cloned
/// connection's packets from this node (where the director delivers them) to its owner. Such
/// a cluster needs `handoff_vip` (every member drops, rather than resets, the VIP's packets
/// that arrive while a connection is on its way). A table that cannot be set up leaves the
/// node serving those requests itself (each counted as a `no_steering` fallback).
fn cross_host_steering(
    c: &ClusterConfig,
    cfg: &NodeConfig,
) -> Result<Option<Arc<switchyard_handoff::steer::table::Table>>, NodeError> {
    if !c.crosses_hosts() {
        return Ok(None);
    }
    if cfg.handoff_vip.is_none() {
        return Err(NodeError::Config(
            "[cluster]: members on other hosts need handoff_vip (the VIP:PORT the layer-4 \
             director spreads, held on lo by every member)"
                .into(),
        ));
    }
    let instance = format!("coop-{}-{}", c.name, std::process::id());
    match switchyard_handoff::steer::table::Table::setup(c.steering, &c.steering_iface, &instance) {
        Ok(t) => {
            tracing::info!(backend = t.kind(), iface = %c.steering_iface, "steering ready for clones across hosts");
            Ok(Some(Arc::new(t)))
        }
        Err(e) => {
            tracing::error!(error = %e, iface = %c.steering_iface,
                "no steering table: requests owned by members on other hosts are served here");
            Ok(None)
        }
    }
}

/// What every worker thread's accept loop shares.
struct Worker {
    ctx: Arc<Ctx>,
    slots: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
    reporter: Option<Arc<report::Reporter>>,
    /// Cooperative mode: requests owned by peers are cloned to them.
    cluster: Option<Arc<coop::Membership>>,
    /// Every worker's table of parked connections.
    parkings: Arc<std::sync::Mutex<Vec<Parking<Held>>>>,
}

impl Worker {
    /// While every slot is taken, the client just accepted waits for one and
    /// new clients wait in the kernel's accept queue. Plain connections (not cooperative)
    /// that stay idle are parked in this worker's table ([`switchyard_runtime::park`]),
    /// served by the worker's parking task.
    async fn accept_loop(&self, listener: &Listener, live: &Live) {
        use std::sync::atomic::Ordering::Relaxed;
        let plain = Arc::new(Plain {
            ctx: self.ctx.clone(),
            stop: self.stop.clone(),
            reporter: self.reporter.clone(),
            parking: Parking::new(),
        });
        lock(&self.parkings).push(plain.parking.clone());
        tokio::spawn(plain.clone().run_parking());
        accept_loop(
            listener,
            &self.slots,
            &self.ctx.waiting,
            WhenFull::Wait,
            &self.ctx.metrics.accepts,
            |incoming| {
                let Incoming::Admitted {
                    stream,
                    peer,
                    slot: permit,
                } = incoming
                else {
                    // `WhenFull::Wait` hands over only connections with a slot.
                    return;
                };
                tracing::trace!(%peer, "accepted");
                let ctx = self.ctx.clone();
                ctx.metrics.connections_total.fetch_add(1, Relaxed);
                ctx.metrics.connections_active.fetch_add(1, Relaxed);
                if let Some(r) = &self.reporter {
                    r.event();
                }
                let Some(cluster) = self.cluster.as_ref().map(|m| m.current()) else {
                    let held = Held {
                        ticket: None,
                        slot: permit,
                        live: live.clone(),
                    };
                    plain.spawn(stream, held, false);
                    return;
                };
                let stop = self.stop.clone();
                let reporter = self.reporter.clone();
                let live = live.clone();
                tokio::spawn(async move {
                    // A cooperative connection may be cloned to a peer from its first request
                    // on: it is registered from the start.
                    let Ok(stream) = stream.into_registered() else {
                        closed(&ctx, reporter.as_deref());
                        return;
                    };
                    // Boxed: the cooperative loop's state (a clone in flight) is
                    // larger than the plain loop's, and every connection's task would
                    // otherwise hold room for it, idle or not.
                    Box::pin(cluster.serve(ctx.clone(), stream, stop)).await;
                    closed(&ctx, reporter.as_deref());
                    drop(permit);
                    drop(live);
                });
            },
        )
        .await;
    }
}

/// How long a plain keep-alive connection waits for its next request in its own task before
/// it is parked without one. Short, so that idle connections hold no task for long (a burst
/// of new clients going idle does not pile up tasks), and long enough that a client sending
/// request after request keeps its task (parking costs no system call, but a resumed
/// connection costs a new task).
const PARK_AFTER: Duration = Duration::from_millis(20);

/// What a plain connection holds while it is open, parked or not. The ticket comes first: it
/// must leave the waiting list before the socket closes.
struct Held {
    /// Its place in the waiting list while parked.
    ticket: Option<switchyard_runtime::shed::Waiting>,
    /// Its connection slot.
    slot: OwnedSemaphorePermit,
    /// Keeps its worker draining on shutdown while it is open.
    live: Live,
}

/// One worker's plain connections: served in tasks while busy, parked while idle.
struct Plain {
    ctx: Arc<Ctx>,
    stop: watch::Receiver<bool>,
    reporter: Option<Arc<report::Reporter>>,
    parking: Parking<Held>,
}

impl Plain {
    /// Serve the connection on `stream` in a task of its own until it closes or goes idle;
    /// an idle one is parked. `resumed`: it was parked and its client sent again.
    fn spawn(self: &Arc<Self>, stream: ClientSocket, held: Held, resumed: bool) {
        let plain = self.clone();
        // Boxed here, once per connection: the task then holds a pointer, which the runtime
        // moves as it spawns it, rather than the whole loop's state (several times); and the
        // loop answers each request without an allocation of its own.
        tokio::spawn(Box::pin(async move {
            let Held { ticket, slot, live } = held;
            let start = if resumed {
                conn::Start::Resumed { ticket }
            } else {
                conn::Start::New {
                    preread: bytes::BytesMut::new(),
                }
            };
            let served =
                conn::serve_parking(&plain.ctx, stream, plain.stop.clone(), start, PARK_AFTER)
                    .await;
            match served {
                conn::Served::Idle { stream, idle } => {
                    let held = Held {
                        ticket: idle.ticket,
                        slot,
                        live,
                    };
                    match plain.parking.park(stream, held, idle.until) {
                        Ok(()) => return,
                        // The node shuts down: close it (its place in the list first).
                        Err((stream, held)) => {
                            drop(held);
                            drop(stream);
                        }
                    }
                }
                conn::Served::Closed(stats) => {
                    tracing::trace!(
                        requests = stats.requests,
                        bytes = stats.bytes,
                        resumed,
                        "connection closed"
                    );
                }
            }
            closed(&plain.ctx, plain.reporter.as_deref());
        }));
    }

    /// The worker's parking task: resume connections whose clients send, close those whose
    /// idle timeout passes, and all of them on shutdown.
    async fn run_parking(self: Arc<Self>) {
        let parking = self.parking.clone();
        parking
            .run(self.stop.clone(), |u| match u {
                Unparked::Ready(stream, held) => {
                    self.spawn(stream.into(), held, true);
                }
                Unparked::Expired(stream, held) => {
                    self.ctx
                        .metrics
                        .timeouts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    drop(held);
                    drop(stream);
                    closed(&self.ctx, self.reporter.as_deref());
                }
                Unparked::Shutdown(stream, held) => {
                    drop(held);
                    drop(stream);
                    closed(&self.ctx, self.reporter.as_deref());
                }
            })
            .await;
    }
}

/// A connection closed: counted, and the switch told of the change in load.
fn closed(ctx: &Ctx, reporter: Option<&report::Reporter>) {
    ctx.metrics
        .connections_active
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(r) = reporter {
        r.event();
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    /// What a parked connection holds beside its socket's registration and its waker: its
    /// table entry (its state, its socket handle, its deadline). Under 128 bytes, against
    /// about 1 KiB for a connection's task.
    #[test]
    fn parked_connection_state_is_small() {
        let entry = std::mem::size_of::<super::Held>()
            + std::mem::size_of::<tokio::net::TcpStream>()
            + std::mem::size_of::<tokio::time::Instant>();
        eprintln!("parked connection entry: {entry} bytes");
        assert!(
            entry <= 128,
            "a parked connection's entry grew to {entry} bytes"
        );
    }
}
