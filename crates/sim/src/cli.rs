//! The `switchyard sim` subcommands.
//!
//! ```text
//! switchyard sim run       [WORKLOAD] [CLUSTER] [--nodes 8] [--policy lard] [--mechanism single]
//!                          [--http 1.0] [--json] [--csv FILE] [--node-csv FILE]
//! switchyard sim sweep     [WORKLOAD] [CLUSTER] [--nodes 1,2,4,8] [--series paper] [--svg FILE] …
//! switchyard sim crossover [CLUSTER] [--sizes-kb 1,2,4,…] [--svg FILE] [--csv FILE] [--json]
//! switchyard sim paper     [WORKLOAD] [CLUSTER] --out DIR [--nodes …] [--presets apache,flash]
//! switchyard sim cyclone   [--trace FILE | --scale 0.01 …] [--nodes 1,2,4,8] [--systems all]
//!                          [--json] [--csv FILE] [--node-csv FILE]
//! ```
//!
//! WORKLOAD is a Common/Combined Log Format trace (`--trace FILE`) or, by default, the synthetic
//! trace shaped like seed 003's (`--scale`, `--requests`, `--seed`, `--zipf-alpha`). CLUSTER is
//! the cost preset and any cost, cache, client and policy setting. With `--json` a command prints
//! exactly one JSON object on one line.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use serde::Serialize;
use switchyard_policy::PolicyKind;
use switchyard_trace::{synthesize, SessionConfig, TargetKey, Workload};

use crate::analysis::{crossover, crossover_chart, CrossoverSpec};
use crate::config::{Pipelining, Preset, RequestDistribution, SimConfig, DEFAULT_CACHE_BYTES};
use crate::paper::{findings_markdown, run_paper, write_dir, PaperSpec};
use crate::plot::{svg, throughput_chart};
use crate::report::{describe, write_nodes_csv, write_runs_csv};
use crate::sim::simulate;
use crate::sweep::{Series, Sweep};
use crate::workload::{seed003_synth, Http, SimWorkload, Targets, WorkloadSummary};
use crate::SimError;

/// `switchyard sim …`
#[derive(Clone, Debug, clap::Subcommand)]
pub enum SimCommand {
    /// Simulate one cluster on a workload: throughput, hit rate, CPU and disk idle per node.
    Run(RunArgs),
    /// Throughput versus cluster size for several policy/mechanism series (seed 003 Figs. 7–8).
    Sweep(SweepArgs),
    /// Multiple handoff versus back-end forwarding by response size (seed 003 Figs. 5–6).
    Crossover(CrossoverArgs),
    /// Reproduce seed 003 §5–§6: Figs. 5–8 and the paper's findings, written to a directory.
    Paper(PaperArgs),
    /// Cooperative clusters without a front end (seed 000 §5): RR, CF-LRU, CF-LFU, CF-REP, SC and
    /// Cyclone at several cluster sizes: throughput, efficiency, hit rates, balance.
    Cyclone(crate::cyclone_cli::CycloneArgs),
}

/// Where the requests come from.
#[derive(Clone, Debug, Args)]
pub struct WorkloadArgs {
    /// Access log (Common or Combined Log Format) to replay; default: a synthetic trace.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Tell targets apart by path and query string (default: path only).
    #[arg(long)]
    pub keep_query: bool,
    /// Size of the synthetic trace relative to seed 003's (31,000 targets, 1.015 GB); the
    /// default cache size is scaled alike.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Requests in the synthetic trace (default 1,000,000 × scale).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Seed of the synthetic trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Zipf exponent of the synthetic trace's page popularity.
    #[arg(long, default_value_t = crate::workload::SEED003_ZIPF_ALPHA)]
    pub zipf_alpha: f64,
    /// Most page views in one synthetic session (seed 004 Table 1 draws 3.86 on average).
    #[arg(long)]
    pub max_pages_per_session: Option<u32>,
    /// Most embedded objects on one synthetic page.
    #[arg(long)]
    pub max_embedded: Option<u32>,
    /// HTTP/1.1 grouping: a gap of at least this many seconds closes a connection.
    #[arg(long, default_value_t = 15)]
    pub gap_secs: i64,
    /// HTTP/1.1 grouping: a gap of at least this many seconds starts a new pipelined batch.
    #[arg(long, default_value_t = 5)]
    pub batch_secs: i64,
}

