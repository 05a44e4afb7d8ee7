//! Randomized pipelining through every delivery mode that needs no privileges: relaying, and
//! handing connections to nodes on the same host with one node per connection (`single`),
//! moving between nodes (`multiple-handoff`) or fetching from the node that has the target
//! (`backend-forwarding`).
//!
//! The trials and their oracle are `switchyard_testkit::pipeline`'s (the lab's suite runs the
//! same ones across hosts).
//!
//! Trials run on [`CLIENTS`] connections at once. Bounded for CI (`TRIALS` per mode);
//! `SWITCHYARD_PIPELINE_TRIALS=N` runs N per mode and
//! `SWITCHYARD_PIPELINE_SEED` starts from another seed. A failure names the seed and the
//! requests of the trial.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{eventually, TestNode, TestSwitch};
use switchyard_policy::PolicyKind;
use switchyard_switch::config::{ControlAddr, Mechanism, Persistent};
use switchyard_switch::NodeEntry;
use switchyard_testkit::pipeline::{self, fill};

/// Trials per mode in an ordinary run.
const TRIALS: u64 = 60;

/// Two nodes taking handed-off connections on Unix sockets in `dir`.
fn handoff_nodes(dir: &Path) -> (Vec<TestNode>, Vec<NodeEntry>) {
    let mut nodes = Vec::new();
    let mut entries = Vec::new();
    for i in 0..2 {
        let sock = dir.join(format!("node{i}.sock"));
        let s = sock.clone();
        let node = TestNode::start(|r| fill(r, i), move |c| c.handoff_unix = Some(s));
        entries.push(NodeEntry {
            control: Some(ControlAddr::Unix(sock)),
            ..NodeEntry::new(node.addr)
        });
        nodes.push(node);
    }
    (nodes, entries)
}

/// Clients running trials at once: connections interleave at the switch, on its control
/// connections and at the nodes.
const CLIENTS: u64 = 4;

fn run(sw: &TestSwitch, mode: &str) {
    let (n, seed) = pipeline::trials_from_env(TRIALS);
    let failures = pipeline::run_trials(sw.addr, n, seed, CLIENTS);
    assert!(
        failures.is_empty(),
        "{mode}: {} of {n} trials failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn relayed_pipelines_are_answered_in_order() {
    let nodes: Vec<TestNode> = (0..2)
        .map(|i| TestNode::start(|r| fill(r, i), |_| {}))
        .collect();
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let sw = TestSwitch::start(&addrs, |c| c.policy.name = PolicyKind::Rr);
    run(&sw, "relay");
}

fn handed_off(mode: Persistent) {
    let dir = tempfile::tempdir().unwrap();
    let (_nodes, entries) = handoff_nodes(dir.path());
    let addrs: Vec<_> = entries.iter().map(|e| e.addr).collect();
    let sw = TestSwitch::start(&addrs, |c| {
        c.nodes = entries;
        c.mechanism = Mechanism::Handoff;
        c.persistent = mode;
        c.policy.name = PolicyKind::Chash;
        c.policy.eps = 1000.0;
    });
    assert!(sw
        .rt
        .block_on(sw.sw().wait_for_controls(Duration::from_secs(5))));
    assert!(eventually(Duration::from_secs(5), || {
        let before = sw.sw().handoff_metrics().handoffs_fd.get();
        let ok = sw.client().get("/who").status == 200;
        ok && sw.sw().handoff_metrics().handoffs_fd.get() > before
    }));
    run(&sw, &format!("{mode:?}"));
}

#[test]
fn handed_off_single_pipelines_are_answered_in_order() {
    handed_off(Persistent::Single);
}

#[test]
fn handed_off_multiple_handoff_pipelines_are_answered_in_order() {
    handed_off(Persistent::MultipleHandoff);
}

#[test]
fn handed_off_backend_forwarding_pipelines_are_answered_in_order() {
    handed_off(Persistent::BackendForwarding);
}
