//! The switch relaying over real sockets against malformed framing, in requests and in what
//! a node answers: strict chunk-size lines and trailers, bare LF in heads, 400 (not 505 or 501)
//! for malformed request lines and a non-final `chunked`, later HTTP/1 minor versions relayed
//! as HTTP/1.1, a prompt 413 for a declared chunk beyond the body limit, and never a head
//! forwarded that the node would refuse for its size once the switch's own fields are added.

mod common;

use common::*;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A scripted node answering `/echo` with the request it got, `/x` with a fixed body and any
/// other path from `bad` by its name.
fn scripted() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    fake_node(|req| {
        let text = String::from_utf8_lossy(req).to_string();
        let path = text.split(' ').nth(1).unwrap_or("").to_owned();
        Some(match path.as_str() {
            "/echo" => {
                let mut r = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", req.len())
                    .into_bytes();
                r.extend_from_slice(req);
                r
            }
            "/x" => b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx".to_vec(),
            "/lf-status" => b"HTTP/1.1 200 OK\nContent-Length: 1\r\n\r\nx".to_vec(),
            "/lf-field" => b"HTTP/1.1 200 OK\r\nContent-Length: 1\nX: y\r\n\r\nx".to_vec(),
            "/lf-end" => b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\nx".to_vec(),
            "/chunk-junk" => {
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1 junk\r\nx\r\n0\r\n\r\n"
                    .to_vec()
            }
            "/chunk-space" => {
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0 5\r\n\r\n".to_vec()
            }
            "/trailer-request-line" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nGET / HTTP/1.1\r\n\r\n".to_vec(),
            "/trailer-nul" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nX: \x00\r\n\r\n".to_vec(),
            "/trailer-ok" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;a=\"b\"\r\nx\r\n0\r\nX-T: 1\r\n\r\n".to_vec(),
            _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
        })
    })
}

/// Send `req` on a new connection; the status and whether the switch then closed.
fn answer(addr: std::net::SocketAddr, req: &[u8]) -> u16 {
    let mut c = Client::connect(addr);
    c.send(req);
    c.response(false).status
}

#[test]
fn malformed_requests_are_refused_before_any_node_sees_them() {
    let (fake, seen) = scripted();
    let sw = TestSwitch::start(&[fake], |c| {
        c.health_interval_ms = 0;
        c.header_timeout_ms = 60_000;
    });
    let chunked = |body: &[u8]| {
        let mut r =
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        r.extend_from_slice(body);
        r
    };
    let mut cases: Vec<Vec<u8>> = [
        &b"2 erfrferferf\r\nab\r\n0\r\n\r\n"[..],
        b"2 3\r\nab\r\n0\r\n\r\n",
        b"0 5\r\n\r\n",
        b"2\t\r\nab\r\n0\r\n\r\n",
        b"0\r\nGET /x HTTP/1.1\r\n\r\n",
        b"0\r\nX-A: \x00\r\n\r\n",
        b"0\r\n X-A: 1\r\n\r\n",
    ]
    .iter()
    .map(|b| chunked(b))
    .collect();
    for req in [
        &b"GET /x HTTP/1.1\nHost: t\r\n\r\n"[..],
        b"GET /x HTTP/1.1\r\nHost: t\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: t\r\n\n",
        b"GET /x HTTP/1.1\nHost: t",
        b"GET /x y HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /x\ty HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /x  HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /x\ny HTTP/1.1\r\nHost: t\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    ] {
        cases.push(req.to_vec());
    }
    for req in &cases {
        assert_eq!(
            answer(sw.addr, req),
            400,
            "{:?}",
            String::from_utf8_lossy(req)
        );
    }
    // A 2 GiB chunk is refused on its size line: 413 long before the header timeout.
    let t = Instant::now();
    assert_eq!(answer(sw.addr, &chunked(b"80000000\r\n")), 413);
    assert!(t.elapsed().as_secs() < 10, "took {:?}", t.elapsed());
    assert_eq!(
        seen.load(Ordering::Relaxed),
        0,
        "a node saw a refused request"
    );
    // What the grammar allows goes through as sent.
    // (The scripted node finds the end of a chunked body by its last bytes `0 CRLF CRLF`.)
    let body = b"2 ; a = \"b c\";d\r\nab\r\n0;e=f\r\nX-T: 0\r\n\r\n";
    let mut c = sw.client();
    let r = c.raw(&chunked(body));
    assert_eq!(r.status, 200);
    assert!(
        r.body.ends_with(body),
        "{:?}",
        String::from_utf8_lossy(&r.body)
    );
    // HTTP/1.2 is relayed and answered as HTTP/1.1: the connection stays open.
    c.send(b"GET /x HTTP/1.2\r\nHost: t\r\n\r\nGET /x HTTP/1.2\r\nHost: t\r\n\r\n");
    assert_eq!(c.response(false).body, b"x");
    assert_eq!(c.response(false).body, b"x");
    assert_eq!(seen.load(Ordering::Relaxed), 3);
}