/// Costs, caches, clients and policy settings.
#[derive(Clone, Debug, Args)]
pub struct ClusterArgs {
    /// CPU cost preset (seed 003 §6).
    #[arg(long, value_enum, default_value_t = Preset::Apache)]
    pub preset: Preset,
    /// Connection establishment, µs (overrides the preset).
    #[arg(long)]
    pub connect_us: Option<f64>,
    /// Connection teardown, µs.
    #[arg(long)]
    pub teardown_us: Option<f64>,
    /// Per-request CPU, µs.
    #[arg(long)]
    pub request_us: Option<f64>,
    /// Transmit CPU per 512 bytes, µs.
    #[arg(long)]
    pub transmit_us: Option<f64>,
    /// Multiple handoff: CPU on the receiving node, µs.
    #[arg(long)]
    pub handoff_us: Option<f64>,
    /// Back-end forwarding: per-request CPU on the handling node, µs.
    #[arg(long)]
    pub forward_request_us: Option<f64>,
    /// Back-end forwarding: CPU per 512 bytes relayed by the handling node, µs.
    #[arg(long)]
    pub forward_us: Option<f64>,
    /// Disk positioning per read, µs.
    #[arg(long)]
    pub disk_seek_us: Option<f64>,
    /// Disk transfer per 4 KB, µs.
    #[arg(long)]
    pub disk_per_4k_us: Option<f64>,
    /// Front end: CPU per connection, µs (default 0: the front end is never a bottleneck).
    #[arg(long, default_value_t = 0.0)]
    pub frontend_connection_us: f64,
    /// Front end: CPU per request dispatched, µs.
    #[arg(long, default_value_t = 0.0)]
    pub frontend_request_us: f64,
    /// Front end: CPU per handoff, µs.
    #[arg(long, default_value_t = 0.0)]
    pub frontend_handoff_us: f64,
    /// Relaying front end: CPU per 512 bytes relayed, µs.
    #[arg(long, default_value_t = 0.0)]
    pub frontend_relay_us: f64,
    /// Cache budget per node in bytes (default 85 MB × scale).
    #[arg(long)]
    pub cache_bytes: Option<u64>,
    /// Cache replacement policy: lru, lfu or gdsf.
    #[arg(long, default_value = "lru")]
    pub cache_policy: String,
    /// Largest object a node caches, bytes (default: any that fits).
    #[arg(long)]
    pub cache_max_object: Option<u64>,
    /// Client connections open at once (default: L_idle per node).
    #[arg(long)]
    pub clients: Option<u32>,
    /// Requests completed before measuring starts.
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// How a node works through a pipelined batch.
    #[arg(long, value_enum, default_value_t = Pipelining::Concurrent)]
    pub pipelining: Pipelining,
    /// LARD family: L_idle.
    #[arg(long)]
    pub l_idle: Option<u32>,
    /// LARD family: L_overload.
    #[arg(long)]
    pub l_overload: Option<u32>,
    /// LARD family: MissCost.
    #[arg(long)]
    pub miss_cost: Option<u32>,
    /// ext-lard: disk queue below which the handling node reads a target itself.
    #[arg(long)]
    pub disk_queue_threshold: Option<u32>,
}

