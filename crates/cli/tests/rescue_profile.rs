//! A short profile of seed 001's Fig. 10 experiment (bench/rescue) between real processes: an
//! origin `switchyard node` and a rescue `switchyard node` peering over mutual TLS, and a crowd
//! from `switchyard load` whose rate steps past the origin's D_out, one `load` run per step so
//! each step's effect is read from the processes' own counters (`/dotslash-status?auto`)
//! between steps.
//!
//! Asserted: no redirect while the offered rate stays clearly below T_high × D_out; redirects
//! from the first step whose rate is clearly above it; the rescue server serves the redirected
//! requests (its own counters, and `load` sees no failures); and over the step above D_out the
//! origin's outbound bytes (responses and redirects, its own counter) stay below D_out.
//!
//! Like bench/rescue on loopback, the origin's link is not shaped: only D_out is set, and the
//! control loop acts on its measured rate. The steps sit well away from the thresholds (0.3,
//! 0.45, 1.1 and 1.5 × D_out against T_alert = 0.5 and T_high = 0.75) so a loaded machine
//! does not change the outcome; the waits are bounded by the steps' durations and status
//! polls with deadlines.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use switchyard_rescue_driver::testcerts::TestCa;
use switchyard_testkit::eventually;
use switchyard_testkit::http::get_once;

