//! Property and workload tests across policies.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{AgingCounter, Cache, Gdsf, GdsfCost, InsertOutcome, LfuAging, PolicyKind};

#[derive(Clone, Debug)]
enum Op {
    Get(u8),
    Insert(u8, u64),
    Remove(u8),
    AddRefs(u8, u64),
    Advance(u64),
    Tick,
    SetCapacity(u64),
    MaxObject(Option<u64>),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..24;
    prop_oneof![
        6 => key.clone().prop_map(Op::Get),
        6 => (key.clone(), 0u64..70).prop_map(|(k, s)| Op::Insert(k, s)),
        1 => key.clone().prop_map(Op::Remove),
        1 => (key, 0u64..5).prop_map(|(k, n)| Op::AddRefs(k, n)),
        2 => (0u64..3_000).prop_map(Op::Advance),
        1 => Just(Op::Tick),
        1 => (0u64..200).prop_map(Op::SetCapacity),
        1 => proptest::option::of(0u64..80).prop_map(Op::MaxObject),
    ]
}

/// Value stored per key: (key, size, version) so stale values show up.
type Val = (u8, u64, u32);

fn make(policy: usize, capacity: u64) -> Cache<u8, Val> {
    match policy {
        0 => Cache::with_kind(capacity, PolicyKind::Lru),
        1 => Cache::with_kind(
            capacity,
            PolicyKind::Lfu {
                aging_interval_ms: 1_000,
                aging_factor: 0.5,
            },
        ),
        2 => Cache::new(capacity, Box::new(LfuAging::without_aging())),
        3 => Cache::with_kind(
            capacity,
            PolicyKind::Lfu {
                aging_interval_ms: 700,
                aging_factor: 0.0,
            },
        ),
        4 => Cache::with_kind(capacity, PolicyKind::Gdsf),
        _ => Cache::new(capacity, Box::new(Gdsf::with_cost(GdsfCost::Packets))),
    }
}

