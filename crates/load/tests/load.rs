//! End-to-end tests of the load generator against small servers on 127.0.0.1.

mod support;

use std::time::{Duration, Instant};

use clap::Parser;
use support::{chunked, ok, response, start, start_with, Opts, Reply};
use switchyard_load::cli::{run, LoadArgs};
use switchyard_load::{
    run_load, HttpVersion, IoEngine, LoadConfig, RateProfile, ReplayRequest, Session, Summary, Url,
    Workload,
};

/// The closed loop over one URL runs on either event loop, with the same results. A kernel
/// without a usable io_uring fails the io_uring runs with a message saying so.
const ENGINES: [(IoEngine, &str); 2] = [(IoEngine::Epoll, "epoll"), (IoEngine::Uring, "io_uring")];

fn config(url: &str) -> LoadConfig {
    let mut c = LoadConfig::new(Url::parse(url).unwrap());
    c.threads = 1;
    c.connections = 1;
    c.duration = None;
    c.timeout = Duration::from_secs(3);
    c
}

fn errors(s: &Summary, kind: &str) -> u64 {
    s.errors[kind]
}

fn status(s: &Summary, code: &str) -> u64 {
    s.status.get(code).copied().unwrap_or(0)
}

#[test]
fn open_loop_rate_is_accurate() {
    let srv = start(|_| Reply::Send(ok(b"hello world")));
    let mut c = config(&srv.url("/"));
    c.threads = 2;
    c.rate_profile = Some(RateProfile::parse("300:1,600:1").unwrap());
    let s = run_load(&c).unwrap();
    assert_eq!(s.mode, "open");
    assert_eq!(s.rate_steps.len(), 2);
    for (st, want) in s.rate_steps.iter().zip([300.0, 600.0]) {
        let tol = want * 0.02;
        assert!((st.offered_rps - want).abs() <= tol, "offered {st:?}");
        assert!((st.achieved_rps - want).abs() <= tol, "achieved {st:?}");
        assert_eq!(st.timeouts, 0);
        assert!(!st.overloaded);
    }
    let cap = s.capacity.as_ref().unwrap();
    assert_eq!(cap.r_max, Some(600.0));
    assert!(!cap.overloaded);
    assert!(cap.d_max_kb_per_sec.unwrap() > 0.0);
    assert_eq!(status(&s, "200"), s.requests);
    // Keep-alive connections are pooled, not one per request.
    assert!(
        s.connections_opened < s.requests / 4,
        "{}",
        s.connections_opened
    );
}

/// A server whose `/r/N` redirects to `/r/N-1` (`/r/0` answers "done"), whose `/loop`
/// redirects to itself and whose `/x` redirects to `/y` on a second server; returns both.
fn redirecting_servers() -> (support::Server, support::Server) {
    let other = start(|r| {
        if r.path == "/y" {
            Reply::Send(ok(b"yy"))
        } else {
            Reply::Send(response(404, "", b""))
        }
    });
    let other_url = other.url("/y");
    let srv = start(move |r| {
        let p = r.path.as_str();
        if let Some(n) = p.strip_prefix("/r/") {
            let n: u32 = n.parse().unwrap();
            if n == 0 {
                Reply::Send(ok(b"done"))
            } else {
                Reply::Send(response(302, &format!("Location: /r/{}\r\n", n - 1), b""))
            }
        } else if p == "/loop" {
            Reply::Send(response(302, "Location: /loop\r\n", b"again"))
        } else if p == "/x" {
            Reply::Send(response(307, &format!("Location: {other_url}\r\n"), b""))
        } else {
            Reply::Send(response(404, "", b""))
        }
    });
    (srv, other)
}

