//! `switchyard lab up|down|status|exec`.
//!
//! ```text
//! switchyard lab up --nodes 3 --mechanism handoff --link-mbit 100 --root ./site
//! switchyard lab exec client -- curl -s http://10.213.0.100/
//! switchyard lab status --json
//! switchyard lab down
//! ```
//!
//! `up` builds the namespaces, then starts this very binary inside them
//! (`ip netns exec NS switchyard node …` per node and `switchyard switch …`
//! on the switch host; with `--mechanism handoff` the nodes take connections
//! on a TCP control listener at port 7000, drop unmatched VIP packets, and
//! the switch steers handed-off flows with tc/eBPF on its `eth0`) and writes
//! a state file (`/run/switchyard/lab/<prefix>.json`, or under
//! `$SWITCHYARD_LAB_DIR`). `down` stops the processes and removes every
//! namespace of the prefix, with or without a state file.
//!
//! `up --cooperative` starts no switch: the N nodes run in cooperative mode (`switchyard node
//! --cooperative`, each a member with its TCP control listener at port 7000, the VIP held on
//! `lo`), and the switch's host becomes the layer-4 director in front of them
//! ([`crate::director`]: LVS direct routing built from an nftables `fwd` per flow hash, as this
//! kernel has no IPVS).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use switchyard_handoff::{HandoffError, Result};

use crate::{LabProcess, LabSpec, LabState, Role, Topology};

/// Port of the nodes' handoff control listeners in the lab.
pub const CONTROL_PORT: u16 = 7000;

/// Delivery mechanism asked of the switch.
pub use switchyard_policy::Mechanism;

/// Which lab.
#[derive(Debug, Clone, clap::Args)]
pub struct LabTarget {
    /// Namespace prefix of the lab (several labs can coexist).
    #[arg(long, default_value = "sylab", value_name = "NAME")]
    pub prefix: String,
}

/// `switchyard lab …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum LabCommand {
    /// Build the hosts (network namespaces) and start the switch and nodes.
    Up {
        /// Back-end nodes.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// Client hosts.
        #[arg(long, default_value_t = 1)]
        clients: usize,
        /// Delivery mechanism for the switch.
        #[arg(long, value_enum, default_value_t = Mechanism::Handoff)]
        mechanism: Mechanism,
        /// No switch: cooperative nodes behind a layer-4 director on the switch's host
        /// (direct routing: nftables `fwd` per flow hash; `--mechanism` does not apply).
        #[arg(long)]
        cooperative: bool,
        /// With `--cooperative`: the nodes do not cooperate and serve every request themselves
        /// (the director's spreading alone, with no content awareness).
        #[arg(long, requires = "cooperative")]
        alone: bool,
        /// Shape every link to this many Mbit/s in both directions.
        #[arg(long, value_name = "M")]
        link_mbit: Option<u32>,
        /// Document root the nodes serve (default: a generated sample site). A `{node}` in it
        /// is replaced by each node's host name (`node0`, `node1`, …): a root per node.
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
        /// HTTP port of the VIP and the nodes.
        #[arg(long, default_value_t = 80)]
        port: u16,
        /// Build the hosts only; start nothing.
        #[arg(long)]
        no_start: bool,
        /// The switchyard binary to run in the hosts (default: this one).
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
        /// An extra argument for `switchyard switch` (repeatable), e.g.
        /// `--switch-arg=--persistent=multiple-handoff`.
        #[arg(long = "switch-arg", value_name = "ARG", allow_hyphen_values = true)]
        switch_args: Vec<String>,
        /// An extra argument for every `switchyard node` (repeatable).
        #[arg(long = "node-arg", value_name = "ARG", allow_hyphen_values = true)]
        node_args: Vec<String>,
        /// Which lab.
        #[command(flatten)]
        target: LabTarget,
    },
    /// Stop the processes and remove every namespace of the lab.
    Down {
        /// Which lab.
        #[command(flatten)]
        target: LabTarget,
    },
    /// Report the VIP, the hosts and the processes.
    Status {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Which lab.
        #[command(flatten)]
        target: LabTarget,
    },
    /// Run a command on a host (`client` = client0, `switch`, `node1`, …).
    Exec {
        /// The host.
        host: String,
        /// The command and its arguments (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<String>,
        /// Which lab.
        #[command(flatten)]
        target: LabTarget,
    },
}

/// Directory of state files.
pub fn state_dir() -> PathBuf {
    std::env::var_os("SWITCHYARD_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/switchyard/lab"))
}

/// State file of a lab.
pub fn state_path(prefix: &str) -> PathBuf {
    state_dir().join(format!("{prefix}.json"))
}

