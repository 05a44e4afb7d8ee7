//! Property tests: each policy's promise, checked against an independent model.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use proptest::prelude::*;
use switchyard_policy::{
    build, ClassSpec, ConnId, Decision, LoadReport, NodeId, NodeSpec, Outcome, Policy,
    PolicyConfig, PolicyKind, Reject, Request,
};

const T0: Duration = Duration::ZERO;

fn nodes(n: u32) -> Vec<NodeSpec> {
    (0..n).map(NodeSpec::new).collect()
}

fn make(cfg: &PolicyConfig, specs: &[NodeSpec]) -> Box<dyn Policy> {
    let mut p = build(cfg).unwrap();
    p.init(specs, T0).unwrap();
    p
}

fn target(i: usize) -> String {
    format!("/t/{i}.html")
}

fn ok() -> Outcome {
    Outcome::ok(200, 100, true)
}

/// Operations on a policy for the model-based tests.
#[derive(Debug, Clone)]
enum Op {
    /// Select target `t` (index into a small set) on connection `c`.
    Select { t: usize, c: u64 },
    /// Finish the `i`-th (mod len) outstanding request.
    Complete(usize),
    /// Take node `i` (mod n) down.
    Down(usize),
    /// Bring node `i` (mod n) up.
    Up(usize),
    /// End connection `c`.
    End(u64),
    /// Node `i` (mod n) reports this disk queue.
    Disk(usize, u32),
}

fn op(targets: usize, updown: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..targets, 0u64..4).prop_map(|(t, c)| Op::Select { t, c }),
        5 => any::<usize>().prop_map(Op::Complete),
        updown => any::<usize>().prop_map(Op::Down),
        updown => any::<usize>().prop_map(Op::Up),
        1 => (0u64..4).prop_map(Op::End),
        1 => (any::<usize>(), 0u32..10).prop_map(|(i, q)| Op::Disk(i, q)),
    ]
}

// ---------------------------------------------------------------- rr / wrr

