//! A cooperative member's live dashboard: one page for the whole cluster on every member's
//! admin listener (`/`, `/events`, `/dashboard.json`), the same page, sampler and feed as the
//! switch's (`switchyard_admin::dashboard`).
//!
//! Every member serves its own cumulative figures at `/member.json`
//! ([`switchyard_admin::cluster::MemberSample`]). Once a second, while someone watches (a
//! viewer on `/events`, or `/dashboard.json` asked since the last round), a member fetches
//! its peers' figures from their admin listeners (`[cluster.admin]`), all at once, each with
//! [`FETCH_TIMEOUT`]: a member that does not answer in time is shown down (with its last known
//! figures), and never holds the others up. The round's figures become one cluster update
//! (`switchyard_admin::dashboard::coop`).
//!
//! Why fetching cumulative figures rather than a stream from each member: a member needs no
//! state about who watches it, a fetch that fails loses nothing (the next one carries the
//! counts), a member that restarts is picked up on the next round, and the cost is paid only
//! while a person or script watches: one small GET per peer per second.
//!
//! With `[rescue.peering]` each update carries the site's rescue state from this member's
//! driver. A node outside a cluster that runs a rescue driver serves the same page about
//! itself alone ([`run_alone`], kind [`ALONE`]): its own figures and its site's rescue.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_admin::cluster::MemberSample;
use switchyard_admin::dashboard::coop::{cluster_sample, MemberView};
use switchyard_admin::dashboard::feed::Publisher;
use switchyard_admin::dashboard::{ClusterSample, LatencyCounts, NodeSample, Sampler, COOPERATIVE};
use switchyard_rescue_driver::StatusSource;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::coop::Membership;
use crate::metrics::NodeMetrics;
use crate::store::Store;

/// Time between two updates.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
/// Response-time quantiles cover this much of the recent past.
pub(crate) const LATENCY_WINDOW: Duration = Duration::from_secs(5);
/// Updates a new viewer gets at once (five minutes).
pub(crate) const HISTORY: usize = 300;
/// Viewers served at once.
pub(crate) const VIEWERS: usize = 64;
/// How long a peer's `/member.json` may take.
pub(crate) const FETCH_TIMEOUT: Duration = Duration::from_millis(500);
/// The largest `/member.json` read.
const MAX_BODY: u64 = 64 * 1024;

/// Fetch `/member.json` from a member's admin listener.
pub(crate) async fn fetch(addr: SocketAddr) -> Result<MemberSample, String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let req = format!("GET /member.json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(4096);
    s.take(MAX_BODY)
        .read_to_end(&mut buf)
        .await
        .map_err(|e| e.to_string())?;
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut r = httparse::Response::new(&mut headers);
    let head = match r.parse(&buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err("truncated response".into()),
        Err(e) => return Err(e.to_string()),
    };
    if r.code != Some(200) {
        return Err(format!("status {:?}", r.code));
    }
    serde_json::from_slice(&buf[head..]).map_err(|e| e.to_string())
}

/// Sample and publish every [`INTERVAL`] until `stop` turns true; `asked` is set by
/// `/dashboard.json`.
pub(crate) async fn run(
    members: Arc<Membership>,
    metrics: Arc<NodeMetrics>,
    store: Arc<Store>,
    rescue: Option<StatusSource>,
    mut publisher: Publisher,
    asked: Arc<AtomicBool>,
    mut stop: watch::Receiver<bool>,
) {
    let origin = Instant::now();
    let mut sampler = Sampler::new(COOPERATIVE, INTERVAL, LATENCY_WINDOW);
    let mut known: HashMap<String, MemberSample> = HashMap::new();
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => if *stop.borrow() { return },
        }
        let c = members.current();
        c.rotate_hot();
        if publisher.viewers() == 0 && !asked.swap(false, Relaxed) {
            continue;
        }
        let mut fetches = tokio::task::JoinSet::new();
        for (i, addr) in c.admins.iter().enumerate() {
            if let (Some(addr), false) = (*addr, i == c.me()) {
                fetches.spawn(async move {
                    (i, tokio::time::timeout(FETCH_TIMEOUT, fetch(addr)).await)
                });
            }
        }
        let mut answered = vec![false; c.names().len()];
        answered[c.me()] = true;
        known.insert(c.name().to_owned(), c.member_sample(&metrics, &store));
        while let Some(r) = fetches.join_next().await {
            let Ok((i, r)) = r else { continue };
            match r {
                Ok(Ok(s)) if s.name == c.names()[i] => {
                    answered[i] = true;
                    known.insert(s.name.clone(), s);
                }
                Ok(Ok(s)) => {
                    tracing::debug!(member = %c.names()[i], answered = %s.name, "a member's admin listener answers under another name");
                }
                Ok(Err(e)) => {
                    tracing::debug!(member = %c.names()[i], error = %e, "member figures not fetched")
                }
                Err(_) => {
                    tracing::debug!(member = %c.names()[i], "member figures not fetched in time")
                }
            }
        }
        known.retain(|name, _| c.names().contains(name));
        let views: Vec<MemberView> = c
            .names()
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let link_up = c.peer(i).is_none_or(|p| p.is_up());
                // A member without an admin listener in the table shows its link's state.
                let heard = answered[i] || c.admins[i].is_none();
                MemberView {
                    name,
                    up: link_up && heard,
                    sample: known.get(name),
                }
            })
            .collect();
        let mut sample = cluster_sample(
            origin.elapsed(),
            members.generation(),
            c.policy_name(),
            &views,
            c.me(),
        );
        sample.rescue = rescue.as_ref().and_then(StatusSource::status);
        publisher.publish(&sampler.step(&sample));
    }
}

/// The kind of a node's feed about itself alone.
pub(crate) const ALONE: &str = "node";

/// A node outside a cluster as the dashboard's sampler takes it: its own counters as the one
/// row, its rescue driver's state as the rescue part.
pub(crate) fn alone_sample(
    at: Duration,
    name: &str,
    metrics: &NodeMetrics,
    store: &Store,
    rescue: &StatusSource,
) -> ClusterSample {
    let cache = store.cache_stats();
    let connections = metrics.connections_active.load(Relaxed);
    let latency: LatencyCounts = metrics.response_times().counts;
    ClusterSample {
        at,
        generation: 1,
        policy: "none".to_owned(),
        mechanism: "direct".to_owned(),
        connections,
        queue: 0,
        fallbacks: Default::default(),
        targets_mapped: 0,
        replicas: 0,
        hot: Vec::new(),
        nodes: vec![NodeSample {
            requests: metrics.responses(),
            bytes: metrics.bytes_out(),
            in_flight: connections,
            connections: Some(connections),
            cache_reported: cache.hits + cache.misses,
            hits: cache.hits,
            latency,
            ..NodeSample::new(name)
        }],
        rescue: rescue.status(),
    }
}

/// A node alone: sample and publish every [`INTERVAL`] until `stop` turns true.
pub(crate) async fn run_alone(
    name: String,
    metrics: Arc<NodeMetrics>,
    store: Arc<Store>,
    rescue: StatusSource,
    mut publisher: Publisher,
    mut stop: watch::Receiver<bool>,
) {
    let origin = Instant::now();
    let mut sampler = Sampler::new(ALONE, INTERVAL, LATENCY_WINDOW);
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => if *stop.borrow() { return },
        }
        let sample = alone_sample(origin.elapsed(), &name, &metrics, &store, &rescue);
        publisher.publish(&sampler.step(&sample));
    }
}
