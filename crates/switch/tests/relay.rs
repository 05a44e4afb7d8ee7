//! The relay over real sockets: per-request routing, pipelining, bodies both ways, strict
//! parsing on both sides, and bad input answered while other clients carry on.

mod common;

use common::*;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use switchyard_policy::PolicyKind;

#[test]
fn every_request_on_one_keep_alive_connection_is_routed() {
    let nodes = cluster(3, &[("a.txt", b"aaa".to_vec())]);
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let sw = TestSwitch::start(&addrs, |c| c.policy.name = PolicyKind::Rr);
    let mut c = sw.client();
    let mut seen = Vec::new();
    for _ in 0..9 {
        let r = c.get("/who");
        assert_eq!(r.status, 200);
        assert!(r.header("Connection").is_none(), "{:?}", r.headers);
        seen.push(String::from_utf8(r.body).unwrap());
    }
    // Round robin over three nodes: each window of three requests saw all three nodes.
    for w in seen.chunks(3) {
        let set: HashSet<_> = w.iter().collect();
        assert_eq!(set.len(), 3, "{seen:?}");
    }
    // Same connection throughout, and the nodes were reached over pooled connections.
    assert_eq!(sw.metric("switchyard_switch_connections_total"), 1.0);
    let text = sw.metrics();
    for m in ["accept_failures", "accept_backoffs"] {
        assert!(
            text.lines()
                .any(|l| l == format!("switchyard_switch_{m}_total 0")),
            "{m} not exported:\n{text}"
        );
    }
    let connects: f64 = addrs
        .iter()
        .map(|a| {
            sw.metric(&format!(
                "switchyard_switch_node_connects_total{{node=\"{a}\"}}"
            ))
        })
        .sum();
    assert!(
        connects <= 3.0 + 1.0,
        "{connects} node connections for 9 requests"
    );
}