/// Runs a lab command; human output goes to `out`.
pub fn run(cmd: &LabCommand, out: &mut dyn Write) -> Result<()> {
    let w = |e: std::io::Error| HandoffError::io("write output", e);
    match cmd {
        LabCommand::Up {
            nodes,
            clients,
            mechanism,
            cooperative,
            alone,
            link_mbit,
            root,
            port,
            no_start,
            binary,
            switch_args,
            node_args,
            target,
        } => {
            let spec = LabSpec {
                prefix: target.prefix.clone(),
                clients: *clients,
                nodes: *nodes,
                link_mbit: *link_mbit,
            };
            let topo = Topology::build(&spec)?;
            let mut state = LabState {
                topology: topo,
                mechanism: if *alone {
                    DIRECTOR_ONLY.into()
                } else if *cooperative {
                    COOPERATIVE.into()
                } else {
                    mechanism.as_str().into()
                },
                root: root.clone(),
                processes: vec![],
                notes: vec![],
            };
            let path = state_path(&target.prefix);
            let r = (|| -> Result<()> {
                state.save(&path)?;
                if !*no_start {
                    let extra = Extra {
                        switch: switch_args,
                        node: node_args,
                    };
                    if *cooperative {
                        let coop = Coop {
                            port: *port,
                            alone: *alone,
                        };
                        start_cooperative(&mut state, coop, binary.as_deref(), &extra)?;
                    } else {
                        start_processes(&mut state, *mechanism, *port, binary.as_deref(), &extra)?;
                    }
                    state.save(&path)?;
                }
                Ok(())
            })();
            if let Err(e) = r {
                down(&target.prefix);
                return Err(e);
            }
            print_human(&state, out).map_err(w)?;
            Ok(())
        }
        LabCommand::Down { target } => {
            let existed = down(&target.prefix);
            if existed {
                writeln!(out, "lab {} removed", target.prefix).map_err(w)?;
            } else {
                writeln!(out, "no lab {} (nothing to remove)", target.prefix).map_err(w)?;
            }
            Ok(())
        }
        LabCommand::Status { json, target } => {
            let path = state_path(&target.prefix);
            let state = LabState::load(&path).ok();
            let existing = Topology::existing(&target.prefix);
            if *json {
                let v = match &state {
                    None => json!({
                        "up": false,
                        "prefix": target.prefix,
                        "namespaces": existing,
                    }),
                    Some(s) => status_json(s, &existing),
                };
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&v).unwrap_or_default()
                )
                .map_err(w)?;
            } else {
                match &state {
                    None if existing.is_empty() => writeln!(out, "no lab {}", target.prefix).map_err(w)?,
                    None => writeln!(
                        out,
                        "lab {}: namespaces without a state file: {} (`switchyard lab down` removes them)",
                        target.prefix,
                        existing.join(" ")
                    )
                    .map_err(w)?,
                    Some(s) => print_human(s, out).map_err(w)?,
                }
            }
            Ok(())
        }
        LabCommand::Exec { host, cmd, target } => {
            let state = LabState::load(&state_path(&target.prefix))?;
            let ns = resolve_host(&state.topology, host)?;
            let status = Command::new("ip")
                .args(["netns", "exec", &ns])
                .args(cmd)
                .status()
                .map_err(|e| HandoffError::io("ip netns exec", e))?;
            if !status.success() {
                return Err(HandoffError::Command {
                    cmd: format!("{} (on {host})", cmd.join(" ")),
                    status: status.to_string(),
                    stderr: String::new(),
                });
            }
            Ok(())
        }
    }
}

