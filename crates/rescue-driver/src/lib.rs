//! Runs the rescue core of `switchyard-rescue` between real processes: the thin I/O around a
//! site's [`Core`], shared by the node (a standalone site) and the switch (a cluster's face).
//!
//! * **The control task** ticks every I_ctrl: it takes the [`Meter`] the request path adds to,
//!   asks the [`Candidates`] for rescue servers, calls [`Core::on_tick`] and carries out the
//!   actions in order.
//! * **Peering** ([`tls`]): the rescue protocol runs over TCP with mutual TLS. Both ends
//!   present certificates issued by the configured authorities, and a connection is refused
//!   unless its certificate names a configured peer. Each connection has one [`Session`]; its
//!   task feeds received bytes to the session and what the session delivers to
//!   [`Core::on_message`], and sleeps until [`Session::next_deadline`]. A broken connection, a
//!   protocol error or a late answer is [`Core::on_peer_lost`]: the relationship ends on this
//!   side, and the peer sees the connection close and ends it on its side.
//! * **Actions**: `Send`/`Reply` through the peer's session (a `Send` to a peer without a
//!   connection dials it first); `Redirect` into the [`Redirector`]; `OriginAdded` and
//!   `OriginEnded` into the [`VirtualHosts`] of a rescue server (the node's rescue proxy);
//!   every action for DNS and the registry (`RescuerAdded`, `RescuerEnded`, `Advertise`,
//!   `OriginAdded`, `OriginEnded`) to a [`Directory`]. With `[rescue.registry]` or
//!   `[rescue.dns]` that is [`discovery::Discovery`] (etcd and RFC 2136 updates), which also
//!   supplies the [`Candidates`] from the registry's searches; without, a [`LogDirectory`] and
//!   the configured peers' `d_free_kbps`. An expired origin's virtual host name is let go
//!   (its A record removed) when the rescue server stops redirecting its clients back, the
//!   configured `expired_redirect_secs` after the relationship ended.
//! * **The request path** ([`Traffic`]): [`Traffic::route`] decides each request of the site's
//!   own content (serve, 302 to a rescue server, or 503 at the redirect bound); the site counts
//!   every response with [`Traffic::served`], [`Traffic::redirected`] (the real size of the
//!   redirect response, for A_redi) or [`Traffic::rescued`].
//!
//! Every decision is the core's; this crate only moves bytes and calls it. The core, the
//! sessions and the connection table share one mutex (every call under it is short and never
//! waits on I/O); the request path has its own.

