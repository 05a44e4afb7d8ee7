//! Test support: a node on its own runtime, and a raw HTTP/1.1 client.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use switchyard_node::{NodeConfig, RunningNode};

pub struct TestNode {
    pub node: Option<RunningNode>,
    pub rt: tokio::runtime::Runtime,
    pub addr: SocketAddr,
    pub root: tempfile::TempDir,
}

impl TestNode {
    /// A node on 127.0.0.1:0 over a fresh root filled by `fill`.
    pub fn start(fill: impl FnOnce(&Path), tweak: impl FnOnce(&mut NodeConfig)) -> TestNode {
        let root = tempfile::tempdir().unwrap();
        fill(root.path());
        let mut cfg = NodeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin: Some("127.0.0.1:0".parse().unwrap()),
            root: root.path().to_path_buf(),
            ..NodeConfig::default()
        };
        tweak(&mut cfg);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let node = rt.block_on(switchyard_node::start(cfg)).unwrap();
        let addr = node.addr();
        TestNode {
            node: Some(node),
            rt,
            addr,
            root,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    pub fn admin(&self) -> SocketAddr {
        self.node.as_ref().unwrap().admin_addr().unwrap()
    }

    /// The Prometheus text of the admin listener.
    pub fn metrics(&self) -> String {
        let mut c = Client::connect(self.admin());
        c.send(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
        String::from_utf8(c.response(false).body).unwrap()
    }

    /// The value of one metric line, e.g. `switchyard_node_cache_hits_total`.
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.metrics();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(n) = self.node.take() {
            self.rt.block_on(n.shutdown(Duration::from_secs(1)));
        }
    }
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

    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 65536];
        let n = self.stream.read(&mut chunk).expect("read from node");
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// Read one response; `head_only` for answers to HEAD.
    pub fn response(&mut self, head_only: bool) -> Response {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(n) = r.parse(&self.buf).expect("valid response") {
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
                let body_len = if head_only || status == 304 || status == 100 {
                    0
                } else {
                    len
                };
                while self.buf.len() < n + body_len {
                    assert!(self.fill() > 0, "connection closed mid-body");
                }
                let body = self.buf[n..n + body_len].to_vec();
                self.buf.drain(..n + body_len);
                return Response {
                    status,
                    headers,
                    body,
                };
            }
            assert!(
                self.fill() > 0,
                "connection closed before a response; got {:?}",
                String::from_utf8_lossy(&self.buf)
            );
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

/// Send `request` on a fresh connection; return the status.
pub fn status_of(addr: SocketAddr, request: &[u8]) -> u16 {
    let mut c = Client::connect(addr);
    c.send(request);
    c.response(false).status
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

/// Waits until `f` holds, up to `limit`. Only for states the node shows no
/// event for (a gauge or counter in /metrics): `f` is rechecked after a
/// short yield until the deadline.
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
