//! One-way delivery on one host: the switch passes client connections to node processes'
//! control sockets (`SCM_RIGHTS`), the nodes answer the clients directly. Real nodes, a real
//! switch, real sockets; no privileges needed.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{eventually, Client, TestNode, TestSwitch};
use switchyard_handoff::fdpass::FdConn;
use switchyard_handoff::proto::{DropReason, Message};
use switchyard_policy::PolicyKind;
use switchyard_switch::config::{ControlAddr, Mechanism, Persistent};
use switchyard_switch::NodeEntry;

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// Nodes that take handed-off connections on Unix sockets in `dir`; every node has the same
/// targets `t0..t9` (bodies naming the node), `/who`, and `/big` (5 MB, the same everywhere).
fn nodes(n: usize, dir: &Path) -> (Vec<TestNode>, Vec<NodeEntry>) {
    let big = big_body();
    let mut nodes = Vec::new();
    let mut entries = Vec::new();
    for i in 0..n {
        let sock = dir.join(format!("node{i}.sock"));
        let s = sock.clone();
        let big = big.clone();
        let node = TestNode::start(
            |r| {
                write(r, "who", format!("node{i}").as_bytes());
                for t in 0..10 {
                    write(r, &format!("t{t}"), format!("node{i} t{t}").as_bytes());
                }
                write(r, "big", &big);
            },
            move |c| c.handoff_unix = Some(s),
        );
        entries.push(NodeEntry {
            control: Some(ControlAddr::Unix(sock)),
            ..NodeEntry::new(node.addr)
        });
        nodes.push(node);
    }
    (nodes, entries)
}

