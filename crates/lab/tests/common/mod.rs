//! Shared pieces of the root tests: a lab that removes itself, a watchdog,
//! requests on keep-alive connections; their runner (which checks the
//! environment) and the HTTP response reader come from `switchyard-testkit`.
// Each test target uses a part of this module (and of what it re-exports).
#![allow(dead_code, unused_imports)]

pub mod cluster;

pub use switchyard_testkit::http::{find, read_response, Response};
pub use switchyard_testkit::{exit, root};

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use switchyard_handoff::netns::NetNs;
use switchyard_lab::{LabSpec, Topology};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A lab whose namespaces are removed when it drops (also on panic).
pub struct LabGuard {
    pub topo: Topology,
}

impl LabGuard {
    /// Builds a lab with a prefix unique to this process and test.
    pub fn new(nodes: usize, clients: usize, link_mbit: Option<u32>) -> LabGuard {
        sweep_stale_labs();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let prefix = format!(
            "syt{}{}",
            std::process::id() % 100_000,
            (b'a' + (n % 26) as u8) as char
        );
        let spec = LabSpec {
            prefix,
            clients,
            nodes,
            link_mbit,
        };
        let topo = Topology::build(&spec).unwrap_or_else(|e| panic!("building the lab: {e}"));
        LabGuard { topo }
    }

    pub fn ns(&self, host: &str) -> NetNs {
        self.topo.netns(host).expect("host namespace")
    }
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        Topology::teardown(&self.topo.prefix);
        let _ = std::fs::remove_dir_all(format!("/run/switchyard/bpf/{}", self.topo.prefix));
    }
}

/// Removes labs of earlier test processes that died before cleaning up
/// (their prefix carries their pid).
fn sweep_stale_labs() {
    for name in NetNs::list_prefixed("syt") {
        let digits: String = name[3..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        let Ok(pid) = digits.parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() % 100_000 {
            continue;
        }
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            switchyard_lab::kill_namespace_processes(&name);
            let _ = NetNs::delete(&name);
        }
    }
}

/// Aborts the whole test process (after removing its labs) if a test runs
/// past `limit`: a hung handoff must fail, not hang.
pub fn watchdog(name: &'static str, limit: Duration) -> Watchdog {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if rx.recv_timeout(limit) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            eprintln!("{name}: timed out after {limit:?}; removing labs and aborting");
            let prefix = format!("syt{}", std::process::id() % 100_000);
            Topology::teardown(&prefix);
            for n in NetNs::list_prefixed(&prefix) {
                let _ = NetNs::delete(&n);
            }
            std::process::exit(101);
        }
    });
    Watchdog { _tx: tx }
}

/// Dropping it disarms the watchdog.
pub struct Watchdog {
    _tx: std::sync::mpsc::Sender<()>,
}

/// Runs `f` on a thread inside `ns` and returns its result.
pub fn in_ns<T: Send + 'static>(ns: NetNs, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let _g = ns.enter().expect("enter namespace");
        f()
    })
    .join()
    .expect("thread in namespace panicked")
}

/// Connects with timeouts set.
pub fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Sends the requests for `paths` on one keep-alive connection, one after
/// the other (or all at once when `pipelined`), and reads the responses.
pub fn get_many(
    addr: SocketAddr,
    paths: &[&str],
    pipelined: bool,
) -> std::io::Result<Vec<Response>> {
    let mut s = connect(addr)?;
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let req = |p: &str| format!("GET {p} HTTP/1.1\r\nHost: lab\r\n\r\n");
    if pipelined {
        let all: String = paths.iter().map(|p| req(p)).collect();
        s.write_all(all.as_bytes())?;
        for _ in paths {
            out.push(read_response(&mut s, &mut buf)?);
        }
    } else {
        for p in paths {
            s.write_all(req(p).as_bytes())?;
            out.push(read_response(&mut s, &mut buf)?);
        }
    }
    Ok(out)
}

/// The 5 MB body's deterministic content.
pub fn big_body() -> Vec<u8> {
    (0..5 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}
