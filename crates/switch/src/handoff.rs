//! One-way delivery at the switch: handing a client's connection to the node that serves it.
//!
//! Each worker thread of the switch keeps a persistent control connection of its own to every
//! node with a `control` address ([`run_worker_links`], [`crate::control`]): a Unix stream
//! socket for a node on the same host (the connection itself travels as a descriptor,
//! `SCM_RIGHTS`) or TCP for a node on another host (the connection travels as `TCP_REPAIR`
//! state and the switch steers the client's later packets to the node below its TCP stack).
//! The messages are those of `switchyard_handoff::proto`. A handoff runs entirely on the
//! thread that owns the client connection: its task writes the `Create` (and any `Cancel`) on
//! that thread's control connection, whose reader, on the same thread, reads the answer. The
//! node's later reports may arrive on any connection and land in the shared table
//! ([`crate::handed`]).
//!
//! The path of one handoff ([`hand_off`], called by the relay loop once the policy chose a
//! node for a request without a body):
//!
//! 1. across hosts: the steering entry for the 4-tuple is installed *first*, then the socket
//!    is dumped (it stays on the switch, silent in repair mode);
//! 2. `Create` goes to the node with the bytes the switch already read;
//! 3. the answer is awaited by a mover (`switchyard_handoff::mover`, driven here by
//!    [`send_offer`] for first handoffs and hand-backs alike). `Accepted`: the switch closes its
//!    copy (a repair-mode socket sends nothing; a passed descriptor lives on in the node) and
//!    forgets the connection except for a table entry. `Drop`, or a clean end of the control
//!    stream: the entry is removed, the socket leaves repair mode and the switch relays the
//!    connection itself — counted as a fallback. No answer within `handoff_timeout_ms`: the
//!    switch sends `Cancel` and waits as long again; a late `Accepted` leaves the connection to
//!    the node, a `Drop` gets it relayed, and no answer (or a failed control stream) gets it
//!    *abandoned*: closed without writing, its steering entry left to linger, never relayed —
//!    the node may be serving it, and a connection must not be served twice.
//!
//! While a node serves a handed-off connection it reports `Served` per dispatched request (the
//! policy counts it finished), `Route` before each further request when persistent
//! connections are routed (answered `Routed`: serve, fetch from another node — back-end
//! forwarding — or hand back), `HandBack` (multiple handoff: the switch passes the connection
//! on to the next node in one step, repointing the steering entry) and `Closed` at the end
//! (the entry goes after `handoff_linger_ms`, once the FIN exchange is over), each on the
//! control connection its `Create` came on. A lost control connection takes the connections
//! the node accepted over it out of the table and their steering entries away.
//!
//! A connection given back that no node takes is returned to the caller's relay loop (a
//! [`ServeHere`] given by the wiring): this module does not depend on the relay.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use switchyard_handoff::fdpass::{ControlReader, ControlSink, ControlWriter};
use switchyard_handoff::mover::{Event, MoverConfig, Outcome as Moved, TakeBackReason};
use switchyard_handoff::proto::{Message, RouteAction, Routing, Transfer, MAX_PREREAD};
use switchyard_handoff::repair;
use switchyard_handoff::steer::{self, Flow, Target};
use switchyard_http::request::{self, ParseOutcome};
use switchyard_policy::{ConnId, Decision, NodeId, Outcome, PolicyKind, Request as PolicyRequest};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::backend::Backend;
use crate::config::{ControlAddr, Persistent};
use crate::control::{Control, Link, Pending, Sent};
use crate::generation::Generation;
use crate::handed::{Dispatched, Fallback, Handed, Handoffs};
use crate::state::Shared;

/// Serves a connection that no node took back (a handed-back connection): the relay loop,
/// given by the caller so that this module does not depend on it. Arguments: the stream, the
/// client's address, the switch's own address of the connection, and the bytes already read.
pub(crate) type ServeHere = Arc<
    dyn Fn(TcpStream, SocketAddr, SocketAddr, BytesMut) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// What became of a connection offered to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offered {
    /// The node serves it: the caller drops its copy without writing to it.
    Moved,
    /// The node will not serve it: the caller relays it.
    Relay,
    /// Unknown whether the node serves it: the caller drops its copy without writing to it and
    /// ends the connection's bookkeeping.
    Abandoned,
}

