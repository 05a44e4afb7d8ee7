//! Dynamic content over real sockets: a node in front of a small application server
//! (`switchyard_testkit::app`), static files beside it.

mod common;

use std::io::Read;

use common::*;
use switchyard_node::DynamicConfig;
use switchyard_testkit::app::{closed_port, App};

const SITE: &[u8] = b"<h1>static</h1>\n";

/// A node serving `index.html` from its root and `/app/` from the application server at
/// `upstream`, with request bodies up to 8 MiB.
fn node(upstream: std::net::SocketAddr, tweak: impl FnOnce(&mut DynamicConfig)) -> TestNode {
    let mut d = DynamicConfig::new(upstream, vec!["/app/".into()]);
    tweak(&mut d);
    TestNode::start(
        |r| write(r, "index.html", SITE),
        |c| {
            c.max_body_bytes = 8 << 20;
            c.dynamic = Some(d);
        },
    )
}

fn upstream_errors(n: &TestNode, kind: &str) -> f64 {
    n.metric(&format!(
        "switchyard_node_upstream_errors_total{{kind=\"{kind}\"}}"
    ))
}

/// A chunked request body: `data` in pieces of `piece` bytes, with an extension and a
/// trailer.
fn chunked(data: &[u8], piece: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, c) in data.chunks(piece).enumerate() {
        out.extend_from_slice(format!("{:x};n={i}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\nX-Trailer: yes\r\n\r\n");
    out
}

/// Dynamic answers are the application's, static files are the node's, on one keep-alive
/// connection (pipelined too); the application's connection is pooled.
#[test]
fn dynamic_and_static_requests_share_a_connection() {
    let app = App::start();
    let n = node(app.addr, |_| {});
    let mut c = n.client();
    for (a, b) in [(2, 3), (40, 2), (7, 0)] {
        let r = c.get(&format!("/app/sum?a={a}&b={b}"));
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.text(), format!("sum={}\n", a + b));
        // One connection to the application carries them all.
        assert_eq!(r.header("X-App-Connection"), Some("1"));
        assert_eq!(r.header("X-Seen-Forwarded-For"), Some("127.0.0.1"));
        let r = c.get("/index.html");
        assert_eq!((r.status, r.body.as_slice()), (200, SITE));
    }
    // HEAD: the application's head without a body.
    c.send(b"HEAD /app/sum?a=1&b=1 HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.response(true);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Length"), Some("6"));
    // Pipelined: answered in order.
    c.send(
        b"GET /index.html HTTP/1.1\r\nHost: t\r\n\r\nGET /app/sum?a=5&b=5 HTTP/1.1\r\nHost: t\r\n\r\nGET /app/nothing HTTP/1.1\r\nHost: t\r\n\r\nGET /index.html HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(c.response(false).body, SITE);
    assert_eq!(c.response(false).text(), "sum=10\n");
    assert_eq!(c.response(false).status, 404);
    assert_eq!(c.response(false).body, SITE);
    // A path outside the patterns is static, even one the application would answer.
    assert_eq!(c.get("/app").status, 404);
    assert_eq!(n.metric("switchyard_node_upstream_requests_total"), 6.0);
    assert_eq!(n.metric("switchyard_node_upstream_connects_total"), 1.0);
    assert_eq!(
        app.seen
            .connections
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// A chunked response passes through as chunks; HTTP/1.0 gets a 502 for it (it cannot be
/// framed for that client) and the node stays healthy.
#[test]
fn chunked_responses_are_relayed() {
    let app = App::start();
    let n = node(app.addr, |_| {});
    let mut c = n.client();
    c.send(b"GET /app/chunked?n=200 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let mut all = Vec::new();
    c.stream.read_to_end(&mut all).unwrap();
    let text = String::from_utf8(all).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("Transfer-Encoding: chunked\r\n"), "{text}");
    assert!(text.contains("Connection: close\r\n"), "{text}");
    assert!(text.contains("9\r\nline 199\n\r\n0\r\n\r\n"), "{text}");
    let mut c = n.client();
    let r = c.raw(b"GET /app/chunked HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 502);
    assert_eq!(upstream_errors(&n, "response"), 1.0);
}

/// Request bodies reach the application intact, large ones by `Content-Length` and chunked
/// ones (as sent: chunk extensions and trailers included), after a `100 Continue` where the
/// client asked; the echoes come back whole.
#[test]
fn request_bodies_stream_to_the_application() {
    let app = App::start();
    let n = node(app.addr, |_| {});
    let mut c = n.client();
    let big = pattern(3 << 20, 1);
    let mut req = format!(
        "POST /app/echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        big.len()
    )
    .into_bytes();
    req.extend_from_slice(&big);
    let r = c.raw(&req);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("X-Framing"), Some("length"));
    assert!(r.body == big, "echo differs");

    let data = pattern(1 << 20, 2);
    let mut req =
        b"PUT /app/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    req.extend_from_slice(&chunked(&data, 10_000));
    let r = c.raw(&req);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("X-Framing"), Some("chunked"));
    assert!(r.body == data, "chunked echo differs");

    c.send(
        b"POST /app/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    );
    let r = c.response(false);
    assert_eq!(r.status, 100);
    c.send(b"hello");
    let r = c.response(false);
    assert_eq!((r.status, r.text().as_str()), (200, "hello"));
    // The same connection still serves static files.
    assert_eq!(c.get("/index.html").body, SITE);
    assert_eq!(app.seen.count_of("POST /app/echo"), 2);
    assert_eq!(app.seen.count_of("PUT /app/echo"), 1);
}

/// A malformed chunked body is the client's fault: 400, and the connection closes.
#[test]
fn a_bad_request_body_is_400() {
    let app = App::start();
    let n = node(app.addr, |_| {});
    let mut c = n.client();
    let r = c.raw(
        b"POST /app/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
    );
    assert_eq!(r.status, 400);
    assert!(c.is_closed());
    // The application never got a whole request.
    assert_eq!(app.seen.count_of("POST"), 0);
}

/// An application server that is down is 502 for dynamic paths, with a clean answer on the
/// same connection; static files are served as ever.
#[test]
fn upstream_down_is_502_and_static_files_are_unaffected() {
    let n = node(closed_port(), |_| {});
    let mut c = n.client();
    let r = c.get("/app/sum?a=1&b=2");
    assert_eq!(r.status, 502);
    assert_eq!(r.text(), "502 Bad Gateway\n");
    assert_eq!(c.get("/index.html").body, SITE);
    // A request whose body was not read cannot leave the connection open.
    let r = c.raw(b"POST /app/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc");
    assert_eq!(r.status, 502);
    assert!(c.is_closed());
    assert_eq!(n.client().get("/index.html").body, SITE);
    assert_eq!(upstream_errors(&n, "connect"), 2.0);
    assert_eq!(
        n.metric("switchyard_node_requests_total{status=\"502\"}"),
        2.0
    );
}

/// A refused response head and a response cut short before anything reached the client are
/// 502; an idempotent request whose pooled connection closed unanswered is sent once more on
/// a new connection, a POST never.
#[test]
fn bad_responses_are_502_and_only_idempotent_requests_are_sent_twice() {
    let app = App::start();
    let n = node(app.addr, |_| {});
    let mut c = n.client();
    assert_eq!(c.get("/app/bad").status, 502);
    assert_eq!(c.get("/app/cut").status, 502);
    assert_eq!(upstream_errors(&n, "response"), 1.0);
    assert_eq!(upstream_errors(&n, "broken"), 1.0);

    // Each call below starts on a pooled connection.
    let warm = |c: &mut Client| assert_eq!(c.get("/app/sum").status, 200);
    warm(&mut c);
    assert_eq!(c.get("/app/close").status, 502);
    assert_eq!(app.seen.count_of("GET /app/close"), 2);
    assert_eq!(n.metric("switchyard_node_upstream_retries_total"), 1.0);
    warm(&mut c);
    assert_eq!(
        c.raw(b"POST /app/close HTTP/1.1\r\nHost: t\r\n\r\n").status,
        502
    );
    warm(&mut c);
    let r = c.raw(b"POST /app/close HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nbody");
    assert_eq!(r.status, 502);
    assert_eq!(app.seen.count_of("POST /app/close"), 2);
    assert_eq!(n.metric("switchyard_node_upstream_retries_total"), 1.0);
    assert_eq!(upstream_errors(&n, "broken"), 4.0);
}

/// An application server that takes longer than `timeout_ms` is 504; the connection carries
/// the next request.
#[test]
fn a_stalled_application_is_504() {
    let app = App::start();
    let n = node(app.addr, |d| d.timeout_ms = 200);
    let mut c = n.client();
    assert_eq!(c.get("/app/stall").status, 504);
    let r = c.raw(b"POST /app/stall HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi");
    assert_eq!(r.status, 504);
    assert_eq!(c.get("/app/sum?a=1&b=1").text(), "sum=2\n");
    assert_eq!(upstream_errors(&n, "timeout"), 2.0);
    assert_eq!(
        n.metric("switchyard_node_requests_total{status=\"504\"}"),
        2.0
    );
}
