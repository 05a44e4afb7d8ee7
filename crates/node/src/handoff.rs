//! The node's handoff receiver: the node side of one-way delivery.
//!
//! A switch connects to one of the node's control listeners and hands it
//! client connections it has accepted (and whose first request it has read);
//! the node answers the clients directly and reports back. The protocol is
//! `switchyard_handoff::proto`:
//!
//! * the switch sends `Hello`, the node answers `Hello` with its name (its
//!   HTTP listen address); any number of control connections may be open;
//! * `Create` hands over a connection: on the Unix listener
//!   (`handoff_unix`) the client socket's descriptor travels with the frame
//!   (`Transfer::Fd`, same host); on the TCP listener (`handoff_listen`) the
//!   connection's `TCP_REPAIR` state does (`Transfer::Repair`), and the node
//!   restores it (needs CAP_NET_ADMIN);
//! * the node answers each `Create` exactly once, before reading the next
//!   frame (`switchyard_handoff::taker` keeps the account): `Accepted`, and
//!   it serves the connection on one of its worker threads (round robin),
//!   counted like an accepted one and under the same connection cap, or
//!   `Drop` with the reason (`Busy` at the cap, `ShuttingDown`,
//!   `NoPrivilege` or `RestoreFailed`). On a refused descriptor the node only
//!   closes its copy: the switch still holds the socket and serves the client
//!   itself. The worker starts serving only once the `Accepted` has been
//!   written to the control socket; if it cannot be written, the connection
//!   is closed without a word (a restored one back in repair mode): the
//!   switch, not knowing, gives it up too (see `switchyard_handoff::mover`);
//! * a `Cancel` (the switch timed out waiting) is answered `Drop` with
//!   `Cancelled` if its `Create` is still unanswered, and ignored otherwise:
//!   the switch learns from the one answer who serves the connection;
//! * `Served` follows every response to a request the switch dispatched (the
//!   first one, and each one answered by `Routed`), saying whether its body
//!   came from the memory cache; `Closed` the end of the connection;
//! * with `route`, each later request is first announced with `Route`, and
//!   the switch's `Routed` says to serve it here, to fetch it from another
//!   node (back-end forwarding, [`crate::forward`]) or to give the connection
//!   back (`HandBack`, multiple handoff). An unanswered query (2 s, or a lost
//!   control connection) is served here.
//!
//! A malformed frame closes that control connection only; the node keeps
//! serving, and the connections already handed in keep running.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use parking_lot::{Mutex, RwLock};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use switchyard_handoff::fdpass::{self, ControlReader, ControlWriter, Outgoing, MAX_BATCH};
use switchyard_handoff::proto::{DropReason, Message, RouteAction, Routing, Transfer, MAX_PREREAD};
use switchyard_handoff::proto::{MAX_STRING, MAX_TARGET};
use switchyard_handoff::taker::Taker;
use switchyard_handoff::{repair, HandoffError};
use switchyard_http::request::{Method, RequestHead};
use switchyard_runtime::{Live, WeakLive};

use crate::conn::{self, ConnStats, Ctx, Outcome, Router, Step};
use crate::metrics::{HandoffMetrics, NodeMetrics};
use crate::replica::Replication;
use crate::report::Reporter;
use crate::store::Store;

/// How long a connection waits for the switch's `Routed` before serving the
/// request itself.
pub const ROUTE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a repair connection waits for its responses to be acknowledged
/// before it is dumped for a hand-back.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `start` waits for the worker threads to come up.
const WORKER_START_TIMEOUT: Duration = Duration::from_secs(5);

/// A worker thread's runtime and the handle that keeps it draining while a
/// connection is open (weak: a worker that has finished takes no more).
type WorkerSlot = (Handle, WeakLive);

/// What every control connection of a node shares.
pub(crate) struct Receiver {
    ctx: Arc<Ctx>,
    slots: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
    /// Never signalled: the stop signal of clones (see `run`).
    never: watch::Sender<bool>,
    reporter: Option<Arc<Reporter>>,
    name: String,
    workers: Arc<RwLock<Vec<WorkerSlot>>>,
    next: AtomicUsize,
}

/// The worker threads' runtimes, registered by each worker when it starts;
/// the `Notify` wakes whoever waits for them to be registered.
#[derive(Clone, Default)]
pub(crate) struct WorkerRegistry(Arc<RwLock<Vec<WorkerSlot>>>, Arc<Notify>);

impl WorkerRegistry {
    /// Called on a worker thread, inside its runtime.
    pub(crate) fn register(&self, live: &Live) {
        self.0.write().push((Handle::current(), live.downgrade()));
        self.1.notify_waiters();
    }

