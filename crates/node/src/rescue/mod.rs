//! The rescue server (seed 001 §4.1): a node with a `[rescue]` table serves the origins it
//! rescues as a reverse caching proxy, under the virtual host names it gave them and under
//! their own names.
//!
//! Every request of such a node is first matched against the virtual host table
//! ([`switchyard_rescue::VhostTable`]) by its host: the `Host` field, or the authority of an
//! absolute-form target (which RFC 9112 §3.2.2 makes take precedence), or a `CONNECT`'s
//! target:
//!
//! * the node's own names (and a request without any host): the node's own site, served as
//!   always;
//! * a live origin's alias or name: proxied. Only `GET` and `HEAD` (others: 405, nothing
//!   fetched); the target must be a clean origin-form path (else 400). A stored object younger
//!   than its freshness lifetime (the origin's `s-maxage` or `max-age`, else `fresh_ms`) is
//!   served at once (an older one whose revalidation fails is served stale, unless the origin
//!   said `must-revalidate`, `proxy-revalidate` or `no-cache`); an older one is revalidated with its validators
//!   (a 304 keeps it another interval); a missing one is fetched. However many clients ask for
//!   one target at once, exactly one fetch is in flight: the first request starts it as a task
//!   of its own (it outlives the client that started it) and every request waits on a
//!   `watch` channel until the task publishes the outcome. Responses marked
//!   `Cache-Control: no-store` or `private` go to one client only and are never stored (the
//!   others fetch for themselves), `no-cache` ones to the clients waiting for that fetch;
//!   responses with bodies above `max_object_bytes` are not stored: one of a known length
//!   (`Content-Length`) is fetched once for all the clients that ask for it while the fetch
//!   is under way, through a temporary file each reads at its own pace ([`spool`]); one
//!   without (chunked, until close) is relayed to each client as it comes, as the paper's
//!   Apache did with its object limit. Upstream failures are 502, timeouts 504;
//! * an ended origin's virtual host name, for `expired_redirect_secs`: a 302 back to
//!   `http://<origin>[:port]<target>`; its own name (reached by DNS round robin, so a
//!   redirect to it could come straight back) is proxied for as long, storing nothing;
//! * anything else: 421 Misdirected Request, and no fetch. The node is never an open proxy.
//!
//! Fetches go to the origin's IP and port from its SOS (not through DNS, §4.2) with the
//! origin's name as `Host`, over the pooled HTTP/1.1 client of `switchyard-upstream`.
//!
//! The rescue driver (the control loop speaking the rescue protocol) adds and ends origins
//! through [`RescueHandle`] as the core's `OriginAdded` and `OriginEnded` actions say.

pub(crate) mod fetch;
pub(crate) mod spool;
pub(crate) mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use switchyard_admin::encode::{counter, gauge, labelled};
use switchyard_http::request::{Method, RequestHead};
use switchyard_rescue::{
    Action, Lookup, Origin, OriginId, PeerId, RescueConfig, Sos, VhostError, VhostTable,
};
use switchyard_upstream::Pool;
use tokio::sync::watch;

use fetch::{Fetched, Object, Sharing, Target};
use spool::{Spool, SpoolBudget};
use store::ProxyStore;

/// Idle connections kept per origin on each worker thread.
const MAX_IDLE_PER_ORIGIN: usize = 8;

/// What a request of a rescue server is.
#[derive(Debug)]
pub(crate) enum Decision {
    /// For the node's own site.
    Own,
    /// Refused with this status (400, 405 or 421); nothing is fetched.
    Refuse(u16),
    /// A 302 to this location (an ended origin).
    Redirect(String),
    /// Proxied for `origin`; `path` is the origin-form target.
    Proxy { origin: Origin, path: String },
}

/// How a proxied request is answered.
#[derive(Debug)]
pub(crate) enum Answer {
    /// From this object.
    Object(Arc<Object>),
    /// Fetched for this client alone and relayed, uncached.
    Relay,
    /// From the one fetch of a large object, as it is spooled.
    Spooled(Arc<Spool>),
    /// With this error status (502, 504).
    Error(u16),
}

