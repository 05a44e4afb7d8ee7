//! `switchyard node`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use switchyard_node::{ClusterConfig, Member, NodeConfig};

use crate::config::FileConfig;
use crate::runtime;

/// Flags of `switchyard node`; each overrides the `[node]` key of the same name.
#[derive(Args, Debug, Default)]
pub struct NodeArgs {
    /// Address to serve HTTP on.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Document root.
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Object cache budget in bytes (0 disables the cache).
    #[arg(long)]
    pub cache_bytes: Option<u64>,
    /// Replacement policy: lru, lfu or gdsf.
    #[arg(long)]
    pub cache_policy: Option<String>,
    /// Admin listener address (/metrics, /healthz).
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// Worker threads (0: one per core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Emulated disk latency per cache miss, in microseconds.
    #[arg(long)]
    pub disk_latency_us: Option<u64>,
    /// Emulated disk bandwidth in bytes per second.
    #[arg(long)]
    pub disk_bandwidth: Option<u64>,
    /// Read cache misses with O_DIRECT, past the page cache (the root must be on a disk-backed
    /// file system that takes it).
    #[arg(long)]
    pub disk_o_direct: bool,
    /// Accept a connection once its first bytes arrive, or after this many ms (0: at once).
    #[arg(long)]
    pub defer_accept_ms: Option<u64>,
    /// Switch address (its report_listen) to push load reports to.
    #[arg(long)]
    pub report_to: Option<SocketAddr>,
    /// Unix-socket control listener for same-host connection handoffs (descriptor passing).
    #[arg(long, value_name = "PATH")]
    pub handoff_unix: Option<PathBuf>,
    /// TCP control listener for cross-host connection handoffs (TCP_REPAIR; needs CAP_NET_ADMIN).
    #[arg(long, value_name = "ADDR")]
    pub handoff_listen: Option<SocketAddr>,
    /// VIP:PORT this node takes cross-host handoffs for: unmatched packets for it are dropped,
    /// not reset, while connections are restored (installs an nftables rule; CAP_NET_ADMIN).
    #[arg(long, value_name = "ADDR")]
    pub handoff_vip: Option<SocketAddr>,
    /// Cooperative mode (no switch): requests owned by other members of the `[cluster]`
    /// table move there with their connection and come back once answered.
    #[arg(long)]
    pub cooperative: bool,
    /// This node's name among the members of the cluster (overrides `[cluster] name`).
    #[arg(long, requires = "cooperative")]
    pub name: Option<String>,
    /// A member of the cluster as NAME=CONTROL (CONTROL: unix:PATH on this host, IP:PORT on
    /// another: its requests then move as TCP_REPAIR state); repeat for every member,
    /// this node included. Replaces the members of `[cluster]`.
    #[arg(long = "member", value_name = "NAME=CONTROL", requires = "cooperative")]
    pub members: Vec<String>,
    /// A member's admin listener as NAME=ADDR, for the cluster's dashboard; repeat for every
    /// member. Replaces `[cluster.admin]`.
    #[arg(
        long = "member-admin",
        value_name = "NAME=ADDR",
        requires = "cooperative"
    )]
    pub member_admins: Vec<String>,
    /// How a request owned by another member is served: `clone` (its connection moves there)
    /// or `fetch` (the response is fetched from the owner's HTTP listener, held whole, then
    /// sent from here). Overrides `[cluster] mechanism`.
    #[arg(long, value_name = "clone|fetch", requires = "cooperative")]
    pub cluster_mechanism: Option<switchyard_node::ClusterMechanism>,
    /// A member's HTTP listener as NAME=ADDR, where `fetch` fetches its responses; repeat for
    /// every member. Replaces `[cluster.http]`.
    #[arg(
        long = "member-http",
        value_name = "NAME=ADDR",
        requires = "cooperative"
    )]
    pub member_https: Vec<String>,
    /// Seconds to wait for open connections on shutdown.
    #[arg(long, default_value_t = 10)]
    pub drain_secs: u64,
}

/// Parses `NAME=CONTROL`.
fn member(s: &str) -> anyhow::Result<Member> {
    let (name, control) = s
        .split_once('=')
        .with_context(|| format!("--member {s}: want NAME=CONTROL"))?;
    let control = control
        .parse()
        .map_err(|e| anyhow::anyhow!("--member {s}: {e}"))?;
    Ok(Member {
        name: name.to_owned(),
        control,
    })
}

/// SIGHUP: apply the config file's `[cluster]` membership to a cooperative node (members and
/// name given as flags override the file's, as at start). A changed `[rescue]` (`rescue`: the
/// table in force) takes a restart, and the log says so.
fn reload(
    node: &switchyard_node::RunningNode,
    args: &NodeArgs,
    path: Option<&Path>,
    rescue: Option<&switchyard_node::RescueConfig>,
) {
    let file = match path {
        Some(p) => FileConfig::load(p),
        None => Ok(FileConfig::default()),
    };
    if let Ok(f) = &file {
        f.note_rescue_change(rescue);
    }
    if !args.cooperative {
        tracing::info!("SIGHUP: only a cooperative node's membership can be reloaded; restart to apply other changes");
        return;
    }
    let applied = file
        .and_then(|f| cluster(args, &f))
        .and_then(|c| node.reload_cluster(&c).map_err(anyhow::Error::from));
    match applied {
        Ok(()) => tracing::info!("cluster membership reloaded"),
        Err(e) => tracing::error!(error = %format!("{e:#}"), "reload refused"),
    }
}