const POLICIES: usize = 6;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Under arbitrary operations, for every policy: never over budget,
    /// contents match a model of what was inserted/evicted/removed, stats
    /// are consistent, and the policy tracks exactly the stored keys.
    #[test]
    fn budget_stats_and_contents(
        policy in 0..POLICIES,
        capacity in 0u64..200,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let mut c = make(policy, capacity);
        let mut model: HashMap<u8, Val> = HashMap::new();
        let mut now = Duration::ZERO;
        let (mut gets, mut hits, mut version) = (0u64, 0u64, 0u32);
        let (mut evictions, mut rejections, mut insertions) = (0u64, 0u64, 0u64);
        for op in ops {
            match op {
                Op::Get(k) => {
                    gets += 1;
                    let got = c.get(&k, now).copied();
                    prop_assert_eq!(got, model.get(&k).copied());
                    hits += u64::from(got.is_some());
                }
                Op::Insert(k, size) => {
                    version += 1;
                    let v = (k, size, version);
                    let too_big = size > c.capacity_bytes()
                        || c.max_object_bytes().is_some_and(|m| size > m);
                    match c.insert(k, v, size, now) {
                        InsertOutcome::Inserted { replaced, evicted } => {
                            prop_assert!(!too_big);
                            insertions += 1;
                            prop_assert_eq!(replaced, model.get(&k).copied());
                            for (ek, ev) in evicted {
                                prop_assert_ne!(ek, k);
                                prop_assert_eq!(model.remove(&ek), Some(ev));
                                evictions += 1;
                            }
                            model.insert(k, v);
                        }
                        InsertOutcome::Rejected { key, value, .. } => {
                            prop_assert!(too_big);
                            prop_assert_eq!((key, value), (k, v));
                            rejections += 1;
                        }
                    }
                }
                Op::Remove(k) => prop_assert_eq!(c.remove(&k), model.remove(&k)),
                Op::AddRefs(k, n) => {
                    prop_assert_eq!(c.add_references(&k, n, now), model.contains_key(&k));
                }
                Op::Advance(ms) => now += Duration::from_millis(ms),
                Op::Tick => c.tick(now),
                Op::SetCapacity(cap) => {
                    for (ek, ev) in c.set_capacity(cap, now) {
                        prop_assert_eq!(model.remove(&ek), Some(ev));
                        evictions += 1;
                    }
                }
                Op::MaxObject(m) => c.set_max_object_bytes(m),
            }
            prop_assert!(c.used_bytes() <= c.capacity_bytes());
            let bytes: u64 = model.values().map(|v| v.1).sum();
            let s = c.stats();
            prop_assert_eq!(s.bytes, bytes);
            prop_assert_eq!(c.used_bytes(), bytes);
            prop_assert_eq!(s.objects as usize, model.len());
            prop_assert_eq!(c.len(), model.len());
            prop_assert_eq!(s.hits + s.misses, gets);
            prop_assert_eq!(s.hits, hits);
            prop_assert_eq!(
                (s.evictions, s.rejections, s.insertions),
                (evictions, rejections, insertions)
            );
            for (k, v) in &model {
                prop_assert_eq!(c.peek(k), Some(v));
            }
        }
        // The policy tracks exactly the stored keys, each once.
        let stored: HashSet<u8> = c.keys().copied().collect();
        let mut named = HashSet::new();
        while let Some(k) = c.policy_mut().victim() {
            prop_assert!(named.insert(k), "key {} named twice", k);
        }
        prop_assert_eq!(named, stored);
    }

    /// LRU against a naive Vec model (front = least recently used).
    #[test]
    fn lru_matches_naive_model(
        capacity in 1u64..120,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let mut c: Cache<u8, u64> = Cache::with_kind(capacity, PolicyKind::Lru);
        let mut model: Vec<(u8, u64)> = Vec::new();
        let mut cap = capacity;
        let now = Duration::ZERO;
        let touch = |m: &mut Vec<(u8, u64)>, k: u8| {
            if let Some(i) = m.iter().position(|e| e.0 == k) {
                let e = m.remove(i);
                m.push(e);
                true
            } else {
                false
            }
        };
        for op in ops {
            match op {
                Op::Get(k) => {
                    let hit = touch(&mut model, k);
                    prop_assert_eq!(c.get(&k, now).is_some(), hit);
                }
                Op::Insert(k, size) => {
                    let out = c.insert(k, size, size, now);
                    if size > cap {
                        prop_assert!(out.is_rejected());
                        continue;
                    }
                    model.retain(|e| e.0 != k);
                    let mut want = Vec::new();
                    while model.iter().map(|e| e.1).sum::<u64>() + size > cap {
                        want.push(model.remove(0));
                    }
                    model.push((k, size));
                    prop_assert_eq!(out.into_evicted(), want);
                }
                Op::Remove(k) => {
                    let i = model.iter().position(|e| e.0 == k);
                    let want = i.map(|i| model.remove(i).1);
                    prop_assert_eq!(c.remove(&k), want);
                }
                Op::AddRefs(k, n) => {
                    if n > 0 {
                        touch(&mut model, k);
                    }
                    c.add_references(&k, n, now);
                }
                Op::SetCapacity(new_cap) => {
                    cap = new_cap;
                    let mut want = Vec::new();
                    while model.iter().map(|e| e.1).sum::<u64>() > cap {
                        want.push(model.remove(0));
                    }
                    prop_assert_eq!(c.set_capacity(cap, now), want);
                }
                Op::Advance(_) | Op::Tick | Op::MaxObject(_) => {}
            }
        }
        // Final order: the policy names victims in the model's order.
        let order: Vec<u8> = std::iter::from_fn(|| c.policy_mut().victim()).collect();
        prop_assert_eq!(order, model.iter().map(|e| e.0).collect::<Vec<_>>());
    }

    /// AgingCounter never tracks more than its bound, and with factor 0.5
    /// (exact in binary) matches a naive model that ages every count
    /// eagerly and forgets the coldest (then least recent) key when full.
    #[test]
    fn aging_counter_bounded_and_exact(
        max_keys in 1usize..8,
        ops in proptest::collection::vec(
            prop_oneof![
                4 => (0u8..20, 0u64..10).prop_map(|(k, n)| (0u8, k, n)),
                1 => (0u8..20).prop_map(|k| (1u8, k, 0)),
                2 => (0u64..2_500).prop_map(|ms| (2u8, 0, ms)),
            ],
            1..200,
        ),
    ) {
        let interval = Duration::from_millis(1_000);
        let mut c: AgingCounter<u8> = AgingCounter::new(interval, 0.5, max_keys);
        // key -> (count, last reference sequence)
        let mut model: HashMap<u8, (f64, u64)> = HashMap::new();
        let mut now = Duration::ZERO;
        let mut origin: Option<Duration> = None;
        let mut applied = 0u32;
        let mut seq = 0u64;
        for (kind, k, arg) in ops {
            match kind {
                0 => {
                    let o = *origin.get_or_insert(now);
                    let due = ((now - o).as_millis() / 1_000) as u32;
                    for e in model.values_mut() {
                        e.0 *= 0.5f64.powi((due - applied) as i32);
                    }
                    applied = due;
                    if !model.contains_key(&k) && model.len() >= max_keys {
                        let coldest = *model
                            .iter()
                            .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0).then(a.1 .1.cmp(&b.1 .1)))
                            .unwrap()
                            .0;
                        model.remove(&coldest);
                    }
                    seq += 1;
                    let e = model.entry(k).or_insert((0.0, 0));
                    e.0 += arg as f64;
                    e.1 = seq;
                    let got = c.record(&k, arg, now);
                    prop_assert_eq!(got, e.0);
                }
                1 => {
                    prop_assert_eq!(c.remove(&k).is_some(), model.remove(&k).is_some());
                }
                _ => now += Duration::from_millis(arg),
            }
            prop_assert!(c.len() <= max_keys);
            prop_assert_eq!(c.len(), model.len());
            let pending = origin.map_or(0, |o| ((now - o).as_millis() / 1_000) as u32 - applied);
            for k in 0..20u8 {
                let want = model.get(&k).map_or(0.0, |e| e.0 * 0.5f64.powi(pending as i32));
                prop_assert_eq!(c.count(&k, now), want, "key {}", k);
            }
        }
    }
}

