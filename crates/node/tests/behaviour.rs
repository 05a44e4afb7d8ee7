//! The node over real sockets: timeouts, the object cache, sendfile,
//! the emulated disk, metrics and graceful shutdown.

mod common;

use common::*;
use std::io::Read;
use std::time::{Duration, Instant};

#[test]
fn header_timeout_answers_408_and_closes() {
    let n = TestNode::start(|r| write(r, "a.txt", b"a"), |c| c.header_timeout_ms = 300);
    let mut c = n.client();
    c.send(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n");
    let t = Instant::now();
    let r = c.response(false);
    assert_eq!(r.status, 408);
    assert!(t.elapsed() >= Duration::from_millis(250));
    assert!(c.is_closed());
    // A slow client that drips bytes (one every 20 ms, until the node
    // answers) is cut off by the same deadline.
    let mut c = n.client();
    let t = Instant::now();
    c.drip(
        b"GET /a.txt HTTP/1.1\r\nHost: t\r\nX-Slow: ",
        Duration::from_millis(20),
        Duration::from_secs(10),
    );
    let cut = t.elapsed();
    assert_eq!(
        c.response(false).status,
        408,
        "slowloris client was not cut off"
    );
    assert!(cut >= Duration::from_millis(250), "cut off after {cut:?}");
    assert!(n.metric("switchyard_node_timeouts_total") >= 2.0);
}

#[test]
fn idle_keep_alive_connections_are_closed() {
    let n = TestNode::start(|r| write(r, "a.txt", b"a"), |c| c.idle_timeout_ms = 300);
    let mut c = n.client();
    assert_eq!(c.get("/a.txt").status, 200);
    let t = Instant::now();
    assert!(c.is_closed());
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "closed after {waited:?}"
    );
    // A connection that never sends anything is closed too (header timeout).
    let n = TestNode::start(|r| write(r, "a.txt", b"a"), |c| c.header_timeout_ms = 300);
    let mut c = n.client();
    assert!(c.is_closed());
}

#[test]
fn cache_hits_misses_and_revalidation() {
    let n = TestNode::start(
        |r| {
            write(r, "a.txt", b"version one");
            write(r, "b.txt", b"bbbb");
        },
        |c| c.cache_revalidate_ms = 100,
    );
    let mut c = n.client();
    assert_eq!(c.get("/a.txt").body, b"version one");
    assert_eq!(n.metric("switchyard_node_cache_misses_total"), 1.0);
    for _ in 0..4 {
        assert_eq!(c.get("/a.txt").body, b"version one");
    }
    assert_eq!(n.metric("switchyard_node_cache_hits_total"), 4.0);
    assert_eq!(n.metric("switchyard_node_cache_objects"), 1.0);
    assert_eq!(n.metric("switchyard_node_cache_bytes"), 11.0);
    // A changed file is noticed once the revalidation interval (100 ms) has passed.
    write(n.root.path(), "a.txt", b"version two, longer");
    assert!(eventually(Duration::from_secs(10), || c.get("/a.txt").body
        == b"version two, longer"));
    // A deleted file stops being served.
    std::fs::remove_file(n.root.path().join("b.txt")).unwrap();
    assert_eq!(c.get("/b.txt").status, 404);
}

/// Within the revalidation interval the cached copy is served as it is, even if the file
/// changed: the node does not look at the disk for a hit.
#[test]
fn a_cached_copy_is_trusted_for_the_revalidation_interval() {
    let n = TestNode::start(
        |r| write(r, "a.txt", b"version one"),
        |c| c.cache_revalidate_ms = 3_600_000,
    );
    let mut c = n.client();
    assert_eq!(c.get("/a.txt").body, b"version one");
    write(n.root.path(), "a.txt", b"version two, longer");
    for _ in 0..3 {
        assert_eq!(c.get("/a.txt").body, b"version one");
    }
    assert_eq!(n.metric("switchyard_node_cache_hits_total"), 3.0);
}