/// What a fetch published to its waiters.
#[derive(Debug)]
enum Outcome {
    /// Serve this to every waiter.
    Shared(Arc<Object>),
    /// Serve this to the first waiter that takes it; the others fetch for themselves.
    Once(Mutex<Option<Arc<Object>>>),
    /// Every waiter fetches for itself (too large to keep, and of no known length).
    Relay,
    /// Every waiter reads this spool of a large object (the fetch may still be filling it).
    Spooled(Arc<Spool>),
    /// Every waiter gets this status.
    Failed(u16),
}

type FlightKey = (OriginId, String);

/// The counters of the proxy.
#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    fetches: AtomicU64,
    revalidations: AtomicU64,
    not_modified: AtomicU64,
    fetch_errors: AtomicU64,
    stale_served: AtomicU64,
    relayed: AtomicU64,
    spooled: AtomicU64,
    spool_full: AtomicU64,
    misdirected: AtomicU64,
    refused: AtomicU64,
    redirected: AtomicU64,
}

/// A snapshot of the proxy's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RescueStats {
    /// Requests answered from a fresh stored object.
    pub hits: u64,
    /// Requests that waited for a fetch (a miss or a revalidation).
    pub misses: u64,
    /// Fetches sent to origins: shared fetches, revalidations and relays.
    pub fetches: u64,
    /// Of the fetches, conditional ones (revalidations).
    pub revalidations: u64,
    /// Revalidations the origin answered 304.
    pub not_modified: u64,
    /// Fetches that failed (502 or 504 to their clients).
    pub fetch_errors: u64,
    /// Failed revalidations answered with the stale stored object (RFC 9111 §4.2.4).
    pub stale_served: u64,
    /// Requests relayed uncached (too large, or not to be shared).
    pub relayed: u64,
    /// Requests answered from the one shared fetch of a large object (its spool).
    pub spooled: u64,
    /// Large objects relayed per client because the spool files in use were at
    /// `spool_bytes`.
    pub spool_full: u64,
    /// Disk bytes reserved by the spool files in use now.
    pub spool_bytes: u64,
    /// Requests for names this server does not serve (421).
    pub misdirected: u64,
    /// Requests for an origin refused before any fetch (400, 405).
    pub refused: u64,
    /// Requests for an ended origin redirected back to it (302).
    pub redirected: u64,
    /// Bytes stored, by origin alias (live origins).
    pub cached_bytes: Vec<(String, u64)>,
}

/// The rescue server's state, shared by every connection of the node.
pub(crate) struct RescueProxy {
    cfg: RescueConfig,
    epoch: Instant,
    table: Mutex<VhostTable>,
    store: Mutex<ProxyStore>,
    flights: Mutex<HashMap<FlightKey, watch::Receiver<Option<Arc<Outcome>>>>>,
    pool: Pool,
    counters: Counters,
    /// The disk bytes of spool files open at once (`[rescue.proxy] spool_bytes`).
    spools: Arc<SpoolBudget>,
}

impl std::fmt::Debug for RescueProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RescueProxy")
            .field("server_name", &self.cfg.server_name)
            .finish_non_exhaustive()
    }
}

/// Where a request target points.
enum Form<'a> {
    /// `/path?query`.
    Origin(&'a str),
    /// `http://authority/path?query`: the authority and the origin-form rest.
    Absolute(&'a str, &'a str),
    /// Anything else (`*`, an authority alone, another scheme, userinfo).
    Other,
}

/// The name a request is for: an absolute-form target's authority, a `CONNECT` target, or the
/// `Host` field.
fn host_of<'a>(head: &'a RequestHead, form: &Form<'a>) -> Option<&'a str> {
    match (form, head.method) {
        (Form::Absolute(authority, _), _) => Some(*authority),
        (_, Method::Connect) => Some(head.target.as_str()),
        _ => head.host.as_deref(),
    }
}

fn form(target: &str) -> Form<'_> {
    if target.starts_with('/') {
        return Form::Origin(target);
    }
    let Some((scheme, rest)) = target.split_once("://") else {
        return Form::Other;
    };
    if !scheme.eq_ignore_ascii_case("http") {
        return Form::Other;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') {
        return Form::Other;
    }
    match path {
        "" => Form::Absolute(authority, "/"),
        p if p.starts_with('/') => Form::Absolute(authority, p),
        // `http://host?query`: the path is empty, i.e. `/`; not worth a special case.
        _ => Form::Other,
    }
}