/// `switchyard sim run`
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub cluster: ClusterArgs,
    /// Back-end nodes.
    #[arg(long, default_value_t = 8)]
    pub nodes: u32,
    /// Dispatching policy: rr wrr lc chash lard lard-r ext-lard cap.
    #[arg(long, default_value = "lard")]
    pub policy: String,
    /// RequestDistribution: single, handoff, forward, relay, ideal.
    #[arg(long, value_enum, default_value_t = RequestDistribution::Single)]
    pub mechanism: RequestDistribution,
    /// HTTP shape of the workload: 1.0 or 1.1.
    #[arg(long, default_value = "1.0")]
    pub http: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write the run as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write per-node figures as CSV.
    #[arg(long)]
    pub node_csv: Option<PathBuf>,
}

/// `switchyard sim sweep`
#[derive(Clone, Debug, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub cluster: ClusterArgs,
    /// Cluster sizes, comma separated.
    #[arg(long, default_value = "1,2,4,6,8,10,12,14,16")]
    pub nodes: String,
    /// Series: `paper`, paper series names, or policy:mechanism:http, comma separated.
    #[arg(long, default_value = "paper")]
    pub series: String,
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
    /// Write the throughput-versus-nodes chart.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Title of the chart.
    #[arg(long, default_value = "throughput versus cluster size")]
    pub title: String,
}

/// `switchyard sim crossover`
#[derive(Clone, Debug, Args)]
pub struct CrossoverArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub cluster: ClusterArgs,
    /// Back-end nodes (the paper uses 4).
    #[arg(long, default_value_t = 4)]
    pub nodes: u32,
    /// Response sizes in KB, comma separated (default 1–32 KB).
    #[arg(long)]
    pub sizes_kb: Option<String>,
    /// Requests per connection.
    #[arg(long, default_value_t = 5)]
    pub requests_per_connection: u32,
    /// Connections simulated per size.
    #[arg(long, default_value_t = 3000)]
    pub connections: u32,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write the chart.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write the points as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

/// `switchyard sim paper`
#[derive(Clone, Debug, Args)]
pub struct PaperArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub cluster: ClusterArgs,
    /// Directory for results.json, findings.md, CSV files and SVG charts.
    #[arg(long)]
    pub out: PathBuf,
    /// Cluster sizes, comma separated.
    #[arg(long, default_value = "1,2,4,6,8,10,12,14,16")]
    pub nodes: String,
    /// Cost presets, comma separated.
    #[arg(long, default_value = "apache,flash")]
    pub presets: String,
    /// Worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Connections per response size in the crossover simulation (0 skips it).
    #[arg(long, default_value_t = 3000)]
    pub crossover_connections: u32,
    /// Print one JSON object (the whole report) instead of the findings.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn parse_list<T: std::str::FromStr>(s: &str, what: &str) -> Result<Vec<T>, SimError> {
    let v: Result<Vec<T>, _> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(str::parse)
        .collect();
    match v {
        Ok(v) if !v.is_empty() => Ok(v),
        _ => Err(SimError::Config(format!("invalid list of {what}: `{s}`"))),
    }
}

/// The loaded workload in both shapes.
struct Loaded {
    trace: Workload,
    targets: std::sync::Arc<Targets>,
    session: SessionConfig,
    source: String,
}

impl Loaded {
    fn shape(&self, http: Http) -> SimWorkload {
        SimWorkload::with_targets(self.targets.clone(), &self.trace, http, &self.session)
    }
}

