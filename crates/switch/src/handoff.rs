//! One-way delivery at the switch: handing a client's connection to the node that serves it.
//!
//! A node with a `control` address keeps a persistent control connection to the switch
//! ([`run_control`]): a Unix stream socket for a node on the same host (the connection itself
//! travels as a descriptor, `SCM_RIGHTS`) or TCP for a node on another host (the connection
//! travels as `TCP_REPAIR` state and the switch steers the client's later packets to the node
//! below its TCP stack). The messages are those of `switchyard_handoff::proto`.
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
//! (the entry goes after `handoff_linger_ms`, once the FIN exchange is over). A lost control
//! connection takes its node's connections out of the table and their steering entries away.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use switchyard_handoff::fdpass::{self, next_batch, ControlReader, ControlWriter, Outgoing};
use switchyard_handoff::metrics::HandoffMetrics;
use switchyard_handoff::mover::{
    self, Event, Mover, MoverConfig, Outcome as Moved, TakeBackReason,
};
use switchyard_handoff::proto::{Message, RouteAction, Transfer, MAX_PREREAD};
use switchyard_handoff::repair;
use switchyard_handoff::steer::{self, Flow, Steering, Target};
use switchyard_http::request::{self, ParseOutcome};
use switchyard_policy::{ConnId, Decision, NodeId, Outcome, PolicyKind, Request as PolicyRequest};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::backend::Backend;
use crate::config::{ControlAddr, Persistent, SteeringKind, SwitchConfig};
use crate::{Generation, Shared};

/// Why a connection was relayed instead of handed off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// The node's control connection is down.
    ControlDown,
    /// No steering table (setup failed: no privileges or tools) for a node on another host.
    NoSteering,
    /// The connection cannot be steered (IPv6) or its node's MAC address is unknown.
    NotSteerable,
    /// The kernel refused to dump the connection (no CAP_NET_ADMIN, not established).
    Dump,
    /// The node answered `Drop`.
    Refused,
    /// The node did not answer in time; it answered the `Cancel` with `Drop`.
    Timeout,
    /// The control connection ended cleanly before the node answered.
    ControlLost,
    /// Neither the `Create` nor the `Cancel` was answered in time, or the control connection
    /// failed before an answer: the switch closed its copy without writing (not relayed).
    Abandoned,
    /// A node gave the connection back and no node took it again.
    HandBack,
    /// The client had sent more than a `Create` carries (pipelined requests beyond 1 MiB).
    TooMuchRead,
}

impl Fallback {
    pub(crate) const ALL: [Fallback; 10] = [
        Fallback::ControlDown,
        Fallback::NoSteering,
        Fallback::NotSteerable,
        Fallback::Dump,
        Fallback::Refused,
        Fallback::Timeout,
        Fallback::ControlLost,
        Fallback::Abandoned,
        Fallback::HandBack,
        Fallback::TooMuchRead,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Fallback::ControlDown => "control_down",
            Fallback::NoSteering => "no_steering",
            Fallback::NotSteerable => "not_steerable",
            Fallback::Dump => "dump_failed",
            Fallback::Refused => "refused",
            Fallback::Timeout => "timeout",
            Fallback::ControlLost => "control_lost",
            Fallback::Abandoned => "abandoned",
            Fallback::HandBack => "hand_back",
            Fallback::TooMuchRead => "too_much_read",
        }
    }
}

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

/// The switch's end of one node's control connection.
#[derive(Debug)]
pub(crate) struct Control {
    pub addr: ControlAddr,
    tx: Mutex<Option<mpsc::UnboundedSender<Outgoing>>>,
    /// Where steered packets go (nodes on another host), found once connected.
    target: Mutex<Option<Target>>,
}

impl Control {
    pub fn new(addr: ControlAddr) -> Self {
        Control {
            addr,
            tx: Mutex::new(None),
            target: Mutex::new(None),
        }
    }

    pub fn is_up(&self) -> bool {
        self.tx.lock().is_some()
    }

    fn same_host(&self) -> bool {
        matches!(self.addr, ControlAddr::Unix(_))
    }

    fn send(&self, msg: Message, fd: Option<OwnedFd>) -> bool {
        match &*self.tx.lock() {
            Some(tx) => tx.send(Outgoing { msg, fd }).is_ok(),
            None => false,
        }
    }
}

