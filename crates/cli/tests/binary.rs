//! The `switchyard` binary as an operator runs it (a `harness = false` target:
//! the test that needs root is reported as ignored without it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Completion, Trial};

use switchyard_testkit::exit::Exit;
use switchyard_testkit::http::get_once;

fn main() {
    let args = Arguments::from_args();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let trials = vec![
        Trial::test(
            stringify!(demo_serves_the_site_and_metrics_then_stops_cleanly),
            || {
                demo_serves_the_site_and_metrics_then_stops_cleanly();
                Ok(())
            },
        ),
        Trial::ignorable_test(
            stringify!(demo_hands_off_without_any_capability),
            move || {
                if !root {
                    return Ok(Completion::ignored_with(
                        "needs root to drop capabilities; unprivileged, the test above covers it",
                    ));
                }
                demo_hands_off_without_any_capability();
                Ok(Completion::Completed)
            },
        ),
        Trial::test(
            stringify!(node_runs_from_a_config_file_and_flags_override_it),
            || {
                node_runs_from_a_config_file_and_flags_override_it();
                Ok(())
            },
        ),
        Trial::test(stringify!(status_reads_a_node_with_a_rescue_driver), || {
            status_reads_a_node_with_a_rescue_driver();
            Ok(())
        }),
        Trial::test(stringify!(bad_input_gives_clear_errors), || {
            bad_input_gives_clear_errors();
            Ok(())
        }),
        Trial::test(
            stringify!(cooperative_demo_moves_requests_to_their_owners_unprivileged),
            move || {
                cooperative_demo_moves_requests_to_their_owners_unprivileged(root);
                Ok(())
            },
        ),
        Trial::test(stringify!(demo_nodes_do_not_outlive_a_killed_demo), || {
            demo_nodes_do_not_outlive_a_killed_demo();
            Ok(())
        }),
    ];
    libtest_mimic::run(&args, trials).exit()
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// GET a URL (http://host:port/path) with a one-shot HTTP/1.0 request.
fn get(url: &str) -> (u16, Vec<u8>) {
    let rest = url.strip_prefix("http://").unwrap();
    let (hostport, path) = rest.split_at(rest.find('/').unwrap());
    let addr = hostport.to_socket_addrs().unwrap().next().unwrap();
    get_once(addr, path).unwrap()
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn term(child: &mut Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exited = Exit::watch(child.id()).wait(Duration::from_secs(15));
    assert!(exited, "did not stop on SIGTERM");
    child.wait().unwrap()
}

/// The children of process `pid` (from every one of its threads).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let list = std::fs::read_to_string(task.unwrap().path().join("children")).unwrap();
        out.extend(list.split_whitespace().map(|p| p.parse::<u32>().unwrap()));
    }
    out
}

fn demo_serves_the_site_and_metrics_then_stops_cleanly() {
    run_demo(bin());
}

/// The demo's one-way delivery needs no privileges: run it with every capability dropped.
/// Needs root to drop them; without root it is reported as ignored (the test above then
/// already ran the demo without privileges).
fn demo_hands_off_without_any_capability() {
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("setpriv (util-linux) is needed to drop capabilities for this test");
    let mut cmd = Command::new(setpriv);
    cmd.args([
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--no-new-privs",
        "--",
        env!("CARGO_BIN_EXE_switchyard"),
    ]);
    run_demo(cmd);
}

