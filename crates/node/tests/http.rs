//! The node over real sockets: statuses, persistence, pipelining,
//! conditional and range requests, HEAD, bodies, traversal.

mod common;

use common::*;
use std::path::Path;

fn site(root: &Path) {
    write(root, "index.html", b"<h1>home</h1>\n");
    write(root, "a.txt", b"hello, world\n");
    write(root, "docs/index.html", b"docs index\n");
    write(root, "docs/guide.html", b"guide\n");
    write(root, "data/1k.bin", &pattern(1024, 1));
    write(root, "data/100k.bin", &pattern(100 * 1024, 2));
    write(root, "data/16k.bin", &pattern(16 * 1024, 4));
    write(root, "style.css", b"body{}\n");
    write(root, "img.png", &pattern(64, 3));
    std::fs::create_dir_all(root.join("emptydir")).unwrap();
}

fn node() -> TestNode {
    TestNode::start(site, |_| {})
}

#[test]
fn get_serves_files_with_types_and_validators() {
    let n = node();
    let mut c = n.client();
    let r = c.get("/a.txt");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello, world\n");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert!(r.header("etag").unwrap().starts_with('"'));
    assert!(r.header("last-modified").unwrap().ends_with("GMT"));
    assert!(r.header("date").is_some());
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(
        c.get("/style.css").header("content-type"),
        Some("text/css; charset=utf-8")
    );
    assert_eq!(c.get("/img.png").header("content-type"), Some("image/png"));
    assert_eq!(c.get("/data/100k.bin").body, pattern(100 * 1024, 2));
    let r = c.get("/");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"<h1>home</h1>\n"[..])
    );
    assert_eq!(c.get("/docs/").body, b"docs index\n");
}

#[test]
fn every_error_status() {
    let n = node();
    let a = n.addr;
    assert_eq!(
        status_of(a, b"GET /missing HTTP/1.1\r\nHost: t\r\n\r\n"),
        404
    );
    assert_eq!(
        status_of(a, b"GET /emptydir/ HTTP/1.1\r\nHost: t\r\n\r\n"),
        404
    );
    assert_eq!(
        status_of(
            a,
            b"POST /a.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"
        ),
        405
    );
    assert_eq!(
        status_of(a, b"DELETE /a.txt HTTP/1.1\r\nHost: t\r\n\r\n"),
        405
    );
    assert_eq!(status_of(a, b"BREW /pot HTTP/1.1\r\nHost: t\r\n\r\n"), 501);
    assert_eq!(
        status_of(
            a,
            b"GET /a.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: foo, chunked\r\n\r\n"
        ),
        501
    );
    assert_eq!(status_of(a, b"GET /a.txt HTTP/2.0\r\nHost: t\r\n\r\n"), 505);
    assert_eq!(
        status_of(a, b"GET /a.txt HTTP/1.1\r\n\r\n"),
        400,
        "missing Host"
    );
    assert_eq!(status_of(a, b"GET /a.txt JUNK\r\n\r\n"), 400);
    assert_eq!(
        status_of(a, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"),
        400,
        "TLS hello"
    );
    assert_eq!(
        status_of(
            a,
            b"GET /a.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999\r\n\r\n"
        ),
        413
    );
    let long = format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "x".repeat(10_000));
    assert_eq!(status_of(a, long.as_bytes()), 414);
    let fat = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Fat: {}\r\n\r\n",
        "y".repeat(20_000)
    );
    assert_eq!(status_of(a, fat.as_bytes()), 431);
    let many: String = (0..150).map(|i| format!("X-{i}: 1\r\n")).collect();
    assert_eq!(
        status_of(
            a,
            format!("GET / HTTP/1.1\r\nHost: t\r\n{many}\r\n").as_bytes()
        ),
        431
    );
    // A directory without its slash is redirected, keeping the query.
    let mut c = n.client();
    let r = c.get("/docs?x=1");
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/docs/?x=1"));
    // 405 names the allowed methods.
    let r = c.raw(b"PUT /a.txt HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
}

#[test]
fn request_smuggling_is_refused_and_closes() {
    let n = node();
    for req in [
        &b"GET /a.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"[..],
        b"GET /a.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcd",
        b"GET /a.txt HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n",
        b"GET /a.txt HTTP/1.1\r\nHost: t\r\nX-A: b\r\n folded\r\n\r\n",
        b"GET /a.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ] {
        let mut c = n.client();
        c.send(req);
        let r = c.response(false);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(req));
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.is_closed());
    }
}

