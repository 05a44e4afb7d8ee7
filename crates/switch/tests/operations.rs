//! The switch in operation: a node dying under load, health checks, reload under load,
//! admission control and overload, graceful drain, load reports and metrics.

mod common;

use common::*;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use switchyard_policy::PolicyKind;

/// Client threads doing keep-alive GETs of `paths` until stopped; every failure is recorded.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, clients: usize, paths: Vec<(String, Vec<u8>)>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let paths = Arc::new(paths);
        let threads = (0..clients)
            .map(|k| {
                let (stop, ok, failures, paths) =
                    (stop.clone(), ok.clone(), failures.clone(), paths.clone());
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    let mut i = k;
                    while !stop.load(Ordering::Relaxed) {
                        let (p, want) = &paths[i % paths.len()];
                        i += 1;
                        match c.try_get(p) {
                            Ok(r) if r.status == 200 && &r.body == want => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(r) => {
                                failures
                                    .lock()
                                    .unwrap()
                                    .push(format!("{p}: status {}", r.status));
                                c = Client::connect(addr);
                            }
                            Err(e) => {
                                failures.lock().unwrap().push(format!("{p}: {e}"));
                                c = Client::connect(addr);
                            }
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failures,
            threads,
        }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Wait until `n` more requests succeeded.
    fn advance(&self, n: u64) {
        let target = self.ok() + n;
        assert!(
            eventually(Duration::from_secs(10), || self.ok() >= target),
            "load stalled at {} (failures {:?})",
            self.ok(),
            self.failures.lock().unwrap()
        );
    }

    fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let f = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::Relaxed), f)
    }
}

fn site(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| (format!("/f{i}"), pattern(500 + i * 37, i as u8)))
        .collect()
}

fn files_of(site: &[(String, Vec<u8>)]) -> Vec<(&str, Vec<u8>)> {
    site.iter().map(|(p, d)| (&p[1..], d.clone())).collect()
}

#[test]
fn a_node_killed_under_load_fails_no_idempotent_request() {
    let s = site(30);
    for policy in [PolicyKind::Lard, PolicyKind::Rr] {
        let mut nodes = cluster(3, &files_of(&s));
        let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
        let sw = TestSwitch::start(&addrs, |c| {
            c.policy.name = policy;
            c.health_path = "/f0".into();
        });
        let load = Load::start(sw.addr, 6, s.clone());
        load.advance(300);
        let victim = nodes[1].addr;
        nodes[1].kill();
        load.advance(300);
        assert!(
            eventually(Duration::from_secs(3), || !sw.node_up(victim)),
            "{policy}: the dead node stayed in the pool"
        );
        load.advance(300);
        let (ok, failures) = load.finish();
        assert!(
            failures.is_empty(),
            "{policy}: {} failed: {failures:?}",
            failures.len()
        );
        assert!(ok >= 900);
        // Its targets went elsewhere: the survivors served everything after the kill.
        let stats = sw.sw().policy_stats();
        assert!(!stats.nodes[1].up, "{policy}");
        if policy == PolicyKind::Lard {
            assert_eq!(stats.nodes[1].targets, 0);
            assert!(stats.reassignments > 0);
        }
    }
}

#[test]
fn health_checks_take_a_node_out_and_bring_it_back() {
    let mut nodes = cluster(2, &[("h", b"ok".to_vec())]);
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let sw = TestSwitch::start(&addrs, |c| {
        c.health_path = "/h".into();
        c.health_fall = 2;
        c.health_rise = 2;
        c.policy.name = PolicyKind::Rr;
    });
    let victim = addrs[0];
    assert!(sw.node_up(victim));
    nodes[0].kill();
    // No traffic: only the active checks can notice.
    assert!(eventually(Duration::from_secs(3), || !sw.node_up(victim)));
    let mut c = sw.client();
    for _ in 0..4 {
        assert_eq!(c.get("/who").body, b"node1");
    }
    // A new node on the same address is taken back after `health_rise` good checks.
    let back = TestNode::start_on(victim, |r| write(r, "h", b"ok"), |_| {});
    assert!(eventually(Duration::from_secs(3), || sw.node_up(victim)));
    let mut who = std::collections::HashSet::new();
    for _ in 0..4 {
        who.insert(c.get("/h").status);
    }
    assert_eq!(who.into_iter().collect::<Vec<_>>(), vec![200]);
    assert!(
        back.requests() >= 2,
        "the node that came back got no requests"
    );
    assert!(sw.metric("switchyard_switch_health_failures_total") >= 2.0);
    assert!(sw.metric("switchyard_switch_node_transitions_total") >= 2.0);
}

