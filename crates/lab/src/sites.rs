//! A lab of independent web sites for flash-crowd rescue (seed 001 §5's testbed): sites with
//! outbound links of their own rates, client hosts, a DNS host and registry hosts, on one
//! bridge in network namespaces.
//!
//! ```text
//!           ┌───────────────── <prefix>-br (namespace): bridge br0 ─────────────────┐
//!           └─ v-dns ── v-r0 v-r1 v-r2 ── v-s0 v-s1 … ── v-c0 v-c1 … (veth ends) ───┘
//!   <prefix>-dns 10.214.0.2    <prefix>-r<i> 10.214.0.5+i    <prefix>-s<i> 10.214.0.11+i
//!   (named)                     (etcd members)                 (sites; eth0 shaped to
//!                                                               the site's rate)
//!                               <prefix>-c<i> 10.214.0.51+i (clients)
//! ```
//!
//! Every host gets `/etc/netns/<namespace>/resolv.conf` naming the DNS host, which
//! `ip netns exec` mounts over `/etc/resolv.conf`: processes started that way (see
//! [`SitesLab::command`]) resolve through the lab's named, as a client resolves a site's
//! name through its DNS. A site's outbound rate is a tbf qdisc on its `eth0` (its uplink,
//! seed 001's D_out link); the other direction and the other hosts' links are unshaped, as in
//! the paper, where the clients and the network are not the bottleneck.
//!
//! The subnet differs from the cluster lab's ([`crate::SUBNET`]), and the namespaces carry
//! their own prefix, so both kinds of lab can exist at once. [`SitesLab::teardown`] removes
//! every namespace of the prefix and its `/etc/netns` directory, also after a failed build.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use switchyard_handoff::netns::{self, NetNs};
use switchyard_handoff::{HandoffError, Result};

use crate::{kill_namespace_processes, sysctl};

/// The sites lab's subnet.
pub const SITES_SUBNET: [u8; 3] = [10, 214, 0];
/// The DNS host's host part.
pub const DNS_HOST: u8 = 2;
/// The first registry host's host part.
pub const REGISTRY_BASE: u8 = 5;
/// The first site's host part.
pub const SITE_BASE: u8 = 11;
/// The first client's host part.
pub const SITE_CLIENT_BASE: u8 = 51;
/// Most registry hosts.
pub const MAX_REGISTRY: usize = 5;
/// Most sites.
pub const MAX_SITES: usize = 39;
/// Most clients.
pub const MAX_SITE_CLIENTS: usize = 40;
/// Where `ip netns exec` looks for a namespace's own `/etc` files.
pub const ETC_NETNS: &str = "/etc/netns";

fn addr(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(SITES_SUBNET[0], SITES_SUBNET[1], SITES_SUBNET[2], host)
}

/// One site to build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteSpec {
    /// Short name (`origin`, `r1`, …): letters and digits.
    pub name: String,
    /// Its outbound link rate in kB/s (tbf on its `eth0`), if shaped.
    pub out_kbps: Option<u32>,
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SitesSpec {
    /// Prefix of every namespace (unique per lab; at most 10 letters or digits).
    pub prefix: String,
    /// The sites.
    pub sites: Vec<SiteSpec>,
    /// Client hosts.
    pub clients: usize,
    /// Registry hosts (one etcd member each; 3 for a cluster that survives one loss).
    pub registry: usize,
}

/// What a host of the sites lab is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SiteRole {
    /// The DNS server (named).
    Dns,
    /// A registry member (etcd).
    Registry,
    /// A web site.
    Site,
    /// A client host.
    Client,
}

/// One host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteHost {
    /// `dns`, `registry0`, a site's name, `client0` …
    pub name: String,
    /// Its role.
    pub role: SiteRole,
    /// Its namespace.
    pub netns: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its outbound rate in kB/s, if shaped.
    pub out_kbps: Option<u32>,
}

/// A built sites lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SitesLab {
    /// Namespace prefix.
    pub prefix: String,
    /// The namespace holding the bridge.
    pub bridge_netns: String,
    /// Every host: the DNS host, the registry hosts, the sites, the clients.
    pub hosts: Vec<SiteHost>,
}

/// The tbf parameters that shape a link to `kbps` kB/s: `rate` in kbit/s, and a burst of
/// 10 ms at that rate (at least 16 KiB, which tbf needs for one MTU-sized packet at HZ=1000).
pub fn tbf_args(kbps: u32) -> (String, String) {
    let rate_kbit = u64::from(kbps) * 8;
    let burst = (u64::from(kbps) * 1000 / 100).max(16 * 1024);
    (format!("{rate_kbit}kbit"), format!("{burst}b"))
}

