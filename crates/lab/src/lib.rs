//! The lab: a multi-host cluster built from network namespaces on this
//! machine, as in the papers' testbeds (client hosts, the switch, N nodes on
//! one LAN, optionally shaped to e.g. 100 Mbit/s per link).
//!
//! ```text
//!              ┌──────────── <prefix>-br (namespace) ────────────┐
//!              │                   bridge br0                     │
//!              └─ v-c0 ── v-sw ── v-n0 ── v-n1 … (veth ends) ─────┘
//!                  │        │        │        │
//!   <prefix>-c0  eth0  <prefix>-sw eth0  <prefix>-n0 eth0 …
//!   10.213.0.51        10.213.0.2        10.213.0.11
//!                      + VIP 10.213.0.100  + VIP on lo (arp_ignore=1, arp_announce=2)
//! ```
//!
//! Everything lives in namespaces whose names start with the lab's prefix;
//! the bridge has a namespace of its own, so nothing is added to the host's
//! own network. [`Topology::teardown`] deletes every namespace with the
//! prefix (processes inside are killed first), so it also cleans up after a
//! build that failed half-way; [`Topology::build`] calls it on failure.
//!
//! [`cli`] is `switchyard lab up|down|status|exec`, which starts the real
//! switch and nodes on those hosts. The crate's root tests (handoff between
//! its hosts, the lab's own life cycle) and the handoff micro-benchmark run
//! on it; they need root and report themselves as ignored without it.
//! [`sites`] builds the other kind of lab, independent web sites with links of their own
//! rates, a DNS host and registry hosts, for flash-crowd rescue (bench/rescue).
//! Errors are the handoff crate's [`HandoffError`]: everything here is
//! namespaces and commands run in them, as in [`switchyard_handoff::netns`].

pub mod cli;
pub mod director;
pub mod sites;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

pub use switchyard_handoff::netns;
use switchyard_handoff::netns::NetNs;
use switchyard_handoff::{HandoffError, Result};

/// The lab's subnet (a /24 inside its own namespaces only).
pub const SUBNET: [u8; 3] = [10, 213, 0];
/// The switch's address.
pub const SWITCH_HOST: u8 = 2;
/// The VIP's host part.
pub const VIP_HOST: u8 = 100;
/// First node's host part.
pub const NODE_BASE: u8 = 11;
/// First client's host part.
pub const CLIENT_BASE: u8 = 51;
/// Most nodes a lab can have.
pub const MAX_NODES: usize = 39;
/// Most clients a lab can have.
pub const MAX_CLIENTS: usize = 40;

fn addr(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], host)
}

/// What to build.
#[derive(Debug, Clone)]
pub struct LabSpec {
    /// Prefix of every namespace (unique per lab; at most 10 characters).
    pub prefix: String,
    /// Client hosts.
    pub clients: usize,
    /// Nodes.
    pub nodes: usize,
    /// Per-link rate limit in Mbit/s, both directions (tc tbf), if any.
    pub link_mbit: Option<u32>,
}

/// A host's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A client host.
    Client,
    /// The switch (owns the VIP).
    Switch,
    /// A back-end node (VIP on lo).
    Node,
}

/// One host of the lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// Short name: `switch`, `node0`, `client0` …
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Its network namespace.
    pub netns: String,
    /// Its address on the lab network (on `eth0`).
    pub ip: Ipv4Addr,
    /// MAC address of its `eth0`.
    pub mac: String,
}

/// A built lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Namespace prefix.
    pub prefix: String,
    /// The virtual IP clients connect to.
    pub vip: Ipv4Addr,
    /// The namespace holding the bridge.
    pub bridge_netns: String,
    /// Per-link rate limit.
    pub link_mbit: Option<u32>,
    /// All hosts: the switch, then nodes, then clients.
    pub hosts: Vec<Host>,
}

/// Writes a sysctl of the namespace `ns` (through a thread that enters it:
/// `/proc/sys/net` shows the opener's namespace).
pub fn sysctl(ns: &NetNs, key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    std::thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            let _g = ns.enter()?;
            std::fs::write(&path, value).map_err(|e| HandoffError::io(format!("write {path}"), e))
        })
        .join()
        .map_err(|_| HandoffError::Other("sysctl thread panicked".into()))?
    })
}

fn ip(ns: &NetNs, args: &[&str]) -> Result<String> {
    let mut argv = vec!["ip"];
    argv.extend_from_slice(args);
    ns.run(&argv)
}

