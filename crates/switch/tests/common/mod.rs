//! Test support: real nodes and a real switch, each on its own runtime, raw HTTP clients.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use switchyard_node::{NodeConfig, RunningNode};
use switchyard_switch::{RunningSwitch, SwitchConfig};

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

/// Waits until `f` holds, up to `limit`. Only for states the switch shows
/// no event for (a gauge or counter in /metrics, a node's health): `f` is
/// rechecked after a short yield until the deadline.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// GET `path` on this connection and read the response.
    pub fn get(&mut self, path: &str) -> Response {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes());
        self.response(false)
    }

    /// Like `get`, but I/O problems are an `Err` instead of a panic.
    pub fn try_get(&mut self, path: &str) -> Result<Response, String> {
        self.stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
            .map_err(|e| e.to_string())?;
        self.try_response(false)
    }

    fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 65536];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Read one response; `head_only` for answers to HEAD.
    pub fn response(&mut self, head_only: bool) -> Response {
        self.try_response(head_only).unwrap()
    }

    pub fn try_response(&mut self, head_only: bool) -> Result<Response, String> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut headers);
            let parsed = r
                .parse(&self.buf)
                .map_err(|e| format!("bad response: {e}"))?;
            if let httparse::Status::Complete(n) = parsed {
                let status = r.code.unwrap();
                let headers: Vec<(String, String)> = r
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_owned(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                let len: usize = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .map(|(_, v)| v.parse().unwrap())
                    .unwrap_or(0);
                let body_len = if head_only || status == 304 || status < 200 {
                    0
                } else {
                    len
                };
                while self.buf.len() < n + body_len {
                    if self.fill().map_err(|e| e.to_string())? == 0 {
                        return Err("connection closed mid-body".into());
                    }
                }
                let body = self.buf[n..n + body_len].to_vec();
                self.buf.drain(..n + body_len);
                return Ok(Response {
                    status,
                    headers,
                    body,
                });
            }
            if self.fill().map_err(|e| e.to_string())? == 0 {
                return Err(format!(
                    "connection closed before a response; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                ));
            }
        }
    }

    /// Whether the server closed the connection (EOF with nothing pending).
    pub fn is_closed(&mut self) -> bool {
        self.buf.is_empty() && matches!(self.stream.read(&mut [0u8; 1]), Ok(0) | Err(_))
    }

    /// Send raw bytes and read one response.
    pub fn raw(&mut self, bytes: &[u8]) -> Response {
        self.send(bytes);
        self.response(false)
    }
}

/// Deterministic bytes for test files.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
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

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