#[test]
fn malformed_node_responses_are_never_passed_on() {
    let (fake, _) = scripted();
    let sw = TestSwitch::start(&[fake], |c| c.health_interval_ms = 0);
    for bad in ["/lf-status", "/lf-field", "/lf-end"] {
        let mut c = sw.client();
        let r = c.get(bad);
        assert_eq!(r.status, 502, "{bad}");
    }
    // Chunked bodies the grammar refuses: the head went out, so the client connection is cut
    // before the last chunk.
    for bad in [
        "/chunk-junk",
        "/chunk-space",
        "/trailer-request-line",
        "/trailer-nul",
    ] {
        let mut c = sw.client();
        c.send(format!("GET {bad} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        let mut all = Vec::new();
        let _ = std::io::Read::read_to_end(&mut c.stream, &mut all);
        let text = String::from_utf8_lossy(&all).to_string();
        assert!(!text.ends_with("0\r\n\r\n"), "{bad}: {text:?}");
    }
    let mut c = sw.client();
    c.send(b"GET /trailer-ok HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut got = Vec::new();
    while !got.ends_with(b"X-T: 1\r\n\r\n") {
        let mut b = [0u8; 4096];
        let n = std::io::Read::read(&mut c.stream, &mut b).unwrap();
        assert!(n > 0, "{:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&b[..n]);
    }
}

/// A request head of exactly `len` bytes, padded in one header field.
fn head_of(len: usize, extra: &str) -> Vec<u8> {
    let base = format!("GET /who HTTP/1.1\r\nHost: t\r\n{extra}X-Pad: \r\n\r\n").len();
    format!(
        "GET /who HTTP/1.1\r\nHost: t\r\n{extra}X-Pad: {}\r\n\r\n",
        "p".repeat(len - base)
    )
    .into_bytes()
}

#[test]
fn the_switch_never_forwards_a_head_its_node_refuses_for_size() {
    let nodes = cluster(1, &[]);
    let sw = TestSwitch::start(&[nodes[0].addr], |_| {});
    let limit = switchyard_switch::SwitchConfig::default().max_head_bytes;
    let node_431 = || nodes[0].node.as_ref().unwrap().metrics().status_count(431);
    // Heads from well under the limit to exactly at it: each one is either served by the
    // node or refused by the switch itself, never refused by the node.
    let mut served = 0;
    let mut refused = 0;
    for len in (limit - 80)..=limit {
        match answer(sw.addr, &head_of(len, "")) {
            200 => served += 1,
            431 => refused += 1,
            s => panic!("head of {len} bytes: {s}"),
        }
    }
    assert!(
        served > 0 && refused > 0,
        "{served} served, {refused} refused"
    );
    // A client's own X-Forwarded-For is extended, and counts as well.
    for len in (limit - 80)..=limit {
        let s = answer(sw.addr, &head_of(len, "X-Forwarded-For: 192.0.2.7\r\n"));
        assert!(s == 200 || s == 431, "head of {len} bytes: {s}");
    }
    // The header count: a request with as many fields as the node takes, plus the one the
    // switch adds.
    let many: String = (1..switchyard_http::request::MAX_HEADERS)
        .map(|i| format!("X-{i}: v\r\n"))
        .collect();
    let req = format!("GET /who HTTP/1.1\r\nHost: t\r\n{many}\r\n");
    assert_eq!(answer(sw.addr, req.as_bytes()), 431);
    assert_eq!(node_431(), 0, "the node refused a forwarded head");
    let mut c = sw.client();
    assert_eq!(c.get("/who").body, b"node0");
}