#[test]
fn redirects_are_followed_counted_and_bounded() {
    let (srv, other) = redirecting_servers();
    let trace: Vec<ReplayRequest> = ["/r/3", "/loop", "/x"]
        .iter()
        .map(|p| ReplayRequest::get(*p))
        .collect();
    let mut c = config(&srv.url("/"));
    c.workload = Workload::Trace(trace.clone());
    c.max_redirects = 5;
    let started = Instant::now();
    let s = run_load(&c).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(status(&s, "200"), 2, "{:?}", s.status);
    assert_eq!(s.redirects, 3 + 5 + 1);
    assert_eq!(errors(&s, "redirect_limit"), 1);
    assert_eq!(s.errors_total, 1);
    assert_eq!(other.seen().len(), 1);
    assert_eq!(
        other.seen()[0].host.as_deref(),
        Some(&*other.addr.to_string())
    );

    // Not following: the 3xx responses are final.
    c.max_redirects = 0;
    let s = run_load(&c).unwrap();
    assert_eq!(s.redirects, 0);
    assert_eq!(status(&s, "302"), 2);
    assert_eq!(status(&s, "307"), 1);
}

#[test]
fn silent_server_times_out() {
    let srv = start(|_| Reply::Silent);
    // Closed loop: every connection times out and reconnects.
    for (io, name) in ENGINES {
        let mut c = config(&srv.url("/"));
        c.io = io;
        c.connections = 2;
        c.timeout = Duration::from_millis(300);
        c.duration = Some(Duration::from_millis(1000));
        let accepted = srv.accepted();
        let started = Instant::now();
        let s = run_load(&c).unwrap();
        assert_eq!(s.io, name);
        assert!(started.elapsed() < Duration::from_secs(3), "{name}");
        assert_eq!(s.requests, 0, "{name}");
        // Three rounds of 300 ms fit in the second on each of the two connections.
        assert!((4..=6).contains(&s.timeouts), "{name}: {}", s.timeouts);
        assert_eq!(s.errors_total, 0, "{name}");
        // Each timed-out request leaves its connection: the next opens a new one.
        assert!(srv.accepted() - accepted >= 4, "{name}");
    }

    // Open loop: all requests time out, so the first step already overloads the server.
    let mut c = config(&srv.url("/"));
    c.timeout = Duration::from_millis(300);
    c.rate_profile = Some(RateProfile::parse("20:1").unwrap());
    let started = Instant::now();
    let s = run_load(&c).unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(s.rate_steps[0].issued, 20);
    assert_eq!(s.timeouts, 20);
    let cap = s.capacity.unwrap();
    assert!(cap.overloaded);
    assert_eq!(cap.r_max, None);
    assert_eq!(cap.overload_rate, Some(20.0));
}

#[test]
fn errors_by_kind() {
    for (io, name) in ENGINES {
        errors_by_kind_on(io, name);
    }
}