/// One cache slot per object: capacity 2 objects, a formerly hot object and
/// a stream of newcomers that each get a few hits.
fn formerly_hot_survives(factor: f64) -> bool {
    let mut c: Cache<u32, ()> = Cache::with_kind(
        2,
        PolicyKind::Lfu {
            aging_interval_ms: 10_000,
            aging_factor: factor,
        },
    );
    let _ = c.insert(0, (), 1, Duration::ZERO);
    for _ in 0..100 {
        c.get(&0, Duration::ZERO);
    }
    for i in 1..=300u32 {
        let now = Duration::from_secs(u64::from(i));
        let _ = c.insert(i, (), 1, now);
        for _ in 0..3 {
            c.get(&i, now);
        }
        if !c.contains(&0) {
            return false;
        }
    }
    true
}

#[test]
fn lfu_aging_evicts_formerly_hot_object() {
    assert!(
        formerly_hot_survives(1.0),
        "without aging the hot object stays"
    );
    assert!(
        !formerly_hot_survives(0.5),
        "with aging it is eventually replaced"
    );
}

/// Skewed (Zipf 0.9) workload over objects whose popularity is independent
/// of size; 80 % are small (1–8 KiB), 20 % large (64–512 KiB). Returns
/// (overall hit rate, small-object hit rate).
fn skewed_run(kind: PolicyKind, seed: u64) -> (f64, f64) {
    const N: usize = 2_000;
    const REQUESTS: usize = 60_000;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let sizes: Vec<u64> = (0..N)
        .map(|_| {
            if rng.random_bool(0.8) {
                rng.random_range(1_024..8_192)
            } else {
                rng.random_range(65_536..524_288)
            }
        })
        .collect();
    let total: u64 = sizes.iter().sum();
    let mut cdf = Vec::with_capacity(N);
    let mut acc = 0.0;
    for rank in 1..=N {
        acc += 1.0 / (rank as f64).powf(0.9);
        cdf.push(acc);
    }
    let mut c: Cache<usize, ()> = Cache::with_kind(total / 20, kind);
    let (mut small, mut small_hits, mut hits) = (0u64, 0u64, 0u64);
    for i in 0..REQUESTS {
        let u = rng.random::<f64>() * acc;
        let obj = cdf.partition_point(|&x| x < u).min(N - 1);
        let now = Duration::from_millis(i as u64);
        let hit = c.get(&obj, now).is_some();
        if !hit {
            let _ = c.insert(obj, (), sizes[obj], now);
        }
        hits += u64::from(hit);
        if sizes[obj] < 65_536 {
            small += 1;
            small_hits += u64::from(hit);
        }
        assert!(c.used_bytes() <= c.capacity_bytes());
    }
    (
        hits as f64 / REQUESTS as f64,
        small_hits as f64 / small as f64,
    )
}

#[test]
fn gdsf_beats_lru_on_small_hot_objects() {
    for seed in [1, 2, 3] {
        let (lru_all, lru_small) = skewed_run(PolicyKind::Lru, seed);
        let (gdsf_all, gdsf_small) = skewed_run(PolicyKind::Gdsf, seed);
        assert!(
            gdsf_small > lru_small + 0.2,
            "seed {seed}: small-object hit rate gdsf {gdsf_small:.3} vs lru {lru_small:.3}"
        );
        assert!(
            gdsf_all > lru_all + 0.1,
            "seed {seed}: hit rate gdsf {gdsf_all:.3} vs lru {lru_all:.3}"
        );
    }
}
