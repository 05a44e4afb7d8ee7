//! The node over real sockets against malformed framing: strict chunk-size lines and trailers,
//! bare LF in heads, 400 (not 505 or 501) for malformed request lines and a non-final
//! `chunked`, later HTTP/1 minor versions served as HTTP/1.1, and a prompt 413 for a declared
//! chunk beyond the body limit.

mod common;

use common::*;
use std::time::Instant;

fn node() -> TestNode {
    TestNode::start(
        |r| write(r, "a.txt", b"hello, world\n"),
        |c| {
            // Far above what any test below waits: a 408 would mean a missed refusal.
            c.header_timeout_ms = 60_000;
        },
    )
}

/// A GET carrying a chunked body `body`: the node reads (and drops) it.
fn chunked_get(body: &[u8]) -> Vec<u8> {
    let mut r = b"GET /a.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    r.extend_from_slice(body);
    r
}

#[test]
fn lenient_chunk_size_lines_and_trailers_are_400() {
    let n = node();
    for body in [
        &b"2 erfrferferf\r\nab\r\n0\r\n\r\n"[..],
        b"2 3\r\nab\r\n0\r\n\r\n",
        b"0 5\r\n\r\n",
        b"2 \r\nab\r\n0\r\n\r\n",
        b"2;a=b c\r\nab\r\n0\r\n\r\n",
        b"0\r\nGET /a.txt HTTP/1.1\r\n\r\n",
        b"0\r\nX-A: \x00\r\n\r\n",
        b"0\r\n X-A: 1\r\n\r\n",
        b"0\r\nX-A: 1\n\r\n",
    ] {
        assert_eq!(
            status_of(n.addr, &chunked_get(body)),
            400,
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    // Extensions and trailers in the grammar are taken, and the connection goes on.
    let mut c = n.client();
    c.send(&chunked_get(
        b"2 ; a = \"b c\";d\r\nab\r\n0;e=f\r\nX-T: 1\r\nX-U:\r\n\r\n",
    ));
    assert_eq!(c.response(false).body, b"hello, world\n");
    assert_eq!(c.get("/a.txt").status, 200);
}

#[test]
fn bare_lf_in_a_head_is_400() {
    let n = node();
    for req in [
        &b"GET /a.txt HTTP/1.1\nHost: t\r\n\r\n"[..],
        b"GET /a.txt HTTP/1.1\r\nHost: t\n\r\n",
        b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\n",
        b"GET /a.txt HTTP/1.0\n\n",
        // Not even complete: refused at once, not after the header timeout.
        b"GET /a.txt HTTP/1.1\nHost: t",
    ] {
        assert_eq!(
            status_of(n.addr, req),
            400,
            "{:?}",
            String::from_utf8_lossy(req)
        );
    }
}

#[test]
fn malformed_request_lines_are_400_and_http_1_2_is_served() {
    let n = node();
    for req in [
        &b"GET /a .txt HTTP/1.1\r\nHost: t\r\n\r\n"[..],
        b"GET /a\t.txt HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /a.txt  HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET  /a.txt HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /a\n.txt HTTP/1.1\r\nHost: t\r\n\r\n",
        b"POST /a.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
    ] {
        assert_eq!(
            status_of(n.addr, req),
            400,
            "{:?}",
            String::from_utf8_lossy(req)
        );
    }
    // Served as HTTP/1.1: persistent without asking, so both answers come on one connection.
    let mut c = n.client();
    c.send(b"GET /a.txt HTTP/1.2\r\nHost: t\r\n\r\nGET /a.txt HTTP/1.3\r\nHost: t\r\n\r\n");
    for _ in 0..2 {
        let r = c.response(false);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"hello, world\n");
    }
    assert_eq!(
        status_of(n.addr, b"GET /a.txt HTTP/2.0\r\nHost: t\r\n\r\n"),
        505
    );
}

#[test]
fn a_huge_declared_chunk_is_413_at_once() {
    let n = node();
    let t = Instant::now();
    // 2 GiB declared, nothing of it sent; the header timeout is a minute.
    let mut c = n.client();
    c.send(&chunked_get(b"80000000\r\n"));
    let r = c.response(false);
    assert_eq!(r.status, 413);
    assert!(t.elapsed().as_secs() < 10, "took {:?}", t.elapsed());
    // The sum of chunks counts too.
    let mut body = Vec::new();
    for _ in 0..2 {
        body.extend_from_slice(b"80000\r\n");
        body.extend_from_slice(&vec![b'x'; 0x80000]);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"1\r\n");
    assert_eq!(status_of(n.addr, &chunked_get(&body)), 413);
}
