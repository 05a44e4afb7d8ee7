//! Root test of `switchyard lab`: up (hosts and processes), status --json,
//! exec on a client, down — and teardown after a failed build. Reported as
//! ignored without root (see `switchyard_testkit::root`).

mod common;

use std::io::Write;
use std::time::Duration;

use common::exit::Exit;
use switchyard_handoff::netns::NetNs;
use switchyard_lab::cli::{run, LabCommand, LabTarget, Mechanism};
use switchyard_lab::Topology;

fn main() {
    common::root::main(common::root::tests![
        lab_up_status_exec_down,
        failed_build_leaves_nothing_behind,
    ]);
}

fn lab_up_status_exec_down() {
    let _w = common::watchdog("lab_up_status_exec_down", Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("SWITCHYARD_LAB_DIR", dir.path());
    // A stand-in for the switchyard binary that just stays up.
    let fake = dir.path().join("fake-switchyard");
    let mut f = std::fs::File::create(&fake).unwrap();
    writeln!(f, "#!/bin/sh\nexec sleep 60").unwrap();
    drop(f);
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&fake)
        .status()
        .unwrap();
    let prefix = format!("syt{}l", std::process::id() % 100_000);
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            switchyard_lab::cli::down(&self.0);
        }
    }
    let _down = Down(prefix.clone());
    let target = LabTarget {
        prefix: prefix.clone(),
    };
    let mut out = Vec::new();
    run(
        &LabCommand::Up {
            nodes: 2,
            clients: 1,
            mechanism: Mechanism::Handoff,
            cooperative: false,
            alone: false,
            link_mbit: Some(100),
            root: None,
            port: 80,
            no_start: false,
            binary: Some(fake.clone()),
            switch_args: vec![],
            node_args: vec![],
            target: target.clone(),
        },
        &mut out,
    )
    .expect("lab up");
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("VIP 10.213.0.100"), "{text}");

    out.clear();
    run(
        &LabCommand::Status {
            json: true,
            target: target.clone(),
        },
        &mut out,
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["up"], true);
    assert_eq!(v["vip"], "10.213.0.100");
    assert_eq!(v["hosts"].as_array().unwrap().len(), 4);
    let procs = v["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 3, "two nodes and the switch: {v}");
    assert!(procs.iter().all(|p| p["alive"] == true), "{v}");
    let sw = procs.iter().find(|p| p["host"] == "switch").unwrap();
    let cmd: Vec<&str> = sw["cmd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(
        cmd.windows(2).any(|w| w == ["--mechanism", "handoff"]),
        "{cmd:?}"
    );
    assert!(
        cmd.windows(2)
            .any(|w| w == ["--node", "10.213.0.12:80,control=10.213.0.12:7000"]),
        "{cmd:?}"
    );
    let node = procs.iter().find(|p| p["host"] == "node1").unwrap();
    let node_cmd: Vec<&str> = node["cmd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(
        node_cmd
            .windows(2)
            .any(|w| w == ["--handoff-listen", "10.213.0.12:7000"]),
        "{node_cmd:?}"
    );

    // exec on the client: the VIP answers ARP from the switch; the link is shaped.
    run(
        &LabCommand::Exec {
            host: "client".into(),
            cmd: vec!["ip".into(), "neigh".into(), "flush".into(), "all".into()],
            target: target.clone(),
        },
        &mut out,
    )
    .expect("exec on the client");
    let c = NetNs::open(&format!("{prefix}-c0")).unwrap();
    let q = c.run(&["tc", "qdisc", "show", "dev", "eth0"]).unwrap();
    assert!(q.contains("tbf") && q.contains("100Mbit"), "{q}");
    let n0 = NetNs::open(&format!("{prefix}-n0")).unwrap();
    let lo = n0.run(&["ip", "-4", "addr", "show", "dev", "lo"]).unwrap();
    assert!(lo.contains("10.213.0.100/32"), "{lo}");
    assert!(run(
        &LabCommand::Exec {
            host: "client".into(),
            cmd: vec!["false".into()],
            target: target.clone()
        },
        &mut out
    )
    .is_err());

    out.clear();
    let pids: Vec<u64> = procs.iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    let exits: Vec<Exit> = pids.iter().map(|&p| Exit::watch(p as u32)).collect();
    run(
        &LabCommand::Down {
            target: target.clone(),
        },
        &mut out,
    )
    .unwrap();
    assert!(Topology::existing(&prefix).is_empty());
    for (p, e) in pids.iter().zip(&exits) {
        assert!(
            e.wait(Duration::from_secs(10)),
            "process {p} survived lab down"
        );
    }
    for p in pids {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z"),
            "process {p} survived lab down"
        );
    }
    out.clear();
    run(
        &LabCommand::Status {
            json: true,
            target: target.clone(),
        },
        &mut out,
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["up"], false);
    // down again is harmless
    run(&LabCommand::Down { target }, &mut out).unwrap();
}

fn failed_build_leaves_nothing_behind() {
    let prefix = format!("syt{}f", std::process::id() % 100_000);
    // Occupy the name of the third host's namespace, so the build fails half-way.
    let blocker = format!("{prefix}-n1");
    let _ = NetNs::create(&blocker).unwrap();
    let spec = switchyard_lab::LabSpec {
        prefix: prefix.clone(),
        clients: 1,
        nodes: 2,
        link_mbit: None,
    };
    // The existing namespace is refused up front…
    assert!(Topology::build(&spec).is_err());
    assert!(NetNs::exists(&blocker));
    NetNs::delete(&blocker).unwrap();
    // …and a failure in the middle (an impossible rate) removes everything.
    let spec = switchyard_lab::LabSpec {
        link_mbit: Some(0),
        ..spec
    };
    let e = Topology::build(&spec).unwrap_err();
    assert!(
        Topology::existing(&prefix).is_empty(),
        "left behind after: {e}"
    );
}