    /// Wait until `n` workers have registered.
    pub(crate) async fn wait_for(&self, n: usize) -> bool {
        let registered = async {
            loop {
                // Enabled before the check, so a registration in between wakes it.
                let mut notified = std::pin::pin!(self.1.notified());
                notified.as_mut().enable();
                if self.0.read().len() >= n {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(WORKER_START_TIMEOUT, registered)
            .await
            .is_ok()
    }
}

impl Receiver {
    pub(crate) fn new(
        ctx: Arc<Ctx>,
        slots: Arc<Semaphore>,
        stop: watch::Receiver<bool>,
        reporter: Option<Arc<Reporter>>,
        name: String,
        workers: &WorkerRegistry,
    ) -> Receiver {
        Receiver {
            ctx,
            slots,
            stop,
            never: watch::channel(false).0,
            reporter,
            name,
            workers: workers.0.clone(),
            next: AtomicUsize::new(0),
        }
    }

    fn metrics(&self) -> &HandoffMetrics {
        &self.ctx.metrics.handoff
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// The next worker thread that is still running, round robin, with a
    /// handle that keeps it draining while the connection is open.
    fn pick_worker(&self) -> Option<(Handle, Live)> {
        pick(&self.workers.read(), self.next.fetch_add(1, Relaxed))
    }
}

/// The first running worker from `start` on (round robin when `start`
/// counts up).
fn pick(workers: &[WorkerSlot], start: usize) -> Option<(Handle, Live)> {
    let n = workers.len();
    (0..n).find_map(|k| {
        let (h, live) = &workers[(start + k) % n];
        live.upgrade().map(|l| (h.clone(), l))
    })
}

/// Bind the Unix control listener at `path`, replacing a stale socket file.
pub(crate) fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// A listener that control connections arrive on.
pub(crate) trait ControlListener: Send + Sync + 'static {
    /// The next control connection and a name for its peer.
    fn next(
        &self,
    ) -> impl std::future::Future<Output = std::io::Result<(ControlReader, ControlWriter, String)>> + Send;
}

impl ControlListener for UnixListener {
    async fn next(&self) -> std::io::Result<(ControlReader, ControlWriter, String)> {
        let (s, _) = self.accept().await?;
        let (r, w) = fdpass::control_unix(s);
        Ok((r, w, "unix".to_owned()))
    }
}

impl ControlListener for TcpListener {
    async fn next(&self) -> std::io::Result<(ControlReader, ControlWriter, String)> {
        let (s, peer) = self.accept().await?;
        let (r, w) = fdpass::control_tcp(s);
        Ok((r, w, peer.to_string()))
    }
}

/// Accept control connections until `done`.
pub(crate) fn spawn_listener<L: ControlListener>(
    rx: Arc<Receiver>,
    listener: L,
    done: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut stop = done.clone();
        loop {
            let accepted = tokio::select! {
                a = listener.next() => a,
                _ = stop.wait_for(|d| *d) => return,
            };
            match accepted {
                Ok((r, w, peer)) => {
                    tokio::spawn(control(rx.clone(), r, w, peer, done.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "handoff control accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    })
}

/// A frame for the control writer, and who to tell once it is written.
struct Out {
    out: Outgoing,
    written: Option<oneshot::Sender<()>>,
}

/// One control connection, as seen by the connections it handed in.
pub(crate) struct Control {
    tx: mpsc::UnboundedSender<Out>,
    routes: Mutex<HashMap<(u64, u64), oneshot::Sender<RouteAction>>>,
    open: AtomicBool,
    /// The name the other end gave in its `Hello`.
    peer: std::sync::OnceLock<String>,
}

impl Control {
    fn send(&self, msg: Message) -> bool {
        self.tx
            .send(Out {
                out: Outgoing::plain(msg),
                written: None,
            })
            .is_ok()
    }

    /// Queues `msg`; the receiver resolves once it has been written (and fails if it never is).
    fn send_written(&self, msg: Message) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Out {
            out: Outgoing::plain(msg),
            written: Some(tx),
        });
        rx
    }

    fn is_open(&self) -> bool {
        self.open.load(Relaxed)
    }

    /// The control connection is gone: pending and later route queries are
    /// answered locally at once.
    fn close(&self) {
        self.open.store(false, Relaxed);
        self.routes.lock().clear();
    }
}

/// Decrements the control-connection gauge when a control connection ends.
struct Gauge<'a>(&'a HandoffMetrics);

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.control_connections.fetch_sub(1, Relaxed);
    }
}

/// Serve one control connection until the switch closes it, a frame is
/// malformed, or the node has shut down (`done`).
async fn control(
    rx: Arc<Receiver>,
    mut reader: ControlReader,
    mut writer: ControlWriter,
    peer: String,
    mut done: watch::Receiver<bool>,
) {
    rx.metrics().control_connections.fetch_add(1, Relaxed);
    let _gauge = Gauge(rx.metrics());
    let (tx, mut out_rx) = mpsc::unbounded_channel::<Out>();
    let ctl = Arc::new(Control {
        tx,
        routes: Mutex::new(HashMap::new()),
        open: AtomicBool::new(true),
        peer: std::sync::OnceLock::new(),
    });
    // The writer outlives the reader while handed-in connections still have
    // `Served` and `Closed` to report; after a bad frame it sends what is
    // already queued and closes.
    let writer_peer = peer.clone();
    let mut writer_done = done.clone();
    let (close, mut closing) = watch::channel(false);
    tokio::spawn(async move {
        let mut close_gone = false;
        let mut batch = Vec::new();
        let mut written = Vec::new();
        loop {
            let out = tokio::select! {
                biased;
                o = out_rx.recv() => o,
                r = closing.wait_for(|c| *c), if !close_gone => match r {
                    Ok(_) => None,
                    Err(_) => {
                        close_gone = true;
                        continue;
                    }
                },
                _ = writer_done.wait_for(|d| *d) => None,
            };
            let Some(out) = out else { return };
            // Frames queued meanwhile (Accepted, Served, Closed of busy connections) go
            // with the same system call; a frame with a descriptor goes on its own.
            next_batch(&mut out_rx, out, &mut batch, &mut written);
            let sent = writer.send_batch(&batch).await;
            // A handed-back descriptor must not stay open here once sent.
            batch.clear();
            match sent {
                Ok(unsent) => {
                    for u in unsent {
                        tracing::warn!(peer = %writer_peer, error = %u.error, id = ?u.id, "control message not encodable; dropped");
                    }
                    // Accepted frames are always encodable: their connections may be served.
                    for w in written.drain(..) {
                        let _ = w.send(());
                    }
                }
                Err(e) => {
                    tracing::info!(peer = %writer_peer, error = %e, "control connection lost");
                    return;
                }
            }
        }
    });
    let mut taker = Taker::new();
    let mut hello = false;
    let end = loop {
        let got = tokio::select! {
            m = reader.recv() => m,
            _ = done.wait_for(|d| *d) => break Ok(()),
        };
        let (msg, fd) = match got {
            Ok(Some(m)) => m,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        if !hello {
            let Message::Hello { name } = msg else {
                break Err(HandoffError::Other(format!(
                    "expected Hello first, got {}",
                    name_of(&msg)
                )));
            };
            tracing::info!(%peer, switch = %name, "handoff control connection");
            let _ = ctl.peer.set(name);
            hello = true;
            ctl.send(Message::Hello {
                name: rx.name.clone(),
            });
            continue;
        }
        match msg {
            Message::Create {
                id,
                client,
                local,
                transfer,
                preread,
                route,
            } => {
                if let Err(e) = taker.created(id) {
                    break Err(HandoffError::Other(e.to_string()));
                }
                rx.create(
                    &ctl, &mut taker, id, client, local, transfer, fd, preread, route,
                )
            }
            Message::Cancel { id } => match taker.cancel(id) {
                Some(drop) => {
                    rx.metrics().refused_other.fetch_add(1, Relaxed);
                    ctl.send(drop);
                }
                // Answered already: the answer is on its way.
                None => tracing::debug!(id, "Cancel for an answered connection ignored"),
            },
            Message::Routed { id, seq, action } => match ctl.routes.lock().remove(&(id, seq)) {
                Some(w) => {
                    let _ = w.send(action);
                }
                None => tracing::debug!(id, seq, "late or unknown Routed"),
            },
            Message::Ping { nonce } => {
                ctl.send(Message::Pong { nonce });
            }
            Message::ReplicaCheck { target, etag } => match (&rx.ctx.replication, ctl.peer.get()) {
                (Some(r), Some(name)) => r.checking(name, target, etag),
                _ => tracing::debug!(%peer, "copy check ignored: replication is off"),
            },
            Message::Hello { .. } | Message::Pong { .. } => {}
            other => {
                tracing::debug!(%peer, msg = name_of(&other), id = ?other.id(), "unexpected control message ignored")
            }
        }
    };
    ctl.close();
    if let (Some(r), Some(name)) = (&rx.ctx.replication, ctl.peer.get()) {
        r.peer_gone(name);
    }
    match end {
        Ok(()) => tracing::debug!(%peer, "handoff control connection closed"),
        Err(e) => {
            tracing::warn!(%peer, error = %e, "handoff control connection closed on a bad frame");
            let _ = close.send(true);
        }
    }
}

/// Takes the frames queued behind `first` into `batch` (as `fdpass::next_batch` does), and the
/// notifications of frames that wait to be written into `written`.
fn next_batch(
    rx: &mut mpsc::UnboundedReceiver<Out>,
    first: Out,
    batch: &mut Vec<Outgoing>,
    written: &mut Vec<oneshot::Sender<()>>,
) {
    batch.clear();
    written.clear();
    let mut next = Some(first);
    while let Some(Out { out, written: w }) = next.take() {
        let fd = out.fd.is_some();
        batch.push(out);
        written.extend(w);
        if fd || batch.len() >= MAX_BATCH {
            break;
        }
        next = rx.try_recv().ok();
    }
}

/// The name of a message's kind, for logs (a `Create` can carry a megabyte).
fn name_of(m: &Message) -> &'static str {
    match m {
        Message::Hello { .. } => "Hello",
        Message::Create { .. } => "Create",
        Message::Accepted { .. } => "Accepted",
        Message::Drop { .. } => "Drop",
        Message::Closed { .. } => "Closed",
        Message::HandBack { .. } => "HandBack",
        Message::Route { .. } => "Route",
        Message::Routed { .. } => "Routed",
        Message::Served { .. } => "Served",
        Message::Ping { .. } => "Ping",
        Message::Pong { .. } => "Pong",
        Message::Cancel { .. } => "Cancel",
        Message::Replica(_) => "Replica",
        Message::ReplicaCheck { .. } => "ReplicaCheck",
        Message::ReplicaValid { .. } => "ReplicaValid",
    }
}

/// How a handed-in connection travelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Fd,
    Repair,
}

impl Receiver {
    /// Take (or refuse) one connection.
    #[allow(clippy::too_many_arguments)]
    fn create(
        self: &Arc<Self>,
        ctl: &Arc<Control>,
        taker: &mut Taker,
        id: u64,
        client: SocketAddr,
        local: SocketAddr,
        transfer: Transfer,
        fd: Option<OwnedFd>,
        preread: Vec<u8>,
        route: Routing,
    ) {
        let m = self.metrics();
        // A refused descriptor is only closed: the switch still holds the
        // socket and serves the client itself.
        let mut refuse = |reason: DropReason, detail: String| {
            let counter = match reason {
                DropReason::Busy => &m.refused_busy,
                DropReason::ShuttingDown => &m.refused_shutting_down,
                DropReason::RestoreFailed => &m.refused_restore_failed,
                DropReason::NoPrivilege => &m.refused_no_privilege,
                _ => &m.refused_other,
            };
            counter.fetch_add(1, Relaxed);
            tracing::debug!(id, %client, ?reason, %detail, "handoff refused");
            if let Some(drop) = taker.refuse(id, reason, detail) {
                ctl.send(drop);
            }
        };
        if self.stopping() {
            return refuse(DropReason::ShuttingDown, "node is shutting down".into());
        }
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            return refuse(DropReason::Busy, "node at its connection limit".into());
        };
        let Some((worker, live)) = self.pick_worker() else {
            return refuse(DropReason::ShuttingDown, "no worker is running".into());
        };
        let (sock, kind, unsent) = match transfer {
            Transfer::Fd => {
                let Some(fd) = fd else {
                    return refuse(DropReason::Other, "no descriptor arrived".into());
                };
                match socket2::SockRef::from(&fd).r#type() {
                    Ok(t) if t == socket2::Type::STREAM => {}
                    _ => {
                        return refuse(
                            DropReason::Other,
                            "descriptor is not a stream socket".into(),
                        )
                    }
                }
                (fd, Kind::Fd, Vec::new())
            }
            Transfer::Repair(state) => {
                let started = Instant::now();
                // No window probe on leaving repair mode: the switch hands over a
                // connection only with a whole request to answer, so the first segment
                // out is the response itself (the probe costs about 15-20 us per restore,
                // bench/handoff-micro).
                let ropts = repair::RestoreOptions {
                    window_probe: false,
                };
                match repair::restore_with(&state, local, client, ropts) {
                    Ok(r) => {
                        m.restore_seconds.observe(started.elapsed().as_secs_f64());
                        (r.fd, Kind::Repair, r.unsent)
                    }
                    Err(e) => {
                        let reason = if e.is_no_privilege() {
                            DropReason::NoPrivilege
                        } else {
                            DropReason::RestoreFailed
                        };
                        tracing::warn!(id, %client, %local, error = %e, "restore failed");
                        return refuse(reason, truncate(e.to_string()));
                    }
                }
            }
        };
        // Register the socket with the chosen worker's reactor.
        let stream = {
            let _enter = worker.enter();
            let std = std::net::TcpStream::from(sock);
            // A restored socket is live: closing it would reset the client
            // while the switch still expects to keep the connection. Keep a
            // duplicate to put it back into repair mode (silent) on failure.
            let spare = match kind {
                Kind::Repair => std.try_clone().ok(),
                Kind::Fd => None,
            };
            match std
                .set_nonblocking(true)
                .and_then(|()| TcpStream::from_std(std))
            {
                Ok(s) => s,
                Err(e) => {
                    if let Some(spare) = spare {
                        let _ = repair::dump(spare.as_fd());
                    }
                    return refuse(DropReason::Other, format!("cannot register socket: {e}"));
                }
            }
        };
        let Some(accepted) = taker.accept(id) else {
            // Answered already (cancelled): never served.
            silence(stream, kind);
            return;
        };
        let written = ctl.send_written(accepted);
        if route == Routing::Once {
            m.clones_in.fetch_add(1, Relaxed);
        }
        match kind {
            Kind::Fd => m.fd_connections.fetch_add(1, Relaxed),
            Kind::Repair => m.repair_connections.fetch_add(1, Relaxed),
        };
        let nm = &self.ctx.metrics;
        nm.connections_total.fetch_add(1, Relaxed);
        nm.connections_active.fetch_add(1, Relaxed);
        if let Some(r) = &self.reporter {
            r.event();
        }
        tracing::trace!(id, %client, ?kind, ?route, "connection handed in");
        let me = self.clone();
        let ctl = ctl.clone();
        worker.spawn(async move {
            // Serve only once the switch can know: a node that dies before its Accepted is
            // written has served nothing.
            if written.await.is_err() {
                tracing::warn!(
                    id,
                    "Accepted not written; the connection is closed unanswered"
                );
                silence(stream, kind);
                me.ctx.metrics.connections_active.fetch_sub(1, Relaxed);
                drop((permit, live));
                return;
            }
            // What the switch was still sending when it dumped the connection (the tail of a
            // response it relayed) goes out first.
            // A client that does not take it in time is cut off, and the connection ends by its
            // ordinary path.
            let mut stream = stream;
            if !unsent.is_empty() {
                let wrote =
                    tokio::time::timeout(me.ctx.send_timeout, stream.write_all(&unsent)).await;
                if !matches!(wrote, Ok(Ok(()))) {
                    tracing::debug!(id, %client, "the tail of the switch's response could not be sent");
                    let _ = socket2::SockRef::from(&stream).shutdown(std::net::Shutdown::Both);
                }
            }
            me.run(
                ctl,
                id,
                kind,
                stream,
                BytesMut::from(&preread[..]),
                route,
                permit,
            )
            .await;
            drop(live);
        });
    }

