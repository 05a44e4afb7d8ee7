//! The switch's live dashboard: once a second one task samples the switch's counters
//! ([`sample`]), turns them into an update with the pure [`Sampler`] of `switchyard-admin` and
//! publishes it to the page's viewers (`/events`), to `/dashboard.json` and to
//! `switchyard status`. Viewers never touch the switch's state: each update is built once.
//! With `[rescue.peering]` each update carries the site's rescue state from the driver.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use switchyard_admin::dashboard::feed::Publisher;
use switchyard_admin::dashboard::{ClusterSample, HotTargets, NodeSample, Sampler, HOT_LISTED};
use tokio::sync::watch;

use crate::state::Shared;

/// Time between two updates.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
/// Response-time quantiles cover this much of the recent past.
pub(crate) const LATENCY_WINDOW: Duration = Duration::from_secs(5);
/// Updates a new viewer gets at once (the charts' history: five minutes).
pub(crate) const HISTORY: usize = 300;
/// Targets the hot-target counter keeps track of between two samples.
pub(crate) const HOT_CAPACITY: usize = 64;

/// The switch's counters now, as the dashboard's sampler takes them.
pub(crate) fn sample(shared: &Shared) -> ClusterSample {
    let g = shared.current();
    let stats = g.policy.lock().stats();
    let mut counters: Vec<_> = shared.hot.iter().map(|c| c.lock()).collect();
    let hot = HotTargets::take_merged(counters.iter_mut().map(|c| &mut **c), HOT_LISTED);
    drop(counters);
    let h = &shared.handoffs;
    let nodes = g
        .nodes
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let ns = stats.nodes.get(i);
            let (cache_reported, hits) = b.cache_counts();
            NodeSample {
                name: b.label.clone(),
                up: b.is_up(),
                held: b.hold(),
                requests: b.requests(),
                bytes: b.bytes(),
                in_flight: b.active.load(Relaxed),
                connections: b
                    .last_report
                    .lock()
                    .map(|r| u64::from(r.active_connections)),
                load: ns.map_or(0.0, |n| n.load),
                moves: b.handoffs.load(Relaxed),
                fallbacks: b.fallbacks.load(Relaxed),
                failures: b.failures.load(Relaxed),
                targets: ns.map_or(0, |n| n.targets),
                cache_reported,
                hits,
                latency: b.latency(),
                coop: None,
            }
        })
        .collect();
    ClusterSample {
        at: shared.now(),
        generation: g.id,
        policy: stats.policy.to_owned(),
        mechanism: g.cfg.mechanism.to_string(),
        connections: shared.metrics.connections_active.load(Relaxed),
        queue: shared.queue_len.load(Relaxed) as u64,
        fallbacks: h
            .fallbacks()
            .map(|(reason, n)| (reason.to_owned(), n))
            .collect(),
        targets_mapped: stats.targets_mapped,
        replicas: stats.replicas,
        hot,
        nodes,
        rescue: shared.rescue.as_ref().map(|r| r.driver.status()),
    }
}

/// Sample and publish every [`INTERVAL`] until `stop` turns true.
pub(crate) async fn run(
    shared: Arc<Shared>,
    mut publisher: Publisher,
    mut stop: watch::Receiver<bool>,
) {
    let mut sampler = Sampler::new("switch", INTERVAL, LATENCY_WINDOW);
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => if *stop.borrow() { return },
        }
        let step = sampler.step(&sample(&shared));
        publisher.publish(&step);
    }
}