/// The cluster this node joins: `[cluster]` with the flags over it.
fn cluster(args: &NodeArgs, file: &FileConfig) -> anyhow::Result<ClusterConfig> {
    let mut c = file
        .cluster
        .clone()
        .unwrap_or_else(|| ClusterConfig::new(String::new(), Vec::new()));
    if !args.members.is_empty() {
        c.members = args
            .members
            .iter()
            .map(|m| member(m))
            .collect::<anyhow::Result<_>>()?;
    }
    if !args.member_admins.is_empty() {
        c.admin = args
            .member_admins
            .iter()
            .map(|m| {
                let (name, addr) = m
                    .split_once('=')
                    .with_context(|| format!("--member-admin {m}: want NAME=ADDR"))?;
                let addr = addr
                    .parse()
                    .with_context(|| format!("--member-admin {m}: not an address"))?;
                Ok((name.to_owned(), addr))
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if !args.member_https.is_empty() {
        c.http = args
            .member_https
            .iter()
            .map(|m| {
                let (name, addr) = m
                    .split_once('=')
                    .with_context(|| format!("--member-http {m}: want NAME=ADDR"))?;
                let addr = addr
                    .parse()
                    .with_context(|| format!("--member-http {m}: not an address"))?;
                Ok((name.to_owned(), addr))
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(m) = args.cluster_mechanism {
        c.mechanism = m;
    }
    if let Some(n) = &args.name {
        c.name = n.clone();
    }
    if c.members.is_empty() {
        anyhow::bail!(
            "--cooperative needs the members: a [cluster] table or --member NAME=CONTROL"
        );
    }
    c.validate().map_err(|e| anyhow::anyhow!(e))?;
    Ok(c)
}

impl NodeArgs {
    /// Apply the flags over a configuration from the file (or defaults).
    pub fn merge(&self, mut cfg: NodeConfig) -> NodeConfig {
        if let Some(v) = self.listen {
            cfg.listen = v;
        }
        if let Some(v) = &self.root {
            cfg.root = v.clone();
        }
        if let Some(v) = self.cache_bytes {
            cfg.cache_bytes = v;
        }
        if let Some(v) = &self.cache_policy {
            cfg.cache_policy = v.clone();
        }
        if let Some(v) = self.admin {
            cfg.admin = Some(v);
        }
        if let Some(v) = self.workers {
            cfg.workers = v;
        }
        if let Some(v) = self.disk_latency_us {
            cfg.disk.latency_us = v;
        }
        if let Some(v) = self.disk_bandwidth {
            cfg.disk.bandwidth_bytes_per_sec = v;
        }
        if self.disk_o_direct {
            cfg.disk.o_direct = true;
        }
        if let Some(v) = self.defer_accept_ms {
            cfg.defer_accept_ms = v;
        }
        if let Some(v) = self.report_to {
            cfg.report_to = Some(v);
        }
        if let Some(v) = &self.handoff_unix {
            cfg.handoff_unix = Some(v.clone());
        }
        if let Some(v) = self.handoff_listen {
            cfg.handoff_listen = Some(v);
        }
        if let Some(v) = self.handoff_vip {
            cfg.handoff_vip = Some(v);
        }
        cfg
    }
}

/// Run a node until SIGINT/SIGTERM. In cooperative mode SIGHUP re-reads the config file and
/// applies its `[cluster]` membership (the rest of the file takes a restart).
pub fn run(args: NodeArgs, file: &FileConfig, path: Option<&Path>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut cfg = args.merge(file.node.clone().unwrap_or_default());
    cfg.dynamic = file.dynamic.clone();
    if args.cooperative {
        cfg.cluster = Some(cluster(&args, file)?);
    } else if file.cluster.is_some() {
        tracing::info!("[cluster] is set but --cooperative is not: serving alone");
    }
    if let Some(r) = &file.rescue {
        r.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        cfg.rescue = Some(r.clone());
    }
    if cfg.root.as_os_str().is_empty() {
        anyhow::bail!("no document root: pass --root DIR or set [node] root in the config file");
    }
    let rescue = cfg.rescue.clone();
    // The node runs its own worker threads; this runtime carries only the
    // admin listener, load reports and signals.
    let rt = runtime::build(1)?;
    rt.block_on(async {
        // Installed before the node is reachable: a SIGHUP must never find the default action
        // (which ends the process).
        let mut hup = signal(SignalKind::hangup())?;
        let node = switchyard_node::start(cfg)
            .await
            .context("node failed to start")?;
        eprintln!("switchyard node: serving http://{}/", node.addr());
        if let Some(a) = node.admin_addr() {
            eprintln!("switchyard node: metrics at http://{a}/metrics");
        }
        if let Some(p) = node.handoff_unix() {
            eprintln!("switchyard node: handoffs on unix:{}", p.display());
        }
        if let Some(a) = node.handoff_addr() {
            eprintln!("switchyard node: handoffs on tcp:{a}");
        }
        if args.cooperative && !node.wait_for_peers(Duration::from_secs(5)).await {
            tracing::warn!("not every peer is up yet: their targets are served here meanwhile");
        }
        let stop = runtime::stop_signal(None);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                why = &mut stop => {
                    tracing::info!(reason = why, "draining");
                    break;
                }
                _ = hup.recv() => reload(&node, &args, path, rescue.as_ref()),
            }
        }
        node.shutdown(Duration::from_secs(args.drain_secs)).await;
        Ok(())
    })
}