pub mod discovery;
pub mod metrics;
#[cfg(feature = "test-certs")]
pub mod testcerts;
pub mod tls;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustls_pki_types::ServerName;
use switchyard_admin::status::{OriginEntry, PeerEntry, RescueStatus, RescueTotals, RescuerEntry};
use switchyard_rescue::{
    Action, Candidate, Core, Meter, PeerConfig, PeerId, Received, Redirector, RescueConfig, Route,
    RouteQuery, Session, Sos, State,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub use switchyard_rescue::redirect::RedirectStats;
pub use tls::TlsIdentity;

/// Why a driver could not start.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The `[rescue]` table is invalid or has no `[rescue.peering]`.
    #[error("[rescue]: {0}")]
    Config(String),
    /// Certificates or keys could not be read or used.
    #[error("rescue TLS: {0}")]
    Tls(String),
    /// The peering listener could not be bound.
    #[error("cannot bind the rescue listener on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// A rescue server's virtual hosts (the node's rescue proxy implements it): the core's
/// `OriginAdded` and `OriginEnded` actions.
pub trait VirtualHosts: Send + Sync {
    /// Start serving `origin` of `peer` under `alias`.
    fn origin_added(&self, peer: PeerId, origin: &Sos, alias: &str) -> Result<(), String>;
    /// Stop serving the origin with virtual host name `alias` (its names are redirected back).
    fn origin_ended(&self, alias: &str) -> Result<(), String>;
}

/// Where rescue candidates come from: the configured peers ([`StaticCandidates`]) or the
/// service registry ([`discovery::Discovery`]).
pub trait Candidates: Send + Sync {
    /// The candidates known now.
    fn candidates(&self) -> Vec<Candidate>;
}

/// The candidates of `[rescue.peering.peers]`: every peer with a `d_free_kbps`.
#[derive(Debug, Clone)]
pub struct StaticCandidates(pub Vec<Candidate>);

impl StaticCandidates {
    /// The candidates among `peers` (peer ids are indices into the list).
    pub fn from_peers(peers: &[PeerConfig]) -> Self {
        StaticCandidates(
            peers
                .iter()
                .enumerate()
                .filter_map(|(i, p)| {
                    Some(Candidate {
                        peer: PeerId(i as u32),
                        d_free_kbps: p.d_free_kbps?,
                        domain: p.domain.clone(),
                    })
                })
                .collect(),
        )
    }
}

impl Candidates for StaticCandidates {
    fn candidates(&self) -> Vec<Candidate> {
        self.0.clone()
    }
}

/// DNS round robin and the registry: the core's `RescuerAdded`, `RescuerEnded`, `Advertise`,
/// `StateChanged`, `OriginAdded` and `OriginEnded` actions.
pub trait Directory: Send + Sync {
    /// One action for DNS or the registry, with the name of the peer it concerns.
    fn on_action(&self, action: &Action, peer_name: Option<&str>);
    /// The virtual host name `alias` of an ended relationship is no longer served (not even
    /// redirected back): its name can go.
    fn vhost_expired(&self, alias: &str) {
        tracing::debug!(alias, "virtual host name expired");
    }
}

/// A [`Directory`] that logs what DNS and the registry would be told.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogDirectory;

impl Directory for LogDirectory {
    fn on_action(&self, action: &Action, peer_name: Option<&str>) {
        match action {
            Action::RescuerAdded { grant, .. } => tracing::info!(
                peer = peer_name,
                alias = %grant.alias,
                ip = %grant.ip,
                port = grant.port,
                d_redi_kbps = grant.d_redi_kbps,
                "rescue server added (DNS round robin: add its address)"
            ),
            Action::RescuerEnded { reason, .. } => tracing::info!(
                peer = peer_name,
                ?reason,
                "rescue server ended (DNS round robin: remove its address)"
            ),
            Action::Advertise { d_free_kbps } => {
                tracing::info!(d_free_kbps, "free rescue capacity changed (registry)")
            }
            Action::StateChanged { from, to } => {
                tracing::info!(from = ?from, to = ?to, "rescue state changed")
            }
            other => tracing::debug!(action = ?other, "rescue action"),
        }
    }
}

/// What a site's request path does with one request of its own content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it here (and count it with [`Traffic::served`]).
    Serve,
    /// Answer 302 with this `Location`, then count the response with [`Traffic::redirected`].
    Redirect {
        /// The rescue server.
        peer: PeerId,
        /// `http://<vhost>[:<port>]<target>`.
        location: String,
    },
    /// The redirect bound of this interval is reached: answer 503.
    Refuse,
}

struct TrafficInner {
    meter: Meter,
    redirector: Redirector,
    refused: u64,
    redirects_to: BTreeMap<PeerId, u64>,
}

/// The request path's side of the driver: the meter and the redirector.
pub struct Traffic {
    inner: Mutex<TrafficInner>,
}

impl std::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traffic").finish_non_exhaustive()
    }
}

impl Traffic {
    fn new(cfg: &RescueConfig) -> Traffic {
        Traffic {
            inner: Mutex::new(TrafficInner {
                meter: Meter::new(cfg, Duration::ZERO),
                redirector: Redirector::new(cfg),
                refused: 0,
                redirects_to: BTreeMap::new(),
            }),
        }
    }

    /// Decides a request for `target` (origin-form, query included) of a file of `size` bytes
    /// from `client`. Requests from a rescue server's address and for the status page are
    /// always served.
    pub fn route(&self, client: IpAddr, target: &str, size: u64) -> Verdict {
        let path = target.split('?').next().unwrap_or(target);
        let mut t = self.inner.lock();
        let out = t.meter.out_bytes();
        let q = RouteQuery { client, path, size };
        match t.redirector.route(&q, out) {
            Route::Serve => Verdict::Serve,
            Route::Refuse => {
                t.refused += 1;
                Verdict::Refuse
            }
            Route::Redirect(r) => Verdict::Redirect {
                peer: r.peer,
                location: r.location(target),
            },
        }
    }

