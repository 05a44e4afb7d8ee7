//! `switchyard sim cyclone`: the six systems of seed 000 §5 over cluster sizes, as a table, CSV
//! and JSON.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use switchyard_trace::{synthesize, SessionConfig, TargetKey, Workload};

use crate::cli::{parse_list, write_to};
use crate::cyclone::{berkeley_synth, sweep_coop, CoopConfig, CoopResult, System, BERKELEY_BYTES};
use crate::workload::{Http, SimWorkload, Targets, WorkloadSummary};
use crate::SimError;

/// `switchyard sim cyclone`
#[derive(Clone, Debug, Args)]
pub struct CycloneArgs {
    /// Access log (Common or Combined Log Format) to replay; default: a synthetic trace shaped
    /// like seed 000's (74,820 files, 650 MB) at `--scale`.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Size of the synthetic trace relative to seed 000's; the default caches scale alike.
    #[arg(long, default_value_t = 0.01)]
    pub scale: f64,
    /// Requests in the synthetic trace.
    #[arg(long, default_value_t = 20_000)]
    pub requests: u64,
    /// Seed of the synthetic trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Zipf exponent of the synthetic trace's page popularity.
    #[arg(long, default_value_t = 1.2)]
    pub zipf_alpha: f64,
    /// HTTP shape: 1.0 (a connection per request, as seed 000 §5 replayed) or 1.1.
    #[arg(long, default_value = "1.0")]
    pub http: String,
    /// Cluster sizes, comma separated.
    #[arg(long, default_value = "1,2,4,8")]
    pub nodes: String,
    /// Systems, comma separated (RR, CF-LRU, CF-LFU, CF-REP, SC, Cyclone) or `all`.
    #[arg(long, default_value = "all")]
    pub systems: String,
    /// Object cache per node, bytes (default: 100 MB × scale, so that the working set fits
    /// only in 8 nodes' memory as in seed 000 §5).
    #[arg(long)]
    pub cache_bytes: Option<u64>,
    /// Replica cache per node, bytes (default: 12 MB × scale, seed 000 §3.3's share).
    #[arg(long)]
    pub replica_bytes: Option<u64>,
    /// Largest object replicated, bytes.
    #[arg(long)]
    pub replica_max_object: Option<u64>,
    /// Largest object the object caches keep, bytes (the node's `cache_max_object_bytes`).
    #[arg(long, default_value_t = crate::cyclone::NODE_CACHE_MAX_OBJECT_BYTES)]
    pub cache_max_object: u64,
    /// Replacement policy of the object caches of RR, SC and Cyclone (the node's
    /// `cache_policy`: lru, lfu or gdsf; LFU ages as `--aging-ms` says).
    #[arg(long, default_value = "lru")]
    pub cache_policy: String,
    /// Aged references from which an owned target is hot.
    #[arg(long, default_value_t = switchyard_cache::replication::DEFAULT_HOT_THRESHOLD)]
    pub hot_threshold: f64,
    /// Aging period of the reference counts, milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub aging_ms: u64,
    /// How long a replica is served after its owner last checked the object, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub replica_fresh_ms: u64,
    /// Owner map policy (as `[cluster] policy`).
    #[arg(long, default_value = "chash")]
    pub owner_policy: String,
    /// `chash` load bound factor of the owner map (default as the node's: 1000, the bound
    /// lifted, plain consistent hashing like the paper's hash mapping).
    #[arg(long)]
    pub owner_eps: Option<f64>,
    /// `chash` ring points per node (default as the node's: 1000).
    #[arg(long)]
    pub chash_points: Option<u32>,
    /// Payload rate of each node's link, Mbit/s.
    #[arg(long, default_value_t = 100.0)]
    pub link_mbps: f64,
    /// How a link carries the transfers in flight: `shared` (as TCP shares it) or `fifo`
    /// (one after the other).
    #[arg(long, default_value = "shared")]
    pub link_model: String,
    /// Client connections open at once (seed 000 §5.1: 38).
    #[arg(long, default_value_t = 38)]
    pub clients: u32,
    /// Socket clone cost in all, µs (seed 000 §4.2: 46 on a Pentium III 733).
    #[arg(long)]
    pub clone_us: Option<f64>,
    /// Per-request CPU, µs.
    #[arg(long)]
    pub request_us: Option<f64>,
    /// Cache forwarding: CPU per fetch on the fetching node, µs.
    #[arg(long)]
    pub fetch_request_us: Option<f64>,
    /// Cache forwarding: CPU per fetch on the owner (lookup and reply), µs.
    #[arg(long)]
    pub fetch_serve_us: Option<f64>,
    /// CPU per 512 bytes received from a peer and stored (a fetched object or a copy), µs.
    #[arg(long)]
    pub receive_per_512_us: Option<f64>,
    /// Connection establishment on the node the client reached, µs.
    #[arg(long)]
    pub connect_us: Option<f64>,
    /// Connection teardown on that node, µs.
    #[arg(long)]
    pub teardown_us: Option<f64>,
    /// CPU per 512 bytes sent, µs.
    #[arg(long)]
    pub transmit_per_512_us: Option<f64>,
    /// File server (or disk) positioning per read, µs.
    #[arg(long)]
    pub disk_seek_us: Option<f64>,
    /// Disk transfer time per 4096 bytes, µs.
    #[arg(long)]
    pub disk_per_4k_us: Option<f64>,
    /// Disk positioning per 44 KiB extent after the first, µs.
    #[arg(long)]
    pub disk_extent_seek_us: Option<f64>,
    /// A disk per node instead of one file server for the cluster.
    #[arg(long)]
    pub private_disks: bool,
    /// Unmeasured replays of the trace before the measured one.
    #[arg(long, default_value_t = 1)]
    pub warmup_passes: u32,
    /// Start each replay of the trace only once the one before has been answered in full,
    /// as a client that replays the trace again after its first run ended (by default the
    /// clients go on without a pause).
    #[arg(long)]
    pub separate_passes: bool,
    /// The number in the first member's name: 1 (`n1`, `n2`, …) as `switchyard demo
    /// --cooperative` names its members, 0 as `switchyard lab up --cooperative` does. The
    /// owner map hashes the names: compare with a real cluster under its own names.
    #[arg(long, default_value_t = 1)]
    pub first_member: u32,
    /// Worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write one CSV line per run.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write one CSV line per node and run.
    #[arg(long)]
    pub node_csv: Option<PathBuf>,
}