fn errors_by_kind_on(io: IoEngine, name: &str) {
    // Connection refused: a port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut c = config(&format!("http://127.0.0.1:{port}/"));
    c.io = io;
    c.requests = Some(5);
    let s = run_load(&c).unwrap();
    assert_eq!(s.io, name);
    assert_eq!(errors(&s, "connect_refused"), 5, "{name}: {:?}", s.errors);

    type MakeReply = fn() -> Reply;
    let cases: [(&str, MakeReply); 3] = [
        ("reset", || Reply::Reset),
        ("bad_response", || Reply::Send(b"HELLO\r\n\r\n".to_vec())),
        ("closed", || {
            Reply::SendClose(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".to_vec())
        }),
    ];
    for (kind, reply) in cases {
        let srv = start(move |_| reply());
        let mut c = config(&srv.url("/"));
        c.io = io;
        c.requests = Some(3);
        let s = run_load(&c).unwrap();
        assert_eq!(errors(&s, kind), 3, "{name} {kind}: {:?}", s.errors);
        assert_eq!(s.errors_total, 3, "{name} {kind}: {:?}", s.errors);
        assert_eq!(s.requests, 0);
    }
}

#[test]
fn pipelined_batches_are_answered_in_order() {
    // The server holds /p/* requests until /p/last arrives: only a client that really
    // pipelines the batch gets answers.
    let srv = start_with(
        Opts {
            hold: Some(("/p/", "/p/last")),
        },
        |r| match r.path.as_str() {
            "/first" => Reply::Send(ok(b"f")),
            "/p/1" => Reply::Send(ok(&[b'a'; 1])),
            "/p/2" => Reply::Send(response(404, "", &[b'b'; 22])),
            "/p/last" => Reply::Send(chunked(200, &[b'c'; 333], 100)),
            _ => Reply::Send(response(500, "", b"")),
        },
    );
    let session = Session {
        batches: vec![
            vec![ReplayRequest::get("/first")],
            ["/p/1", "/p/2", "/p/last"]
                .iter()
                .map(|p| ReplayRequest::get(*p))
                .collect(),
        ],
        think_times: vec![Duration::from_millis(50)],
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.csv");
    let mut c = config(&srv.url("/"));
    c.connections = 2;
    c.timeout = Duration::from_secs(2);
    c.workload = Workload::Sessions(vec![session.clone(), session.clone(), session]);
    c.think_time = switchyard_load::ThinkTime::Trace(1.0);
    c.request_log = Some(log.clone());
    let s = run_load(&c).unwrap();
    assert_eq!(s.mode, "sessions");
    assert_eq!(s.timeouts, 0, "{s:?}");
    assert_eq!(s.requests, 12);
    assert_eq!(status(&s, "404"), 3);
    assert_eq!(s.body_bytes, 3 * (1 + 1 + 22 + 333));
    // One connection per session.
    assert_eq!(s.connections_opened, 3);
    assert_eq!(srv.accepted(), 3);
    let text = std::fs::read_to_string(&log).unwrap();
    let mut lines = 0;
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let (path, status, body) = (f[2], f[3], f[4]);
        let want = match path {
            "/first" => ("200", "1"),
            "/p/1" => ("200", "1"),
            "/p/2" => ("404", "22"),
            "/p/last" => ("200", "333"),
            _ => panic!("unexpected {line}"),
        };
        assert_eq!((status, body), want, "{line}");
        assert_eq!(f[7], "ok");
        lines += 1;
    }
    assert_eq!(lines, 12);
}

#[test]
fn http10_and_keep_alive() {
    for (io, name) in ENGINES {
        let srv = start(|r| {
            if r.minor_version == 0 {
                Reply::SendClose(b"HTTP/1.0 200 OK\r\n\r\nclose-delimited".to_vec())
            } else {
                Reply::Send(ok(b"kept"))
            }
        });
        // HTTP/1.1: one connection carries every request.
        let mut c = config(&srv.url("/"));
        c.io = io;
        c.requests = Some(20);
        let s = run_load(&c).unwrap();
        assert_eq!(s.io, name);
        assert_eq!((s.requests, s.connections_opened), (20, 1), "{name}");
        assert_eq!(srv.accepted(), 1, "{name}");

        // HTTP/1.0: one connection per request, close-delimited bodies.
        c.version = HttpVersion::Http10;
        c.keep_alive = false;
        let s = run_load(&c).unwrap();
        assert_eq!((s.requests, s.connections_opened), (20, 20), "{name}");
        assert_eq!(s.errors_total, 0, "{name}");
        assert_eq!(s.body_bytes, 20 * 15, "{name}");
        assert!(srv.seen().iter().any(|r| r.minor_version == 0));

        // A server that closes each kept-alive connection after its response (without
        // saying so): the next request, sent on the closed connection, goes again on a new
        // one and nothing is lost.
        let srv = start(|_| Reply::SendClose(ok(b"bye")));
        let mut c = config(&srv.url("/"));
        c.io = io;
        c.requests = Some(10);
        let s = run_load(&c).unwrap();
        assert_eq!(
            (s.requests, s.errors_total),
            (10, 0),
            "{name}: {:?}",
            s.errors
        );
        assert_eq!(srv.accepted(), 10, "{name}");
    }

    // A server answering HTTP/1.1 requests with non-persistent HTTP/1.0 responses, while
    // the client pipelines: unanswered requests are sent again on a new connection.
    let srv =
        start(|_| Reply::SendClose(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()));
    let mut c = config(&srv.url("/"));
    c.pipeline = 4;
    c.requests = Some(8);
    let s = run_load(&c).unwrap();
    assert_eq!(s.requests, 8);
    assert_eq!(s.errors_total, 0);
    assert_eq!(s.connections_opened, 8);
}

#[test]
fn trace_replays_in_log_order() {
    let srv = start(|_| Reply::Send(ok(b"x")));
    let paths: Vec<String> = (0..40).map(|i| format!("/f{i}?q={i}")).collect();
    let mut c = config(&srv.url("/"));
    c.workload = Workload::Trace(paths.iter().map(ReplayRequest::get).collect());
    c.host = Some("site.example".into());
    let s = run_load(&c).unwrap();
    assert_eq!((s.mode.as_str(), s.requests), ("trace", 40));
    let seen: Vec<String> = srv.seen().into_iter().map(|r| r.path).collect();
    assert_eq!(seen, paths);
    assert!(srv
        .seen()
        .iter()
        .all(|r| r.host.as_deref() == Some("site.example")));

    // Over several connections every request is sent exactly once.
    let srv = start(|_| Reply::Send(ok(b"x")));
    let mut c = config(&srv.url("/"));
    c.connections = 4;
    c.threads = 2;
    c.workload = Workload::Trace(paths.iter().map(ReplayRequest::get).collect());
    let s = run_load(&c).unwrap();
    assert_eq!(s.requests, 40);
    let mut seen: Vec<String> = srv.seen().into_iter().map(|r| r.path).collect();
    seen.sort();
    let mut want = paths.clone();
    want.sort();
    assert_eq!(seen, want);
}

#[test]
fn spread_sends_request_i_to_address_i_mod_n() {
    // Three servers, HTTP/1.0 (a connection per request), four connections at once: request
    // i of the trace reaches server i mod 3 whatever the order the connections run in.
    let servers: Vec<_> = (0..3).map(|_| start(|_| Reply::Send(ok(b"x")))).collect();
    let paths: Vec<String> = (0..30).map(|i| format!("/f{i}")).collect();
    let mut c = config(&servers[0].url("/"));
    c.connections = 4;
    c.threads = 2;
    c.version = HttpVersion::Http10;
    c.keep_alive = false;
    c.spread = servers.iter().map(|s| s.addr).collect();
    c.workload = Workload::Trace(paths.iter().map(ReplayRequest::get).collect());
    let s = run_load(&c).unwrap();
    assert_eq!((s.requests, status(&s, "200")), (30, 30));
    for (k, srv) in servers.iter().enumerate() {
        let mut seen: Vec<String> = srv.seen().into_iter().map(|r| r.path).collect();
        seen.sort();
        let mut want: Vec<String> = (0..30)
            .filter(|i| i % 3 == k)
            .map(|i| format!("/f{i}"))
            .collect();
        want.sort();
        assert_eq!(seen, want, "server {k}");
        assert_eq!(srv.accepted(), 10, "server {k}");
    }
    // The flag needs a trace.
    assert!(
        Cmd::try_parse_from(["load", "http://127.0.0.1:1/", "--spread", "127.0.0.1:2"]).is_err()
    );
    let cmd = Cmd::try_parse_from([
        "load",
        "http://127.0.0.1:1/",
        "--trace",
        "t.log",
        "--spread",
        "127.0.0.1:2,127.0.0.1:3",
    ])
    .unwrap();
    assert_eq!(cmd.load.spread.len(), 2);
}

#[derive(Parser)]
struct Cmd {
    #[command(flatten)]
    load: LoadArgs,
}

#[test]
fn json_summary_shape_and_series_files() {
    let srv = start(|_| Reply::Send(ok(&[b'z'; 1024])));
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("s.csv");
    let svg = dir.path().join("s.svg");
    let js = dir.path().join("s.json");
    let args = Cmd::parse_from([
        "load".to_owned(),
        srv.url("/index.html"),
        "--connections".into(),
        "4".into(),
        "--threads".into(),
        "2".into(),
        "--duration".into(),
        "1500ms".into(),
        "--json".into(),
        "--csv".into(),
        csv.display().to_string(),
        "--svg".into(),
        svg.display().to_string(),
        "--series-json".into(),
        js.display().to_string(),
    ])
    .load;
    let mut out = Vec::new();
    let summary = run(&args, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["mode"], "closed");
    // The closed loop over one URL takes io_uring by default (--io auto).
    assert_eq!(v["io"], "io_uring");
    assert!(v["requests_per_sec"].as_f64().unwrap() > 0.0);
    assert!(v["bytes_per_sec"].as_f64().unwrap() > 1000.0);
    for key in ["p50", "p90", "p99", "max", "mean"] {
        assert!(v["latency_us"][key].is_number(), "{key}");
        assert!(v["first_byte_us"][key].is_number(), "{key}");
    }
    assert!(v["latency_us"]["p50"].as_u64().unwrap() > 0);
    assert_eq!(v["status"]["200"].as_u64().unwrap(), summary.requests);
    assert_eq!(v["timeouts"], 0);
    assert_eq!(v["errors"]["connect_refused"], 0);
    assert_eq!(v["errors"].as_object().unwrap().len(), 9);
    assert!(v["cpu"]["us_per_request"].is_number());
    assert_eq!(v["connections_opened"], 4);

    let csv = std::fs::read_to_string(csv).unwrap();
    let mut lines = csv.lines();
    assert!(lines.next().unwrap().starts_with("second,requests,"));
    assert_eq!(lines.count(), 2);
    let series: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(js).unwrap()).unwrap();
    assert_eq!(series.as_array().unwrap().len(), 2);
    let total: u64 = series
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(total, summary.requests);
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
}