fn load(w: &WorkloadArgs) -> Result<Loaded, SimError> {
    if !(w.scale.is_finite() && w.scale > 0.0 && w.scale <= 1.0) {
        return Err(SimError::Config(format!(
            "scale must be in (0, 1], got {}",
            w.scale
        )));
    }
    if w.gap_secs <= 0 || w.batch_secs <= 0 {
        return Err(SimError::Config(
            "gap and batch seconds must be positive".into(),
        ));
    }
    let session = SessionConfig {
        gap_secs: w.gap_secs,
        batch_secs: w.batch_secs,
    };
    let (trace, source) = match &w.trace {
        Some(path) => {
            let key = if w.keep_query {
                TargetKey::Full
            } else {
                TargetKey::Path
            };
            let (trace, _report) = Workload::open(path, key)?;
            (trace, path.display().to_string())
        }
        None => {
            let requests = w
                .requests
                .unwrap_or(((1_000_000.0 * w.scale).round() as u64).max(1));
            let mut cfg = seed003_synth(w.scale, requests, w.seed);
            cfg.zipf_alpha = w.zipf_alpha;
            if let Some(m) = w.max_pages_per_session {
                cfg.max_pages_per_session = m;
            }
            if let Some(m) = w.max_embedded {
                cfg.max_embedded = m;
            }
            let s = synthesize(&cfg)?;
            (
                s.workload,
                format!(
                    "synthetic (seed 003 shape, scale {}, seed {}, zipf {})",
                    w.scale, w.seed, w.zipf_alpha
                ),
            )
        }
    };
    if trace.requests.is_empty() {
        return Err(SimError::Workload("the trace has no requests".into()));
    }
    Ok(Loaded {
        targets: std::sync::Arc::new(Targets::of(&trace)),
        trace,
        session,
        source,
    })
}

fn base_config(c: &ClusterArgs, scale: f64) -> Result<SimConfig, SimError> {
    let mut cfg =
        SimConfig::new(1, PolicyKind::Lard, RequestDistribution::Single).with_preset(c.preset);
    let mut custom = false;
    let mut set = |slot: &mut f64, v: Option<f64>| {
        if let Some(v) = v {
            *slot = v;
            custom = true;
        }
    };
    set(&mut cfg.cpu.connect_us, c.connect_us);
    set(&mut cfg.cpu.teardown_us, c.teardown_us);
    set(&mut cfg.cpu.request_us, c.request_us);
    set(&mut cfg.cpu.transmit_per_512_us, c.transmit_us);
    set(&mut cfg.cpu.handoff_us, c.handoff_us);
    set(&mut cfg.cpu.forward_request_us, c.forward_request_us);
    set(&mut cfg.cpu.forward_per_512_us, c.forward_us);
    if custom {
        cfg.preset = format!("{}+custom", c.preset);
    }
    if let Some(v) = c.disk_seek_us {
        cfg.disk.seek_us = v;
    }
    if let Some(v) = c.disk_per_4k_us {
        cfg.disk.per_4k_us = v;
    }
    cfg.frontend.connection_us = c.frontend_connection_us;
    cfg.frontend.request_us = c.frontend_request_us;
    cfg.frontend.handoff_us = c.frontend_handoff_us;
    cfg.frontend.relay_per_512_us = c.frontend_relay_us;
    cfg.cache_bytes = c
        .cache_bytes
        .unwrap_or(((DEFAULT_CACHE_BYTES as f64) * scale).round() as u64);
    cfg.cache_policy = c
        .cache_policy
        .parse()
        .map_err(|e| SimError::Config(format!("cache policy: {e}")))?;
    cfg.cache_max_object_bytes = c.cache_max_object;
    cfg.clients = c.clients;
    cfg.warmup_requests = c.warmup;
    cfg.pipelining = c.pipelining;
    if let Some(v) = c.l_idle {
        cfg.policy.l_idle = v;
    }
    if let Some(v) = c.l_overload {
        cfg.policy.l_overload = v;
    }
    if let Some(v) = c.miss_cost {
        cfg.policy.miss_cost = v;
    }
    if let Some(v) = c.disk_queue_threshold {
        cfg.policy.disk_queue_threshold = v;
    }
    cfg.validate()?;
    Ok(cfg)
}

pub(crate) fn write_to(
    path: &Path,
    f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), SimError> {
    let wrap = |source| SimError::Write {
        path: path.to_owned(),
        source,
    };
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(wrap)?);
    f(&mut file).map_err(wrap)?;
    file.flush().map_err(wrap)
}

#[derive(Serialize)]
struct RunOutput<'a> {
    source: &'a str,
    workload: WorkloadSummary,
    run: &'a crate::RunResult,
    wall_secs: f64,
}

