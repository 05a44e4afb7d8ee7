//! The nodes tell the switch whether each response came from their memory cache, relayed (a
//! response field the switch removes) and handed off (the `Served` report), and the policy
//! counts it. Real nodes, a real switch, real sockets; no privileges needed.

mod common;

use std::time::Duration;

use common::{eventually, write, TestNode, TestSwitch};
use switchyard_switch::config::{ControlAddr, Mechanism};
use switchyard_switch::NodeEntry;

/// The policy's count of responses the nodes served from their caches.
fn cache_hits(sw: &TestSwitch) -> u64 {
    sw.sw()
        .policy_stats()
        .nodes
        .iter()
        .map(|n| n.cache_hits)
        .sum()
}

#[test]
fn the_policy_learns_which_responses_came_from_the_cache() {
    for mechanism in [Mechanism::Relay, Mechanism::Handoff] {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("node.sock");
        let s = sock.clone();
        let node = TestNode::start(
            |r| {
                write(r, "a.txt", b"alpha");
                write(r, "b.txt", b"beta");
                write(r, "probe.txt", b"probe");
            },
            move |c| c.handoff_unix = Some(s),
        );
        let entry = NodeEntry {
            control: Some(ControlAddr::Unix(sock)),
            ..NodeEntry::new(node.addr)
        };
        let sw = TestSwitch::start(&[node.addr], |c| {
            c.nodes = vec![entry];
            c.mechanism = mechanism;
            // No health checks: only the requests below reach the node.
            c.health_interval_ms = 0;
        });
        let completed = || sw.sw().policy_stats().nodes[0].completed;
        let mut probes = 0;
        if mechanism == Mechanism::Handoff {
            assert!(sw
                .rt
                .block_on(sw.sw().wait_for_controls(Duration::from_secs(5))));
            // Control connections come up in the background: probe (with a file of its own)
            // until a request is handed off.
            assert!(eventually(Duration::from_secs(5), || {
                let before = sw.sw().handoff_metrics().handoffs_fd.get();
                probes += 1;
                assert_eq!(sw.client().get("/probe.txt").status, 200);
                sw.sw().handoff_metrics().handoffs_fd.get() > before
            }));
            assert!(eventually(Duration::from_secs(5), || completed() == probes));
        }
        let (base_hits, base_done) = (cache_hits(&sw), completed());
        // Each on a connection of its own (handed off, the first request is the switch's).
        let plan = [("/a.txt", 0), ("/a.txt", 1), ("/b.txt", 1), ("/a.txt", 2)];
        for (i, (path, hits)) in plan.into_iter().enumerate() {
            let mut c = sw.client();
            let r = c.get(path);
            assert_eq!(r.status, 200, "{mechanism:?}");
            // The node's answer to the switch never reaches the client.
            assert_eq!(r.header("X-Switchyard-Cache"), None, "{mechanism:?}");
            drop(c);
            // Relayed, the policy has heard before the client has its answer; handed off,
            // the node's report follows the response.
            assert!(
                eventually(Duration::from_secs(5), || {
                    completed() == base_done + i as u64 + 1 && cache_hits(&sw) == base_hits + hits
                }),
                "{mechanism:?} {path}: cache hits {} want {}",
                cache_hits(&sw),
                base_hits + hits
            );
        }
    }
}