/// A relaying switch asks (`X-Switchyard-Relay`) whether a response came from the cache and
/// is told in `X-Switchyard-Cache`; nobody else gets the field.
#[test]
fn the_cache_answer_goes_only_to_a_switch_that_asks() {
    let n = TestNode::start(|r| write(r, "a.txt", b"alpha"), |_| {});
    let mut c = n.client();
    let ask = |c: &mut Client, extra: &str| {
        c.send(format!("GET /a.txt HTTP/1.1\r\nHost: t\r\n{extra}\r\n").as_bytes());
        c.response(false)
    };
    let r = ask(&mut c, "X-Switchyard-Relay: 1\r\n");
    assert_eq!(
        (r.status, r.header("X-Switchyard-Cache")),
        (200, Some("miss"))
    );
    let r = ask(&mut c, "X-Switchyard-Relay: 1\r\n");
    assert_eq!(r.header("X-Switchyard-Cache"), Some("hit"));
    let r = ask(
        &mut c,
        "X-Switchyard-Relay: 1\r\nIf-None-Match: \"nothing\"\r\n",
    );
    assert_eq!(r.header("X-Switchyard-Cache"), Some("hit"));
    let etag = r.header("ETag").unwrap().to_owned();
    let r = ask(
        &mut c,
        &format!("X-Switchyard-Relay: 1\r\nIf-None-Match: {etag}\r\n"),
    );
    assert_eq!(
        (r.status, r.header("X-Switchyard-Cache")),
        (304, Some("hit"))
    );
    assert_eq!(ask(&mut c, "").header("X-Switchyard-Cache"), None);
    let r = c.raw(b"GET /none HTTP/1.1\r\nHost: t\r\nX-Switchyard-Relay: 1\r\n\r\n");
    assert_eq!((r.status, r.header("X-Switchyard-Cache")), (404, None));
}

#[test]
fn cache_stays_within_budget_and_evicts() {
    let n = TestNode::start(
        |r| {
            for i in 0..20 {
                write(r, &format!("f{i}.bin"), &pattern(10_000, i as u8));
            }
        },
        |c| {
            c.cache_bytes = 50_000;
            c.cache_policy = "gdsf".into();
        },
    );
    let mut c = n.client();
    for round in 0..2 {
        for i in 0..20 {
            let r = c.get(&format!("/f{i}.bin"));
            assert_eq!(r.body, pattern(10_000, i as u8), "round {round} file {i}");
        }
    }
    assert!(n.metric("switchyard_node_cache_bytes") <= 50_000.0);
    assert!(n.metric("switchyard_node_cache_evictions_total") >= 15.0);
    assert_eq!(n.metric("switchyard_node_cache_capacity_bytes"), 50_000.0);
}

/// Cached objects over 16 KiB share one memfd at their own offsets and leave with sendfile:
/// each comes back whole and in part, before and after others are evicted and their pages
/// taken by new ones, and the cache charges them in whole pages.
#[test]
fn large_cached_objects_are_sent_from_the_arena() {
    let sizes = [16 * 1024 + 1, 20_000, 40_000, 65_536, 100_000];
    let n = TestNode::start(
        move |r| {
            for (i, len) in sizes.iter().enumerate() {
                write(r, &format!("o{i}.bin"), &pattern(*len, i as u8));
            }
        },
        |c| {
            c.cache_bytes = 200 * 1024;
            c.cache_policy = "lru".into();
        },
    );
    let mut c = n.client();
    let mut sent = 0.0;
    for round in 0..3 {
        for (i, &len) in sizes.iter().enumerate() {
            let want = pattern(len, i as u8);
            let r = c.get(&format!("/o{i}.bin"));
            assert!(r.body == want, "round {round} object {i}");
            let range =
                format!("GET /o{i}.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=4000-8191\r\n\r\n");
            let r = c.raw(range.as_bytes());
            assert_eq!(r.status, 206);
            assert!(
                r.body == want[4000..8192],
                "round {round} object {i}, range"
            );
            sent += (len + 4192) as f64;
        }
    }
    // Not all fit: objects went and their pages were reused.
    assert!(n.metric("switchyard_node_cache_evictions_total") >= 2.0);
    let held = n.metric("switchyard_node_cache_bytes");
    assert!(held > 0.0 && held <= 200.0 * 1024.0);
    assert_eq!(held % 4096.0, 0.0, "charged in whole pages: {held}");
    assert!(n.metric("switchyard_node_sendfile_bytes_total") >= sent);
}