#[derive(Serialize)]
struct Output<'a> {
    source: &'a str,
    workload: WorkloadSummary,
    runs: &'a [CoopResult],
    wall_secs: f64,
}

fn config(a: &CycloneArgs, scale: f64) -> Result<CoopConfig, SimError> {
    let mut c = CoopConfig::new(1, System::Rr);
    c.cache_bytes = a
        .cache_bytes
        .unwrap_or((100e6 * scale).round().max(1.0) as u64);
    c.replication.replica_bytes = a
        .replica_bytes
        .unwrap_or((12e6 * scale).round().max(1.0) as u64);
    c.replication.threshold = a.hot_threshold;
    if let Some(m) = a.replica_max_object {
        c.replication.max_object_bytes = m;
    }
    c.cache_max_object_bytes = a.cache_max_object;
    c.cache_policy = cache_policy(&a.cache_policy, a.aging_ms)?;
    c.replication.aging_interval = Duration::from_millis(a.aging_ms);
    c.replica_fresh = Duration::from_millis(a.replica_fresh_ms);
    c.owner_policy.name = a.owner_policy.parse()?;
    if let Some(e) = a.owner_eps {
        c.owner_policy.eps = e;
    }
    if let Some(p) = a.chash_points {
        c.owner_policy.chash_points = p;
    }
    c.link_mbps = a.link_mbps;
    c.link_model = a.link_model.parse()?;
    c.clients = a.clients;
    if let Some(v) = a.clone_us {
        c.costs.clone_us = v;
    }
    if let Some(v) = a.request_us {
        c.costs.request_us = v;
    }
    if let Some(v) = a.fetch_request_us {
        c.costs.fetch_request_us = v;
    }
    if let Some(v) = a.fetch_serve_us {
        c.costs.fetch_serve_us = v;
    }
    if let Some(v) = a.receive_per_512_us {
        c.costs.receive_per_512_us = v;
    }
    if let Some(v) = a.connect_us {
        c.costs.connect_us = v;
    }
    if let Some(v) = a.teardown_us {
        c.costs.teardown_us = v;
    }
    if let Some(v) = a.transmit_per_512_us {
        c.costs.transmit_per_512_us = v;
    }
    if let Some(v) = a.disk_seek_us {
        c.disk.seek_us = v;
    }
    if let Some(v) = a.disk_per_4k_us {
        c.disk.per_4k_us = v;
    }
    if let Some(v) = a.disk_extent_seek_us {
        c.disk.extent_seek_us = v;
    }
    c.shared_disk = !a.private_disks;
    c.warmup_passes = a.warmup_passes;
    c.separate_passes = a.separate_passes;
    c.first_member = a.first_member;
    c.validate()?;
    Ok(c)
}

