//! The service registry on etcd: one site's registration kept alive under a lease, and
//! periodic searches of everyone's registrations.
//!
//! Each registration is the JSON of a [`Registration`] at `<prefix><name>`, attached to a
//! lease of the configured TTL: when the site stops renewing (it crashed, or lost the network)
//! etcd deletes the key at the lease's expiry, so the registry holds soft state as §4.5 asks.
//! [`Advertiser`] decides when to publish and renew; this module carries it out. A second task
//! searches the prefix every search interval and keeps the ranked candidates. When etcd cannot
//! be reached, both tasks log, count, back off and go on; the handle keeps the last candidates
//! it had (a candidate that meanwhile went away costs one failed SOS, which the rescue core
//! handles; an empty list would leave an origin in trouble without any help).
//!
//! A leader change does not expire a lease: etcd renews every lease's TTL when a new leader
//! takes over, and the keeper renews every TTL/3 with requests limited to
//! `request_timeout` (at most TTL/3), so it can lose two renewals in a row and still renew in
//! time through another member. Should renewals fail for longer, the keeper asks etcd about the
//! old lease before taking a new one, so a registration that is still alive is not replaced.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions,
};
use switchyard_rescue::registry::{
    rank, to_candidates, Advertiser, Registration, RegistryConfig, Step,
};
use switchyard_rescue::{Candidate, PeerId, RescueConfig};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::metrics::RegistryMetrics;
use crate::Error;

/// This site's registration and its rescue capacity D_resc (kB/s), which scales the
/// threshold of immediate re-registration.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    /// What is registered.
    pub registration: Registration,
    /// D_resc, kB/s.
    pub d_resc_kbps: f64,
}

impl Site {
    /// The site `cfg` describes, advertising `d_free_bytes` (bytes per second, from
    /// [`switchyard_rescue::Core::d_free`]) with its rescue protocol on `reg.port_dots`, or if
    /// that is not set on the port of `[rescue.peering] listen` (a port 0 there makes an
    /// invalid registration: the driver sets `port_dots` to the port it bound).
    pub fn new(cfg: &RescueConfig, reg: &RegistryConfig, d_free_bytes: f64) -> Self {
        let port = reg
            .port_dots
            .or_else(|| cfg.peering.as_ref().map(|p| p.listen.port()))
            .unwrap_or(0);
        let mut registration = Registration::new(cfg, port, d_free_bytes);
        registration.domain = reg.domain.clone();
        Site {
            registration,
            d_resc_kbps: cfg.d_resc() / 1000.0,
        }
    }
}

/// What the registry handle knows: the candidates and the counts of what it did.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The candidates of the last successful search, largest d_free first.
    pub candidates: Arc<Vec<Registration>>,
    /// Searches answered.
    pub searches: u64,
    /// Searches that failed.
    pub search_failures: u64,
    /// When the last search was answered.
    pub last_search: Option<Instant>,
    /// The lease our registration is under, if we have one.
    pub lease: Option<i64>,
    /// Leases granted.
    pub leases_granted: u64,
    /// The d_free (kB/s) last written.
    pub published: Option<f64>,
    /// Lease renewals answered.
    pub keepalives: u64,
    /// Registration or renewal attempts that failed.
    pub renew_failures: u64,
}

/// A running registry client: registers this site (if given one) and searches.
///
/// Dropping it stops its tasks without withdrawing the registration, which then expires with
/// its lease, as after a crash; [`Registry::shutdown`] withdraws it at once.
pub struct Registry {
    state: watch::Sender<Snapshot>,
    d_free: watch::Sender<f64>,
    tasks: Vec<JoinHandle<()>>,
    client: Client,
    timeout: Duration,
}

