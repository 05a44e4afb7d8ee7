//! Cooperative mode: nodes move live connections among themselves, with no front end (seed 000,
//! Cyclone, §3.1 socket cloning).
//!
//! Clients reach any node (the kernel spreads them over processes sharing one port with
//! `SO_REUSEPORT`, or a layer-4 director spreads them over hosts). Every node computes the same
//! owner map from the same membership ([`Owners`], a policy of `switchyard-policy`, consistent
//! hashing with bounded loads by default, with node ids derived from the members' names). A
//! request whose owner is this node is served here. A request owned by a peer is *cloned* to
//! it: the connection leaves the HTTP loop with the request unread (`Step::HandBack` of the
//! connection's [`Owned`] router), travels to the owner over this node's control connection to
//! it (`Create` with [`Routing::Once`], the same link and mover as the switch's handoffs,
//! `switchyard_handoff::link`), the owner serves exactly that request and gives the connection
//! back (`HandBack`) with whatever the client sent meanwhile, and the loop here takes the next
//! request: serve it, or clone again. At most one clone of a connection exists at a time (this
//! node waits for the hand-back before it reads again) and a clone never clones further (the
//! owner serves it with the switch's `Dispatch` router in `Once` mode, which never asks anyone).
//!
//! The safety argument of the mover holds unchanged: this node serves a connection it offered
//! only after a definitive refusal, and gives it up when nothing is known. A peer that dies
//! loses the connections it was serving at that moment and nothing else; its targets move to
//! the others (its control connection is down: `node_down` in the owner map).
//!
//! Same host (a member with a `unix:` control address): connections travel as descriptors
//! (`SCM_RIGHTS`), which needs no privilege. Across hosts (a member with a TCP control
//! address), as seed 000 §3.1 and LVS direct routing have it: the layer-4 director keeps
//! delivering the client's packets to this node (the *entry* node), so this node installs a
//! steering entry for the connection's 4-tuple towards the owner first
//! (`switchyard_handoff::steer::table`, the switch's backends), then dumps the socket with
//! `TCP_REPAIR` (it stays here, deaf and silent, until the owner's answer) and sends the state
//! in the `Create`. The owner restores it (it holds the VIP on `lo` like every member), answers
//! the client directly, waits until the response is acknowledged, dumps it again and sends the
//! state back in its `HandBack`; this node restores it and only then removes the steering
//! entry, so that no packet of the client finds this node without its socket (and any that
//! reaches the owner meanwhile is dropped there by the VIP rule, for the client to send again).
//! A refusal removes the entry and the socket leaves repair mode; an abandoned clone keeps its
//! entry for a while (the owner may be serving it) and the socket is closed in repair mode,
//! which sends nothing: never two writers.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use parking_lot::Mutex;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch, Notify};

use switchyard_handoff::fdpass::ControlReader;
use switchyard_handoff::link::{self, ControlAddr, Link};
use switchyard_handoff::mover::{MoverConfig, Outcome as Moved, TakeBackReason};
use switchyard_handoff::proto::{Message, RouteAction, Routing, Transfer, MAX_PREREAD};
use switchyard_handoff::repair::{self, RepairState};
use switchyard_handoff::steer::table::Table;
use switchyard_handoff::steer::{Flow, Target};
use switchyard_http::request::{Method, RequestHead};
use switchyard_policy::{ConnId, NodeId, NodeSpec, Outcome, Policy, Request};

use crate::config::{ClusterConfig, ClusterMechanism};
use crate::conn::{self, CopyTo, Ctx, Fetch, FetchCopy, FetchCounts, Router, Step};
use crate::error::NodeError;
use crate::handoff::restream;
use crate::replica::{Held, Replication};
use crate::store::Store;

/// Targets the dashboard's hot-target counter keeps track of in a period.
const HOT_CAPACITY: usize = 64;

/// How long a steering entry stays after the owner reported its clone closed: the last
/// packets of the FIN exchange still go to the owner.
const CLOSED_LINGER: Duration = Duration::from_secs(2);
/// How long a steering entry stays after a clone was lost or abandoned: the owner may still be
/// serving the connection, and must keep getting its packets meanwhile.
const LOST_LINGER: Duration = Duration::from_secs(60);
/// Step of the wait until a response written here has left the socket before a dump.
const SENT_POLL: Duration = Duration::from_micros(200);

/// A connection as it comes back from its owner.
enum Came {
    /// The socket itself (same host).
    Fd(OwnedFd),
    /// Its `TCP_REPAIR` state, to restore here (across hosts).
    Repair(Box<RepairState>),
}

/// How a cloned connection came back, or did not.
enum Return {
    /// The owner gave it back: the connection and the bytes of the next request it read.
    Back { conn: Came, preread: Vec<u8> },
    /// The client closed it while the owner served it.
    Closed,
    /// The owner's control connection ended, or the owner lost it.
    Lost,
}

/// Why a request owned by a peer was served here after all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// The control connection to the owner was down.
    ControlDown,
    /// More bytes were read than a `Create` carries.
    TooMuchRead,
    /// The socket could not be duplicated.
    NoDescriptor,
    /// The owner refused it (`Drop`), or answered the `Cancel` with `Drop`.
    Refused,
    /// The control connection ended cleanly before an answer.
    ControlEnded,
    /// The owner is on another host and its packets cannot be steered there (no steering
    /// table, the owner's MAC address unknown, an IPv6 connection, an insertion that failed).
    NoSteering,
    /// A response written here had not left the socket in time for a dump.
    StillSending,
    /// The `TCP_REPAIR` dump failed.
    Dump,
    /// The client reached this node at an address of its own, not at the VIP every member
    /// holds: the owner could not take the connection over.
    NotVip,
}

impl Fallback {
    const ALL: [Fallback; 9] = [
        Fallback::ControlDown,
        Fallback::TooMuchRead,
        Fallback::NoDescriptor,
        Fallback::Refused,
        Fallback::ControlEnded,
        Fallback::NoSteering,
        Fallback::StillSending,
        Fallback::Dump,
        Fallback::NotVip,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Fallback::ControlDown => "control_down",
            Fallback::TooMuchRead => "too_much_read",
            Fallback::NoDescriptor => "no_descriptor",
            Fallback::Refused => "refused",
            Fallback::ControlEnded => "control_ended",
            Fallback::NoSteering => "no_steering",
            Fallback::StillSending => "still_sending",
            Fallback::Dump => "dump",
            Fallback::NotVip => "not_vip",
        }
    }
}

/// Counters of one peer, as seen by this node.
#[derive(Debug, Default)]
pub(crate) struct PeerStats {
    /// Connections cloned to the peer (it accepted them).
    pub clones: AtomicU64,
    /// Clones the peer gave back.
    pub hand_backs: AtomicU64,
    /// Clones that ended at the peer (the client closed them there).
    pub closed: AtomicU64,
    /// Clones lost: the peer's control connection ended while it held them, or nobody knows
    /// whether it took them (abandoned).
    pub lost: AtomicU64,
    /// Requests the owner map gave the peer (cloned, or served here from a copy).
    pub routed: AtomicU64,
}

/// One member of the cluster other than this node.
pub(crate) struct Peer {
    pub name: String,
    id: NodeId,
    pub addr: ControlAddr,
    link: Link<()>,
    /// Clones this peer holds, waiting for their return, by connection id.
    returns: Mutex<HashMap<u64, oneshot::Sender<Return>>>,
    /// Notified whenever `returns` becomes empty (a peer that left closes its link then).
    idle: Notify,
    pub stats: PeerStats,
    /// Where the client's packets go while the peer serves a clone (a peer on another host;
    /// learnt once its control connection is up).
    target: Mutex<Option<Target>>,
    /// Responses fetched from the peer (`mechanism = "fetch"`).
    pub fetches: Arc<FetchCounts>,
}

impl Peer {
    pub(crate) fn is_up(&self) -> bool {
        self.link.is_up()
    }