/// A request dispatched by the switch whose `Served` has not arrived yet.
#[derive(Clone, Copy, Debug)]
struct Dispatched {
    /// The node it was counted on (its index in the connection's generation).
    node: usize,
    /// Whether the policy counted it (a request served locally because the policy refused to
    /// choose is not).
    counted: bool,
}

/// A `Create` waiting for its node's answer.
struct Pending {
    /// The node it went to.
    node: usize,
    /// When the first handoff of the connection started (`None`: a handed-back connection
    /// passed on).
    first: Option<Instant>,
    /// The one answer for the connection's mover.
    tx: oneshot::Sender<Event>,
    /// Which offer of the connection this is: a connection handed back and passed on gets a
    /// new entry under the same id while the mover of the previous offer may still be
    /// finishing, and that one must not take the new entry away.
    offer: u64,
    /// The control address the `Create` went to: only that node's answers are for it.
    via: ControlAddr,
}

/// A connection that lives on a node.
struct Handed {
    gen: Arc<Generation>,
    conn: ConnId,
    /// The node that holds it now.
    node: usize,
    peer: SocketAddr,
    local: SocketAddr,
    flow: Option<Flow>,
    route: bool,
    outstanding: VecDeque<Dispatched>,
    /// Where a connection handed back goes next (decided when its request was routed).
    next: Option<usize>,
}

/// Everything the switch keeps for one-way delivery.
pub(crate) struct Handoffs {
    pub metrics: HandoffMetrics,
    steering: Option<Arc<dyn Steering>>,
    /// Why there is no steering table, if there is none.
    pub steering_error: Option<String>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
    conns: Mutex<HashMap<u64, Handed>>,
    /// The connection that owns each live steering entry (a delayed removal must not take
    /// the entry of a newer connection on the same 4-tuple).
    flows: Mutex<HashMap<Flow, u64>>,
    /// Entries of closed connections, removed once their time is up (oldest first; every
    /// connection of a generation lingers equally long, so deadlines stay nearly in order).
    lingering: Mutex<VecDeque<(Instant, Flow, u64)>>,
    /// Removes the steering setup (at shutdown).
    teardown: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Handoffs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoffs")
            .field("steering", &self.steering.as_ref().map(|s| s.kind()))
            .field("live", &self.conns.lock().len())
            .finish_non_exhaustive()
    }
}

impl Drop for Handoffs {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Handoffs {
    /// Set up for `cfg`: a steering table when handoffs cross hosts.
    pub fn new(cfg: &SwitchConfig, instance: &str) -> Self {
        let cross_host = cfg.mechanism == crate::config::Mechanism::Handoff
            && cfg
                .nodes
                .iter()
                .any(|n| matches!(n.control, Some(ControlAddr::Tcp(_))));
        let mut steering: Option<Arc<dyn Steering>> = None;
        let mut steering_error = None;
        let mut teardown: Option<Box<dyn FnOnce() + Send>> = None;
        if cross_host {
            let iface = cfg.steering_iface.clone();
            let tag = instance.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
            let nft = |teardown: &mut Option<Box<dyn FnOnce() + Send>>| {
                steer::nft::NftSteering::setup(None, &iface, &tag).map(|s| {
                    let tag = tag.clone();
                    *teardown = Some(Box::new(move || {
                        steer::nft::NftSteering::teardown(None, &tag)
                    }));
                    Arc::new(s) as Arc<dyn Steering>
                })
            };
            let r: switchyard_handoff::Result<Arc<dyn Steering>> = match cfg.steering {
                SteeringKind::Ebpf => {
                    let ecfg = steer::ebpf::EbpfConfig::new(&iface, instance);
                    let pin_dir = ecfg.pin_dir.clone();
                    let iface2 = iface.clone();
                    match steer::ebpf::EbpfSteering::setup(&ecfg, None) {
                        Ok(s) => {
                            teardown = Some(Box::new(move || {
                                steer::ebpf::EbpfSteering::teardown(None, &iface2, &pin_dir)
                            }));
                            Ok(Arc::new(s) as Arc<dyn Steering>)
                        }
                        // nftables is the fallback when the eBPF program cannot be built or
                        // attached (no clang or bpftool, an older kernel).
                        Err(e) => {
                            tracing::warn!(error = %e, %iface, "eBPF steering unavailable; trying nftables");
                            nft(&mut teardown).map_err(|n| {
                                switchyard_handoff::HandoffError::Other(format!(
                                    "eBPF: {e}; nftables: {n}"
                                ))
                            })
                        }
                    }
                }
                SteeringKind::Nftables => nft(&mut teardown),
            };
            match r {
                Ok(s) => {
                    tracing::info!(backend = s.kind(), %iface, "steering ready");
                    steering = Some(s);
                }
                Err(e) => {
                    tracing::error!(error = %e, %iface,
                        "no steering table: connections for nodes on other hosts will be relayed");
                    steering_error = Some(e.to_string());
                }
            }
        }
        Handoffs {
            metrics: HandoffMetrics::new(),
            steering,
            steering_error,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
            flows: Mutex::new(HashMap::new()),
            lingering: Mutex::new(VecDeque::new()),
            teardown: Mutex::new(teardown),
        }
    }

