//! The Debian package (`scripts/package-deb`): what it holds, that its configuration is the
//! conffile, that its systemd units reload with SIGHUP, stop with SIGTERM and pass
//! `systemd-analyze verify`, and that dpkg installs it into a throwaway root whose binary runs
//! a node from the installed configuration.

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

    // Install it into a throwaway root with dpkg itself: a fresh dpkg database there, holding
    // only the host's own libc6 record (the package's one dependency, which the binary uses from
    // the host). The maintainer scripts run outside a chroot with DPKG_ROOT set, which tells them
    // to leave the running system alone.
    let root = out.path().join("root");
    let admin = root.join("var/lib/dpkg");
    std::fs::create_dir_all(admin.join("info")).unwrap();
    std::fs::create_dir_all(admin.join("updates")).unwrap();
    std::fs::write(admin.join("available"), "").unwrap();
    let libc6 = run(Command::new("dpkg-query").args(["--status", "libc6"]));
    std::fs::write(admin.join("status"), format!("{}\n", libc6.trim_end())).unwrap();
    let dpkg = |args: &[&str]| {
        let mut c = Command::new("dpkg");
        c.arg(format!("--root={}", root.display()))
            .args([
                "--log=/dev/null",
                "--force-script-chrootless",
                "--force-not-root",
            ])
            .args(args);
        c
    };
    run(dpkg(&["--install"]).arg(&deb));
    let status = run(&mut dpkg(&["--status", "switchyard"]));
    assert!(
        status.contains("Status: install ok installed"),
        "not configured:\n{status}"
    );
    assert!(
        status.contains("Conffiles:\n /etc/switchyard/switchyard.toml "),
        "the configuration is not a registered conffile:\n{status}"
    );
    let listed = run(&mut dpkg(&["--listfiles", "switchyard"]));
    for path in ["/usr/bin/switchyard", "/etc/switchyard/switchyard.toml"] {
        assert!(listed.lines().any(|l| l == path), "{path}:\n{listed}");
        assert!(root.join(&path[1..]).is_file(), "{path} not installed");
    }
    let mut units = Vec::new();
    for (unit, sub) in [
        ("switchyard-node@.service", "node"),
        ("switchyard-switch@.service", "switch"),
    ] {
        let path = root.join("lib/systemd/system").join(unit);
        units.push(path.clone());
        let keys = service_keys(&path);
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
    verify_units(&units, &root, out.path());

    // The installed binary runs, and runs a node from the installed configuration (its listen
    // and admin addresses moved to free ports, its root to the installed site).
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

    // Removing the package takes the binary and keeps the edited configuration (a conffile).
    let conf = root.join("etc/switchyard/switchyard.toml");
    let edited = format!(
        "{}\n# edited here\n",
        std::fs::read_to_string(&conf).unwrap()
    );
    std::fs::write(&conf, &edited).unwrap();
    run(&mut dpkg(&["--remove", "switchyard"]));
    assert!(!bin.exists(), "the binary outlived the package");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), edited);
}

/// `systemd-analyze verify` on each unit, as an instance (`…@switchyard.service`, a template
/// alone cannot be verified) whose `/usr/bin/switchyard` is the binary installed under `root`:
/// the host has no such file, and verification checks that the command exists. Any warning
/// fails the test (systemd-analyze exits 0 on unknown keys). Without systemd-analyze the check
/// is skipped and says so.
fn verify_units(units: &[PathBuf], root: &Path, scratch: &Path) {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("package test: systemd-analyze is missing (Debian package systemd): unit verification skipped");
        return;
    }
    let dir = scratch.join("verify");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = root.join("usr/bin/switchyard");
    for unit in units {
        let name = unit.file_name().unwrap().to_str().unwrap();
        let instance = dir.join(name.replace("@.", "@switchyard."));
        let text = std::fs::read_to_string(unit).unwrap();
        assert!(text.contains("/usr/bin/switchyard "), "{name}");
        std::fs::write(
            &instance,
            text.replace("/usr/bin/switchyard ", &format!("{} ", bin.display())),
        )
        .unwrap();
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&instance)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "systemd-analyze verify {name}: {}\n{said}",
            out.status
        );
    }
}