    fn give_back(&self, id: u64, r: Return) {
        if let Some(tx) = self.forget(id) {
            let _ = tx.send(r);
        }
    }

    /// Stop waiting for clone `id`'s return.
    fn forget(&self, id: u64) -> Option<oneshot::Sender<Return>> {
        let mut returns = self.returns.lock();
        let tx = returns.remove(&id);
        if returns.is_empty() {
            self.idle.notify_waiters();
        }
        tx
    }

    /// Resolves once no clone is held by this peer.
    async fn until_idle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.returns.lock().is_empty() {
                return;
            }
            idle.await;
        }
    }
}

/// Counters of the cluster as a whole.
#[derive(Debug)]
pub(crate) struct ClusterStats {
    /// Requests owned by a peer served here after all, by [`Fallback`].
    fallbacks: [AtomicU64; Fallback::ALL.len()],
    /// Requests served here because this node owns them.
    pub owned: AtomicU64,
    /// Requests another node forwarded here (a peer's fetch, a switch's relay), served here.
    pub relayed_in: AtomicU64,
    /// Requests cloned to their owners and not yet finished (answered and counted).
    pub outstanding: AtomicU64,
    /// From the `Create` to the owner's `Accepted`.
    pub clone_seconds: Histogram,
    /// This node's CPU time per connection cloned across hosts and given back: steering
    /// entry, dump, restore and removal of the entry (the work of the sending side).
    pub clone_cpu_seconds: Histogram,
}

impl Default for ClusterStats {
    fn default() -> Self {
        ClusterStats {
            fallbacks: Default::default(),
            owned: AtomicU64::new(0),
            relayed_in: AtomicU64::new(0),
            outstanding: AtomicU64::new(0),
            clone_seconds: Histogram::new(exponential_buckets(10e-6, 2.0, 16)),
            // Fine steps around the tens of microseconds the kernel calls take.
            clone_cpu_seconds: Histogram::new(exponential_buckets(4e-6, 1.2, 30)),
        }
    }
}

impl ClusterStats {
    fn count_fallback(&self, f: Fallback) {
        self.fallbacks[Fallback::ALL.iter().position(|x| *x == f).unwrap_or(0)]
            .fetch_add(1, Relaxed);
    }

    /// Fallbacks by reason label.
    pub(crate) fn fallbacks(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Fallback::ALL
            .iter()
            .zip(&self.fallbacks)
            .map(|(f, n)| (f.label(), n.load(Relaxed)))
    }
}

/// The owner map: a policy over the members, with ids every member derives the same way.
struct Owners {
    policy: Box<dyn Policy>,
    /// Member index by policy node id.
    index: HashMap<NodeId, usize>,
}

/// A member's id in the owner map: FNV-1a of its name. Written out here rather than taken from
/// a hashing crate because every member — every build, every version — must compute the same
/// value, which the standard library's hasher does not promise.
fn member_id(name: &str) -> NodeId {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    NodeId(h)
}

/// A cooperative cluster, seen from one member.
pub(crate) struct Cluster {
    /// This node's member index.
    me: usize,
    /// This node's id in the owner map.
    me_id: NodeId,
    /// Every member by index; this node's entry is `None`.
    peers: Vec<Option<Arc<Peer>>>,
    names: Vec<String>,
    /// Every member's control address, for the status page.
    controls: Vec<String>,
    /// The owner map's policy name.
    policy_name: String,
    owners: Mutex<Owners>,
    next_id: AtomicU64,
    next_conn: AtomicU64,
    mover: MoverConfig,
    /// The steering table for clones to members on other hosts, if there is one.
    steering: Option<Arc<Table>>,
    /// The VIP (and port) every member holds: only connections to it can move across hosts.
    vip: Option<std::net::SocketAddr>,
    origin: Instant,
    /// Counters, kept across membership reloads.
    pub stats: Arc<ClusterStats>,
    /// Hot-object replication, when on.
    pub(crate) replication: Option<Arc<Replication>>,
    /// Every member's admin listener, by member index, where `[cluster.admin]` names one.
    pub(crate) admins: Vec<Option<std::net::SocketAddr>>,
    /// How a request owned by a peer is served.
    mechanism: ClusterMechanism,
    /// Every member's HTTP listener, by member index, where `[cluster.http]` names one.
    http: Vec<Option<std::net::SocketAddr>>,
    /// With `fetch`: the largest response held whole before it is sent.
    fetch_hold_max: u64,
    /// The targets routed here in the current period, with the member owning each.
    hot: Mutex<switchyard_admin::dashboard::HotTargets>,
    /// The last finished period's hottest targets: target, owner's name, requests.
    hot_last: Mutex<Vec<(String, String, u64)>>,
}

impl Cluster {
    /// The cluster of `cfg`, seen from its member `cfg.name`. Peers start down; [`Cluster::run`]
    /// brings their control connections up.
    pub(crate) fn new(cfg: &ClusterConfig) -> Result<Self, NodeError> {
        Self::reusing(cfg, &HashMap::new(), Arc::default())
    }