    /// Remove the entries whose linger time is over (called periodically by [`run_linger`]).
    fn expire_lingering(&self, now: Instant) {
        loop {
            let next = {
                let mut q = self.lingering.lock();
                match q.front() {
                    Some((at, _, _)) if *at <= now => q.pop_front(),
                    _ => None,
                }
            };
            let Some((_, flow, id)) = next else {
                return;
            };
            self.unsteer(&flow, id);
        }
    }

    /// Take offer `offer` of connection `id` out of the waiting table; false if an answer
    /// (or the end of the control connection) took it first.
    fn withdraw(&self, id: u64, offer: u64) -> bool {
        let mut pending = self.pending.lock();
        match pending.get(&id) {
            Some(p) if p.offer == offer => pending.remove(&id).is_some(),
            _ => false,
        }
    }

    /// The waiting offer of connection `id` if it went to node `b`: an answer about `id` from
    /// another node (one the connection left before it came back and was passed on) is not
    /// for it.
    fn take_pending(&self, id: u64, b: &Backend) -> Option<Pending> {
        let via = b.control.as_deref().map(|c| &c.addr);
        let mut pending = self.pending.lock();
        match pending.get(&id) {
            Some(p) if Some(&p.via) == via => pending.remove(&id),
            _ => None,
        }
    }

    /// Remove the steering setup; connections on nodes keep their entries until then.
    pub fn shutdown(&self) {
        if let Some(t) = self.teardown.lock().take() {
            t();
        }
    }

    /// Fallbacks by reason.
    pub fn fallbacks(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Fallback::ALL
            .iter()
            .map(|f| (f.label(), self.metrics.fallbacks_for(f.label())))
    }

    fn count_fallback(&self, why: Fallback) {
        self.metrics.fallback(why.label());
    }

    /// Steering entries live.
    pub fn steering_live(&self) -> usize {
        self.steering.as_ref().map_or(0, |s| s.live())
    }

    /// The steering backend in use, if any.
    pub fn steering_kind(&self) -> Option<&'static str> {
        self.steering.as_ref().map(|s| s.kind())
    }

    fn set_steering_gauge(&self) {
        self.metrics
            .steering_entries
            .set(self.steering_live() as i64);
    }

    fn steer(&self, flow: &Flow, to: &Target, id: u64) -> bool {
        let Some(s) = &self.steering else {
            return false;
        };
        match s.insert(flow, to) {
            Ok(()) => {
                self.flows.lock().insert(*flow, id);
                self.set_steering_gauge();
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "steering insert failed");
                false
            }
        }
    }

    /// Removes `flow`'s entry if connection `id` still owns it.
    fn unsteer(&self, flow: &Flow, id: u64) {
        let Some(s) = &self.steering else {
            return;
        };
        {
            let mut flows = self.flows.lock();
            if flows.get(flow) != Some(&id) {
                return;
            }
            flows.remove(flow);
        }
        if let Err(e) = s.remove(flow) {
            tracing::warn!(error = %e, "steering remove failed");
        }
        self.set_steering_gauge();
    }
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
fn routes(gen: &Generation) -> bool {
    match gen.cfg.persistent {
        Persistent::Auto => gen.cfg.policy.name == PolicyKind::ExtLard,
        Persistent::Single => false,
        Persistent::MultipleHandoff | Persistent::BackendForwarding => true,
    }
}