impl RescueProxy {
    pub(crate) fn new(cfg: RescueConfig) -> Self {
        RescueProxy {
            table: Mutex::new(VhostTable::new(&cfg)),
            store: Mutex::new(ProxyStore::new(&cfg.proxy)),
            flights: Mutex::new(HashMap::new()),
            // Fetches leave from the address this server is known by, which is how an origin
            // tells its rescuers' fetches from its clients' requests.
            pool: Pool::new(usize::MAX, MAX_IDLE_PER_ORIGIN).with_source(cfg.web_ip),
            counters: Counters::default(),
            spools: SpoolBudget::new(cfg.proxy.spool_bytes),
            epoch: Instant::now(),
            cfg,
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    pub(crate) fn config(&self) -> &RescueConfig {
        &self.cfg
    }

    /// Whether `head` is for this server's own site (nothing counted).
    pub(crate) fn is_own(&self, head: &RequestHead) -> bool {
        let form = form(&head.target);
        let host = host_of(head, &form);
        matches!(self.table.lock().lookup(self.now(), host), Lookup::Own)
    }

    /// What `head` is for. Counts refusals, misdirected requests and redirects.
    pub(crate) fn decide(&self, head: &RequestHead) -> Decision {
        let form = form(&head.target);
        let host = host_of(head, &form);
        let refuse = |status: u16| {
            self.counters.refused.fetch_add(1, Relaxed);
            Decision::Refuse(status)
        };
        let table = self.table.lock();
        let (origin, proxy) = match table.lookup(self.now(), host) {
            Lookup::Own => return Decision::Own,
            Lookup::Misdirected => {
                self.counters.misdirected.fetch_add(1, Relaxed);
                return Decision::Refuse(421);
            }
            Lookup::Proxy(o) => (o, true),
            Lookup::RedirectBack(o) => (o, false),
            // Under its own name an ended origin is still proxied (uncached: it is not live),
            // until the resolvers that send its clients here forget this server.
            Lookup::ProxyEnded(o) => (o, true),
        };
        if !matches!(head.method, Method::Get | Method::Head) {
            return refuse(405);
        }
        let path = match form {
            Form::Origin(p) | Form::Absolute(_, p) => p,
            Form::Other => return refuse(400),
        };
        if switchyard_http::path::normalize(path).is_err() || path.contains('#') {
            return refuse(400);
        }
        if !proxy {
            self.counters.redirected.fetch_add(1, Relaxed);
            return Decision::Redirect(origin.location(path));
        }
        Decision::Proxy {
            origin: origin.clone(),
            path: path.to_string(),
        }
    }

    /// How to answer a proxied request for `path` of `origin`: from a fresh stored object,
    /// or once the one fetch in flight for it is done (started here if there is none).
    pub(crate) async fn answer(self: &Arc<Self>, origin: &Origin, path: &str) -> Answer {
        let key = (origin.id, path.to_string());
        let mut rx = {
            let mut flights = self.flights.lock();
            if let Some(rx) = flights.get(&key) {
                rx.clone()
            } else {
                // Looked up under the flights lock: a fetch that just ended has stored its
                // object before leaving the table.
                let now = self.now();
                let stored = self.store.lock().get(origin.id, path, now);
                if let Some(e) = &stored {
                    if now.saturating_sub(e.checked) < e.object.fresh_for(self.cfg.proxy.fresh()) {
                        self.counters.hits.fetch_add(1, Relaxed);
                        return Answer::Object(e.object.clone());
                    }
                }
                let (tx, rx) = watch::channel(None);
                flights.insert(key.clone(), rx.clone());
                let this = self.clone();
                let origin = origin.clone();
                tokio::spawn(async move {
                    this.run_fetch(origin, key, stored.map(|e| e.object), tx)
                        .await
                });
                rx
            }
        };
        self.counters.misses.fetch_add(1, Relaxed);
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone().expect("waited for a value"),
            // The fetch task ended without an outcome (the node is shutting down).
            Err(_) => return Answer::Error(502),
        };
        match &*outcome {
            Outcome::Shared(o) => Answer::Object(o.clone()),
            Outcome::Once(o) => match o.lock().take() {
                Some(o) => Answer::Object(o),
                None => Answer::Relay,
            },
            Outcome::Relay => Answer::Relay,
            Outcome::Spooled(s) => {
                self.counters.spooled.fetch_add(1, Relaxed);
                Answer::Spooled(s.clone())
            }
            Outcome::Failed(s) => Answer::Error(*s),
        }
    }

    /// The one fetch for `key`: fetch (or revalidate `stored`), store what may be stored,
    /// leave the flight table, then wake the waiters.
    async fn run_fetch(
        self: Arc<Self>,
        origin: Origin,
        key: FlightKey,
        stored: Option<Arc<Object>>,
        tx: watch::Sender<Option<Arc<Outcome>>>,
    ) {
        let c = &self.counters;
        c.fetches.fetch_add(1, Relaxed);
        let validators = stored.as_deref().filter(|o| o.has_validator());
        if validators.is_some() {
            c.revalidations.fetch_add(1, Relaxed);
        }
        let max = self.store.lock().max_object();
        let target = Target {
            addr: origin.addr,
            fqdn: &origin.fqdn,
            path: &key.1,
            via: &self.cfg.server_name,
        };
        let fetched = fetch::fetch(
            &self.pool,
            target,
            validators,
            max,
            self.cfg.proxy.fetch_timeout(),
        )
        .await;
        let now = self.now();
        let mut dropped = Vec::new();
        let outcome = match fetched {
            Fetched::Complete(object, sharing) => {
                let object = Arc::new(object);
                match sharing {
                    Sharing::Store if object.status == 200 => {
                        if self.is_live(origin.id) {
                            let (_, d) = self.store.lock().insert(
                                origin.id,
                                key.1.clone(),
                                object.clone(),
                                now,
                            );
                            dropped = d;
                        }
                        Outcome::Shared(object)
                    }
                    Sharing::Store | Sharing::Waiters => Outcome::Shared(object),
                    Sharing::Private => Outcome::Once(Mutex::new(Some(object))),
                }
            }
            Fetched::NotModified => {
                c.not_modified.fetch_add(1, Relaxed);
                let object = stored.expect("a 304 answers only a conditional fetch");
                if self.is_live(origin.id) {
                    let (_, d) =
                        self.store
                            .lock()
                            .insert(origin.id, key.1.clone(), object.clone(), now);
                    dropped = d;
                }
                Outcome::Shared(object)
            }
            Fetched::TooLarge => Outcome::Relay,
            Fetched::Large {
                conn,
                status,
                kept,
                len,
                keep_alive,
                until,
            } => match self
                .spools
                .reserve(len)
                .ok_or_else(|| {
                    c.spool_full.fetch_add(1, Relaxed);
                    std::io::Error::other(format!(
                        "the spool files in use hold {} of {} bytes",
                        self.spools.used(),
                        self.cfg.proxy.spool_bytes
                    ))
                })
                .and_then(|r| Spool::new(status, kept, r, self.cfg.proxy.spool_dir.as_deref()))
            {
                Ok(spool) => {
                    // The waiters (and requests arriving while the body comes) read the spool
                    // as it fills; the flight stays in the table until the body is complete.
                    let spool = Arc::new(spool);
                    tx.send_replace(Some(Arc::new(Outcome::Spooled(spool.clone()))));
                    if !spool.fill(conn, keep_alive, &self.pool, until).await {
                        c.fetch_errors.fetch_add(1, Relaxed);
                    }
                    self.flights.lock().remove(&key);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, len, "cannot spool a large object; relaying it per client");
                    Outcome::Relay
                }
            },
            Fetched::Failed(status) => {
                c.fetch_errors.fetch_add(1, Relaxed);
                // The origin cannot be reached to revalidate: its last answer is better than
                // an error, unless it asked never to be served stale. The entry stays stale,
                // so the next request asks again.
                match stored.filter(|o| o.may_serve_stale()) {
                    Some(o) => {
                        c.stale_served.fetch_add(1, Relaxed);
                        Outcome::Shared(o)
                    }
                    None => Outcome::Failed(status),
                }
            }
        };
        self.flights.lock().remove(&key);
        tx.send_replace(Some(Arc::new(outcome)));
        drop(dropped);
    }

