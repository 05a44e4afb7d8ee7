//! Rescue through the service registry and DNS round robin, between real processes: two
//! `switchyard node` sites (an origin and a rescue server, peering over mutual TLS), a real
//! etcd as the registry, a real BIND 9 named holding both sites' zones, and a crowd from
//! `switchyard load`.
//!
//! * The origin's configuration gives its peer no `d_free_kbps`: it learns the rescue server's
//!   free capacity only from the rescue server's registration in etcd, and allocates it.
//! * A client resolving through named sees the rescue server's address join the origin's
//!   name on allocation and leave it on release; the virtual host name the rescue server hands
//!   out resolves to it while it is served and goes when the name expires.
//! * Failures: the origin dies mid-rescue (the rescue server ends the relationship, offers its
//!   capacity again, lets the name go); the rescue server dies (the origin stops redirecting
//!   to it within one control interval plus the request timeout, and its address leaves the
//!   round robin); etcd is unreachable (rescue goes on with the candidates already known, the
//!   failed searches are counted, no process dies); named refuses the origin's updates (the
//!   refusal is logged, retried and counted while the rescue goes on).
//!
//! Sites sit on their own loopback addresses with one web port, as DNS round robin needs
//! (an A record carries no port). The origin's link is not shaped: only D_out is set, and the
//! crowd's rate is 1.5 × D_out. Waits are bounded polls of the processes' admin listeners and
//! of named.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use switchyard_admin::status::RescueStatus;
use switchyard_rescue_driver::testcerts::TestCa;
use switchyard_testkit::engines::{dig, free_ports, spawn, Etcd, Log, Named, Zone, KEY, KEY_NAME};
use switchyard_testkit::eventually;
use switchyard_testkit::http::get_once;

/// The origin's D_out, kB/s.
const D_OUT_KBPS: f64 = 100.0;
/// The file the crowd asks for.
const FILE_BYTES: usize = 2000;
/// The control interval of both sites, ms.
const INTERVAL_MS: u64 = 200;
/// The rescue protocol's request timeout, ms.
const REQUEST_TIMEOUT_MS: u64 = 1000;
/// How long an expired origin's virtual host name is still served (redirected back), s.
const EXPIRED_SECS: u64 = 2;
const ORIGIN_IP: &str = "127.0.0.2";
/// The rescue server's address is the one its fetches from the origin leave from (loopback
/// connections to 127.0.0.2 go out from 127.0.0.1), as the origin recognizes a rescue
/// server's fetches by its address and never redirects them.
const RESCUE_IP: &str = "127.0.0.1";
/// The crowd's address: neither site's, so it is never taken for a rescue server's fetch.
const CLIENT_IP: &str = "127.0.0.9";
const ORIGIN: &str = "www.origin.test";
const RESCUE: &str = "www.rescue.test";
/// The first virtual host name the rescue server hands out.
const VHOST: &str = "www-vh1.rescue.test";
const WAIT: Duration = Duration::from_secs(30);

/// A `switchyard` process, killed when dropped.
struct Running {
    child: Option<Child>,
    log: Log,
}

impl Running {
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One site: its addresses and configuration file.
struct Site {
    name: &'static str,
    ip: IpAddr,
    web: u16,
    admin: SocketAddr,
    peer: SocketAddr,
    config: PathBuf,
}

impl Site {
    fn web(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.web)
    }

    fn start(&self) -> Running {
        let log = Log::default();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
        cmd.arg("--config")
            .arg(&self.config)
            .arg("node")
            .env("RUST_LOG", "info");
        let child = spawn(&mut cmd, &log);
        let mut r = Running {
            child: Some(child),
            log,
        };
        assert!(
            eventually(WAIT, || r.alive() && auto(self.admin).is_some()),
            "{} answers on its admin listener:\n{}",
            self.name,
            r.log.dump()
        );
        r
    }
}