/// The cooperative demo (no switch, nodes sharing one port) serves the site with connections
/// moved among the node processes; as root it runs with every capability dropped, since
/// same-host cloning passes descriptors and needs none.
fn cooperative_demo_moves_requests_to_their_owners_unprivileged(root: bool) {
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args([
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--no-new-privs",
            "--",
            env!("CARGO_BIN_EXE_switchyard"),
        ]);
        c
    } else {
        bin()
    };
    // The nodes share a fixed port: take one the kernel has free now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = cmd
        .args([
            "demo",
            "--cooperative",
            "--nodes",
            "3",
            "--admin",
            "127.0.0.1:0",
        ])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--duration", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut run = Running(child);
    let out = run.0.stdout.take().unwrap();
    let (mut dir, mut node_metrics, mut dashboard) = (None, Vec::new(), None);
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        if dashboard.is_none() && !node_metrics.is_empty() {
            panic!("the dashboard's URL comes first");
        }
        if let Some(u) = line.strip_prefix("switchyard demo: live dashboard at ") {
            dashboard = Some(u.split_whitespace().next().unwrap().to_owned());
        }
        if let Some(u) = line.trim().strip_prefix("metrics:") {
            node_metrics.push(u.split_whitespace().next().unwrap().to_owned());
        }
        if let Some(i) = line.find(" from /") {
            dir = Some(line[i + 6..].to_owned());
        }
        if line.starts_with("Press Ctrl-C") {
            break;
        }
    }
    let dir = dir.expect("demo printed its directory");
    assert_eq!(node_metrics.len(), 3, "three nodes' metrics");
    // The cluster's dashboard on the first member, which knows every member's admin listener.
    let dashboard = dashboard.expect("the demo printed the dashboard's URL");
    let (status, page) = get(&dashboard);
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&page).contains("EventSource"));
    for (i, m) in node_metrics.iter().enumerate() {
        let (status, body) = get(&m.replace("/metrics", "/member.json"));
        assert_eq!(status, 200);
        let s: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(s["name"], format!("n{}", i + 1));
    }
    // One keep-alive connection, twenty pages: each answered with the file's bytes, whichever
    // node owns it.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    for p in 1..=20 {
        let path = format!("/pages/p{p}.html");
        write!(s, "GET {path} HTTP/1.1\r\nHost: demo\r\n\r\n").unwrap();
        let r = switchyard_testkit::http::read_response(&mut s, &mut buf).unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(
            r.body,
            std::fs::read(format!("{dir}{path}")).unwrap(),
            "{path}"
        );
    }
    let sum = |family: &str| -> f64 {
        node_metrics
            .iter()
            .map(|m| {
                let (_, text) = get(m);
                String::from_utf8(text)
                    .unwrap()
                    .lines()
                    .filter(|l| l.starts_with(family))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>()
            })
            .sum()
    };
    // Each node counts its side of a clone on its own; the last clone's counts may land a
    // moment after its response reached the client. Every clone taken in is given back once
    // all is counted.
    assert!(switchyard_testkit::eventually(
        Duration::from_secs(5),
        || {
            let taken = sum("switchyard_node_clones_in_total");
            taken == sum("switchyard_node_clone_hand_backs_total")
                && taken == sum("switchyard_node_clones_out_total")
        }
    ));
    assert!(
        sum("switchyard_node_clones_out_total") >= 1.0,
        "some of twenty pages belong to other nodes than the entry"
    );
    let admin = dashboard
        .strip_prefix("http://")
        .and_then(|a| a.strip_suffix('/'))
        .expect("the dashboard's URL is http://ADDR/");
    status_reads_a_cooperative_member(admin);
    let status = term(&mut run.0);
    assert!(status.success(), "{status:?}");
}