#[test]
fn cli_replays_an_access_log_as_sessions() {
    let srv = start(|r| {
        if r.method == "HEAD" {
            Reply::Send(response(200, "", b""))
        } else {
            Reply::Send(ok(r.path.as_bytes()))
        }
    });
    let log: String = [
        ("a", "00:00:00", "GET /index.html HTTP/1.1"),
        ("b", "00:00:01", "GET /b.html?x=1 HTTP/1.0"),
        ("a", "00:00:06", "GET /img1.gif HTTP/1.1"),
        ("a", "00:00:06", "HEAD /img2.gif HTTP/1.1"),
        ("a", "00:00:40", "GET /later.html HTTP/1.1"),
    ]
    .iter()
    .map(|(c, t, r)| format!("{c} - - [01/Jun/1995:{t} +0000] \"{r}\" 200 100\n"))
    .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    std::fs::write(&path, log).unwrap();
    let args = Cmd::parse_from([
        "load".to_owned(),
        srv.url("/"),
        "--trace".into(),
        path.display().to_string(),
        "--sessions".into(),
        "--connections".into(),
        "2".into(),
        "--json".into(),
    ])
    .load;
    let mut out = Vec::new();
    let s = run(&args, &mut out).unwrap();
    assert_eq!(s.mode, "sessions");
    assert_eq!(s.requests, 5);
    assert_eq!(s.connections_opened, 3);
    let body: u64 = ["/index.html", "/b.html?x=1", "/img1.gif", "/later.html"]
        .iter()
        .map(|p| p.len() as u64)
        .sum();
    assert_eq!(s.body_bytes, body);
    let mut paths: Vec<String> = srv.seen().into_iter().map(|r| r.path).collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "/b.html?x=1",
            "/img1.gif",
            "/img2.gif",
            "/index.html",
            "/later.html"
        ]
    );
}