/// The origin's D_out, kB/s.
const D_OUT_KBPS: f64 = 100.0;
const T_HIGH: f64 = 0.75;
/// The file the crowd asks for.
const FILE_BYTES: usize = 2000;
/// Seconds per rate step.
const STEP_SECS: u64 = 4;
/// The crowd's address: not the rescue server's (127.0.0.1), whose fetches are never
/// redirected.
const CLIENT_IP: &str = "127.0.0.5";

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn at(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

struct Ports {
    web: u16,
    admin: u16,
    peer: u16,
}

impl Ports {
    fn new() -> Ports {
        Ports {
            web: free_port(),
            admin: free_port(),
            peer: free_port(),
        }
    }
}

/// A node's configuration file: its site, `[rescue]` and `[rescue.peering]` with one peer.
#[allow(clippy::too_many_arguments)]
fn config(
    dir: &Path,
    root: &Path,
    name: &str,
    own: &Ports,
    d_out: f64,
    peer: &str,
    peer_port: u16,
    peer_extra: &str,
    ca: &TestCa,
) -> std::path::PathBuf {
    let (cert, key, ca_path) = ca.write_identity(name, dir).unwrap();
    let text = format!(
        r#"[node]
listen = "127.0.0.1:{web}"
admin = "127.0.0.1:{admin}"
root = "{root}"
workers = 1
[rescue]
server_name = "{name}"
web_ip = "127.0.0.1"
web_port = {web}
bandwidth_kbps = {b}
d_out_kbps = {d_out}
retry_refused_intervals = 100000
[rescue.peering]
listen = "127.0.0.1:{peer_listen}"
cert = "{cert}"
key = "{key}"
ca = "{ca}"
peers = [ {{ name = "{peer}", addr = "127.0.0.1:{peer_port}"{peer_extra} }} ]
"#,
        web = own.web,
        admin = own.admin,
        root = root.display(),
        b = d_out / 0.8,
        peer_listen = own.peer,
        cert = cert.display(),
        key = key.display(),
        ca = ca_path.display(),
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn start(config: &Path) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("--config")
        .arg(config)
        .arg("node")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Running(child)
}

/// `/dotslash-status?auto` of the admin listener at `admin`.
fn auto(admin: SocketAddr) -> Option<String> {
    let (status, body) = get_once(admin, "/dotslash-status?auto").ok()?;
    (status == 200).then(|| String::from_utf8_lossy(&body).into_owned())
}

fn value(auto: &str, key: &str) -> f64 {
    auto.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(": "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} missing in {auto}"))
}

/// One step: `rate` requests/s for [`STEP_SECS`] from `switchyard load`, following redirects
/// to the rescue server's virtual hosts. Returns the load summary and the step's wall time.
fn step(origin: u16, rescue: u16, rate: f64) -> (serde_json::Value, Duration) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    cmd.args(["load", &format!("http://origin.test:{origin}/f.html")])
        .args(["--rate-profile", &format!("{rate}:{STEP_SECS}")])
        .args(["--timeout", "7s", "--http1.0", "--max-redirects", "1"])
        .args(["--threads", "1", "--json", "-q"])
        .args(["--local-addr", CLIENT_IP])
        .args(["--resolve", &format!("origin.test:{origin}:127.0.0.1")]);
    for n in 1..=3 {
        cmd.args([
            "--resolve",
            &format!("rescue-vh{n}.test:{rescue}:127.0.0.1"),
        ]);
    }
    let t0 = Instant::now();
    let out = cmd.stderr(Stdio::inherit()).output().unwrap();
    let took = t0.elapsed();
    assert!(out.status.success(), "load at {rate}/s: {:?}", out.status);
    (serde_json::from_slice(&out.stdout).unwrap(), took)
}

#[test]
fn a_stepped_crowd_is_redirected_from_the_step_past_t_high_and_the_origin_stays_below_d_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("site");
    std::fs::create_dir(&root).unwrap();
    let body: Vec<u8> = (0..FILE_BYTES).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(root.join("f.html"), &body).unwrap();
    let ca = TestCa::new("peers");
    let (o, r) = (Ports::new(), Ports::new());
    let rescue_cfg = config(
        dir.path(),
        &root,
        "rescue.test",
        &r,
        4000.0,
        "origin.test",
        o.peer,
        "",
        &ca,
    );
    let origin_cfg = config(
        dir.path(),
        &root,
        "origin.test",
        &o,
        D_OUT_KBPS,
        "rescue.test",
        r.peer,
        ", d_free_kbps = 2000",
        &ca,
    );
    let _rescue = start(&rescue_cfg);
    let _origin = start(&origin_cfg);
    let (oadmin, radmin) = (at(o.admin), at(r.admin));
    let wait = Duration::from_secs(20);
    assert!(
        eventually(wait, || auto(oadmin).is_some() && auto(radmin).is_some()),
        "both nodes answer on their admin listeners"
    );
    // The size of one response as the origin counts it (head and body).
    let before = value(&auto(oadmin).unwrap(), "TotalBytesServed");
    let (status, got) = get_once(at(o.web), "/f.html").unwrap();
    assert_eq!((status, got.as_slice()), (200, body.as_slice()));
    let response = value(&auto(oadmin).unwrap(), "TotalBytesServed") - before;
    assert!(response > FILE_BYTES as f64, "{response}");
    // Rates (requests/s) for 0.3, 0.45, 1.1 and 1.5 × D_out.
    let per_kbps = 1000.0 / response;
    let steps: Vec<(f64, f64)> = [0.3, 0.45, 1.1, 1.5]
        .iter()
        .map(|&f| (f, (f * D_OUT_KBPS * per_kbps).round()))
        .collect();

    let mut first_redirect_step = None;
    let mut last = auto(oadmin).unwrap();
    for (i, &(f, rate)) in steps.iter().enumerate() {
        let (summary, took) = step(o.web, r.web, rate);
        let now = auto(oadmin).unwrap();
        let redirected = value(&now, "RequestsRedirected") - value(&last, "RequestsRedirected");
        // Every request of the crowd got its file, from the origin or the rescue server.
        assert_eq!(summary["errors_total"], 0, "step {f}: {summary}");
        assert_eq!(summary["timeouts"], 0, "step {f}: {summary}");
        assert_eq!(
            summary["status"]["200"], summary["issued"],
            "step {f}: {summary}"
        );
        let sent = value(&now, "TotalBytesServed") - value(&last, "TotalBytesServed");
        eprintln!(
            "step {f} x D_out: {rate}/s for {took:?}, {redirected} redirected, origin {:.1} kB/s",
            sent / 1000.0 / took.as_secs_f64()
        );
        if f < T_HIGH {
            assert_eq!(redirected, 0.0, "step {f} × D_out redirected: {now}");
        } else if redirected > 0.0 && first_redirect_step.is_none() {
            first_redirect_step = Some(i);
        }
        if f > 1.0 && i == steps.len() - 1 {
            // Past D_out, with the rescue server taking the excess: the origin's outbound
            // bytes over the whole step stay below D_out.
            let kbps = sent / 1000.0 / took.as_secs_f64();
            assert!(
                kbps < D_OUT_KBPS,
                "origin sent {kbps:.1} kB/s at {f} × D_out: {now}"
            );
            assert!(redirected > 0.0, "{now}");
        }
        last = now;
    }
    assert_eq!(
        first_redirect_step,
        Some(2),
        "redirects start at the first step past T_high × D_out: {last}"
    );
    assert_eq!(value(&last, "SosSent"), 1.0, "{last}");
    assert_eq!(value(&last, "Rescuers"), 1.0, "{last}");
    // The rescue server served the redirected requests: each one it got was answered by its
    // proxy (the crowd's `load` saw only 200s), and it counted them as rescued.
    let redirected = value(&last, "RequestsRedirected");
    let ra = auto(radmin).unwrap();
    assert!(ra.contains("State: rescue\n"), "{ra}");
    let rescued = value(&ra, "RequestsRescued");
    assert_eq!(rescued, redirected, "{ra}");
    assert_eq!(value(&ra, "Origins"), 1.0, "{ra}");
}