    /// The cluster of `cfg`, taking over the peers of `existing` (by name) that keep their
    /// control address: their control connections and the clones they hold carry on, and
    /// those that are up count as up in the new owner map at once.
    fn reusing(
        cfg: &ClusterConfig,
        existing: &HashMap<String, Arc<Peer>>,
        stats: Arc<ClusterStats>,
    ) -> Result<Self, NodeError> {
        cfg.validate().map_err(NodeError::Config)?;
        let mut ids: HashMap<NodeId, usize> = HashMap::new();
        for (i, m) in cfg.members.iter().enumerate() {
            let id = member_id(&m.name);
            if let Some(j) = ids.insert(id, i) {
                return Err(NodeError::Config(format!(
                    "[cluster]: members `{}` and `{}` hash to the same id; rename one",
                    cfg.members[j].name, m.name
                )));
            }
        }
        let me = cfg
            .members
            .iter()
            .position(|m| m.name == cfg.name)
            .ok_or_else(|| NodeError::Config("[cluster]: this node is not a member".into()))?;
        let mut policy = switchyard_policy::build(&cfg.policy)
            .map_err(|e| NodeError::Config(format!("[cluster] policy: {e}")))?;
        let specs: Vec<NodeSpec> = cfg
            .members
            .iter()
            .map(|m| NodeSpec::new(member_id(&m.name).0))
            .collect();
        policy
            .init(&specs, Duration::ZERO)
            .map_err(|e| NodeError::Config(format!("[cluster] policy: {e}")))?;
        let peers: Vec<Option<Arc<Peer>>> = cfg
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                (i != me).then(|| match existing.get(&m.name) {
                    Some(p) if p.addr == m.control => p.clone(),
                    _ => Arc::new(Peer {
                        name: m.name.clone(),
                        id: member_id(&m.name),
                        addr: m.control.clone(),
                        link: Link::default(),
                        returns: Mutex::new(HashMap::new()),
                        idle: Notify::new(),
                        stats: PeerStats::default(),
                        target: Mutex::new(None),
                        fetches: Arc::default(),
                    }),
                })
            })
            .collect();
        // Peers are down until their control connections are up.
        for p in peers.iter().flatten() {
            if !p.is_up() {
                policy.node_down(p.id, Duration::ZERO);
            }
        }
        Ok(Cluster {
            me,
            me_id: member_id(&cfg.members[me].name),
            peers,
            names: cfg.members.iter().map(|m| m.name.clone()).collect(),
            controls: cfg.members.iter().map(|m| m.control.to_string()).collect(),
            policy_name: cfg.policy.name.to_string(),
            owners: Mutex::new(Owners { policy, index: ids }),
            next_id: AtomicU64::new(1),
            next_conn: AtomicU64::new(1),
            mover: MoverConfig::symmetric(Duration::from_millis(cfg.clone_timeout_ms)),
            steering: None,
            vip: None,
            origin: Instant::now(),
            stats,
            replication: None,
            admins: cfg
                .members
                .iter()
                .map(|m| cfg.admin.get(&m.name).copied())
                .collect(),
            mechanism: cfg.mechanism,
            http: cfg
                .members
                .iter()
                .map(|m| cfg.http.get(&m.name).copied())
                .collect(),
            fetch_hold_max: cfg.fetch_hold_max_bytes,
            hot: Mutex::new(switchyard_admin::dashboard::HotTargets::new(HOT_CAPACITY)),
            hot_last: Mutex::new(Vec::new()),
        })
    }

    /// The cluster with hot-object replication (`None`: off).
    pub(crate) fn replicating(mut self, replication: Option<Arc<Replication>>) -> Self {
        self.replication = replication;
        self
    }

    /// Remove the steering set-up (the node is shutting down).
    pub(crate) fn shutdown_steering(&self) {
        if let Some(t) = &self.steering {
            t.shutdown();
        }
    }

    /// The cluster with a steering table for clones across hosts (`None`: such clones are
    /// served here instead, counted as `no_steering`) and the VIP the members hold.
    pub(crate) fn steering(
        mut self,
        table: Option<Arc<Table>>,
        vip: Option<std::net::SocketAddr>,
    ) -> Self {
        self.steering = table;
        self.vip = vip;
        self
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// This node's name.
    pub(crate) fn name(&self) -> &str {
        &self.names[self.me]
    }

    /// The other members.
    pub(crate) fn peers(&self) -> impl Iterator<Item = &Arc<Peer>> {
        self.peers.iter().flatten()
    }

    /// The member that owns `target` now (its name), as this node would route a request for it.
    #[cfg(test)]
    fn owner_of(&self, target: &str) -> Option<&str> {
        let conn = ConnId(u64::MAX);
        let mut o = self.owners.lock();
        let d = o
            .policy
            .select(&Request::get(conn, target), self.now())
            .ok()?;
        o.policy
            .post_request(conn, d.node(), &Outcome::failed(), self.now());
        o.policy.connection_end(conn, self.now());
        let i = *o.index.get(&d.node())?;
        Some(&self.names[i])
    }

    /// The cluster as this member sees it, for `/status.json`.
    pub(crate) fn status(&self) -> switchyard_admin::cluster::ClusterStatus {
        use switchyard_admin::cluster::{ClusterStatus, MemberStatus};
        let members = self
            .names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let (up, routed, clones, hand_backs, lost) = match &self.peers[i] {
                    Some(p) => (
                        p.is_up(),
                        p.stats.routed.load(Relaxed),
                        p.stats.clones.load(Relaxed),
                        p.stats.hand_backs.load(Relaxed),
                        p.stats.lost.load(Relaxed),
                    ),
                    None => (true, self.stats.owned.load(Relaxed), 0, 0, 0),
                };
                MemberStatus {
                    name: name.clone(),
                    control: self.controls[i].clone(),
                    this_node: i == self.me,
                    up,
                    routed,
                    clones,
                    hand_backs,
                    lost,
                }
            })
            .collect();
        ClusterStatus {
            name: self.name().to_owned(),
            policy: self.policy_name.clone(),
            members,
            clones_outstanding: self.stats.outstanding.load(Relaxed),
            fallbacks: self
                .stats
                .fallbacks()
                .map(|(l, n)| (l.to_owned(), n))
                .collect(),
            replication: self.replication.as_ref().map(|r| r.status()),
            rescue: None,
        }
    }

    /// The member names, in configuration order.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// This node's member index.
    pub(crate) fn me(&self) -> usize {
        self.me
    }

    /// The owner map's policy name.
    pub(crate) fn policy_name(&self) -> &str {
        &self.policy_name
    }

    /// The peer at member index `i` (`None` for this node).
    pub(crate) fn peer(&self, i: usize) -> Option<&Arc<Peer>> {
        self.peers.get(i).and_then(Option::as_ref)
    }

    /// End the hot targets' period: its hottest become what [`Cluster::member_sample`] shows.
    pub(crate) fn rotate_hot(&self) {
        let top = self
            .hot
            .lock()
            .take(switchyard_admin::dashboard::HOT_LISTED);
        *self.hot_last.lock() = top
            .into_iter()
            .filter_map(|h| {
                let owner = self.names.get(h.node as usize)?;
                Some((h.target, owner.clone(), h.count))
            })
            .collect();
    }

    /// This member's own figures for the cluster's dashboard (`/member.json`).
    pub(crate) fn member_sample(
        &self,
        metrics: &crate::metrics::NodeMetrics,
        store: &Store,
    ) -> switchyard_admin::cluster::MemberSample {
        let stats = self.owners.lock().policy.stats();
        let own = stats.nodes.get(self.me);
        let cache = store.cache_stats();
        let mut latency = metrics.response_times().counts.to_vec();
        while latency.last() == Some(&0) {
            latency.pop();
        }
        switchyard_admin::cluster::MemberSample {
            name: self.name().to_owned(),
            requests: metrics.responses(),
            bytes: metrics.bytes_out(),
            connections: metrics.connections_active.load(Relaxed),
            load: own.map_or(0.0, |n| n.load),
            targets: own.map_or(0, |n| n.targets),
            clones_in: metrics.handoff.clones_in.load(Relaxed),
            hand_backs: metrics.handoff.hand_backs.load(Relaxed),
            clones_lost: self.peers().map(|p| p.stats.lost.load(Relaxed)).sum(),
            fallbacks: self
                .stats
                .fallbacks()
                .filter(|(_, n)| *n > 0)
                .map(|(l, n)| (l.to_owned(), n))
                .collect(),
            cache_lookups: cache.hits + cache.misses,
            cache_hits: cache.hits,
            latency,
            replicas: self.replication.as_ref().map(|r| r.held().0 as u64),
            targets_mapped: stats.targets_mapped,
            map_replicas: stats.replicas,
            hot: self.hot_last.lock().clone(),
        }
    }

    /// A peer's control connection came up or went down: the owner map follows.
    fn set_peer_up(&self, p: &Peer, up: bool) {
        let now = self.now();
        let mut o = self.owners.lock();
        // Only this cluster's own peer counts: not a member that left, nor the old connection
        // of a member that moved to another control address.
        let ours = o
            .index
            .get(&p.id)
            .and_then(|&i| self.peers[i].as_ref())
            .is_some_and(|q| std::ptr::eq(Arc::as_ptr(q), p));
        if !ours {
            return;
        }
        if up {
            o.policy.node_up(p.id, now);
        } else {
            o.policy.node_down(p.id, now);
        }
    }

    /// Serve an accepted client connection in cooperative mode until it closes.
    pub(crate) async fn serve(
        self: Arc<Self>,
        ctx: Arc<Ctx>,
        mut stream: TcpStream,
        stop: watch::Receiver<bool>,
    ) {
        let conn = ConnId(self.next_conn.fetch_add(1, Relaxed));
        self.owners.lock().policy.connection_start(conn, self.now());
        let mut router = Owned {
            cluster: &self,
            store: &ctx.store,
            conn,
            clone_to: None,
            here_next: false,
            served_for: self.me_id,
            client: stream.peer_addr().ok().map(|a| a.ip()),
        };
        let mut preread = BytesMut::new();
        loop {
            let out = conn::serve_routed(&ctx, stream, stop.clone(), preread, &mut router).await;
            let (s, rest) = match out {
                conn::Outcome::Closed(_) => break,
                conn::Outcome::Moved { stream, rest, .. } => (stream, rest),
            };
            let Some(peer) = router.clone_to.take() else {
                // (The router asks for the connection only to clone it.)
                break;
            };
            self.stats.outstanding.fetch_add(1, Relaxed);
            let cloned = self.clone_to(&peer, s, rest).await;
            let done = || self.stats.outstanding.fetch_sub(1, Relaxed);
            match cloned {
                Cloned::Back(s, rest) => {
                    self.post(conn, peer.id, Outcome::ok(200, 0, false));
                    done();
                    stream = s;
                    preread = rest;
                }
                Cloned::Here(s, rest, why) => {
                    self.stats.count_fallback(why);
                    tracing::debug!(peer = %peer.name, reason = why.label(), "clone fell back to serving here");
                    self.post(conn, peer.id, Outcome::failed());
                    done();
                    router.here_next = true;
                    stream = s;
                    preread = rest;
                }
                Cloned::Ended => {
                    self.post(conn, peer.id, Outcome::failed());
                    done();
                    break;
                }
            }
        }
        self.owners.lock().policy.connection_end(conn, self.now());
    }

    fn post(&self, conn: ConnId, node: NodeId, outcome: Outcome) {
        let now = self.now();
        self.owners
            .lock()
            .policy
            .post_request(conn, node, &outcome, now);
    }

    /// Clone `stream` to `peer` with `rest` (the request it owns, and anything after it) and
    /// wait until the connection comes back.
    async fn clone_to(&self, peer: &Peer, stream: TcpStream, rest: BytesMut) -> Cloned {
        if !peer.link.is_up() {
            return Cloned::Here(stream, rest, Fallback::ControlDown);
        }
        if rest.len() > MAX_PREREAD {
            return Cloned::Here(stream, rest, Fallback::TooMuchRead);
        }
        if !peer.addr.same_host() {
            return self.clone_across(peer, stream, rest).await;
        }
        let (Ok(client), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
            // Not connected any more: nothing to serve.
            return Cloned::Ended;
        };
        let Ok(fd) = stream.as_fd().try_clone_to_owned() else {
            return Cloned::Here(stream, rest, Fallback::NoDescriptor);
        };
        let id = self.next_id.fetch_add(1, Relaxed);
        let (tx, back) = oneshot::channel();
        // Registered before the Create leaves: the hand-back may follow the Accepted at once.
        peer.returns.lock().insert(id, tx);
        let create = Message::Create {
            id,
            client,
            local,
            transfer: Transfer::Fd,
            preread: rest.to_vec(),
            route: Routing::Once,
        };
        // The owner has the socket once it accepts; this copy is then closed without a word.
        match self.offer(peer, id, create, Some(fd), back, stream).await {
            Offered::Back(Came::Fd(fd), preread) => {
                peer.stats.hand_backs.fetch_add(1, Relaxed);
                match restream(fd) {
                    Ok(s) => Cloned::Back(s, BytesMut::from(&preread[..])),
                    Err(e) => {
                        tracing::warn!(peer = %peer.name, error = %e, "cannot take a connection back");
                        peer.stats.lost.fetch_add(1, Relaxed);
                        Cloned::Ended
                    }
                }
            }
            Offered::Back(Came::Repair(_), _) => {
                tracing::warn!(peer = %peer.name, id, "a descriptor clone came back as TCP_REPAIR state");
                peer.stats.lost.fetch_add(1, Relaxed);
                Cloned::Ended
            }
            Offered::Gone { .. } | Offered::Abandoned => Cloned::Ended,
            Offered::Refused(stream, why) => Cloned::Here(stream, rest, why),
        }
    }

    /// Offer the clone `create` (numbered `id`, whose hand-back `back` waits for) to `peer`
    /// and, once it is taken, wait for it to come back; the counting and forgetting common to
    /// both transfers is done here. `stream` (this node's copy of the connection) is closed
    /// as soon as the owner has taken it, before the wait: a descriptor copy left open would
    /// keep the socket open past the owner's close, and a repair-mode copy must be gone before
    /// the connection is restored here.
    async fn offer(
        &self,
        peer: &Peer,
        id: u64,
        create: Message,
        fd: Option<OwnedFd>,
        back: oneshot::Receiver<Return>,
        stream: TcpStream,
    ) -> Offered {
        let started = Instant::now();
        match link::offer(&peer.link, id, id, (), create, fd, self.mover).await {
            Moved::Moved { .. } => {
                self.stats
                    .clone_seconds
                    .observe(started.elapsed().as_secs_f64());
                peer.stats.clones.fetch_add(1, Relaxed);
                drop(stream);
                match back.await.unwrap_or(Return::Lost) {
                    Return::Back { conn, preread } => Offered::Back(conn, preread),
                    Return::Closed => {
                        peer.stats.closed.fetch_add(1, Relaxed);
                        Offered::Gone { closed: true }
                    }
                    Return::Lost => {
                        peer.stats.lost.fetch_add(1, Relaxed);
                        Offered::Gone { closed: false }
                    }
                }
            }
            Moved::TakeBack(why) => {
                peer.forget(id);
                Offered::Refused(stream, take_back_fallback(why))
            }
            Moved::Abandon(why) => {
                peer.forget(id);
                peer.stats.lost.fetch_add(1, Relaxed);
                tracing::warn!(peer = %peer.name, id, reason = why.label(), "clone abandoned: the connection is closed unanswered");
                drop(stream);
                Offered::Abandoned
            }
        }
    }
}

