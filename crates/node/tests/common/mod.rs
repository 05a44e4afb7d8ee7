//! Test support: a node on its own runtime; the raw HTTP/1.1 client,
//! fixtures and waits come from `switchyard-testkit`.
// Each test target uses a part of this module (and of what it re-exports).
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use switchyard_node::{NodeConfig, RunningNode};
pub use switchyard_testkit::http::{status_of, Client, Response};
pub use switchyard_testkit::{eventually, pattern, write};

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

    /// The sum of every series of a (labelled) counter.
    pub fn total(&self, family: &str) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(family) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// Who served `/tN.txt` of a cooperative test site, whose bodies read `<node>:t<N>`.
pub fn served_by(body: &[u8], t: usize) -> String {
    let s = String::from_utf8_lossy(body);
    let (who, what) = s
        .split_once(':')
        .unwrap_or_else(|| panic!("odd body {s:?}"));
    assert_eq!(what, format!("t{t}"), "the body of the target asked for");
    who.to_owned()
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(n) = self.node.take() {
            self.rt.block_on(n.shutdown(Duration::from_secs(1)));
        }
    }
}