    fn is_live(&self, id: OriginId) -> bool {
        self.table.lock().origin(id).is_some_and(Origin::is_live)
    }

    /// Count a request relayed uncached.
    pub(crate) fn count_relay(&self, failed: bool) {
        self.counters.fetches.fetch_add(1, Relaxed);
        self.counters.relayed.fetch_add(1, Relaxed);
        if failed {
            self.counters.fetch_errors.fetch_add(1, Relaxed);
        }
    }

    fn forget(&self, gone: &[OriginId]) {
        let dropped: Vec<_> = {
            let mut store = self.store.lock();
            gone.iter().flat_map(|id| store.drop_origin(*id)).collect()
        };
        drop(dropped);
    }

    fn stats(&self) -> RescueStats {
        let c = &self.counters;
        let cached_bytes = {
            let table = self.table.lock();
            let store = self.store.lock();
            let mut v: Vec<(String, u64)> = table
                .live()
                .map(|o| (o.alias.clone(), store.used(o.id)))
                .collect();
            v.sort();
            v
        };
        RescueStats {
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            fetches: c.fetches.load(Relaxed),
            revalidations: c.revalidations.load(Relaxed),
            not_modified: c.not_modified.load(Relaxed),
            fetch_errors: c.fetch_errors.load(Relaxed),
            stale_served: c.stale_served.load(Relaxed),
            relayed: c.relayed.load(Relaxed),
            spooled: c.spooled.load(Relaxed),
            spool_full: c.spool_full.load(Relaxed),
            spool_bytes: self.spools.used(),
            misdirected: c.misdirected.load(Relaxed),
            refused: c.refused.load(Relaxed),
            redirected: c.redirected.load(Relaxed),
            cached_bytes,
        }
    }
}