/// A web port free on both sites' addresses.
fn shared_web_port() -> u16 {
    loop {
        let a = std::net::TcpListener::bind((ORIGIN_IP, 0)).unwrap();
        let port = a.local_addr().unwrap().port();
        if std::net::TcpListener::bind((RESCUE_IP, port)).is_ok() {
            return port;
        }
    }
}

/// What a test's two sites and engines are.
struct Options {
    /// named refuses updates of the origin's zone.
    origin_zone_refuses: bool,
}

struct World {
    etcd: Etcd,
    named: Named,
    origin: Site,
    rescue: Site,
    _dir: tempfile::TempDir,
}

fn world(opts: Options) -> World {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("site");
    std::fs::create_dir(&root).unwrap();
    let body: Vec<u8> = (0..FILE_BYTES).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(root.join("f.html"), &body).unwrap();
    let etcd = Etcd::start(1);
    let mut origin_zone = Zone::updatable("origin.test", &[("www", ORIGIN_IP)]);
    origin_zone.updatable = !opts.origin_zone_refuses;
    let named = Named::start_zones(
        free_ports(1)[0],
        &[
            origin_zone,
            Zone::updatable("rescue.test", &[("www", RESCUE_IP)]),
        ],
    );
    let ca = TestCa::new("peers");
    let web = shared_web_port();
    let ports = free_ports(4);
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let mut origin = Site {
        name: ORIGIN,
        ip: ORIGIN_IP.parse().unwrap(),
        web,
        admin: at(ports[0]),
        peer: at(ports[1]),
        config: PathBuf::new(),
    };
    let mut rescue = Site {
        name: RESCUE,
        ip: RESCUE_IP.parse().unwrap(),
        web,
        admin: at(ports[2]),
        peer: at(ports[3]),
        config: PathBuf::new(),
    };
    let endpoints = etcd.endpoints();
    origin.config = config(
        dir.path(),
        &root,
        &origin,
        &rescue,
        D_OUT_KBPS,
        "origin.test",
        &endpoints,
        named.addr,
        &ca,
    );
    rescue.config = config(
        dir.path(),
        &root,
        &rescue,
        &origin,
        4000.0,
        "rescue.test",
        &endpoints,
        named.addr,
        &ca,
    );
    World {
        etcd,
        named,
        origin,
        rescue,
        _dir: dir,
    }
}

/// A site's configuration: `[rescue]` with `[rescue.peering]` (one peer, the other site,
/// without `d_free_kbps`), `[rescue.registry]` and `[rescue.dns]` for its own zone.
#[allow(clippy::too_many_arguments)]
fn config(
    dir: &Path,
    root: &Path,
    me: &Site,
    other: &Site,
    d_out: f64,
    zone: &str,
    endpoints: &[String],
    named: SocketAddr,
    ca: &TestCa,
) -> PathBuf {
    let (cert, key, ca_path) = ca.write_identity(me.name, dir).unwrap();
    let endpoints: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    let text = format!(
        r#"[node]
listen = "{ip}:{web}"
admin = "{admin}"
root = "{root}"
workers = 1
[rescue]
server_name = "{name}"
web_ip = "{ip}"
web_port = {web}
bandwidth_kbps = {b}
d_out_kbps = {d_out}
control_interval_ms = {INTERVAL_MS}
request_timeout_ms = {REQUEST_TIMEOUT_MS}
n_low = 5
expired_redirect_secs = {EXPIRED_SECS}
retry_refused_intervals = 100000
[rescue.peering]
listen = "{peer}"
cert = "{cert}"
key = "{key}"
ca = "{ca}"
peers = [ {{ name = "{other}", addr = "{other_peer}" }} ]
[rescue.registry]
endpoints = [{endpoints}]
ttl_secs = 3
search_interval_ms = {INTERVAL_MS}
request_timeout_ms = 500
[rescue.dns]
server = "{named}"
zone = "{zone}"
tsig_key_name = "{KEY_NAME}"
tsig_secret = "{KEY}"
retry_max_ms = 500
"#,
        ip = me.ip,
        web = me.web,
        admin = me.admin,
        root = root.display(),
        name = me.name,
        b = d_out / 0.8,
        peer = me.peer,
        cert = cert.display(),
        key = key.display(),
        ca = ca_path.display(),
        other = other.name,
        other_peer = other.peer,
        endpoints = endpoints.join(", "),
    );
    let path = dir.join(format!("{}.toml", me.name));
    std::fs::write(&path, text).unwrap();
    path
}