    /// A response of `bytes` (head and body) for the site's own content.
    pub fn served(&self, bytes: u64) {
        self.inner.lock().meter.served(bytes);
    }

    /// A redirect response of `response_bytes` sending a file of `file_bytes` to `peer`.
    pub fn redirected(&self, peer: PeerId, response_bytes: u64, file_bytes: u64) {
        let mut t = self.inner.lock();
        t.meter.redirected(peer, response_bytes, file_bytes);
        *t.redirects_to.entry(peer).or_default() += 1;
    }

    /// A response of `bytes` served on behalf of the origin `peer`.
    pub fn rescued(&self, origin: PeerId, bytes: u64) {
        self.inner.lock().meter.rescued(origin, bytes);
    }

    /// The redirector's counters.
    pub fn redirect_stats(&self) -> RedirectStats {
        self.inner.lock().redirector.stats()
    }
}

/// One peer connection as the control state sees it.
struct Conn {
    id: u64,
    session: Session,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    wake: Arc<Notify>,
    /// Dialed by us (for an SOS): we close it once nothing depends on it.
    outgoing: bool,
}

#[derive(Default)]
struct Counters {
    sos_sent: AtomicU64,
    rate_messages: AtomicU64,
    ended: AtomicU64,
    refused: AtomicU64,
    lost: AtomicU64,
}

struct Control {
    core: Core,
    conns: HashMap<PeerId, Conn>,
    next_conn: u64,
    ticks: u64,
    /// Virtual host names of ended relationships and when the rescue proxy lets them go
    /// (`expired_redirect_secs` after the end), in that order.
    expiring: std::collections::VecDeque<(Duration, String)>,
}

struct Shared {
    epoch: Instant,
    cfg: RescueConfig,
    peers: Vec<PeerConfig>,
    control: Mutex<Control>,
    traffic: Arc<Traffic>,
    vhosts: Option<Arc<dyn VirtualHosts>>,
    candidates: Arc<dyn Candidates>,
    directory: Arc<dyn Directory>,
    discovery: Option<Arc<discovery::Discovery>>,
    discovery_metrics: discovery::DiscoveryMetrics,
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    counters: Counters,
    stop: watch::Receiver<bool>,
    /// Bumped after every change of the control state (tests and status pages wait on it).
    changed: watch::Sender<u64>,
}

/// What a driver is built from.
pub struct DriverParts {
    /// The `[rescue]` table; `peering` must be set.
    pub config: RescueConfig,
    /// This server's certificate and key and the peers' authorities.
    pub identity: TlsIdentity,
    /// A rescue server's virtual hosts; `None` on a site that only asks for rescue (it then
    /// refuses no SOS itself: the core decides, but origins it accepts are not served).
    pub vhosts: Option<Arc<dyn VirtualHosts>>,
    /// Rescue candidates; `None`: the registry's with `[rescue.registry]`, else the configured
    /// peers with a `d_free_kbps`.
    pub candidates: Option<Arc<dyn Candidates>>,
    /// DNS and registry; `None`: the registry and DNS updates of `[rescue.registry]` and
    /// `[rescue.dns]`, or a [`LogDirectory`] without them.
    pub directory: Option<Arc<dyn Directory>>,
}

