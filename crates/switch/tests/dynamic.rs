//! A site with static files and an application server behind the switch, in both
//! mechanisms: relayed, and with the client's connection handed off to the node (same host,
//! descriptor passing; no privileges needed). Real nodes, a real switch, a small application
//! server (`switchyard_testkit::app`).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, pattern, write, Client, TestNode, TestSwitch};
use switchyard_node::DynamicConfig;
use switchyard_switch::config::{ControlAddr, Mechanism};
use switchyard_switch::NodeEntry;
use switchyard_testkit::app::{closed_port, App};

const BODY_LIMIT: u64 = 8 << 20;

/// Nodes serving `index.html` (naming the node) and `/app/` from the application server at
/// `upstream`, taking handoffs on Unix sockets in `dir`.
fn nodes(n: usize, upstream: SocketAddr, dir: &Path) -> (Vec<TestNode>, Vec<NodeEntry>) {
    nodes_with(n, DynamicConfig::new(upstream, vec!["/app/".into()]), dir)
}

/// Nodes as [`nodes`], forwarding the paths of `dynamic`.
fn nodes_with(n: usize, dynamic: DynamicConfig, dir: &Path) -> (Vec<TestNode>, Vec<NodeEntry>) {
    let mut nodes = Vec::new();
    let mut entries = Vec::new();
    for i in 0..n {
        let sock = dir.join(format!("node{i}.sock"));
        let s = sock.clone();
        let d = dynamic.clone();
        let node = TestNode::start(
            |r| write(r, "index.html", format!("static {i}\n").as_bytes()),
            move |c| {
                c.handoff_unix = Some(s);
                c.max_body_bytes = BODY_LIMIT;
                c.dynamic = Some(d);
            },
        );
        entries.push(NodeEntry {
            control: Some(ControlAddr::Unix(sock)),
            ..NodeEntry::new(node.addr)
        });
        nodes.push(node);
    }
    (nodes, entries)
}

fn switch(entries: Vec<NodeEntry>, mechanism: Mechanism) -> TestSwitch {
    switch_with(entries, mechanism, |_| {})
}

/// A switch as [`switch`], its configuration changed by `tweak`.
fn switch_with(
    entries: Vec<NodeEntry>,
    mechanism: Mechanism,
    tweak: impl FnOnce(&mut switchyard_switch::SwitchConfig),
) -> TestSwitch {
    let addrs: Vec<_> = entries.iter().map(|e| e.addr).collect();
    let sw = TestSwitch::start(&addrs, |c| {
        c.nodes = entries;
        c.mechanism = mechanism;
        c.max_body_bytes = BODY_LIMIT;
        tweak(c);
    });
    if mechanism == Mechanism::Handoff {
        assert!(sw
            .rt
            .block_on(sw.sw().wait_for_controls(Duration::from_secs(5))));
        // Control connections come up in the background: wait until a first request is
        // handed off.
        assert!(
            eventually(Duration::from_secs(5), || {
                let before = sw.sw().handoff_metrics().handoffs_fd.get();
                let r = sw.client().get("/index.html");
                assert_eq!(r.status, 200);
                sw.sw().handoff_metrics().handoffs_fd.get() > before
            }),
            "control connections did not come up"
        );
    }
    sw
}