#[test]
fn keep_alive_and_http10() {
    let n = node();
    let mut c = n.client();
    for _ in 0..5 {
        assert_eq!(c.get("/a.txt").status, 200);
    }
    // HTTP/1.0 closes by default…
    let mut c = n.client();
    let r = c.raw(b"GET /a.txt HTTP/1.0\r\n\r\n");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed());
    // …and keeps the connection when asked.
    let mut c = n.client();
    let r = c.raw(b"GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(r.header("connection"), Some("keep-alive"));
    assert_eq!(
        c.raw(b"GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .status,
        200
    );
    // Connection: close on 1.1 closes after the response.
    let mut c = n.client();
    let r = c.raw(b"GET /a.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(r.status, 200);
    assert!(c.is_closed());
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let n = node();
    let mut c = n.client();
    // 16 KiB bodies are kept in memory and sent gathered behind their head, not batched:
    // between batched answers they must still come in order.
    let paths = [
        "/a.txt",
        "/data/1k.bin",
        "/data/16k.bin",
        "/missing",
        "/data/16k.bin",
        "/docs/guide.html",
        "/data/100k.bin",
        "/a.txt",
    ];
    let mut batch = Vec::new();
    for p in paths {
        batch.extend_from_slice(format!("GET {p} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    }
    // A HEAD in the middle must not carry a body.
    batch.extend_from_slice(b"HEAD /data/1k.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    batch.extend_from_slice(b"GET /style.css HTTP/1.1\r\nHost: t\r\n\r\n");
    batch.extend_from_slice(b"GET /data/16k.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    c.send(&batch);
    assert_eq!(c.response(false).body, b"hello, world\n");
    assert_eq!(c.response(false).body, pattern(1024, 1));
    assert_eq!(c.response(false).body, pattern(16 * 1024, 4));
    assert_eq!(c.response(false).status, 404);
    assert_eq!(c.response(false).body, pattern(16 * 1024, 4));
    assert_eq!(c.response(false).body, b"guide\n");
    assert_eq!(c.response(false).body, pattern(100 * 1024, 2));
    assert_eq!(c.response(false).body, b"hello, world\n");
    let h = c.response(true);
    assert_eq!(h.header("content-length"), Some("1024"));
    assert_eq!(c.response(false).body, b"body{}\n");
    assert_eq!(c.response(false).body, pattern(16 * 1024, 4));
    assert!(c.is_closed());
}

#[test]
fn head_has_get_headers_and_no_body() {
    let n = node();
    let mut c = n.client();
    for p in ["/a.txt", "/data/100k.bin", "/missing"] {
        let g = c.get(p);
        c.send(format!("HEAD {p} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        let h = c.response(true);
        assert_eq!(g.status, h.status);
        assert_eq!(g.header("content-length"), h.header("content-length"));
        assert_eq!(g.header("etag"), h.header("etag"));
        assert_eq!(
            g.body.len().to_string(),
            h.header("content-length").unwrap()
        );
    }
    // Nothing extra arrived after the HEAD responses.
    assert_eq!(c.get("/style.css").body, b"body{}\n");
}

#[test]
fn conditional_requests() {
    let n = node();
    let mut c = n.client();
    let r = c.get("/a.txt");
    let etag = r.header("etag").unwrap().to_owned();
    let lm = r.header("last-modified").unwrap().to_owned();
    let r = c
        .raw(format!("GET /a.txt HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n").as_bytes());
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    let r = c.raw(
        format!("GET /a.txt HTTP/1.1\r\nHost: t\r\nIf-None-Match: \"other\", W/{etag}\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(r.status, 304, "weak comparison");
    let r = c.raw(b"GET /a.txt HTTP/1.1\r\nHost: t\r\nIf-None-Match: \"other\"\r\n\r\n");
    assert_eq!(r.status, 200);
    let r = c.raw(
        format!("GET /a.txt HTTP/1.1\r\nHost: t\r\nIf-Modified-Since: {lm}\r\n\r\n").as_bytes(),
    );
    assert_eq!(r.status, 304);
    let r = c.raw(b"GET /a.txt HTTP/1.1\r\nHost: t\r\nIf-Modified-Since: Thu, 01 Jan 1998 00:00:00 GMT\r\n\r\n");
    assert_eq!(r.status, 200);
    // If-None-Match wins over If-Modified-Since.
    let r = c.raw(format!("GET /a.txt HTTP/1.1\r\nHost: t\r\nIf-None-Match: \"other\"\r\nIf-Modified-Since: {lm}\r\n\r\n").as_bytes());
    assert_eq!(r.status, 200);
    // HEAD is conditional too.
    c.send(b"HEAD /a.txt HTTP/1.1\r\nHost: t\r\nIf-None-Match: *\r\n\r\n");
    assert_eq!(c.response(true).status, 304);
}

#[test]
fn range_requests() {
    let n = node();
    let mut c = n.client();
    let full = pattern(100 * 1024, 2);
    let r = c.raw(b"GET /data/100k.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=10-19\r\n\r\n");
    assert_eq!(r.status, 206);
    assert_eq!(r.body, &full[10..20]);
    assert_eq!(r.header("content-range"), Some("bytes 10-19/102400"));
    let r = c.raw(b"GET /data/100k.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=-100\r\n\r\n");
    assert_eq!(r.body, &full[full.len() - 100..]);
    let r = c.raw(b"GET /data/100k.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=102000-\r\n\r\n");
    assert_eq!(r.body, &full[102000..]);
    let r = c.raw(b"GET /data/100k.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=200000-\r\n\r\n");
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range"), Some("bytes */102400"));
    let r = c.raw(b"GET /data/100k.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=0-1,5-6\r\n\r\n");
    assert_eq!(
        (r.status, r.body.len()),
        (200, full.len()),
        "multiple ranges: whole file"
    );
    let r = c.raw(b"GET /data/100k.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=0-0\r\nIf-Range: \"stale\"\r\n\r\n");
    assert_eq!(r.status, 200, "If-Range mismatch: whole file");
    let etag = r.header("etag").unwrap().to_owned();
    let r = c.raw(format!("GET /data/100k.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=0-0\r\nIf-Range: {etag}\r\n\r\n").as_bytes());
    assert_eq!((r.status, r.body.as_slice()), (206, &full[..1]));
    // A range of a body kept in memory, large enough to be sent gathered behind its head.
    let small = pattern(16 * 1024, 4);
    for _ in 0..2 {
        let r = c.raw(b"GET /data/16k.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=100-8291\r\n\r\n");
        assert_eq!((r.status, r.body.as_slice()), (206, &small[100..8292]));
    }
}

#[test]
fn traversal_never_escapes_the_root() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), b"TOP SECRET").unwrap();
    let secret_dir = outside.path().to_path_buf();
    let n = TestNode::start(
        |root| {
            site(root);
            std::os::unix::fs::symlink(secret_dir.join("secret.txt"), root.join("abs-link.txt"))
                .unwrap();
            std::os::unix::fs::symlink(&secret_dir, root.join("dir-link")).unwrap();
            std::os::unix::fs::symlink("a.txt", root.join("inside-link.txt")).unwrap();
        },
        |_| {},
    );
    // The node's root is a sibling of `outside` under the same temp parent.
    let name = outside.path().file_name().unwrap().to_str().unwrap();
    let attempts = [
        format!("/../{name}/secret.txt"),
        format!("/..%2f{name}%2fsecret.txt"),
        format!("/%2e%2e/{name}/secret.txt"),
        format!("/%2E%2E%2F{name}%2Fsecret.txt"),
        format!("/docs/../../{name}/secret.txt"),
        "/..".to_owned(),
        "/a.txt%00.html".to_owned(),
        "/abs-link.txt".to_owned(),
        "/dir-link/secret.txt".to_owned(),
        format!("http://t/../{name}/secret.txt"),
        "/%".to_owned(),
        "/..\\..\\etc\\passwd".to_owned(),
    ];
    for a in &attempts {
        let mut c = n.client();
        let r = c.raw(format!("GET {a} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        assert!(matches!(r.status, 400 | 404), "{a} gave {}", r.status);
        assert!(
            !String::from_utf8_lossy(&r.body).contains("TOP SECRET"),
            "{a}"
        );
    }
    // A symlink that stays inside the root is fine.
    assert_eq!(n.client().get("/inside-link.txt").body, b"hello, world\n");
    // A raw NUL byte in the request line is malformed.
    assert_eq!(
        status_of(n.addr, b"GET /a.txt\0 HTTP/1.1\r\nHost: t\r\n\r\n"),
        400
    );
}

#[test]
fn request_bodies_on_get_are_consumed() {
    let n = node();
    let mut c = n.client();
    let r = c.raw(b"GET /a.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhelloGET /style.css HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.body, b"hello, world\n");
    assert_eq!(c.response(false).body, b"body{}\n");
    c.send(b"GET /a.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /style.css HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(c.response(false).body, b"hello, world\n");
    assert_eq!(c.response(false).body, b"body{}\n");
    // Expect: 100-continue gets an interim response before the final one.
    c.send(b"GET /a.txt HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
    assert_eq!(c.response(false).status, 100);
    c.send(b"ok");
    assert_eq!(c.response(false).body, b"hello, world\n");
}