/// A running driver: its control task, its listener and its connections. Dropping it stops
/// them all.
pub struct Driver {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("server_name", &self.shared.cfg.server_name)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Binds the peering listener and starts the control task (on the current tokio runtime).
    pub async fn start(parts: DriverParts) -> Result<Driver, DriverError> {
        let cfg = parts.config;
        let peering = cfg
            .peering
            .clone()
            .ok_or_else(|| DriverError::Config("no [rescue.peering] table".into()))?;
        let core = Core::new(cfg.clone()).map_err(|e| DriverError::Config(e.to_string()))?;
        let d_free = core.d_free();
        let (server, client) = parts.identity.configs()?;
        let listener =
            TcpListener::bind(peering.listen)
                .await
                .map_err(|source| DriverError::Bind {
                    addr: peering.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| DriverError::Bind {
            addr: peering.listen,
            source,
        })?;
        let epoch = Instant::now();
        let (stop, stop_rx) = watch::channel(false);
        let discovery_metrics = discovery::DiscoveryMetrics::default();
        let discovery = if parts.candidates.is_none() || parts.directory.is_none() {
            discovery::Discovery::start(
                &cfg,
                &peering.peers,
                d_free,
                addr.port(),
                &discovery_metrics,
            )
            .await?
            .map(Arc::new)
        } else {
            None
        };
        let candidates: Arc<dyn Candidates> = match (parts.candidates, &discovery) {
            (Some(c), _) => c,
            (None, Some(d)) if d.has_registry() => d.clone(),
            (None, _) => Arc::new(StaticCandidates::from_peers(&peering.peers)),
        };
        let directory: Arc<dyn Directory> = match (parts.directory, &discovery) {
            (Some(d), _) => d,
            (None, Some(d)) => d.clone(),
            (None, None) => Arc::new(LogDirectory),
        };
        let shared = Arc::new(Shared {
            epoch,
            traffic: Arc::new(Traffic::new(&cfg)),
            control: Mutex::new(Control {
                core,
                conns: HashMap::new(),
                next_conn: 1,
                ticks: 0,
                expiring: Default::default(),
            }),
            peers: peering.peers.clone(),
            cfg,
            vhosts: parts.vhosts,
            candidates,
            directory,
            discovery,
            discovery_metrics,
            acceptor: TlsAcceptor::from(server),
            connector: TlsConnector::from(client),
            counters: Counters::default(),
            stop: stop_rx,
            changed: watch::channel(0).0,
        });
        let tasks = vec![
            tokio::spawn(shared.clone().accept_loop(listener)),
            tokio::spawn(shared.clone().control_loop()),
        ];
        tracing::info!(
            server = %shared.cfg.server_name,
            %addr,
            peers = shared.peers.len(),
            "rescue driver started"
        );
        Ok(Driver {
            shared,
            addr,
            stop,
            tasks,
        })
    }

    /// The peering listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The request path's handle.
    pub fn traffic(&self) -> Arc<Traffic> {
        self.shared.traffic.clone()
    }

    /// The core's state.
    pub fn state(&self) -> State {
        self.shared.control.lock().core.state()
    }

    /// A receiver whose value changes after every change of the control state.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    /// The status page's content.
    pub fn status(&self) -> RescueStatus {
        self.shared.status()
    }

    /// A handle that renders the status without keeping the driver's tasks alive.
    pub fn status_source(&self) -> StatusSource {
        StatusSource(Arc::downgrade(&self.shared))
    }

    /// The registry and DNS side, with `[rescue.registry]` or `[rescue.dns]`.
    pub fn discovery(&self) -> Option<&discovery::Discovery> {
        self.shared.discovery.as_deref()
    }

    /// Closes the connection to `peer`, if any: every relationship with it ends here, and the
    /// peer ends its side when it sees the connection close.
    pub fn disconnect(&self, peer: PeerId) {
        let now = self.shared.now();
        let mut ctl = self.shared.control.lock();
        if let Some(c) = ctl.conns.get(&peer) {
            let id = c.id;
            self.shared
                .lost(&mut ctl, now, peer, id, "closed by the operator");
        }
        drop(ctl);
        self.shared.bump();
    }

    /// Stops every task, closes every connection and withdraws the registration.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        if let Some(d) = &self.shared.discovery {
            d.withdraw().await;
        }
        let mut ctl = self.shared.control.lock();
        for (_, c) in ctl.conns.drain() {
            c.wake.notify_one();
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for t in &self.tasks {
            t.abort();
        }
        let mut ctl = self.shared.control.lock();
        for (_, c) in ctl.conns.drain() {
            c.wake.notify_one();
        }
    }
}

/// Renders a driver's status for the admin listener, as long as the driver runs.
#[derive(Clone)]
pub struct StatusSource(std::sync::Weak<Shared>);

impl std::fmt::Debug for StatusSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusSource").finish_non_exhaustive()
    }
}

impl StatusSource {
    /// The status, if the driver still runs.
    pub fn status(&self) -> Option<RescueStatus> {
        self.0.upgrade().map(|s| s.status())
    }
}