fn post(c: &mut Client, target: &str, body: &[u8]) -> common::Response {
    let mut req = format!(
        "POST {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    c.raw(&req)
}

fn post_chunked(c: &mut Client, target: &str, body: &[u8]) -> common::Response {
    let mut req =
        format!("POST {target} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
            .into_bytes();
    for piece in body.chunks(30_000) {
        req.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        req.extend_from_slice(piece);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    c.raw(&req)
}

/// Dynamic answers, large and chunked POST bodies and static files through the switch,
/// relayed and handed off.
#[test]
fn a_site_with_an_application_server_behind_the_switch() {
    for mechanism in [Mechanism::Relay, Mechanism::Handoff] {
        let dir = tempfile::tempdir().unwrap();
        let app = App::start();
        let (_nodes, entries) = nodes(2, app.addr, dir.path());
        let sw = switch(entries, mechanism);
        let mut c = sw.client();
        let r = c.get("/index.html");
        assert_eq!(r.status, 200, "{mechanism:?}");
        assert!(r.text().starts_with("static "), "{r:?}");
        for (a, b) in [(4, 5), (100, 1)] {
            let r = c.get(&format!("/app/sum?a={a}&b={b}"));
            assert_eq!(r.status, 200, "{mechanism:?} {r:?}");
            assert_eq!(r.text(), format!("sum={}\n", a + b));
        }
        // Bodies go through the switch (a request with a body is relayed in either mechanism)
        // and the node to the application, whole.
        let big = pattern(2 << 20, 3);
        let r = post(&mut c, "/app/echo", &big);
        assert_eq!((r.status, r.header("X-Framing")), (200, Some("length")));
        assert!(r.body == big, "{mechanism:?}: large echo differs");
        let data = pattern(500_000, 4);
        let r = post_chunked(&mut c, "/app/echo", &data);
        assert_eq!(r.status, 200, "{mechanism:?}");
        assert!(r.body == data, "{mechanism:?}: chunked echo differs");
        assert_eq!(c.get("/index.html").status, 200);
        assert_eq!(app.seen.count_of("POST /app/echo"), 2);
    }
}

/// A connection handed off by the switch is served by the node to its end: its dynamic
/// requests, with bodies, go from the node to the application and the answers straight to
/// the client.
#[test]
fn a_handed_off_connection_reaches_the_application_from_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let (nodes, entries) = nodes(2, app.addr, dir.path());
    let sw = switch(entries, Mechanism::Handoff);
    // Counted by the nodes as they take a connection, before its first answer leaves: every
    // probe made while the switch came up is counted by now.
    let taken = || -> u64 {
        nodes
            .iter()
            .map(|n| {
                let m = n.node.as_ref().unwrap().metrics();
                m.handoff.fd_connections.load(Relaxed)
            })
            .sum()
    };
    let before = taken();
    let upstream_before: f64 = nodes.iter().map(upstream_requests).sum();

    let mut c = sw.client();
    let r = c.get("/app/sum?a=20&b=22");
    assert_eq!(r.text(), "sum=42\n");
    // The connection now lives on a node: the switch has no part in what follows on it.
    assert_eq!(taken(), before + 1);
    let body = pattern(1 << 20, 5);
    let r = post(&mut c, "/app/echo", &body);
    assert_eq!(r.status, 200);
    assert!(r.body == body, "echo differs");
    let r = post_chunked(&mut c, "/app/echo", b"over the handed-off connection");
    assert_eq!(r.text(), "over the handed-off connection");
    assert_eq!(c.get("/app/sum?a=1&b=1").text(), "sum=2\n");
    let upstream_after: f64 = nodes.iter().map(upstream_requests).sum();
    assert_eq!(upstream_after - upstream_before, 4.0);
    assert_eq!(taken(), before + 1);
}

/// With `cap` and the classes of `[dynamic]`, heavy requests have a round-robin pointer of
/// their own: interleaved with cheap dynamic requests they are still spread evenly over the
/// nodes (in one shared class every heavy request of the pattern below would land on the
/// same node), and both kinds reach the application through the node that took them.
#[test]
fn cap_spreads_heavy_requests_apart_from_dynamic_ones() {
    for mechanism in [Mechanism::Relay, Mechanism::Handoff] {
        let dir = tempfile::tempdir().unwrap();
        let app = App::start();
        let mut dynamic = DynamicConfig::new(app.addr, vec!["/app/".into()]);
        // Large generated pages stand for the expensive requests.
        dynamic.heavy = vec!["/app/big".into()];
        let classes = dynamic.cap_classes();
        let (nodes, entries) = nodes_with(2, dynamic, dir.path());
        let sw = switch_with(entries, mechanism, |c| {
            c.policy.name = switchyard_policy::PolicyKind::Cap;
            c.policy.classes = classes;
        });
        // Which node's application-server count a request moved.
        let served_by = |target: &str, want: &[u8]| -> usize {
            let before: Vec<f64> = nodes.iter().map(upstream_requests).collect();
            let r = sw.client().get(target);
            assert_eq!(r.status, 200, "{mechanism:?} {target}");
            assert!(r.body == want, "{mechanism:?} {target}: body differs");
            let after: Vec<f64> = nodes.iter().map(upstream_requests).collect();
            let moved: Vec<usize> = (0..nodes.len()).filter(|&i| after[i] > before[i]).collect();
            assert_eq!(moved.len(), 1, "{mechanism:?}: {before:?} -> {after:?}");
            moved[0]
        };
        let mut heavy = [0; 2];
        let mut cheap = [0; 2];
        for _ in 0..4 {
            heavy[served_by("/app/big?n=3000", &pattern(3000, 7))] += 1;
            cheap[served_by("/app/sum?a=1&b=1", b"sum=2\n")] += 1;
        }
        assert_eq!(heavy, [2, 2], "{mechanism:?}: heavy requests per node");
        assert_eq!(cheap, [2, 2], "{mechanism:?}: dynamic requests per node");
        assert_eq!(app.seen.count_of("GET /app/big"), 4);
    }
}

fn upstream_requests(n: &TestNode) -> f64 {
    n.node
        .as_ref()
        .unwrap()
        .metrics()
        .upstream
        .requests
        .load(Relaxed) as f64
}

/// With the application server down, dynamic paths are 502 in both mechanisms and the static
/// part of the site is served as ever; the nodes stay up.
#[test]
fn upstream_down_is_502_behind_the_switch_and_static_files_are_unaffected() {
    for mechanism in [Mechanism::Relay, Mechanism::Handoff] {
        let dir = tempfile::tempdir().unwrap();
        let (nodes, entries) = nodes(2, closed_port(), dir.path());
        let sw = switch(entries, mechanism);
        let mut c = sw.client();
        for _ in 0..3 {
            assert_eq!(c.get("/app/sum?a=1&b=1").status, 502, "{mechanism:?}");
            let r = c.get("/index.html");
            assert_eq!(r.status, 200, "{mechanism:?}");
            assert!(r.text().starts_with("static "));
        }
        let r = post(&mut sw.client(), "/app/echo", b"lost");
        assert_eq!(r.status, 502, "{mechanism:?}");
        for n in &nodes {
            assert!(sw.node_up(n.addr), "{mechanism:?}: a node was taken out");
        }
    }
}

/// In relay mode a request that is not idempotent is sent once: when its pooled connection
/// closes without an answer it is answered 502, not sent again (while a GET in the same
/// position is sent again on a new connection).
#[test]
fn the_switch_never_sends_a_request_that_is_not_idempotent_twice() {
    let posts = Arc::new(AtomicU64::new(0));
    let closing_gets = Arc::new(AtomicU64::new(0));
    let (p, g) = (posts.clone(), closing_gets.clone());
    let (addr, _) = common::fake_node(move |req| {
        let line = String::from_utf8_lossy(req);
        if line.starts_with("POST ") {
            p.fetch_add(1, Relaxed);
            return None;
        }
        if line.starts_with("GET /close ") {
            g.fetch_add(1, Relaxed);
            return None;
        }
        Some(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec())
    });
    let sw = TestSwitch::start(&[addr], |c| c.retries = 1);
    let mut c = sw.client();
    // Each request below finds a pooled connection, left by the one before it.
    assert_eq!(c.get("/warm").status, 200);
    assert_eq!(c.get("/close").status, 502);
    assert_eq!(closing_gets.load(Relaxed), 2);
    let mut c = sw.client();
    assert_eq!(c.get("/warm").status, 200);
    assert_eq!(post(&mut c, "/form", b"a=1").status, 502);
    assert_eq!(posts.load(Relaxed), 1);
    let mut c = sw.client();
    assert_eq!(c.get("/warm").status, 200);
    assert_eq!(c.raw(b"POST /form HTTP/1.1\r\nHost: t\r\n\r\n").status, 502);
    assert_eq!(posts.load(Relaxed), 2);
}
