//! One-way delivery across hosts with the real binaries: `switchyard lab up --mechanism handoff`
//! starts a switch and two nodes in their own network namespaces; clients in the client
//! namespace fetch through the VIP. Needs root (network namespaces, TCP_REPAIR, tc/eBPF):
//! without it, or with `SWITCHYARD_SKIP_ROOT_TESTS=1`, the runner reports the tests as
//! ignored with the reason (`switchyard_testkit::root`, shared with the lab crate's
//! root tests).
//!
//! A switch killed with SIGKILL leaves its steering behind (eBPF pins and the tc attachment,
//! or its nftables table); the last two tests start another in its place and show that it
//! replaces them rather than adding its own beside them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use switchyard_testkit::http::{get_once, read_response};
use switchyard_testkit::wait::{eventually, holds_for};
use switchyard_testkit::{pipeline, root};

mod lab_support;
use lab_support::{read_all, Lab, SlowReader};

fn main() {
    root::main(root::tests![
        handoff_across_hosts_with_the_real_switch_and_nodes,
        multiple_handoff_and_backend_forwarding_across_hosts,
        handoff_with_nftables_steering,
        randomized_pipelines_across_hosts,
        a_connection_still_sending_is_relayed_rather_than_moved,
        a_slow_reader_gets_the_whole_response_after_the_node_closes,
        a_switch_started_after_a_sigkill_replaces_its_ebpf_steering,
        a_switch_started_after_a_sigkill_replaces_its_nftables_table,
    ]);
}

