//! Test support: real nodes and a real switch, each on its own runtime, and a scripted back
//! end; the raw HTTP/1.1 client, fixtures and waits come from `switchyard-testkit`.
// Each test target uses a part of this module (and of what it re-exports).
#![allow(dead_code, unused_imports)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use switchyard_node::{NodeConfig, RunningNode};
use switchyard_switch::{RunningSwitch, SwitchConfig};
pub use switchyard_testkit::http::find;
pub use switchyard_testkit::http::{Client, Response};
pub use switchyard_testkit::{eventually, pattern, write};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A node on 127.0.0.1 over a fresh root.
pub struct TestNode {
    pub node: Option<RunningNode>,
    pub rt: Option<tokio::runtime::Runtime>,
    pub addr: SocketAddr,
    pub root: tempfile::TempDir,
}

impl TestNode {
    /// A node on `listen` (port 0 for any) over a root filled by `fill`.
    pub fn start_on(
        listen: SocketAddr,
        fill: impl FnOnce(&Path),
        tweak: impl FnOnce(&mut NodeConfig),
    ) -> TestNode {
        let root = tempfile::tempdir().unwrap();
        fill(root.path());
        let mut cfg = NodeConfig {
            listen,
            root: root.path().to_path_buf(),
            workers: 1,
            ..NodeConfig::default()
        };
        tweak(&mut cfg);
        let rt = runtime();
        let node = rt.block_on(switchyard_node::start(cfg)).unwrap();
        let addr = node.addr();
        TestNode {
            node: Some(node),
            rt: Some(rt),
            addr,
            root,
        }
    }

    pub fn start(fill: impl FnOnce(&Path), tweak: impl FnOnce(&mut NodeConfig)) -> TestNode {
        Self::start_on("127.0.0.1:0".parse().unwrap(), fill, tweak)
    }

    /// Kill the node as a crash would: every task and socket is dropped at once.
    pub fn kill(&mut self) {
        drop(self.node.take());
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    pub fn requests(&self) -> u64 {
        let m = self.node.as_ref().unwrap().metrics();
        (100..600).map(|c| m.status_count(c)).sum()
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let (Some(n), Some(rt)) = (self.node.take(), self.rt.as_ref()) {
            rt.block_on(n.shutdown(Duration::from_millis(200)));
        }
    }
}

/// Every node gets the same files, plus `/who` naming the node.
pub fn cluster(n: usize, files: &[(&str, Vec<u8>)]) -> Vec<TestNode> {
    (0..n)
        .map(|i| {
            TestNode::start(
                |r| {
                    write(r, "who", format!("node{i}").as_bytes());
                    for (p, d) in files {
                        write(r, p, d);
                    }
                },
                |_| {},
            )
        })
        .collect()
}

/// A switch on 127.0.0.1:0 with an admin listener.
pub struct TestSwitch {
    pub sw: Option<RunningSwitch>,
    pub rt: tokio::runtime::Runtime,
    pub addr: SocketAddr,
}

impl TestSwitch {
    pub fn start(nodes: &[SocketAddr], tweak: impl FnOnce(&mut SwitchConfig)) -> TestSwitch {
        let mut cfg = SwitchConfig::with_nodes(nodes);
        cfg.listen = "127.0.0.1:0".parse().unwrap();
        cfg.admin = Some("127.0.0.1:0".parse().unwrap());
        cfg.workers = 2;
        cfg.health_interval_ms = 100;
        cfg.health_timeout_ms = 500;
        tweak(&mut cfg);
        let rt = runtime();
        let sw = rt.block_on(switchyard_switch::start(cfg)).unwrap();
        let addr = sw.addr();
        TestSwitch {
            sw: Some(sw),
            rt,
            addr,
        }
    }

    pub fn sw(&self) -> &RunningSwitch {
        self.sw.as_ref().unwrap()
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    pub fn reload(&self, cfg: SwitchConfig) -> Result<(), switchyard_switch::SwitchError> {
        self.rt.block_on(self.sw().reload(cfg))
    }

    /// The Prometheus text of the admin listener.
    pub fn metrics(&self) -> String {
        let mut c = Client::connect(self.sw().admin_addr().unwrap());
        c.send(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
        String::from_utf8(c.response(false).body).unwrap()
    }

    /// The value of one metric line, e.g. `switchyard_switch_retries_total` or
    /// `switchyard_switch_node_up{node="127.0.0.1:1"}`; 0 when absent.
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.metrics();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    pub fn node_up(&self, node: SocketAddr) -> bool {
        self.metric(&format!("switchyard_switch_node_up{{node=\"{node}\"}}")) == 1.0
    }
}

impl Drop for TestSwitch {
    fn drop(&mut self) {
        if let Some(s) = self.sw.take() {
            self.rt.block_on(s.shutdown(Duration::from_millis(200)));
        }
    }
}

/// A scripted back end: for each connection, reads one request head (and a Content-Length or
/// chunked body, kept raw) and answers with what `answer` returns for the raw request bytes.
/// `None` closes the connection without answering.
pub fn fake_node(
    answer: impl Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync + 'static,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let answer = Arc::new(answer);
    let c = count.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let answer = answer.clone();
            let c = c.clone();
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = Vec::new();
                loop {
                    // Read a whole request: head, then its body by Content-Length or chunked end.
                    let req = loop {
                        if let Some(end) = find(&buf, b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                            let total = if let Some(i) = head.find("content-length:") {
                                let v: usize = head[i + 15..]
                                    .lines()
                                    .next()
                                    .unwrap()
                                    .trim()
                                    .parse()
                                    .unwrap();
                                Some(end + 4 + v)
                            } else if head.contains("transfer-encoding: chunked") {
                                find(&buf[end + 4..], b"0\r\n\r\n").map(|i| end + 4 + i + 5)
                            } else {
                                Some(end + 4)
                            };
                            if let Some(t) = total {
                                if buf.len() >= t {
                                    break buf.drain(..t).collect::<Vec<u8>>();
                                }
                            }
                        }
                        let mut chunk = [0u8; 65536];
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    c.fetch_add(1, Ordering::Relaxed);
                    match answer(&req) {
                        Some(a) => {
                            if s.write_all(&a).is_err() {
                                return;
                            }
                        }
                        None => return,
                    }
                }
            });
        }
    });
    (addr, count)
}

/// A Unix control listener bound at `path` on a one-thread runtime of its own, which runs by
/// itself while the test thread blocks (a scripted node's end of the handoff control protocol).
pub fn control_listener(path: &Path) -> (tokio::runtime::Runtime, tokio::net::UnixListener) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = {
        let _g = rt.enter();
        tokio::net::UnixListener::bind(path).unwrap()
    };
    (rt, listener)
}