    /// Serve a handed-in connection until it closes or goes back to the switch.
    #[allow(clippy::too_many_arguments)]
    async fn run(
        self: Arc<Self>,
        ctl: Arc<Control>,
        id: u64,
        kind: Kind,
        mut stream: TcpStream,
        mut preread: BytesMut,
        route: Routing,
        permit: OwnedSemaphorePermit,
    ) {
        let mut dispatch = Dispatch::new(id, route, ctl.clone(), self.ctx.metrics.clone())
            .replicating(self.ctx.replication.clone(), self.ctx.store.clone())
            .steered(kind == Kind::Repair);
        let mut total = ConnStats::default();
        // A clone (one request, then the connection goes back to its entry node) is not this
        // node's to close when it drains: it is answered as its client asked, and handed back.
        let stop = if route == Routing::Once {
            self.never.subscribe()
        } else {
            self.stop.clone()
        };
        loop {
            let out =
                conn::serve_routed(&self.ctx, stream, stop.clone(), preread, &mut dispatch).await;
            match out {
                Outcome::Closed(stats) => {
                    total += stats;
                    ctl.send(Message::Closed {
                        id,
                        requests: total.requests,
                        bytes: total.bytes,
                    });
                    break;
                }
                Outcome::Moved {
                    stream: s,
                    rest,
                    stats,
                } => {
                    total += stats;
                    match self.hand_back(&ctl, id, kind, s, rest, total).await {
                        HandBack::Done => break,
                        HandBack::Keep(s, rest) => {
                            self.metrics().hand_back_failures.fetch_add(1, Relaxed);
                            stream = s;
                            preread = rest;
                            dispatch.resume();
                        }
                        HandBack::Lost => {
                            self.metrics().hand_back_failures.fetch_add(1, Relaxed);
                            ctl.send(Message::Closed {
                                id,
                                requests: total.requests,
                                bytes: total.bytes,
                            });
                            break;
                        }
                    }
                }
            }
        }
        self.ctx.metrics.connections_active.fetch_sub(1, Relaxed);
        if let Some(r) = &self.reporter {
            r.event();
        }
        drop(permit);
    }