#[derive(Serialize)]
struct SweepOutput<'a> {
    source: &'a str,
    workload_http10: Option<WorkloadSummary>,
    workload_http11: Option<WorkloadSummary>,
    runs: &'a [crate::RunResult],
    wall_secs: f64,
}

fn summary_line(s: &WorkloadSummary) -> String {
    format!(
        "HTTP/{}: {} requests on {} connections ({} batches), {} targets, {:.1} MB, mean response {:.0} B, 97/98/99 % of requests in {:.0}/{:.0}/{:.0} MB",
        s.http,
        s.requests,
        s.connections,
        s.batches,
        s.targets,
        s.target_bytes as f64 / 1e6,
        s.mean_response_bytes,
        s.memory_for_97_98_99[0] as f64 / 1e6,
        s.memory_for_97_98_99[1] as f64 / 1e6,
        s.memory_for_97_98_99[2] as f64 / 1e6
    )
}

/// Runs a `switchyard sim` subcommand, writing its report to `out`.
pub fn run(cmd: &SimCommand, out: &mut dyn Write) -> Result<(), SimError> {
    match cmd {
        SimCommand::Run(a) => run_one(a, out),
        SimCommand::Sweep(a) => run_sweep(a, out),
        SimCommand::Crossover(a) => run_crossover(a, out),
        SimCommand::Paper(a) => run_paper_cmd(a, out),
        SimCommand::Cyclone(a) => crate::cyclone_cli::run(a, out),
    }
}

fn run_one(a: &RunArgs, out: &mut dyn Write) -> Result<(), SimError> {
    let mut cfg = base_config(&a.cluster, a.workload.scale)?;
    cfg.nodes = a.nodes;
    cfg.policy.name = a.policy.parse()?;
    cfg.mechanism = a.mechanism;
    let http: Http = a.http.parse()?;
    let loaded = load(&a.workload)?;
    let w = loaded.shape(http);
    let start = Instant::now();
    let r = simulate(&cfg, &w)?;
    let wall = start.elapsed().as_secs_f64();
    if let Some(p) = &a.csv {
        write_to(p, |f| write_runs_csv(f, std::slice::from_ref(&r)))?;
    }
    if let Some(p) = &a.node_csv {
        write_to(p, |f| write_nodes_csv(f, std::slice::from_ref(&r)))?;
    }
    if a.json {
        let o = RunOutput {
            source: &loaded.source,
            workload: w.summary(),
            run: &r,
            wall_secs: wall,
        };
        serde_json::to_writer(&mut *out, &o)?;
        writeln!(out)?;
    } else {
        writeln!(out, "workload: {}", loaded.source)?;
        writeln!(out, "  {}", summary_line(&w.summary()))?;
        write!(out, "{}", describe(&r))?;
        writeln!(out, "  simulated in {wall:.2} s")?;
    }
    Ok(())
}