impl Topology {
    /// Builds the lab; on any failure removes whatever was made.
    pub fn build(spec: &LabSpec) -> Result<Topology> {
        if spec.prefix.is_empty()
            || spec.prefix.len() > 10
            || !spec.prefix.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return Err(HandoffError::Other(format!(
                "lab prefix {:?} must be 1–10 letters or digits",
                spec.prefix
            )));
        }
        if spec.nodes == 0
            || spec.nodes > MAX_NODES
            || spec.clients == 0
            || spec.clients > MAX_CLIENTS
        {
            return Err(HandoffError::Other(format!(
                "a lab has 1–{MAX_NODES} nodes and 1–{MAX_CLIENTS} clients"
            )));
        }
        if !netns::has_admin_caps() {
            return Err(HandoffError::NoPrivilege {
                what: "building the lab (network namespaces)".into(),
            });
        }
        if !Self::existing(&spec.prefix).is_empty() {
            return Err(HandoffError::Other(format!(
                "a lab with prefix {} exists already (`switchyard lab down` removes it)",
                spec.prefix
            )));
        }
        match Self::build_inner(spec) {
            Ok(t) => Ok(t),
            Err(e) => {
                warn!(error = %e, "lab build failed; removing what was made");
                Self::teardown(&spec.prefix);
                Err(e)
            }
        }
    }

    fn build_inner(spec: &LabSpec) -> Result<Topology> {
        let p = &spec.prefix;
        let bridge_netns = format!("{p}-br");
        let br = NetNs::create(&bridge_netns)?;
        ip(&br, &["link", "add", "br0", "type", "bridge"])?;
        ip(&br, &["link", "set", "br0", "up"])?;
        let mut plan: Vec<(String, Role, String, u8)> = Vec::new();
        plan.push((
            "switch".into(),
            Role::Switch,
            format!("{p}-sw"),
            SWITCH_HOST,
        ));
        for i in 0..spec.nodes {
            plan.push((
                format!("node{i}"),
                Role::Node,
                format!("{p}-n{i}"),
                NODE_BASE + i as u8,
            ));
        }
        for i in 0..spec.clients {
            plan.push((
                format!("client{i}"),
                Role::Client,
                format!("{p}-c{i}"),
                CLIENT_BASE + i as u8,
            ));
        }
        let vip = addr(VIP_HOST);
        let mut hosts = Vec::new();
        for (name, role, nsname, hostpart) in plan {
            let ns = NetNs::create(&nsname)?;
            let peer = format!("v-{}", &nsname[p.len() + 1..]);
            ip(
                &br,
                &[
                    "link", "add", &peer, "type", "veth", "peer", "name", "eth0", "netns", &nsname,
                ],
            )?;
            ip(&br, &["link", "set", &peer, "master", "br0", "up"])?;
            let a = addr(hostpart);
            ip(&ns, &["addr", "add", &format!("{a}/24"), "dev", "eth0"])?;
            ip(&ns, &["link", "set", "eth0", "up"])?;
            sysctl(&ns, "net.ipv4.conf.all.rp_filter", "0")?;
            sysctl(&ns, "net.ipv4.conf.default.rp_filter", "0")?;
            match role {
                Role::Switch => {
                    ip(&ns, &["addr", "add", &format!("{vip}/24"), "dev", "eth0"])?;
                }
                Role::Node => {
                    ip(&ns, &["addr", "add", &format!("{vip}/32"), "dev", "lo"])?;
                    for dev in ["all", "eth0"] {
                        sysctl(&ns, &format!("net.ipv4.conf.{dev}.arp_ignore"), "1")?;
                        sysctl(&ns, &format!("net.ipv4.conf.{dev}.arp_announce"), "2")?;
                    }
                }
                Role::Client => {}
            }
            if let Some(m) = spec.link_mbit {
                let rate = format!("{m}mbit");
                // tbf needs a burst of at least rate / HZ; 64 KiB covers 1 Gbit/s.
                let shape = [
                    "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", &rate, "burst",
                    "64kb", "latency", "20ms",
                ];
                ns.run(&[&["tc"][..], &shape[..]].concat())?;
                let mut s2 = shape;
                s2[3] = &peer;
                br.run(&[&["tc"][..], &s2[..]].concat())?;
            }
            let mac = iface_mac(&ns, "eth0")?;
            hosts.push(Host {
                name,
                role,
                netns: nsname,
                ip: a,
                mac,
            });
        }
        let t = Topology {
            prefix: p.clone(),
            vip,
            bridge_netns,
            link_mbit: spec.link_mbit,
            hosts,
        };
        info!(prefix = %p, nodes = spec.nodes, clients = spec.clients, "lab built");
        Ok(t)
    }

    /// Namespaces that exist with this prefix.
    pub fn existing(prefix: &str) -> Vec<String> {
        NetNs::list_prefixed(&format!("{prefix}-"))
    }

    /// Removes every namespace of the prefix (killing processes still in
    /// them); safe to call any number of times.
    pub fn teardown(prefix: &str) {
        for name in Self::existing(prefix) {
            kill_namespace_processes(&name);
            let _ = NetNs::delete(&name);
        }
    }

    /// A host by name (`switch`, `node0`, `client0`, …).
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// Hosts of one role.
    pub fn hosts_of(&self, role: Role) -> impl Iterator<Item = &Host> {
        self.hosts.iter().filter(move |h| h.role == role)
    }

    /// Opens a host's namespace.
    pub fn netns(&self, name: &str) -> Result<NetNs> {
        let h = self
            .host(name)
            .ok_or_else(|| HandoffError::Other(format!("no host {name} in the lab")))?;
        NetNs::open(&h.netns)
    }
}