    /// Give the connection back to the switch with `rest` (the next
    /// request, unread by the node's HTTP loop).
    async fn hand_back(
        &self,
        ctl: &Control,
        id: u64,
        kind: Kind,
        stream: TcpStream,
        rest: BytesMut,
        total: ConnStats,
    ) -> HandBack {
        if !ctl.is_open() || rest.len() > MAX_PREREAD {
            tracing::debug!(id, "hand-back not possible; serving locally");
            return HandBack::Keep(stream, rest);
        }
        let fd: OwnedFd = match stream.into_std() {
            Ok(s) => s.into(),
            Err(e) => {
                tracing::warn!(id, error = %e, "cannot take the socket off the runtime");
                return HandBack::Lost;
            }
        };
        let msg = |transfer| Message::HandBack {
            id,
            transfer,
            preread: rest.to_vec(),
            requests: total.requests,
            bytes: total.bytes,
        };
        match kind {
            Kind::Fd => {
                // Same kernel socket: nothing to wait for. The node's copy is
                // closed (never shut down) once the frame is sent.
                let out = Outgoing {
                    msg: msg(Transfer::Fd),
                    fd: Some(fd),
                };
                match ctl.tx.send(Out { out, written: None }) {
                    Ok(()) => {
                        self.metrics().hand_backs.fetch_add(1, Relaxed);
                        HandBack::Done
                    }
                    Err(mpsc::error::SendError(Out { out, .. })) => match out.fd.map(restream) {
                        Some(Ok(s)) => HandBack::Keep(s, rest),
                        _ => HandBack::Lost,
                    },
                }
            }
            Kind::Repair => {
                // Everything sent must be acknowledged before the dump, so
                // the switch restores a connection with nothing in flight.
                let waited = tokio::task::spawn_blocking(move || {
                    match repair::wait_acked(fd.as_fd(), ACK_TIMEOUT) {
                        Ok(true) => {}
                        Ok(false) => tracing::debug!(id, "responses not acknowledged in time"),
                        Err(e) => tracing::debug!(id, error = %e, "cannot read the send queue"),
                    }
                    let dumped = repair::dump(fd.as_fd());
                    (fd, dumped)
                })
                .await;
                let Ok((fd, dumped)) = waited else {
                    return HandBack::Lost;
                };
                match dumped {
                    Ok(state) => {
                        // In repair mode: closing sends nothing to the client.
                        drop(fd);
                        if ctl.send(msg(Transfer::Repair(Box::new(state)))) {
                            self.metrics().hand_backs.fetch_add(1, Relaxed);
                            HandBack::Done
                        } else {
                            HandBack::Lost
                        }
                    }
                    Err(e) => {
                        tracing::warn!(id, error = %e, "dump for hand-back failed; serving locally");
                        match restream(fd) {
                            Ok(s) => HandBack::Keep(s, rest),
                            Err(_) => HandBack::Lost,
                        }
                    }
                }
            }
        }
    }
}