/// The object caches' policy by the node's name for it; LFU ages as the replication counts do
/// (the node's `lfu_aging_interval_ms` and the simulator's `--aging-ms` are both 10 s by
/// default).
fn cache_policy(name: &str, aging_ms: u64) -> Result<switchyard_cache::PolicyKind, SimError> {
    let kind: switchyard_cache::PolicyKind = name
        .parse()
        .map_err(|e| SimError::Config(format!("--cache-policy: {e}")))?;
    Ok(match kind {
        switchyard_cache::PolicyKind::Lfu { aging_factor, .. } => {
            switchyard_cache::PolicyKind::Lfu {
                aging_interval_ms: aging_ms,
                aging_factor,
            }
        }
        k => k,
    })
}

fn systems(s: &str) -> Result<Vec<System>, SimError> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(System::ALL.to_vec());
    }
    let v: Vec<System> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    if v.is_empty() {
        return Err(SimError::Config("no system given".into()));
    }
    Ok(v)
}

/// Runs `switchyard sim cyclone`.
pub(crate) fn run(a: &CycloneArgs, out: &mut dyn Write) -> Result<(), SimError> {
    if !(a.scale.is_finite() && a.scale > 0.0 && a.scale <= 1.0) {
        return Err(SimError::Config(format!(
            "scale must be in (0, 1], got {}",
            a.scale
        )));
    }
    let http: Http = a.http.parse()?;
    let nodes: Vec<u32> = parse_list(&a.nodes, "node counts")?;
    let systems = systems(&a.systems)?;
    let (trace, source, scale) = match &a.trace {
        Some(path) => {
            let (w, _) = Workload::open(path, TargetKey::Path)?;
            let bytes: u64 = w.targets.iter().map(|t| t.size).sum();
            let scale = (bytes as f64 / BERKELEY_BYTES as f64).clamp(1e-6, 1e3);
            (w, path.display().to_string(), scale)
        }
        None => {
            let s = synthesize(&berkeley_synth(a.scale, a.requests, a.zipf_alpha, a.seed))?;
            (
                s.workload,
                format!(
                    "synthetic (seed 000 shape, scale {}, seed {}, zipf {})",
                    a.scale, a.seed, a.zipf_alpha
                ),
                a.scale,
            )
        }
    };
    if trace.requests.is_empty() {
        return Err(SimError::Workload("the trace has no requests".into()));
    }
    let base = config(a, scale)?;
    let w = SimWorkload::with_targets(
        Arc::new(Targets::of(&trace)),
        &trace,
        http,
        &SessionConfig::default(),
    );
    let start = Instant::now();
    let runs = sweep_coop(&base, &systems, &nodes, &w, a.threads)?;
    let wall = start.elapsed().as_secs_f64();
    if let Some(p) = &a.csv {
        write_to(p, |f| write_runs_csv(f, &runs))?;
    }
    if let Some(p) = &a.node_csv {
        write_to(p, |f| write_nodes_csv(f, &runs))?;
    }
    if a.json {
        let o = Output {
            source: &source,
            workload: w.summary(),
            runs: &runs,
            wall_secs: wall,
        };
        serde_json::to_writer(&mut *out, &o)?;
        writeln!(out)?;
        return Ok(());
    }
    let s = w.summary();
    writeln!(
        out,
        "workload: {source}: {} requests, {} targets, {:.1} MB, mean response {:.0} B",
        s.requests,
        s.targets,
        s.target_bytes as f64 / 1e6,
        s.mean_response_bytes
    )?;
    writeln!(
        out,
        "cluster: {} MB cache and {} MB replicas per node, {} Mbit/s links, {} clients, owner map {} (eps {}, {} points)",
        base.cache_bytes as f64 / 1e6,
        base.replication.replica_bytes as f64 / 1e6,
        base.link_mbps,
        base.clients,
        base.owner_policy.name.as_str(),
        base.owner_policy.eps,
        base.owner_policy.chash_points
    )?;
    write!(out, "{}", table(&runs))?;
    writeln!(out, "{} runs in {wall:.1} s", runs.len())?;
    Ok(())
}