fn big_body() -> Vec<u8> {
    (0..5 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect()
}

fn switch(
    entries: Vec<NodeEntry>,
    tweak: impl FnOnce(&mut switchyard_switch::SwitchConfig),
) -> TestSwitch {
    let addrs: Vec<_> = entries.iter().map(|e| e.addr).collect();
    let sw = TestSwitch::start(&addrs, |c| {
        c.nodes = entries;
        c.mechanism = Mechanism::Handoff;
        tweak(c);
    });
    // Control connections (one per worker thread) come up in the background.
    assert!(sw
        .rt
        .block_on(sw.sw().wait_for_controls(Duration::from_secs(5))));
    assert!(
        eventually(Duration::from_secs(5), || {
            sw.metrics().contains("switchyard_handoff_fd_total") && control_ready(&sw)
        }),
        "control connections did not come up"
    );
    sw
}

/// Whether a first request is handed off (the probe connection counts as a handoff).
fn control_ready(sw: &TestSwitch) -> bool {
    let before = sw.sw().handoff_metrics().handoffs_fd.get();
    let mut c = sw.client();
    let r = c.get("/who");
    assert_eq!(r.status, 200);
    sw.sw().handoff_metrics().handoffs_fd.get() > before
}

fn fallbacks(sw: &TestSwitch, reason: &'static str) -> u64 {
    sw.sw().handoff_metrics().fallbacks_for(reason)
}

#[test]
fn connections_move_to_the_nodes_and_responses_bypass_the_switch() {
    let dir = tempfile::tempdir().unwrap();
    let (_nodes, entries) = nodes(2, dir.path());
    let sw = switch(entries, |_| {});
    let m = sw.sw().handoff_metrics();
    // The probes' connections are closed and reported before the counts are taken.
    assert!(eventually(Duration::from_secs(5), || m.handed_active.get() == 0));
    let fd_before = m.handoffs_fd.get();
    let requests_before = m.requests.get();
    // Probes made while the control connections came up may have been relayed.
    let relayed_before = sw.metric("switchyard_switch_relay_seconds_count");

    // Keep-alive: three requests on one handed-off connection.
    let mut c = sw.client();
    for t in ["/t1", "/t2", "/t1"] {
        let r = c.get(t);
        assert_eq!(r.status, 200);
        assert!(String::from_utf8_lossy(&r.body).ends_with(&t[1..]), "{r:?}");
    }
    // Pipelined: four requests in one write, answered in order.
    let mut p = sw.client();
    p.send(
        b"GET /t3 HTTP/1.1\r\nHost: a\r\n\r\nGET /t4 HTTP/1.1\r\nHost: a\r\n\r\nHEAD /t5 HTTP/1.1\r\nHost: a\r\n\r\nGET /t6 HTTP/1.1\r\nHost: a\r\n\r\n",
    );
    for (t, head) in [("t3", false), ("t4", false), ("t5", true), ("t6", false)] {
        let r = p.response(head);
        assert_eq!(r.status, 200);
        if !head {
            assert!(String::from_utf8_lossy(&r.body).ends_with(t));
        }
    }
    // A 5 MB body, and HTTP/1.0 with close.
    let mut b = sw.client();
    let r = b.get("/big");
    assert_eq!(r.body.len(), 5 * 1024 * 1024);
    assert!(r.body == big_body());
    let mut h10 = sw.client();
    let r = h10.raw(b"GET /who HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200);
    assert!(h10.is_closed());

    // Four connections, four handoffs, nothing relayed. (The switch counts a handoff when it
    // reads the node's Accepted, which may come after the client has its answer.)
    assert!(eventually(Duration::from_secs(5), || m.handoffs_fd.get()
        - fd_before
        == 4));
    assert_eq!(fallbacks(&sw, "refused") + fallbacks(&sw, "timeout"), 0);
    assert_eq!(
        sw.metric("switchyard_switch_relay_seconds_count"),
        relayed_before
    );
    assert_eq!(sw.metric("switchyard_switch_splice_bytes_total"), 0.0);
    // The first request of each connection was dispatched by the switch; the nodes report
    // it served (single handoff: later ones are the node's own).
    assert!(eventually(Duration::from_secs(5), || sw
        .metric("switchyard_switch_requests_total{status=\"200\"}")
        >= 4.0));
    drop((c, p, b, h10));
    // Closed reports empty the table and carry each connection's totals: 3 + 4 + 1 + 1.
    assert!(
        eventually(Duration::from_secs(5), || m.handed_active.get() == 0),
        "handed-off connections still listed: {}",
        m.handed_active.get()
    );
    assert_eq!(m.requests.get() - requests_before, 9);
    let status = {
        let mut a = Client::connect(sw.sw().admin_addr().unwrap());
        String::from_utf8(a.raw(b"GET /status.json HTTP/1.1\r\nHost: a\r\n\r\n").body).unwrap()
    };
    assert!(status.contains("\"mechanism\":\"handoff\""), "{status}");
    assert!(status.contains("\"steering\":null"), "{status}");
}

/// A control listener that answers `Hello`, then every `Create` with `Drop` (or not at all).
struct FakeControl {
    path: PathBuf,
    _rt: tokio::runtime::Runtime,
}

impl FakeControl {
    fn start(path: PathBuf, answer: bool) -> FakeControl {
        let (rt, listener) = common::control_listener(&path);
        rt.spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let (mut rx, mut tx) = FdConn::new(s).split();
                    while let Ok(Some((m, _fd))) = rx.recv().await {
                        let reply = match m {
                            Message::Hello { .. } => Some(Message::Hello {
                                name: "fake".into(),
                            }),
                            Message::Create { id, .. } if answer => Some(Message::Drop {
                                id,
                                reason: DropReason::Busy,
                                detail: "test".into(),
                            }),
                            _ => None,
                        };
                        if let Some(r) = reply {
                            if tx.send(&r, None).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        FakeControl { path, _rt: rt }
    }
}

fn one_node_with_control(control: ControlAddr) -> (TestNode, NodeEntry) {
    let node = TestNode::start(|r| write(r, "who", b"real node"), |_| {});
    let entry = NodeEntry {
        control: Some(control),
        ..NodeEntry::new(node.addr)
    };
    (node, entry)
}

#[test]
fn a_refusing_node_gets_the_connection_relayed_and_a_silent_one_abandoned() {
    let dir = tempfile::tempdir().unwrap();
    for answer in [true, false] {
        let fake = FakeControl::start(dir.path().join(format!("fake-{answer}.sock")), answer);
        let (_node, entry) = one_node_with_control(ControlAddr::Unix(fake.path.clone()));
        let addrs = [entry.addr];
        let sw = TestSwitch::start(&addrs, |c| {
            c.nodes = vec![entry];
            c.mechanism = Mechanism::Handoff;
            c.handoff_timeout_ms = 300;
        });
        let reason = if answer { "refused" } else { "abandoned" };
        // The control connection comes up in the background; until then requests are relayed
        // as `control_down`.
        assert!(eventually(Duration::from_secs(5), || {
            let mut c = sw.client();
            match c.try_get("/who") {
                Ok(r) => {
                    assert_eq!(r.status, 200);
                    assert_eq!(r.body, b"real node");
                    // Relayed connections stay usable for further requests.
                    assert_eq!(c.get("/who").body, b"real node");
                }
                // A node that answers neither the Create nor the Cancel may be serving the
                // connection: the switch closes it without a word rather than relay it.
                Err(e) => assert!(!answer, "{e}"),
            }
            fallbacks(&sw, reason) > 0
        }));
        if !answer {
            let m = sw.sw().handoff_metrics();
            assert_eq!(
                m.abandoned_for("cancel_timeout"),
                fallbacks(&sw, "abandoned")
            );
            assert_eq!(fallbacks(&sw, "timeout"), 0);
        }
        assert_eq!(sw.sw().handoff_metrics().handoffs_fd.get(), 0);
    }
}

#[test]
fn a_node_without_a_control_listener_is_relayed_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, entry) = one_node_with_control(ControlAddr::Unix(dir.path().join("nobody.sock")));
    let addrs = [entry.addr];
    let sw = TestSwitch::start(&addrs, |c| {
        c.nodes = vec![entry];
        c.mechanism = Mechanism::Handoff;
    });
    for _ in 0..3 {
        assert_eq!(sw.client().get("/who").body, b"real node");
    }
    assert_eq!(fallbacks(&sw, "control_down"), 3);
    // Counted just after the response reached the client.
    assert!(eventually(Duration::from_secs(5), || sw
        .metric("switchyard_switch_relay_seconds_count")
        == 3.0));
}

/// Which node serves each target when it is the first request of a connection.
fn placement(sw: &TestSwitch) -> Vec<String> {
    (0..10)
        .map(|t| {
            let r = sw.client().get(&format!("/t{t}"));
            let body = String::from_utf8(r.body).unwrap();
            body.split(' ').next().unwrap().to_owned()
        })
        .collect()
}

fn persistent_run(mode: Persistent) -> (TestSwitch, Vec<TestNode>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, entries) = nodes(2, dir.path());
    let sw = switch(entries, |c| {
        c.policy.name = PolicyKind::Chash;
        // Plain consistent hashing: a target's node must not depend on load.
        c.policy.eps = 1000.0;
        c.persistent = mode;
    });
    (sw, nodes, dir)
}

#[test]
fn multiple_handoff_moves_a_connection_to_each_target_node() {
    let (sw, _nodes, _dir) = persistent_run(Persistent::MultipleHandoff);
    let place = placement(&sw);
    assert!(
        place.iter().any(|n| n == "node0") && place.iter().any(|n| n == "node1"),
        "targets must spread over both nodes: {place:?}"
    );
    let m = sw.sw().handoff_metrics();
    let backs = m.hand_backs.get();
    let mut c = sw.client();
    let mut moves = 0;
    let mut last = None;
    for round in 0..2 {
        for (t, node) in place.iter().enumerate() {
            let r = c.get(&format!("/t{t}"));
            assert_eq!(r.status, 200, "round {round} t{t}");
            let body = String::from_utf8(r.body).unwrap();
            let by = body.split(' ').next().unwrap().to_owned();
            assert_eq!(&by, node, "t{t} must be served by its node");
            if last.as_ref().is_some_and(|l| *l != by) {
                moves += 1;
            }
            last = Some(by);
        }
    }
    assert!(moves > 0);
    assert_eq!(m.hand_backs.get() - backs, moves);
    assert_eq!(m.backend_forwards.get(), 0);
    assert_eq!(fallbacks(&sw, "hand_back"), 0);
}

#[test]
fn backend_forwarding_fetches_from_the_node_that_has_the_target() {
    let (sw, nodes, _dir) = persistent_run(Persistent::BackendForwarding);
    let place = placement(&sw);
    let m = sw.sw().handoff_metrics();
    let mut c = sw.client();
    // The first request places the connection.
    let first = String::from_utf8(c.get("/t0").body).unwrap();
    let handler = first.split(' ').next().unwrap().to_owned();
    let mut remote = 0;
    for (t, node) in place.iter().enumerate() {
        let r = c.get(&format!("/t{t}"));
        let body = String::from_utf8(r.body).unwrap();
        assert_eq!(body.split(' ').next().unwrap(), node, "t{t}");
        if *node != handler {
            remote += 1;
        }
    }
    assert!(remote > 0, "{place:?}");
    assert_eq!(m.backend_forwards.get(), remote);
    assert_eq!(m.hand_backs.get(), 0);
    drop(c);
    drop(nodes);
}

/// Extended LARD drives persistent connections itself (`persistent = "auto"`): a target another
/// node already serves is fetched from it (its `forward` mechanism) or the connection moves there
/// (`handoff`). Extended LARD does so only while the handling node's disk is busy (seed 003
/// §4.2); a threshold of 0 makes every disk count as busy.
#[test]
fn extended_lard_decides_forwarding_or_moving_per_request() {
    use switchyard_policy::PersistentRouting as ExtMechanism;
    for mech in [ExtMechanism::Forward, ExtMechanism::Handoff] {
        let dir = tempfile::tempdir().unwrap();
        let (_nodes, entries) = nodes(2, dir.path());
        let sw = switch(entries, |c| {
            c.policy.name = PolicyKind::ExtLard;
            c.policy.mechanism = mech;
            c.policy.disk_queue_threshold = 0;
        });
        let m = sw.sw().handoff_metrics();
        let by = |r: common::Response| {
            String::from_utf8(r.body)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .to_owned()
        };
        // The connection under test is placed on one node...
        let mut c = sw.client();
        let handler = by(c.get("/t0"));
        // ...while other connections place other targets, some of them on the other node.
        let mut others = Vec::new();
        let mut remote = None;
        for t in 1..10 {
            let mut o = sw.client();
            let node = by(o.get(&format!("/t{t}")));
            others.push(o);
            if node != handler {
                remote = Some((t, node));
                break;
            }
        }
        let (t, node) = remote.expect("no target landed on the other node");
        // The connection under test asks for it: the other node's copy answers.
        assert_eq!(by(c.get(&format!("/t{t}"))), node, "{mech:?}");
        match mech {
            ExtMechanism::Forward => {
                assert_eq!(m.backend_forwards.get(), 1);
                assert_eq!(m.hand_backs.get(), 0);
            }
            _ => {
                assert!(eventually(Duration::from_secs(5), || m.hand_backs.get() == 1));
                assert_eq!(m.backend_forwards.get(), 0);
            }
        }
        // And the connection keeps working.
        assert_eq!(c.get("/t0").status, 200);
        drop(others);
    }
}

/// A reload keeps the control connections of the nodes that stay, opens one to a node that
/// joins, and closes the one of a node that leaves; connections keep moving to the nodes.
#[test]
fn reload_adds_and_removes_nodes_under_handoff() {
    let dir = tempfile::tempdir().unwrap();
    let (_nodes, entries) = nodes(3, dir.path());
    let sw = switch(entries[..2].to_vec(), |c| c.policy.name = PolicyKind::Rr);
    let m = sw.sw().handoff_metrics();
    let mut cfg = switchyard_switch::SwitchConfig {
        nodes: entries[1..].to_vec(),
        ..switchyard_switch::SwitchConfig::default()
    };
    // The keys that cannot change, as the switch was started with them.
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.admin = Some("127.0.0.1:0".parse().unwrap());
    cfg.workers = 2;
    cfg.mechanism = Mechanism::Handoff;
    cfg.policy.name = PolicyKind::Rr;
    sw.reload(cfg).unwrap();
    // The joining node's control connection comes up; then every connection is handed off
    // and both remaining nodes serve (node0 left the configuration).
    assert!(eventually(Duration::from_secs(5), || sw
        .rt
        .block_on(sw.sw().wait_for_controls(Duration::from_millis(10)))));
    let before = m.handoffs_fd.get();
    let relayed = sw.metric("switchyard_switch_relay_seconds_count");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..8 {
        let r = sw.client().get("/who");
        assert_eq!(r.status, 200);
        seen.insert(String::from_utf8(r.body).unwrap());
    }
    // The switch counts a handoff when it reads the node's Accepted, which may come after the
    // client already has its answer.
    assert!(
        eventually(Duration::from_secs(5), || m.handoffs_fd.get() - before == 8),
        "{} handed off, fallbacks {:?}",
        m.handoffs_fd.get() - before,
        ["control_down", "refused", "timeout"].map(|r| fallbacks(&sw, r))
    );
    assert_eq!(sw.metric("switchyard_switch_relay_seconds_count"), relayed);
    let want: std::collections::HashSet<String> = ["node1".to_string(), "node2".to_string()].into();
    assert_eq!(seen, want);
}

/// Every worker thread of the switch keeps a control connection of its own to every node: with
/// two workers each node has two open, and connections accepted on either thread are handed
/// off.
#[test]
fn each_worker_thread_has_its_own_control_connection_to_each_node() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, entries) = nodes(2, dir.path());
    let sw = switch(entries, |c| {
        c.workers = 2;
        c.policy.name = PolicyKind::Rr;
    });
    for n in &nodes {
        let m = n.node.as_ref().unwrap().metrics();
        assert_eq!(
            m.handoff
                .control_connections
                .load(std::sync::atomic::Ordering::Relaxed),
            2
        );
    }
    let m = sw.sw().handoff_metrics();
    let before = m.handoffs_fd.get();
    let relayed = sw.metric("switchyard_switch_relay_seconds_count");
    // Connections land on either worker (SO_REUSEPORT spreads them); all move to the nodes.
    for _ in 0..20 {
        assert_eq!(sw.client().get("/who").status, 200);
    }
    assert!(eventually(Duration::from_secs(5), || m.handoffs_fd.get()
        - before
        == 20));
    assert_eq!(sw.metric("switchyard_switch_relay_seconds_count"), relayed);
    assert_eq!(fallbacks(&sw, "control_down"), 0);
}