fn run_demo(mut cmd: Command) {
    let child = cmd
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--duration",
            "60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut run = Running(child);
    let out = run.0.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let mut site = None;
    let mut metrics = None;
    let mut dir = None;
    let mut node_metrics = Vec::new();
    let mut dashboard = None;
    for (i, line) in lines.by_ref().enumerate() {
        let line = line.unwrap();
        if let Some(u) = line.strip_prefix("switchyard demo: live dashboard at ") {
            assert_eq!(i, 0, "the dashboard comes first");
            dashboard = Some(u.trim().to_owned());
        }
        if let Some(u) = line.trim().strip_prefix("site:") {
            site = Some(u.trim().to_owned());
        }
        if let Some(u) = line.trim().strip_prefix("metrics:") {
            metrics = Some(u.split_whitespace().next().unwrap().to_owned());
        } else if line.trim().starts_with("http://") && line.contains("(node ") {
            node_metrics.push(line.split_whitespace().next().unwrap().to_owned());
        }
        if let Some(i) = line.find(" from /") {
            dir = Some(line[i + 6..].to_owned());
        }
        if line.starts_with("Press Ctrl-C") {
            break;
        }
    }
    let dashboard = dashboard.expect("demo printed the dashboard URL");
    let site = site.expect("demo printed the site URL");
    let metrics = metrics.expect("demo printed the metrics URL");
    let dir = dir.expect("demo printed its directory");
    assert!(std::path::Path::new(&dir).is_dir());

    let (st, body) = get(&site);
    assert_eq!(st, 200);
    assert!(String::from_utf8_lossy(&body).contains("switchyard demo site"));
    let (st, body) = get(&format!("{site}pages/p1.html"));
    assert_eq!(st, 200);
    assert_eq!(body, std::fs::read(format!("{dir}/pages/p1.html")).unwrap());
    let (st, body) = get(&format!("{site}large/l0.bin"));
    assert_eq!((st, body.len()), (200, 2 * 1024 * 1024));
    // The switch counts a request once its response has reached the
    // client, so the client may see the bytes a moment before the count.
    let want = "switchyard_switch_requests_total{status=\"200\"} 3";
    let t = Instant::now();
    loop {
        let (st, text) = get(&metrics);
        assert_eq!(st, 200);
        let text = String::from_utf8(text).unwrap();
        if text.contains(want) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{want} missing in\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // One-way delivery: each of the three connections was handed to a node and nothing was
    // relayed through the switch.
    let (_, text) = get(&metrics);
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains("switchyard_handoff_fd_total 3"),
        "three handoffs expected in\n{text}"
    );
    assert!(
        text.contains("switchyard_switch_relay_seconds_count 0"),
        "{text}"
    );
    // Four node processes stand behind the switch, and between them they
    // served the three requests (plus any health checks so far).
    assert_eq!(node_metrics.len(), 4, "{node_metrics:?}");
    let mut served = 0u64;
    for url in &node_metrics {
        let (st, text) = get(url);
        assert_eq!(st, 200);
        served += String::from_utf8(text)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("switchyard_node_requests_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>();
    }
    assert!(served >= 3, "nodes served {served}");

    let (st, page) = get(&dashboard);
    assert_eq!(st, 200);
    assert!(String::from_utf8_lossy(&page).contains("<title>switchyard dashboard</title>"));
    let admin = dashboard
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    status_reads_the_running_switch(&admin, &metrics);

    let status = term(&mut run.0);
    assert!(status.success(), "{status:?}");
    assert!(
        !std::path::Path::new(&dir).exists(),
        "temporary site left behind"
    );
}

/// `switchyard status` against the demo's running switch (at `admin`; its metrics at
/// `metrics`): the table, `--json`, and `--watch` redrawing in place.
fn status_reads_the_running_switch(admin: &str, metrics: &str) {
    let out = bin().args(["status", "--admin", admin]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(&format!("switch {admin}: policy lard, handoff")),
        "{text}"
    );
    assert!(lines[0].contains("4/4 nodes up"), "{text}");
    assert!(
        lines[1].starts_with("node") && lines[1].contains("p99ms"),
        "{text}"
    );
    let nodes: Vec<&&str> = lines.iter().filter(|l| l.contains(" UP ")).collect();
    assert_eq!(nodes.len(), 4, "{text}");
    // The requests column sums what the switch counted (three so far, as /metrics says).
    let (_, m) = get(metrics);
    assert!(String::from_utf8_lossy(&m).contains("switchyard_switch_node_requests_total"));
    let total = lines
        .iter()
        .find(|l| l.starts_with("total"))
        .expect("a total line");
    let cols: Vec<&str> = lines[1].split_whitespace().collect();
    let at = cols.iter().position(|c| *c == "requests").unwrap();
    // "total" has no state, load or latency cells: count from the right.
    let from_right = cols.len() - at;
    let t: Vec<&str> = total.split_whitespace().collect();
    assert_eq!(t[t.len() - from_right], "3", "{text}");

    let out = bin()
        .args(["status", "--admin", admin, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["status"]["nodes"].as_array().unwrap().len(), 4);
    assert_eq!(
        j["dashboard"]["meta"]["nodes"].as_array().unwrap().len(),
        4,
        "{j}"
    );
    assert_eq!(j["dashboard"]["meta"]["kind"], "switch");

    let mut watch = Running(
        bin()
            .args(["status", "--admin", admin, "--watch", "--interval", "0.2"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = watch.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let clear = b"\x1b[H\x1b[2J";
    let frames = |s: &[u8]| s.windows(clear.len()).filter(|w| w == clear).count();
    while frames(&seen) < 3 {
        let chunk = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("--watch redraws");
        seen.extend(chunk);
    }
    let text = String::from_utf8_lossy(&seen);
    let last_full = text.split("\x1b[H\x1b[2J").nth(2).unwrap();
    assert!(last_full.contains("4/4 nodes up"), "{text}");
    assert!(last_full.contains("Ctrl-C to stop"), "{text}");
    drop(watch);

    // A switch that is not there: a clear error.
    let out = bin()
        .args(["status", "--admin", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the admin listener at 127.0.0.1:1"),
        "{err}"
    );
}

/// `switchyard status` against a running cooperative member (its admin listener at `admin`):
/// the whole cluster's table as that member sees it, `--json`, and `--watch`.
fn status_reads_a_cooperative_member(admin: &str) {
    let out = bin().args(["status", "--admin", admin]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(&format!("cooperative member n1 at {admin}: policy")),
        "{text}"
    );
    assert!(lines[0].contains("3/3 members up"), "{text}");
    assert!(
        lines[1].starts_with("member") && lines[1].contains("clones/s"),
        "{text}"
    );
    for (i, l) in lines[2..5].iter().enumerate() {
        let cells: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(cells[0], format!("n{}", i + 1), "{text}");
        assert!(cells.contains(&"UP"), "{text}");
    }
    assert!(lines[2].starts_with("n1 (this)"), "{text}");
    assert!(lines[5].starts_with("total"), "{text}");
    // A single reading waits for a fresh update: the rates are there.
    assert!(!text.contains("no rates yet"), "{text}");
    // The total line sums this member's counts: routed, clones, hand-backs, lost.
    let total: Vec<&str> = lines[5].split_whitespace().collect();
    for cell in &total[total.len() - 4..] {
        assert!(cell.parse::<u64>().is_ok(), "{text}");
    }

    let out = bin()
        .args(["status", "--admin", admin, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["kind"], "cooperative");
    assert_eq!(j["status"]["members"].as_array().unwrap().len(), 3, "{j}");
    assert_eq!(j["dashboard"]["meta"]["kind"], "cooperative", "{j}");
    assert_eq!(j["dashboard"]["update"]["n"].as_array().unwrap().len(), 3);

    let mut watch = Running(
        bin()
            .args(["status", "--admin", admin, "--watch", "--interval", "0.2"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = watch.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let clear = b"\x1b[H\x1b[2J";
    let frames = |s: &[u8]| s.windows(clear.len()).filter(|w| w == clear).count();
    while frames(&seen) < 3 {
        let chunk = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("--watch redraws");
        seen.extend(chunk);
    }
    let text = String::from_utf8_lossy(&seen);
    let second = text.split("\x1b[H\x1b[2J").nth(2).unwrap();
    assert!(second.contains("3/3 members up"), "{text}");
    assert!(second.contains("Ctrl-C to stop"), "{text}");
}

fn node_runs_from_a_config_file_and_flags_override_it() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("hello.txt"), b"hi there").unwrap();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("sy.toml");
    // Port 1 cannot be bound without privileges: the flag must win.
    std::fs::write(
        &cfg,
        format!(
            "[log]\nlevel = \"warn\"\n[node]\nlisten = \"127.0.0.1:1\"\nroot = \"{}\"\ncache_policy = \"gdsf\"\n",
            root.path().display()
        ),
    )
    .unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = bin()
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "node",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = Running(child);
    let t = Instant::now();
    let body = loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            s.write_all(b"GET /hello.txt HTTP/1.0\r\n\r\n").unwrap();
            let mut all = Vec::new();
            s.read_to_end(&mut all).unwrap();
            break all;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "node did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(body.ends_with(b"hi there"));
    assert!(term(&mut run.0).success());
}

/// A node outside a cluster with `[rescue.peering]`, from a config file: `switchyard status`
/// with the same file reads its `[node] admin`, tells the kind, and prints the site's rescue
/// line; `--json` has the rescue status and the dashboard's rescue part.
fn status_reads_a_node_with_a_rescue_driver() {
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("hello.txt"), b"hi there").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = switchyard_rescue_driver::testcerts::TestCa::new("peers");
    let (cert, key, ca_path) = ca.write_identity("site.test", dir.path()).unwrap();
    let (web, admin, peering, peer) = (free_port(), free_port(), free_port(), free_port());
    let cfg = dir.path().join("sy.toml");
    std::fs::write(
        &cfg,
        format!(
            "[log]\nlevel = \"warn\"\n\
             [node]\nlisten = \"127.0.0.1:{web}\"\nadmin = \"127.0.0.1:{admin}\"\nroot = {:?}\n\
             [rescue]\nserver_name = \"site.test\"\nweb_ip = \"127.0.0.1\"\nweb_port = {web}\n\
             bandwidth_kbps = 1000\n\
             [rescue.peering]\nlisten = \"127.0.0.1:{peering}\"\ncert = {:?}\nkey = {:?}\nca = {:?}\n\
             peers = [{{ name = \"rescue.test\", addr = \"127.0.0.1:{peer}\" }}]\n",
            root.path(),
            cert,
            key,
            ca_path
        ),
    )
    .unwrap();
    let mut run = Running(
        bin()
            .args(["--config", cfg.to_str().unwrap(), "node"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", admin)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the node's admin listener did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = bin()
        .args(["--config", cfg.to_str().unwrap(), "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with(&format!("node 127.0.0.1:{admin}: outside a cluster")),
        "{text}"
    );
    assert!(
        text.contains("rescue site.test: normal, d_out 0.0 of "),
        "{text}"
    );
    let out = bin()
        .args(["--config", cfg.to_str().unwrap(), "status", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["kind"], "node");
    assert_eq!(j["status"]["rescue"]["server_name"], "site.test");
    assert_eq!(j["status"]["rescue"]["peers"][0]["name"], "rescue.test");
    assert!(term(&mut run.0).success());
}

fn bad_input_gives_clear_errors() {
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("bad.toml");
    std::fs::write(&cfg, "[node]\nroot = \"/tmp\"\ncache_bytez = 1\n").unwrap();
    let out = bin()
        .args(["--config", cfg.to_str().unwrap(), "node"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cache_bytez") && err.contains("bad.toml"),
        "{err}"
    );

    let out = bin()
        .args(["node", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no document root"));

    let out = bin()
        .args(["node", "--root", "/no/such/dir", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/dir"));

    let out = bin()
        .args(["--config", "/no/such.toml", "demo"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such.toml"));

    // O_DIRECT over a root on tmpfs: refused at start, saying why (the node's own tests cover
    // hosts whose /dev/shm is no tmpfs).
    use nix::sys::statfs::{statfs, TMPFS_MAGIC};
    if statfs("/dev/shm").is_ok_and(|s| s.filesystem_type() == TMPFS_MAGIC) {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        std::fs::write(shm.path().join("a.txt"), b"a").unwrap();
        let out = bin()
            .args([
                "node",
                "--disk-o-direct",
                "--listen",
                "127.0.0.1:0",
                "--root",
            ])
            .arg(shm.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("o_direct") && err.contains("tmpfs"), "{err}");
    }
}

fn demo_nodes_do_not_outlive_a_killed_demo() {
    let child = bin()
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--nodes",
            "2",
            "--duration",
            "60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut run = Running(child);
    let out = run.0.stdout.take().unwrap();
    let mut nodes = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        if let Some(i) = line.find("(node ") {
            let addr = line[i..]
                .split(" at ")
                .nth(1)
                .unwrap()
                .trim_end_matches(')');
            nodes.push(addr.to_owned());
        }
        if line.starts_with("Press Ctrl-C") {
            break;
        }
    }
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    for n in &nodes {
        assert!(TcpStream::connect(n).is_ok(), "node {n} not serving");
    }
    // Watch the node processes before the demo goes (their pids cannot be
    // reused while we hold their pidfds).
    let procs: Vec<Exit> = children(run.0.id()).into_iter().map(Exit::watch).collect();
    assert_eq!(procs.len(), 2, "the demo's children: two nodes");
    // No chance to clean up: the nodes must still go.
    run.0.kill().unwrap();
    run.0.wait().unwrap();
    for p in &procs {
        assert!(
            p.wait(Duration::from_secs(10)),
            "a node outlived the demo: {nodes:?}"
        );
    }
    for n in &nodes {
        assert!(TcpStream::connect(n).is_err(), "node {n} still serving");
    }
}