#[test]
fn content_aware_policies_keep_a_target_on_its_node() {
    let files: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| (format!("f{i}"), pattern(100, i)))
        .collect();
    let files_ref: Vec<(&str, Vec<u8>)> =
        files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
    for policy in [
        PolicyKind::Lard,
        PolicyKind::Chash,
        PolicyKind::LardR,
        PolicyKind::ExtLard,
        PolicyKind::Cap,
        PolicyKind::Lc,
        PolicyKind::Wrr,
    ] {
        let nodes = cluster(3, &files_ref);
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        // No health checks: the nodes' own request counts below must see
        // only the relayed requests.
        let sw = TestSwitch::start(&addrs, |c| {
            c.policy.name = policy;
            c.health_interval_ms = 0;
        });
        let mut c = sw.client();
        for round in 0..3 {
            for (i, (p, d)) in files.iter().enumerate() {
                let r = c.get(&format!("/{p}"));
                assert_eq!(r.status, 200, "{policy} {p}");
                assert_eq!(&r.body, d, "{policy} {p} round {round} file {i}");
            }
        }
        let stats = sw.sw().policy_stats();
        assert_eq!(stats.decisions, 36, "{policy}");
        if matches!(policy, PolicyKind::Lard | PolicyKind::LardR) {
            assert_eq!(stats.targets_mapped, 12, "{policy}");
            // Sequential requests: each target stays where it was first placed, so every node
            // served only its own targets: 12 targets × 3 rounds spread as mapped.
            let served: Vec<u64> = nodes.iter().map(|n| n.requests()).collect();
            assert_eq!(served.iter().sum::<u64>(), 36, "{policy} {served:?}");
            assert!(served.iter().all(|&s| s % 3 == 0), "{policy} {served:?}");
        }
    }
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let big = pattern(600 * 1024, 9); // above splice_min_bytes: moved with splice
    let mid = pattern(40 * 1024, 5); // copy loop
    let nodes = cluster(
        2,
        &[
            ("small", b"s".to_vec()),
            ("mid", mid.clone()),
            ("big", big.clone()),
        ],
    );
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let sw = TestSwitch::start(&addrs, |c| c.policy.name = PolicyKind::Rr);
    let mut c = sw.client();
    let order = [
        "small", "big", "who", "mid", "missing", "small", "big", "who", "mid",
    ];
    let mut batch = Vec::new();
    for p in order {
        batch.extend_from_slice(format!("GET /{p} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    }
    batch.extend_from_slice(b"HEAD /big HTTP/1.1\r\nHost: t\r\n\r\n");
    batch.extend_from_slice(b"GET /small HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    c.send(&batch);
    for p in order {
        let r = c.response(false);
        match p {
            "small" => assert_eq!(r.body, b"s"),
            "big" => assert!(r.body == big, "big body differs"),
            "mid" => assert!(r.body == mid, "mid body differs"),
            "who" => assert!(r.body.starts_with(b"node")),
            "missing" => assert_eq!(r.status, 404),
            _ => unreachable!(),
        }
    }
    let h = c.response(true);
    assert_eq!(h.status, 200);
    assert_eq!(h.header("Content-Length"), Some("614400"));
    let last = c.response(false);
    assert_eq!(last.body, b"s");
    assert_eq!(last.header("Connection"), Some("close"));
    assert!(c.is_closed());
    assert!(sw.metric("switchyard_switch_splice_bytes_total") > 0.0);
}

/// A response read whole leaves in one gathered write: its head, the body bytes read with the
/// head (left in the node connection's buffer) and the rest. A client with a small window cuts
/// those writes short; each goes on from where it stopped, across the parts, and every body
/// arrives whole and in order.
#[test]
fn gathered_responses_reach_a_client_with_a_small_window_whole() {
    // Under the splice threshold (64 KiB), over what the first read of a node's response takes.
    let bodies: Vec<_> = (0..4u8)
        .map(|i| pattern(40 * 1024 + 7000 * i as usize, i))
        .collect();
    let names: Vec<_> = (0..bodies.len()).map(|i| format!("f{i}")).collect();
    let files: Vec<_> = names
        .iter()
        .map(String::as_str)
        .zip(bodies.clone())
        .collect();
    let nodes = cluster(1, &files);
    let sw = TestSwitch::start(&[nodes[0].addr], |_| {});
    let mut c = Client::connect_with_receive_buffer(sw.addr, 4096);
    let mut batch = Vec::new();
    for _ in 0..3 {
        for i in 0..bodies.len() {
            batch.extend_from_slice(format!("GET /f{i} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        }
    }
    c.send(&batch);
    for round in 0..3 {
        for (i, body) in bodies.iter().enumerate() {
            let r = c.response(false);
            assert_eq!(r.status, 200);
            assert!(r.body == *body, "round {round}: body {i} differs");
        }
    }
    assert_eq!(sw.metric("switchyard_switch_splice_bytes_total"), 0.0);
}

#[test]
fn http10_clients_and_node_connection_reuse() {
    let nodes = cluster(1, &[("a", b"abc".to_vec())]);
    // Node connections are pooled per worker thread: with one worker, every client connection
    // must reuse the same node connection.
    let sw = TestSwitch::start(&[nodes[0].addr], |c| c.workers = 1);
    // HTTP/1.0 without keep-alive: answered and closed; the node connection is kept.
    for _ in 0..3 {
        let mut c = sw.client();
        let r = c.raw(b"GET /a HTTP/1.0\r\n\r\n");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abc"[..]));
        assert_eq!(r.header("Connection"), Some("close"));
        assert!(c.is_closed());
    }
    // HTTP/1.0 with keep-alive stays open.
    let mut c = sw.client();
    let r = c.raw(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(r.header("Connection"), Some("keep-alive"));
    let r = c.raw(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(r.body, b"abc");
    let connects = sw.metric(&format!(
        "switchyard_switch_node_connects_total{{node=\"{}\"}}",
        nodes[0].addr
    ));
    assert_eq!(connects, 1.0, "the pooled node connection was not reused");
}

#[test]
fn bodies_are_forwarded_and_responses_of_every_framing_relayed() {
    let (fake, _) = fake_node(|req| {
        let text = String::from_utf8_lossy(req).to_string();
        let first = text.lines().next().unwrap().to_owned();
        let body_at = find(req, b"\r\n\r\n").unwrap() + 4;
        let body = &req[body_at..];
        Some(match first.split(' ').nth(1).unwrap() {
            "/echo" => {
                let mut r = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Seen-Head: {}\r\n\r\n",
                    body.len(),
                    text.contains("X-Forwarded-For: 127.0.0.1") && !text.contains("Keep-Alive")
                )
                .into_bytes();
                r.extend_from_slice(body);
                r
            }
            "/chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".to_vec(),
            "/until-close" => b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it".to_vec(),
            "/early-hint" => b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n".to_vec(),
            "/smuggle" => b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
            "/two-lengths" => b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".to_vec(),
            "/fold" => b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 1\r\n\r\nx".to_vec(),
            "/bad-chunk" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
        })
    });
    let sw = TestSwitch::start(&[fake], |c| c.health_interval_ms = 0);
    let mut c = sw.client();
    let r = c.raw(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nKeep-Alive: 1\r\nContent-Length: 11\r\n\r\nhello world",
    );
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello world"[..]));
    assert_eq!(r.header("X-Seen-Head"), Some("true"));
    // Chunked request bodies go through as sent.
    let r = c.raw(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
    assert_eq!(r.body, b"3\r\nabc\r\n0\r\n\r\n");
    // Expect: 100-continue is answered by the switch, then the body flows.
    c.send(b"PUT /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
    assert_eq!(c.response(false).status, 100);
    let r = c.raw(b"data");
    assert_eq!(r.body, b"data");
    // A large body arriving in pieces.
    let big = pattern(300_000, 1);
    c.send(
        format!(
            "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
            big.len()
        )
        .as_bytes(),
    );
    // Larger than a socket buffer: the switch reads it in several pieces.
    for part in big.chunks(70_000) {
        c.send(part);
    }
    assert!(c.response(false).body == big);
    // Chunked response relayed to a 1.1 client as is.
    c.send(b"GET /chunked HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut got = Vec::new();
    while !got.ends_with(b"0\r\n\r\n") {
        let mut b = [0u8; 4096];
        let n = std::io::Read::read(&mut c.stream, &mut b).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&b[..n]);
    }
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("Transfer-Encoding: chunked\r\n"), "{text}");
    assert!(
        text.ends_with("\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
        "{text}"
    );
    // The connection goes on after a chunked response.
    assert_eq!(
        c.raw(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nz")
            .body,
        b"z"
    );
    // An interim 103, then the final 204.
    let mut c = sw.client();
    let r = c.raw(b"GET /early-hint HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 103);
    assert_eq!(c.response(false).status, 204);
    // A body delimited by the node's close: relayed, then the client connection closes.
    let mut c = sw.client();
    c.send(b"GET /until-close HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut all = Vec::new();
    std::io::Read::read_to_end(&mut c.stream, &mut all).unwrap();
    let text = String::from_utf8(all).unwrap();
    assert!(
        text.ends_with("\r\n\r\nall of it") && text.contains("Connection: close"),
        "{text}"
    );
    // Ambiguous or malformed node responses are never passed on: 502.
    for bad in ["/smuggle", "/two-lengths", "/fold"] {
        let mut c = sw.client();
        let r = c.get(bad);
        assert_eq!(r.status, 502, "{bad}");
        assert_eq!(r.body, b"502 Bad Gateway\n");
    }
    // A bad chunk after the head was sent: the client connection is cut.
    let mut c = sw.client();
    c.send(b"GET /bad-chunk HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut all = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c.stream, &mut all);
    assert!(!String::from_utf8_lossy(&all).contains("0\r\n\r\n"));
}

#[test]
fn bad_input_is_answered_while_other_clients_carry_on() {
    let nodes = cluster(2, &[("a", pattern(2000, 3))]);
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let sw = TestSwitch::start(&addrs, |c| {
        c.header_timeout_ms = 400;
        c.health_path = "/a".into();
        c.policy.name = PolicyKind::Rr;
    });
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let addr = sw.addr;
    // Each answer of the good client is also an event on `progress`.
    let (progress, answers) = std::sync::mpsc::channel::<()>();
    let good = {
        let (stop, ok) = (stop.clone(), ok.clone());
        std::thread::spawn(move || {
            let mut c = Client::connect(addr);
            let want = pattern(2000, 3);
            while !stop.load(Ordering::Relaxed) {
                let r = c.try_get("/a").expect("good client failed");
                assert_eq!(r.status, 200);
                assert!(r.body == want);
                ok.fetch_add(1, Ordering::Relaxed);
                let _ = progress.send(());
            }
        })
    };
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("CL with TE", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), 400),
        ("duplicate CL", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx".to_vec(), 400),
        ("invalid CL", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 1x\r\n\r\nx".to_vec(), 400),
        ("obs-fold", b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: a\r\n b\r\n\r\n".to_vec(), 400),
        ("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(), 400),
        ("missing Host", b"GET /a HTTP/1.1\r\n\r\n".to_vec(), 400),
        ("TE not chunked", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(), 400),
        ("TE foo", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: foo\r\n\r\n".to_vec(), 400),
        ("unknown TE", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: foo, chunked\r\n\r\n".to_vec(), 501),
        ("long URI", format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "a".repeat(9000)).into_bytes(), 414),
        ("big head", format!("GET /a HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "b".repeat(17_000)).into_bytes(), 431),
        ("too many headers", format!("GET /a HTTP/1.1\r\nHost: t\r\n{}\r\n", (0..120).map(|i| format!("X-{i}: v\r\n")).collect::<String>()).into_bytes(), 431),
        ("version", b"GET /a HTTP/2.0\r\n\r\n".to_vec(), 505),
        ("big body", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999\r\n\r\n".to_vec(), 413),
    ];
    for (name, req, want) in &cases {
        let mut c = sw.client();
        c.send(req);
        let r = c.response(false);
        assert_eq!(r.status, *want, "{name}");
        assert_eq!(r.header("Connection"), Some("close"), "{name}");
        assert!(c.is_closed(), "{name}: connection left open");
    }
    // Invalid chunk size in a request body: the head was fine, the body is not.
    let mut c = sw.client();
    c.send(
        b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    );
    assert_eq!(c.response(false).status, 400);
    assert!(c.is_closed());
    // A slow client (slowloris): a byte every 20 ms until the switch answers;
    // the header timeout (400 ms) cuts it off with 408.
    let mut c = sw.client();
    let t = std::time::Instant::now();
    c.drip(
        b"GET /a HTTP/1.1\r\nHost: t\r\nX-Slow: ",
        Duration::from_millis(20),
        Duration::from_secs(10),
    );
    let cut = t.elapsed();
    assert_eq!(c.try_response(false).map(|r| r.status), Ok(408));
    assert!(cut >= Duration::from_millis(400), "cut off after {cut:?}");
    // A client that connects and sends nothing is closed quietly.
    let mut idle = sw.client();
    assert!(idle.is_closed());

    // The good client still gets answers after all of that.
    let before = ok.load(Ordering::Relaxed);
    while answers.try_recv().is_ok() {}
    let more = answers.recv_timeout(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    good.join().unwrap();
    assert!(
        more.is_ok() && ok.load(Ordering::Relaxed) > before,
        "the good client stalled"
    );
    assert!(
        sw.metric("switchyard_switch_rejections_total{reason=\"bad_request\"}")
            >= cases.len() as f64
    );
    // The nodes never saw any of it.
    let node_errors: u64 = nodes
        .iter()
        .map(|n| {
            let m = n.node.as_ref().unwrap().metrics();
            (400..600).map(|s| m.status_count(s)).sum::<u64>()
        })
        .sum();
    assert_eq!(node_errors, 0);
}

#[test]
fn a_switch_and_a_node_that_defer_accepts_answer_as_before() {
    let node = TestNode::start(
        |root| std::fs::write(root.join("a"), b"abc").unwrap(),
        |c| c.defer_accept_ms = 1000,
    );
    // One worker: one listener, whose queue hands out connections in the order they complete.
    let sw = TestSwitch::start(&[node.addr], |c| {
        c.defer_accept_ms = 1000;
        c.workers = 1;
    });
    // A client that connects and says nothing is not accepted: the one behind it, which sends
    // its request, is answered while the switch has accepted it alone.
    let mut silent = sw.client();
    let mut c = sw.client();
    let r = c.raw(b"GET /a HTTP/1.0\r\n\r\n");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"abc"[..]));
    assert_eq!(sw.metric("switchyard_switch_connections_total"), 1.0);
    // Its first bytes complete it.
    let r = silent.raw(b"GET /a HTTP/1.0\r\n\r\n");
    assert_eq!(r.body, b"abc");
    assert_eq!(sw.metric("switchyard_switch_connections_total"), 2.0);
    for _ in 0..2 {
        let mut c = sw.client();
        let r = c.raw(b"GET /a HTTP/1.0\r\n\r\n");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abc"[..]));
        assert!(c.is_closed());
    }
    let mut c = sw.client();
    for _ in 0..2 {
        let r = c.raw(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.body, b"abc");
    }
}