/// Remove lingering steering entries of closed connections, ten times a second, while the
/// switch runs (one task for all of them instead of a timer per connection).
pub(crate) async fn run_linger(shared: Arc<Shared>) {
    if shared.handoffs.steering.is_none() {
        return;
    }
    let mut stop = shared.stop.clone();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => shared.handoffs.expire_lingering(Instant::now()),
            _ = stop.changed() => return,
        }
    }
}

/// Whether handed-off connections ask the switch before each further request.
fn routes(gen: &Generation) -> Routing {
    let ask = match gen.cfg.persistent {
        Persistent::Auto => gen.cfg.policy.name == PolicyKind::ExtLard,
        Persistent::Single => false,
        Persistent::MultipleHandoff | Persistent::BackendForwarding => true,
    };
    if ask {
        Routing::Ask
    } else {
        Routing::Own
    }
}

/// A connection the relay loop offers to a node: node `idx` of `gen` serves the request at
/// the front of `preread` (chosen by the policy as `policy_node`).
pub(crate) struct Offer<'a> {
    pub gen: &'a Arc<Generation>,
    pub idx: usize,
    pub policy_node: Option<NodeId>,
    pub conn: ConnId,
    /// The client's socket.
    pub stream: BorrowedFd<'a>,
    pub peer: SocketAddr,
    /// The switch's address of the connection.
    pub local: SocketAddr,
    /// The worker thread that owns the connection (whose control connection carries it).
    pub worker: usize,
    pub preread: Vec<u8>,
    /// Whether the switch has written anything on the connection (a response it relayed or
    /// answered itself): only then can bytes still be unsent (see [`all_sent`]).
    pub wrote: bool,
}

/// Hand the offered connection to its node. [`Offered::Moved`]: the node has the connection;
/// [`Offered::Relay`]: the connection is usable by the caller as before (out of repair mode,
/// nothing sent) and the caller relays; [`Offered::Abandoned`]: nobody knows whether the node
/// serves it, so the caller closes it without writing. Fallbacks are counted by reason.
pub(crate) async fn hand_off(shared: &Arc<Shared>, offer: Offer<'_>) -> Offered {
    let backend = offer.gen.nodes[offer.idx].clone();
    let (peer, node) = (offer.peer, backend.addr);
    match try_hand_off(shared, offer).await {
        Ok(()) => Offered::Moved,
        Err(why) => {
            backend.fallbacks.fetch_add(1, Relaxed);
            if why != Fallback::Abandoned {
                // (An abandoned handoff was counted where it was given up.)
                shared.handoffs.count_fallback(why);
            }
            if why == Fallback::Abandoned {
                tracing::warn!(%peer, %node, "handoff abandoned: the connection is closed unanswered");
                Offered::Abandoned
            } else {
                tracing::debug!(%peer, %node, reason = why.label(), "handoff fell back to relaying");
                Offered::Relay
            }
        }
    }
}

/// Offer connection `id` to node `node` over `link` (`create` and its descriptor) and run the
/// mover until the answer is definitive. The `Create` is written by the task that owns the
/// connection, and the answer is read by the link's reader on the same thread.
#[allow(clippy::too_many_arguments)]
async fn send_offer(
    h: &Handoffs,
    link: &Link,
    id: u64,
    node: usize,
    first: Option<Instant>,
    create: Message,
    fd: Option<OwnedFd>,
    timeout: Duration,
) -> Moved {
    let offer = h.next_id.fetch_add(1, Relaxed);
    let sent = Sent { node, first };
    let cfg = MoverConfig::symmetric(timeout);
    switchyard_handoff::link::offer(link, id, offer, sent, create, fd, cfg).await
}