#[test]
fn reload_under_load_fails_no_request() {
    let s = site(20);
    let nodes = cluster(3, &files_of(&s));
    let addrs: Vec<_> = nodes.iter().map(|n| n.addr).collect();
    let sw = TestSwitch::start(&addrs[..2], |c| {
        c.policy.name = PolicyKind::Lard;
        c.health_path = "/f0".into();
    });
    let load = Load::start(sw.addr, 6, s.clone());
    load.advance(200);
    // Add the third node, drop the first, change the policy.
    let mut cfg = switchyard_switch::SwitchConfig::with_nodes(&addrs[1..]);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.admin = Some("127.0.0.1:0".parse().unwrap());
    cfg.workers = 2;
    cfg.health_interval_ms = 100;
    cfg.health_path = "/f0".into();
    cfg.policy.name = PolicyKind::Chash;
    sw.reload(cfg.clone()).unwrap();
    let first_after = nodes[0].requests();
    load.advance(300);
    // Reload back and forth a few times under load.
    for k in 0..4 {
        let mut c2 = cfg.clone();
        c2.policy.name = if k % 2 == 0 {
            PolicyKind::Rr
        } else {
            PolicyKind::LardR
        };
        c2.nodes = cfg.nodes.clone();
        sw.reload(c2).unwrap();
        load.advance(100);
    }
    let (ok, failures) = load.finish();
    assert!(failures.is_empty(), "{failures:?}");
    assert!(ok >= 600);
    assert!(nodes[2].requests() > 0, "the added node got no requests");
    // The removed node only finished what it had in flight.
    assert!(nodes[0].requests() <= first_after + 6);
    assert_eq!(sw.metric("switchyard_switch_reloads_total"), 5.0);
    // Keys that need a restart are refused, and nothing changes.
    let mut bad = cfg.clone();
    bad.listen = "127.0.0.1:1".parse().unwrap();
    assert!(sw.reload(bad).is_err());
    let mut bad = cfg.clone();
    bad.defer_accept_ms = 1000;
    let e = sw.reload(bad).unwrap_err();
    assert!(e.to_string().contains("defer_accept_ms"), "{e}");
    let mut bad = cfg.clone();
    bad.nodes.clear();
    assert!(sw.reload(bad).is_err());
    assert_eq!(sw.metric("switchyard_switch_reloads_total"), 5.0);
}

#[test]
fn saturated_nodes_queue_then_answer_503_with_retry_after() {
    // Every miss waits 300 ms on the emulated disk (no cache): requests stay in flight.
    let node = TestNode::start(
        |r| {
            for i in 0..8 {
                write(r, &format!("s{i}"), b"slow");
            }
        },
        |c| {
            c.cache_bytes = 0;
            c.disk.latency_us = 300_000;
        },
    );
    let sw = TestSwitch::start(&[node.addr], |c| {
        c.node_max_inflight = 1;
        c.queue_max = 1;
        c.queue_timeout_ms = 2_000;
        c.retry_after_secs = 7;
        c.health_interval_ms = 0;
        c.policy.name = PolicyKind::Rr;
    });
    let addr = sw.addr;
    let t = Instant::now();
    let active = format!("switchyard_switch_node_active{{node=\"{}\"}}", node.addr);
    let get = move |i: usize| {
        std::thread::spawn(move || {
            let mut c = Client::connect(addr);
            let r = c.get(&format!("/s{i}"));
            (r.status, r.header("Retry-After").map(str::to_owned))
        })
    };
    // The first in flight on the node, the second waiting in the queue, then
    // the third.
    let mut handles = vec![get(0)];
    assert!(eventually(Duration::from_secs(5), || sw.metric(&active) == 1.0));
    handles.push(get(1));
    assert!(eventually(Duration::from_secs(5), || {
        sw.metric("switchyard_switch_queue_length") == 1.0
    }));
    handles.push(get(2));
    let mut got: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    got.sort();
    // One in flight, one queued (served after the first), one refused.
    assert_eq!(got[0].0, 200);
    assert_eq!(got[1].0, 200);
    assert_eq!(got[2], (503, Some("7".to_owned())));
    assert!(t.elapsed() >= Duration::from_millis(550));
    assert_eq!(
        sw.metric("switchyard_switch_rejections_total{reason=\"queue_full\"}"),
        1.0
    );

    // A queued request that waits too long gets 503 as well.
    let sw2 = TestSwitch::start(&[node.addr], |c| {
        c.node_max_inflight = 1;
        c.queue_timeout_ms = 100;
        c.health_interval_ms = 0;
    });
    let a2 = sw2.addr;
    let first = std::thread::spawn(move || Client::connect(a2).get("/s5").status);
    assert!(eventually(Duration::from_secs(5), || sw2.metric(&active) == 1.0));
    let r = sw2.client().get("/s6");
    assert_eq!(r.status, 503);
    assert_eq!(r.header("Retry-After"), Some("1"));
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(
        sw2.metric("switchyard_switch_rejections_total{reason=\"queue_timeout\"}"),
        1.0
    );
}