#[test]
fn io_uring_loop_follows_redirects_and_logs_requests() {
    let (srv, other) = redirecting_servers();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.csv");
    let run = |path: &str, max_redirects: u32| {
        let mut c = config(&srv.url(path));
        c.io = IoEngine::Uring;
        c.requests = Some(4);
        c.max_redirects = max_redirects;
        c.request_log = Some(log.clone());
        let s = run_load(&c).unwrap();
        assert_eq!(s.io, "io_uring");
        s
    };

    // Same origin: three hops on the loop's connection, then the final response.
    let s = run("/r/3", 5);
    assert_eq!((status(&s, "200"), s.redirects, s.errors_total), (4, 12, 0));
    assert_eq!(s.connections_opened, 1);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 4, "{text}");
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(
            (f[1], f[2], f[3], f[4], f[7]),
            ("GET", "/r/3", "200", "4", "ok")
        );
        let (first, done): (u64, u64) = (f[5].parse().unwrap(), f[6].parse().unwrap());
        assert!(first <= done, "{line}");
    }

    // Another origin: each request's last hop goes to the other server, with its Host.
    let s = run("/x", 5);
    assert_eq!((status(&s, "200"), s.redirects, s.errors_total), (4, 4, 0));
    let seen = other.seen();
    assert_eq!(seen.len(), 4);
    assert!(seen
        .iter()
        .all(|r| r.host.as_deref() == Some(&*other.addr.to_string())));

    // A redirect loop ends at the limit, counted as an error and logged as one.
    let s = run("/loop", 2);
    assert_eq!((s.requests, errors(&s, "redirect_limit")), (0, 4));
    assert_eq!(s.redirects, 4 * 2);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.lines()
            .filter(|l| l.ends_with(",redirect_limit"))
            .count(),
        4,
        "{text}"
    );

    // Not following: the 3xx responses are final.
    let s = run("/r/3", 0);
    assert_eq!((status(&s, "302"), s.redirects), (4, 0));
}