/// The runs as a text table.
pub fn table(runs: &[CoopResult]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{:<8} {:>5} {:>9} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8} {:>8}",
        "system",
        "nodes",
        "req/s",
        "MB/s",
        "eff",
        "local",
        "owner",
        "repl",
        "disk",
        "clones",
        "fetch",
        "max/mean",
        "1st B ms"
    );
    for r in runs {
        let _ = writeln!(
            t,
            "{:<8} {:>5} {:>9.0} {:>7.2} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>6.2} {:>6.2} {:>8.2} {:>8.2}",
            r.system.as_str(),
            r.nodes,
            r.throughput,
            r.mbytes_per_sec,
            r.efficiency,
            r.local_hit_rate,
            r.owner_hit_rate,
            r.replica_hit_rate,
            r.disk_rate,
            r.clones_per_request,
            r.fetches_per_request,
            r.max_bytes_over_mean,
            r.mean_first_byte_ms
        );
    }
    t
}

/// Header of [`write_runs_csv`].
pub const RUNS_CSV_HEADER: &str = "system,nodes,clients,owner_policy,cache_bytes,replica_bytes,link_mbps,measured_requests,sim_secs,throughput,mbytes_per_sec,efficiency,local_hit_rate,owner_hit_rate,replica_hit_rate,disk_rate,clones_per_request,fetches_per_request,copies_shipped,peer_traffic_share,max_bytes_over_mean,max_responses_over_mean,mean_first_byte_ms,mean_response_ms,mean_cpu_utilization,mean_link_utilization,owner_map_reassignments";

/// One line per run.
pub fn write_runs_csv(out: &mut dyn Write, runs: &[CoopResult]) -> io::Result<()> {
    writeln!(out, "{RUNS_CSV_HEADER}")?;
    for r in runs {
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{:.6},{:.3},{:.4},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{},{:.6},{:.4},{:.4},{:.4},{:.4},{:.6},{:.6},{}",
            r.system,
            r.nodes,
            r.clients,
            r.owner_policy,
            r.cache_bytes,
            r.replica_bytes,
            r.link_mbps,
            r.measured_requests,
            r.sim_secs,
            r.throughput,
            r.mbytes_per_sec,
            r.efficiency,
            r.local_hit_rate,
            r.owner_hit_rate,
            r.replica_hit_rate,
            r.disk_rate,
            r.clones_per_request,
            r.fetches_per_request,
            r.copies_shipped,
            r.peer_traffic_share,
            r.max_bytes_over_mean,
            r.max_responses_over_mean,
            r.mean_first_byte_ms,
            r.mean_response_ms,
            r.mean_cpu_utilization,
            r.mean_link_utilization,
            r.owner_map_reassignments
        )?;
    }
    Ok(())
}

