//! The rescue server over real sockets: a node with a `[rescue]` table proxies for an origin
//! (a small counting server in the test) under its virtual host name and the origin's own
//! name, fetches one URI once however many clients wait, revalidates with the origin's
//! validators, keeps to its per-object cap and per-origin budget, redirects an ended origin's
//! requests back, and never fetches anything for a name it does not serve.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, Client, TestNode};
use switchyard_node::{RescueConfig, RescueHandle};
use switchyard_rescue::{PeerId, Sos};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

const ALIAS: &str = "www-vh1.rescue.test";
const FQDN: &str = "www.origin.test";
const BIG: usize = 50_000;
const SMALL: usize = 5_000;
/// The size of `/gated-large`.
const LARGE: usize = 300_000;

/// The body of `/gated-large`: no two neighbouring 251-byte runs alike at the same offset.
fn large_body() -> Vec<u8> {
    (0..LARGE)
        .map(|i| (i % 251) as u8 ^ (i / 251) as u8)
        .collect()
}

/// One request the origin received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    host: String,
    if_none_match: Option<String>,
    if_modified_since: Option<String>,
    status: u16,
    /// The address the request came from.
    from: std::net::IpAddr,
}

/// A test origin: counts and records every request; `/gated` answers only once the gate
/// opens (level 1), `/gated-large` sends its head and the first half of [`LARGE`] bytes at
/// level 1 and the rest at level 2, `/page` has validators and answers matching conditionals 304, `/big` is larger than
/// the proxy's object cap, `/s<n>` are small objects, `/private` is `Cache-Control: private`,
/// `/hang` never answers; anything else echoes its target.
struct Origin {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    gate: watch::Sender<u8>,
    _rt: tokio::runtime::Runtime,
}

impl Origin {
    fn start() -> Origin {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (gate, gate_rx) = watch::channel(0u8);
        let l = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = l.local_addr().unwrap();
        let log = seen.clone();
        rt.spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(serve_origin(s, log.clone(), gate_rx.clone()));
            }
        });
        Origin {
            addr,
            seen,
            gate,
            _rt: rt,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn count(&self, target: &str) -> usize {
        self.seen().iter().filter(|s| s.target == target).count()
    }

    fn sos(&self) -> Sos {
        Sos {
            fqdn: FQDN.into(),
            ip: self.addr.ip(),
            port: self.addr.port(),
            max_idle_secs: 300,
            want_kbps: None,
        }
    }
}