#[test]
fn at_the_cap_the_longest_waiting_connection_is_shed_and_only_busy_ones_make_a_503() {
    // A node that holds `/hold` requests until the test releases them.
    let (release, held) = std::sync::mpsc::channel::<()>();
    let held = std::sync::Mutex::new(held);
    let (fake, seen) = fake_node(move |req| {
        if req.starts_with(b"GET /hold ") {
            held.lock().unwrap().recv().ok()?;
        }
        Some(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec())
    });
    let sw = TestSwitch::start(&[fake], |c| {
        c.max_connections = Some(2);
        c.health_interval_ms = 0;
    });
    // Two idle keep-alive connections fill the slots; `a` has waited longest.
    let mut a = sw.client();
    let mut b = sw.client();
    assert_eq!(a.get("/x").status, 200);
    assert_eq!(b.get("/x").status, 200);
    // A newcomer takes the slot of `a`, which is closed without a word.
    let mut c = sw.client();
    assert_eq!(c.get("/x").status, 200);
    assert!(a.is_closed());
    // A client still sending its head waits on its client too: it takes the slot of `b`...
    let mut slow = sw.client();
    slow.send(b"GET /x HTTP/1.1\r\nHo");
    assert!(b.is_closed());
    // ...and is shed in its turn once `c` is busy.
    c.send(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n");
    // (Until the switch has read it, `c` still waits on its client, and it waited longer.)
    assert!(eventually(Duration::from_secs(5), || seen
        .load(Ordering::Relaxed)
        == 4));
    let mut d = sw.client();
    d.send(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(slow.is_closed(), "the half-sent head was not shed");
    // (Counted just after the shed connection is told to close.)
    assert!(eventually(Duration::from_secs(5), || sw
        .metric("switchyard_switch_connections_shed_total")
        == 3.0));
    // Both slots busy with requests at the node: nothing to shed, so a newcomer gets 503.
    assert!(eventually(Duration::from_secs(5), || seen
        .load(Ordering::Relaxed)
        == 5));
    let mut e = sw.client();
    let r = e.raw(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 503);
    assert!(r.header("Retry-After").is_some());
    assert!(e.is_closed());
    assert!(sw.metric("switchyard_switch_rejections_total{reason=\"connection_limit\"}") >= 1.0);
    release.send(()).unwrap();
    release.send(()).unwrap();
    assert_eq!(c.response(false).body, b"ok");
    assert_eq!(d.response(false).body, b"ok");
}

#[test]
fn no_node_up_is_503_and_connect_failures_are_retried() {
    // One live node and one address nobody listens on.
    let nodes = cluster(1, &[("x", b"x".to_vec())]);
    let dead: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let sw = TestSwitch::start(&[dead, nodes[0].addr], |c| {
        c.policy.name = PolicyKind::Rr;
        c.health_interval_ms = 60_000; // only failed connections can notice
    });
    let mut c = sw.client();
    for _ in 0..6 {
        let r = c.get("/x");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"x"[..]));
    }
    assert!(!sw.node_up(dead));
    assert!(sw.metric("switchyard_switch_retries_total") >= 1.0);
    // Non-idempotent requests are not retried: a POST to the dead node would be a 502, but the
    // dead node is out of the pool now, so it goes to the live one (which answers 405).
    assert_eq!(
        c.raw(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
            .status,
        405
    );

    let sw = TestSwitch::start(&[dead], |c| c.health_interval_ms = 60_000);
    let mut c = sw.client();
    let r = c.get("/x");
    assert_eq!(r.status, 502);
    let r = c.get("/x");
    assert_eq!(r.status, 503);
    assert!(r.header("Retry-After").is_some());
    assert_eq!(
        sw.metric("switchyard_switch_rejections_total{reason=\"no_node\"}"),
        1.0
    );
}

#[test]
fn shutdown_drains_busy_connections_and_closes_idle_ones() {
    let node = TestNode::start(
        |r| write(r, "slow", b"done"),
        |c| {
            c.cache_bytes = 0;
            c.disk.latency_us = 400_000;
        },
    );
    let mut sw = TestSwitch::start(&[node.addr], |c| c.health_interval_ms = 0);
    let mut idle = sw.client();
    assert_eq!(idle.get("/who").status, 404);
    let mut busy = sw.client();
    busy.send(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n");
    let active = format!("switchyard_switch_node_active{{node=\"{}\"}}", node.addr);
    assert!(eventually(Duration::from_secs(5), || sw.metric(&active) == 1.0));
    let running = sw.sw.take().unwrap();
    let t = Instant::now();
    let drained = std::thread::spawn({
        let handle = sw.rt.handle().clone();
        move || handle.block_on(running.shutdown(Duration::from_secs(5)))
    });
    let r = busy.response(false);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"done"[..]));
    assert_eq!(r.header("Connection"), Some("close"));
    assert!(busy.is_closed());
    assert!(idle.is_closed());
    drained.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(eventually(Duration::from_secs(2), || {
        std::net::TcpStream::connect(sw.addr).is_err()
    }));
}