/// A connection the relay loop offers to a node: node `idx` of `gen` serves the request at
/// the front of `preread` (chosen by the policy as `policy_node`).
pub(crate) struct Offer<'a> {
    pub gen: &'a Arc<Generation>,
    pub idx: usize,
    pub policy_node: Option<NodeId>,
    pub conn: ConnId,
    pub stream: &'a TcpStream,
    pub peer: SocketAddr,
    pub preread: Vec<u8>,
}

/// Hand the offered connection to its node. [`Offered::Moved`]: the node has the connection;
/// [`Offered::Relay`]: the connection is usable by the caller as before (out of repair mode,
/// nothing sent) and the caller relays; [`Offered::Abandoned`]: nobody knows whether the node
/// serves it, so the caller closes it without writing. Fallbacks are counted by reason.
pub(crate) async fn hand_off(shared: &Arc<Shared>, offer: Offer<'_>) -> Offered {
    let (peer, node) = (offer.peer, offer.gen.nodes[offer.idx].addr);
    match try_hand_off(shared, offer).await {
        Ok(()) => Offered::Moved,
        Err(why) => {
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

/// Offer connection `id` to node `node` over `ctl` (`create` and its descriptor) and run the
/// mover until the answer is definitive (see `switchyard_handoff::mover` for why the switch
/// never serves a connection the node may serve).
#[allow(clippy::too_many_arguments)]
async fn send_offer(
    h: &Handoffs,
    ctl: &Control,
    id: u64,
    node: usize,
    first: Option<Instant>,
    create: Message,
    fd: Option<OwnedFd>,
    timeout: Duration,
) -> Moved {
    let (tx, rx) = oneshot::channel();
    let offer = h.next_id.fetch_add(1, Relaxed);
    h.pending.lock().insert(
        id,
        Pending {
            node,
            first,
            tx,
            offer,
            via: ctl.addr.clone(),
        },
    );
    let now = tokio::time::Instant::now().into_std();
    let mut m = Mover::new(id, MoverConfig::symmetric(timeout), now);
    if !ctl.send(create, fd) {
        m.handle(Event::NotSent);
    }
    let outcome = mover::drive(
        &mut m,
        async { rx.await.ok() },
        |frame| {
            // If the link is down, its end reaches the mover through the pending entry.
            ctl.send(frame, None);
        },
        // Taking the entry out fences the expiry against an answer read meanwhile.
        || h.withdraw(id, offer),
    )
    .await;
    h.withdraw(id, offer);
    outcome
}

/// A connection nobody may serve any more from here: its table entry goes (returned), its
/// steering entry stays for the linger time (the node may hold the connection), and it is
/// counted by reason.
fn abandon(h: &Handoffs, id: u64, why: mover::AbandonReason, linger: Duration) -> Option<Handed> {
    h.count_fallback(Fallback::Abandoned);
    h.metrics.abandon(why.label());
    let c = h.conns.lock().remove(&id)?;
    if let Some(flow) = c.flow {
        h.lingering
            .lock()
            .push_back((Instant::now() + linger, flow, id));
    }
    Some(c)
}

async fn try_hand_off(shared: &Arc<Shared>, offer: Offer<'_>) -> Result<(), Fallback> {
    let Offer {
        gen,
        idx,
        policy_node,
        conn,
        stream,
        peer,
        preread,
    } = offer;
    let started = Instant::now();
    let h = &shared.handoffs;
    let b = &gen.nodes[idx];
    let ctl = b.control.as_ref().ok_or(Fallback::ControlDown)?;
    if !ctl.is_up() {
        return Err(Fallback::ControlDown);
    }
    if preread.len() > MAX_PREREAD {
        // More pipelined bytes than a Create carries: relay this connection.
        return Err(Fallback::TooMuchRead);
    }
    let local = stream.local_addr().map_err(|_| Fallback::NotSteerable)?;
    let id = h.next_id.fetch_add(1, Relaxed);
    let route = routes(gen);
    let (transfer, fd, flow) = if ctl.same_host() {
        let fd = stream
            .as_fd()
            .try_clone_to_owned()
            .map_err(|_| Fallback::Dump)?;
        (Transfer::Fd, Some(fd), None)
    } else {
        if h.steering.is_none() {
            return Err(Fallback::NoSteering);
        }
        let flow = Flow::new(peer, local).map_err(|_| Fallback::NotSteerable)?;
        let target = (*ctl.target.lock()).ok_or(Fallback::NotSteerable)?;
        // The entry first: from the dump on, the client's packets must reach the node.
        if !h.steer(&flow, &target, id) {
            return Err(Fallback::NoSteering);
        }
        match repair::dump(stream.as_fd()) {
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
    });
    h.conns.lock().insert(
        id,
        Handed {
            gen: gen.clone(),
            conn,
            node: idx,
            peer,
            local,
            flow,
            route,
            outstanding,
            next: None,
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
    match send_offer(h, ctl, id, idx, Some(started), create, fd, wait).await {
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
            abandon(h, id, why, Duration::from_millis(gen.cfg.handoff_linger_ms));
            Err(Fallback::Abandoned)
        }
        Moved::TakeBack(why) => {
            h.conns.lock().remove(&id);
            if let Some(flow) = &flow {
                h.unsteer(flow, id);
                if let Err(e) = repair::leave_repair(stream.as_fd()) {
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

/// Keep node `b`'s control connection up while the switch runs and `b` is configured.
pub(crate) async fn run_control(shared: Arc<Shared>, b: Arc<Backend>) {
    let Some(ctl) = b.control.clone() else {
        return;
    };
    let mut stop = shared.stop.clone();
    let mut backoff = Duration::from_millis(50);
    loop {
        if *stop.borrow() || b.retired.load(Relaxed) {
            return;
        }
        let connect_timeout = shared.current().t.connect;
        let connected = tokio::time::timeout(connect_timeout, connect(&ctl.addr)).await;
        let result = match connected {
            Ok(Ok(io)) => {
                backoff = Duration::from_millis(50);
                tokio::select! {
                    r = session(&shared, &b, &ctl, io) => r,
                    _ = stop.changed() => Ok(()),
                }
            }
            Ok(Err(e)) => Err(End::Failed(e.to_string())),
            Err(_) => Err(End::Failed("connect timed out".into())),
        };
        *ctl.tx.lock() = None;
        let clean = matches!(&result, Err(End::Clean(_)));
        lost(&shared, &b, clean);
        if let Err(e) = result {
            tracing::debug!(node = %b.addr, control = %ctl.addr, error = %e, "control connection down");
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn connect(addr: &ControlAddr) -> std::io::Result<(ControlReader, ControlWriter)> {
    Ok(match addr {
        ControlAddr::Unix(p) => fdpass::control_unix(tokio::net::UnixStream::connect(p).await?),
        ControlAddr::Tcp(a) => fdpass::control_tcp(TcpStream::connect(a).await?),
    })
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

/// One control connection: hello both ways, then frames until either side ends it.
async fn session(
    shared: &Arc<Shared>,
    b: &Arc<Backend>,
    ctl: &Arc<Control>,
    (mut reader, mut writer): (ControlReader, ControlWriter),
) -> Result<(), End> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
    let _ = tx.send(Outgoing::plain(Message::Hello {
        name: "switch".into(),
    }));
    let write = async {
        let mut batch = Vec::new();
        while let Some(o) = rx.recv().await {
            next_batch(&mut rx, o, &mut batch);
            let sent = writer.send_batch(&batch).await;
            // Drop what was sent now: a passed descriptor must not keep the switch's copy of
            // the client socket open.
            batch.clear();
            match sent {
                Ok(unsent) => {
                    // A frame that cannot be encoded spoils only itself.
                    for u in unsent {
                        tracing::warn!(error = %u.error, id = ?u.id, "control frame not encodable");
                        fail_pending(shared, u.id);
                    }
                }
                // A failed write may have delivered any part of the batch: the waiting
                // handoffs learn it from the end of the session.
                Err(e) => return Err(End::Failed(e.to_string())),
            }
        }
        Ok(())
    };
    let read = async {
        let mut hello = false;
        loop {
            match reader.recv().await {
                Ok(Some((m, fd))) => {
                    if !hello {
                        expect_hello(&m, b, ctl, &tx).map_err(End::Failed)?;
                        hello = true;
                        shared.control_up.notify_waiters();
                        continue;
                    }
                    on_message(shared, b, m, fd)
                }
                Ok(None) => return Err(End::Clean("node closed the control connection".into())),
                Err(e) if clean_error(&reader, &e) => return Err(End::Clean(e.to_string())),
                Err(e) => return Err(End::Failed(e.to_string())),
            }
        }
    };
    tokio::select! { r = write => r, r = read => r }
}

fn expect_hello(
    m: &Message,
    b: &Backend,
    ctl: &Control,
    tx: &mpsc::UnboundedSender<Outgoing>,
) -> Result<(), String> {
    match m {
        Message::Hello { name } => {
            if let ControlAddr::Tcp(a) = &ctl.addr {
                // The node answered over this connection, so its MAC address is in the
                // neighbour table now.
                if let std::net::IpAddr::V4(ip) = a.ip() {
                    match steer::neighbour_mac(ip) {
                        Some(mac) => *ctl.target.lock() = Some(Target { ip, mac }),
                        None => tracing::warn!(node = %b.addr, %ip,
                            "node's MAC address unknown: its connections will be relayed"),
                    }
                }
            }
            tracing::info!(node = %b.addr, control = %ctl.addr, name = %name, "control connection up");
            *ctl.tx.lock() = Some(tx.clone());
            Ok(())
        }
        other => Err(format!("expected Hello, got {other:?}")),
    }
}

/// A frame could not be encoded, so it never left: its `Create`, if it was one, is taken back
/// now rather than after the timeout.
fn fail_pending(shared: &Shared, id: Option<u64>) {
    if let Some(id) = id {
        if let Some(Pending { tx, .. }) = shared.handoffs.pending.lock().remove(&id) {
            let _ = tx.send(Event::NotSent);
        }
    }
}

/// The node behind a control connection is gone: its connections with it. `clean`: everything
/// the node wrote was read.
fn lost(shared: &Shared, b: &Arc<Backend>, clean: bool) {
    let h = &shared.handoffs;
    // Handoffs still waiting for this node's answer: their movers decide (a clean end takes
    // the connection back, a failure abandons it) and clean up their table entries.
    let waiting: Vec<u64> = {
        let mut pending = h.pending.lock();
        let g = shared.current();
        let ids: Vec<u64> = pending
            .iter()
            .filter(|(_, p)| {
                g.nodes
                    .get(p.node)
                    .is_some_and(|n| std::ptr::eq(&**n, &**b))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some(Pending { tx, .. }) = pending.remove(id) {
                let _ = tx.send(if clean {
                    Event::ControlEnded
                } else {
                    Event::ControlFailed
                });
            }
        }
        ids
    };
    // Connections the node had accepted are gone with it.
    let gone: Vec<(u64, Handed)> = {
        let mut conns = h.conns.lock();
        let ids: Vec<u64> = conns
            .iter()
            .filter(|(id, c)| std::ptr::eq(&*c.gen.nodes[c.node], &**b) && !waiting.contains(id))
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| conns.remove(&id).map(|c| (id, c)))
            .collect()
    };
    if !gone.is_empty() {
        tracing::warn!(node = %b.addr, connections = gone.len(), "node lost with handed-off connections");
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

fn on_message(shared: &Arc<Shared>, b: &Arc<Backend>, m: Message, fd: Option<OwnedFd>) {
    let h = &shared.handoffs;
    match m {
        Message::Accepted { id } => {
            let pending = h.take_pending(id, b);
            if let Some(Pending {
                node, first, tx, ..
            }) = pending
            {
                // The node may ask about the next request (or report this one served) before
                // the waiting task runs: the connection is on `node` from now on, and counted
                // here, in order with the node's later reports.
                if let Some(c) = h.conns.lock().get_mut(&id) {
                    c.node = node;
                    if c.flow.is_some() {
                        h.metrics.handoffs_repair.inc();
                    } else {
                        h.metrics.handoffs_fd.inc();
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
            if let Some(Pending { tx, .. }) = h.take_pending(id, b) {
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
        Message::Served { id, status, bytes } => {
            let done = h.conns.lock().get_mut(&id).and_then(|c| {
                c.outstanding
                    .pop_front()
                    .map(|d| (d, c.gen.clone(), c.conn))
            });
            if let Some((d, gen, conn)) = done {
                let node = &gen.nodes[d.node];
                node.active.fetch_sub(1, Relaxed);
                node.requests.fetch_add(1, Relaxed);
                node.bytes.fetch_add(bytes, Relaxed);
                shared.node_ok(node);
                shared.metrics.count_status(status);
                if d.counted {
                    gen.policy.lock().post_request(
                        conn,
                        NodeId(d.node as u32),
                        &Outcome::ok(status, bytes, false),
                        shared.now(),
                    );
                }
                shared.freed.notify_one();
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
            if let Some(c) = c {
                if let Some(flow) = c.flow {
                    // The FIN exchange still needs the entry for a moment.
                    let linger = Duration::from_millis(c.gen.cfg.handoff_linger_ms);
                    h.lingering
                        .lock()
                        .push_back((Instant::now() + linger, flow, id));
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
            if let Some(ctl) = &b.control {
                ctl.send(Message::Routed { id, seq, action }, None);
            }
        }
        Message::HandBack {
            id,
            transfer,
            preread,
            ..
        } => {
            h.metrics.hand_backs.inc();
            let sh = shared.clone();
            tokio::spawn(async move { pass_on(sh, id, transfer, fd, preread).await });
        }
        Message::Ping { nonce } => {
            if let Some(ctl) = &b.control {
                ctl.send(Message::Pong { nonce }, None);
            }
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
    c.outstanding.push_back(Dispatched { node, counted });
    gen.nodes[node].active.fetch_add(1, Relaxed);
    action
}

/// Multiple handoff: connection `id` came back from its node with the next request unread;
/// pass it on to the node chosen for that request, or serve it here if none takes it.
async fn pass_on(
    shared: Arc<Shared>,
    id: u64,
    transfer: Transfer,
    fd: Option<OwnedFd>,
    preread: Vec<u8>,
) {
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
        return;
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
            });
            gen.nodes[n].active.fetch_add(1, Relaxed);
        }
        Some(n)
    });
    let same_kind = |i: usize| {
        gen.nodes
            .get(i)
            .and_then(|b| b.control.clone())
            .filter(|c| c.is_up() && c.same_host() == matches!(transfer, Transfer::Fd))
    };
    let target_ctl = to
        .filter(|&i| i != from)
        .and_then(|i| same_kind(i).map(|c| (i, c)));
    if let Some((to, ctl)) = target_ctl {
        let steered = match (&flow, ctl.target.lock().as_ref()) {
            // Repoint in one step: the entry never disappears.
            (Some(f), Some(t)) => h.steer(f, t, id),
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
            match send_offer(h, &ctl, id, to, None, create, fd_copy, wait).await {
                Moved::Moved { late } => {
                    if late {
                        h.metrics.late_accepts.inc();
                    }
                    return;
                }
                Moved::Abandon(why) => {
                    // The state or descriptor held here is dropped unused.
                    tracing::warn!(%peer, node = %gen.nodes[to].addr, ?why,
                        "handed-back connection abandoned: the connection is closed unanswered");
                    let linger = Duration::from_millis(gen.cfg.handoff_linger_ms);
                    if let Some(c) = abandon(h, id, why, linger) {
                        finish(&shared, c);
                    }
                    return;
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
    let Some(c) = h.conns.lock().remove(&id) else {
        return;
    };
    if let Some(f) = &c.flow {
        h.unsteer(f, id);
    }
    finish(&shared, c);
    let stream = match (transfer, fd) {
        (Transfer::Fd, Some(fd)) => Some(std::net::TcpStream::from(fd)),
        (Transfer::Repair(state), _) => match repair::restore(&state, local, peer) {
            Ok(fd) => Some(std::net::TcpStream::from(fd)),
            Err(e) => {
                tracing::warn!(error = %e, %peer, "cannot take a handed-back connection back; it is lost");
                None
            }
        },
        _ => None,
    };
    let Some(stream) = stream.and_then(|s| {
        s.set_nonblocking(true).ok()?;
        TcpStream::from_std(s).ok()
    }) else {
        return;
    };
    crate::relay::serve_with(shared, stream, peer, bytes::BytesMut::from(&preread[..])).await;
}