/// Whether everything the switch wrote on `stream` has left it; a connection still sending
/// a response the switch relayed is relayed again rather than moved. A dump reads the send
/// queue and the unsent count at one moment, but the kernel goes on sending queued bytes
/// (pacing, small-queue completions) until the socket is closed: bytes counted as unsent would
/// then reach the client from here, the client's acknowledgements would run ahead of the
/// restored socket's next sequence number and be ignored there, and the connection would stall.
/// With nothing unsent, a dump is exact. (Only a request that follows a relayed one, a request
/// with a body, on the same connection can find bytes unsent.)
fn all_sent(stream: BorrowedFd<'_>) -> Result<(), Fallback> {
    match repair::unsent(stream) {
        Ok(0) => Ok(()),
        Ok(_) => Err(Fallback::StillSending),
        Err(_) => Err(Fallback::Dump),
    }
}

async fn try_hand_off(shared: &Arc<Shared>, offer: Offer<'_>) -> Result<(), Fallback> {
    let Offer {
        gen,
        idx,
        policy_node,
        conn,
        stream,
        peer,
        local,
        worker,
        preread,
        wrote,
    } = offer;
    let started = Instant::now();
    let h = &shared.handoffs;
    let b = &gen.nodes[idx];
    let ctl = b.control.as_ref().ok_or(Fallback::ControlDown)?;
    let link = ctl.link(worker);
    if !link.is_up() {
        return Err(Fallback::ControlDown);
    }
    if preread.len() > MAX_PREREAD {
        // More pipelined bytes than a Create carries: relay this connection.
        return Err(Fallback::TooMuchRead);
    }
    let id = h.next_id.fetch_add(1, Relaxed);
    let route = routes(gen);
    let (transfer, fd, flow) = if ctl.same_host() {
        let fd = stream.try_clone_to_owned().map_err(|_| Fallback::Dump)?;
        (Transfer::Fd, Some(fd), None)
    } else {
        if h.steering.is_none() {
            return Err(Fallback::NoSteering);
        }
        let flow = Flow::new(peer, local).map_err(|_| Fallback::NotSteerable)?;
        let target = ctl.target().ok_or(Fallback::NotSteerable)?;
        if wrote {
            all_sent(stream)?;
        }
        // The entry first: from the dump on, the client's packets must reach the node.
        if !h.steer(&flow, &target, id) {
            return Err(Fallback::NoSteering);
        }
        match repair::dump(stream) {
            Ok(state) => (Transfer::Repair(Box::new(state)), None, Some(flow)),
            Err(e) => {
                tracing::debug!(error = %e, "dump failed");
                h.unsteer(&flow, id);
                return Err(Fallback::Dump);
            }
        }
    };
    let mut outstanding = VecDeque::new();
    outstanding.push_back(Dispatched {
        node: idx,
        counted: policy_node.is_some(),
        at: Instant::now(),
    });
    h.conns.lock().insert(
        id,
        Handed {
            gen: gen.clone(),
            conn,
            node: idx,
            link: worker,
            peer,
            local,
            flow,
            route,
            outstanding,
            next: None,
            counted: (0, 0),
        },
    );
    let create = Message::Create {
        id,
        client: peer,
        local,
        transfer,
        preread,
        route,
    };
    let wait = Duration::from_millis(gen.cfg.handoff_timeout_ms);
    match send_offer(h, link, id, idx, Some(started), create, fd, wait).await {
        // Counted where the Accepted was read, in order with the node's later reports.
        Moved::Moved { late } => {
            if late {
                h.metrics.late_accepts.inc();
                tracing::warn!(node = %b.addr, id, "node accepted a handoff after its Cancel");
            }
            Ok(())
        }
        Moved::Abandon(why) => {
            // The socket stays as it is (in repair mode it closes silently). Nothing was
            // counted for the connection yet: that happens with the Accepted.
            h.abandon(id, why, Duration::from_millis(gen.cfg.handoff_linger_ms));
            Err(Fallback::Abandoned)
        }
        Moved::TakeBack(why) => {
            h.conns.lock().remove(&id);
            if let Some(flow) = &flow {
                h.unsteer(flow, id);
                if let Err(e) = repair::leave_repair(stream) {
                    // The socket cannot be used any more; the relay loop finds it broken.
                    tracing::warn!(error = %e, "cannot leave repair mode");
                }
            }
            tracing::debug!(node = %b.addr, ?why, "node did not take a handoff");
            Err(take_back_fallback(why))
        }
    }
}

