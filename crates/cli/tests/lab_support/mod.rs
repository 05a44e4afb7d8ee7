//! The lab as the root suites drive it (`lab_handoff`, `lab_cooperative`): `switchyard lab up`
//! with a state directory of its own, the status it reports (hosts, addresses, processes),
//! closures run inside a host's namespace, the processes' logs for failure messages, and
//! `switchyard lab down` when the test ends, however it ends, and a client that reads slowly
//! ([`SlowReader`]). Each suite adds what it reads of its own processes (a switch's or the
//! nodes' metrics) in an `impl Lab` of its own.

#![allow(dead_code)] // each suite uses part of it

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use switchyard_handoff::netns::NetNs;

/// The binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// A lab that is taken down when the test ends, however it ends.
pub struct Lab {
    pub prefix: String,
    pub state_dir: tempfile::TempDir,
    /// `switchyard lab status --json` as it was once the lab was up.
    pub status: serde_json::Value,
}

impl Lab {
    /// `switchyard lab up` with `args` and the arguments `prepare` returns after filling the
    /// lab's own temporary directory (document roots, say), under the prefix
    /// `syt<pid><tag>`. Panics with `lab up`'s output when it fails.
    pub fn start(tag: char, args: &[&str], prepare: impl FnOnce(&Path) -> Vec<String>) -> Lab {
        let prefix = format!("syt{}{tag}", std::process::id() % 100_000);
        let state_dir = tempfile::tempdir().unwrap();
        let extra = prepare(state_dir.path());
        let mut me = Lab {
            prefix,
            state_dir,
            status: serde_json::Value::Null,
        };
        let mut up = vec!["up"];
        up.extend_from_slice(args);
        up.extend(extra.iter().map(String::as_str));
        let out = me.lab(&up);
        assert!(
            out.status.success(),
            "lab up failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let out = me.lab(&["status", "--json"]);
        assert!(out.status.success());
        me.status = serde_json::from_slice(&out.stdout).unwrap();
        me
    }

    /// `switchyard lab ARGS` on this lab.
    pub fn lab(&self, args: &[&str]) -> std::process::Output {
        bin()
            .arg("lab")
            .args(args)
            .args(["--prefix", &self.prefix])
            .env("SWITCHYARD_LAB_DIR", self.state_dir.path())
            .output()
            .unwrap()
    }

    /// The service address clients use.
    pub fn vip(&self) -> SocketAddr {
        format!("{}:80", self.status["vip"].as_str().unwrap())
            .parse()
            .unwrap()
    }

    /// Host `name`'s namespace and address.
    pub fn host(&self, name: &str) -> (String, String) {
        let h = self.status["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == name)
            .unwrap_or_else(|| panic!("no host {name}: {}", self.status));
        (
            h["netns"].as_str().unwrap().to_owned(),
            h["ip"].as_str().unwrap().to_owned(),
        )
    }

    /// `ss -Htn ARGS` on `host`: its TCP sockets that match, one line each, no header.
    pub fn sockets(&self, host: &str, args: &[&str]) -> String {
        let (ns, _) = self.host(host);
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "ss", "-Htn"])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether `host` holds a TCP socket matching the `ss` filter `filter` in FIN-WAIT-1 with
    /// bytes in its send queue: it queued an answer and shut its side down, and the client has
    /// not acknowledged all of it.
    pub fn queued_close(&self, host: &str, filter: &[&str]) -> bool {
        let mut args = vec!["state", "fin-wait-1"];
        args.extend_from_slice(filter);
        self.sockets(host, &args)
            .lines()
            .any(|l| l.split_whitespace().nth(1).is_some_and(|q| q != "0"))
    }

    /// The pid of the process on `host`.
    pub fn pid(&self, host: &str) -> u32 {
        self.status["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["host"] == host)
            .and_then(|p| p["pid"].as_u64())
            .unwrap_or_else(|| panic!("no process on {host}")) as u32
    }

    /// Run `f` on a thread inside host `host`'s namespace.
    pub fn on<T: Send + 'static>(&self, host: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (ns, _) = self.host(host);
        std::thread::spawn(move || {
            let ns = NetNs::open(&ns).unwrap();
            let _g = ns.enter().unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    /// Run `f` on a thread inside the client namespace.
    pub fn on_client<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.on("client0", f)
    }

    /// The processes' logs: warnings and errors from each whole log, then its last lines.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for p in self.status["processes"].as_array().unwrap() {
            let log = p["log"].as_str().unwrap();
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let cut = lines.len().saturating_sub(20);
            let tail = lines[..cut]
                .iter()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .chain(&lines[cut..]);
            s.push_str(&format!("--- {log}\n"));
            for l in tail {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.lab(&["down"]);
    }
}

/// Reads `s` to its end: the bytes, and how the reading ended.
pub fn read_all(s: &mut TcpStream) -> (Result<usize, String>, Vec<u8>) {
    use std::io::Read;
    let mut all = Vec::new();
    let read = s.read_to_end(&mut all).map_err(|e| e.to_string());
    (read, all)
}

/// A client on client0 whose receive window is small (2 KiB asked before it connects, so the
/// handshake offers a small window): it connects to the VIP, sends what it is asked to, and
/// reads nothing until told to go.
pub struct SlowReader<T> {
    /// Its local port (the connection's 4-tuple, for `ss` filters on the nodes).
    pub port: u16,
    ask: mpsc::Sender<Vec<u8>>,
    go: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<T>,
}

impl<T: Send + 'static> SlowReader<T> {
    /// Connects; once told to go, `read` runs on the connection and its result is
    /// [`SlowReader::read`]'s.
    pub fn connect(lab: &Lab, read: impl FnOnce(&mut TcpStream) -> T + Send + 'static) -> Self {
        let vip = lab.vip();
        let (ns, _) = lab.host("client0");
        let (ask, asked) = mpsc::channel::<Vec<u8>>();
        let (go, read_now) = mpsc::channel::<()>();
        let (port_tx, port) = mpsc::channel::<u16>();
        let thread = std::thread::spawn(move || {
            let _g = NetNs::open(&ns).unwrap().enter().unwrap();
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.set_recv_buffer_size(2048).unwrap();
            sock.connect(&vip.into()).unwrap();
            let mut s: TcpStream = sock.into();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            port_tx.send(s.local_addr().unwrap().port()).unwrap();
            s.write_all(&asked.recv().unwrap()).unwrap();
            read_now.recv().unwrap();
            read(&mut s)
        });
        let port = port.recv().unwrap();
        SlowReader {
            port,
            ask,
            go,
            thread,
        }
    }

    /// Sends `request` on the connection.
    pub fn ask(&self, request: &[u8]) {
        self.ask.send(request.to_vec()).unwrap();
    }

    /// Lets it read, and waits for what it read.
    pub fn read(self) -> T {
        self.go.send(()).unwrap();
        self.thread.join().unwrap()
    }
}
