//! A cooperative cluster's sample, put together by any member from every member's
//! [`MemberSample`] (its own, and those its peers serve at `/member.json`). Pure: what was
//! fetched, and when, comes in as values.
//!
//! A member whose figures could not be fetched this time is shown down with the last figures
//! known of it: its rates read zero while it is away, and its counters do not seem to jump when
//! it answers again.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::{latency, ClusterSample, CoopSample, HotCount, NodeSample, HOT_LISTED};
use crate::cluster::MemberSample;

/// One member as the aggregating member sees it now.
#[derive(Clone, Debug)]
pub struct MemberView<'a> {
    /// Its name.
    pub name: &'a str,
    /// In service: its control connection is up (always, for the member itself) and it
    /// answered this time.
    pub up: bool,
    /// Its figures: fresh when it answered, else the last known (`None`: never known).
    pub sample: Option<&'a MemberSample>,
}

/// The kind of mechanism a cooperative cluster uses: connections cloned to their owners.
pub const MECHANISM: &str = "clone";

/// The whole cluster at `at`, from its members' views; `me` is the aggregating member's index
/// (its owner map's table sizes are the cluster's: every member computes the same map).
pub fn cluster_sample(
    at: Duration,
    generation: u64,
    policy: &str,
    members: &[MemberView<'_>],
    me: usize,
) -> ClusterSample {
    let index: HashMap<&str, u32> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.name, i as u32))
        .collect();
    let mut fallbacks: BTreeMap<String, u64> = BTreeMap::new();
    let mut hot: HashMap<&str, (u32, u64)> = HashMap::new();
    let mut connections = 0;
    let nodes = members
        .iter()
        .map(|m| {
            let mut n = NodeSample::new(m.name);
            n.up = m.up;
            let Some(s) = m.sample else {
                return n;
            };
            for (reason, v) in &s.fallbacks {
                *fallbacks.entry(reason.clone()).or_default() += v;
            }
            if m.up {
                connections += s.connections;
                for (target, owner, count) in &s.hot {
                    let e = hot
                        .entry(target.as_str())
                        .or_insert((index.get(owner.as_str()).copied().unwrap_or(u32::MAX), 0));
                    e.1 += count;
                }
            }
            let mut lat = [0u64; latency::BUCKETS];
            for (b, v) in lat.iter_mut().zip(&s.latency) {
                *b = *v;
            }
            NodeSample {
                requests: s.requests,
                bytes: s.bytes,
                in_flight: if m.up { s.connections } else { 0 },
                connections: Some(if m.up { s.connections } else { 0 }),
                load: s.load,
                moves: s.clones_in,
                fallbacks: s.fallbacks.values().sum(),
                failures: s.clones_lost,
                targets: s.targets,
                cache_reported: s.cache_lookups,
                hits: s.cache_hits,
                latency: lat,
                coop: Some(CoopSample {
                    hand_backs: s.hand_backs,
                    replicas: s.replicas,
                }),
                ..n
            }
        })
        .collect();
    let mut hot: Vec<HotCount> = hot
        .into_iter()
        .map(|(target, (node, count))| HotCount {
            target: target.to_owned(),
            node,
            count,
            error: 0,
        })
        .collect();
    hot.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.target.cmp(&b.target)));
    hot.truncate(HOT_LISTED);
    let own = members.get(me).and_then(|m| m.sample);
    ClusterSample {
        at,
        generation,
        policy: policy.to_owned(),
        mechanism: MECHANISM.to_owned(),
        connections,
        queue: 0,
        fallbacks,
        targets_mapped: own.map_or(0, |s| s.targets_mapped),
        replicas: own.map_or(0, |s| s.map_replicas),
        hot,
        nodes,
        rescue: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Num, Sampler, State, Update, COOPERATIVE};
    use super::*;

    fn member(name: &str, k: u64) -> MemberSample {
        MemberSample {
            name: name.into(),
            requests: 100 * k,
            bytes: 10_000 * k,
            connections: 3,
            load: 2.0,
            targets: 0,
            clones_in: 10 * k,
            hand_backs: 9 * k,
            clones_lost: 2 * k,
            fallbacks: [("control_down".to_owned(), k)].into_iter().collect(),
            cache_lookups: 50 * k,
            cache_hits: 40 * k,
            latency: vec![0, 0, 0, 5 * k],
            replicas: Some(4),
            targets_mapped: 0,
            map_replicas: 0,
            hot: vec![("/a".into(), "n1".into(), 7), ("/b".into(), "n0".into(), 2)],
        }
    }

    #[test]
    fn members_become_rows_and_the_hot_targets_add_up() {
        let (a, b) = (member("n0", 1), member("n1", 1));
        let views = [
            MemberView {
                name: "n0",
                up: true,
                sample: Some(&a),
            },
            MemberView {
                name: "n1",
                up: true,
                sample: Some(&b),
            },
            MemberView {
                name: "n2",
                up: false,
                sample: None,
            },
        ];
        let s = cluster_sample(Duration::from_secs(1), 1, "chash", &views, 0);
        assert_eq!(s.mechanism, "clone");
        assert_eq!(s.connections, 6);
        assert_eq!(s.fallbacks["control_down"], 2);
        assert_eq!(s.hot[0].target, "/a");
        assert_eq!((s.hot[0].node, s.hot[0].count), (1, 14));
        assert_eq!((s.hot[1].node, s.hot[1].count), (0, 4));
        assert_eq!(s.nodes[0].moves, 10);
        assert_eq!(s.nodes[0].latency[3], 5);
        assert!(!s.nodes[2].up && s.nodes[2].coop.is_none());
    }

    #[test]
    fn rates_follow_the_members_and_a_member_away_reads_zero_without_a_jump() {
        let mut sampler = Sampler::new(COOPERATIVE, Duration::from_secs(1), Duration::from_secs(5));
        let step = |sampler: &mut Sampler, t: u64, k: [u64; 2], up1: bool| {
            let (a, b) = (member("n0", k[0]), member("n1", k[1]));
            let views = [
                MemberView {
                    name: "n0",
                    up: true,
                    sample: Some(&a),
                },
                MemberView {
                    name: "n1",
                    up: up1,
                    sample: Some(&b),
                },
            ];
            sampler.step(&cluster_sample(
                Duration::from_secs(t),
                1,
                "chash",
                &views,
                0,
            ))
        };
        let first = step(&mut sampler, 1, [1, 1], true);
        assert_eq!(first.meta.cols.last().map(String::as_str), Some("replicas"));
        let u = step(&mut sampler, 2, [3, 2], true).update;
        assert_eq!(u.n[0].rps, Num(200.0));
        assert_eq!(u.n[0].moves, Num(20.0), "clones taken per second");
        assert_eq!(u.n[0].coop.unwrap().replicas, Some(4));
        assert_eq!(u.n[0].failures, Num(4.0), "clones lost per second");
        assert_eq!(
            u.c.backs,
            Some(Num(27.0)),
            "hand-backs per second, all members"
        );
        assert_eq!(u.n[0].hit, Some(Num(80.0)));
        assert_eq!(u.n[1].rps, Num(100.0));
        // n1 stops answering: shown down with its last figures, zero rates.
        let u = step(&mut sampler, 3, [4, 2], false).update;
        assert_eq!(u.n[1].state, State::Down);
        assert_eq!(u.n[1].rps, Num(0.0));
        // Back with more requests: the rate covers only the time since the last figures.
        let u = step(&mut sampler, 4, [5, 3], true).update;
        assert_eq!(u.n[1].rps, Num(100.0));
        let text = serde_json::to_string(&u).unwrap();
        let back: Update = serde_json::from_str(&text).unwrap();
        assert_eq!(back, u);
    }

    /// The update of a busy 64-member cooperative cluster encodes under 4 KB. Members of a
    /// cooperative cluster share one host (connections travel between them as descriptors), so
    /// busy here is that host's busy: about 63,000 requests/s and 630 MB/s over the 64
    /// members, each with hundreds of connections, of clones, hand-backs and replicas, a
    /// slow tail, fallbacks and lost clones every second, every fallback reason, a `lard`
    /// owner map with thousands of targets each, one member down, and the hot targets at the
    /// longest kept length.
    #[test]
    fn an_update_for_64_busy_members_is_under_4_kb() {
        let mut sampler = Sampler::new(COOPERATIVE, Duration::from_secs(1), Duration::from_secs(5));
        let names: Vec<String> = (0..64).map(|i| format!("node-{i:02}")).collect();
        let busy = |k: u64| -> Vec<MemberSample> {
            (0..64u64)
                .map(|i| {
                    let h = super::super::LatencyHistogram::default();
                    for j in 0..(20 * k) {
                        h.observe(Duration::from_micros(700 + 13 * (j % 97) + i));
                    }
                    h.observe(Duration::from_millis(4321));
                    MemberSample {
                        name: names[i as usize].clone(),
                        requests: k * 987 + i,
                        bytes: k * 9_876_543,
                        connections: 987,
                        load: 98.76,
                        targets: 9_876,
                        clones_in: k * 654,
                        hand_backs: k * 643,
                        clones_lost: k * 3,
                        fallbacks: [
                            "control_down",
                            "too_much_read",
                            "no_descriptor",
                            "refused",
                            "control_ended",
                        ]
                        .iter()
                        .map(|r| ((*r).to_owned(), 987_654 + k))
                        .collect(),
                        cache_lookups: k * 987 + i,
                        cache_hits: k * 900 + i,
                        latency: h.snapshot().to_vec(),
                        replicas: Some(987),
                        targets_mapped: 987_654,
                        map_replicas: 98_765,
                        hot: (0..5)
                            .map(|t| {
                                (
                                    format!(
                                        "/objects/{}{t}.bin",
                                        "x".repeat(super::super::hot::MAX_TARGET_BYTES - 14)
                                    ),
                                    names[63].clone(),
                                    12_345 * k,
                                )
                            })
                            .collect(),
                    }
                })
                .collect()
        };
        let at = |k: u64| {
            let samples = busy(k);
            let views: Vec<MemberView> = samples
                .iter()
                .enumerate()
                .map(|(i, s)| MemberView {
                    name: &names[i],
                    up: i != 5,
                    sample: Some(s),
                })
                .collect();
            cluster_sample(
                Duration::from_secs_f64(86_400.0 + k as f64 * 1.0003),
                1,
                "chash",
                &views,
                0,
            )
        };
        sampler.step(&at(1));
        let u = sampler.step(&at(2)).update;
        let text = serde_json::to_string(&u).unwrap();
        assert!(text.len() < 4096, "{} bytes: {text}", text.len());
        assert_eq!(u.n.len(), 64);
        assert!(u.n[0].coop.is_some() && u.n[0].p99.is_some() && u.n[0].rps.0 > 900.0);
        assert!(u.c.rps.0 > 60_000.0 && u.c.backs.is_some_and(|b| b.0 > 40_000.0));
        assert_eq!(u.map.hot.len(), HOT_LISTED);
        let back: Update = serde_json::from_str(&text).unwrap();
        assert_eq!(back.n.len(), 64);
        assert_eq!(back.n[5].state, State::Down);
        assert_eq!(back.n[0].coop.unwrap().replicas, Some(987));
    }
}