/// What became of a hand-back.
enum HandBack {
    /// The switch has the connection.
    Done,
    /// It stays here: serve on.
    Keep(TcpStream, BytesMut),
    /// It could be neither handed back nor kept.
    Lost,
}

/// Closes a handed-in connection without a word to the client: a restored one goes back into
/// repair mode first (closing it then sends nothing), a passed descriptor is only this
/// process's copy.
fn silence(stream: TcpStream, kind: Kind) {
    if kind == Kind::Repair {
        if let Err(e) = repair::set_repair(stream.as_fd(), true) {
            tracing::warn!(error = %e, "cannot put a connection back into repair mode");
        }
    }
    drop(stream);
}

/// A socket taken off the runtime, registered again on the current one.
pub(crate) fn restream(fd: OwnedFd) -> std::io::Result<TcpStream> {
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    TcpStream::from_std(std)
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_STRING {
        let mut cut = MAX_STRING;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// The per-connection link between the HTTP loop and the switch: the
/// connection's [`Router`].
pub(crate) struct Dispatch {
    id: u64,
    route: Routing,
    /// A clone whose hand-back failed: it serves the rest of the connection here.
    kept: bool,
    /// Requests seen on the connection.
    seq: u64,
    /// The next request was already routed (a failed hand-back): serve it
    /// without asking again.
    skip_next: bool,
    ctl: Arc<Control>,
    metrics: Arc<NodeMetrics>,
    /// A clone's owner with replication on: what it needs to copy a hot object to the peer
    /// that moved the request here, and the object's key once the request is read.
    replicate: Option<(Arc<Replication>, Arc<Store>, Option<String>)>,
    /// A dispatched response produced and not yet written: (status, bytes, from the cache).
    served: Option<(u16, u64, bool)>,
    /// Whether the response about to be reported came from the memory cache.
    hit: bool,
    /// Restored with `TCP_REPAIR`: the client's packets come through the sender's steering.
    steered: bool,
}

impl Dispatch {
    pub(crate) fn new(
        id: u64,
        route: Routing,
        ctl: Arc<Control>,
        metrics: Arc<NodeMetrics>,
    ) -> Self {
        Dispatch {
            id,
            route,
            kept: false,
            seq: 0,
            skip_next: false,
            ctl,
            metrics,
            served: None,
            replicate: None,
            hit: false,
            steered: false,
        }
    }

    /// A connection restored here with `TCP_REPAIR`, whose client's packets reach this node
    /// through the sender's steering entry ([`Router::steered`]).
    pub(crate) fn steered(mut self, steered: bool) -> Self {
        self.steered = steered;
        self
    }

    /// A clone served by its owner: counts its request as the owner's reference and, once it
    /// is answered, sends the peer a copy of a hot object.
    pub(crate) fn replicating(mut self, r: Option<Arc<Replication>>, store: Arc<Store>) -> Self {
        if self.route == Routing::Once {
            self.replicate = r.map(|r| (r, store, None));
        }
        self
    }

    /// After a failed hand-back: the pending request is served here.
    fn resume(&mut self) {
        if self.route == Routing::Once {
            self.kept = true;
            return;
        }
        self.skip_next = true;
        self.seq = self.seq.saturating_sub(1);
    }

    /// Send `Route` and wait for the answer; `None` when there is none.
    async fn ask(&mut self, head: &RequestHead) -> Option<RouteAction> {
        let m = &self.metrics.handoff;
        let too_long = head.target.len() > MAX_TARGET
            || head.method_token.len() > MAX_STRING
            || head.host.as_ref().is_some_and(|h| h.len() > MAX_TARGET);
        if too_long || !self.ctl.is_open() {
            m.route_timeouts.fetch_add(1, Relaxed);
            return None;
        }
        let key = (self.id, self.seq);
        let (tx, rx) = oneshot::channel();
        self.ctl.routes.lock().insert(key, tx);
        m.route_queries.fetch_add(1, Relaxed);
        let sent = self.ctl.send(Message::Route {
            id: self.id,
            seq: self.seq,
            method: head.method_token.to_string(),
            host: head.host.clone(),
            target: head.target.clone(),
        });
        let answer = if sent {
            tokio::time::timeout(ROUTE_TIMEOUT, rx)
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        if answer.is_none() {
            self.ctl.routes.lock().remove(&key);
            m.route_timeouts.fetch_add(1, Relaxed);
            tracing::debug!(
                id = self.id,
                seq = self.seq,
                "route query unanswered; serving locally"
            );
        }
        answer
    }
}

/// The switch routes the requests of a connection it handed in.
impl Router for Dispatch {
    /// Whether the next request will be announced to the switch.
    fn asks(&self) -> bool {
        self.route == Routing::Ask && self.seq >= 1 && !self.skip_next
    }

    /// A clone goes back once its one request is answered.
    fn leaves(&self) -> bool {
        self.route == Routing::Once && self.seq >= 1 && !self.kept
    }

    /// The first request is the switch's; later ones are served here, or
    /// announced with `Route` when the switch asked for that.
    async fn route(&mut self, head: &RequestHead) -> Step {
        self.seq += 1;
        if self.seq == 1 && !self.skip_next {
            if let Some((r, store, key)) = &mut self.replicate {
                if matches!(head.method, Method::Get | Method::Head) {
                    *key = store.object_key(&head.target);
                    if let Some(k) = key.as_deref() {
                        r.owned(k);
                    }
                }
            }
            return Step::Local { dispatched: true };
        }
        if std::mem::take(&mut self.skip_next) || self.route != Routing::Ask {
            return Step::Local { dispatched: false };
        }
        match self.ask(head).await {
            Some(RouteAction::Serve) => Step::Local { dispatched: true },
            Some(RouteAction::Forward(peer)) => Step::Forward(peer),
            Some(RouteAction::HandBack) => Step::HandBack,
            None => Step::Local { dispatched: false },
        }
    }

    /// Remembers a dispatched response until it is written. A clone's answered request for a
    /// hot object sends its copy ahead of the connection's return.
    fn answered(&mut self, status: u16, bytes: u64) {
        self.served = Some((status, bytes, std::mem::take(&mut self.hit)));
        if let Some((r, store, key)) = &mut self.replicate {
            if let (Some(k), Some(peer), true) = (key.take(), self.ctl.peer.get(), status < 400) {
                if let Some(copy) = r.offer(store, &k, peer) {
                    self.ctl.send(copy);
                }
            }
        }
    }

    fn cache_hit(&mut self, hit: bool) {
        self.hit = hit;
    }

    fn steered(&self) -> bool {
        self.steered
    }

    /// Everything produced has been written: report a pending response.
    fn flushed(&mut self) {
        if let Some((status, bytes, from_cache)) = self.served.take() {
            self.ctl.send(Message::Served {
                id: self.id,
                status,
                bytes,
                from_cache,
            });
        }
    }
}

/// The control listeners of a running node.
pub(crate) struct Listeners {
    pub(crate) tcp_addr: Option<SocketAddr>,
    pub(crate) unix_path: Option<PathBuf>,
    pub(crate) done: watch::Sender<bool>,
    pub(crate) tasks: Vec<JoinHandle<()>>,
    /// The rule that drops unmatched packets for the VIP (`handoff_vip`).
    pub(crate) drop_rule: Option<switchyard_handoff::steer::NoSocketDrop>,
}

impl Listeners {
    /// After the workers have drained: close every control connection and
    /// remove the socket file.
    pub(crate) async fn close(self) {
        let _ = self.done.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        if let Some(p) = &self.unix_path {
            if let Err(e) = std::fs::remove_file(p) {
                tracing::debug!(path = %p.display(), error = %e, "cannot remove the handoff socket");
            }
        }
        if let Some(rule) = self.drop_rule {
            if let Err(e) = rule.remove(None) {
                tracing::warn!(error = %e, "cannot remove the VIP drop rule");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control() -> (Arc<Control>, mpsc::UnboundedReceiver<Out>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let ctl = Arc::new(Control {
            tx,
            routes: Mutex::new(HashMap::new()),
            open: AtomicBool::new(true),
            peer: std::sync::OnceLock::new(),
        });
        (ctl, rx)
    }

    fn head(target: &str) -> RequestHead {
        let req = format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n");
        match switchyard_http::request::parse(req.as_bytes(), &Default::default()) {
            Ok(switchyard_http::request::ParseOutcome::Complete(h)) => h,
            other => panic!("{other:?}"),
        }
    }

    /// The first request is the switch's; later ones are asked about only
    /// with `route`, and an unanswered query is served locally.
    #[test]
    fn route_steps() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (ctl, mut out) = control();
            let metrics = Arc::new(NodeMetrics::default());
            let mut d = Dispatch::new(9, Routing::Own, ctl.clone(), metrics.clone());
            assert!(matches!(
                d.route(&head("/a")).await,
                Step::Local { dispatched: true }
            ));
            assert!(!d.asks());
            assert!(matches!(
                d.route(&head("/b")).await,
                Step::Local { dispatched: false }
            ));
            d.cache_hit(true);
            d.answered(200, 10);
            d.flushed();
            d.flushed();
            let m = out.recv().await.unwrap().out.msg;
            assert_eq!(
                m,
                Message::Served {
                    id: 9,
                    status: 200,
                    bytes: 10,
                    from_cache: true,
                }
            );
            assert!(out.try_recv().is_err());

            let mut d = Dispatch::new(4, Routing::Ask, ctl.clone(), metrics.clone());
            d.route(&head("/a")).await;
            assert!(d.asks());
            let answer = {
                let ctl = ctl.clone();
                async move {
                    let Some(Out {
                        out:
                            Outgoing {
                                msg:
                                    Message::Route {
                                        id, seq, target, ..
                                    },
                                ..
                            },
                        ..
                    }) = out.recv().await
                    else {
                        panic!("expected Route");
                    };
                    assert_eq!((id, seq, target.as_str()), (4, 2, "/b"));
                    let w = ctl.routes.lock().remove(&(id, seq)).unwrap();
                    w.send(RouteAction::HandBack).unwrap();
                    out
                }
            };
            let b = head("/b");
            let (step, _out) = tokio::join!(d.route(&b), answer);
            assert!(matches!(step, Step::HandBack));
            // A failed hand-back: the same request is served without asking.
            d.resume();
            assert!(!d.asks());
            assert!(matches!(
                d.route(&head("/b")).await,
                Step::Local { dispatched: false }
            ));
            // The control connection is gone: no wait at all.
            ctl.close();
            let t = Instant::now();
            assert!(matches!(
                d.route(&head("/c")).await,
                Step::Local { dispatched: false }
            ));
            assert!(t.elapsed() < ROUTE_TIMEOUT);
            assert_eq!(metrics.handoff.route_queries.load(Relaxed), 1);
            assert_eq!(metrics.handoff.route_timeouts.load(Relaxed), 1);
        });
    }

    /// Connections go round the workers; a finished worker is skipped.
    #[test]
    fn workers_are_picked_round_robin() {
        let rts: Vec<_> = (0..3)
            .map(|_| {
                tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap()
            })
            .collect();
        let lives: Vec<Live> = (0..3).map(|_| Live::new()).collect();
        let slots: Vec<WorkerSlot> = rts
            .iter()
            .zip(&lives)
            .map(|(rt, l)| (rt.handle().clone(), l.downgrade()))
            .collect();
        let id = |start| pick(&slots, start).map(|(h, _)| h.id());
        let ids: Vec<_> = rts.iter().map(|r| Some(r.handle().id())).collect();
        assert_eq!(
            [id(0), id(1), id(2), id(3)],
            [ids[0], ids[1], ids[2], ids[0]]
        );
        let mut lives = lives;
        lives.remove(1);
        assert_eq!(id(1), ids[2]);
        lives.clear();
        assert!(id(0).is_none());
        assert!(pick(&[], 0).is_none());
    }

    #[test]
    fn long_details_are_cut_on_a_char_boundary() {
        let s = truncate("é".repeat(MAX_STRING));
        assert!(s.len() <= MAX_STRING);
        assert!(s.chars().all(|c| c == 'é'));
    }

    #[test]
    fn stale_socket_files_are_replaced_but_other_files_kept() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("ctl.sock");
            drop(bind_unix(&p).unwrap());
            assert!(p.exists());
            let _l = bind_unix(&p).unwrap();
            let f = dir.path().join("plain");
            std::fs::write(&f, b"x").unwrap();
            assert!(bind_unix(&f).is_err());
            assert!(f.exists());
        });
    }
}