#[test]
fn io_uring_loop_reads_large_and_chunked_bodies() {
    let big: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
    let chunk_body = vec![b'c'; 70_000];
    let srv = start(move |r| match r.path.as_str() {
        "/big" => Reply::Send(ok(&big)),
        _ => Reply::Send(chunked(200, &chunk_body, 1000)),
    });
    for (path, body) in [("/big", 300 * 1024u64), ("/chunked", 70_000)] {
        for (io, name) in ENGINES {
            let mut c = config(&srv.url(path));
            c.io = io;
            c.connections = 3;
            c.requests = Some(12);
            let s = run_load(&c).unwrap();
            assert_eq!((s.requests, s.errors_total), (12, 0), "{name} {path}");
            assert_eq!(s.body_bytes, 12 * body, "{name} {path}");
            assert_eq!(s.connections_opened, 3, "{name} {path}");
        }
    }
}

#[test]
fn io_uring_is_refused_for_what_it_does_not_run() {
    let srv = start(|_| Reply::Send(ok(b"x")));
    let mut c = config(&srv.url("/"));
    c.io = IoEngine::Uring;
    c.pipeline = 2;
    c.requests = Some(4);
    let err = run_load(&c).unwrap_err().to_string();
    assert!(err.contains("not pipelining"), "{err}");
    // Auto takes the epoll loop for it instead.
    c.io = IoEngine::Auto;
    let s = run_load(&c).unwrap();
    assert_eq!((s.io.as_str(), s.requests), ("epoll", 4));
    // And io_uring for a plain closed loop.
    c.pipeline = 1;
    let s = run_load(&c).unwrap();
    assert_eq!((s.io.as_str(), s.requests), ("io_uring", 4));
    assert_eq!(srv.accepted(), 2);
}