#[test]
fn nodes_push_load_reports_and_metrics_show_nodes_and_policy() {
    // The switch first, so that the nodes know where to report.
    let placeholder: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let sw = TestSwitch::start(&[placeholder], |c| {
        c.report_listen = Some("127.0.0.1:0".parse().unwrap());
        c.health_interval_ms = 100;
    });
    let report_to = sw.sw().report_addr().unwrap();
    let nodes: Vec<TestNode> = (0..2)
        .map(|_| TestNode::start(|r| write(r, "r", b"r"), |c| c.report_to = Some(report_to)))
        .collect();
    let mut cfg = switchyard_switch::SwitchConfig::with_nodes(&[nodes[0].addr, nodes[1].addr]);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.admin = Some("127.0.0.1:0".parse().unwrap());
    cfg.report_listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.workers = 2;
    cfg.health_interval_ms = 100;
    cfg.policy.name = PolicyKind::ExtLard;
    sw.reload(cfg).unwrap();
    let mut c = sw.client();
    for _ in 0..10 {
        assert_eq!(c.get("/r").status, 200);
    }
    assert!(eventually(Duration::from_secs(3), || sw
        .metric("switchyard_switch_load_reports_total")
        >= 2.0));
    let stats = sw.sw().policy_stats();
    assert!(stats.nodes.iter().any(|n| n.report.is_some()), "{stats:?}");
    // A request is counted once its response has reached the client, so the
    // client can see the last response a moment before the counters do.
    assert!(eventually(Duration::from_secs(3), || sw
        .metric("switchyard_switch_relay_seconds_count")
        >= 10.0));
    let text = sw.metrics();
    for family in [
        "switchyard_switch_requests_total{status=\"200\"} 10",
        &format!(
            "switchyard_switch_node_requests_total{{node=\"{}\"}}",
            nodes[0].addr
        ),
        &format!("switchyard_switch_node_up{{node=\"{}\"}} 1", nodes[1].addr),
        "switchyard_switch_policy_decisions_total{policy=\"ext-lard\"} 10",
        "switchyard_switch_policy_targets_mapped{policy=\"ext-lard\"}",
        "switchyard_switch_policy_replicas{policy=\"ext-lard\"}",
        "switchyard_switch_policy_reassignments_total{policy=\"ext-lard\"}",
        "switchyard_switch_rejections_total{reason=\"queue_full\"} 0",
        "switchyard_switch_queue_length 0",
        "switchyard_switch_relay_seconds_count 10",
        "switchyard_switch_node_bytes_total",
        "switchyard_switch_node_failures_total",
        "switchyard_switch_node_active",
    ] {
        assert!(text.contains(family), "missing {family} in\n{text}");
    }
    let mut status = Client::connect(sw.sw().admin_addr().unwrap());
    let r = status.get("/status.json");
    let json = String::from_utf8(r.body).unwrap();
    assert!(
        json.contains("\"policy\":\"ext-lard\"") && json.contains("\"up\":true"),
        "{json}"
    );
}