async fn serve_origin(
    mut s: tokio::net::TcpStream,
    log: Arc<Mutex<Vec<Seen>>>,
    mut gate: watch::Receiver<u8>,
) {
    let from = s.peer_addr().unwrap().ip();
    let mut buf = Vec::new();
    loop {
        let (head_len, mut seen) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut r = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(n)) = r.parse(&buf) {
                let h = |name: &str| {
                    r.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).into_owned())
                };
                break (
                    n,
                    Seen {
                        method: r.method.unwrap().into(),
                        target: r.path.unwrap().into(),
                        host: h("host").unwrap_or_default(),
                        if_none_match: h("if-none-match"),
                        if_modified_since: h("if-modified-since"),
                        status: 0,
                        from,
                    },
                );
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        buf.drain(..head_len);
        // Counted on arrival; the status is filled in once answered.
        let idx = {
            let mut log = log.lock().unwrap();
            log.push(seen.clone());
            log.len() - 1
        };
        const LM: &str = "Sun, 06 Nov 1994 08:49:37 GMT";
        let (status, extra, body): (u16, String, Vec<u8>) = match seen.target.as_str() {
            "/gated" => {
                let _ = gate.wait_for(|level| *level >= 1).await;
                (200, String::new(), b"gated content".to_vec())
            }
            "/gated-large" => {
                let _ = gate.wait_for(|level| *level >= 1).await;
                let body = large_body();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                log.lock().unwrap()[idx].status = 200;
                if s.write_all(head.as_bytes()).await.is_err()
                    || s.write_all(&body[..LARGE / 2]).await.is_err()
                {
                    return;
                }
                let _ = gate.wait_for(|level| *level >= 2).await;
                if s.write_all(&body[LARGE / 2..]).await.is_err() {
                    return;
                }
                continue;
            }
            "/page" => {
                if seen.if_none_match.as_deref() == Some("\"v1\"") {
                    (
                        304,
                        format!("ETag: \"v1\"\r\nLast-Modified: {LM}\r\n"),
                        Vec::new(),
                    )
                } else {
                    (
                        200,
                        format!("ETag: \"v1\"\r\nLast-Modified: {LM}\r\nContent-Type: text/html\r\nSet-Cookie: s=1\r\n"),
                        b"<p>page v1</p>".to_vec(),
                    )
                }
            }
            "/max0" => {
                let h = "ETag: \"m0\"\r\nCache-Control: max-age=0\r\n".to_string();
                if seen.if_none_match.as_deref() == Some("\"m0\"") {
                    (304, h, Vec::new())
                } else {
                    (200, h, b"max-age 0".to_vec())
                }
            }
            "/once" | "/once-mr" => {
                // Answers once; later fetches find the origin gone (the connection closes).
                let asked = log
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|s| s.target == seen.target)
                    .count();
                if asked > 1 {
                    return;
                }
                let cc = if seen.target == "/once-mr" {
                    "Cache-Control: must-revalidate\r\n"
                } else {
                    ""
                };
                (
                    200,
                    format!("ETag: \"o1\"\r\n{cc}"),
                    b"first answer".to_vec(),
                )
            }
            "/smax" => (
                200,
                "ETag: \"s1\"\r\nCache-Control: max-age=0, s-maxage=3600\r\n".into(),
                b"shared for an hour".to_vec(),
            ),
            "/big" => (200, String::new(), vec![b'b'; BIG]),
            // The origin sends this client elsewhere (to a rescue server of its own, say).
            "/moved" => (
                302,
                "Location: http://www-vh9.other.test/moved\r\n".into(),
                Vec::new(),
            ),
            "/private" => (200, "Cache-Control: private\r\n".into(), b"mine".to_vec()),
            "/hang" => {
                std::future::pending::<()>().await;
                return;
            }
            t if t.starts_with("/s") => (200, String::new(), vec![b's'; SMALL]),
            t => (200, String::new(), format!("origin {t}").into_bytes()),
        };
        seen.status = status;
        let is_head = seen.method == "HEAD";
        log.lock().unwrap()[idx].status = status;
        let reason = if status == 304 { "Not Modified" } else { "OK" };
        let mut out = format!("HTTP/1.1 {status} {reason}\r\n{extra}");
        if status != 304 {
            out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        out.push_str("\r\n");
        let mut out = out.into_bytes();
        if !is_head {
            out.extend_from_slice(&body);
        }
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// A rescue node (own name `www.rescue.test`, address 127.0.0.2) with `tweak` applied to its `[rescue]` table.
fn rescue_node(tweak: impl FnOnce(&mut RescueConfig)) -> (TestNode, RescueHandle) {
    // Its address differs from the origin's (both really listen on 127.0.0.1): a host naming
    // the origin's address is not this server's own.
    let mut r = RescueConfig::new("www.rescue.test", [127, 0, 0, 2].into(), 8080, 1250.0);
    tweak(&mut r);
    let node = TestNode::start(
        |root| common::write(root, "own.html", b"own content"),
        |c| c.rescue = Some(r),
    );
    let handle = node.node.as_ref().unwrap().rescue().expect("a rescue node");
    (node, handle)
}

fn get(c: &mut Client, host: &str, target: &str) -> common::Response {
    c.send(format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
    c.response(false)
}

#[test]
fn an_alias_and_the_origin_name_are_served_from_the_origin() {
    let origin = Origin::start();
    let (node, rescue) = rescue_node(|_| {});
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let mut c = node.client();

    let r = get(&mut c, ALIAS, "/hello?x=1");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "origin /hello?x=1");
    let r = get(&mut c, "WWW.ORIGIN.TEST:8080", "/hello?x=1");
    assert_eq!(
        r.text(),
        "origin /hello?x=1",
        "the origin's own name, from the cache"
    );
    assert_eq!(origin.count("/hello?x=1"), 1);
    let s = &origin.seen()[0];
    assert_eq!(s.method, "GET");
    assert_eq!(
        s.from.to_string(),
        "127.0.0.2",
        "fetched from the rescue server's own address"
    );
    assert_eq!(
        s.host,
        format!("{FQDN}:{}", origin.addr.port()),
        "fetched as the origin"
    );

    // The entity headers that matter come along; the origin's others stay behind.
    let r = get(&mut c, ALIAS, "/page");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "<p>page v1</p>");
    assert_eq!(r.header("etag"), Some("\"v1\""));
    assert_eq!(r.header("content-type"), Some("text/html"));
    assert_eq!(
        r.header("last-modified"),
        Some("Sun, 06 Nov 1994 08:49:37 GMT")
    );
    assert_eq!(r.header("set-cookie"), None);
    // HEAD: the same head, no body.
    c.send(format!("HEAD /page HTTP/1.1\r\nHost: {ALIAS}\r\n\r\n").as_bytes());
    let h = c.response(true);
    assert_eq!(h.status, 200);
    assert_eq!(h.header("content-length"), Some("14"));
    assert!(h.body.is_empty());
    // The client's own validators get a 304 from the stored copy.
    c.send(
        format!("GET /page HTTP/1.1\r\nHost: {ALIAS}\r\nIf-None-Match: \"v1\"\r\n\r\n").as_bytes(),
    );
    assert_eq!(c.response(false).status, 304);
    assert_eq!(origin.count("/page"), 1);

    // The node's own site is its own.
    let r = get(&mut c, "www.rescue.test", "/own.html");
    assert_eq!(r.text(), "own content");
    let r = get(&mut c, "127.0.0.2", "/own.html");
    assert_eq!(r.text(), "own content");

    let s = rescue.stats();
    assert_eq!(s.fetches, 2);
    assert_eq!(s.hits, 3);
    assert!(s.cached_bytes[0].1 > 0, "{s:?}");
    let metrics = node.metrics();
    assert!(
        metrics.contains("switchyard_node_rescue_proxy_fetches_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "switchyard_node_rescue_proxy_origin_bytes{{origin=\"{ALIAS}\"}}"
        )),
        "{metrics}"
    );
}

#[test]
fn a_thousand_waiting_clients_cause_one_fetch() {
    const N: usize = 1000;
    let origin = Origin::start();
    let (node, rescue) = rescue_node(|_| {});
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let addr = node.addr;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let clients: Vec<_> = (0..N)
        .map(|_| {
            rt.spawn(async move {
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.write_all(
                    format!("GET /gated HTTP/1.1\r\nHost: {ALIAS}\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .unwrap();
                let mut all = Vec::new();
                s.read_to_end(&mut all).await.unwrap();
                String::from_utf8(all).unwrap()
            })
        })
        .collect();
    // Every client waits on the one fetch, which the origin holds until all are there.
    assert!(
        eventually(Duration::from_secs(60), || rescue.stats().misses
            == N as u64),
        "{:?}",
        rescue.stats()
    );
    assert_eq!(origin.count("/gated"), 1);
    origin.gate.send_replace(1);
    for c in clients {
        let text = rt.block_on(c).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\ngated content"), "{text}");
    }
    assert_eq!(origin.count("/gated"), 1, "the origin's own count");
    let s = rescue.stats();
    assert_eq!((s.fetches, s.misses), (1, N as u64));
}

#[test]
fn concurrent_clients_of_a_large_object_share_one_fetch() {
    const N: usize = 200;
    let origin = Origin::start();
    let (node, rescue) = rescue_node(|r| r.proxy.max_object_bytes = 10_000);
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let addr = node.addr;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = move || async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET /gated-large HTTP/1.1\r\nHost: {ALIAS}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).await.unwrap();
        all
    };
    let clients: Vec<_> = (0..N).map(|_| rt.spawn(client())).collect();
    // Every client waits on the one fetch, which the origin holds until all are there.
    assert!(
        eventually(Duration::from_secs(60), || rescue.stats().misses
            == N as u64),
        "{:?}",
        rescue.stats()
    );
    // The head and half the body: every waiter is handed the spool.
    origin.gate.send_replace(1);
    assert!(
        eventually(Duration::from_secs(60), || rescue.stats().spooled
            == N as u64),
        "{:?}",
        rescue.stats()
    );
    // A client arriving while the body is still coming joins the same fetch from byte 0.
    let late = rt.spawn(client());
    assert!(
        eventually(Duration::from_secs(60), || rescue.stats().spooled
            == N as u64 + 1),
        "{:?}",
        rescue.stats()
    );
    origin.gate.send_replace(2);
    let body = large_body();
    for c in clients.into_iter().chain([late]) {
        let all = rt.block_on(c).unwrap();
        let split = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&all[..split]);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains(&format!("Content-Length: {LARGE}\r\n")),
            "{head}"
        );
        assert!(
            head.contains("Content-Type: application/octet-stream\r\n"),
            "{head}"
        );
        assert!(
            all[split..] == body[..],
            "a body of {} bytes differs",
            all.len() - split
        );
    }
    assert_eq!(origin.count("/gated-large"), 1, "the origin's own count");
    let s = rescue.stats();
    assert_eq!((s.fetches, s.relayed, s.fetch_errors), (1, 0, 0), "{s:?}");
    assert_eq!(s.cached_bytes[0].1, 0, "never stored");
    // Once it is complete, the next request fetches again (nothing above the cap is kept).
    let mut c = node.client();
    let r = get(&mut c, ALIAS, "/big");
    assert_eq!(r.body.len(), BIG);
    assert_eq!(origin.count("/big"), 1);
}