/// The text of a resolv.conf that names `dns` only.
pub fn resolv_conf(dns: Ipv4Addr) -> String {
    format!("# switchyard sites lab\nnameserver {dns}\noptions timeout:1 attempts:2\n")
}

impl SitesLab {
    /// Builds the lab; on any failure removes whatever was made.
    pub fn build(spec: &SitesSpec) -> Result<SitesLab> {
        Self::check(spec)?;
        if !netns::has_admin_caps() {
            return Err(HandoffError::NoPrivilege {
                what: "building the sites lab (network namespaces)".into(),
            });
        }
        if !NetNs::list_prefixed(&format!("{}-", spec.prefix)).is_empty() {
            return Err(HandoffError::Other(format!(
                "a lab with prefix {} exists already",
                spec.prefix
            )));
        }
        match Self::build_inner(spec) {
            Ok(l) => Ok(l),
            Err(e) => {
                warn!(error = %e, "sites lab build failed; removing what was made");
                Self::teardown(&spec.prefix);
                Err(e)
            }
        }
    }

    /// Checks a spec without touching anything.
    pub fn check(spec: &SitesSpec) -> Result<()> {
        let bad = |m: String| Err(HandoffError::Other(m));
        let label = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric());
        if !label(&spec.prefix) || spec.prefix.len() > 10 {
            return bad(format!(
                "lab prefix {:?} must be 1–10 letters or digits",
                spec.prefix
            ));
        }
        if spec.sites.is_empty() || spec.sites.len() > MAX_SITES {
            return bad(format!("a sites lab has 1–{MAX_SITES} sites"));
        }
        if spec.clients == 0 || spec.clients > MAX_SITE_CLIENTS {
            return bad(format!("a sites lab has 1–{MAX_SITE_CLIENTS} clients"));
        }
        if spec.registry > MAX_REGISTRY {
            return bad(format!("at most {MAX_REGISTRY} registry hosts"));
        }
        let mut names = std::collections::HashSet::new();
        for s in &spec.sites {
            // The namespace is <prefix>-s<i>, so the name only has to be a label.
            if !label(&s.name) || s.name.len() > 15 || s.name.starts_with("client") {
                return bad(format!(
                    "site name {:?} must be 1–15 letters or digits and not a client's",
                    s.name
                ));
            }
            if matches!(s.name.as_str(), "dns") || s.name.starts_with("registry") {
                return bad(format!("site name {:?} is a service host's", s.name));
            }
            if !names.insert(s.name.clone()) {
                return bad(format!("site name {:?} given twice", s.name));
            }
            if s.out_kbps == Some(0) {
                return bad(format!("site {:?}: a rate of 0 kB/s", s.name));
            }
        }
        Ok(())
    }

    fn build_inner(spec: &SitesSpec) -> Result<SitesLab> {
        let p = &spec.prefix;
        let bridge_netns = format!("{p}-br");
        let br = NetNs::create(&bridge_netns)?;
        br.run(&["ip", "link", "add", "br0", "type", "bridge"])?;
        br.run(&["ip", "link", "set", "br0", "up"])?;
        let mut plan: Vec<(String, SiteRole, String, u8, Option<u32>)> = vec![(
            "dns".into(),
            SiteRole::Dns,
            format!("{p}-dns"),
            DNS_HOST,
            None,
        )];
        for i in 0..spec.registry {
            plan.push((
                format!("registry{i}"),
                SiteRole::Registry,
                format!("{p}-r{i}"),
                REGISTRY_BASE + i as u8,
                None,
            ));
        }
        for (i, s) in spec.sites.iter().enumerate() {
            plan.push((
                s.name.clone(),
                SiteRole::Site,
                format!("{p}-s{i}"),
                SITE_BASE + i as u8,
                s.out_kbps,
            ));
        }
        for i in 0..spec.clients {
            plan.push((
                format!("client{i}"),
                SiteRole::Client,
                format!("{p}-c{i}"),
                SITE_CLIENT_BASE + i as u8,
                None,
            ));
        }
        let dns = addr(DNS_HOST);
        let mut hosts = Vec::new();
        for (name, role, nsname, hostpart, out_kbps) in plan {
            let ns = NetNs::create(&nsname)?;
            let peer = format!("v-{}", &nsname[p.len() + 1..]);
            br.run(&[
                "ip", "link", "add", &peer, "type", "veth", "peer", "name", "eth0", "netns",
                &nsname,
            ])?;
            br.run(&["ip", "link", "set", &peer, "master", "br0", "up"])?;
            let a = addr(hostpart);
            ns.run(&["ip", "addr", "add", &format!("{a}/24"), "dev", "eth0"])?;
            ns.run(&["ip", "link", "set", "eth0", "up"])?;
            sysctl(&ns, "net.ipv4.conf.all.rp_filter", "0")?;
            if let Some(kbps) = out_kbps {
                let (rate, burst) = tbf_args(kbps);
                ns.run(&[
                    "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", &rate, "burst",
                    &burst, "latency", "100ms",
                ])?;
            }
            let etc = PathBuf::from(ETC_NETNS).join(&nsname);
            std::fs::create_dir_all(&etc)
                .map_err(|e| HandoffError::io(format!("mkdir {}", etc.display()), e))?;
            let rc = etc.join("resolv.conf");
            std::fs::write(&rc, resolv_conf(dns))
                .map_err(|e| HandoffError::io(format!("write {}", rc.display()), e))?;
            hosts.push(SiteHost {
                name,
                role,
                netns: nsname,
                ip: a,
                out_kbps,
            });
        }
        info!(prefix = %p, sites = spec.sites.len(), clients = spec.clients, registry = spec.registry, "sites lab built");
        Ok(SitesLab {
            prefix: p.clone(),
            bridge_netns,
            hosts,
        })
    }

    /// Removes every namespace of the prefix (killing processes still in them) and their
    /// `/etc/netns` directories; safe to call any number of times.
    pub fn teardown(prefix: &str) {
        for name in NetNs::list_prefixed(&format!("{prefix}-")) {
            kill_namespace_processes(&name);
            let _ = NetNs::delete(&name);
        }
        if let Ok(rd) = std::fs::read_dir(ETC_NETNS) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&format!("{prefix}-")) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }

    /// A host by name.
    pub fn host(&self, name: &str) -> Option<&SiteHost> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// Hosts of one role, in build order.
    pub fn hosts_of(&self, role: SiteRole) -> impl Iterator<Item = &SiteHost> {
        self.hosts.iter().filter(move |h| h.role == role)
    }

    /// The DNS host's address.
    pub fn dns_ip(&self) -> Ipv4Addr {
        addr(DNS_HOST)
    }

    /// A command run on host `name` through `ip netns exec`, so that it sees the host's
    /// resolv.conf.
    pub fn command(&self, name: &str, program: &str) -> Result<Command> {
        let h = self
            .host(name)
            .ok_or_else(|| HandoffError::Other(format!("no host {name} in the sites lab")))?;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &h.netns, program]);
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SitesSpec {
        SitesSpec {
            prefix: "t".into(),
            sites: vec![
                SiteSpec {
                    name: "origin".into(),
                    out_kbps: Some(1000),
                },
                SiteSpec {
                    name: "r1".into(),
                    out_kbps: None,
                },
            ],
            clients: 1,
            registry: 3,
        }
    }

    #[test]
    fn address_plan_stays_apart() {
        assert!(REGISTRY_BASE as usize + MAX_REGISTRY <= SITE_BASE as usize);
        assert!(SITE_BASE as usize + MAX_SITES <= SITE_CLIENT_BASE as usize);
        assert!(SITE_CLIENT_BASE as usize + MAX_SITE_CLIENTS < 255);
        assert_ne!(SITES_SUBNET, crate::SUBNET);
    }

    #[test]
    fn shaping_rates_in_kbit_and_a_burst_of_ten_milliseconds() {
        assert_eq!(tbf_args(1000), ("8000kbit".into(), "16384b".into()));
        assert_eq!(tbf_args(10000), ("80000kbit".into(), "100000b".into()));
    }

    #[test]
    fn resolv_conf_names_the_lab_dns_only() {
        let t = resolv_conf(addr(DNS_HOST));
        assert_eq!(t.lines().filter(|l| l.starts_with("nameserver")).count(), 1);
        assert!(t.contains("nameserver 10.214.0.2\n"), "{t}");
    }

    #[test]
    fn bad_specs_are_refused_before_touching_anything() {
        assert!(SitesLab::check(&spec()).is_ok());
        let mut s = spec();
        s.sites[1].name = "origin".into();
        assert!(SitesLab::check(&s).is_err());
        let mut s = spec();
        s.sites[0].out_kbps = Some(0);
        assert!(SitesLab::check(&s).is_err());
        let mut s = spec();
        s.sites[0].name = "dns".into();
        assert!(SitesLab::check(&s).is_err());
        let mut s = spec();
        s.registry = 9;
        assert!(SitesLab::check(&s).is_err());
        let mut s = spec();
        s.prefix = "has space".into();
        assert!(SitesLab::check(&s).is_err());
    }

    #[test]
    fn state_round_trips_through_json() {
        let l = SitesLab {
            prefix: "t".into(),
            bridge_netns: "t-br".into(),
            hosts: vec![SiteHost {
                name: "origin".into(),
                role: SiteRole::Site,
                netns: "t-s0".into(),
                ip: addr(SITE_BASE),
                out_kbps: Some(1000),
            }],
        };
        let j = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<SitesLab>(&j).unwrap(), l);
    }
}