fn run_sweep(a: &SweepArgs, out: &mut dyn Write) -> Result<(), SimError> {
    let base = base_config(&a.cluster, a.workload.scale)?;
    let series = Series::parse_list(&a.series)?;
    let nodes: Vec<u32> = parse_list(&a.nodes, "node counts")?;
    let loaded = load(&a.workload)?;
    let (need10, need11) = (
        series.iter().any(|s| s.http == Http::V10),
        series.iter().any(|s| s.http == Http::V11),
    );
    let needs = |h: Http| if h == Http::V10 { need10 } else { need11 };
    let empty = |h| SimWorkload::from_connections(loaded.targets.clone(), h, &[]);
    let w10 = if needs(Http::V10) {
        loaded.shape(Http::V10)
    } else {
        empty(Http::V10)?
    };
    let w11 = if needs(Http::V11) {
        loaded.shape(Http::V11)
    } else {
        empty(Http::V11)?
    };
    let sweep = Sweep {
        base,
        series,
        nodes,
        threads: a.threads,
    };
    let start = Instant::now();
    let runs = sweep.run(&w10, &w11)?;
    let wall = start.elapsed().as_secs_f64();
    if let Some(p) = &a.csv {
        write_to(p, |f| write_runs_csv(f, &runs))?;
    }
    if let Some(p) = &a.node_csv {
        write_to(p, |f| write_nodes_csv(f, &runs))?;
    }
    if let Some(p) = &a.svg {
        let chart = throughput_chart(&a.title, &runs);
        write_to(p, |f| f.write_all(svg(&chart).as_bytes()))?;
    }
    if a.json {
        let o = SweepOutput {
            source: &loaded.source,
            workload_http10: needs(Http::V10).then(|| w10.summary()),
            workload_http11: needs(Http::V11).then(|| w11.summary()),
            runs: &runs,
            wall_secs: wall,
        };
        serde_json::to_writer(&mut *out, &o)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "workload: {}", loaded.source)?;
    for (h, w) in [(Http::V10, &w10), (Http::V11, &w11)] {
        if needs(h) {
            writeln!(out, "  {}", summary_line(&w.summary()))?;
        }
    }
    let mut table = String::new();
    let _ = write!(table, "{:<30}", "throughput (req/s)");
    for n in &sweep.nodes {
        let _ = write!(table, "{n:>9}");
    }
    table.push('\n');
    for s in &sweep.series {
        let _ = write!(table, "{:<30}", s.name);
        for &n in &sweep.nodes {
            let t = crate::sweep::find(&runs, &s.name, n).map_or(f64::NAN, |r| r.throughput);
            let _ = write!(table, "{t:>9.0}");
        }
        table.push('\n');
    }
    write!(out, "{table}")?;
    writeln!(out, "{} runs in {wall:.1} s", runs.len())?;
    Ok(())
}

fn run_crossover(a: &CrossoverArgs, out: &mut dyn Write) -> Result<(), SimError> {
    let mut base = base_config(&a.cluster, 1.0)?;
    base.nodes = a.nodes;
    let mut spec = CrossoverSpec::paper(base);
    spec.base.nodes = a.nodes;
    if let Some(c) = a.cluster.clients {
        spec.base.clients = Some(c);
    }
    if let Some(s) = &a.sizes_kb {
        spec.sizes_kb = parse_list(s, "sizes")?;
    }
    spec.requests_per_connection = a.requests_per_connection;
    spec.connections = a.connections.max(10);
    let c = crossover(&spec)?;
    if let Some(p) = &a.svg {
        write_to(p, |f| f.write_all(svg(&crossover_chart(&c)).as_bytes()))?;
    }
    if let Some(p) = &a.csv {
        write_to(p, |f| {
            writeln!(
                f,
                "size_kb,sim_forward_mbps,sim_handoff_mbps,model_forward_mbps,model_handoff_mbps"
            )?;
            for pt in &c.points {
                writeln!(
                    f,
                    "{},{:.3},{:.3},{:.3},{:.3}",
                    pt.size_kb,
                    pt.sim_forward_mbps,
                    pt.sim_handoff_mbps,
                    pt.model_forward_mbps,
                    pt.model_handoff_mbps
                )?;
            }
            Ok(())
        })?;
    }
    if a.json {
        serde_json::to_writer(&mut *out, &c)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{}: {} nodes, {} requests per connection (Mb/s)",
        c.preset, c.nodes, c.requests_per_connection
    )?;
    writeln!(
        out,
        "{:>8} {:>12} {:>12} {:>12} {:>12}",
        "size KB", "forward", "handoff", "fwd model", "hoff model"
    )?;
    for p in &c.points {
        writeln!(
            out,
            "{:>8} {:>12.1} {:>12.1} {:>12.1} {:>12.1}",
            p.size_kb,
            p.sim_forward_mbps,
            p.sim_handoff_mbps,
            p.model_forward_mbps,
            p.model_handoff_mbps
        )?;
    }
    let show = |x: Option<f64>| x.map_or("none".to_owned(), |x| format!("{x:.1} KB"));
    writeln!(
        out,
        "crossover: {} simulated, {} closed form",
        show(c.sim_crossover_kb),
        show(c.model_crossover_kb)
    )?;
    Ok(())
}