#[test]
fn a_stale_object_is_revalidated_and_a_304_keeps_it() {
    let origin = Origin::start();
    let (node, rescue) = rescue_node(|r| r.proxy.fresh_ms = 200);
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let mut c = node.client();
    assert_eq!(get(&mut c, ALIAS, "/page").text(), "<p>page v1</p>");
    let stored = rescue.stats().cached_bytes[0].1;
    // Ask until the freshness interval has passed and the proxy asked the origin again.
    assert!(eventually(Duration::from_secs(10), || {
        let r = get(&mut c, ALIAS, "/page");
        assert_eq!((r.status, r.text()), (200, "<p>page v1</p>".to_string()));
        origin.count("/page") >= 2
    }));
    let seen = origin.seen();
    assert_eq!(
        seen[0].if_none_match, None,
        "the first fetch is unconditional"
    );
    for s in &seen[1..] {
        assert_eq!(s.if_none_match.as_deref(), Some("\"v1\""), "{s:?}");
        assert_eq!(
            s.if_modified_since.as_deref(),
            Some("Sun, 06 Nov 1994 08:49:37 GMT")
        );
        assert_eq!(s.status, 304);
    }
    let s = rescue.stats();
    assert_eq!(s.revalidations, seen.len() as u64 - 1);
    assert_eq!(s.not_modified, s.revalidations);
    assert_eq!(
        s.cached_bytes[0].1, stored,
        "the entry was kept, not fetched again"
    );
    assert!(node.metric("switchyard_node_rescue_proxy_not_modified_total") >= 1.0);
}

