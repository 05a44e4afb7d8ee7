//! Descriptor exhaustion over real sockets: a node and a switch, each a `switchyard` process
//! whose descriptor limit is lowered to [`LIMIT`] (soft and hard, set in the child before it
//! runs), under more slow clients (slowloris: a head that never ends) than they have
//! descriptors. Legitimate clients must still be served, the switch must never take its node
//! for dead because it ran out of descriptors itself, and nobody gets a 503.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use switchyard_testkit::http::get_once;

/// The children's descriptor limit.
const LIMIT: u64 = 256;
/// Slow clients per server: well over the limit.
const SLOW: usize = 600;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `switchyard ARGS` with its descriptor limit at `LIMIT`.
fn limited(args: &[&str]) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Running(cmd.spawn().unwrap())
}

/// Wait until `addr` answers `path` with 200.
fn up(addr: SocketAddr, path: &str) {
    let t = Instant::now();
    while !matches!(get_once(addr, path), Ok((200, _))) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{addr} did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `SLOW` connections to `addr`, each with a head that is never finished.
fn slowloris(addr: SocketAddr) -> Vec<TcpStream> {
    (0..SLOW)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /a.txt HTTP/1.1\r\nHost: t\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect()
}

/// Send `sig` to process `pid`.
fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a child's pid that this test still holds (not yet reaped).
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

/// The value of metric line `name` in the Prometheus text at `admin`; 0 when absent.
fn metric(admin: SocketAddr, name: &str) -> f64 {
    let (status, body) = get_once(admin, "/metrics").unwrap();
    assert_eq!(status, 200);
    String::from_utf8(body)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[test]
fn slow_clients_beyond_the_descriptor_limit_do_not_lock_out_legitimate_ones() {
    // This process holds both ends' worth of slow connections.
    let mut own = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut own), 0);
        own.rlim_cur = own.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &own), 0);
    }
    assert!(
        own.rlim_cur > 4 * SLOW as u64,
        "descriptor limit of the test too low"
    );

    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("a.txt"), b"alpha").unwrap();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("sy.toml");
    // Health checks often, and one failure takes a node out: a node wrongly blamed for the
    // switch's own shortage would show at once.
    std::fs::write(
        &cfg,
        "[log]\nlevel = \"error\"\n[switch]\nhealth_interval_ms = 50\nhealth_fall = 1\nworkers = 1\n",
    )
    .unwrap();
    let node: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let switch: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _node = limited(&[
        "--config",
        cfg.to_str().unwrap(),
        "node",
        "--listen",
        &node.to_string(),
        "--root",
        root.path().to_str().unwrap(),
        "--workers",
        "1",
    ]);
    up(node, "/a.txt");
    let _switch = limited(&[
        "--config",
        cfg.to_str().unwrap(),
        "switch",
        "--listen",
        &switch.to_string(),
        "--node",
        &node.to_string(),
        "--admin",
        &admin.to_string(),
    ]);
    up(switch, "/a.txt");

    let up_line = format!("switchyard_switch_node_up{{node=\"{node}\"}}");
    for (target, pid) in [(node, _node.0.id()), (switch, _switch.0.id())] {
        // The slow clients all arrive while the server is stopped, so that it finds them queued
        // at once: its accept loop gets ahead of the connections it admits, and must still find
        // room (by shedding those that begin to wait) rather than refuse or stall.
        signal(pid, libc::SIGSTOP);
        let slow = slowloris(target);
        signal(pid, libc::SIGCONT);
        // Legitimate clients behind every slow one, each on a new connection.
        for i in 0..20 {
            let (status, body) = get_once(target, "/a.txt")
                .unwrap_or_else(|e| panic!("{target}: request {i} failed: {e}"));
            assert_eq!((status, body.as_slice()), (200, &b"alpha"[..]), "{target}");
        }
        drop(slow);
    }
    assert_eq!(metric(admin, &up_line), 1.0, "the node was marked down");
    assert_eq!(
        metric(admin, "switchyard_switch_requests_total{status=\"503\"}"),
        0.0
    );
    assert!(metric(admin, "switchyard_switch_connections_shed_total") >= 1.0);
}