fn run_paper_cmd(a: &PaperArgs, out: &mut dyn Write) -> Result<(), SimError> {
    let base = base_config(&a.cluster, a.workload.scale)?;
    let loaded = load(&a.workload)?;
    let (w10, w11) = (loaded.shape(Http::V10), loaded.shape(Http::V11));
    let spec = PaperSpec {
        base,
        nodes: parse_list(&a.nodes, "node counts")?,
        presets: a
            .presets
            .split(',')
            .map(|p| {
                <Preset as clap::ValueEnum>::from_str(p.trim(), true)
                    .map_err(|_| SimError::Config(format!("unknown preset `{p}`")))
            })
            .collect::<Result<_, _>>()?,
        series: Series::paper(),
        threads: a.threads,
        crossover_connections: a.crossover_connections,
    };
    let start = Instant::now();
    let report = run_paper(&spec, &w10, &w11)?;
    write_dir(&report, &a.out)?;
    let wall = start.elapsed().as_secs_f64();
    if a.json {
        serde_json::to_writer(&mut *out, &report)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "workload: {}", loaded.source)?;
    writeln!(out, "  {}", summary_line(&report.workload_http10))?;
    writeln!(out, "  {}", summary_line(&report.workload_http11))?;
    writeln!(out)?;
    write!(out, "{}", findings_markdown(&report))?;
    writeln!(out, "written to {} in {wall:.1} s", a.out.display())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Top {
        #[command(subcommand)]
        cmd: SimCommand,
    }

    #[test]
    fn command_definition_is_consistent() {
        use clap::CommandFactory;
        Top::command().debug_assert();
    }

    fn run_args(args: &[&str]) -> String {
        let top = Top::try_parse_from(args).unwrap();
        let mut out = Vec::new();
        run(&top.cmd, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn run_prints_json_with_every_figure() {
        let out = run_args(&[
            "sim",
            "run",
            "--scale",
            "0.002",
            "--requests",
            "3000",
            "--nodes",
            "2",
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["run"]["nodes"], 2);
        assert_eq!(v["run"]["measured_requests"], 3000);
        assert!(v["run"]["throughput"].as_f64().unwrap() > 0.0);
        assert_eq!(v["run"]["per_node"].as_array().unwrap().len(), 2);
        assert_eq!(v["workload"]["requests"], 3000);
        assert_eq!(out.lines().count(), 1);
    }

    #[test]
    fn sweep_writes_csv_and_svg() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("runs.csv");
        let svg = dir.path().join("t.svg");
        let out = run_args(&[
            "sim",
            "sweep",
            "--scale",
            "0.002",
            "--requests",
            "2000",
            "--nodes",
            "1,2",
            "--series",
            "simple-LARD,wrr:single:1.1",
            "--csv",
            csv.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ]);
        assert!(out.contains("simple-LARD"), "{out}");
        let text = std::fs::read_to_string(&csv).unwrap();
        assert_eq!(text.lines().count(), 5);
        assert!(std::fs::read_to_string(&svg)
            .unwrap()
            .contains("wrr:single:1.1"));
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let top = Top::try_parse_from(["sim", "run", "--policy", "fastest"]).unwrap();
        let e = run(&top.cmd, &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("unknown policy"), "{e}");
        let top = Top::try_parse_from(["sim", "run", "--scale", "2"]).unwrap();
        assert!(run(&top.cmd, &mut Vec::new()).is_err());
        let top = Top::try_parse_from(["sim", "sweep", "--nodes", "x"]).unwrap();
        assert!(run(&top.cmd, &mut Vec::new()).is_err());
    }
}
