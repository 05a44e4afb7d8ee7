//! Real engines for the tests: an etcd cluster of members on loopback ports in a temporary
//! directory, and a BIND 9 `named` with a temporary configuration, a TSIG key and zones.
//! Every instance picks its own free ports, so tests run in parallel without colliding.
//! Readiness is read from the engines' logs, not waited for by sleeping.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hickory_client::client::{AsyncClient, ClientHandle};
use hickory_proto::iocompat::AsyncIoTokioAsStd;
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use hickory_proto::tcp::TcpClientStream;
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
}

/// Spawns `cmd` with its stderr followed in `log`; it dies with the test process.
pub fn spawn(cmd: &mut Command, log: &Log) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // The engine dies with the test process, even if it is killed.
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
    pub name: String,
    pub client_url: String,
    args: Vec<String>,
    child: Option<Child>,
    pub log: Log,
}

/// An etcd cluster on loopback.
pub struct Etcd {
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

    /// The index of the leader, as member `asked` sees it.
    pub async fn leader(&self, asked: usize) -> Option<usize> {
        let mut c = etcd_client::Client::connect([&self.members[asked].client_url], None)
            .await
            .ok()?;
        let st = tokio::time::timeout(Duration::from_secs(2), c.status())
            .await
            .ok()?
            .ok()?;
        let leader = st.leader();
        for (i, m) in self.members.iter().enumerate() {
            let Ok(mut c) = etcd_client::Client::connect([&m.client_url], None).await else {
                continue;
            };
            if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), c.status()).await {
                if s.header().map(|h| h.member_id()) == Some(leader) {
                    return Some(i);
                }
            }
        }
        None
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A TSIG key the tests' named knows (32 bytes, base64).
pub const KEY: &str = "c2VjcmV0LWtleS1vZi0zMi1ieXRlcy1sb25nLi4uLi4=";
/// The key's name.
pub const KEY_NAME: &str = "switchyard-update";

/// A running named.
pub struct Named {
    pub addr: SocketAddr,
    child: Child,
    pub log: Log,
    _dir: TempDir,
}

impl Named {
    /// Starts named on a free port.
    pub fn start() -> Named {
        Self::start_on(free_ports(1)[0])
    }

    /// Starts named on `port` with zone `origin.test` (updates allowed with the key; `www`
    /// at 10.0.0.1) and zone `refuse.test` (no updates allowed), and waits until it runs.
    pub fn start_on(port: u16) -> Named {
        let bin = require("named", "bind9");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        for zone in ["origin.test", "refuse.test"] {
            std::fs::write(
                dir.path().join(format!("{zone}.db")),
                format!(
                    "$TTL 300\n@ IN SOA ns.{zone}. hostmaster.{zone}. 1 3600 600 86400 60\n\
                     @ IN NS ns.{zone}.\nns IN A 127.0.0.1\nwww IN A 10.0.0.1\n"
                ),
            )
            .unwrap();
        }
        let conf = format!(
            r#"options {{
    directory "{d}";
    pid-file "{d}/named.pid";
    session-keyfile "{d}/session.key";
    managed-keys-directory "{d}";
    listen-on port {port} {{ 127.0.0.1; }};
    listen-on-v6 {{ none; }};
    recursion no;
    dnssec-validation no;
    notify no;
}};
controls {{ }};
key "{KEY_NAME}" {{ algorithm hmac-sha256; secret "{KEY}"; }};
zone "origin.test" {{ type primary; file "{d}/origin.test.db"; allow-update {{ key "{KEY_NAME}"; }}; }};
zone "refuse.test" {{ type primary; file "{d}/refuse.test.db"; allow-update {{ none; }}; }};
"#
        );
        let conf_path = dir.path().join("named.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let log = Log::default();
        let mut cmd = Command::new(bin);
        cmd.arg("-g")
            .arg("-4")
            .arg("-n")
            .arg("1")
            .arg("-c")
            .arg(&conf_path);
        let child = spawn(&mut cmd, &log);
        log.wait_for(0, "running", Duration::from_secs(30));
        // named logs `running` before its TCP listener takes connections: probe it.
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            assert!(
                Instant::now() < end,
                "named takes no TCP connections:\n{}",
                log.dump()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Named {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
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

/// The A records of `name` at `server` (an unsigned query), with their TTLs, sorted.
pub async fn a_records(server: SocketAddr, name: &str) -> Vec<(IpAddr, u32)> {
    let (stream, handle) = TcpClientStream::<AsyncIoTokioAsStd<tokio::net::TcpStream>>::new(server);
    let (mut c, bg) = AsyncClient::new(stream, handle, None).await.unwrap();
    tokio::spawn(bg);
    let resp = c
        .query(Name::from_ascii(name).unwrap(), DNSClass::IN, RecordType::A)
        .await
        .unwrap();
    let mut v: Vec<(IpAddr, u32)> = resp
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            Some(RData::A(a)) => Some((IpAddr::V4(a.0), r.ttl())),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

/// Waits until `f` holds for the value in `rx`, at most `limit`; panics with `what` otherwise.
pub async fn wait_until<T: Clone>(
    rx: &mut tokio::sync::watch::Receiver<T>,
    limit: Duration,
    what: &str,
    mut f: impl FnMut(&T) -> bool,
) -> T {
    match tokio::time::timeout(limit, rx.wait_for(|v| f(v))).await {
        Ok(Ok(v)) => v.clone(),
        Ok(Err(_)) => panic!("{what}: the sender went away"),
        Err(_) => panic!("{what}: not within {limit:?}"),
    }
}
