//! Properties of the simulator on random small workloads and clusters: a run is a function of its
//! inputs, every request completes exactly once, and simulated time never goes backwards.

use std::sync::Arc;

use proptest::prelude::*;
use switchyard_policy::PolicyKind;
use switchyard_sim::{
    simulate_observed, Completion, Http, Pipelining, RequestDistribution, SimConfig, SimWorkload,
    Targets,
};

#[derive(Debug, Clone)]
struct Case {
    sizes: Vec<u64>,
    conns: Vec<Vec<Vec<u32>>>,
    nodes: u32,
    policy: PolicyKind,
    mechanism: RequestDistribution,
    pipelining: Pipelining,
    clients: u32,
    cache_bytes: u64,
    l_overload: u32,
    warmup: u64,
}

fn case() -> impl Strategy<Value = Case> {
    let sizes = prop::collection::vec(0u64..200_000, 1..40);
    (
        sizes,
        1u32..6,
        0usize..PolicyKind::ALL.len(),
        0usize..5,
        any::<bool>(),
    )
        .prop_flat_map(|(sizes, nodes, p, m, serial)| {
            let n = sizes.len() as u32;
            let batch = prop::collection::vec(0..n, 1..6);
            let conn = prop::collection::vec(batch, 1..5);
            (
                Just(sizes),
                prop::collection::vec(conn, 1..40),
                Just(nodes),
                Just(PolicyKind::ALL[p]),
                Just(RequestDistribution::ALL[m]),
                Just(if serial {
                    Pipelining::Serial
                } else {
                    Pipelining::Concurrent
                }),
                1u32..20,
                0u64..1_000_000,
                prop_oneof![Just(130u32), 1u32..10],
                0u64..10,
            )
        })
        .prop_map(
            |(sizes, conns, nodes, policy, mechanism, pipelining, clients, cache, lo, warmup)| {
                Case {
                    sizes,
                    conns,
                    nodes,
                    policy,
                    mechanism,
                    pipelining,
                    clients,
                    cache_bytes: cache,
                    l_overload: lo,
                    warmup,
                }
            },
        )
}

fn setup(c: &Case) -> (SimConfig, SimWorkload) {
    let targets = Arc::new(Targets {
        keys: (0..c.sizes.len())
            .map(|i| format!("/d{}/t{i}.html", i % 3).into())
            .collect(),
        sizes: c.sizes.clone(),
    });
    let w = SimWorkload::from_connections(targets, Http::V11, &c.conns).unwrap();
    let mut cfg = SimConfig::new(c.nodes, c.policy, c.mechanism);
    cfg.pipelining = c.pipelining;
    cfg.clients = Some(c.clients);
    cfg.cache_bytes = c.cache_bytes;
    cfg.policy.l_idle = c.l_overload.min(cfg.policy.l_idle);
    cfg.policy.l_overload = c.l_overload;
    cfg.warmup_requests = c.warmup;
    (cfg, w)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn runs_are_deterministic_and_conserve_requests(c in case()) {
        let (cfg, w) = setup(&c);
        let mut first: Vec<Completion> = Vec::new();
        let r1 = simulate_observed(&cfg, &w, |d| first.push(d)).unwrap();
        let mut second: Vec<Completion> = Vec::new();
        let r2 = simulate_observed(&cfg, &w, |d| second.push(d)).unwrap();
        // Determinism: the same inputs give the same events and the same figures.
        prop_assert_eq!(&first, &second);
        prop_assert_eq!(&r1, &r2);
        // Conservation: every request completes exactly once.
        let mut seen = vec![0u32; w.requests()];
        for d in &first {
            seen[d.request] += 1;
            prop_assert!(d.node < c.nodes);
        }
        prop_assert!(seen.iter().all(|&n| n == 1), "{:?}", seen);
        prop_assert_eq!(r1.requests as usize, w.requests());
        let warm = c.warmup.min(w.requests() as u64);
        let measured = if c.warmup > 0 && c.warmup <= w.requests() as u64 {
            w.requests() as u64 - warm
        } else {
            w.requests() as u64
        };
        prop_assert_eq!(r1.measured_requests, measured);
        let served: u64 = r1.per_node.iter().map(|n| n.requests).sum();
        let looked: u64 = r1.per_node.iter().map(|n| n.hits + n.misses).sum();
        prop_assert_eq!(served, measured);
        prop_assert_eq!(looked, measured);
        // Time never goes backwards.
        prop_assert!(first.windows(2).all(|p| p[0].time <= p[1].time));
        for n in &r1.per_node {
            prop_assert!((0.0..=1.0).contains(&n.cpu_idle), "{}", n.cpu_idle);
            prop_assert!((0.0..=1.0).contains(&n.disk_idle), "{}", n.disk_idle);
        }
        prop_assert!(r1.throughput.is_finite());
    }

    #[test]
    fn requests_of_a_connection_keep_batch_order(c in case()) {
        // A batch is sent only when the previous one is answered: every request of batch k+1
        // completes after every request of batch k of the same connection.
        let (cfg, w) = setup(&c);
        let mut done = vec![0u64; w.requests()];
        simulate_observed(&cfg, &w, |d| done[d.request] = d.time).unwrap();
        let mut i = 0usize;
        for conn in &c.conns {
            let mut prev_end = 0u64;
            for batch in conn {
                let times = &done[i..i + batch.len()];
                let start = *times.iter().min().unwrap();
                prop_assert!(start >= prev_end);
                prev_end = *times.iter().max().unwrap();
                i += batch.len();
            }
        }
    }
}