/// The origin's own freshness lifetime wins over `fresh_ms`: `max-age=0` is revalidated on
/// every request, and `s-maxage` (for shared caches) wins over `max-age`.
#[test]
fn the_origin_s_max_age_and_s_maxage_decide_freshness() {
    let origin = Origin::start();
    let (node, rescue) = rescue_node(|r| r.proxy.fresh_ms = 60_000);
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let mut c = node.client();
    for _ in 0..3 {
        let r = get(&mut c, ALIAS, "/max0");
        assert_eq!((r.status, r.text()), (200, "max-age 0".to_string()));
        let r = get(&mut c, ALIAS, "/smax");
        assert_eq!(
            (r.status, r.text()),
            (200, "shared for an hour".to_string())
        );
    }
    assert_eq!(origin.count("/max0"), 3, "max-age=0: asked every time");
    assert_eq!(origin.count("/smax"), 1, "s-maxage=3600 outranks max-age=0");
    let seen = origin.seen();
    let max0: Vec<_> = seen.iter().filter(|s| s.target == "/max0").collect();
    assert_eq!(max0[0].if_none_match, None);
    for s in &max0[1..] {
        assert_eq!(s.if_none_match.as_deref(), Some("\"m0\""));
        assert_eq!(s.status, 304);
    }
    assert_eq!(rescue.stats().not_modified, 2);
}

