//! Operator actions on the admin listener over real sockets: refused with 403 while
//! `admin_actions` is off (the default), not reachable by GET, and, when on, only with the
//! token the page gets from `/actions.json` and never from another origin. Draining a node
//! stops new requests to it and health checks leave it out; `up` brings it back; the
//! dashboard's stream shows the state.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use switchyard_admin::dashboard::{State, Update};

/// Send `req` on a new connection and read the response.
fn exchange(admin: SocketAddr, req: &str) -> Response {
    let mut c = Client::connect(admin);
    c.send(req.as_bytes());
    c.response(req.starts_with("HEAD "))
}

fn post(admin: SocketAddr, path: &str, extra: &str) -> Response {
    exchange(
        admin,
        &format!("POST {path} HTTP/1.1\r\nHost: {admin}\r\nContent-Length: 0\r\n{extra}\r\n"),
    )
}

fn json(r: &Response) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()))
}

fn generation(admin: SocketAddr) -> u64 {
    let r = exchange(admin, "GET /status.json HTTP/1.1\r\nHost: t\r\n\r\n");
    json(&r)["generation"].as_u64().unwrap()
}

/// The dashboard's updates as they come.
struct Stream(BufReader<TcpStream>);

impl Stream {
    fn open(admin: SocketAddr) -> Stream {
        let mut s = TcpStream::connect(admin).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /events HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        Stream(BufReader::new(s))
    }

    /// The next update event.
    fn update(&mut self) -> Update {
        let mut event = String::new();
        loop {
            let mut l = String::new();
            assert!(
                self.0.read_line(&mut l).expect("an event within 5 s") > 0,
                "the stream ended"
            );
            if let Some(v) = l.strip_prefix("event: ") {
                event = v.trim().to_owned();
            } else if let Some(d) = l.strip_prefix("data: ") {
                if event == "update" {
                    return serde_json::from_str(d.trim()).unwrap();
                }
            }
        }
    }

    /// Updates until node `i` is in `state` (at most `n` updates, one a second).
    fn until(&mut self, i: usize, state: State, n: usize) -> bool {
        (0..n).any(|_| self.update().n[i].state == state)
    }
}

#[test]
fn actions_are_refused_while_the_setting_is_off() {
    let nodes = cluster(2, &[]);
    let sw = TestSwitch::start(&[nodes[0].addr, nodes[1].addr], |_| {});
    let admin = sw.sw().admin_addr().unwrap();

    let info = exchange(admin, "GET /actions.json HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(info.status, 200);
    assert_eq!(
        json(&info),
        serde_json::json!({"enabled": false, "token": null})
    );
    let g = generation(admin);
    let path = format!("/actions/nodes/0/down?g={g}");
    let r = post(admin, &path, "X-Switchyard-Token: 00\r\n");
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("admin_actions"), "{}", r.text());
    // Not reachable by GET or HEAD.
    for method in ["GET", "HEAD"] {
        let r = exchange(
            admin,
            &format!("{method} {path} HTTP/1.1\r\nHost: t\r\n\r\n"),
        );
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.header("allow"), Some("POST"));
    }
    assert!(sw.node_up(nodes[0].addr), "nothing happened to the node");
    let page = exchange(admin, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").text();
    assert!(
        page.contains("actions.json"),
        "the page asks before it offers buttons"
    );
}