fn resolve_host(t: &Topology, host: &str) -> Result<String> {
    let name = match host {
        "client" => "client0",
        "node" => "node0",
        h => h,
    };
    t.hosts
        .iter()
        .find(|h| h.name == name || h.netns == name)
        .map(|h| h.netns.clone())
        .ok_or_else(|| {
            HandoffError::Other(format!(
                "no host {host}; hosts: {}",
                t.hosts
                    .iter()
                    .map(|h| h.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// Stops the processes and removes the namespaces and the state file; true
/// when anything existed.
pub fn down(prefix: &str) -> bool {
    let path = state_path(prefix);
    let mut existed = false;
    if let Ok(state) = LabState::load(&path) {
        existed = true;
        for p in &state.processes {
            stop_pid(p.pid);
            // A cooperative node killed before it could tear its eBPF steering down leaves its
            // pins behind (`coop-<member>-<pid>` made file-name safe, see the node's
            // `cross_host_steering`); its tc attachment goes with the namespace.
            if let Some(i) = p.host.strip_prefix("node") {
                let pins = std::path::Path::new(switchyard_handoff::steer::ebpf::DEFAULT_PIN_ROOT)
                    .join(format!("coop_n{i}_{}", p.pid));
                let _ = std::fs::remove_dir_all(pins);
            }
        }
    }
    let ns = Topology::existing(prefix);
    existed |= !ns.is_empty();
    Topology::teardown(prefix);
    let _ = std::fs::remove_file(&path);
    existed
}

fn alive(pid: u32) -> bool {
    // A zombie child of ours still has /proc/<pid>; look at its state.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

fn stop_pid(pid: u32) {
    // SAFETY: kill(2) on a pid this lab recorded.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    for _ in 0..60 {
        if !alive(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

fn sample_site(dir: &Path) -> Result<()> {
    let io = |e| HandoffError::io(format!("write sample site in {}", dir.display()), e);
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(
        dir.join("index.html"),
        "<!doctype html><title>switchyard lab</title><p>switchyard lab\n",
    )
    .map_err(io)?;
    for (name, size) in [
        ("1k.bin", 1024usize),
        ("100k.bin", 100 * 1024),
        ("5m.bin", 5 * 1024 * 1024),
    ] {
        let data: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(dir.join(name), data).map_err(io)?;
    }
    Ok(())
}

/// The `mechanism` a cooperative lab records in its state file.
pub const COOPERATIVE: &str = "cooperative";
/// The `mechanism` of a lab with the director in front of nodes that do not cooperate.
pub const DIRECTOR_ONLY: &str = "director";

/// How `up --cooperative` runs.
#[derive(Debug, Clone, Copy)]
struct Coop {
    /// The VIP's and the nodes' HTTP port.
    port: u16,
    /// The nodes serve every request themselves.
    alone: bool,
}

/// The binary to run in the hosts and the directory of logs (with the sample site unless a
/// root was given).
fn prepare(state: &mut LabState, binary: Option<&Path>) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let bin = match binary {
        Some(b) => b.to_path_buf(),
        None => std::env::current_exe().map_err(|e| HandoffError::io("current_exe", e))?,
    };
    let logs = state_dir().join(&state.topology.prefix);
    std::fs::create_dir_all(&logs).map_err(|e| HandoffError::io("mkdir lab logs", e))?;
    // The switch and the nodes run under `ip netns exec`, each in a mount namespace of its own:
    // the BPF file system for their steering pins is mounted here first so that they all share
    // it (a switch started after a SIGKILL finds and replaces what the old one pinned).
    let pins = Path::new(switchyard_handoff::steer::ebpf::DEFAULT_PIN_ROOT);
    if let Err(e) = switchyard_handoff::steer::ebpf::ensure_bpffs(pins) {
        state.notes.push(format!(
            "no BPF file system at {} ({e}): each process's eBPF steering pins stay its own",
            pins.display()
        ));
    }
    let root = match &state.root {
        Some(r) => r.clone(),
        None => {
            let r = logs.join("site");
            sample_site(&r)?;
            state.root = Some(r.clone());
            r
        }
    };
    Ok((bin, logs, root))
}

/// The document root of node host `host`: `root` with `{node}` replaced by its name.
fn root_for(root: &Path, host: &str) -> String {
    root.to_string_lossy().replace("{node}", host)
}

/// The director of a cooperative lab: the VIP's `port` spread over every node.
pub fn director(topo: &Topology, port: u16) -> crate::director::Director {
    crate::director::Director {
        iface: "eth0".into(),
        vip: topo.vip,
        port,
        nodes: topo.hosts_of(Role::Node).map(|h| h.ip).collect(),
    }
}

/// `up --cooperative`: the director on the switch's host, a cooperative node on each node
/// host (members `n0`, `n1`, … with TCP control listeners at [`CONTROL_PORT`], admin
/// listeners at port 9080, HTTP listeners named with `--member-http` for the `fetch`
/// mechanism, the VIP's unmatched packets dropped); with `alone`, plain nodes.
fn start_cooperative(
    state: &mut LabState,
    Coop { port, alone }: Coop,
    binary: Option<&Path>,
    extra: &Extra<'_>,
) -> Result<()> {
    let (bin, logs, root) = prepare(state, binary)?;
    let topo = state.topology.clone();
    let sw = topo
        .host("switch")
        .ok_or_else(|| HandoffError::Other("lab without switch".into()))?;
    director(&topo, port).install(&crate::netns::NetNs::open(&sw.netns)?)?;
    state.notes.push(format!(
        "director on {}: nftables netdev ingress on eth0, `fwd ip to` a node chosen by a hash of \
         the client's address and port (LVS direct routing; this kernel has no IPVS)",
        sw.name
    ));
    let nodes: Vec<_> = topo.hosts_of(Role::Node).cloned().collect();
    let mut members = Vec::new();
    for (i, h) in nodes.iter().enumerate() {
        members.push("--member".to_string());
        members.push(format!("n{i}={}:{CONTROL_PORT}", h.ip));
        members.push("--member-admin".to_string());
        members.push(format!("n{i}={}:9080", h.ip));
        // Where `--cluster-mechanism fetch` (a `--node-arg`) fetches the member's responses.
        members.push("--member-http".to_string());
        members.push(format!("n{i}={}:{port}", h.ip));
    }
    for (i, h) in nodes.iter().enumerate() {
        let mut args = vec![
            "node".to_string(),
            "--root".into(),
            root_for(&root, &h.name),
            "--listen".into(),
            format!("0.0.0.0:{port}"),
            "--admin".into(),
            format!("{}:9080", h.ip),
        ];
        if !alone {
            args.extend([
                "--handoff-vip".into(),
                format!("{}:{port}", topo.vip),
                "--cooperative".into(),
                "--name".into(),
                format!("n{i}"),
            ]);
            args.extend(members.iter().cloned());
        }
        args.extend(extra.node.iter().cloned());
        let p = spawn_in(&h.netns, &h.name, &bin, &args, &logs)?;
        state.processes.push(p);
    }
    check_started(state)
}

/// Extra arguments for the processes the lab starts.
struct Extra<'a> {
    switch: &'a [String],
    node: &'a [String],
}

fn start_processes(
    state: &mut LabState,
    mechanism: Mechanism,
    port: u16,
    binary: Option<&Path>,
    extra: &Extra<'_>,
) -> Result<()> {
    let (bin, logs, root) = prepare(state, binary)?;
    let topo = state.topology.clone();
    let handoff = mechanism == Mechanism::Handoff;
    let mut nodes = Vec::new();
    for h in topo.hosts_of(Role::Node) {
        let mut args = vec![
            "node".to_string(),
            "--root".into(),
            root_for(&root, &h.name),
            "--listen".into(),
            format!("0.0.0.0:{port}"),
            "--admin".into(),
            format!("{}:9080", h.ip),
        ];
        let mut entry = format!("{}:{port}", h.ip);
        if handoff {
            // The node takes connections over TCP (TCP_REPAIR state) and drops, not resets,
            // packets for the VIP that arrive before a restore completes.
            args.push("--handoff-listen".into());
            args.push(format!("{}:{CONTROL_PORT}", h.ip));
            args.push("--handoff-vip".into());
            args.push(format!("{}:{port}", topo.vip));
            entry.push_str(&format!(",control={}:{CONTROL_PORT}", h.ip));
        }
        args.extend(extra.node.iter().cloned());
        let p = spawn_in(&h.netns, &h.name, &bin, &args, &logs)?;
        state.processes.push(p);
        nodes.push(entry);
    }
    let sw = topo
        .host("switch")
        .ok_or_else(|| HandoffError::Other("lab without switch".into()))?;
    let mut args = vec![
        "switch".to_string(),
        "--listen".into(),
        format!("{}:{port}", topo.vip),
        "--admin".into(),
        format!("{}:9080", sw.ip),
        "--mechanism".into(),
        mechanism.as_str().into(),
    ];
    for n in &nodes {
        args.push("--node".into());
        args.push(n.clone());
    }
    if handoff {
        args.push("--steering-iface".into());
        args.push("eth0".into());
    }
    args.extend(extra.switch.iter().cloned());
    let p = spawn_in(&sw.netns, "switch", &bin, &args, &logs)?;
    state.processes.push(p);
    check_started(state)
}

/// Gives the processes a moment, then makes sure none died at start.
fn check_started(state: &LabState) -> Result<()> {
    std::thread::sleep(Duration::from_millis(400));
    for p in &state.processes {
        if !alive(p.pid) {
            let tail = std::fs::read_to_string(&p.log).unwrap_or_default();
            let tail: String = tail
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            return Err(HandoffError::Other(format!(
                "{} exited at start ({}):\n{tail}",
                p.host,
                p.cmd.join(" ")
            )));
        }
    }
    Ok(())
}

fn spawn_in(
    netns: &str,
    host: &str,
    bin: &Path,
    args: &[String],
    logs: &Path,
) -> Result<LabProcess> {
    use std::os::unix::process::CommandExt;
    let log = logs.join(format!("{host}.log"));
    let f = std::fs::File::create(&log)
        .map_err(|e| HandoffError::io(format!("create {}", log.display()), e))?;
    let f2 = f.try_clone().map_err(|e| HandoffError::io("dup log", e))?;
    let child = Command::new("ip")
        .args(["netns", "exec", netns])
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(f)
        .stderr(f2)
        .process_group(0)
        .spawn()
        .map_err(|e| HandoffError::io("spawn ip netns exec", e))?;
    let mut cmd = vec![bin.to_string_lossy().into_owned()];
    cmd.extend(args.iter().cloned());
    Ok(LabProcess {
        host: host.to_string(),
        pid: child.id(),
        cmd,
        log,
    })
}

fn status_json(s: &LabState, existing: &[String]) -> serde_json::Value {
    let t = &s.topology;
    json!({
        "up": true,
        "prefix": t.prefix,
        "vip": t.vip.to_string(),
        "mechanism": s.mechanism,
        "link_mbit": t.link_mbit,
        "root": s.root,
        "bridge_netns": t.bridge_netns,
        "hosts": t.hosts.iter().map(|h| json!({
            "name": h.name,
            "role": h.role,
            "netns": h.netns,
            "ip": h.ip.to_string(),
            "mac": h.mac,
            "present": existing.contains(&h.netns),
        })).collect::<Vec<_>>(),
        "processes": s.processes.iter().map(|p| json!({
            "host": p.host,
            "pid": p.pid,
            "alive": alive(p.pid),
            "cmd": p.cmd,
            "log": p.log,
        })).collect::<Vec<_>>(),
        "notes": s.notes,
    })
}

fn print_human(s: &LabState, out: &mut dyn Write) -> std::io::Result<()> {
    let t = &s.topology;
    writeln!(
        out,
        "lab {}: VIP {}, mechanism {}",
        t.prefix, t.vip, s.mechanism
    )?;
    if let Some(m) = t.link_mbit {
        writeln!(out, "links shaped to {m} Mbit/s")?;
    }
    for h in &t.hosts {
        writeln!(out, "  {:<9} {:<15} netns {}", h.name, h.ip, h.netns)?;
    }
    for p in &s.processes {
        let st = if alive(p.pid) { "running" } else { "exited" };
        writeln!(
            out,
            "  pid {:<7} {:<8} on {:<8} log {}",
            p.pid,
            st,
            p.host,
            p.log.display()
        )?;
    }
    for n in &s.notes {
        writeln!(out, "note: {n}")?;
    }
    writeln!(
        out,
        "run a client command: switchyard lab exec client -- curl -s http://{}/",
        t.vip
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(subcommand)]
        cmd: LabCommand,
    }

    #[test]
    fn parses_the_documented_forms() {
        let t = T::try_parse_from([
            "x",
            "up",
            "--nodes",
            "3",
            "--mechanism",
            "relay",
            "--link-mbit",
            "100",
            "--root",
            "/tmp",
        ])
        .unwrap();
        match t.cmd {
            LabCommand::Up {
                nodes,
                mechanism,
                link_mbit,
                ..
            } => {
                assert_eq!(nodes, 3);
                assert_eq!(mechanism, Mechanism::Relay);
                assert_eq!(link_mbit, Some(100));
            }
            other => panic!("{other:?}"),
        }
        let t =
            T::try_parse_from(["x", "exec", "client", "--", "curl", "-s", "http://x/"]).unwrap();
        match t.cmd {
            LabCommand::Exec { host, cmd, .. } => {
                assert_eq!(host, "client");
                assert_eq!(cmd, ["curl", "-s", "http://x/"]);
            }
            other => panic!("{other:?}"),
        }
        match T::try_parse_from(["x", "up", "--cooperative", "--alone", "--nodes", "3"])
            .unwrap()
            .cmd
        {
            LabCommand::Up {
                cooperative, alone, ..
            } => assert!(cooperative && alone),
            other => panic!("{other:?}"),
        }
        assert!(
            T::try_parse_from(["x", "up", "--alone"]).is_err(),
            "--alone needs --cooperative"
        );
        assert!(T::try_parse_from(["x", "status", "--json"]).is_ok());
        assert!(T::try_parse_from(["x", "down"]).is_ok());
    }

    #[test]
    fn status_without_a_lab_says_so() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var("SWITCHYARD_LAB_DIR", dir.path());
        let mut out = Vec::new();
        run(
            &LabCommand::Status {
                json: true,
                target: LabTarget {
                    prefix: "synolab".into(),
                },
            },
            &mut out,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["up"], false);
    }
}
