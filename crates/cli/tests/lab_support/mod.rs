//! The lab as the root suites drive it (`lab_handoff`, `lab_cooperative`): `switchyard lab up`
//! with a state directory of its own, the status it reports (hosts, addresses, processes),
//! closures run inside a host's namespace, the processes' logs for failure messages, and
//! `switchyard lab down` when the test ends, however it ends. Each suite adds what it reads
//! of its own processes (a switch's or the nodes' metrics) in an `impl Lab` of its own.

#![allow(dead_code)] // each suite uses part of it

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

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