#[test]
fn with_the_setting_a_drain_holds_a_node_out_until_it_is_put_up() {
    let nodes = cluster(2, &[("f.html", b"x".repeat(100))]);
    let sw = TestSwitch::start(&[nodes[0].addr, nodes[1].addr], |c| {
        c.admin_actions = true;
        c.policy = switchyard_policy::PolicyConfig::new(switchyard_policy::PolicyKind::Rr);
    });
    let admin = sw.sw().admin_addr().unwrap();
    let info = json(&exchange(
        admin,
        "GET /actions.json HTTP/1.1\r\nHost: t\r\n\r\n",
    ));
    assert_eq!(info["enabled"], true);
    let token = info["token"].as_str().unwrap().to_owned();
    assert_eq!(token.len(), 32);
    let g = generation(admin);
    let drain = format!("/actions/nodes/0/drain?g={g}");

    // Without the token, with a wrong one, or from another origin: refused.
    for extra in [
        String::new(),
        "X-Switchyard-Token: 0123\r\n".to_owned(),
        format!("Origin: http://evil.example\r\nX-Switchyard-Token: {token}\r\n"),
    ] {
        let r = post(admin, &drain, &extra);
        assert_eq!(r.status, 403, "{extra:?}: {}", r.text());
    }
    assert!(sw.node_up(nodes[0].addr));
    // A page of an older configuration generation: refused with the current one.
    let r = post(
        admin,
        &format!("/actions/nodes/0/drain?g={}", g + 1),
        &format!("X-Switchyard-Token: {token}\r\n"),
    );
    assert_eq!(r.status, 409);
    assert_eq!(json(&r)["generation"], g);
    let r = post(
        admin,
        &format!("/actions/nodes/9/drain?g={g}"),
        &format!("X-Switchyard-Token: {token}\r\n"),
    );
    assert_eq!(r.status, 404);

    // The page's own request: same origin, the token.
    let mut stream = Stream::open(admin);
    let r = post(
        admin,
        &drain,
        &format!("Origin: http://{admin}\r\nX-Switchyard-Token: {token}\r\n"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let said = json(&r);
    assert_eq!(said["node"], nodes[0].addr.to_string());
    assert_eq!(said["state"], "drained", "nothing was in flight");
    assert!(!sw.node_up(nodes[0].addr));
    assert!(
        stream.until(0, State::Drained, 5),
        "the dashboard shows it drained"
    );

    // No new request reaches it, through several health-check intervals (node 1's checks
    // count them; node 0 answers but a held node stays out).
    let before = nodes[0].requests();
    let checks = sw.metric("switchyard_switch_health_checks_total");
    let mut c = sw.client();
    let mut n = 0;
    while sw.metric("switchyard_switch_health_checks_total") < checks + 4.0 {
        assert_eq!(c.get("/f.html").status, 200);
        n += 1;
        assert!(n < 100_000, "health checks stopped");
    }
    assert!(n >= 2);
    assert!(!sw.node_up(nodes[0].addr), "a health check brought it back");
    assert_eq!(nodes[0].requests(), before);

    // Up: it takes requests again (round robin: every other one).
    let r = post(
        admin,
        &format!("/actions/nodes/0/up?g={g}"),
        &format!("X-Switchyard-Token: {token}\r\n"),
    );
    assert_eq!(r.status, 200);
    assert_eq!(json(&r)["state"], "up");
    assert!(sw.node_up(nodes[0].addr));
    for _ in 0..4 {
        assert_eq!(c.get("/f.html").status, 200);
    }
    assert!(nodes[0].requests() > before);
    assert!(stream.until(0, State::Up, 5));

    // Marked down; then a reload that turns the setting off refuses the next action.
    let r = post(
        admin,
        &format!("/actions/nodes/1/down?g={g}"),
        &format!("X-Switchyard-Token: {token}\r\n"),
    );
    assert_eq!(json(&r)["state"], "marked down");
    assert!(stream.until(1, State::Held, 5));
    let mut cfg = switchyard_switch::SwitchConfig::with_nodes(&[nodes[0].addr, nodes[1].addr]);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.admin = Some("127.0.0.1:0".parse().unwrap());
    cfg.workers = 2;
    cfg.health_interval_ms = 100;
    cfg.health_timeout_ms = 500;
    cfg.policy = switchyard_policy::PolicyConfig::new(switchyard_policy::PolicyKind::Rr);
    sw.reload(cfg).unwrap();
    let r = post(
        admin,
        &format!("/actions/nodes/1/up?g={}", generation(admin)),
        &format!("X-Switchyard-Token: {token}\r\n"),
    );
    assert_eq!(r.status, 403);
    assert!(!sw.node_up(nodes[1].addr), "still held down");
}

/// A node drained with a request in flight shows draining until that request is answered (it
/// is, in full), then drained.
#[test]
fn a_drain_lets_the_request_in_flight_finish() {
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    // Both nodes hold `/slow` until the test releases it; anything else (health checks) is
    // answered at once.
    let (release, gate) = mpsc::channel::<()>();
    let gate = Arc::new(Mutex::new(gate));
    let node = |gate: Arc<Mutex<mpsc::Receiver<()>>>| {
        fake_node(move |req| {
            if req.starts_with(b"GET /slow ") {
                let _ = gate.lock().unwrap().recv_timeout(Duration::from_secs(20));
            }
            Some(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone".to_vec())
        })
        .0
    };
    let nodes = [node(gate.clone()), node(gate)];
    let sw = TestSwitch::start(&nodes, |c| c.admin_actions = true);
    let admin = sw.sw().admin_addr().unwrap();
    let token = json(&exchange(
        admin,
        "GET /actions.json HTTP/1.1\r\nHost: t\r\n\r\n",
    ))["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let g = generation(admin);
    let mut stream = Stream::open(admin);

    let addr = sw.addr;
    let slow = std::thread::spawn(move || Client::connect(addr).get("/slow"));
    let mut busy = None;
    for _ in 0..5 {
        if let Some(i) = stream.update().n.iter().position(|r| r.conns == 1) {
            busy = Some(i);
            break;
        }
    }
    let i = busy.expect("the slow request shows in flight on a node");
    let r = post(
        admin,
        &format!("/actions/nodes/{i}/drain?g={g}"),
        &format!("X-Switchyard-Token: {token}\r\n"),
    );
    let said = json(&r);
    assert_eq!(
        (said["state"].as_str(), said["in_flight"].as_u64()),
        (Some("draining"), Some(1))
    );
    assert!(stream.until(i, State::Draining, 5));
    release.send(()).unwrap();
    let answer = slow.join().unwrap();
    assert_eq!((answer.status, answer.body.as_slice()), (200, &b"done"[..]));
    assert!(stream.until(i, State::Drained, 5));
}