#[test]
fn large_files_bypass_the_cache_and_use_sendfile() {
    let big = pattern(3 * 1024 * 1024 + 17, 9);
    let b2 = big.clone();
    let n = TestNode::start(
        move |r| write(r, "big.bin", &b2),
        |c| c.cache_max_object_bytes = 64 * 1024,
    );
    let mut c = n.client();
    let r = c.get("/big.bin");
    assert_eq!(r.body.len(), big.len());
    assert!(r.body == big);
    let r = c.raw(b"GET /big.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=1000000-1000099\r\n\r\n");
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &big[1_000_000..1_000_100]);
    // Pipelined after a sendfile response, the next answer is intact.
    c.send(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\nHEAD /big.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(c.response(false).body == big);
    assert_eq!(c.response(true).status, 200);
    assert_eq!(n.metric("switchyard_node_cache_objects"), 0.0);
    assert!(n.metric("switchyard_node_sendfile_bytes_total") >= 2.0 * big.len() as f64);
}

#[test]
fn emulated_disk_delays_misses_only() {
    let n = TestNode::start(
        |r| write(r, "a.bin", &pattern(100_000, 1)),
        |c| {
            c.disk.latency_us = 80_000;
            c.disk.bandwidth_bytes_per_sec = 1_000_000; // +100 ms for 100 kB
        },
    );
    let mut c = n.client();
    let t = Instant::now();
    assert_eq!(c.get("/a.bin").status, 200);
    let miss = t.elapsed();
    assert!(miss >= Duration::from_millis(175), "miss took {miss:?}");
    // Two misses in parallel queue behind each other on the one disk.
    let n2 = TestNode::start(
        |r| {
            write(r, "x.bin", b"x");
            write(r, "y.bin", b"y");
        },
        |c| c.disk.latency_us = 150_000,
    );
    let t = Instant::now();
    let addr = n2.addr;
    let h = std::thread::spawn(move || Client::connect(addr).get("/x.bin").status);
    assert_eq!(n2.client().get("/y.bin").status, 200);
    assert_eq!(h.join().unwrap(), 200);
    assert!(
        t.elapsed() >= Duration::from_millis(290),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(n2.metric("switchyard_node_disk_queue"), 0.0);
}

#[test]
fn metrics_count_requests_by_status_and_bytes() {
    let n = TestNode::start(|r| write(r, "a.txt", b"12345"), |_| {});
    let mut c = n.client();
    for _ in 0..3 {
        c.get("/a.txt");
    }
    c.get("/nope");
    let text = n.metrics();
    assert!(
        text.contains("switchyard_node_requests_total{status=\"200\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_node_requests_total{status=\"404\"} 1"),
        "{text}"
    );
    // The response time is observed just after the response is handed to
    // the kernel, so the client can see its bytes a moment before the count.
    assert!(
        eventually(Duration::from_secs(5), || {
            n.metric("switchyard_node_response_seconds_count") >= 4.0
        }),
        "response times never counted:\n{}",
        n.metrics()
    );
    assert_eq!(n.metric("switchyard_node_response_seconds_count"), 4.0);
    assert!(n.metric("switchyard_node_bytes_out_total") > 15.0);
    assert_eq!(n.metric("switchyard_node_connections_active"), 1.0);
    assert_eq!(n.metric("switchyard_node_connections_total"), 1.0);
    // Accept failures are exported (none here: descriptors were never short).
    assert_eq!(n.metric("switchyard_node_accept_failures_total"), 0.0);
    assert_eq!(n.metric("switchyard_node_accept_backoffs_total"), 0.0);
    let mut h = Client::connect(n.admin());
    assert_eq!(h.get("/healthz").status, 200);
}

#[test]
fn shutdown_closes_idle_connections_and_stops_accepting() {
    let mut n = TestNode::start(|r| write(r, "a.txt", b"a"), |_| {});
    let mut idle = n.client();
    assert_eq!(idle.get("/a.txt").status, 200);
    let node = n.node.take().unwrap();
    let t = Instant::now();
    n.rt.block_on(node.shutdown(Duration::from_secs(5)));
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "idle connection held shutdown"
    );
    let mut b = [0u8; 1];
    assert!(matches!(idle.stream.read(&mut b), Ok(0) | Err(_)));
    assert!(
        std::net::TcpStream::connect(n.addr).is_err(),
        "still accepting"
    );
}

#[test]
fn bad_config_is_a_clear_error() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cfg = switchyard_node::NodeConfig {
        root: "/definitely/not/here".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    };
    let e = rt.block_on(switchyard_node::start(cfg)).err().unwrap();
    assert!(e.to_string().contains("/definitely/not/here"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = switchyard_node::NodeConfig {
        root: dir.path().into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        cache_policy: "fifo".into(),
        ..Default::default()
    };
    let e = rt.block_on(switchyard_node::start(cfg)).err().unwrap();
    assert!(e.to_string().contains("cache_policy"), "{e}");
}