/// A lab with a switch and two nodes (`lab up --nodes 2 --mechanism handoff` and `extra`),
/// once the switch's admin listener answers.
fn up(tag: char, extra: &[&str]) -> Lab {
    let mut args = vec!["--nodes", "2", "--mechanism", "handoff"];
    args.extend_from_slice(extra);
    let me = Lab::start(tag, &args, |_| Vec::new());
    // The switch sets up its steering before its admin listener answers.
    let (_, ip) = me.host("switch");
    let admin: SocketAddr = format!("{ip}:9080").parse().unwrap();
    let up = me.on_client(move || {
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if get_once(admin, "/healthz").is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    assert!(
        up,
        "the switch's admin listener never answered\n{}",
        me.logs()
    );
    me
}

/// What the handoff suites read of the lab's switch.
impl Lab {
    /// The switch's Prometheus text, fetched from the client host.
    fn switch_metrics(&self) -> String {
        self.switch_admin("/metrics")
    }

    /// A page of the switch's admin listener, fetched from the client host.
    fn switch_admin(&self, path: &'static str) -> String {
        let (_, ip) = self.host("switch");
        let admin: SocketAddr = format!("{ip}:9080").parse().unwrap();
        self.on_client(move || {
            let (_, body) = get_once(admin, path).unwrap();
            String::from_utf8(body).unwrap()
        })
    }

    fn metric(&self, name: &str) -> f64 {
        self.switch_metrics()
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    /// Fetch `path` through the VIP until the switch has handed a connection off (its control
    /// connections come up in the background), within 10 s.
    fn wait_for_a_handoff(&self, path: &'static str) {
        let vip = self.vip();
        let until = Instant::now() + Duration::from_secs(10);
        while self.metric("switchyard_handoff_repair_total") < 1.0 {
            let _ = self.on_client(move || get_once(vip, path));
            assert!(
                Instant::now() < until,
                "no connection was handed off\n{}\n{}",
                self.switch_metrics(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Handoffs the switch abandoned so far, for every reason.
    fn abandoned(&self) -> f64 {
        self.switch_metrics()
            .lines()
            .filter_map(|l| l.strip_prefix("switchyard_handoff_abandoned_total{"))
            .filter_map(|r| r.rsplit_once(' '))
            .map(|(_, v)| v.trim().parse::<f64>().unwrap())
            .sum()
    }
}

/// One response on a kept connection: status and body (`buf` keeps what follows).
fn read_one(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<(u16, Vec<u8>)> {
    read_response(s, buf).map(|r| (r.status, r.body))
}

/// The lab's generated sample file of `size` bytes.
fn sample(size: usize) -> Vec<u8> {
    (0..size).map(|i| b'a' + (i % 26) as u8).collect()
}

fn handoff_across_hosts_with_the_real_switch_and_nodes() {
    let lab = up('h', &[]);
    let vip = lab.vip();
    let started = Instant::now();
    // Each node installed its rule for VIP packets without a socket (--handoff-vip).
    for node in ["node0", "node1"] {
        let (ns, _) = lab.host(node);
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "nft", "list", "tables"])
            .output()
            .unwrap();
        let tables = String::from_utf8_lossy(&out.stdout);
        assert!(tables.contains("sy_nosock_node"), "{node}: {tables}");
    }
    // The switch brings its control connections up in the background.
    let ready = lab.on_client(move || {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if get_once(vip, "/1k.bin").is_ok_and(|(st, _)| st == 200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    });
    assert!(ready, "the VIP never answered\n{}", lab.logs());
    lab.wait_for_a_handoff("/1k.bin");

    // curl through a handoff.
    let (client_ns, _) = lab.host("client0");
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &client_ns,
            "curl",
            "-sS",
            "--max-time",
            "10",
        ])
        .arg(format!("http://{vip}/100k.bin"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, sample(100 * 1024));

    // Keep-alive, pipelining and a 5 MB body on handed-off connections.
    lab.on_client(move || {
        let mut s = TcpStream::connect(vip).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = Vec::new();
        for _ in 0..3 {
            s.write_all(b"GET /1k.bin HTTP/1.1\r\nHost: lab\r\n\r\n")
                .unwrap();
            let (st, body) = read_one(&mut s, &mut buf).unwrap();
            assert_eq!((st, body), (200, sample(1024)));
        }
        let mut batch = Vec::new();
        for _ in 0..8 {
            batch.extend_from_slice(b"GET /1k.bin HTTP/1.1\r\nHost: lab\r\n\r\n");
        }
        s.write_all(&batch).unwrap();
        for _ in 0..8 {
            let (st, body) = read_one(&mut s, &mut buf).unwrap();
            assert_eq!((st, body.len()), (200, 1024));
        }
        s.write_all(b"GET /5m.bin HTTP/1.1\r\nHost: lab\r\n\r\n")
            .unwrap();
        let (st, body) = read_one(&mut s, &mut buf).unwrap();
        assert_eq!(st, 200);
        assert!(body == sample(5 * 1024 * 1024), "5 MB body differs");
    });

    // A client reusing its source port while the old connection's entry lingers.
    lab.on_client(move || {
        for _ in 0..2 {
            // The earlier connection on this port is gone once the node has acknowledged the
            // client's FIN; until then (a round trip, longer on a loaded host) the kernel
            // refuses the same four-tuple.
            let t = Instant::now();
            let sock = loop {
                let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                sock.set_reuse_address(true).unwrap();
                sock.bind(&SocketAddr::from(([0, 0, 0, 0], 45_678)).into())
                    .unwrap();
                match sock.connect_timeout(&vip.into(), Duration::from_secs(5)) {
                    Ok(()) => break sock,
                    Err(e)
                        if e.kind() == std::io::ErrorKind::AddrNotAvailable
                            && t.elapsed() < Duration::from_secs(5) =>
                    {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => panic!("connect from port 45678: {e}"),
                }
            };
            let mut s: TcpStream = sock.into();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"GET /1k.bin HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut buf = Vec::new();
            let (st, body) = read_one(&mut s, &mut buf).unwrap();
            assert_eq!((st, body.len()), (200, 1024));
            // The node closes first; wait for its FIN so the port is free at once.
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
        }
    });

    // 10,000 handed-off connections, eight clients at a time, none failing.
    let before = lab.metric("switchyard_handoff_repair_total");
    let failures = lab.on_client(move || {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut bad = Vec::new();
                    for _ in 0..1250 {
                        match get_once(vip, "/1k.bin") {
                            Ok((200, b)) if b.len() == 1024 => {}
                            other => bad.push(format!("{other:?}")),
                        }
                    }
                    bad
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let handed = lab.metric("switchyard_handoff_repair_total") - before;
    let metrics = lab.switch_metrics();
    // A handoff that cannot happen in time is relayed, never lost: at most 1% may be.
    assert!(
        handed >= 9_900.0,
        "only {handed} of 10000 handed off\n{metrics}"
    );

    // A node killed with a connection on it: the client's connection ends (no hang), and new
    // connections are served by the other node.
    let served = |lab: &Lab| -> Vec<f64> {
        ["node0", "node1"]
            .iter()
            .map(|h| {
                let (_, ip) = lab.host(h);
                lab.metric(&format!(
                    "switchyard_switch_node_requests_total{{node=\"{ip}:80\"}}"
                ))
            })
            .collect()
    };
    let before = served(&lab);
    let conn = lab.on_client(move || {
        let mut s = TcpStream::connect(vip).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = Vec::new();
        s.write_all(b"GET /1k.bin HTTP/1.1\r\nHost: lab\r\n\r\n")
            .unwrap();
        assert_eq!(read_one(&mut s, &mut buf).unwrap().0, 200);
        s
    });
    let holder = {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let after = served(&lab);
            if let Some(i) = (0..2).find(|&i| after[i] > before[i]) {
                break i;
            }
            assert!(Instant::now() < until, "no node reported the request");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let victim = lab.pid(if holder == 0 { "node0" } else { "node1" });
    let abandoned_before = lab.abandoned();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let (ok_after, old_conn_ended) = lab.on_client(move || {
        let mut s = conn;
        let t = Instant::now();
        let mut buf = Vec::new();
        let _ = s.write_all(b"GET /1k.bin HTTP/1.1\r\nHost: lab\r\n\r\n");
        // Either the other node still had it (a response) or it ends: never a hang.
        let ended = read_one(&mut s, &mut buf).is_ok() || t.elapsed() < Duration::from_secs(9);
        let mut ok = 0;
        for _ in 0..50 {
            if matches!(get_once(vip, "/1k.bin"), Ok((200, _))) {
                ok += 1;
            }
        }
        (ok, ended)
    });
    assert!(old_conn_ended);
    // A connection whose handoff to the node was under way when its control connection ended
    // has an unknown fate: the switch closes it unanswered (never serving it twice) and counts
    // it. The requests go one at a time, so at most one can be caught so; every other is served.
    let abandoned = lab.abandoned() - abandoned_before;
    assert!(
        abandoned <= 1.0,
        "{abandoned} handoffs abandoned\n{}",
        lab.logs()
    );
    assert_eq!(
        ok_after as f64 + abandoned,
        50.0,
        "requests after a node died\n{}",
        lab.logs()
    );
    assert!(started.elapsed() < Duration::from_secs(240));
}

fn multiple_handoff_and_backend_forwarding_across_hosts() {
    // Sixteen targets: consistent hashing spreads them over both nodes.
    let site = tempfile::tempdir().unwrap();
    let file = |i: usize| -> Vec<u8> { (0..3000 + i).map(|k| (k * 7 + i) as u8).collect() };
    for i in 0..16 {
        std::fs::write(site.path().join(format!("f{i}")), file(i)).unwrap();
    }
    std::fs::write(site.path().join("index.html"), b"lab\n").unwrap();
    let root = site.path().to_str().unwrap().to_owned();
    for (tag, mode, counter) in [
        (
            'm',
            "multiple-handoff",
            "switchyard_handoff_hand_backs_total",
        ),
        (
            'f',
            "backend-forwarding",
            "switchyard_handoff_backend_forwards_total",
        ),
    ] {
        let persistent = format!("--persistent={mode}");
        let lab = up(
            tag,
            &[
                "--root",
                &root,
                "--switch-arg=--policy=chash",
                &format!("--switch-arg={persistent}"),
            ],
        );
        let vip = lab.vip();
        lab.wait_for_a_handoff("/index.html");
        // One keep-alive connection asks for every target, twice.
        lab.on_client(move || {
            let mut s = TcpStream::connect(vip).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = Vec::new();
            for round in 0..2 {
                for i in 0..16 {
                    s.write_all(format!("GET /f{i} HTTP/1.1\r\nHost: lab\r\n\r\n").as_bytes())
                        .unwrap();
                    let (st, body) = read_one(&mut s, &mut buf)
                        .unwrap_or_else(|e| panic!("round {round} f{i}: {e}"));
                    assert_eq!(st, 200);
                    assert!(body == file(i), "f{i} body differs");
                }
            }
        });
        let metrics = lab.switch_metrics();
        let moved = lab.metric(counter);
        assert!(
            moved > 0.0,
            "{mode}: {counter} stayed 0\n{metrics}\n{}",
            lab.logs()
        );
        assert_eq!(
            lab.metric("switchyard_handoff_fallbacks_total{reason=\"hand_back\"}"),
            0.0,
            "{metrics}\n{}",
            lab.logs()
        );
    }
}

fn handoff_with_nftables_steering() {
    let lab = up('n', &["--switch-arg=--steering=nftables"]);
    let vip = lab.vip();
    lab.wait_for_a_handoff("/1k.bin");
    let before = lab.metric("switchyard_handoff_repair_total");
    let bad = lab.on_client(move || {
        // Keep-alive with a large body, then many short connections.
        let mut s = TcpStream::connect(vip).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = Vec::new();
        for _ in 0..3 {
            s.write_all(b"GET /100k.bin HTTP/1.1\r\nHost: lab\r\n\r\n")
                .unwrap();
            let (st, body) = read_one(&mut s, &mut buf).unwrap();
            assert_eq!(st, 200);
            assert!(body == sample(100 * 1024));
        }
        (0..500)
            .filter(|_| !matches!(get_once(vip, "/1k.bin"), Ok((200, b)) if b.len() == 1024))
            .count()
    });
    assert_eq!(bad, 0);
    let handed = lab.metric("switchyard_handoff_repair_total") - before;
    assert!(
        handed >= 495.0,
        "{handed} handed off\n{}",
        lab.switch_metrics()
    );
    let status = lab.switch_admin("/status.json");
    assert!(status.contains("\"steering\":\"nftables\""), "{status}");
    // Every connection has closed: its entry goes once the linger time is over.
    let until = Instant::now() + Duration::from_secs(10);
    while lab.metric("switchyard_handoff_steering_entries") > 0.0 {
        assert!(
            Instant::now() < until,
            "steering entries left behind\n{}",
            lab.switch_metrics()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(lab.metric("switchyard_handoff_connections_active"), 0.0);
}

/// The randomized pipelining trials of `switchyard_testkit::pipeline` through every one-way
/// mode across hosts (TCP_REPAIR and steering): one node per connection, moving between
/// nodes, and back-end forwarding. `SWITCHYARD_PIPELINE_TRIALS` sets the trials per mode.
fn randomized_pipelines_across_hosts() {
    let site = tempfile::tempdir().unwrap();
    pipeline::fill(site.path(), 0);
    let root = site.path().to_str().unwrap().to_owned();
    let (n, seed) = pipeline::trials_from_env(40);
    for (tag, mode) in [
        ('s', "single"),
        ('m', "multiple-handoff"),
        ('f', "backend-forwarding"),
    ] {
        let lab = up(
            tag,
            &[
                "--root",
                &root,
                "--switch-arg=--policy=chash",
                &format!("--switch-arg=--persistent={mode}"),
            ],
        );
        let vip = lab.vip();
        lab.wait_for_a_handoff("/who");
        let failures = lab.on_client(move || pipeline::run_trials(vip, n, seed, 4));
        assert!(
            failures.is_empty(),
            "{mode}: {} of {n} trials failed:\n{}\n{}",
            failures.len(),
            failures.join("\n"),
            lab.logs()
        );
        assert!(lab.metric("switchyard_handoff_repair_total") >= n as f64 / 2.0);
    }
}

/// A TCP_REPAIR dump takes the send queue as it is at one moment while the kernel may go on
/// sending from it, so a connection with bytes still unsent is relayed, not moved (fallback
/// `still_sending`). Here the client reads nothing, with a small receive buffer: the relayed
/// answer to a GET with a body (relayed, its body is checked at the switch) stays queued at
/// the switch while the pipelined GET behind it, which would otherwise move, is decided.
fn a_connection_still_sending_is_relayed_rather_than_moved() {
    let site = tempfile::tempdir().unwrap();
    // Larger than the client's window, small enough for the switch's send buffer.
    let big = sample(8 * 1024);
    std::fs::write(site.path().join("big"), &big).unwrap();
    std::fs::write(site.path().join("small"), b"small").unwrap();
    let root = site.path().to_str().unwrap().to_owned();
    let lab = up('u', &["--root", &root]);
    lab.wait_for_a_handoff("/small");
    let still = "switchyard_handoff_fallbacks_total{reason=\"still_sending\"}";
    let before = lab.metric(still);
    let moved = lab.metric("switchyard_handoff_repair_total");

    let request: &[u8] =
        b"GET /big HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nxGET /small HTTP/1.1\r\nHost: t\r\n\r\n";
    let client = SlowReader::connect(&lab, |s| {
        let mut buf = Vec::new();
        let first = read_one(s, &mut buf).unwrap();
        let second = read_one(s, &mut buf).unwrap();
        (first, second)
    });
    client.ask(request);
    let until = Instant::now() + Duration::from_secs(10);
    while lab.metric(still) <= before {
        assert!(
            Instant::now() < until,
            "the second request was never relayed for unsent bytes\n{}\n{}",
            lab.switch_metrics(),
            lab.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (first, second) = client.read();
    assert_eq!(first, (200, big));
    assert_eq!(second, (200, b"small".to_vec()));
    // Neither request moved the connection.
    assert_eq!(lab.metric("switchyard_handoff_repair_total"), moved);
    assert_eq!(lab.abandoned(), 0.0);
}

/// A node that has written its last response into a handed-in connection and closed it is not
/// done with it: the client may not have the response yet, and its acknowledgements and window
/// updates come through the switch's steering entry. Here the client's window is small and it
/// reads nothing until the node has queued the whole answer and shut its side down; the
/// switch's entry would go 1 ms after the node reports the connection closed. The node reports
/// it only once the client has closed, after reading everything.
fn a_slow_reader_gets_the_whole_response_after_the_node_closes() {
    let site = tempfile::tempdir().unwrap();
    // Larger than the client's window, small enough for the node's send buffer.
    let big = sample(16 * 1024);
    std::fs::write(site.path().join("big"), &big).unwrap();
    std::fs::write(site.path().join("small"), b"small").unwrap();
    let cfg = site.path().join("switch.toml");
    std::fs::write(&cfg, "[switch]\nhandoff_linger_ms = 1\n").unwrap();
    let root = site.path().to_str().unwrap().to_owned();
    let config = format!("--switch-arg=--config={}", cfg.display());
    let lab = up('w', &["--root", &root, &config]);
    lab.wait_for_a_handoff("/small");
    let entries = "switchyard_handoff_steering_entries";
    assert!(
        eventually(Duration::from_secs(10), || lab.metric(entries) == 0.0),
        "steering entries stay\n{}",
        lab.logs()
    );
    let moved = lab.metric("switchyard_handoff_repair_total");
    let closed = lab.metric("switchyard_handoff_requests_total");

    let client = SlowReader::connect(&lab, read_all);
    client.ask(b"GET /big HTTP/1.0\r\n\r\n");
    // The node has queued the answer and shut its side down, with bytes the client has not
    // acknowledged: its socket is in FIN-WAIT-1 with a send queue.
    let vip_port = lab.vip().to_string();
    assert!(
        eventually(Duration::from_secs(10), || {
            ["node0", "node1"]
                .iter()
                .any(|n| lab.queued_close(n, &["src", &vip_port]))
        }),
        "no node queued the answer\n{}",
        lab.logs()
    );
    assert_eq!(lab.metric("switchyard_handoff_repair_total"), moved + 1.0);
    // The switch's gauge of live entries is refreshed on its expiry tick (100 ms): it shows
    // this connection's entry within a tick. Had the node reported the connection closed, the
    // entry would go on the first tick after its 1 ms linger: watch it for ten ticks before the
    // client reads.
    let node_sockets = || {
        ["node0", "node1"]
            .iter()
            .map(|n| {
                String::from_utf8_lossy(&in_ns(&lab.host(n).0, &["ss", "-tnoi"]).stdout)
                    .into_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        eventually(Duration::from_secs(10), || lab.metric(entries) >= 1.0),
        "the switch never showed the connection's steering entry\n{}\n{}\n{}",
        lab.switch_metrics(),
        node_sockets(),
        lab.logs()
    );
    assert!(
        holds_for(Duration::from_secs(1), || lab.metric(entries) == 1.0),
        "the steering entry went while the client had not the whole response\n{}\n{}\n{}",
        lab.switch_metrics(),
        node_sockets(),
        lab.logs()
    );
    let (read, all) = client.read();
    assert!(
        read.is_ok(),
        "{read:?} after {} bytes\n{}",
        all.len(),
        lab.logs()
    );
    let text = String::from_utf8_lossy(&all);
    assert!(
        text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
        "{text:.200}"
    );
    assert!(
        all.ends_with(&big),
        "the body is not whole: {} bytes in all",
        all.len()
    );
    // Once the client has closed, so does the node, and the entry goes.
    assert!(
        eventually(Duration::from_secs(10), || {
            lab.metric(entries) == 0.0 && lab.metric("switchyard_handoff_requests_total") > closed
        }),
        "the node never reported the connection closed\n{}\n{}",
        lab.switch_metrics(),
        lab.logs()
    );
    assert_eq!(lab.abandoned(), 0.0);
}

/// `cmd` run in namespace `ns` (`ip netns exec`).
fn in_ns(ns: &str, cmd: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(cmd)
        .output()
        .unwrap()
}

/// The id of the BPF object (`prog` or `map`) pinned at `pin`, if one is.
fn pinned_id(kind: &str, pin: &std::path::Path) -> Option<u64> {
    let out = Command::new("bpftool")
        .args(["--json", kind, "show", "pinned"])
        .arg(pin)
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["id"].as_u64()
}

/// The pin directory (under the switch's pin root) holding program `prog`.
fn pin_dir_of(prog: u64) -> Option<std::path::PathBuf> {
    let root = switchyard_handoff::steer::ebpf::DEFAULT_PIN_ROOT;
    std::fs::read_dir(root)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|d| pinned_id("prog", &d.join("prog")) == Some(prog))
}

/// Whether a BPF object (`prog` or `map`) with this id still exists.
fn bpf_exists(kind: &str, id: u64) -> bool {
    Command::new("bpftool")
        .args([kind, "show", "id", &id.to_string()])
        .output()
        .unwrap()
        .status
        .success()
}

/// The ids of the BPF programs attached to `eth0`'s ingress in `ns`.
fn ingress_progs(ns: &str) -> Vec<u64> {
    let out = in_ns(ns, &["tc", "filter", "show", "dev", "eth0", "ingress"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "id")
        .filter_map(|w| w[1].parse().ok())
        .collect()
}

/// The switch's steering tables in `ns`.
fn steering_tables(ns: &str) -> Vec<String> {
    let out = in_ns(ns, &["nft", "list", "tables"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|t| t.starts_with("sy_steer_"))
        .map(str::to_owned)
        .collect()
}

/// A switch started by the test in the lab's switch namespace; stopped (SIGTERM, which tears
/// its steering down) when the test ends.
struct Replacement {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Replacement {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Replacement {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGKILL the lab's switch, wait until it is gone, and start the same command line again.
fn kill_and_replace_switch(lab: &Lab) -> Replacement {
    let pid = lab.pid("switch");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Gone, or a zombie that holds nothing any more.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        if stat.is_empty() || state == Some("Z") {
            break;
        }
        assert!(Instant::now() < until, "the switch did not die");
        std::thread::sleep(Duration::from_millis(20));
    }
    let cmd: Vec<String> = lab.status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["host"] == "switch")
        .unwrap()["cmd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let (ns, ip) = lab.host("switch");
    let log = lab.state_dir.path().join("replacement-switch.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", &ns])
        .args(&cmd)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let r = Replacement { child, log };
    let admin: SocketAddr = format!("{ip}:9080").parse().unwrap();
    let up = lab.on_client(move || {
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if get_once(admin, "/healthz").is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    assert!(up, "the new switch never answered\n{}", r.log());
    r
}

/// Connections are handed off again, and all of a batch are served.
fn handoffs_work(lab: &Lab, why: &dyn Fn() -> String) {
    let vip = lab.vip();
    let until = Instant::now() + Duration::from_secs(10);
    while lab.metric("switchyard_handoff_repair_total") < 1.0 {
        let _ = lab.on_client(move || get_once(vip, "/1k.bin"));
        assert!(Instant::now() < until, "no handoff\n{}", why());
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = lab.metric("switchyard_handoff_repair_total");
    let bad = lab.on_client(move || {
        (0..200)
            .filter(|_| !matches!(get_once(vip, "/1k.bin"), Ok((200, b)) if b == sample(1024)))
            .count()
    });
    assert_eq!(bad, 0, "{}", why());
    let handed = lab.metric("switchyard_handoff_repair_total") - before;
    assert!(handed >= 195.0, "{handed} of 200 handed off\n{}", why());
}

fn a_switch_started_after_a_sigkill_replaces_its_ebpf_steering() {
    use switchyard_handoff::steer::ebpf::{MAP_NAME, STATS_NAME};
    let lab = up('k', &[]);
    handoffs_work(&lab, &|| lab.logs());
    let (ns, _) = lab.host("switch");
    let attached = ingress_progs(&ns);
    assert_eq!(attached.len(), 1, "{attached:?}\n{}", lab.logs());
    let old = attached[0];
    let dir = pin_dir_of(old).unwrap_or_else(|| panic!("program {old} is pinned nowhere"));
    let old_maps: Vec<u64> = [MAP_NAME, STATS_NAME]
        .iter()
        .map(|m| pinned_id("map", &dir.join(m)).unwrap_or_else(|| panic!("no pinned {m}")))
        .collect();

    let replacement = kill_and_replace_switch(&lab);
    let why = || format!("{}\n{}", lab.logs(), replacement.log());
    // The new switch attached its own program in place of the old one, pinned where the old
    // one was...
    let attached = ingress_progs(&ns);
    assert_eq!(attached.len(), 1, "{attached:?}\n{}", why());
    let new = attached[0];
    assert_ne!(new, old, "the old program is still attached\n{}", why());
    assert_eq!(pin_dir_of(new).as_ref(), Some(&dir), "{}", why());
    // ... and nothing of the old one is left anywhere: a pin or an attachment would keep the
    // program and its maps alive (they are freed once the last goes).
    let until = Instant::now() + Duration::from_secs(5);
    while bpf_exists("prog", old) || old_maps.iter().any(|&m| bpf_exists("map", m)) {
        assert!(
            Instant::now() < until,
            "the old program {old} or its maps {old_maps:?} live on (pinned in {:?})\n{}",
            pin_dir_of(old),
            why()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    handoffs_work(&lab, &why);
    let status = lab.switch_admin("/status.json");
    assert!(status.contains("\"steering\":\"ebpf\""), "{status}");
    drop(replacement);
}

fn a_switch_started_after_a_sigkill_replaces_its_nftables_table() {
    let lab = up('t', &["--switch-arg=--steering=nftables"]);
    handoffs_work(&lab, &|| lab.logs());
    let (ns, _) = lab.host("switch");
    let tables = steering_tables(&ns);
    assert_eq!(tables.len(), 1, "{tables:?}");

    let replacement = kill_and_replace_switch(&lab);
    let why = || format!("{}\n{}", lab.logs(), replacement.log());
    // One table, under the same name: the old one was replaced, not joined by a second.
    assert_eq!(steering_tables(&ns), tables, "{}", why());
    handoffs_work(&lab, &why);
    let status = lab.switch_admin("/status.json");
    assert!(status.contains("\"steering\":\"nftables\""), "{status}");
    drop(replacement);
}
