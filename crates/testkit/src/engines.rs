//! Real engines for the rescue suites: an etcd cluster of members on loopback ports in a
//! temporary directory, and a BIND 9 `named` with a temporary configuration, a TSIG key and
//! zones. Every instance picks its own free ports, so suites run in parallel without
//! colliding; readiness is read from the engines' logs, not waited for by sleeping. Each
//! engine is killed when its handle drops, and with the test process (PR_SET_PDEATHSIG).
//!
//! [`dig`] asks a server for a name's A records the way a client's resolver does (the
//! `dig` of bind9-dnsutils).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The path of `cmd`, or a panic that says how to install it.
pub fn require(cmd: &str, package: &str) -> PathBuf {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
    {
        let p = Path::new(dir).join(cmd);
        if p.is_file() {
            return p;
        }
    }
    panic!("`{cmd}` is not installed: these tests start a real one; install the Debian package {package} (scripts/install-deps does)");
}

/// Free loopback ports, never the same one twice in this process (the kernel may hand a
/// port it just gave to another test again once its probe socket is closed).
pub fn free_ports(n: usize) -> Vec<u16> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    let mut held = Vec::new();
    let mut out = Vec::new();
    while out.len() < n {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if !given.contains(&p) {
            given.push(p);
            out.push(p);
        }
        held.push(l);
    }
    out
}

/// A child's stderr lines, to wait on.
#[derive(Clone, Default)]
pub struct Log(Arc<(Mutex<Vec<String>>, Condvar)>);

impl Log {
    fn follow(&self, stream: impl std::io::Read + Send + 'static) {
        let me = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let (lines, cv) = &*me.0;
                let Ok(mut g) = lines.lock() else { return };
                g.push(line);
                drop(g);
                cv.notify_all();
            }
        });
    }

    /// Waits until a line after the first `from` lines contains `pat`; the number of lines
    /// seen then. Panics after `limit` with the log.
    pub fn wait_for(&self, from: usize, pat: &str, limit: Duration) -> usize {
        let (lines, cv) = &*self.0;
        let end = Instant::now() + limit;
        let mut g = lines.lock().unwrap();
        loop {
            if let Some(i) = g.iter().skip(from).position(|l| l.contains(pat)) {
                return from + i + 1;
            }
            let now = Instant::now();
            if now >= end {
                panic!(
                    "no log line with `{pat}` within {limit:?}:\n{}",
                    g.join("\n")
                );
            }
            g = cv.wait_timeout(g, end - now).unwrap().0;
        }
    }

    /// The lines so far, one string.
    pub fn dump(&self) -> String {
        self.0 .0.lock().unwrap().join("\n")
    }

    /// Lines so far.
    pub fn len(&self) -> usize {
        self.0 .0.lock().unwrap().len()
    }

    /// Whether no line came yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Spawns `cmd` with its stderr followed in `log`; it dies with the test process.
pub fn spawn(cmd: &mut Command, log: &Log) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: prctl is async-signal-safe; the engine dies with the test process, even if
    // that is killed.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("engine starts");
    log.follow(child.stderr.take().unwrap());
    child
}

/// What a member logs once it has joined the cluster and serves clients.
const READY: &str = "published local member to cluster";

/// One etcd member.
pub struct Member {
    /// `m<i>`.
    pub name: String,
    /// `http://127.0.0.1:<port>`.
    pub client_url: String,
    args: Vec<String>,
    child: Option<Child>,
    /// Its stderr.
    pub log: Log,
}

/// An etcd cluster on loopback.
pub struct Etcd {
    /// The members, in start order.
    pub members: Vec<Member>,
    bin: PathBuf,
    _dir: TempDir,
}