/// A stale object whose revalidation fails is served stale (RFC 9111 §4.2.4), unless the
/// origin said `must-revalidate`.
#[test]
fn a_failed_revalidation_serves_the_stale_object_unless_it_must_revalidate() {
    let origin = Origin::start();
    let (node, rescue) = rescue_node(|r| r.proxy.fresh_ms = 100);
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let mut c = node.client();
    let r = get(&mut c, ALIAS, "/once");
    assert_eq!((r.status, r.text()), (200, "first answer".to_string()));
    assert!(eventually(Duration::from_secs(10), || {
        let r = get(&mut c, ALIAS, "/once");
        assert_eq!((r.status, r.text()), (200, "first answer".to_string()));
        origin.count("/once") >= 2
    }));
    let s = rescue.stats();
    assert!(s.stale_served >= 1 && s.fetch_errors >= 1, "{s:?}");

    let r = get(&mut c, ALIAS, "/once-mr");
    assert_eq!((r.status, r.text()), (200, "first answer".to_string()));
    assert!(eventually(Duration::from_secs(10), || {
        let r = get(&mut c, ALIAS, "/once-mr");
        if origin.count("/once-mr") >= 2 {
            assert_eq!(r.status, 502, "must-revalidate: no stale answer");
            true
        } else {
            assert_eq!(r.status, 200);
            false
        }
    }));
    assert_eq!(rescue.stats().stale_served, s.stale_served);
}

/// The spool files of large objects are bounded on disk: one that would take them over
/// `spool_bytes` is relayed to its client instead (correct bytes, counted), and a spool's
/// bytes come back once its clients are done.
#[test]
fn spool_files_are_bounded_by_spool_bytes() {
    let origin = Origin::start();
    let spool_dir = tempfile::tempdir().unwrap();
    let dir = spool_dir.path().to_path_buf();
    let (node, rescue) = rescue_node(|r| {
        r.proxy.max_object_bytes = 10_000;
        r.proxy.spool_bytes = BIG as u64 - 1;
        r.proxy.spool_dir = Some(dir);
    });
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let mut c = node.client();
    for _ in 0..2 {
        let r = get(&mut c, ALIAS, "/big");
        assert_eq!((r.status, r.body.len()), (200, BIG));
    }
    let s = rescue.stats();
    assert_eq!((s.spooled, s.spool_full, s.relayed), (0, 2, 2), "{s:?}");
    assert_eq!(s.spool_bytes, 0);
    // Each: the shared fetch, given up at the head (no room to spool), then the client's own.
    assert_eq!(origin.count("/big"), 4);
    assert!(node
        .metrics()
        .contains("switchyard_node_rescue_proxy_spool_full_total 2"));

    // Room for exactly one: spooled, and its bytes given back after the answer.
    let (node, rescue) = rescue_node(|r| {
        r.proxy.max_object_bytes = 10_000;
        r.proxy.spool_bytes = BIG as u64;
        r.proxy.spool_dir = Some(spool_dir.path().to_path_buf());
    });
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let mut c = node.client();
    let r = get(&mut c, ALIAS, "/big");
    assert_eq!((r.status, r.body.len()), (200, BIG));
    assert!(eventually(Duration::from_secs(10), || rescue
        .stats()
        .spool_bytes
        == 0));
    let s = rescue.stats();
    assert_eq!((s.spooled, s.spool_full), (1, 0), "{s:?}");
    // The spool files are unlinked from the start: nothing is left in their directory.
    assert_eq!(std::fs::read_dir(spool_dir.path()).unwrap().count(), 0);
}

