//! The Debian package (`scripts/package-deb`): what it holds, that its configuration is the
//! conffile, that its systemd units reload with SIGHUP and stop with SIGTERM, and that the
//! binary it installs runs a node from the packaged configuration.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The keys of a systemd unit's `[Service]` section.
fn service_keys(unit: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(unit).unwrap();
    let mut in_service = false;
    let mut keys = Vec::new();
    for l in text.lines() {
        let l = l.trim();
        if l.starts_with('[') {
            in_service = l == "[Service]";
        } else if in_service && !l.starts_with('#') {
            if let Some((k, v)) = l.split_once('=') {
                keys.push((k.to_owned(), v.to_owned()));
            }
        }
    }
    keys
}

#[test]
fn the_package_holds_binary_units_and_conffile_and_its_binary_runs() {
    assert!(
        Command::new("dpkg-deb").arg("--version").output().is_ok(),
        "dpkg-deb is missing: install the Debian package dpkg"
    );
    let out = tempfile::tempdir().unwrap();
    let deb = run(Command::new(repo().join("scripts/package-deb"))
        .arg(out.path())
        .env("SWITCHYARD_BIN", env!("CARGO_BIN_EXE_switchyard"))
        .env("DEB_COMPRESSION", "none"));
    let deb = PathBuf::from(deb.trim());
    assert!(deb.is_file(), "{}", deb.display());

    let info = run(Command::new("dpkg-deb").arg("--field").arg(&deb));
    assert!(info.contains("Package: switchyard\n"), "{info}");
    assert!(
        info.contains(&format!("Version: {}\n", env!("CARGO_PKG_VERSION"))),
        "{info}"
    );
    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    for path in [
        "./usr/bin/switchyard",
        "./lib/systemd/system/switchyard-node@.service",
        "./lib/systemd/system/switchyard-switch@.service",
        "./etc/switchyard/switchyard.toml",
        "./usr/share/doc/switchyard/README.md",
        "./var/lib/switchyard/www/index.html",
    ] {
        assert!(
            contents.lines().any(|l| l.ends_with(path)),
            "{path} missing:\n{contents}"
        );
    }
    let control = out.path().join("control");
    run(Command::new("dpkg-deb")
        .arg("--control")
        .arg(&deb)
        .arg(&control));
    assert_eq!(
        std::fs::read_to_string(control.join("conffiles")).unwrap(),
        "/etc/switchyard/switchyard.toml\n"
    );

    let root = out.path().join("root");
    run(Command::new("dpkg-deb")
        .arg("--extract")
        .arg(&deb)
        .arg(&root));
    for (unit, sub) in [
        ("switchyard-node@.service", "node"),
        ("switchyard-switch@.service", "switch"),
    ] {
        let keys = service_keys(&root.join("lib/systemd/system").join(unit));
        let get = |k: &str| {
            keys.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
                .unwrap_or_else(|| panic!("{unit}: no {k}"))
        };
        assert_eq!(
            get("ExecStart"),
            format!("/usr/bin/switchyard --config /etc/switchyard/%i.toml {sub}")
        );
        assert_eq!(get("ExecReload"), "/bin/kill -HUP $MAINPID");
        assert_eq!(get("KillSignal"), "SIGTERM");
    }

    // The installed binary runs, and runs a node from the packaged configuration (its listen
    // and admin addresses moved to free ports, its root to the packaged site).
    let bin = root.join("usr/bin/switchyard");
    let version = run(Command::new(&bin).arg("--version"));
    assert_eq!(
        version.trim(),
        format!("switchyard {}", env!("CARGO_PKG_VERSION"))
    );
    let mut node = Command::new(&bin)
        .arg("--config")
        .arg(root.join("etc/switchyard/switchyard.toml"))
        .args(["node", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .arg("--root")
        .arg(root.join("var/lib/switchyard/www"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = node.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = l.strip_prefix("switchyard node: serving ") {
                let _ = tx.send(url.to_owned());
            }
        }
    });
    let url = rx.recv_timeout(Duration::from_secs(20));
    let answer = url.as_ref().ok().map(|url| {
        let addr: std::net::SocketAddr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .unwrap();
        switchyard_testkit::http::get_once(addr, "/")
    });
    let _ = node.kill();
    let _ = node.wait();
    url.expect("the packaged node starts");
    let (status, body) = answer.unwrap().expect("the packaged node answers");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("switchyard is serving this host"));
}