proptest! {
    #[test]
    fn rr_exact_proportions_over_cycles(n in 1u32..9, cycles in 1usize..5, down in proptest::collection::vec(any::<bool>(), 9)) {
        let mut p = make(&PolicyConfig::new(PolicyKind::Rr), &nodes(n));
        let mut up: Vec<u32> = (0..n).filter(|&i| !down[i as usize]).collect();
        if up.is_empty() { up.push(0); }
        for i in 0..n { if !up.contains(&i) { p.node_down(NodeId(i), T0); } }
        let k = up.len();
        let picks: Vec<u32> = (0..k * cycles)
            .map(|j| p.select(&Request::get(ConnId(j as u64), &target(j)), T0).unwrap().node().0)
            .collect();
        for &u in &up {
            prop_assert_eq!(picks.iter().filter(|&&x| x == u).count(), cycles);
        }
        for w in picks.windows(k + 1) { prop_assert_eq!(w[0], w[k]); }
    }

    #[test]
    fn wrr_exact_proportions_in_every_window(weights in proptest::collection::vec(0u32..7, 1..7)) {
        prop_assume!(weights.iter().any(|&w| w > 0));
        let specs: Vec<NodeSpec> = weights.iter().enumerate()
            .map(|(i, &w)| NodeSpec::new(i as u32).with_weight(w)).collect();
        let mut p = make(&PolicyConfig::new(PolicyKind::Wrr), &specs);
        let g = weights.iter().fold(0u32, |g, &w| gcd(g, w));
        let cycle: u32 = weights.iter().map(|w| w / g).sum();
        let picks: Vec<u32> = (0..cycle * 4)
            .map(|_| p.select(&Request::get(ConnId(0), "/"), T0).unwrap().node().0)
            .collect();
        // Any `cycle` consecutive picks hold node i exactly w_i / g times.
        for win in picks.windows(cycle as usize) {
            for (i, &w) in weights.iter().enumerate() {
                prop_assert_eq!(win.iter().filter(|&&x| x == i as u32).count() as u32, w / g);
            }
        }
    }

    #[test]
    fn wrr_large_weights_exact(weights in proptest::collection::vec(800u32..1000, 9..12)) {
        let specs: Vec<NodeSpec> = weights.iter().enumerate()
            .map(|(i, &w)| NodeSpec::new(i as u32).with_weight(w)).collect();
        let mut p = make(&PolicyConfig::new(PolicyKind::Wrr), &specs);
        let total: u32 = weights.iter().sum();
        let mut counts = vec![0u32; weights.len()];
        for _ in 0..total {
            counts[p.select(&Request::get(ConnId(0), "/"), T0).unwrap().node().0 as usize] += 1;
        }
        prop_assert_eq!(counts, weights);
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

// ---------------------------------------------------------------- lc

proptest! {
    #[test]
    fn lc_picks_a_least_loaded_up_node(n in 1u32..7, ops in proptest::collection::vec(op(5, 1), 1..200)) {
        let mut p = make(&PolicyConfig::new(PolicyKind::Lc), &nodes(n));
        let mut load = vec![0u32; n as usize];
        let mut up = vec![true; n as usize];
        let mut out: Vec<NodeId> = vec![];
        for o in ops {
            match o {
                Op::Select { t, c } => {
                    let r = p.select(&Request::get(ConnId(c), &target(t)), T0);
                    let min = (0..n as usize).filter(|&i| up[i]).map(|i| load[i]).min();
                    match (r, min) {
                        (Ok(d), Some(m)) => {
                            let i = d.node().0 as usize;
                            prop_assert!(up[i]);
                            prop_assert_eq!(load[i], m);
                            load[i] += 1;
                            out.push(d.node());
                        }
                        (Err(Reject::NoNode), None) => {}
                        (r, m) => prop_assert!(false, "{:?} with min {:?}", r, m),
                    }
                }
                Op::Complete(i) if !out.is_empty() => {
                    let nd = out.swap_remove(i % out.len());
                    p.post_request(ConnId(0), nd, &ok(), T0);
                    load[nd.0 as usize] -= 1;
                }
                Op::Down(i) => { up[i % n as usize] = false; p.node_down(NodeId((i % n as usize) as u32), T0); }
                Op::Up(i) => { up[i % n as usize] = true; p.node_up(NodeId((i % n as usize) as u32), T0); }
                _ => {}
            }
        }
    }
}

// ---------------------------------------------------------------- chash

/// `ceil((100 + eps_pct) * total / (100 * n))` in exact integers.
fn chash_bound(eps_pct: u64, total: u64, n: u64) -> u64 {
    ((100 + eps_pct) * total).div_ceil(100 * n)
}

fn chash_cfg(eps_pct: u64) -> PolicyConfig {
    let mut cfg = PolicyConfig::new(PolicyKind::Chash);
    cfg.eps = eps_pct as f64 / 100.0;
    cfg
}

proptest! {
    #[test]
    fn chash_never_exceeds_the_bound(
        n in 1u32..8,
        eps_pct in prop_oneof![Just(0u64), Just(10), Just(25), Just(100)],
        ops in proptest::collection::vec(prop_oneof![3 => (0usize..40).prop_map(Some), 1 => Just(None)], 1..300),
    ) {
        let mut p = make(&chash_cfg(eps_pct), &nodes(n));
        let mut load = vec![0u64; n as usize];
        let mut out: Vec<NodeId> = vec![];
        for (k, o) in ops.into_iter().enumerate() {
            match o {
                Some(t) => {
                    let d = p.select(&Request::get(ConnId(0), &target(t)), T0).unwrap();
                    let i = d.node().0 as usize;
                    load[i] += 1;
                    out.push(d.node());
                    let total: u64 = load.iter().sum();
                    prop_assert!(load[i] <= chash_bound(eps_pct, total, n as u64),
                        "node {} has {} of {} (eps {}%)", i, load[i], total, eps_pct);
                }
                None if !out.is_empty() => {
                    let nd = out.swap_remove(k % out.len());
                    p.post_request(ConnId(0), nd, &ok(), T0);
                    load[nd.0 as usize] -= 1;
                }
                None => {}
            }
        }
    }

    #[test]
    fn chash_arrivals_only_keep_every_node_within_the_bound(
        n in 1u32..8,
        eps_pct in prop_oneof![Just(0u64), Just(25), Just(50)],
        ts in proptest::collection::vec(0usize..10, 1..200),
    ) {
        let mut p = make(&chash_cfg(eps_pct), &nodes(n));
        let mut load = vec![0u64; n as usize];
        for t in ts {
            let d = p.select(&Request::get(ConnId(0), &target(t)), T0).unwrap();
            load[d.node().0 as usize] += 1;
            let total: u64 = load.iter().sum();
            let b = chash_bound(eps_pct, total, n as u64);
            prop_assert!(load.iter().all(|&l| l <= b), "{:?} above {}", load, b);
        }
    }

    #[test]
    fn chash_moves_only_what_it_must(n in 2u32..10, victim in any::<usize>()) {
        let mut p = make(&chash_cfg(25), &nodes(n));
        let place = |p: &mut Box<dyn Policy>| -> Vec<NodeId> {
            (0..300).map(|t| {
                let d = p.select(&Request::get(ConnId(0), &target(t)), T0).unwrap();
                p.post_request(ConnId(0), d.node(), &ok(), T0);
                d.node()
            }).collect()
        };
        let before = place(&mut p);
        let v = NodeId((victim % n as usize) as u32);
        p.node_down(v, T0);
        let after = place(&mut p);
        for (b, a) in before.iter().zip(&after) {
            prop_assert!(*a != v);
            if *b != v { prop_assert_eq!(a, b); }
        }
        p.node_up(v, T0);
        prop_assert_eq!(place(&mut p), before.clone());
        p.add_node(NodeSpec::new(100), T0).unwrap();
        let grown = place(&mut p);
        let moved = grown.iter().zip(&before).filter(|(g, b)| g != b).count();
        for (g, b) in grown.iter().zip(&before) {
            prop_assert!(g == b || *g == NodeId(100));
        }
        // The newcomer takes some share but far from everything.
        prop_assert!(moved < 300 * 3 / (n as usize + 1) + 30, "moved {}", moved);
    }
}

// ---------------------------------------------------------------- lard

const INF: u64 = u64::MAX;

/// Reference cost of seed 003 Fig. 4 in whole load units.
fn fig4(load: u64, mapped: bool, l_idle: u64, l_over: u64, miss: u64) -> u64 {
    let bal = if load < l_idle {
        0
    } else if load > l_over {
        return INF;
    } else {
        load - l_idle
    };
    let loc = if mapped { 1 } else { miss };
    let repl = if load < l_idle || mapped { 0 } else { miss };
    bal + loc + repl
}

/// Operations for the cache-feedback model: select a target, or finish the oldest request
/// with the node saying whether it came from its cache.
#[derive(Debug, Clone)]
enum CacheOp {
    Select(usize),
    Finish(bool),
    Down(usize),
    Up(usize),
}

fn cache_op() -> impl Strategy<Value = CacheOp> {
    prop_oneof![
        6 => (0usize..5).prop_map(CacheOp::Select),
        6 => any::<bool>().prop_map(CacheOp::Finish),
        1 => any::<usize>().prop_map(CacheOp::Down),
        1 => any::<usize>().prop_map(CacheOp::Up),
    ]
}

proptest! {
    /// LARD with the nodes' word on their caches: a member that served its target from the
    /// cache and then without it costs as if the target were not mapped to it (Fig. 4's
    /// unmapped cost) until it serves a hit again; every choice is of minimum cost, ties stay.
    #[test]
    fn lard_follows_fig4_with_cache_losses(
        n in 1u32..4,
        l_idle in 1u32..5,
        span in 0u32..8,
        miss in 1u32..6,
        ops in proptest::collection::vec(cache_op(), 1..300),
    ) {
        let mut cfg = PolicyConfig::new(PolicyKind::Lard);
        cfg.l_idle = l_idle;
        cfg.l_overload = l_idle + span;
        cfg.miss_cost = miss;
        cfg.cache_feedback = true;
        let (li, lo, mc) = (l_idle as u64, (l_idle + span) as u64, miss as u64);
        let mut p = make(&cfg, &nodes(n));
        let nn = n as usize;
        let c = ConnId(0);
        let mut load = vec![0u64; nn];
        let mut up = vec![true; nn];
        let mut map: HashMap<usize, usize> = HashMap::new();
        let mut hit_seen: HashSet<usize> = HashSet::new();
        let mut lost: HashSet<usize> = HashSet::new();
        let mut out: VecDeque<(usize, usize)> = VecDeque::new();
        for o in ops {
            match o {
                CacheOp::Select(t) => {
                    let m = map.get(&t).copied();
                    let holds = |i: usize| m == Some(i) && !lost.contains(&t);
                    let costs: Vec<u64> = (0..nn)
                        .map(|i| if up[i] { fig4(load[i], holds(i), li, lo, mc) } else { INF })
                        .collect();
                    let min = *costs.iter().min().unwrap();
                    let r = p.select(&Request::get(c, &target(t)), T0);
                    if !up.iter().any(|&u| u) {
                        prop_assert_eq!(r, Err(Reject::NoNode));
                        continue;
                    }
                    if min == INF {
                        prop_assert_eq!(r, Err(Reject::Overloaded));
                        continue;
                    }
                    let i = r.unwrap().node().0 as usize;
                    prop_assert!(up[i]);
                    prop_assert_eq!(costs[i], min, "costs {:?} mapped {:?} lost {}", costs, m, lost.contains(&t));
                    if let Some(m) = m {
                        if costs[m] == min { prop_assert_eq!(i, m); }
                    }
                    if m != Some(i) {
                        map.insert(t, i);
                        hit_seen.remove(&t);
                        lost.remove(&t);
                    }
                    load[i] += 1;
                    out.push_back((i, t));
                }
                CacheOp::Finish(hit) => {
                    let Some((i, t)) = out.pop_front() else { continue };
                    p.post_request(c, NodeId(i as u32), &Outcome::ok(200, 1, hit), T0);
                    load[i] -= 1;
                    if map.get(&t) == Some(&i) {
                        if hit {
                            hit_seen.insert(t);
                            lost.remove(&t);
                        } else if hit_seen.remove(&t) {
                            lost.insert(t);
                        }
                    }
                }
                CacheOp::Down(k) => {
                    let i = k % nn;
                    if up[i] {
                        let gone: Vec<usize> = map.iter().filter(|(_, &v)| v == i).map(|(&t, _)| t).collect();
                        for t in gone {
                            map.remove(&t);
                            hit_seen.remove(&t);
                            lost.remove(&t);
                        }
                    }
                    up[i] = false;
                    p.node_down(NodeId(i as u32), T0);
                }
                CacheOp::Up(k) => { up[k % nn] = true; p.node_up(NodeId((k % nn) as u32), T0); }
            }
            prop_assert_eq!(p.stats().targets_mapped, map.len() as u64);
        }
    }
}

proptest! {
    #[test]
    fn lard_follows_fig4(
        n in 1u32..5,
        l_idle in 1u32..5,
        span in 0u32..8,
        miss in 1u32..6,
        ops in proptest::collection::vec(op(6, 1), 1..300),
    ) {
        let mut cfg = PolicyConfig::new(PolicyKind::Lard);
        cfg.l_idle = l_idle;
        cfg.l_overload = l_idle + span;
        cfg.miss_cost = miss;
        let (li, lo, mc) = (l_idle as u64, (l_idle + span) as u64, miss as u64);
        let mut p = make(&cfg, &nodes(n));
        let nn = n as usize;
        let mut load = vec![0u64; nn];
        let mut up = vec![true; nn];
        let mut map: HashMap<usize, usize> = HashMap::new();
        let mut out: Vec<NodeId> = vec![];
        for o in ops {
            match o {
                Op::Select { t, c } => {
                    let m = map.get(&t).copied();
                    let costs: Vec<u64> = (0..nn)
                        .map(|i| if up[i] { fig4(load[i], m == Some(i), li, lo, mc) } else { INF })
                        .collect();
                    let min = *costs.iter().min().unwrap();
                    let r = p.select(&Request::get(ConnId(c), &target(t)), T0);
                    if !up.iter().any(|&u| u) {
                        prop_assert_eq!(r, Err(Reject::NoNode));
                        continue;
                    }
                    if min == INF {
                        prop_assert_eq!(r, Err(Reject::Overloaded));
                        continue;
                    }
                    let i = r.unwrap().node().0 as usize;
                    prop_assert!(up[i]);
                    prop_assert_eq!(costs[i], min, "costs {:?} mapped {:?}", costs, m);
                    if let Some(m) = m {
                        // Repeated targets stay while their node is the cheapest (ties stay),
                        // in particular while its load is below L_idle + MissCost.
                        if costs[m] == min { prop_assert_eq!(i, m); }
                        if up[m] && load[m] < li + mc && load[m] <= lo { prop_assert_eq!(i, m); }
                    }
                    map.insert(t, i);
                    load[i] += 1;
                    out.push(NodeId(i as u32));
                }
                Op::Complete(k) if !out.is_empty() => {
                    let nd = out.swap_remove(k % out.len());
                    p.post_request(ConnId(0), nd, &ok(), T0);
                    load[nd.0 as usize] -= 1;
                }
                Op::Down(k) => {
                    let i = k % nn;
                    if up[i] { map.retain(|_, v| *v != i); }
                    up[i] = false;
                    p.node_down(NodeId(i as u32), T0);
                }
                Op::Up(k) => { up[k % nn] = true; p.node_up(NodeId((k % nn) as u32), T0); }
                _ => {}
            }
            prop_assert_eq!(p.stats().targets_mapped, map.len() as u64);
        }
    }

    #[test]
    fn lard_r_grows_under_load_and_shrinks_after_cooling(
        n in 2u32..6,
        l_idle in 1u32..6,
        miss in 1u32..6,
        k_secs in 1u64..30,
        fill in 0.0f64..1.0,
    ) {
        let mut cfg = PolicyConfig::new(PolicyKind::LardR);
        cfg.l_idle = l_idle;
        cfg.miss_cost = miss;
        cfg.l_overload = l_idle + miss + 10;
        cfg.lard_r_shrink_secs = k_secs as f64;
        let mut p = make(&cfg, &nodes(n));
        let l = (l_idle + miss) as usize;
        let held = 1 + (fill * (n as usize * l - 1) as f64) as usize;
        let hot = Request::get(ConnId(0), "/hot");
        let mut out = vec![];
        for _ in 0..held {
            out.push(p.select(&hot, T0).unwrap().node());
        }
        // A member takes L_idle + MissCost requests before the set has to grow.
        let size = held.div_ceil(l);
        prop_assert_eq!(p.mapped_nodes(&hot).len(), size);
        prop_assert_eq!(p.stats().replicas, size as u64 - 1);
        for nd in out { p.post_request(ConnId(0), nd, &ok(), T0); }
        // Cooling: a request less than K after the last change keeps the set ...
        let k = Duration::from_secs(k_secs);
        let d = p.select(&hot, k).unwrap();
        p.post_request(ConnId(0), d.node(), &ok(), k);
        prop_assert_eq!(p.mapped_nodes(&hot).len(), size);
        // ... and each request more than K after the last change drops one member.
        let mut now = k;
        for expect in (1..size).rev() {
            now += k + Duration::from_millis(1);
            let d = p.select(&hot, now).unwrap();
            p.post_request(ConnId(0), d.node(), &ok(), now);
            let set = p.mapped_nodes(&hot);
            prop_assert_eq!(set.len(), expect);
            prop_assert!(set.contains(&d.node()));
        }
        prop_assert_eq!(p.stats().replicas, 0);
    }
}

// ---------------------------------------------------------------- ext-lard

proptest! {
    #[test]
    fn ext_lard_disk_threshold_and_one_over_n(
        n in 2u32..5,
        threshold in 1u32..8,
        placed in proptest::collection::vec(0usize..8, 0..8),
        batches in proptest::collection::vec(
            (proptest::collection::vec(0usize..8, 1..6),
             proptest::collection::vec(0u32..10, 5),
             any::<bool>()),
            1..8),
    ) {
        let mut cfg = PolicyConfig::new(PolicyKind::ExtLard);
        cfg.disk_queue_threshold = threshold;
        let mut p = make(&cfg, &nodes(n));
        // Other connections place some targets first.
        for (j, &t) in placed.iter().enumerate() {
            let c = ConnId(100 + j as u64);
            let d = p.select(&Request::get(c, &target(t)), T0).unwrap();
            p.post_request(c, d.node(), &ok(), T0);
            p.connection_end(c, T0);
        }
        let c = ConnId(1);
        p.connection_start(c, T0);
        let mut handler: Option<NodeId> = None;
        let mut prev_len = 0u64;
        let mut charges: HashMap<NodeId, u64> = HashMap::new();
        let mut queues = vec![0u32; n as usize];
        let mut outstanding: Vec<NodeId> = vec![];
        for (b, (ts, disk, finish)) in batches.iter().enumerate() {
            let now = Duration::from_secs(b as u64 + 1);
            for i in 0..n as usize {
                queues[i] = disk[i];
                let r = LoadReport { disk_queue: disk[i], ..Default::default() };
                p.load_report(NodeId(i as u32), &r, now);
            }
            // New batch: the previous batch's charges are gone.
            charges.clear();
            let mut served = vec![];
            // Requests of this batch so far, the current one included.
            let mut so_far = 0u64;
            for &t in ts {
                so_far += 1;
                let path = target(t);
                let req = Request::get(c, &path);
                let cached_at = p.mapped_nodes(&req);
                let d = p.select(&req, now).unwrap();
                served.push(d.node());
                let Some(h) = handler else {
                    let first_ok = matches!(d, Decision::Serve { cache: true, .. });
                    prop_assert!(first_ok, "first request: {:?}", d);
                    handler = Some(d.node());
                    continue;
                };
                let low = queues[h.0 as usize] < threshold;
                // Served and cached by the handling node: its disk is not busy,
                // it caches the target already, or nobody does (so caching it
                // there replicates nothing).
                if low || cached_at.contains(&h) || cached_at.is_empty() {
                    prop_assert_eq!(d, Decision::Serve { node: h, cache: true });
                    prop_assert!(p.mapped_nodes(&req).contains(&h));
                } else {
                    match d {
                        Decision::Serve { node, cache: false } => prop_assert_eq!(node, h),
                        Decision::Forward { handler: fh, source } => {
                            prop_assert_eq!(fh, h);
                            prop_assert!(source != h && cached_at.contains(&source));
                            // 1/N with N the batch's size as far as known,
                            // at most one unit per node and batch.
                            let n = prev_len.max(so_far).max(1);
                            let have = charges.get(&source).copied().unwrap_or(0);
                            let share = (1000 / n).max(1).min(1000u64.saturating_sub(have));
                            *charges.entry(source).or_default() += share;
                        }
                        other => prop_assert!(false, "unexpected {:?}", other),
                    }
                }
            }
            let h = handler.unwrap();
            let check = |p: &dyn Policy, charges: &HashMap<NodeId, u64>| {
                for s in p.stats().nodes {
                    let want = charges.get(&s.id).copied().unwrap_or(0) + if s.id == h { 1000 } else { 0 };
                    if (s.load * 1000.0).round() as u64 != want {
                        return Err(format!("{} load {} want {}", s.id, s.load, want as f64 / 1000.0));
                    }
                }
                Ok(())
            };
            check(&*p, &charges).map_err(TestCaseError::fail)?;
            outstanding.extend(served);
            if *finish {
                // Everything asked on the connection is answered: the charges go.
                for nd in outstanding.drain(..) { p.post_request(c, nd, &ok(), now); }
                charges.clear();
                check(&*p, &charges).map_err(TestCaseError::fail)?;
            }
            prev_len = ts.len() as u64;
        }
        p.connection_end(c, T0);
        prop_assert!(p.stats().nodes.iter().all(|s| s.load == 0.0));
    }
}

// ---------------------------------------------------------------- cap

proptest! {
    #[test]
    fn cap_rotates_within_each_class(
        n in 1u32..6,
        down in proptest::collection::vec(any::<bool>(), 6),
        reqs in proptest::collection::vec(0usize..6, 1..100),
    ) {
        let mut cfg = PolicyConfig::new(PolicyKind::Cap);
        for (name, pattern) in [("cgi", "*.cgi"), ("cgi", "/cgi-bin/"), ("img", "/img/")] {
            cfg.classes.push(ClassSpec { name: name.into(), pattern: pattern.into() });
        }
        let mut p = make(&cfg, &nodes(n));
        let up: Vec<u32> = (0..n).filter(|&i| i == 0 || !down[i as usize]).collect();
        for i in 0..n { if !up.contains(&i) { p.node_down(NodeId(i), T0); } }
        let paths = ["/a.cgi", "/cgi-bin/q?x=1", "/img/a.png", "/img/b.gif", "/index.html", "/x.cgi?y"];
        let mut last: HashMap<String, usize> = HashMap::new();
        for r in reqs {
            let req = Request::get(ConnId(0), paths[r]);
            let class = p.class_name(p.parse(&req)).to_string();
            let node = p.select(&req, T0).unwrap().node().0;
            let pos = up.iter().position(|&u| u == node).expect("an up node");
            let expect = last.get(&class).map_or(0, |&l| (l + 1) % up.len());
            prop_assert_eq!(pos, expect, "class {}", class);
            last.insert(class, pos);
        }
    }
}

// ---------------------------------------------------------------- all policies

fn any_kind() -> impl Strategy<Value = PolicyKind> {
    proptest::sample::select(PolicyKind::ALL.to_vec())
}

proptest! {
    #[test]
    fn no_policy_selects_a_down_node_and_loads_return_to_zero(
        kind in any_kind(),
        n in 1u32..6,
        ops in proptest::collection::vec(op(8, 2), 1..250),
    ) {
        let mut cfg = PolicyConfig::new(kind);
        cfg.classes.push(ClassSpec { name: "odd".into(), pattern: "*1.html".into() });
        cfg.disk_queue_threshold = 3;
        let mut p = make(&cfg, &nodes(n));
        let nn = n as usize;
        let mut up = vec![true; nn];
        let mut out: Vec<(ConnId, NodeId)> = vec![];
        for o in ops {
            match o {
                Op::Select { t, c } => {
                    let path = target(t);
                    let mut req = Request::get(ConnId(c), &path);
                    req.size_hint = Some(t as u64 * 4096);
                    match p.select(&req, T0) {
                        Ok(d) => {
                            for x in [d.node(), d.handler()] {
                                prop_assert!((x.0 as usize) < nn && up[x.0 as usize], "{:?} picked down {}", d, x);
                            }
                            out.push((req.conn, d.node()));
                        }
                        Err(Reject::NoNode) => prop_assert!(!up.iter().any(|&u| u)),
                        Err(e) => prop_assert!(false, "{:?}", e),
                    }
                }
                Op::Complete(i) if !out.is_empty() => {
                    let (c, nd) = out.swap_remove(i % out.len());
                    p.post_request(c, nd, &ok(), T0);
                }
                Op::Down(i) => { up[i % nn] = false; p.node_down(NodeId((i % nn) as u32), T0); }
                Op::Up(i) => { up[i % nn] = true; p.node_up(NodeId((i % nn) as u32), T0); }
                Op::End(c) => p.connection_end(ConnId(c), T0),
                Op::Disk(i, q) => {
                    let r = LoadReport { disk_queue: q, ..Default::default() };
                    p.load_report(NodeId((i % nn) as u32), &r, T0);
                }
                _ => {}
            }
        }
        for (c, nd) in out.drain(..) { p.post_request(c, nd, &ok(), T0); }
        for c in 0..4 { p.connection_end(ConnId(c), T0); }
        for s in p.stats().nodes {
            prop_assert_eq!(s.in_flight, 0);
            prop_assert_eq!(s.load, 0.0, "{} {:?}", kind, s);
            prop_assert_eq!(s.connections, 0);
        }
    }
}