/// Adds and ends the origins a rescue node serves: what the rescue driver calls when the
/// core's `OriginAdded` and `OriginEnded` actions say so ([`RescueHandle::apply`]).
#[derive(Clone, Debug)]
pub struct RescueHandle(pub(crate) Arc<RescueProxy>);

impl RescueHandle {
    /// Start proxying for the origin `sos` of `peer` under the virtual host name `alias`.
    pub fn add_origin(&self, peer: PeerId, sos: &Sos, alias: &str) -> Result<OriginId, VhostError> {
        let p = &self.0;
        let now = p.now();
        let (r, gone) = {
            let mut t = p.table.lock();
            let gone = t.purge(now);
            (t.add_origin(now, peer, sos, alias), gone)
        };
        p.forget(&gone);
        match &r {
            Ok(id) => {
                tracing::info!(origin = %sos.fqdn, addr = %sos.ip, port = sos.port, alias, id = id.0, "rescuing origin")
            }
            Err(e) => tracing::warn!(origin = %sos.fqdn, alias, error = %e, "origin not added"),
        }
        r
    }

    /// Stop proxying for the origin with virtual host name `alias`: its stored objects go,
    /// and its names are redirected back to it for `expired_redirect_secs`.
    pub fn end_origin(&self, alias: &str) -> Result<OriginId, VhostError> {
        let p = &self.0;
        let now = p.now();
        let (r, mut gone) = {
            let mut t = p.table.lock();
            let gone = t.purge(now);
            (t.end_origin(now, alias), gone)
        };
        if let Ok(id) = &r {
            gone.push(*id);
            tracing::info!(alias, id = id.0, "origin ended; redirecting it back");
        }
        p.forget(&gone);
        r
    }

    /// Carry out a core action that concerns the virtual hosts (`OriginAdded`,
    /// `OriginEnded`); `None` for any other action.
    pub fn apply(&self, action: &Action) -> Option<Result<OriginId, VhostError>> {
        match action {
            Action::OriginAdded {
                peer,
                origin,
                alias,
                ..
            } => Some(self.add_origin(*peer, origin, alias)),
            Action::OriginEnded { alias, .. } => Some(self.end_origin(alias)),
            _ => None,
        }
    }

    /// The proxy's counters.
    pub fn stats(&self) -> RescueStats {
        self.0.stats()
    }
}