/// The fallback a definitive refusal is counted as.
fn take_back_fallback(why: TakeBackReason) -> Fallback {
    match why {
        TakeBackReason::NotSent => Fallback::ControlDown,
        TakeBackReason::Refused(_) => Fallback::Refused,
        TakeBackReason::Cancelled(_) => Fallback::Timeout,
        TakeBackReason::ControlEnded => Fallback::ControlLost,
    }
}

/// Keep this worker's control connection to every node with a control address up while the
/// switch runs, following reloads: a node that joins gets one, one that leaves ends its own.
/// Runs on the worker's runtime, so that the connections' readers run on the worker's thread.
pub(crate) async fn run_worker_links(shared: Arc<Shared>, worker: usize, serve: ServeHere) {
    let mut gens = shared.gen_id.subscribe();
    let mut stop = shared.stop.clone();
    let mut started: Vec<Arc<Backend>> = Vec::new();
    loop {
        if *stop.borrow() {
            return;
        }
        started.retain(|b| !b.retired.load(Relaxed));
        let g = shared.current();
        for b in g.nodes.iter().filter(|b| b.control.is_some()) {
            if !started.iter().any(|s| Arc::ptr_eq(s, b)) {
                started.push(b.clone());
                tokio::spawn(run_link(shared.clone(), b.clone(), worker, serve.clone()));
            }
        }
        drop(g);
        // (A dropped stop signal stops too.)
        tokio::select! {
            r = gens.changed() => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Keep worker `worker`'s control connection to node `b` up while the switch runs and `b` is
/// configured.
async fn run_link(shared: Arc<Shared>, b: Arc<Backend>, worker: usize, serve: ServeHere) {
    let Some(ctl) = b.control.clone() else {
        return;
    };
    let link = ctl.link(worker);
    let mut stop = shared.stop.clone();
    let mut backoff = Duration::from_millis(50);
    loop {
        if *stop.borrow() || b.retired.load(Relaxed) {
            return;
        }
        let connect_timeout = shared.current().t.connect;
        let connected = tokio::time::timeout(connect_timeout, ctl.addr.connect()).await;
        let result = match connected {
            Ok(Ok(io)) => {
                backoff = Duration::from_millis(50);
                tokio::select! {
                    r = session(&shared, &b, &ctl, worker, &serve, io) => r,
                    _ = stop.wait_for(|s| *s) => Ok(()),
                }
            }
            Ok(Err(e)) => Err(End::Failed(e.to_string())),
            Err(_) => Err(End::Failed("connect timed out".into())),
        };
        let waiting = link.close();
        let clean = matches!(&result, Err(End::Clean(_)));
        lost(&shared, &b, worker, waiting, clean);
        if let Err(e) = result {
            tracing::debug!(node = %b.addr, control = %ctl.addr, worker, error = %e, "control connection down");
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// How a control connection ended, for the handoffs waiting on it.
#[derive(Debug)]
enum End {
    /// Everything the node wrote has been read (end of stream; on a Unix socket also a reset,
    /// reported only after the dead peer's last bytes): a `Create` it did not answer is one it
    /// never serves.
    Clean(String),
    /// Frames may have been lost either way.
    Failed(String),
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Clean(s) => write!(f, "{s}"),
            End::Failed(s) => write!(f, "{s}"),
        }
    }
}

/// Whether a read error still means that everything the node wrote was read.
fn clean_error(reader: &ControlReader, e: &switchyard_handoff::HandoffError) -> bool {
    matches!(reader, ControlReader::Unix(_))
        && matches!(e, switchyard_handoff::HandoffError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionReset)
}

/// One control connection: hello both ways, then frames until either side ends it. The reader
/// runs here; frames are written by whoever sends them, and the backlog, if any, by the
/// flusher here.
async fn session(
    shared: &Arc<Shared>,
    b: &Arc<Backend>,
    ctl: &Control,
    worker: usize,
    serve: &ServeHere,
    (mut reader, writer): (ControlReader, ControlWriter),
) -> Result<(), End> {
    let link = ctl.link(worker);
    let ready = link.open(ControlSink::new(writer));
    let hello = Message::Hello {
        name: "switch".into(),
    };
    if !link.write(&hello, None) {
        return Err(End::Failed("cannot send Hello".into()));
    }
    let flush = async { link.run_flusher(ready).await.map_err(End::Failed) };
    let read = async {
        let mut hello = false;
        loop {
            match reader.recv().await {
                Ok(Some((m, fd))) => {
                    if !hello {
                        expect_hello(&m, b, ctl, worker).map_err(End::Failed)?;
                        link.set_up();
                        shared.control_up.notify_waiters();
                        hello = true;
                        continue;
                    }
                    // Replies to frames that arrived together go out with one write: frames
                    // already read are handled without a suspension point in between.
                    if reader.has_frame() {
                        link.hold();
                    }
                    on_message(shared, b, link, worker, serve, m, fd);
                    if !reader.has_frame() {
                        link.release();
                    }
                }
                Ok(None) => return Err(End::Clean("node closed the control connection".into())),
                Err(e) if clean_error(&reader, &e) => return Err(End::Clean(e.to_string())),
                Err(e) => return Err(End::Failed(e.to_string())),
            }
        }
    };
    tokio::select! { r = flush => r, r = read => r }
}

fn expect_hello(m: &Message, b: &Backend, ctl: &Control, worker: usize) -> Result<(), String> {
    match m {
        Message::Hello { name } => {
            if let (ControlAddr::Tcp(a), None) = (&ctl.addr, ctl.target()) {
                // The node answered over this connection, so its MAC address is in the
                // neighbour table now.
                if let std::net::IpAddr::V4(ip) = a.ip() {
                    match steer::neighbour_mac(ip) {
                        Some(mac) => ctl.set_target(Target { ip, mac }),
                        None => tracing::warn!(node = %b.addr, %ip,
                            "node's MAC address unknown: its connections will be relayed"),
                    }
                }
            }
            tracing::info!(node = %b.addr, control = %ctl.addr, worker, name = %name, "control connection up");
            Ok(())
        }
        other => Err(format!("expected Hello, got {other:?}")),
    }
}

/// Worker `worker`'s control connection to node `b` is gone: the handoffs that waited on it
/// (`waiting`) and the connections the node accepted over it go with it. `clean`: everything
/// the node wrote was read.
fn lost(
    shared: &Shared,
    b: &Arc<Backend>,
    worker: usize,
    waiting: Vec<(u64, Pending)>,
    clean: bool,
) {
    let h = &shared.handoffs;
    // Handoffs still waiting for this node's answer: their movers decide (a clean end takes
    // the connection back, a failure abandons it) and clean up their table entries.
    let waiting: Vec<u64> = waiting
        .into_iter()
        .map(|(id, p)| {
            let _ = p.tx.send(if clean {
                Event::ControlEnded
            } else {
                Event::ControlFailed
            });
            id
        })
        .collect();
    // Connections the node had accepted over this connection can report nothing more.
    let gone: Vec<(u64, Handed)> = {
        let mut conns = h.conns.lock();
        let ids: Vec<u64> = conns
            .iter()
            .filter(|(id, c)| {
                c.link == worker
                    && std::ptr::eq(&*c.gen.nodes[c.node], &**b)
                    && !waiting.contains(id)
            })
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| conns.remove(&id).map(|c| (id, c)))
            .collect()
    };
    if !gone.is_empty() {
        tracing::warn!(node = %b.addr, worker, connections = gone.len(), "control connection lost with handed-off connections");
    }
    for (id, c) in gone {
        if let Some(flow) = &c.flow {
            h.unsteer(flow, id);
        }
        finish(shared, c);
    }
}

/// A handed-off connection has ended: its outstanding requests and the connection itself are
/// finished for the policy.
fn finish(shared: &Shared, c: Handed) {
    let now = shared.now();
    {
        let mut p = c.gen.policy.lock();
        for d in &c.outstanding {
            if d.counted {
                p.post_request(c.conn, NodeId(d.node as u32), &Outcome::failed(), now);
            }
        }
        p.connection_end(c.conn, now);
    }
    for d in &c.outstanding {
        c.gen.nodes[d.node].active.fetch_sub(1, Relaxed);
    }
    shared.handoffs.metrics.handed_active.dec();
    shared.freed.notify_waiters();
}

/// One frame from node `b` on worker `worker`'s control connection `link`.
fn on_message(
    shared: &Arc<Shared>,
    b: &Arc<Backend>,
    link: &Link,
    worker: usize,
    serve: &ServeHere,
    m: Message,
    fd: Option<OwnedFd>,
) {
    let h = &shared.handoffs;
    match m {
        Message::Accepted { id } => {
            if let Some(Pending {
                data: Sent { node, first },
                tx,
                ..
            }) = link.answer(id)
            {
                // The node may ask about the next request (or report this one served) before
                // the waiting task runs: the connection is on `node` from now on, and counted
                // here, in order with the node's later reports.
                if let Some(c) = h.conns.lock().get_mut(&id) {
                    c.node = node;
                    c.link = worker;
                    if c.flow.is_some() {
                        h.metrics.handoffs_repair.inc();
                    } else {
                        h.metrics.handoffs_fd.inc();
                    }
                    if let Some(b) = c.gen.nodes.get(node) {
                        b.handoffs.fetch_add(1, Relaxed);
                    }
                    if let Some(started) = first {
                        h.metrics.observe_latency(started.elapsed());
                        h.metrics.handed_active.inc();
                        // The first request, dispatched with the handoff.
                        c.gen.nodes[node].active.fetch_add(1, Relaxed);
                    }
                }
                let _ = tx.send(Event::Accepted);
            }
        }
        Message::Drop { id, reason, detail } => {
            if let Some(Pending { tx, .. }) = link.answer(id) {
                tracing::debug!(id, ?reason, %detail, "node dropped a handoff");
                let _ = tx.send(Event::Dropped(reason));
            } else if let Some(c) = h.conns.lock().remove(&id) {
                // Lost after it was accepted.
                if let Some(flow) = &c.flow {
                    h.unsteer(flow, id);
                }
                finish(shared, c);
            }
        }
        Message::Served {
            id,
            status,
            bytes,
            from_cache,
        } => {
            let done = h.conns.lock().get_mut(&id).and_then(|c| {
                let d = c.outstanding.pop_front()?;
                c.counted.0 += 1;
                c.counted.1 += bytes;
                Some((d, c.gen.clone(), c.conn))
            });
            if let Some((d, gen, conn)) = done {
                let node = &gen.nodes[d.node];
                node.active.fetch_sub(1, Relaxed);
                node.count_response(bytes, Some(from_cache), d.at.elapsed());
                shared.node_ok(node);
                shared.metrics.count_status(status);
                if d.counted {
                    gen.policy.lock().post_request(
                        conn,
                        NodeId(d.node as u32),
                        &Outcome::ok(status, bytes, from_cache),
                        shared.now(),
                    );
                }
                shared.request_done();
            }
        }
        Message::Closed {
            id,
            requests,
            bytes,
        } => {
            h.metrics.requests.inc_by(requests);
            h.metrics.bytes.inc_by(bytes);
            let c = h.conns.lock().remove(&id);
            if let Some(mut c) = c {
                c.count_totals(requests, bytes);
                if let Some(flow) = c.flow {
                    // The FIN exchange still needs the entry for a moment.
                    let linger = Duration::from_millis(c.gen.cfg.handoff_linger_ms);
                    h.linger(flow, id, linger);
                }
                finish(shared, c);
            }
        }
        Message::Route {
            id,
            seq,
            method,
            host,
            target,
        } => {
            let action = route(shared, id, &method, host.as_deref(), &target);
            link.send(&Message::Routed { id, seq, action }, None);
        }
        Message::HandBack {
            id,
            transfer,
            preread,
            requests,
            bytes,
        } => {
            h.metrics.hand_backs.inc();
            if let Some(c) = h.conns.lock().get_mut(&id) {
                c.count_totals(requests, bytes);
            }
            let (sh, serve) = (shared.clone(), serve.clone());
            tokio::spawn(async move {
                if let Some((stream, peer, local, pre)) =
                    pass_on(&sh, worker, id, transfer, fd, preread).await
                {
                    serve(stream, peer, local, pre).await;
                }
            });
        }
        Message::Ping { nonce } => {
            link.send(&Message::Pong { nonce }, None);
        }
        other => {
            tracing::debug!(node = %b.addr, message = ?other.id(), "unexpected control message ignored");
        }
    }
}

/// Decide how the node holding connection `id` serves its next request.
fn route(shared: &Shared, id: u64, method: &str, host: Option<&str>, target: &str) -> RouteAction {
    let h = &shared.handoffs;
    let mut conns = h.conns.lock();
    let Some(c) = conns.get_mut(&id) else {
        return RouteAction::Serve;
    };
    let gen = c.gen.clone();
    let req = PolicyRequest {
        conn: c.conn,
        method,
        host,
        target,
        size_hint: None,
    };
    let decision = gen.policy.lock().select(&req, shared.now());
    let here = c.node;
    let mode = gen.cfg.persistent;
    let (action, node, counted) = match decision {
        Err(_) => (RouteAction::Serve, here, false),
        Ok(d) => {
            let n = d.node().0 as usize;
            let usable = |i: usize| i < gen.nodes.len() && gen.nodes[i].is_up();
            match d {
                _ if n == here || !usable(n) => (RouteAction::Serve, n, true),
                Decision::Handoff { .. } => (RouteAction::HandBack, n, true),
                Decision::Forward { .. } => (RouteAction::Forward(gen.nodes[n].addr), n, true),
                Decision::Serve { .. } => match mode {
                    Persistent::MultipleHandoff => (RouteAction::HandBack, n, true),
                    Persistent::BackendForwarding => {
                        (RouteAction::Forward(gen.nodes[n].addr), n, true)
                    }
                    Persistent::Auto | Persistent::Single => (RouteAction::Serve, n, true),
                },
            }
        }
    };
    match action {
        RouteAction::HandBack => c.next = Some(node),
        RouteAction::Forward(_) => {
            h.metrics.backend_forwards.inc();
        }
        RouteAction::Serve => {}
    }
    c.outstanding.push_back(Dispatched {
        node,
        counted,
        at: Instant::now(),
    });
    gen.nodes[node].active.fetch_add(1, Relaxed);
    shared.dispatched(target, node);
    action
}

/// Multiple handoff: connection `id` came back from its node with the next request unread;
/// pass it on to the node chosen for that request over worker `worker`'s control connection to
/// it, or return it to be served here (the stream, the client's and the switch's addresses and
/// the bytes read) if none takes it.
async fn pass_on(
    shared: &Arc<Shared>,
    worker: usize,
    id: u64,
    transfer: Transfer,
    fd: Option<OwnedFd>,
    preread: Vec<u8>,
) -> Option<(TcpStream, SocketAddr, SocketAddr, BytesMut)> {
    let h = &shared.handoffs;
    let info = {
        let mut conns = h.conns.lock();
        conns.get_mut(&id).map(|c| {
            let next = c.next.take();
            (
                c.gen.clone(),
                c.conn,
                c.node,
                next,
                c.peer,
                c.local,
                c.flow,
                c.route,
            )
        })
    };
    let Some((gen, conn, from, next, peer, local, flow, route)) = info else {
        tracing::debug!(id, "hand-back for an unknown connection");
        return None;
    };
    let to = next.or_else(|| {
        // Not routed (a node gave it back on its own): choose for the request it carries.
        let limits = gen.limits;
        let head = match request::parse(&preread, &limits) {
            Ok(ParseOutcome::Complete(head)) => head,
            _ => return None,
        };
        let req = PolicyRequest {
            conn,
            method: &head.method_token,
            host: head.host.as_deref(),
            target: &head.target,
            size_hint: None,
        };
        let d = gen.policy.lock().select(&req, shared.now()).ok()?;
        let n = d.node().0 as usize;
        if let Some(c) = h.conns.lock().get_mut(&id) {
            c.outstanding.push_back(Dispatched {
                node: n,
                counted: true,
                at: Instant::now(),
            });
            shared.dispatched(&head.target, n);
            gen.nodes[n].active.fetch_add(1, Relaxed);
        }
        Some(n)
    });
    let same_kind = |i: usize| {
        gen.nodes
            .get(i)
            .and_then(|b| b.control.clone())
            .filter(|c| c.link(worker).is_up() && c.same_host() == matches!(transfer, Transfer::Fd))
    };
    let target_ctl = to
        .filter(|&i| i != from)
        .and_then(|i| same_kind(i).map(|c| (i, c)));
    if let Some((to, ctl)) = target_ctl {
        let steered = match (&flow, ctl.target()) {
            // Repoint in one step: the entry never disappears.
            (Some(f), Some(t)) => h.steer(f, &t, id),
            (None, _) => true,
            (Some(_), None) => false,
        };
        if steered {
            let fd_copy = fd.as_ref().and_then(|f| f.try_clone().ok());
            let create = Message::Create {
                id,
                client: peer,
                local,
                transfer: transfer.clone(),
                preread: preread.clone(),
                route,
            };
            let wait = Duration::from_millis(gen.cfg.handoff_timeout_ms);
            match send_offer(h, ctl.link(worker), id, to, None, create, fd_copy, wait).await {
                Moved::Moved { late } => {
                    if late {
                        h.metrics.late_accepts.inc();
                    }
                    return None;
                }
                Moved::Abandon(why) => {
                    // The state or descriptor held here is dropped unused.
                    tracing::warn!(%peer, node = %gen.nodes[to].addr, ?why,
                        "handed-back connection abandoned: the connection is closed unanswered");
                    let linger = Duration::from_millis(gen.cfg.handoff_linger_ms);
                    if let Some(c) = h.abandon(id, why, linger) {
                        finish(shared, c);
                    }
                    return None;
                }
                Moved::TakeBack(why) => {
                    tracing::warn!(%peer, node = %gen.nodes[to].addr, ?why,
                        "node did not take a handed-back connection");
                }
            }
        } else {
            tracing::warn!(%peer, node = %gen.nodes[to].addr, "cannot steer a handed-back connection");
        }
    } else {
        tracing::warn!(%peer, to = ?to, from, "no node to pass a handed-back connection on to");
    }
    // Nobody took it: the switch serves the connection itself from here on.
    h.count_fallback(Fallback::HandBack);
    if let Some(b) = to.and_then(|i| gen.nodes.get(i)) {
        b.fallbacks.fetch_add(1, Relaxed);
    }
    let c = h.conns.lock().remove(&id)?;
    if let Some(f) = &c.flow {
        h.unsteer(f, id);
    }
    finish(shared, c);
    let (stream, unsent) = match (transfer, fd) {
        (Transfer::Fd, Some(fd)) => (std::net::TcpStream::from(fd), Vec::new()),
        (Transfer::Repair(state), _) => match repair::restore(&state, local, peer) {
            Ok(r) => (std::net::TcpStream::from(r.fd), r.unsent),
            Err(e) => {
                tracing::warn!(error = %e, %peer, "cannot take a handed-back connection back; it is lost");
                return None;
            }
        },
        _ => return None,
    };
    stream.set_nonblocking(true).ok()?;
    let mut stream = TcpStream::from_std(stream).ok()?;
    // What the node was still sending when it dumped the connection goes out first.
    if !unsent.is_empty() {
        let send = Duration::from_millis(gen.cfg.send_timeout_ms);
        match tokio::time::timeout(send, stream.write_all(&unsent)).await {
            Ok(Ok(())) => {}
            _ => {
                tracing::debug!(%peer, "the tail of a handed-back response could not be sent");
                return None;
            }
        }
    }
    Some((stream, peer, local, BytesMut::from(&preread[..])))
}
