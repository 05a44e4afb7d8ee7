//! The simulator tells the policy, request by request, whether the serving node found the
//! target in its cache; with `cache_feedback` the LARD family acts on it. The same workload and
//! cluster, with and without it.

use std::sync::Arc;

use switchyard_policy::PolicyKind;
use switchyard_sim::workload::seed003_synth;
use switchyard_sim::{
    simulate, Http, RequestDistribution, RunResult, SimConfig, SimWorkload, Targets,
    DEFAULT_CACHE_BYTES,
};
use switchyard_trace::{synthesize, SessionConfig};

const SCALE: f64 = 0.02;

fn run(
    policy: PolicyKind,
    mechanism: RequestDistribution,
    http: Http,
    feedback: bool,
) -> RunResult {
    let s = synthesize(&seed003_synth(SCALE, 40_000, 3)).unwrap();
    let t = Arc::new(Targets::of(&s.workload));
    let w = SimWorkload::with_targets(t, &s.workload, http, &SessionConfig::default());
    let mut cfg = SimConfig::new(4, policy, mechanism);
    cfg.cache_bytes = (DEFAULT_CACHE_BYTES as f64 * SCALE) as u64;
    cfg.policy.cache_feedback = feedback;
    simulate(&cfg, &w).unwrap()
}

/// LARD over HTTP/1.0 with caches that thrash: targets whose nodes lost them are placed
/// again, so with the nodes' word on their caches the policy reassigns more, and the run
/// without it is the policy of the paper (same requests, same cluster).
#[test]
fn lard_reassigns_targets_the_simulated_nodes_lost() {
    let off = run(
        PolicyKind::Lard,
        RequestDistribution::Single,
        Http::V10,
        false,
    );
    let on = run(
        PolicyKind::Lard,
        RequestDistribution::Single,
        Http::V10,
        true,
    );
    eprintln!(
        "reassignments {} -> {}, throughput {:.0} -> {:.0}, hit rate {:.3} -> {:.3}",
        off.policy_reassignments,
        on.policy_reassignments,
        off.throughput,
        on.throughput,
        off.hit_rate,
        on.hit_rate
    );
    assert_eq!(off.requests, on.requests);
    assert!(
        off.hit_rate < 0.95,
        "the caches must thrash: {}",
        off.hit_rate
    );
    assert!(
        on.policy_reassignments > off.policy_reassignments,
        "{} vs {}",
        on.policy_reassignments,
        off.policy_reassignments
    );
}
