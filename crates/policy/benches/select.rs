//! `select` + `post_request` per policy: 16 nodes, 20 000 targets with Zipf-like popularity,
//! about 64 requests in flight, 200 keep-alive connections.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use switchyard_policy::{
    build, ClassSpec, ConnId, LoadReport, NodeId, NodeSpec, Outcome, PolicyConfig, PolicyKind,
    Request,
};

const NODES: u32 = 16;
const TARGETS: usize = 20_000;
const IN_FLIGHT: usize = 64;
const CONNS: u64 = 200;

/// Deterministic request stream: (target index, connection).
fn stream(len: usize) -> Vec<(usize, u64)> {
    // Zipf(1) by inverse transform over the harmonic numbers.
    let mut cdf = Vec::with_capacity(TARGETS);
    let mut acc = 0.0;
    for i in 1..=TARGETS {
        acc += 1.0 / i as f64;
        cdf.push(acc);
    }
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64 * acc;
            let t = cdf.partition_point(|&c| c < u).min(TARGETS - 1);
            (t, x % CONNS)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let targets: Vec<String> = (0..TARGETS)
        .map(|i| {
            if i % 10 == 0 {
                format!("/cgi-bin/app{i}.cgi")
            } else {
                format!("/docs/{i}.html")
            }
        })
        .collect();
    let reqs = stream(1 << 16);
    let specs: Vec<NodeSpec> = (0..NODES)
        .map(|i| NodeSpec::new(i).with_weight(1 + i % 3))
        .collect();
    let mut group = c.benchmark_group("select");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    for kind in PolicyKind::ALL {
        let mut cfg = PolicyConfig::new(kind);
        cfg.classes.push(ClassSpec {
            name: "cgi".into(),
            pattern: "*.cgi".into(),
        });
        let mut p = build(&cfg).unwrap();
        p.init(&specs, Duration::ZERO).unwrap();
        for i in 0..NODES {
            let r = LoadReport {
                disk_queue: i % 8,
                ..Default::default()
            };
            p.load_report(NodeId(i), &r, Duration::ZERO);
        }
        let mut ring: Vec<Option<(ConnId, NodeId)>> = vec![None; IN_FLIGHT];
        let mut k = 0usize;
        let mut clock = Duration::ZERO;
        group.bench_function(kind.as_str(), |b| {
            b.iter(|| {
                let (t, conn) = reqs[k % reqs.len()];
                clock += Duration::from_micros(10);
                let slot = k % IN_FLIGHT;
                if let Some((c, n)) = ring[slot].take() {
                    p.post_request(c, n, &Outcome::ok(200, 8192, true), clock);
                }
                let req = Request::get(ConnId(conn), &targets[t]);
                if let Ok(d) = p.select(black_box(&req), clock) {
                    ring[slot] = Some((req.conn, d.node()));
                }
                if k % 1000 == 999 {
                    p.connection_end(ConnId(conn), clock);
                }
                k += 1;
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