impl switchyard_rescue_driver::VirtualHosts for RescueHandle {
    fn origin_added(&self, peer: PeerId, origin: &Sos, alias: &str) -> Result<(), String> {
        self.add_origin(peer, origin, alias)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn origin_ended(&self, alias: &str) -> Result<(), String> {
        self.end_origin(alias)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Export the proxy's counters on the admin listener.
pub(crate) fn register(
    registry: &mut prometheus_client::registry::Registry,
    proxy: Arc<RescueProxy>,
) {
    registry.register_collector(Box::new(RescueCollector(proxy)));
}

#[derive(Debug)]
struct RescueCollector(Arc<RescueProxy>);

impl Collector for RescueCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.stats();
        let counters: [(&str, &str, u64); 13] = [
            (
                "switchyard_node_rescue_proxy_hits",
                "Rescue proxy requests answered from a fresh stored object",
                s.hits,
            ),
            (
                "switchyard_node_rescue_proxy_misses",
                "Rescue proxy requests that waited for a fetch (miss or revalidation)",
                s.misses,
            ),
            (
                "switchyard_node_rescue_proxy_fetches",
                "Fetches from origins (shared fetches, revalidations, relays)",
                s.fetches,
            ),
            (
                "switchyard_node_rescue_proxy_revalidations",
                "Conditional fetches of stale objects",
                s.revalidations,
            ),
            (
                "switchyard_node_rescue_proxy_not_modified",
                "Revalidations answered 304",
                s.not_modified,
            ),
            (
                "switchyard_node_rescue_proxy_fetch_errors",
                "Fetches that failed (502 or 504)",
                s.fetch_errors,
            ),
            (
                "switchyard_node_rescue_proxy_stale_served",
                "Failed revalidations answered with the stale stored object",
                s.stale_served,
            ),
            (
                "switchyard_node_rescue_proxy_relayed",
                "Requests relayed uncached (too large or not shareable)",
                s.relayed,
            ),
            (
                "switchyard_node_rescue_proxy_spooled",
                "Requests answered from the one shared fetch of a large object",
                s.spooled,
            ),
            (
                "switchyard_node_rescue_proxy_spool_full",
                "Large objects relayed per client because the spool files in use were at spool_bytes",
                s.spool_full,
            ),
            (
                "switchyard_node_rescue_misdirected",
                "Requests for names this server does not serve (421)",
                s.misdirected,
            ),
            (
                "switchyard_node_rescue_refused",
                "Requests for an origin refused before any fetch (400, 405)",
                s.refused,
            ),
            (
                "switchyard_node_rescue_redirected_back",
                "Requests for an ended origin redirected back to it (302)",
                s.redirected,
            ),
        ];
        for (name, help, v) in counters {
            counter(&mut enc, name, help, v)?;
        }
        let (objects, total) = {
            let st = self.0.store.lock();
            (st.objects(), st.total_used())
        };
        gauge(
            &mut enc,
            "switchyard_node_rescue_proxy_spool_bytes",
            "Disk bytes reserved by the rescue proxy's spool files in use",
            s.spool_bytes as i64,
        )?;
        gauge(
            &mut enc,
            "switchyard_node_rescue_proxy_objects",
            "Objects stored by the rescue proxy",
            objects as i64,
        )?;
        gauge(
            &mut enc,
            "switchyard_node_rescue_proxy_bytes",
            "Bytes stored by the rescue proxy",
            total as i64,
        )?;
        labelled(
            &mut enc,
            "switchyard_node_rescue_proxy_origin_bytes",
            "Bytes stored by the rescue proxy, by origin alias",
            "origin",
            false,
            s.cached_bytes,
        )?;
        gauge(
            &mut enc,
            "switchyard_node_rescue_origins",
            "Origins being rescued",
            self.0.table.lock().live().count() as i64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_forms() {
        assert!(matches!(form("/a?b"), Form::Origin("/a?b")));
        assert!(matches!(
            form("http://h.example:8080/a"),
            Form::Absolute("h.example:8080", "/a")
        ));
        assert!(matches!(
            form("HTTP://h.example"),
            Form::Absolute("h.example", "/")
        ));
        for other in [
            "*",
            "h.example:443",
            "https://h.example/",
            "http://u@h.example/",
            "http:///a",
            "ftp://h/x",
            "http://h?x",
        ] {
            assert!(matches!(form(other), Form::Other), "{other}");
        }
    }
}