/// Header of [`write_nodes_csv`].
pub const NODES_CSV_HEADER: &str = "system,nodes,node,connections,responses,bytes_out,peer_bytes_out,link_utilization,cpu_utilization,disk_utilization,cached_bytes,replicas,replica_bytes,replica_capacity,replica_hits,replicas_stored,replicas_expired,copies_shipped";

/// One line per node of every run.
pub fn write_nodes_csv(out: &mut dyn Write, runs: &[CoopResult]) -> io::Result<()> {
    writeln!(out, "{NODES_CSV_HEADER}")?;
    for r in runs {
        for n in &r.per_node {
            writeln!(
                out,
                "{},{},{},{},{},{},{},{:.6},{:.6},{:.6},{},{},{},{},{},{},{},{}",
                r.system,
                r.nodes,
                n.node,
                n.connections,
                n.responses,
                n.bytes_out,
                n.peer_bytes_out,
                n.link_utilization,
                n.cpu_utilization,
                n.disk_utilization,
                n.cached_bytes,
                n.replicas,
                n.replica_bytes,
                n.replica_capacity,
                n.replica_hits,
                n.replicas_stored,
                n.replicas_expired,
                n.copies_shipped
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cli::{run, SimCommand};
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Top {
        #[command(subcommand)]
        cmd: SimCommand,
    }

    fn go(args: &[&str]) -> Result<String, crate::SimError> {
        let top = Top::try_parse_from(args).unwrap();
        let mut out = Vec::new();
        run(&top.cmd, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn cyclone_prints_a_table_and_writes_csv_and_json() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("runs.csv");
        let nodes = dir.path().join("nodes.csv");
        let base = [
            "sim",
            "cyclone",
            "--scale",
            "0.002",
            "--requests",
            "1500",
            "--nodes",
            "1,2",
            "--systems",
            "sc,Cyclone",
        ];
        let mut args = base.to_vec();
        args.extend(["--csv", csv.to_str().unwrap()]);
        args.extend(["--node-csv", nodes.to_str().unwrap()]);
        let out = go(&args).unwrap();
        assert!(out.contains("Cyclone"), "{out}");
        assert_eq!(out.lines().filter(|l| l.starts_with("SC ")).count(), 2);
        let text = std::fs::read_to_string(&csv).unwrap();
        assert_eq!(text.lines().count(), 5);
        assert_eq!(
            text.lines().nth(1).unwrap().split(',').count(),
            super::RUNS_CSV_HEADER.split(',').count()
        );
        // 1 + 2 nodes per system.
        assert_eq!(std::fs::read_to_string(&nodes).unwrap().lines().count(), 7);
        let mut args = base.to_vec();
        args.push("--json");
        let out = go(&args).unwrap();
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["runs"].as_array().unwrap().len(), 4);
        assert_eq!(v["runs"][3]["system"], "Cyclone");
        assert_eq!(v["workload"]["requests"], 1500);
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let e = go(&["sim", "cyclone", "--systems", "LARD"]).unwrap_err();
        assert!(e.to_string().contains("unknown system"), "{e}");
        let e = go(&["sim", "cyclone", "--link-mbps", "0"]).unwrap_err();
        assert!(e.to_string().contains("link rate"), "{e}");
        assert!(go(&["sim", "cyclone", "--scale", "3"]).is_err());
    }
}
