//! The live dashboard over real sockets: the page, the server-sent event stream (meta, then one
//! update per second that follows the traffic and the nodes' health), the viewer limit and
//! `/dashboard.json`.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use switchyard_admin::dashboard::{Meta, Update, COLUMNS};

/// A viewer of `/events`: reads one event at a time.
struct Viewer {
    lines: BufReader<TcpStream>,
}

impl Viewer {
    /// Connect and read the response head; returns the status line and the head.
    fn open(admin: SocketAddr) -> (String, Viewer) {
        let mut s = TcpStream::connect(admin).unwrap();
        // Updates come every second: a read waiting longer than this means none came.
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /events HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n")
            .unwrap();
        let mut lines = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut l = String::new();
            lines.read_line(&mut l).unwrap();
            head.push_str(&l);
            if l == "\r\n" || l.is_empty() {
                break;
            }
        }
        (head, Viewer { lines })
    }

    /// The next event's name and data (`retry` lines and comments skipped).
    fn next(&mut self) -> (String, String) {
        let (mut name, mut data) = (String::from("message"), String::new());
        loop {
            let mut l = String::new();
            let n = self.lines.read_line(&mut l).expect("an event within 5 s");
            assert!(n > 0, "the stream ended");
            let l = l.trim_end_matches('\n');
            if l.is_empty() {
                if !data.is_empty() {
                    return (name, data);
                }
                continue;
            }
            if let Some(v) = l.strip_prefix("event: ") {
                name = v.to_owned();
            } else if let Some(v) = l.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
    }

    fn meta(&mut self) -> Meta {
        let (name, data) = self.next();
        assert_eq!(name, "meta", "{data}");
        serde_json::from_str(&data).unwrap()
    }

    fn update(&mut self) -> Update {
        let (name, data) = self.next();
        assert_eq!(name, "update", "{data}");
        assert!(data.len() < 4096);
        serde_json::from_str(&data).unwrap()
    }
}

/// Keep-alive GETs of `path` on one client thread until the returned flag is set.
fn traffic(
    addr: SocketAddr,
    path: &'static str,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let t = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        let mut n = 0;
        // Bounded: at most 30 s of traffic whatever happens to the test.
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while !s.load(Ordering::Relaxed) && std::time::Instant::now() < end {
            match c.try_get(path) {
                Ok(r) if r.status == 200 => n += 1,
                _ => c = Client::connect(addr),
            }
        }
        n
    });
    (stop, t)
}

#[test]
fn the_page_is_served_from_the_binary() {
    let nodes = cluster(1, &[]);
    let sw = TestSwitch::start(&[nodes[0].addr], |_| {});
    let admin = sw.sw().admin_addr().unwrap();
    let mut c = Client::connect(admin);
    let r = c.get("/");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let page = r.text();
    assert!(
        page.contains("EventSource(\"events\")"),
        "the page follows /events"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "the page loads nothing from elsewhere"
    );
}

/// Two updates read while traffic flows differ, count the traffic on the node that served it,
/// with its response times and its target among the hot ones; a node that dies shows as down.
#[test]
fn updates_follow_traffic_and_health() {
    let mut nodes = cluster(2, &[("a.html", vec![b'a'; 5000])]);
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let sw = TestSwitch::start(&addrs, |c| {
        c.policy.name = switchyard_policy::PolicyKind::Lard;
        c.health_fall = 1;
    });
    let admin = sw.sw().admin_addr().unwrap();
    let (head, mut v) = Viewer::open(admin);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{head}"
    );
    let meta = v.meta();
    assert_eq!(meta.kind, "switch");
    assert_eq!(meta.policy, "lard");
    assert_eq!(meta.cols, COLUMNS.map(String::from).to_vec());
    assert_eq!(
        meta.nodes,
        addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>()
    );

    let (stop, load) = traffic(sw.addr, "/a.html");
    // The first update that saw traffic over its whole period, then the next one.
    let mut first = v.update();
    for _ in 0..5 {
        if first.c.rps.0 > 0.0 && first.n.iter().any(|n| n.p50.is_some()) {
            break;
        }
        first = v.update();
    }
    let second = v.update();
    stop.store(true, Ordering::Relaxed);
    let served = load.join().unwrap();
    assert!(served > 0);
    for u in [&first, &second] {
        assert!(u.c.rps.0 > 0.0, "{u:?}");
        assert!(u.c.mbps.0 > 0.0, "{u:?}");
        assert_eq!(u.n.len(), 2);
        // LARD sends one target to one node.
        let busy = u.n.iter().position(|n| n.rps.0 > 0.0).expect("a busy node");
        let row = &u.n[busy];
        assert!(row.p50.is_some() && row.p99.is_some(), "{row:?}");
        assert!(row.p50.unwrap().0 <= row.p99.unwrap().0);
        // One small file asked for again and again: the node answers it from its cache (the
        // first request of the run may have been the miss).
        assert!(row.hit.is_some_and(|h| h.0 >= 90.0), "{row:?}");
        assert_eq!(
            u.map.hot.first().map(|h| (h.0.as_str(), h.1)),
            Some(("/a.html", busy as u32))
        );
        assert!(u.n.iter().all(|n| n.up));
    }
    assert!(second.t.0 > first.t.0, "{:?} then {:?}", first.t, second.t);
    assert_ne!(first, second);

    // A node killed shows as down within the health checks' interval (100 ms here).
    nodes[1].kill();
    let mut down = false;
    for _ in 0..4 {
        let u = v.update();
        if !u.n[1].up {
            assert!(u.n[0].up);
            down = true;
            break;
        }
    }
    assert!(down, "node 1 still shown up");

    // The same state for scripts.
    let mut c = Client::connect(admin);
    let r = c.get("/dashboard.json");
    assert_eq!(r.status, 200);
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["meta"]["nodes"][1], addrs[1].to_string());
    assert_eq!(j["update"]["n"][1][0], 0, "{j}");
}

/// Viewers beyond `dashboard_viewers` are refused with a 503 that says why; a place freed by a
/// viewer that left is given to the next one.
#[test]
fn viewers_beyond_the_limit_are_refused() {
    let nodes = cluster(1, &[]);
    let sw = TestSwitch::start(&[nodes[0].addr], |c| c.dashboard_viewers = 2);
    let admin = sw.sw().admin_addr().unwrap();
    let (h1, mut v1) = Viewer::open(admin);
    let (h2, mut v2) = Viewer::open(admin);
    assert!(h1.starts_with("HTTP/1.1 200") && h2.starts_with("HTTP/1.1 200"));
    // Both are being served (their first event arrived) before the third asks.
    v1.meta();
    v2.meta();
    let mut c = Client::connect(admin);
    let r = c.get("/events");
    assert_eq!(r.status, 503);
    assert!(
        r.text().contains("too many dashboard viewers: at most 2"),
        "{}",
        r.text()
    );
    assert_eq!(r.header("retry-after"), Some("10"));
    // Other pages still answer.
    let mut c = Client::connect(admin);
    assert_eq!(c.get("/metrics").status, 200);

    drop(v2);
    // The switch notices the viewer left at its next write (the next update, within 1 s).
    assert!(eventually(Duration::from_secs(5), || {
        let (h, _v) = Viewer::open(admin);
        h.starts_with("HTTP/1.1 200")
    }));
    v1.update();
}
