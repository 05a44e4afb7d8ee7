//! `switchyard node`: the cluster's back-end web server.
//!
//! A node serves static files from a document root over HTTP/1.0 and
//! HTTP/1.1 (keep-alive, pipelining, GET and HEAD, validators and 304,
//! single byte ranges), keeps hot files in a byte-bounded object cache
//! with a pluggable replacement policy (`switchyard-cache`), sends files
//! too large for the cache with `sendfile(2)`, can emulate a slow disk for
//! experiments, and exports Prometheus metrics on an admin listener.
//!
//! The flow of one request: [`start`] binds the listener and accepts;
//! each connection runs in `conn`, which parses request heads with
//! `switchyard-http`, maps the target to a clean path, asks the
//! [`store::Store`] for the body (cache, then disk beneath the root via
//! `openat2(RESOLVE_BENEATH)`), writes the head and body, and loops for the
//! next request on the connection.

pub mod config;
mod conn;
pub mod disk;
pub mod fs;
pub mod metrics;
pub mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use switchyard_admin::Admin;
use switchyard_http::request::Limits;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

pub use config::{DiskConfig, NodeConfig};
pub use metrics::NodeMetrics;
pub use store::Store;

/// Errors that stop a node from starting.
#[derive(Debug, Error)]
pub enum NodeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("document root {path}: {source}")]
    Root {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Admin(#[from] switchyard_admin::AdminError),
}

/// Shared by every connection of a node.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) limits: Limits,
    pub(crate) store: Arc<Store>,
    pub(crate) metrics: Arc<NodeMetrics>,
    pub(crate) header_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) send_timeout: Duration,
}

/// A node that is serving.
pub struct RunningNode {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    metrics: Arc<NodeMetrics>,
    store: Arc<Store>,
    stop: watch::Sender<bool>,
    slots: Arc<Semaphore>,
    max_connections: u32,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningNode {
    /// The address the web server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's address, if one was configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The node's counters.
    pub fn metrics(&self) -> &Arc<NodeMetrics> {
        &self.metrics
    }

    /// The node's store (cache statistics, disk queue).
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Stop accepting, let open connections finish their current response
    /// (idle ones close at once), and wait for them up to `grace`.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.stop.send(true);
        for t in &self.tasks {
            t.abort();
        }
        let all = self.max_connections;
        let _ = tokio::time::timeout(grace, self.slots.acquire_many(all)).await;
    }
}

fn limits(cfg: &NodeConfig) -> Limits {
    Limits {
        max_request_line: cfg.max_request_line,
        max_head_bytes: cfg.max_head_bytes,
        max_body_bytes: cfg.max_body_bytes,
    }
}

/// Build a listening socket with a deep accept queue.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    TcpListener::from_std(socket.into())
}

/// Bind the node's listeners and start serving on the current runtime.
pub async fn start(cfg: NodeConfig) -> Result<RunningNode, NodeError> {
    if cfg.max_connections == 0 || cfg.max_connections > u32::MAX as usize {
        return Err(NodeError::Config("max_connections must be positive".into()));
    }
    let store = Arc::new(Store::new(&cfg)?);
    let metrics = Arc::new(NodeMetrics::default());
    let ctx = Arc::new(Ctx {
        limits: limits(&cfg),
        store: store.clone(),
        metrics: metrics.clone(),
        header_timeout: Duration::from_millis(cfg.header_timeout_ms),
        idle_timeout: Duration::from_millis(cfg.idle_timeout_ms),
        send_timeout: Duration::from_millis(cfg.send_timeout_ms),
    });
    let listener = listen(cfg.listen).map_err(|source| NodeError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let addr = listener.local_addr().map_err(|source| NodeError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();

    let admin_addr = match cfg.admin {
        Some(a) => {
            let mut registry = Registry::default();
            metrics::register(&mut registry, metrics.clone(), store.clone());
            let admin_listener = Admin::bind(a).await?;
            let bound = admin_listener
                .local_addr()
                .map_err(|source| NodeError::Bind { addr: a, source })?;
            tasks.push(tokio::spawn(
                Admin::new(registry).serve(admin_listener, stop_rx.clone()),
            ));
            Some(bound)
        }
        None => None,
    };

    let max = cfg.max_connections as u32;
    let slots = Arc::new(Semaphore::new(max as usize));
    // One accept loop per worker thread, so that accepting keeps pace with
    // short connections the way several event loops do.
    let listener = Arc::new(listener);
    let loops = match cfg.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    for _ in 0..loops {
        tasks.push(tokio::spawn(accept_loop(
            listener.clone(),
            ctx.clone(),
            slots.clone(),
            stop_rx.clone(),
        )));
    }
    tracing::info!(%addr, root = %cfg.root.display(), admin = ?admin_addr, "node serving");
    Ok(RunningNode {
        addr,
        admin_addr,
        metrics,
        store,
        stop,
        slots,
        max_connections: max,
        tasks,
    })
}

async fn accept_loop(
    listener: Arc<TcpListener>,
    ctx: Arc<Ctx>,
    slots: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        tracing::trace!(%peer, "accepted");
        ctx.metrics.connections_total.fetch_add(1, Relaxed);
        ctx.metrics.connections_active.fetch_add(1, Relaxed);
        let ctx = ctx.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            conn::serve(ctx.clone(), stream, stop).await;
            ctx.metrics.connections_active.fetch_sub(1, Relaxed);
            drop(permit);
        });
    }
}