impl Shared {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    fn peer_name(&self, peer: PeerId) -> &str {
        self.peers
            .get(peer.0 as usize)
            .map_or("unknown", |p| p.name.as_str())
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    async fn control_loop(self: Arc<Self>) {
        let interval = self.cfg.control_interval();
        let mut stop = self.stop.clone();
        let mut next = tokio::time::Instant::from_std(self.epoch) + interval;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = stop.changed() => return,
            }
            if self.stopping() {
                return;
            }
            next += interval;
            let now = self.now();
            let m = self.traffic.inner.lock().meter.take(now);
            let candidates = self.candidates.candidates();
            let mut ctl = self.control.lock();
            ctl.ticks += 1;
            let acts = ctl.core.on_tick(now, &m, &candidates);
            self.apply(&mut ctl, now, acts);
            while ctl.expiring.front().is_some_and(|(at, _)| *at <= now) {
                let (_, alias) = ctl.expiring.pop_front().expect("checked above");
                self.directory.vhost_expired(&alias);
            }
            // Connections we dialed that nothing depends on any more are closed.
            let idle: Vec<(PeerId, u64)> = ctl
                .conns
                .iter()
                .filter(|(p, c)| {
                    c.outgoing && c.session.is_idle() && !ctl.core.has_relationship(**p)
                })
                .map(|(p, c)| (*p, c.id))
                .collect();
            for (peer, id) in idle {
                if let Some(c) = ctl.conns.remove(&peer) {
                    debug_assert_eq!(c.id, id);
                    tracing::debug!(
                        peer = self.peer_name(peer),
                        "closing idle rescue connection"
                    );
                    c.wake.notify_one();
                }
            }
            drop(ctl);
            self.bump();
        }
    }

    /// Carries out the core's actions in order (the control lock held).
    fn apply(self: &Arc<Self>, ctl: &mut Control, now: Duration, acts: Vec<Action>) {
        for a in acts {
            match a {
                Action::Send { peer, request } => {
                    if matches!(request, switchyard_rescue::Request::Sos(_)) {
                        self.counters.sos_sent.fetch_add(1, Relaxed);
                    }
                    if matches!(request, switchyard_rescue::Request::Rate { .. }) {
                        self.counters.rate_messages.fetch_add(1, Relaxed);
                    }
                    if !ctl.conns.contains_key(&peer) && !self.dial(ctl, peer) {
                        let more = ctl.core.on_peer_lost(now, peer);
                        self.apply(ctl, now, more);
                        continue;
                    }
                    let c = ctl.conns.get_mut(&peer).expect("dialed above");
                    tracing::debug!(peer = self.peer_name(peer), ?request, "rescue request");
                    match c.session.send_request(now, request) {
                        Ok((_, line)) => {
                            let _ = c.tx.send(line);
                            c.wake.notify_one();
                        }
                        Err(e) => {
                            let id = c.id;
                            self.lost(ctl, now, peer, id, &e.to_string());
                        }
                    }
                }
                Action::Reply {
                    peer,
                    seq,
                    response,
                } => {
                    let Some(c) = ctl.conns.get_mut(&peer) else {
                        continue;
                    };
                    match c.session.send_response(seq, response) {
                        Ok(line) => {
                            let _ = c.tx.send(line);
                        }
                        Err(e) => {
                            let id = c.id;
                            self.lost(ctl, now, peer, id, &e.to_string());
                        }
                    }
                }
                Action::Redirect(plan) => self.traffic.inner.lock().redirector.apply(plan),
                Action::OriginAdded {
                    peer,
                    ref origin,
                    ref alias,
                    d_alloc_kbps,
                } => {
                    tracing::info!(
                        peer = self.peer_name(peer),
                        origin = %origin.fqdn,
                        alias = %alias,
                        d_alloc_kbps,
                        "rescuing origin"
                    );
                    match &self.vhosts {
                        Some(v) => {
                            if let Err(e) = v.origin_added(peer, origin, alias) {
                                tracing::warn!(alias = %alias, error = %e, "virtual host not added");
                            }
                        }
                        None => tracing::warn!(
                            alias = %alias,
                            "this site has no rescue proxy: the origin's requests are misdirected"
                        ),
                    }
                    self.directory.on_action(&a, Some(self.peer_name(peer)));
                }
                Action::OriginEnded {
                    peer,
                    ref alias,
                    reason,
                    ..
                } => {
                    self.counters.ended.fetch_add(1, Relaxed);
                    tracing::info!(peer = self.peer_name(peer), alias = %alias, ?reason, "rescue of origin ended");
                    if let Some(v) = &self.vhosts {
                        if let Err(e) = v.origin_ended(alias) {
                            tracing::warn!(alias = %alias, error = %e, "virtual host not ended");
                        }
                    }
                    ctl.expiring
                        .push_back((now + self.cfg.expired_redirect(), alias.clone()));
                    self.directory.on_action(&a, Some(self.peer_name(peer)));
                }
                other => {
                    let peer = match &other {
                        Action::RescuerAdded { peer, .. } => Some(*peer),
                        Action::RescuerEnded { peer, .. } => {
                            self.counters.ended.fetch_add(1, Relaxed);
                            Some(*peer)
                        }
                        _ => None,
                    };
                    self.directory
                        .on_action(&other, peer.map(|p| self.peer_name(p)));
                }
            }
        }
    }

    /// Opens a connection entry for `peer` and dials it in the background; false if `peer`
    /// is not configured.
    fn dial(self: &Arc<Self>, ctl: &mut Control, peer: PeerId) -> bool {
        let Some(pc) = self.peers.get(peer.0 as usize).cloned() else {
            return false;
        };
        let Ok(name) = ServerName::try_from(pc.name.clone()) else {
            return false;
        };
        let (id, rx, wake) = self.open(ctl, peer, true);
        let this = self.clone();
        let timeout = self.cfg.request_timeout();
        tokio::spawn(async move {
            let dialed = tokio::time::timeout(timeout, async {
                let tcp = TcpStream::connect(pc.addr).await?;
                let _ = tcp.set_nodelay(true);
                this.connector.connect(name, tcp).await
            })
            .await;
            match dialed {
                Ok(Ok(stream)) => {
                    tracing::debug!(peer = %pc.name, addr = %pc.addr, "rescue connection open");
                    this.run_conn(peer, id, tokio_rustls::TlsStream::Client(stream), rx, wake)
                        .await
                }
                Ok(Err(e)) => this.lost_now(peer, id, &format!("cannot connect: {e}")),
                Err(_) => this.lost_now(peer, id, "connect timed out"),
            }
        });
        true
    }

    /// A new connection entry for `peer`, replacing any older one (whose relationships end:
    /// the peer has started a new session).
    fn open(
        self: &Arc<Self>,
        ctl: &mut Control,
        peer: PeerId,
        outgoing: bool,
    ) -> (u64, mpsc::UnboundedReceiver<Vec<u8>>, Arc<Notify>) {
        let now = self.now();
        if let Some(old) = ctl.conns.get(&peer) {
            let old = old.id;
            self.lost(ctl, now, peer, old, "replaced by a new connection");
        }
        let id = ctl.next_conn;
        ctl.next_conn += 1;
        let (tx, rx) = mpsc::unbounded_channel();
        let wake = Arc::new(Notify::new());
        ctl.conns.insert(
            peer,
            Conn {
                id,
                session: ctl.core.new_session(),
                tx,
                wake: wake.clone(),
                outgoing,
            },
        );
        (id, rx, wake)
    }

    fn lost_now(self: &Arc<Self>, peer: PeerId, id: u64, why: &str) {
        let now = self.now();
        let mut ctl = self.control.lock();
        self.lost(&mut ctl, now, peer, id, why);
        drop(ctl);
        self.bump();
    }

    /// Connection `id` to `peer` is gone: if it is still the peer's connection, every
    /// relationship with the peer ends here.
    fn lost(self: &Arc<Self>, ctl: &mut Control, now: Duration, peer: PeerId, id: u64, why: &str) {
        if ctl.conns.get(&peer).is_none_or(|c| c.id != id) {
            return;
        }
        let c = ctl.conns.remove(&peer).expect("checked above");
        c.wake.notify_one();
        let tied = ctl.core.has_relationship(peer) || !c.session.is_idle();
        if tied {
            self.counters.lost.fetch_add(1, Relaxed);
            tracing::warn!(
                peer = self.peer_name(peer),
                reason = why,
                "rescue connection lost"
            );
        } else {
            tracing::debug!(
                peer = self.peer_name(peer),
                reason = why,
                "rescue connection closed"
            );
        }
        let acts = ctl.core.on_peer_lost(now, peer);
        self.apply(ctl, now, acts);
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let mut stop = self.stop.clone();
        loop {
            let accepted = tokio::select! {
                r = listener.accept() => r,
                _ = stop.changed() => return,
            };
            match accepted {
                Ok((tcp, from)) => {
                    let this = self.clone();
                    tokio::spawn(async move { this.handshake(tcp, from).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rescue accept failed");
                    // Out of descriptors: let some close before accepting again.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn handshake(self: Arc<Self>, tcp: TcpStream, from: SocketAddr) {
        let _ = tcp.set_nodelay(true);
        let timeout = self.cfg.request_timeout();
        let stream = match tokio::time::timeout(timeout, self.acceptor.accept(tcp)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return self.refuse(from, &e.to_string()),
            Err(_) => return self.refuse(from, "handshake timed out"),
        };
        let peer = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|leaf| tls::identify(leaf, &self.peers));
        let Some(peer) = peer else {
            return self.refuse(from, "certificate names no configured peer");
        };
        tracing::debug!(peer = self.peer_name(peer), %from, "rescue connection accepted");
        let (id, rx, wake) = {
            let mut ctl = self.control.lock();
            self.open(&mut ctl, peer, false)
        };
        self.run_conn(peer, id, tokio_rustls::TlsStream::Server(stream), rx, wake)
            .await
    }

    fn refuse(&self, from: SocketAddr, why: &str) {
        self.counters.refused.fetch_add(1, Relaxed);
        tracing::warn!(%from, reason = why, "rescue peer refused");
        self.bump();
    }

    /// One connection: a writer task sends what the session produces; this loop reads,
    /// delivers, and checks the session's deadline.
    async fn run_conn(
        self: Arc<Self>,
        peer: PeerId,
        id: u64,
        stream: tokio_rustls::TlsStream<TcpStream>,
        mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
        wake: Arc<Notify>,
    ) {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let writer = tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if wr.write_all(&line).await.is_err() || wr.flush().await.is_err() {
                    return false;
                }
            }
            // The entry is gone: close our side (TLS close_notify, then FIN).
            let _ = wr.shutdown().await;
            true
        });
        let mut buf = vec![0u8; 4096];
        let mut stop = self.stop.clone();
        let why = loop {
            let deadline = {
                let ctl = self.control.lock();
                match ctl.conns.get(&peer) {
                    Some(c) if c.id == id => c.session.next_deadline(),
                    _ => break None,
                }
            };
            let sleep = async {
                match deadline {
                    Some(d) => {
                        tokio::time::sleep_until(tokio::time::Instant::from_std(self.epoch + d))
                            .await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = rd.read(&mut buf) => match r {
                    Ok(0) => break Some("closed by the peer".to_string()),
                    Ok(n) => {
                        if let Some(e) = self.received(peer, id, &buf[..n]) {
                            break Some(e);
                        }
                    }
                    Err(e) => break Some(e.to_string()),
                },
                _ = sleep => {
                    let now = self.now();
                    let mut ctl = self.control.lock();
                    let late = match ctl.conns.get_mut(&peer) {
                        Some(c) if c.id == id => c.session.check_timeouts(now).err(),
                        _ => None,
                    };
                    if let Some(e) = late {
                        self.lost(&mut ctl, now, peer, id, &e.to_string());
                        drop(ctl);
                        self.bump();
                    }
                }
                _ = wake.notified() => {}
                _ = stop.changed() => break None,
            }
        };
        if let Some(why) = why {
            self.lost_now(peer, id, &why);
        }
        // The writer ends once the entry (and its sender) is gone.
        let _ = writer.await;
    }

    /// Bytes from `peer` on connection `id`; an error ends the connection.
    fn received(self: &Arc<Self>, peer: PeerId, id: u64, bytes: &[u8]) -> Option<String> {
        let now = self.now();
        let mut ctl = self.control.lock();
        let got = match ctl.conns.get_mut(&peer) {
            Some(c) if c.id == id => c.session.receive(bytes),
            _ => return None,
        };
        let items = match got {
            Ok(items) => items,
            Err(e) => return Some(e.to_string()),
        };
        for item in items {
            match item {
                Received::Deliver(msg) => {
                    tracing::debug!(peer = self.peer_name(peer), ?msg, "rescue message");
                    if let switchyard_rescue::Inbound::Request {
                        request: switchyard_rescue::Request::Rate { .. },
                        ..
                    } = &msg
                    {
                        self.counters.rate_messages.fetch_add(1, Relaxed);
                    }
                    let acts = ctl.core.on_message(now, peer, msg);
                    self.apply(&mut ctl, now, acts);
                }
                Received::Reply(line) => {
                    if let Some(c) = ctl.conns.get(&peer).filter(|c| c.id == id) {
                        let _ = c.tx.send(line);
                    }
                }
            }
        }
        drop(ctl);
        self.bump();
        None
    }

    fn status(&self) -> RescueStatus {
        let ctl = self.control.lock();
        let s = ctl.core.status();
        let (totals, refused, to) = {
            let t = self.traffic.inner.lock();
            (t.meter.totals(), t.refused, t.redirects_to.clone())
        };
        let c = &self.counters;
        RescueStatus {
            server_name: self.cfg.server_name.clone(),
            state: match s.state {
                State::Normal => "normal",
                State::Sos => "sos",
                State::Rescue => "rescue",
            }
            .to_string(),
            ticks: ctl.ticks,
            d_out_max: s.d_out_max,
            d_out: s.rates.d_out,
            d_self: s.rates.d_self,
            d_resc: s.rates.d_resc,
            r_redi: s.rates.r_redi,
            t_redi: s.t_redi,
            a_redi: s.a_redi,
            d_free: s.d_free,
            pending_sos: s.pending_sos.map(|p| self.peer_name(p).to_string()),
            rescuers: s
                .rescuers
                .iter()
                .map(|r| RescuerEntry {
                    peer: self.peer_name(r.peer).to_string(),
                    alias: r.grant.alias.clone(),
                    web: SocketAddr::new(r.grant.ip, r.grant.port).to_string(),
                    d_redi_kbps: r.grant.d_redi_kbps,
                    d_redi: r.d_redi,
                    redirects: to.get(&r.peer).copied().unwrap_or(0),
                })
                .collect(),
            origins: s
                .origins
                .iter()
                .map(|o| OriginEntry {
                    peer: self.peer_name(o.peer).to_string(),
                    fqdn: o.fqdn.clone(),
                    alias: o.alias.clone(),
                    d_alloc: o.d_alloc,
                    d_redi: o.d_redi,
                    d_resc: o.d_resc,
                })
                .collect(),
            totals: RescueTotals {
                bytes_served: totals.bytes_served,
                requests_served: totals.requests_served,
                requests_redirected: totals.requests_redirected,
                requests_rescued: totals.requests_rescued,
                requests_refused: refused,
                sos_sent: c.sos_sent.load(Relaxed),
                rate_messages: c.rate_messages.load(Relaxed),
                relationships_ended: c.ended.load(Relaxed),
                connections_refused: c.refused.load(Relaxed),
                connections_lost: c.lost.load(Relaxed),
            },
            peers: self
                .peers
                .iter()
                .enumerate()
                .map(|(i, p)| PeerEntry {
                    name: p.name.clone(),
                    addr: p.addr,
                    connected: ctl.conns.contains_key(&PeerId(i as u32)),
                })
                .collect(),
        }
    }
}

/// The `/dotslash-status` route for an admin listener: the page, or with `?auto` the
/// counters.
pub fn status_page(source: &StatusSource, query: Option<&str>) -> (&'static str, Vec<u8>) {
    let Some(s) = source.status() else {
        return (
            "text/plain; charset=utf-8",
            b"rescue driver stopped\n".to_vec(),
        );
    };
    if query.is_some_and(|q| q.split('&').any(|p| p == "auto")) {
        ("text/plain; charset=utf-8", s.auto().into_bytes())
    } else {
        ("text/plain; charset=utf-8", s.page().into_bytes())
    }
}

/// Waits until `f` holds for the driver's status or `deadline` passes; the status at the end.
/// (For tests and tools: it waits on the driver's change notifications, not on a timer.)
pub async fn wait_for(
    driver: &Driver,
    deadline: Duration,
    mut f: impl FnMut(&RescueStatus) -> bool,
) -> Result<RescueStatus, RescueStatus> {
    let mut rx = driver.subscribe();
    let until = tokio::time::Instant::now() + deadline;
    loop {
        let s = driver.status();
        if f(&s) {
            return Ok(s);
        }
        match tokio::time::timeout_at(until, rx.changed()).await {
            Ok(Ok(())) => {}
            _ => return Err(driver.status()),
        }
    }
}