impl Registry {
    /// Starts the client. Does not wait for etcd: an unreachable registry is retried in the
    /// background. `site` is None for a client that only searches.
    pub async fn start(
        cfg: &RegistryConfig,
        site: Option<Site>,
        metrics: RegistryMetrics,
    ) -> Result<Registry, Error> {
        cfg.validate()?;
        if let Some(s) = &site {
            s.registration
                .validate()
                .map_err(|e| Error::Registration(e.to_string()))?;
        }
        let opts = ConnectOptions::new()
            .with_connect_timeout(cfg.request_timeout())
            .with_timeout(cfg.request_timeout())
            .with_keep_alive(cfg.request_timeout(), cfg.request_timeout());
        let client = Client::connect(&cfg.endpoints, Some(opts)).await?;
        let (state, _) = watch::channel(Snapshot::default());
        let initial = site.as_ref().map_or(0.0, |s| s.registration.d_free_kbps);
        let (d_free, d_free_rx) = watch::channel(initial);
        let own = site
            .as_ref()
            .map(|s| s.registration.name().to_owned())
            .unwrap_or_default();
        let mut tasks = vec![tokio::spawn(search_loop(
            client.clone(),
            cfg.clone(),
            own,
            state.clone(),
            metrics.clone(),
        ))];
        if let Some(site) = site {
            tasks.push(tokio::spawn(keep_loop(
                client.clone(),
                cfg.clone(),
                site,
                d_free_rx,
                state.clone(),
                metrics,
            )));
        }
        Ok(Registry {
            state,
            d_free,
            tasks,
            client,
            timeout: cfg.request_timeout(),
        })
    }

    /// d_free changed (kB/s): re-registered at once if beyond the threshold, else with the
    /// next periodic registration.
    pub fn set_d_free(&self, d_free_kbps: f64) {
        self.d_free.send_replace(d_free_kbps);
    }

    /// The candidates of the last successful search, largest free capacity first.
    pub fn candidates(&self) -> Vec<Registration> {
        self.state.borrow().candidates.as_ref().clone()
    }

    /// The candidates as the core takes them ([`switchyard_rescue::Core::on_tick`]), largest
    /// free capacity first: `peer_of` names the peer each registration belongs to (the
    /// driver's peer table); sites that are not peers are left out.
    pub fn core_candidates(
        &self,
        peer_of: impl FnMut(&Registration) -> Option<PeerId>,
    ) -> Vec<Candidate> {
        to_candidates(&self.state.borrow().candidates, peer_of)
    }

    /// What the handle knows now.
    pub fn snapshot(&self) -> Snapshot {
        self.state.borrow().clone()
    }

    /// Changes of the snapshot (after every search and registry write), to wait on.
    pub fn subscribe(&self) -> watch::Receiver<Snapshot> {
        self.state.subscribe()
    }