fn iface_mac(ns: &NetNs, ifname: &str) -> Result<String> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<String> {
            let _g = ns.enter()?;
            let (mac, _) = switchyard_handoff::steer::interface_info(ifname)?;
            Ok(mac
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":"))
        })
        .join()
        .map_err(|_| HandoffError::Other("mac thread panicked".into()))?
    })
}

/// Kills every process whose network namespace is `name` (`ip netns pids`).
pub fn kill_namespace_processes(name: &str) {
    let Ok(out) = netns::run(Command::new("ip").args(["netns", "pids", name])) else {
        return;
    };
    let pids: Vec<i32> = out
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    for &pid in &pids {
        // SAFETY: kill(2) on pids the kernel listed in that namespace.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < deadline
        && pids
            .iter()
            .any(|&p| Path::new(&format!("/proc/{p}")).exists())
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for &pid in &pids {
        // SAFETY: as above; the ones still there get SIGKILL.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// A process the lab started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabProcess {
    /// Host it runs on.
    pub host: String,
    /// Its pid (in the initial pid namespace).
    pub pid: u32,
    /// Its command line.
    pub cmd: Vec<String>,
    /// Where its output goes.
    pub log: PathBuf,
}

/// What `switchyard lab status` reports and `down` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    /// The topology.
    pub topology: Topology,
    /// Delivery mechanism the switch was asked to use.
    pub mechanism: String,
    /// Document root the nodes serve.
    pub root: Option<PathBuf>,
    /// Processes started in the hosts.
    pub processes: Vec<LabProcess>,
    /// Notes for the operator (for example: the switch could not be started).
    pub notes: Vec<String>,
}

impl LabState {
    /// Reads a state file.
    pub fn load(path: &Path) -> Result<LabState> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| HandoffError::io(format!("read {}", path.display()), e))?;
        serde_json::from_str(&text)
            .map_err(|e| HandoffError::Other(format!("{}: {e}", path.display())))
    }

    /// Writes it atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)
                .map_err(|e| HandoffError::io(format!("mkdir {}", d.display()), e))?;
        }
        let tmp = path.with_extension("tmp");
        let text =
            serde_json::to_string_pretty(self).map_err(|e| HandoffError::Other(e.to_string()))?;
        std::fs::write(&tmp, text)
            .map_err(|e| HandoffError::io(format!("write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| HandoffError::io(format!("rename {}", path.display()), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_plan() {
        assert_eq!(addr(VIP_HOST).to_string(), "10.213.0.100");
        assert!(NODE_BASE as usize + MAX_NODES <= CLIENT_BASE as usize);
        assert!(CLIENT_BASE as usize + MAX_CLIENTS < VIP_HOST as usize);
    }

    #[test]
    fn bad_specs_are_refused_before_touching_anything() {
        let mut s = LabSpec {
            prefix: "has space".into(),
            clients: 1,
            nodes: 1,
            link_mbit: None,
        };
        assert!(Topology::build(&s).is_err());
        s.prefix = "ok".into();
        s.nodes = 0;
        assert!(Topology::build(&s).is_err());
    }

    #[test]
    fn state_round_trips_through_json() {
        let st = LabState {
            topology: Topology {
                prefix: "x".into(),
                vip: addr(VIP_HOST),
                bridge_netns: "x-br".into(),
                link_mbit: Some(100),
                hosts: vec![Host {
                    name: "switch".into(),
                    role: Role::Switch,
                    netns: "x-sw".into(),
                    ip: addr(2),
                    mac: "02:00:00:00:00:01".into(),
                }],
            },
            mechanism: "handoff".into(),
            root: None,
            processes: vec![],
            notes: vec![],
        };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        st.save(&p).unwrap();
        assert_eq!(LabState::load(&p).unwrap(), st);
    }
}