/// `/dotslash-status?auto` of the admin listener at `admin`.
fn auto(admin: SocketAddr) -> Option<String> {
    let (status, body) = get_once(admin, "/dotslash-status?auto").ok()?;
    (status == 200).then(|| String::from_utf8_lossy(&body).into_owned())
}

fn value(auto: &str, key: &str) -> f64 {
    RescueStatus::auto_value(auto, key).unwrap_or_else(|| panic!("{key} missing in {auto}"))
}

/// A counter of `/metrics` at `admin` (0 when absent).
fn metric(admin: SocketAddr, name: &str) -> f64 {
    let (status, body) = get_once(admin, "/metrics").unwrap();
    assert_eq!(status, 200);
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits until the status of the site at `admin` satisfies `f`; the status then.
fn wait_auto(admin: SocketAddr, what: &str, mut f: impl FnMut(&str) -> bool) -> String {
    let mut last = String::new();
    let ok = eventually(WAIT, || {
        last = auto(admin).unwrap_or_default();
        !last.is_empty() && f(&last)
    });
    assert!(ok, "{what}: {last}");
    last
}

/// Waits until named answers `name` with exactly `want` (sorted).
fn wait_dns(named: SocketAddr, name: &str, want: &[&str]) {
    let mut want: Vec<IpAddr> = want.iter().map(|a| a.parse().unwrap()).collect();
    want.sort();
    let mut got = Vec::new();
    let ok = eventually(WAIT, || {
        got = dig(named, name);
        got == want
    });
    assert!(ok, "{name}: named answers {got:?}, expected {want:?}");
}

/// A crowd on the origin at 1.5 × D_out for `secs`, from `switchyard load` (redirects to
/// the rescue server's virtual hosts followed), in the background.
fn crowd(w: &World, secs: u64) -> Child {
    // One response is the file and about 200 bytes of head.
    let rate = (1.5 * D_OUT_KBPS * 1000.0 / (FILE_BYTES as f64 + 200.0)).round();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    cmd.args(["load", &format!("http://{ORIGIN}:{}/f.html", w.origin.web)])
        .args(["--rate-profile", &format!("{rate}:{secs}")])
        .args(["--timeout", "7s", "--http1.0", "--max-redirects", "1"])
        .args(["--threads", "1", "--json", "-q"])
        .args(["--local-addr", CLIENT_IP])
        .args([
            "--resolve",
            &format!("{ORIGIN}:{}:{ORIGIN_IP}", w.origin.web),
        ]);
    for n in 1..=3 {
        cmd.args([
            "--resolve",
            &format!("www-vh{n}.rescue.test:{}:{RESCUE_IP}", w.rescue.web),
        ]);
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The load summary of a finished crowd.
fn summary(c: Child) -> serde_json::Value {
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "load: {:?}", out.status);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A GET of the crowd's file from `web` with `Host: host`, as a client that resolved `host`
/// to `web`'s address.
fn get_as(web: SocketAddr, host: &str) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(web).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /f.html HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let status: u16 = String::from_utf8_lossy(&buf[9..12]).parse().unwrap();
    (status, buf[head_end..].to_vec())
}

/// Both sites up, and the origin's registry search has found the rescue server.
fn started(w: &World) -> (Running, Running) {
    let rescue = w.rescue.start();
    let origin = w.origin.start();
    assert!(
        eventually(WAIT, || metric(
            w.origin.admin,
            "rescue_registry_candidates"
        ) == 1.0),
        "the origin's search finds the rescue server's registration"
    );
    (origin, rescue)
}

#[test]
fn a_rescue_server_found_through_the_registry_joins_and_leaves_the_origins_dns_round_robin() {
    let w = world(Options {
        origin_zone_refuses: false,
    });
    let (_origin, _rescue) = started(&w);
    let named = w.named.addr;
    wait_dns(named, ORIGIN, &[ORIGIN_IP]);
    assert!(dig(named, VHOST).is_empty());
    let d_resc = value(&auto(w.rescue.admin).unwrap(), "DFree");
    assert!(d_resc > 0.0);

    let crowd = crowd(&w, 8);
    // Allocation: the origin asked the one site the registry lists, and its address joined
    // the origin's name at named; the rescue server's virtual host name resolves to it.
    let s = wait_auto(
        w.origin.admin,
        "the origin allocates the rescue server",
        |a| value(a, "Rescuers") == 1.0,
    );
    assert_eq!(value(&s, "SosSent"), 1.0, "{s}");
    wait_dns(named, ORIGIN, &[ORIGIN_IP, RESCUE_IP]);
    wait_dns(named, VHOST, &[RESCUE_IP]);
    // A client sent to the rescue server by the round robin is served the origin's file.
    let (status, body) = get_as(w.rescue.web(), ORIGIN);
    assert_eq!((status, body.len()), (200, FILE_BYTES));
    // The rescue server's registration carries its d_free in rescue (D_resc minus the
    // allocation), which its status shows.
    let rs = auto(w.rescue.admin).unwrap();
    assert!(value(&rs, "DFree") < d_resc, "{rs}");

    let sum = summary(crowd);
    assert_eq!(sum["errors_total"], 0, "{sum}");
    assert_eq!(sum["timeouts"], 0, "{sum}");
    assert_eq!(sum["status"]["200"], sum["issued"], "{sum}");
    let redirected = value(&auto(w.origin.admin).unwrap(), "RequestsRedirected");
    assert!(redirected > 0.0);

    // Release after the crowd: the address leaves the round robin; the virtual host name
    // goes once the rescue server stops redirecting the expired origin's clients back.
    let s = wait_auto(
        w.origin.admin,
        "the origin releases the rescue server",
        |a| value(a, "Rescuers") == 0.0 && a.contains("State: normal\n"),
    );
    assert!(value(&s, "RelationshipsEnded") >= 1.0, "{s}");
    wait_dns(named, ORIGIN, &[ORIGIN_IP]);
    wait_dns(named, VHOST, &[]);
    // Every DNS update was accepted at once: none failed.
    assert_eq!(metric(w.origin.admin, "rescue_dns_failures_total"), 0.0);
    assert!(metric(w.origin.admin, "rescue_dns_updates_total") >= 2.0);
    assert!(metric(w.rescue.admin, "rescue_dns_updates_total") >= 2.0);
    // The rescue server offers its whole capacity again.
    wait_auto(w.rescue.admin, "the rescue server is free again", |a| {
        value(a, "DFree") == d_resc && a.contains("State: normal\n")
    });
}

#[test]
fn an_origin_that_dies_mid_rescue_is_let_go_by_its_rescue_server() {
    let w = world(Options {
        origin_zone_refuses: false,
    });
    let (mut origin, rescue) = started(&w);
    let d_resc = value(&auto(w.rescue.admin).unwrap(), "DFree");
    let crowd = crowd(&w, 30);
    wait_auto(w.rescue.admin, "the rescue server rescues", |a| {
        value(a, "Origins") == 1.0
    });
    wait_dns(w.named.addr, VHOST, &[RESCUE_IP]);
    let published = metric(w.rescue.admin, "rescue_registry_publishes_total");
    origin.kill();
    // The connection closes with the process: the relationship ends on the rescue server's
    // side, its capacity is offered again (registered at once: a change beyond the
    // threshold), and the virtual host name goes after the redirect-back time.
    let s = wait_auto(
        w.rescue.admin,
        "the rescue server ends the relationship",
        |a| value(a, "Origins") == 0.0 && value(a, "DFree") == d_resc,
    );
    assert!(value(&s, "ConnectionsLost") >= 1.0, "{s}");
    assert!(
        eventually(WAIT, || metric(
            w.rescue.admin,
            "rescue_registry_publishes_total"
        ) > published),
        "the freed capacity is registered again"
    );
    wait_dns(w.named.addr, VHOST, &[]);
    let mut rescue = rescue;
    assert!(rescue.alive(), "{}", rescue.log.dump());
    let mut crowd = crowd;
    let _ = crowd.kill();
    let _ = crowd.wait();
}

#[test]
fn an_origin_stops_redirecting_to_a_rescue_server_that_died_within_an_interval_and_a_timeout() {
    let w = world(Options {
        origin_zone_refuses: false,
    });
    let (mut origin, mut rescue) = started(&w);
    let crowd = crowd(&w, 30);
    wait_auto(w.origin.admin, "the origin redirects", |a| {
        value(a, "Rescuers") == 1.0 && value(a, "RequestsRedirected") > 0.0
    });
    wait_dns(w.named.addr, ORIGIN, &[ORIGIN_IP, RESCUE_IP]);
    rescue.kill();
    let killed = Instant::now();
    let s = wait_auto(w.origin.admin, "the origin drops the rescue server", |a| {
        value(a, "Rescuers") == 0.0
    });
    let took = killed.elapsed();
    let bound = Duration::from_millis(INTERVAL_MS + REQUEST_TIMEOUT_MS);
    assert!(took <= bound, "took {took:?}, bound {bound:?}: {s}");
    // No redirect to it after that: the crowd's next requests are all served by the origin.
    let redirected = value(&s, "RequestsRedirected");
    let later = wait_auto(w.origin.admin, "twenty more requests served", |a| {
        value(a, "RequestsServed") >= value(&s, "RequestsServed") + 20.0
    });
    assert_eq!(
        value(&later, "RequestsRedirected"),
        redirected,
        "redirected after the loss: {later}"
    );
    wait_dns(w.named.addr, ORIGIN, &[ORIGIN_IP]);
    assert!(origin.alive(), "{}", origin.log.dump());
    let mut crowd = crowd;
    let _ = crowd.kill();
    let _ = crowd.wait();
}

#[test]
fn rescue_goes_on_with_etcd_unreachable_and_named_refusing_the_origins_updates() {
    let mut w = world(Options {
        origin_zone_refuses: true,
    });
    let (mut origin, mut rescue) = started(&w);
    // The registry goes away after the origin has learned its candidates.
    w.etcd.kill(0);
    let failures = |admin| metric(admin, "rescue_registry_search_failures_total");
    assert!(
        eventually(WAIT, || failures(w.origin.admin) >= 2.0),
        "searches fail and are counted"
    );
    let crowd = crowd(&w, 8);
    // The origin allocates from the candidates it had; named refuses the round-robin update,
    // which is logged, retried and counted, and the redirects go on regardless.
    wait_auto(w.origin.admin, "the origin allocates without etcd", |a| {
        value(a, "Rescuers") == 1.0 && value(a, "RequestsRedirected") > 0.0
    });
    assert!(
        eventually(WAIT, || metric(w.origin.admin, "rescue_dns_failures_total")
            >= 2.0),
        "the refused update is retried and counted"
    );
    origin
        .log
        .wait_for(0, "dns: update failed; will retry", WAIT);
    assert_eq!(
        dig(w.named.addr, ORIGIN),
        [ORIGIN_IP.parse::<IpAddr>().unwrap()]
    );
    // The rescue server's own zone takes its update.
    wait_dns(w.named.addr, VHOST, &[RESCUE_IP]);
    let sum = summary(crowd);
    assert_eq!(sum["errors_total"], 0, "{sum}");
    assert_eq!(sum["timeouts"], 0, "{sum}");
    assert_eq!(sum["status"]["200"], sum["issued"], "{sum}");
    assert!(origin.alive(), "{}", origin.log.dump());
    assert!(rescue.alive(), "{}", rescue.log.dump());
    assert!(failures(w.rescue.admin) >= 1.0);
    assert!(metric(w.rescue.admin, "rescue_registry_renew_failures_total") >= 1.0);
}
