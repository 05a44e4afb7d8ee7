//! `switchyard node --cooperative` and SIGHUP: the process re-reads its config file and takes
//! the new `[cluster]` membership; a file that does not parse is refused and nothing changes.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use switchyard_testkit::eventually;
use switchyard_testkit::http::get_once;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A `[cluster]` table with members `n0..n{count}` whose control sockets are in `dir`.
fn table(dir: &Path, count: usize) -> String {
    let members: Vec<String> = (0..count)
        .map(|i| {
            format!(
                "{{ name = \"n{i}\", control = \"unix:{}\" }}",
                dir.join(format!("n{i}.sock")).display()
            )
        })
        .collect();
    format!(
        "[log]\nlevel = \"info\"\n[cluster]\nmembers = [{}]\n",
        members.join(", ")
    )
}

/// Node `name` of the cluster in `config`, serving `root`; its log goes to `log`.
fn node(config: &Path, name: &str, root: &Path, admin: SocketAddr, log: Stdio) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("--config")
        .arg(config)
        .args(["node", "--cooperative", "--name", name, "--workers", "1"])
        .args(["--listen", &free_addr().to_string()])
        .arg("--root")
        .arg(root)
        .args(["--admin", &admin.to_string()])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Running(child)
}

/// The members node `admin` lists, and which of them are up.
fn members(admin: SocketAddr) -> Option<Vec<(String, bool)>> {
    let (status, body) = get_once(admin, "/status.json").ok()?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    v["members"]
        .as_array()?
        .iter()
        .map(|m| Some((m["name"].as_str()?.to_owned(), m["up"].as_bool()?)))
        .collect()
}

fn all_up(names: &[&str]) -> Vec<(String, bool)> {
    names.iter().map(|n| ((*n).to_owned(), true)).collect()
}

#[test]
fn sighup_applies_a_new_membership_and_refuses_a_broken_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.txt"), b"a").unwrap();
    let two = dir.path().join("two.toml");
    let three = dir.path().join("three.toml");
    std::fs::write(&two, table(dir.path(), 2)).unwrap();
    std::fs::write(&three, table(dir.path(), 3)).unwrap();
    let admins: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
    // n0 reads `two.toml` (and later its new contents); n1 and n2 know all three.
    let mut nodes = [
        node(&two, "n0", &root, admins[0], Stdio::piped()),
        node(&three, "n1", &root, admins[1], Stdio::null()),
        node(&three, "n2", &root, admins[2], Stdio::null()),
    ];
    // n0's log, line by line.
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = nodes[0].0.stderr.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(l).is_err() {
                return;
            }
        }
    });
    let logged = |what: &str| loop {
        match lines.recv_timeout(Duration::from_secs(20)) {
            Ok(l) if l.contains(what) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    };
    let wait = Duration::from_secs(20);
    assert!(
        eventually(wait, || members(admins[0]) == Some(all_up(&["n0", "n1"]))),
        "n0 starts with two members: {:?}",
        members(admins[0])
    );

    let hup = |c: &Running| {
        // SAFETY: kill(2) on a child this test still holds.
        assert_eq!(
            unsafe { libc::kill(c.0.id() as libc::pid_t, libc::SIGHUP) },
            0
        );
    };
    std::fs::write(&two, table(dir.path(), 3)).unwrap();
    hup(&nodes[0]);
    assert!(logged("cluster membership reloaded"));
    assert!(
        eventually(wait, || members(admins[0])
            == Some(all_up(&["n0", "n1", "n2"]))),
        "after SIGHUP n0 has three members, all up: {:?}",
        members(admins[0])
    );

    // A file that does not parse: refused, the membership stays, the node serves on.
    std::fs::write(&two, "[cluster\nmembers = ").unwrap();
    hup(&nodes[0]);
    assert!(logged("reload refused"), "the broken file is refused");
    assert_eq!(members(admins[0]), Some(all_up(&["n0", "n1", "n2"])));
    // And a valid one after it is applied.
    std::fs::write(&two, table(dir.path(), 2)).unwrap();
    hup(&nodes[0]);
    assert!(logged("cluster membership reloaded"));
    assert!(
        eventually(wait, || members(admins[0]) == Some(all_up(&["n0", "n1"]))),
        "n0 back to two members: {:?}",
        members(admins[0])
    );
}

/// `[rescue]` takes a restart: a SIGHUP that finds the table unchanged says nothing of it, one
/// that finds it changed logs a warning naming the restart, and the node serves on.
#[test]
fn sighup_logs_that_a_changed_rescue_table_takes_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.txt"), b"a").unwrap();
    let web = free_addr();
    let admin = free_addr();
    let file = dir.path().join("node.toml");
    let text = |bandwidth: u32| {
        format!(
            "[log]\nlevel = \"info\"\n[rescue]\nserver_name = \"www.rescue.test\"\nweb_ip = \"127.0.0.1\"\nweb_port = {}\nbandwidth_kbps = {bandwidth}\n",
            web.port()
        )
    };
    std::fs::write(&file, text(1250)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("--config")
        .arg(&file)
        .args(["node", "--workers", "1", "--listen", &web.to_string()])
        .arg("--root")
        .arg(&root)
        .args(["--admin", &admin.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let node = Running(child);
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(l).is_err() {
                return;
            }
        }
    });
    // The lines up to the one containing `until` (None if it does not come in 20 s).
    let lines_until = |until: &str| {
        let mut seen = Vec::new();
        loop {
            match lines.recv_timeout(Duration::from_secs(20)) {
                Ok(l) => {
                    let done = l.contains(until);
                    seen.push(l);
                    if done {
                        return Some(seen);
                    }
                }
                Err(_) => return None,
            }
        }
    };
    let wait = Duration::from_secs(20);
    assert!(
        eventually(wait, || get_once(web, "/a.txt")
            .is_ok_and(|(s, _)| s == 200)),
        "the node serves"
    );
    let hup = || {
        // SAFETY: kill(2) on a child this test still holds.
        assert_eq!(
            unsafe { libc::kill(node.0.id() as libc::pid_t, libc::SIGHUP) },
            0
        );
    };
    const DONE: &str = "only a cooperative node's membership can be reloaded";
    const CHANGED: &str = "[rescue] changed in the config file: it takes a restart";
    hup();
    let seen = lines_until(DONE).expect("the reload is logged");
    assert!(!seen.iter().any(|l| l.contains(CHANGED)), "{seen:?}");
    std::fs::write(&file, text(2500)).unwrap();
    hup();
    let seen = lines_until(DONE).expect("the reload is logged");
    assert!(seen.iter().any(|l| l.contains(CHANGED)), "{seen:?}");
    assert_eq!(get_once(web, "/a.txt").unwrap().0, 200, "serving on");
}