#[test]
fn object_cap_and_origin_budget_hold() {
    let origin = Origin::start();
    let (node, rescue) = rescue_node(|r| {
        r.proxy.max_object_bytes = 10_000;
        r.proxy.origin_bytes = 3 * SMALL as u64 + 1_000;
    });
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let mut c = node.client();
    // Above the cap: never stored; each request one after the other makes a fetch of its own,
    // shared only with requests arriving while it is under way.
    for _ in 0..2 {
        let r = get(&mut c, ALIAS, "/big");
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), BIG);
    }
    c.send(format!("HEAD /big HTTP/1.1\r\nHost: {ALIAS}\r\n\r\n").as_bytes());
    let h = c.response(true);
    assert_eq!(h.header("content-length"), Some("50000"));
    let s = rescue.stats();
    assert_eq!(s.cached_bytes[0].1, 0);
    assert_eq!(s.spooled, 3, "{s:?}");
    assert_eq!(origin.count("/big"), 3);
    // Private responses go to their client only and are never stored.
    assert_eq!(get(&mut c, ALIAS, "/private").text(), "mine");
    assert_eq!(get(&mut c, ALIAS, "/private").text(), "mine");
    assert_eq!(origin.count("/private"), 2);
    assert_eq!(rescue.stats().cached_bytes[0].1, 0);
    // Small ones are stored up to the origin's budget; the oldest go first.
    for i in 0..6 {
        assert_eq!(get(&mut c, ALIAS, &format!("/s{i}")).body.len(), SMALL);
        let used = rescue.stats().cached_bytes[0].1;
        assert!(used > 0 && used <= 3 * SMALL as u64 + 1_000, "{used}");
    }
    assert_eq!(get(&mut c, ALIAS, "/s5").body.len(), SMALL);
    assert_eq!(origin.count("/s5"), 1, "the newest is kept");
    assert_eq!(get(&mut c, ALIAS, "/s0").body.len(), SMALL);
    assert_eq!(origin.count("/s0"), 2, "the oldest was evicted");
}

#[test]
fn an_ended_origin_is_redirected_back() {
    let origin = Origin::start();
    let (node, rescue) = rescue_node(|_| {});
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let mut c = node.client();
    assert_eq!(get(&mut c, ALIAS, "/a?b=c").status, 200);
    rescue.end_origin(ALIAS).unwrap();
    let port = origin.addr.port();
    // Its virtual host name is sent back to its own name.
    let r = get(&mut c, ALIAS, "/a?b=c");
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("location"),
        Some(format!("http://{FQDN}:{port}/a?b=c").as_str())
    );
    assert_eq!(origin.seen().len(), 1, "nothing more was fetched");
    assert_eq!(rescue.stats().redirected, 1);
    // Its own name came by DNS round robin from a resolver that still has this server's
    // address: a redirect to that name could come straight back, so it is proxied, uncached.
    for _ in 0..2 {
        let r = get(&mut c, FQDN, "/a?b=c");
        assert_eq!(r.status, 200);
    }
    assert_eq!(origin.seen().len(), 3);
    assert_eq!(rescue.stats().redirected, 1);
    // The origin, which no longer counts this server as its rescuer, may redirect what it
    // fetches for it: the redirect reaches the client whole, Location included.
    let r = get(&mut c, FQDN, "/moved");
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("location"),
        Some("http://www-vh9.other.test/moved")
    );
    assert!(rescue.stats().cached_bytes.is_empty());
    // The alias is never given out again.
    assert!(rescue.add_origin(PeerId(2), &origin.sos(), ALIAS).is_err());
}

/// Sends `request` on a new connection and returns the status (the connection may close).
fn status(addr: SocketAddr, request: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut all = Vec::new();
    let mut b = [0u8; 4096];
    while !all.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut b).unwrap();
        assert!(n > 0, "closed before a response to {request:?}");
        all.extend_from_slice(&b[..n]);
    }
    String::from_utf8_lossy(&all[9..12]).parse().unwrap()
}