    /// Stops and withdraws the registration at once (revokes its lease).
    pub async fn shutdown(mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        let lease = self.state.borrow().lease;
        if let Some(id) = lease {
            match timeout(self.timeout, self.client.lease_revoke(id)).await {
                Ok(Ok(_)) => info!(lease = id, "registry: registration withdrawn"),
                Ok(Err(e)) => {
                    warn!(lease = id, error = %e, "registry: could not revoke the lease; it expires with its TTL")
                }
                Err(_) => warn!(
                    lease = id,
                    "registry: revoking the lease timed out; it expires with its TTL"
                ),
            }
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Searches every interval; keeps the last candidates when a search fails.
async fn search_loop(
    mut client: Client,
    cfg: RegistryConfig,
    own: String,
    state: watch::Sender<Snapshot>,
    metrics: RegistryMetrics,
) {
    let mut tick = tokio::time::interval(cfg.search_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = 0u64;
    loop {
        tick.tick().await;
        let res = timeout(
            cfg.request_timeout(),
            client.get(cfg.prefix.as_bytes(), Some(GetOptions::new().with_prefix())),
        )
        .await;
        let resp = match res {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                search_failed(&state, &metrics, &mut failing, &e.to_string());
                continue;
            }
            Err(_) => {
                search_failed(&state, &metrics, &mut failing, "timed out");
                continue;
            }
        };
        let mut found = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            match Registration::decode(kv.value()) {
                Ok(r) if kv.key() == cfg.key(r.name()).as_bytes() => found.push(r),
                Ok(r) => {
                    metrics.invalid_entries.inc();
                    debug!(key = %String::from_utf8_lossy(kv.key()), name = r.name(), "registry: registration under another site's key skipped");
                }
                Err(e) => {
                    metrics.invalid_entries.inc();
                    debug!(key = %String::from_utf8_lossy(kv.key()), error = %e, "registry: invalid registration skipped");
                }
            }
        }
        let ranked = rank(found, &own, cfg.max_candidates);
        if failing > 0 {
            info!(failed = failing, "registry: searches answered again");
            failing = 0;
        }
        metrics.searches.inc();
        metrics.candidates.set(ranked.len() as i64);
        state.send_modify(|s| {
            if s.candidates.as_slice() != ranked.as_slice() {
                debug!(
                    candidates = ranked.len(),
                    best = ranked.first().map(|r| r.d_free_kbps),
                    "registry: candidates changed"
                );
            }
            s.candidates = Arc::new(ranked);
            s.searches += 1;
            s.last_search = Some(Instant::now());
        });
    }
}

fn search_failed(
    state: &watch::Sender<Snapshot>,
    metrics: &RegistryMetrics,
    failing: &mut u64,
    error: &str,
) {
    *failing += 1;
    metrics.search_failures.inc();
    let kept = state.borrow().candidates.len();
    if failing.is_power_of_two() {
        warn!(
            error,
            failures = *failing,
            kept,
            "registry: search failed; keeping the last candidates"
        );
    }
    state.send_modify(|s| s.search_failures += 1);
}

/// The lease renewal stream of the current lease.
struct Keeper {
    lease: i64,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

/// Registers, renews and re-registers as the [`Advertiser`] says.
async fn keep_loop(
    mut client: Client,
    cfg: RegistryConfig,
    site: Site,
    mut d_free: watch::Receiver<f64>,
    state: watch::Sender<Snapshot>,
    metrics: RegistryMetrics,
) {
    let start = Instant::now();
    let policy = cfg.renewal();
    let mut adv = Advertiser::new(policy, site.d_resc_kbps, site.registration.d_free_kbps);
    let key = cfg.key(site.registration.name());
    let rto = cfg.request_timeout();
    let mut backoff = Backoff::new(Duration::from_millis(100), policy.keepalive / 2);
    let mut lease: Option<i64> = None;
    let mut keeper: Option<Keeper> = None;
    loop {
        let now = start.elapsed();
        let step = adv.poll(now);
        let outcome: Result<(), String> = match step {
            Step::Idle => {
                let wake = start + adv.next_deadline(now);
                tokio::select! {
                    _ = sleep_until(wake) => {}
                    r = d_free.changed() => {
                        if r.is_err() {
                            return;
                        }
                        adv.set_d_free(*d_free.borrow_and_update());
                    }
                }
                continue;
            }
            Step::Publish {
                d_free_kbps,
                new_lease,
                reason,
            } => {
                let mut reg = site.registration.clone();
                reg.d_free_kbps = d_free_kbps;
                let res = timeout(
                    rto * 2,
                    publish(
                        &mut client,
                        &key,
                        &reg,
                        if new_lease { None } else { lease },
                        policy.ttl,
                    ),
                )
                .await
                .unwrap_or_else(|_| Err(PublishError::Other("timed out".into())));
                match res {
                    Ok((id, granted)) => {
                        adv.on_published(now, d_free_kbps, granted);
                        metrics.publishes.inc();
                        if granted.is_some() {
                            metrics.leases_granted.inc();
                            let old = lease.replace(id);
                            keeper = None;
                            if let Some(old) = old.filter(|o| *o != id) {
                                // Best effort: the old lease holds nothing any more.
                                let _ = timeout(rto, client.lease_revoke(old)).await;
                            }
                            info!(key, lease = id, ttl = ?granted, d_free_kbps, ?reason, "registry: registered under a new lease");
                        } else {
                            debug!(key, d_free_kbps, ?reason, "registry: registration written");
                        }
                        state.send_modify(|s| {
                            s.lease = lease;
                            s.published = Some(d_free_kbps);
                            s.leases_granted += u64::from(granted.is_some());
                        });
                        Ok(())
                    }
                    Err(PublishError::LeaseGone) => {
                        warn!(
                            key,
                            lease, "registry: our lease is gone; registering under a new one"
                        );
                        adv.lease_lost();
                        Err("lease not found".into())
                    }
                    Err(PublishError::Other(e)) => Err(e),
                }
            }
            Step::KeepAlive => {
                let id = lease.expect("a lease is alive when the advertiser asks to renew it");
                match timeout(rto, renew(&mut client, &mut keeper, id)).await {
                    Ok(Ok(remaining)) => {
                        adv.on_kept_alive(now, remaining);
                        metrics.keepalives.inc();
                        if remaining.is_zero() {
                            warn!(
                                key,
                                lease = id,
                                "registry: lease expired at the registry; registering again"
                            );
                            keeper = None;
                        }
                        state.send_modify(|s| s.keepalives += 1);
                        Ok(())
                    }
                    Ok(Err(e)) => {
                        keeper = None;
                        Err(e)
                    }
                    Err(_) => {
                        keeper = None;
                        Err("renewal timed out".into())
                    }
                }
            }
        };
        match outcome {
            Ok(()) => backoff.succeeded(),
            Err(e) => {
                metrics.renew_failures.inc();
                let delay = backoff.failed();
                adv.on_failure(now, delay);
                let alive = adv.lease_alive(now);
                if backoff.failures().is_power_of_two() {
                    warn!(key, error = e, failures = backoff.failures(), lease_alive = alive, retry_in = ?delay, "registry: registration or renewal failed");
                }
                state.send_modify(|s| s.renew_failures += 1);
            }
        }
    }
}

enum PublishError {
    LeaseGone,
    Other(String),
}

/// Writes `reg` under `lease`, or under a new lease when None. Answers the lease and, for a new
/// one, its granted TTL.
async fn publish(
    client: &mut Client,
    key: &str,
    reg: &Registration,
    lease: Option<i64>,
    ttl: Duration,
) -> Result<(i64, Option<Duration>), PublishError> {
    let other = |e: etcd_client::Error| PublishError::Other(e.to_string());
    let (id, granted) = match lease {
        Some(id) => (id, None),
        None => {
            let g = client
                .lease_grant(ttl.as_secs() as i64, None)
                .await
                .map_err(other)?;
            (g.id(), Some(Duration::from_secs(g.ttl().max(0) as u64)))
        }
    };
    match client
        .put(key, reg.encode(), Some(PutOptions::new().with_lease(id)))
        .await
    {
        Ok(_) => Ok((id, granted)),
        Err(e) if e.to_string().contains("lease not found") => Err(PublishError::LeaseGone),
        Err(e) => Err(other(e)),
    }
}

/// Renews `lease` on its keep-alive stream (opened first if needed). Answers the time it has
/// left (zero: the lease is gone).
async fn renew(
    client: &mut Client,
    keeper: &mut Option<Keeper>,
    lease: i64,
) -> Result<Duration, String> {
    if keeper.as_ref().is_none_or(|k| k.lease != lease) {
        // Opening the stream renews once and fails so when the lease is gone.
        let (k, s) = match client.lease_keep_alive(lease).await {
            Ok(ks) => ks,
            Err(e) if e.to_string().contains("lease not found") => return Ok(Duration::ZERO),
            Err(e) => return Err(e.to_string()),
        };
        *keeper = Some(Keeper {
            lease,
            keeper: k,
            stream: s,
        });
    }
    let k = keeper.as_mut().expect("just set");
    k.keeper.keep_alive().await.map_err(|e| e.to_string())?;
    match k.stream.message().await {
        Ok(Some(resp)) => Ok(Duration::from_secs(resp.ttl().max(0) as u64)),
        Ok(None) => Err("keep-alive stream closed".into()),
        Err(e) => Err(e.to_string()),
    }
}