impl Etcd {
    /// Starts `n` members and waits until every one serves clients.
    pub fn start(n: usize) -> Etcd {
        let bin = require("etcd", "etcd-server");
        let dir = tempfile::tempdir().unwrap();
        let ports = free_ports(2 * n);
        let peer = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let cluster: Vec<String> = (0..n).map(|i| format!("m{i}={}", peer(i))).collect();
        let token = format!("t{}", ports[0]);
        let mut members = Vec::new();
        for i in 0..n {
            let client_url = format!("http://127.0.0.1:{}", ports[2 * i]);
            let args = vec![
                format!("--name=m{i}"),
                format!("--data-dir={}", dir.path().join(format!("m{i}")).display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={}", peer(i)),
                format!("--initial-advertise-peer-urls={}", peer(i)),
                format!("--initial-cluster={}", cluster.join(",")),
                "--initial-cluster-state=new".into(),
                format!("--initial-cluster-token={token}"),
                "--heartbeat-interval=100".into(),
                "--election-timeout=1000".into(),
                "--logger=zap".into(),
                "--log-outputs=stderr".into(),
            ];
            members.push(Member {
                name: format!("m{i}"),
                client_url,
                args,
                child: None,
                log: Log::default(),
            });
        }
        let mut e = Etcd {
            members,
            bin,
            _dir: dir,
        };
        for i in 0..n {
            e.spawn(i);
        }
        for m in &e.members {
            m.log.wait_for(0, READY, Duration::from_secs(30));
        }
        e
    }

    fn spawn(&mut self, i: usize) {
        let m = &mut self.members[i];
        let mut cmd = Command::new(&self.bin);
        cmd.args(&m.args);
        m.child = Some(spawn(&mut cmd, &m.log));
    }

    /// The client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// Kills member `i` (SIGKILL) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Starts the members `which` again on their data and waits until each serves clients
    /// (a member is ready only once a quorum is up, so they are started together).
    pub fn restart(&mut self, which: &[usize]) {
        let from: Vec<usize> = which.iter().map(|i| self.members[*i].log.len()).collect();
        for i in which {
            self.spawn(*i);
        }
        for (i, from) in which.iter().zip(from) {
            self.members[*i]
                .log
                .wait_for(from, READY, Duration::from_secs(30));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A TSIG key the engines' named knows (32 bytes, base64).
pub const KEY: &str = "c2VjcmV0LWtleS1vZi0zMi1ieXRlcy1sb25nLi4uLi4=";
/// The key's name.
pub const KEY_NAME: &str = "switchyard-update";

/// A zone of the test named.
#[derive(Debug, Clone)]
pub struct Zone {
    /// Its name, without the final dot.
    pub name: String,
    /// Whether updates signed with [`KEY`] are allowed (else every update is refused).
    pub updatable: bool,
    /// A records: relative name (or `@`) and address.
    pub a: Vec<(String, IpAddr)>,
}

impl Zone {
    /// An updatable zone `name` with these A records.
    pub fn updatable(name: &str, a: &[(&str, &str)]) -> Zone {
        Zone {
            name: name.into(),
            updatable: true,
            a: a.iter()
                .map(|(n, ip)| ((*n).into(), ip.parse().unwrap()))
                .collect(),
        }
    }
}

/// A running named.
pub struct Named {
    /// Where it answers (UDP and TCP).
    pub addr: SocketAddr,
    child: Child,
    /// Its stderr.
    pub log: Log,
    _dir: TempDir,
}

impl Named {
    /// Starts named on 127.0.0.1:`port` with `zones` (SOA, NS and the zone's A records, TTL
    /// 300), and waits until it takes TCP connections.
    pub fn start_zones(port: u16, zones: &[Zone]) -> Named {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let named = Self::start_at(addr, zones, &|bin: &Path| Command::new(bin));
        // named logs `running` before its TCP listener takes connections: probe it.
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            assert!(
                Instant::now() < end,
                "named takes no TCP connections:\n{}",
                named.log.dump()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        named
    }

    /// Starts named listening on `addr` with `zones`, through the command `wrap` makes of
    /// named's path (`ip netns exec <ns> named` for a lab host), and waits until it logs that
    /// it runs. Its name server record points at `addr`'s address.
    pub fn start_at(addr: SocketAddr, zones: &[Zone], wrap: &dyn Fn(&Path) -> Command) -> Named {
        let bin = require("named", "bind9");
        let (listen, port) = (addr.ip(), addr.port());
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let mut zone_conf = String::new();
        for z in zones {
            let zone = &z.name;
            let mut db = format!(
                "$TTL 300\n@ IN SOA ns.{zone}. hostmaster.{zone}. 1 3600 600 86400 60\n\
                 @ IN NS ns.{zone}.\nns IN A {listen}\n"
            );
            for (n, ip) in &z.a {
                db.push_str(&format!("{n} IN A {ip}\n"));
            }
            std::fs::write(dir.path().join(format!("{zone}.db")), db).unwrap();
            let update = if z.updatable {
                format!("key \"{KEY_NAME}\";")
            } else {
                "none;".into()
            };
            zone_conf.push_str(&format!(
                "zone \"{zone}\" {{ type primary; file \"{d}/{zone}.db\"; allow-update {{ {update} }}; }};\n"
            ));
        }
        let conf = format!(
            r#"options {{
    directory "{d}";
    pid-file "{d}/named.pid";
    session-keyfile "{d}/session.key";
    managed-keys-directory "{d}";
    listen-on port {port} {{ {listen}; }};
    listen-on-v6 {{ none; }};
    recursion no;
    dnssec-validation no;
    notify no;
}};
controls {{ }};
key "{KEY_NAME}" {{ algorithm hmac-sha256; secret "{KEY}"; }};
{zone_conf}"#
        );
        let conf_path = dir.path().join("named.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let log = Log::default();
        let mut cmd = wrap(&bin);
        cmd.arg("-g")
            .arg("-4")
            .arg("-n")
            .arg("1")
            .arg("-c")
            .arg(&conf_path);
        let child = spawn(&mut cmd, &log);
        log.wait_for(0, "running", Duration::from_secs(30));
        Named {
            addr,
            child,
            log,
            _dir: dir,
        }
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The A records of `name` as `server` answers them, sorted, from `dig` over TCP (no
/// retries over UDP to wait out).
pub fn dig(server: SocketAddr, name: &str) -> Vec<IpAddr> {
    let bin = require("dig", "bind9-dnsutils");
    let out = Command::new(bin)
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string()])
        .args(["+tcp", "+short", "+time=2", "+tries=1", name, "A"])
        .output()
        .expect("dig runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v: Vec<IpAddr> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    v.sort();
    v
}