#[test]
fn open_proxy_attempts_never_reach_an_origin() {
    let origin = Origin::start();
    let ended = Origin::start();
    // Ended origins are not redirected back at all here: their names are unknown at once.
    let (node, rescue) = rescue_node(|r| r.expired_redirect_secs = 0);
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    let mut old = ended.sos();
    old.fqdn = "www.ended.test".into();
    rescue
        .add_origin(PeerId(2), &old, "www-vh2.rescue.test")
        .unwrap();
    rescue.end_origin("www-vh2.rescue.test").unwrap();
    let addr = node.addr;
    let o = origin.addr;
    let cases: Vec<(String, u16)> = vec![
        ("GET /x HTTP/1.1\r\nHost: evil.example\r\n\r\n".into(), 421),
        (format!("GET /x HTTP/1.1\r\nHost: {o}\r\n\r\n"), 421),
        (
            format!("GET http://evil.example/x HTTP/1.1\r\nHost: {ALIAS}\r\n\r\n"),
            421,
        ),
        (
            format!("GET http://{o}/x HTTP/1.1\r\nHost: {ALIAS}\r\n\r\n"),
            421,
        ),
        (
            format!("GET https://{ALIAS}/x HTTP/1.1\r\nHost: {ALIAS}\r\n\r\n"),
            400,
        ),
        (
            format!("GET http://user@{ALIAS}/x HTTP/1.1\r\nHost: {ALIAS}\r\n\r\n"),
            400,
        ),
        (format!("CONNECT {o} HTTP/1.1\r\nHost: {o}\r\n\r\n"), 421),
        (
            "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n".into(),
            421,
        ),
        (
            format!("CONNECT {FQDN}:80 HTTP/1.1\r\nHost: {FQDN}:80\r\n\r\n"),
            405,
        ),
        (
            format!("POST /x HTTP/1.1\r\nHost: {ALIAS}\r\nContent-Length: 3\r\n\r\nabc"),
            405,
        ),
        (format!("DELETE /x HTTP/1.1\r\nHost: {FQDN}\r\n\r\n"), 405),
        (format!("OPTIONS * HTTP/1.1\r\nHost: {ALIAS}\r\n\r\n"), 405),
        (
            format!("GET /../etc/passwd HTTP/1.1\r\nHost: {ALIAS}\r\n\r\n"),
            400,
        ),
        (format!("GET /a%00b HTTP/1.1\r\nHost: {ALIAS}\r\n\r\n"), 400),
        (
            "GET /x HTTP/1.1\r\nHost: www-vh2.rescue.test\r\n\r\n".into(),
            421,
        ),
        (
            "GET /x HTTP/1.1\r\nHost: www.ended.test\r\n\r\n".into(),
            421,
        ),
        (
            "GET /x HTTP/1.1\r\nHost: www-vh3.rescue.test\r\n\r\n".into(),
            421,
        ),
    ];
    for (req, want) in &cases {
        assert_eq!(status(addr, req), *want, "{req:?}");
    }
    assert!(origin.seen().is_empty(), "{:?}", origin.seen());
    assert!(ended.seen().is_empty(), "{:?}", ended.seen());
    let s = rescue.stats();
    assert_eq!(s.fetches, 0);
    assert_eq!(
        s.misdirected,
        cases.iter().filter(|c| c.1 == 421).count() as u64
    );
    assert!(node.metric("switchyard_node_rescue_misdirected_total") >= 9.0);
}

#[test]
fn upstream_failures_are_502_and_timeouts_504() {
    let origin = Origin::start();
    let (node, rescue) = rescue_node(|r| r.proxy.fetch_timeout_ms = 300);
    rescue.add_origin(PeerId(1), &origin.sos(), ALIAS).unwrap();
    // An origin whose port has no listener.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut gone = origin.sos();
    gone.fqdn = "www.gone.test".into();
    gone.port = closed.port();
    rescue
        .add_origin(PeerId(2), &gone, "www-vh2.rescue.test")
        .unwrap();
    let mut c = node.client();
    assert_eq!(get(&mut c, "www-vh2.rescue.test", "/x").status, 502);
    assert_eq!(get(&mut c, ALIAS, "/hang").status, 504);
    assert_eq!(origin.count("/hang"), 1);
    assert_eq!(rescue.stats().fetch_errors, 2);
}
