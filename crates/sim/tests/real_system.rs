//! The simulator against real `switchyard-node` nodes on loopback: the same trace, policy, node
//! count, cache size and number of clients give hit rates within 5 percentage points.

#[path = "support/realcheck.rs"]
mod realcheck;

use realcheck::{run_check, CheckConfig};
use switchyard_policy::PolicyKind;
use switchyard_sim::{Http, DEFAULT_CACHE_BYTES};

fn check(policy: PolicyKind, http: Http) {
    let scale = 0.02;
    let cfg = CheckConfig {
        nodes: 4,
        scale,
        requests: 12_000,
        seed: 3,
        cache_bytes: (DEFAULT_CACHE_BYTES as f64 * scale) as u64,
        clients: 4,
        policy,
        http,
    };
    let r = run_check(&cfg);
    assert_eq!(r.errors, 0, "{r:#?}");
    let real: u64 = r.real_nodes.iter().map(|n| n.hits + n.misses).sum();
    assert_eq!(
        real, r.requests,
        "every request reached a node cache: {r:#?}"
    );
    assert!(
        (r.real_hit_rate - r.sim_hit_rate).abs() < 0.05,
        "real {:.4} vs simulated {:.4}: {r:#?}",
        r.real_hit_rate,
        r.sim_hit_rate
    );
    // A meaningful comparison: the caches neither hold everything nor nothing.
    assert!((0.2..0.98).contains(&r.sim_hit_rate), "{r:#?}");
}

#[test]
fn lard_over_http10_matches_real_nodes() {
    check(PolicyKind::Lard, Http::V10);
}

#[test]
fn wrr_over_http11_single_handoff_matches_real_nodes() {
    check(PolicyKind::Wrr, Http::V11);
}