/// How an offered clone ended ([`Cluster::offer`]).
enum Offered {
    /// Taken and given back: the connection and the bytes of the next request.
    Back(Came, Vec<u8>),
    /// Taken, and closed by the client there (`closed`) or lost with its owner; counted.
    Gone { closed: bool },
    /// Refused: serve it here, for this reason.
    Refused(TcpStream, Fallback),
    /// Nothing is known: the owner may serve it; closed here unanswered, counted.
    Abandoned,
}

impl Cluster {
    /// Clone `stream` to `peer` on another host: steer, dump, offer the state, and wait until
    /// the connection comes back (see the module's docs for the order and why).
    async fn clone_across(&self, peer: &Peer, stream: TcpStream, rest: BytesMut) -> Cloned {
        let (Ok(client), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
            return Cloned::Ended;
        };
        if self.vip != Some(local) {
            return Cloned::Here(stream, rest, Fallback::NotVip);
        }
        let target = *peer.target.lock();
        let (Some(table), Some(target), Ok(flow)) =
            (&self.steering, target, Flow::new(client, local))
        else {
            return Cloned::Here(stream, rest, Fallback::NoSteering);
        };
        // Bytes still unsent would keep leaving this host after the dump read them as unsent
        // (see the switch's `all_sent`): wait until a response written here is on the wire.
        if !self.all_sent(&stream).await {
            return Cloned::Here(stream, rest, Fallback::StillSending);
        }
        let id = self.next_id.fetch_add(1, Relaxed);
        let cpu = thread_cpu();
        // The entry first: from the dump on, the client's packets must reach the owner.
        if let Err(e) = table.steer(&flow, &target, id) {
            tracing::warn!(peer = %peer.name, error = %e, "steering insert failed");
            return Cloned::Here(stream, rest, Fallback::NoSteering);
        }
        let state = match repair::dump(stream.as_fd()) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(peer = %peer.name, error = %e, "dump failed");
                table.unsteer(&flow, id);
                return Cloned::Here(stream, rest, Fallback::Dump);
            }
        };
        let sending = thread_cpu().saturating_sub(cpu);
        let (tx, back) = oneshot::channel();
        peer.returns.lock().insert(id, tx);
        let create = Message::Create {
            id,
            client,
            local,
            transfer: Transfer::Repair(Box::new(state)),
            preread: rest.to_vec(),
            route: Routing::Once,
        };
        // The copy here is in repair mode: closing it sends nothing.
        match self.offer(peer, id, create, None, back, stream).await {
            Offered::Back(Came::Repair(state), preread) => {
                peer.stats.hand_backs.fetch_add(1, Relaxed);
                let back = (table, &flow, id, sending);
                match self.take_back(back, &state, local, client).await {
                    Some(s) => Cloned::Back(s, BytesMut::from(&preread[..])),
                    None => {
                        peer.stats.lost.fetch_add(1, Relaxed);
                        Cloned::Ended
                    }
                }
            }
            Offered::Back(Came::Fd(_), _) => {
                tracing::warn!(peer = %peer.name, id, "a clone across hosts came back as a descriptor");
                peer.stats.lost.fetch_add(1, Relaxed);
                linger(table, flow, id, LOST_LINGER);
                Cloned::Ended
            }
            Offered::Gone { closed: true } => {
                linger(table, flow, id, CLOSED_LINGER);
                Cloned::Ended
            }
            // The owner may serve an abandoned one: its packets keep going there for a while.
            Offered::Gone { closed: false } | Offered::Abandoned => {
                linger(table, flow, id, LOST_LINGER);
                Cloned::Ended
            }
            Offered::Refused(stream, why) => {
                table.unsteer(&flow, id);
                if let Err(e) = repair::leave_repair(stream.as_fd()) {
                    tracing::warn!(peer = %peer.name, error = %e, "cannot leave repair mode; the connection is lost");
                    return Cloned::Ended;
                }
                Cloned::Here(stream, rest, why)
            }
        }
    }

    /// Whether everything written on `stream` has left it, waiting up to the clone timeout.
    async fn all_sent(&self, stream: &TcpStream) -> bool {
        // Why a bounded poll: no readiness event says "the send queue holds no unsent byte"
        // (see `repair::wait_acked`); a response written here leaves within a round trip or
        // two unless the client's window is full.
        let deadline = tokio::time::Instant::now() + self.mover.answer_timeout;
        loop {
            match repair::unsent(stream.as_fd()) {
                Ok(0) => return true,
                Ok(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(SENT_POLL).await
                }
                _ => return false,
            }
        }
    }

    /// Restore a connection its owner gave back, then stop steering its packets away: the
    /// socket exists here before the client's packets come here again.
    /// `sending`: this node's CPU time spent on the clone so far, to which the restore's is
    /// added for [`ClusterStats::clone_cpu_seconds`].
    async fn take_back(
        &self,
        (table, flow, id, sending): (&Arc<Table>, &Flow, u64, Duration),
        state: &RepairState,
        local: std::net::SocketAddr,
        client: std::net::SocketAddr,
    ) -> Option<TcpStream> {
        let cpu = thread_cpu();
        // No window probe (about 20 us of this node's CPU on a veth lab): the owner gave the
        // connection back only once its response was acknowledged, so nothing is in flight; a
        // request the client sent meanwhile was dropped unacknowledged and comes again by the
        // client's own retransmission. (With bytes still in the send queue the restore sends
        // the probe anyway.)
        let ropts = repair::RestoreOptions {
            window_probe: false,
        };
        let restored = repair::restore_with(state, local, client, ropts);
        let r = match restored {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%client, error = %e, "cannot restore a connection given back; it is lost");
                linger(table, *flow, id, LOST_LINGER);
                return None;
            }
        };
        table.unsteer(flow, id);
        self.stats
            .clone_cpu_seconds
            .observe((sending + thread_cpu().saturating_sub(cpu)).as_secs_f64());
        let mut s = match restream(r.fd) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%client, error = %e, "cannot take a restored connection on");
                return None;
            }
        };
        if !r.unsent.is_empty() {
            use tokio::io::AsyncWriteExt;
            // What the owner had not sent yet when it dumped the connection goes out first.
            if s.write_all(&r.unsent).await.is_err() {
                return None;
            }
        }
        Some(s)
    }
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`): a clone runs on one worker
/// thread, so the difference across a stretch without a suspension point is that stretch's
/// own CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Remove `flow`'s entry after `after`, if connection `id` still owns it (the table's
/// expiry task, [`expire_lingering`], removes it).
fn linger(table: &Arc<Table>, flow: Flow, id: u64, after: Duration) {
    table.linger(flow, id, std::time::Instant::now() + after);
}

/// How often lingering steering entries are looked at: an entry goes at most this much
/// after its time, and the entries due together leave the kernel's map in one call.
const EXPIRY_TICK: Duration = Duration::from_millis(100);

/// Remove lingering steering entries whose time is up, every [`EXPIRY_TICK`], until `stop`.
async fn expire_lingering(table: Arc<Table>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(EXPIRY_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                table.expire(std::time::Instant::now());
            }
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    return;
                }
            }
        }
    }
}

/// The fallback a definitive refusal is counted as.
fn take_back_fallback(why: TakeBackReason) -> Fallback {
    match why {
        TakeBackReason::NotSent => Fallback::ControlDown,
        TakeBackReason::Refused(_) | TakeBackReason::Cancelled(_) => Fallback::Refused,
        TakeBackReason::ControlEnded => Fallback::ControlEnded,
    }
}

/// What became of a clone.
enum Cloned {
    /// The owner served its request and gave the connection back.
    Back(TcpStream, BytesMut),
    /// The owner did not take it: serve the request here.
    Here(TcpStream, BytesMut, Fallback),
    /// The connection is over (closed at the owner, lost, or abandoned).
    Ended,
}

/// The router of a connection accepted in cooperative mode: the owner map decides.
struct Owned<'a> {
    cluster: &'a Cluster,
    store: &'a Store,
    conn: ConnId,
    /// The member the owner map chose for the request being answered here (this node, or the
    /// owner whose replica serves it): its load is what the answer ends.
    served_for: NodeId,
    /// The peer the request just routed goes to.
    clone_to: Option<Arc<Peer>>,
    /// The owner did not take the request: serve it here without asking the map again.
    here_next: bool,
    /// The client's address: a peer fetching from here comes from its HTTP listener's.
    client: Option<std::net::IpAddr>,
}

impl Owned<'_> {
    /// The copy a peer fetching `head` (for `key`, owned here) asks for, if it is a member
    /// fetching from its own host: from its HTTP listener's address where this node knows it,
    /// else from its control address's (loopback for a member on this host, whose control
    /// socket is a Unix one). A name alone could be anyone's, and a holder the owner counts
    /// wrongly would inflate every later count of the target.
    fn copy_to(&self, head: &RequestHead, key: String) -> Option<CopyTo> {
        let ask = switchyard_http::upstream::CopyAsk::parse(head.copy_ask.as_deref()?)?;
        let c = self.cluster;
        let from = self.client?;
        let i = c.names.iter().position(|n| n == ask.member)?;
        let peer = c.peers[i].as_ref()?;
        let host_of_member = match (c.http.get(i).copied().flatten(), &peer.addr) {
            (Some(listener), _) => listener.ip() == from || listener.ip().is_unspecified(),
            (None, ControlAddr::Tcp(control)) => control.ip() == from,
            (None, ControlAddr::Unix(_)) => from.is_loopback(),
        };
        if !host_of_member {
            tracing::debug!(member = ask.member, %from, "copy asked for from another host than the member's: none offered");
            return None;
        }
        Some(CopyTo {
            key,
            peer: ask.member.to_owned(),
            max_bytes: ask.max_bytes,
        })
    }
}

impl Router for Owned<'_> {
    fn asks(&self) -> bool {
        false
    }

    async fn route(&mut self, head: &RequestHead) -> Step {
        if std::mem::take(&mut self.here_next) {
            return Step::Local { dispatched: false };
        }
        let c = self.cluster;
        // A request that another node forwards (a peer's fetch, a switch's relay) is served
        // here, never moved on: like a clone, a fetch goes one hop at most, whatever this
        // node's owner map says meanwhile.
        let relayed = head.cache_report;
        let req = Request {
            conn: self.conn,
            method: &head.method_token,
            host: head.host.as_deref(),
            target: &head.target,
            size_hint: None,
        };
        let now = c.now();
        let owner = {
            let mut o = c.owners.lock();
            match o.policy.select(&req, now) {
                Ok(d) => o.index.get(&d.node()).copied(),
                Err(_) => None,
            }
        };
        if let Some(i) = owner {
            c.hot.lock().record(&head.target, i as u32);
        }
        // Replication concerns the objects GET and HEAD fetch.
        let key = match (&c.replication, head.method) {
            (Some(_), Method::Get | Method::Head) => self.store.object_key(&head.target),
            _ => None,
        };
        match owner
            .filter(|_| !relayed)
            .and_then(|i| Some((i, c.peers[i].clone()?)))
        {
            Some((i, peer)) => {
                peer.stats.routed.fetch_add(1, Relaxed);
                let fetch_from = match c.mechanism {
                    ClusterMechanism::Fetch => c.http[i],
                    ClusterMechanism::Clone => None,
                };
                if let (Some(r), Some(key)) = (&c.replication, &key) {
                    match r.lookup(key) {
                        Held::Fresh(object) => {
                            self.served_for = peer.id;
                            return Step::Replica(object);
                        }
                        // Ahead of the clone, on the control connection it takes (written at
                        // once, so before the `Create`, however that is sent): the owner
                        // checks the copy as it serves the request. (A fetching node fetches
                        // the object anyway: the response renews its copy.)
                        Held::Stale(etag) if fetch_from.is_none() => {
                            let check = Message::ReplicaCheck {
                                target: key.clone(),
                                etag,
                            };
                            peer.link.send(&check, None);
                        }
                        Held::Stale(_) | Held::Miss => {}
                    }
                }
                match fetch_from {
                    Some(addr) => {
                        self.served_for = peer.id;
                        // The response to a GET can come as this node's copy (or renew a stale
                        // one: the owner sends it anew, the response being the copy).
                        let copy = match (&c.replication, key) {
                            (Some(r), Some(key)) if head.method == Method::Get => Some(FetchCopy {
                                replication: r.clone(),
                                key,
                                me: c.names[c.me].clone(),
                            }),
                            _ => None,
                        };
                        Step::Fetch(Fetch {
                            addr,
                            hold_max: c.fetch_hold_max,
                            counts: peer.fetches.clone(),
                            copy,
                        })
                    }
                    None => {
                        self.clone_to = Some(peer);
                        Step::HandBack
                    }
                }
            }
            None => {
                if relayed {
                    c.stats.relayed_in.fetch_add(1, Relaxed);
                }
                let mine = owner.is_some_and(|i| i == c.me);
                if mine {
                    c.stats.owned.fetch_add(1, Relaxed);
                    if let (Some(r), Some(key)) = (&c.replication, &key) {
                        r.owned(key);
                    }
                }
                // (The member the map chose: a relayed request may be a peer's in this map.)
                self.served_for = owner
                    .and_then(|i| c.peers[i].as_ref().map(|p| p.id))
                    .unwrap_or(c.me_id);
                match key.filter(|_| mine && relayed) {
                    Some(key) => match self.copy_to(head, key) {
                        Some(to) => Step::Copy(to),
                        None => Step::Local { dispatched: true },
                    },
                    None => Step::Local {
                        dispatched: owner.is_some(),
                    },
                }
            }
        }
    }

    fn answered(&mut self, status: u16, bytes: u64) {
        let c = self.cluster;
        c.post(
            self.conn,
            self.served_for,
            Outcome::ok(status, bytes, false),
        );
    }

    fn flushed(&mut self) {}
}

/// The cluster in force and the control connections to its peers. A membership reload builds
/// a new [`Cluster`] and swaps it in: connections accepted from then on use the new owner map,
/// those already open finish with the one they started with. Peers that stay keep their
/// control connections (the new cluster takes them over); new peers get one; a peer that left
/// keeps its own until the clones it holds have come back, then closes it.
pub(crate) struct Membership {
    current: parking_lot::RwLock<Arc<Cluster>>,
    /// The node's stop signal.
    stop: watch::Receiver<bool>,
    /// The control connection of each peer that has one, by name.
    links: Mutex<HashMap<String, PeerLink>>,
    /// 1 at start, one more per membership reload.
    generation: AtomicU64,
}

/// A peer's control connection task, and how to retire it.
struct PeerLink {
    peer: Arc<Peer>,
    /// `true`: the peer left the cluster (its task ends once the clones it holds came back).
    retire: watch::Sender<bool>,
}

impl Membership {
    /// `cluster` in force, its control connections kept up until `stop`.
    pub(crate) fn start(cluster: Cluster, stop: watch::Receiver<bool>) -> Arc<Self> {
        if let Some(table) = &cluster.steering {
            tokio::spawn(expire_lingering(table.clone(), stop.clone()));
        }
        let m = Arc::new(Membership {
            current: parking_lot::RwLock::new(Arc::new(cluster)),
            stop,
            links: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(1),
        });
        m.link_new_peers();
        m
    }

    /// The cluster in force.
    pub(crate) fn current(&self) -> Arc<Cluster> {
        self.current.read().clone()
    }

    /// The membership's generation: 1 at start, one more per reload.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    /// Start a control connection to every peer of the current cluster that has none.
    fn link_new_peers(self: &Arc<Self>) {
        let cluster = self.current();
        let mut links = self.links.lock();
        for p in cluster.peers() {
            if links.get(&p.name).is_some_and(|l| Arc::ptr_eq(p, &l.peer)) {
                continue;
            }
            let (retire, retired) = watch::channel(false);
            tokio::spawn(run_link(
                self.clone(),
                p.clone(),
                self.stop.clone(),
                retired,
            ));
            let link = PeerLink {
                peer: p.clone(),
                retire,
            };
            if let Some(old) = links.insert(p.name.clone(), link) {
                // The same name at a new control address: the old connection retires.
                let _ = old.retire.send(true);
            }
        }
    }

    /// Replace the membership by `cfg`'s. This node's name and control address cannot change,
    /// nor can replication's settings (a restart applies those).
    pub(crate) fn reload(self: &Arc<Self>, cfg: &ClusterConfig) -> Result<(), NodeError> {
        let old = self.current();
        if cfg.name != old.name() {
            return Err(NodeError::Config(format!(
                "[cluster]: this node's name cannot change from `{}` to `{}` without a restart",
                old.name(),
                cfg.name
            )));
        }
        let me = cfg.me().map(|m| m.control.to_string());
        if me.as_deref() != Some(old.controls[old.me].as_str()) {
            return Err(NodeError::Config(
                "[cluster]: this member's control address cannot change without a restart".into(),
            ));
        }
        let existing: HashMap<String, Arc<Peer>> =
            old.peers().map(|p| (p.name.clone(), p.clone())).collect();
        let new = Cluster::reusing(cfg, &existing, old.stats.clone())?
            .replicating(old.replication.clone())
            .steering(old.steering.clone(), old.vip);
        let names: std::collections::HashSet<String> =
            new.peers().map(|p| p.name.clone()).collect();
        tracing::info!(
            name = new.name(),
            members = cfg.members.len(),
            joined = new
                .peers()
                .filter(|p| !existing.contains_key(&p.name))
                .count(),
            left = existing.keys().filter(|n| !names.contains(*n)).count(),
            "cluster membership reloaded"
        );
        *self.current.write() = Arc::new(new);
        self.generation.fetch_add(1, Relaxed);
        self.link_new_peers();
        let mut links = self.links.lock();
        links.retain(|name, l| {
            let stays = names.contains(name);
            if !stays {
                let _ = l.retire.send(true);
            }
            stays
        });
        Ok(())
    }
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("cluster", &self.current())
            .finish_non_exhaustive()
    }
}

/// Keep the control connection to `peer` up until `stop`.
async fn run_link(
    members: Arc<Membership>,
    peer: Arc<Peer>,
    mut stop: watch::Receiver<bool>,
    mut retired: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(20);
    loop {
        if *stop.borrow() || *retired.borrow() {
            return;
        }
        let connected = tokio::time::timeout(Duration::from_secs(2), peer.addr.connect()).await;
        let result = match connected {
            Ok(Ok(io)) => {
                backoff = Duration::from_millis(20);
                // A peer that left the cluster keeps its control connection until the clones
                // it holds have come back.
                let left = async {
                    let _ = retired.wait_for(|r| *r).await;
                    peer.until_idle().await;
                };
                tokio::select! {
                    r = session(&members, &peer, io) => r,
                    _ = stop.wait_for(|s| *s) => Ok(()),
                    () = left => Ok(()),
                }
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("connect timed out".into()),
        };
        let was_up = peer.link.is_up();
        for (_, p) in peer.link.close() {
            // A Unix control stream that ended has delivered everything the peer wrote; a
            // failure may have lost frames.
            let _ = p.tx.send(if result.is_ok() {
                switchyard_handoff::mover::Event::ControlEnded
            } else {
                switchyard_handoff::mover::Event::ControlFailed
            });
        }
        let held: Vec<_> = peer.returns.lock().drain().collect();
        peer.idle.notify_waiters();
        for (_, tx) in held {
            let _ = tx.send(Return::Lost);
        }
        if was_up {
            members.current().set_peer_up(&peer, false);
            tracing::warn!(peer = %peer.name, control = %peer.addr, error = ?result.err(), "peer down: its targets move to the others");
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
            _ = retired.wait_for(|r| *r) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// One control connection to a peer: `Hello` both ways, then the peer's answers and reports
/// until it ends (`Ok`: cleanly, everything it wrote was read).
async fn session(
    members: &Membership,
    peer: &Peer,
    (mut reader, writer): (ControlReader, switchyard_handoff::fdpass::ControlWriter),
) -> Result<(), String> {
    let link = &peer.link;
    let ready = link.open(switchyard_handoff::fdpass::ControlSink::new(writer));
    let cluster = members.current();
    let hello = Message::Hello {
        name: cluster.name().to_owned(),
    };
    if !link.write(&hello, None) {
        return Err("cannot send Hello".into());
    }
    let flush = link.run_flusher(ready);
    let read = async {
        let mut hello = false;
        loop {
            let (m, fd) = match reader.recv().await {
                Ok(Some(x)) => x,
                Ok(None) => return Ok(()),
                // A Unix stream reports a reset only after the dead peer's last bytes; over TCP
                // a reset may have lost frames.
                Err(e)
                    if peer.addr.same_host()
                        && matches!(&e, switchyard_handoff::HandoffError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::ConnectionReset) =>
                {
                    return Ok(())
                }
                Err(e) => return Err(e.to_string()),
            };
            if !hello {
                let Message::Hello { name } = &m else {
                    return Err("expected Hello first".into());
                };
                if *name != peer.name {
                    tracing::warn!(peer = %peer.name, answered = %name, "peer answered under another name");
                }
                hello = true;
                if let ControlAddr::Tcp(std::net::SocketAddr::V4(a)) = &peer.addr {
                    // The peer answered over this connection: its MAC address is in the
                    // neighbour table now.
                    let t = switchyard_handoff::steer::table::target_of(*a.ip());
                    if t.is_none() {
                        tracing::warn!(peer = %peer.name, ip = %a.ip(), "peer's MAC address unknown: its requests are served here");
                    }
                    *peer.target.lock() = t;
                }
                link.set_up();
                members.current().set_peer_up(peer, true);
                UP.notify_waiters();
                tracing::info!(peer = %peer.name, control = %peer.addr, "peer up");
                continue;
            }
            on_message(&cluster, peer, m, fd);
        }
    };
    tokio::select! { r = flush => r, r = read => r }
}

/// Notified whenever some peer's link comes up.
static UP: Notify = Notify::const_new();

fn on_message(cluster: &Cluster, peer: &Peer, m: Message, fd: Option<OwnedFd>) {
    use switchyard_handoff::mover::Event;
    match m {
        Message::Replica(r) => match &cluster.replication {
            Some(repl) => repl.receive(*r),
            None => {
                tracing::debug!(peer = %peer.name, "copy of a hot object ignored: replication is off")
            }
        },
        Message::ReplicaValid {
            target,
            etag,
            copies,
            age_ms,
        } => match &cluster.replication {
            Some(repl) => repl.renew(&target, &etag, copies, age_ms),
            None => {
                tracing::debug!(peer = %peer.name, "renewal of a copy ignored: replication is off")
            }
        },
        Message::Accepted { id } => {
            if let Some(p) = peer.link.answer(id) {
                let _ = p.tx.send(Event::Accepted);
            }
        }
        Message::Drop { id, reason, .. } => match peer.link.answer(id) {
            Some(p) => {
                let _ = p.tx.send(Event::Dropped(reason));
            }
            // Lost after it was accepted.
            None => peer.give_back(id, Return::Lost),
        },
        Message::HandBack {
            id,
            transfer,
            preread,
            ..
        } => match (transfer, fd) {
            (Transfer::Fd, Some(fd)) => peer.give_back(
                id,
                Return::Back {
                    conn: Came::Fd(fd),
                    preread,
                },
            ),
            (Transfer::Repair(state), _) => peer.give_back(
                id,
                Return::Back {
                    conn: Came::Repair(state),
                    preread,
                },
            ),
            (Transfer::Fd, None) => {
                tracing::warn!(peer = %peer.name, id, "hand-back without a descriptor");
                peer.give_back(id, Return::Lost);
            }
        },
        Message::Closed { id, .. } => peer.give_back(id, Return::Closed),
        Message::Route { id, seq, .. } => {
            // A clone never asks; answer anyway so that the peer does not wait.
            peer.link.send(
                &Message::Routed {
                    id,
                    seq,
                    action: RouteAction::Serve,
                },
                None,
            );
        }
        Message::Ping { nonce } => {
            peer.link.send(&Message::Pong { nonce }, None);
        }
        Message::Served { .. } | Message::Pong { .. } | Message::Hello { .. } => {}
        other => {
            tracing::debug!(peer = %peer.name, id = ?other.id(), "unexpected control message ignored");
        }
    }
}

/// Wait until every peer's control connection is up, or `timeout` passes.
pub(crate) async fn wait_for_peers(members: &Membership, timeout: Duration) -> bool {
    let all_up = async {
        loop {
            let mut n = std::pin::pin!(UP.notified());
            n.as_mut().enable();
            if members.current().peers().all(|p| p.is_up()) {
                return;
            }
            n.await;
        }
    };
    tokio::time::timeout(timeout, all_up).await.is_ok()
}

/// Register the cluster's metrics into `registry`.
pub(crate) fn register(
    registry: &mut prometheus_client::registry::Registry,
    members: Arc<Membership>,
) {
    registry.register(
        "switchyard_node_clone_seconds",
        "Time from a clone's Create to its owner's Accepted",
        members.current().stats.clone_seconds.clone(),
    );
    registry.register(
        "switchyard_node_clone_cpu_seconds",
        "CPU time per connection cloned across hosts and given back, on the node that cloned it \
         (steering entry, dump, restore, removal of the entry)",
        members.current().stats.clone_cpu_seconds.clone(),
    );
    registry.register_collector(Box::new(ClusterCollector(members)));
}

#[derive(Debug)]
struct ClusterCollector(Arc<Membership>);

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

impl prometheus_client::collector::Collector for ClusterCollector {
    fn encode(
        &self,
        mut enc: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use switchyard_admin::encode::{counter, gauge, labelled};
        let c = &self.0.current();
        let per_peer = |f: fn(&PeerStats) -> &AtomicU64| {
            c.peers()
                .map(move |p| (p.name.clone(), f(&p.stats).load(Relaxed)))
                .collect::<Vec<_>>()
        };
        gauge(
            &mut enc,
            "switchyard_node_cluster_peers_up",
            "Peers whose control connection is up",
            c.peers().filter(|p| p.is_up()).count() as i64,
        )?;
        labelled(
            &mut enc,
            "switchyard_node_clones_out",
            "Connections cloned to their owner (accepted), by peer",
            "peer",
            true,
            per_peer(|s| &s.clones),
        )?;
        labelled(
            &mut enc,
            "switchyard_node_clone_hand_backs",
            "Clones given back by their owner, by peer",
            "peer",
            true,
            per_peer(|s| &s.hand_backs),
        )?;
        labelled(
            &mut enc,
            "switchyard_node_clones_closed",
            "Clones the client closed while their owner served them, by peer",
            "peer",
            true,
            per_peer(|s| &s.closed),
        )?;
        labelled(
            &mut enc,
            "switchyard_node_clones_lost",
            "Clones lost with their owner's control connection or abandoned, by peer",
            "peer",
            true,
            per_peer(|s| &s.lost),
        )?;
        labelled(
            &mut enc,
            "switchyard_node_clone_fallbacks",
            "Requests owned by a peer served here after all, by reason",
            "reason",
            true,
            c.stats.fallbacks().map(|(l, n)| (l.to_owned(), n)),
        )?;
        gauge(
            &mut enc,
            "switchyard_node_clones_outstanding",
            "Requests cloned to their owners and not finished yet",
            c.stats.outstanding.load(Relaxed) as i64,
        )?;
        if let Some(t) = &c.steering {
            // Counted at each scrape (for eBPF steering a read of the program's counter),
            // not on every clone.
            gauge(
                &mut enc,
                "switchyard_node_cluster_steering_entries",
                "Steering entries on this node: connections cloned to another host, and those \
                 lingering after their end",
                t.live() as i64,
            )?;
        }
        counter(
            &mut enc,
            "switchyard_node_cluster_owned_requests",
            "Requests served here because this node owns them",
            c.stats.owned.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "switchyard_node_cluster_relayed_in_requests",
            "Requests another node forwarded here (a peer's fetch), served here",
            c.stats.relayed_in.load(Relaxed),
        )?;
        let per_fetch = |f: fn(&FetchCounts) -> &AtomicU64| {
            c.peers()
                .map(move |p| (p.name.clone(), f(&p.fetches).load(Relaxed)))
                .collect::<Vec<_>>()
        };
        labelled(
            &mut enc,
            "switchyard_node_cluster_fetches",
            "Responses fetched from their owner and sent here (mechanism fetch), by peer",
            "peer",
            true,
            per_fetch(|f| &f.fetched),
        )?;
        labelled(
            &mut enc,
            "switchyard_node_cluster_fetches_held",
            "Fetched responses held whole before they were sent, by peer",
            "peer",
            true,
            per_fetch(|f| &f.held),
        )?;
        labelled(
            &mut enc,
            "switchyard_node_cluster_fetch_bytes",
            "Bytes sent to clients from fetched responses, by peer",
            "peer",
            true,
            per_fetch(|f| &f.bytes),
        )?;
        labelled(
            &mut enc,
            "switchyard_node_cluster_fetch_failures",
            "Fetches that failed before any byte reached the client (served here), by peer",
            "peer",
            true,
            per_fetch(|f| &f.failed),
        )?;
        match &c.replication {
            Some(r) => encode_replication(&mut enc, r),
            None => Ok(()),
        }
    }
}

/// The replication metrics of a node.
fn encode_replication(
    enc: &mut prometheus_client::encoding::DescriptorEncoder,
    r: &Replication,
) -> Result<(), std::fmt::Error> {
    use switchyard_admin::encode::{counter, gauge};
    let (held, bytes, stats) = r.held();
    gauge(
        enc,
        "switchyard_node_replicas",
        "Copies of peers' hot objects held here",
        held as i64,
    )?;
    gauge(
        enc,
        "switchyard_node_replica_bytes",
        "Bytes of the copies of peers' hot objects held here",
        bytes as i64,
    )?;
    counter(
        enc,
        "switchyard_node_replica_hits",
        "Requests for a peer's target served here from a copy",
        stats.hits,
    )?;
    counter(
        enc,
        "switchyard_node_replicas_received",
        "Copies of hot objects received from their owners",
        r.stats.received.load(Relaxed),
    )?;
    counter(
        enc,
        "switchyard_node_replicas_rejected",
        "Copies received and not kept: larger than the replica cache or its object bound",
        stats.rejected + r.stats.unusable.load(Relaxed),
    )?;
    counter(
        enc,
        "switchyard_node_replicas_evicted",
        "Copies evicted to make room for others",
        stats.evicted,
    )?;
    counter(
        enc,
        "switchyard_node_replicas_expired",
        "Copies whose owner's revalidation interval ran out (then checked with the owner)",
        stats.expired,
    )?;
    counter(
        enc,
        "switchyard_node_replicas_renewed",
        "Stale copies the owner found unchanged and renewed without sending them again",
        stats.renewed,
    )?;
    counter(
        enc,
        "switchyard_node_replicas_dropped",
        "Stale copies dropped because the owner did not renew them within an interval",
        stats.dropped,
    )?;
    counter(
        enc,
        "switchyard_node_replica_renewals_sent",
        "Peers' stale copies of this node's hot objects found unchanged and renewed",
        r.stats.renewals_sent.load(Relaxed),
    )?;
    counter(
        enc,
        "switchyard_node_objects_shipped",
        "Copies of this node's hot objects sent to peers",
        r.stats.shipped.load(Relaxed),
    )?;
    counter(
        enc,
        "switchyard_node_objects_shipped_bytes",
        "Bytes of the copies of this node's hot objects sent to peers",
        r.stats.shipped_bytes.load(Relaxed),
    )?;
    gauge(
        enc,
        "switchyard_node_hot_targets",
        "Targets this node owns whose aged count is at the hot threshold",
        r.hot_count() as i64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Member;

    fn cfg(name: &str, n: usize) -> ClusterConfig {
        let members = (0..n)
            .map(|i| Member {
                name: format!("n{i}"),
                control: ControlAddr::Unix(format!("/tmp/none-{i}.sock").into()),
            })
            .collect();
        ClusterConfig::new(name, members)
    }

    #[test]
    fn every_member_computes_the_same_owners() {
        let a = Cluster::new(&cfg("n0", 3)).unwrap();
        let b = Cluster::new(&cfg("n2", 3)).unwrap();
        for c in [&a, &b] {
            for p in c.peers() {
                c.set_peer_up(p, true);
            }
        }
        let mut seen = std::collections::HashSet::new();
        for i in 0..200 {
            let t = format!("/file{i}.html");
            let (oa, ob) = (a.owner_of(&t).unwrap(), b.owner_of(&t).unwrap());
            assert_eq!(oa, ob, "{t}");
            seen.insert(oa.to_owned());
        }
        assert_eq!(seen.len(), 3, "every member owns some targets");
    }

    #[test]
    fn a_peer_down_moves_only_its_targets() {
        let c = Cluster::new(&cfg("n0", 3)).unwrap();
        for p in c.peers() {
            c.set_peer_up(p, true);
        }
        let targets: Vec<String> = (0..300).map(|i| format!("/t/{i}")).collect();
        let before: Vec<String> = targets
            .iter()
            .map(|t| c.owner_of(t).unwrap().to_owned())
            .collect();
        let n1 = c.peers().find(|p| p.name == "n1").unwrap().clone();
        c.set_peer_up(&n1, false);
        for (t, b) in targets.iter().zip(&before) {
            let now = c.owner_of(t).unwrap();
            if b == "n1" {
                assert_ne!(now, "n1");
            } else {
                assert_eq!(now, b, "{t} moved though its owner stayed up");
            }
        }
    }

    #[test]
    fn peers_start_down_so_everything_is_owned_here() {
        let c = Cluster::new(&cfg("n1", 3)).unwrap();
        for i in 0..50 {
            assert_eq!(c.owner_of(&format!("/{i}")), Some("n1"));
        }
    }

    #[test]
    fn bad_tables_are_refused() {
        let mut c = cfg("n9", 2);
        assert!(Cluster::new(&c).is_err(), "not a member");
        c.name = "n0".into();
        c.members.push(c.members[0].clone());
        assert!(Cluster::new(&c).is_err(), "duplicate");
        // A member on another host is taken: its clones move as TCP_REPAIR state.
        let mut c = cfg("n0", 2);
        c.members[1].control = ControlAddr::Tcp("10.0.0.2:7000".parse().unwrap());
        assert!(Cluster::new(&c).is_ok());
        assert!(c.crosses_hosts());
    }

    #[test]
    fn member_ids_are_fixed() {
        // FNV-1a test vectors: the ids must never change between builds.
        assert_eq!(member_id("").0, 0x811c_9dc5);
        assert_eq!(member_id("a").0, 0xe40c_292c);
        assert_eq!(member_id("foobar").0, 0xbf9c_f968);
    }
}
