//! The `switchyard trace` subcommands.
//!
//! ```text
//! switchyard trace stats FILE [--json] [--top N] [--keep-query]
//! switchyard trace sessions FILE [--gap-secs 15] [--batch-secs 5] [--json] [--keep-query]
//! switchyard trace synth --trace FILE [--out-root DIR] [--seed S] [--targets N]
//!                        [--total-bytes SIZE] [--zipf-alpha A] [--requests N] [--clients N] …
//! switchyard trace synth --trace FILE --preset cyclone [--scale 1] [--requests N] [--seed S]
//! switchyard trace root FILE --out-root DIR [--index index.html] [--seed S] [--force] [--json]
//! ```
//!
//! `FILE` may be `-` for standard input. Output is human-readable by
//! default; with `--json` it is exactly one JSON object on one line:
//!
//! * `stats`: `{"file", "parse": ParseReport, …every field of TraceStats}`;
//! * `sessions`: `{"file", "parse": ParseReport, …every field of SessionStats}`;
//! * `synth`: `{"trace", "out_root", "config": SynthConfig, "summary": SynthSummary, "stats": TraceStats}`;
//! * `root`: `{"file", "out_root", "parse": ParseReport, "files", "bytes", "skipped": [[target, reason]]}`.

use std::fmt::Write as _;
use std::io::{self, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::parse::{parse_reader, ParseReport};
use crate::record::TargetKey;
use crate::session::{group_connections, SessionConfig, SessionStats};
use crate::stats::{StatsBuilder, StatsOptions, TraceStats};
use crate::synth::{synthesize, SynthConfig, SynthSummary, DEFAULT_START_TIME};
use crate::time::ClfTime;
use crate::workload::{Workload, WorkloadBuilder};
use crate::TraceError;

/// `switchyard trace …`
#[derive(Clone, Debug, PartialEq, clap::Subcommand)]
pub enum TraceCommand {
    /// Summarize an access log: requests, targets, sizes, concentration of
    /// references, memory to cover 97/98/99% of requests.
    Stats {
        /// Log in Common or Combined Log Format (`-` for standard input).
        file: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// How many of the most requested targets to list.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Tell targets apart by path and query string (default: path only).
        #[arg(long)]
        keep_query: bool,
    },
    /// Group a log's requests into HTTP/1.1 connections and pipelined batches.
    Sessions {
        /// Log in Common or Combined Log Format (`-` for standard input).
        file: PathBuf,
        /// A gap of at least this many seconds closes a connection.
        #[arg(long, default_value_t = 15)]
        gap_secs: u32,
        /// A gap of at least this many seconds starts a new pipelined batch.
        #[arg(long, default_value_t = 5)]
        batch_secs: u32,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Tell targets apart by path and query string (default: path only).
        #[arg(long)]
        keep_query: bool,
    },
    /// Generate a synthetic site (document root) and a trace of sessions on it.
    Synth {
        /// Where to write the document root (must be absent or empty unless --force).
        #[arg(long)]
        out_root: Option<PathBuf>,
        /// Where to write the trace (Common Log Format).
        #[arg(long)]
        trace: PathBuf,
        /// Seed: the same seed gives the same bytes.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// A site shaped like a paper's: `cyclone` (seed 000 §5.1: 74,820 files, 650 MB,
        /// Zipf 1.2 popularity, 20,000 clients) times --scale. Sets the files, their size, the
        /// popularity, the clients and the session rate.
        #[arg(long, value_parser = ["cyclone"], conflicts_with_all = ["targets", "total_bytes", "zipf_alpha", "clients", "session_interarrival"])]
        preset: Option<String>,
        /// Size of the --preset site relative to the paper's, in (0, 1].
        #[arg(long, default_value_t = 1.0, requires = "preset")]
        scale: f64,
        /// Number of files (default 1000 unless --total-bytes is given).
        #[arg(long)]
        targets: Option<u64>,
        /// Total size of the files (suffixes K, M, G, T: powers of 1024).
        #[arg(long, value_parser = parse_size)]
        total_bytes: Option<u64>,
        /// Exponent of the Zipf-like page popularity.
        #[arg(long, default_value_t = 1.0)]
        zipf_alpha: f64,
        /// Requests in the trace.
        #[arg(long, default_value_t = 10_000)]
        requests: u64,
        /// Distinct clients (addresses from 198.18.0.0/15).
        #[arg(long, default_value_t = 100)]
        clients: u32,
        /// Start of the trace, Unix seconds.
        #[arg(long, default_value_t = DEFAULT_START_TIME)]
        start: i64,
        /// Mean time between session starts, seconds.
        #[arg(long, default_value_t = 1.0)]
        session_interarrival: f64,
        /// Largest file size (suffixes K, M, G, T).
        #[arg(long, value_parser = parse_size, default_value = "64M")]
        max_file_bytes: u64,
        /// Write into a non-empty document root (files are overwritten, nothing is deleted).
        #[arg(long)]
        force: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Write a document root for a log: every logged target a file of its logged size (the
    /// largest byte count logged for it), named as a node resolves the target, so that the log
    /// can be replayed against a cluster serving that root.
    Root {
        /// Log in Common or Combined Log Format (`-` for standard input).
        file: PathBuf,
        /// Where to write the document root (must be absent or empty unless --force).
        #[arg(long)]
        out_root: PathBuf,
        /// The index file of a directory target (as the node's `index`).
        #[arg(long, default_value = "index.html")]
        index: String,
        /// Seed of the files' content: the same seed gives the same bytes.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write into a non-empty document root (files are overwritten, nothing is deleted).
        #[arg(long)]
        force: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Parses a size such as `650M`, `1.5G` or `4096` (K, M, G, T are powers of
/// 1024; an optional `B` or `iB` may follow).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let bad = || format!("invalid size {s:?} (examples: 4096, 64K, 650M, 1.5G)");
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(bad);
    }
    let x: f64 = num.parse().map_err(|_| bad())?;
    let v = x * mult as f64;
    if !(0.0..1.8e19).contains(&v) {
        return Err(bad());
    }
    Ok(v.round() as u64)
}

/// A byte count for people: `1.5 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

fn key(keep_query: bool) -> TargetKey {
    if keep_query {
        TargetKey::Full
    } else {
        TargetKey::Path
    }
}

/// Reads `file` (or standard input for `-`) with `f` on each record.
fn read_log(
    file: &Path,
    mut f: impl FnMut(&crate::RecordRef<'_>),
) -> Result<ParseReport, TraceError> {
    if file == Path::new("-") {
        let stdin = io::stdin();
        let mut logs = parse_reader(stdin.lock());
        logs.for_each_record(&mut f)?;
        Ok(logs.into_report())
    } else {
        let mut logs = crate::parse::open_log(file)?;
        logs.for_each_record(&mut f)
            .map_err(|source| TraceError::Read {
                path: file.to_owned(),
                source,
            })?;
        Ok(logs.into_report())
    }
}

#[derive(Serialize)]
struct StatsOutput<'a> {
    file: String,
    parse: &'a ParseReport,
    #[serde(flatten)]
    stats: &'a TraceStats,
}

#[derive(Serialize)]
struct SessionsOutput<'a> {
    file: String,
    parse: &'a ParseReport,
    #[serde(flatten)]
    stats: &'a SessionStats,
}

#[derive(Serialize)]
struct SynthOutput<'a> {
    trace: String,
    out_root: Option<String>,
    config: &'a SynthConfig,
    summary: &'a SynthSummary,
    stats: &'a TraceStats,
}

#[derive(Serialize)]
struct RootOutput<'a> {
    file: String,
    out_root: String,
    parse: &'a ParseReport,
    files: usize,
    bytes: u64,
    skipped: &'a [(String, crate::root::Skipped)],
}

fn json_line(out: &mut dyn Write, value: &impl Serialize) -> Result<(), TraceError> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")?;
    Ok(())
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// Runs a `switchyard trace` subcommand, writing its report to `out`.
pub fn run(cmd: &TraceCommand, out: &mut dyn Write) -> Result<(), TraceError> {
    match cmd {
        TraceCommand::Stats {
            file,
            json,
            top,
            keep_query,
        } => {
            let mut builder = StatsBuilder::new(StatsOptions {
                target_key: key(*keep_query),
                top: *top,
            });
            let report = read_log(file, |r| builder.add(r))?;
            let stats = builder.finish();
            if *json {
                json_line(
                    out,
                    &StatsOutput {
                        file: file.display().to_string(),
                        parse: &report,
                        stats: &stats,
                    },
                )
            } else {
                let mut s = String::new();
                write_parse_human(&mut s, file, &report);
                write_stats_human(&mut s, &stats);
                out.write_all(s.as_bytes())?;
                Ok(())
            }
        }
        TraceCommand::Sessions {
            file,
            gap_secs,
            batch_secs,
            json,
            keep_query,
        } => {
            let mut builder = WorkloadBuilder::new(key(*keep_query));
            let report = read_log(file, |r| builder.add(r))?;
            let workload = builder.finish();
            let config = SessionConfig {
                gap_secs: i64::from(*gap_secs),
                batch_secs: i64::from(*batch_secs),
            };
            let conns = group_connections(&workload, &config);
            let stats = SessionStats::new(&workload, &conns, config);
            if *json {
                json_line(
                    out,
                    &SessionsOutput {
                        file: file.display().to_string(),
                        parse: &report,
                        stats: &stats,
                    },
                )
            } else {
                let mut s = String::new();
                write_parse_human(&mut s, file, &report);
                write_sessions_human(&mut s, &stats);
                out.write_all(s.as_bytes())?;
                Ok(())
            }
        }
        TraceCommand::Synth {
            out_root,
            trace,
            seed,
            preset,
            scale,
            targets,
            total_bytes,
            zipf_alpha,
            requests,
            clients,
            start,
            session_interarrival,
            max_file_bytes,
            force,
            json,
        } => {
            let config = match preset.as_deref() {
                Some("cyclone") => {
                    if !(scale.is_finite() && *scale > 0.0 && *scale <= 1.0) {
                        return Err(TraceError::Config(format!(
                            "--scale must be in (0, 1], got {scale}"
                        )));
                    }
                    SynthConfig {
                        start_time: *start,
                        max_file_bytes: *max_file_bytes,
                        ..SynthConfig::cyclone(
                            *scale,
                            *requests,
                            crate::synth::CYCLONE_ZIPF_ALPHA,
                            *seed,
                        )
                    }
                }
                Some(other) => {
                    return Err(TraceError::Config(format!(
                        "unknown preset `{other}` (known: cyclone)"
                    )))
                }
                None => SynthConfig {
                    seed: *seed,
                    targets: *targets,
                    total_bytes: *total_bytes,
                    zipf_alpha: *zipf_alpha,
                    requests: *requests,
                    clients: *clients,
                    start_time: *start,
                    session_interarrival_secs: *session_interarrival,
                    max_file_bytes: *max_file_bytes,
                    ..SynthConfig::default()
                },
            };
            let synthesis = synthesize(&config)?;
            if let Some(root) = out_root {
                synthesis.write_docroot(root, *force)?;
            }
            synthesis.write_trace(trace)?;
            let summary = synthesis.summary();
            let stats = synthesis.workload.stats(10);
            if *json {
                json_line(
                    out,
                    &SynthOutput {
                        trace: trace.display().to_string(),
                        out_root: out_root.as_ref().map(|p| p.display().to_string()),
                        config: &config,
                        summary: &summary,
                        stats: &stats,
                    },
                )
            } else {
                let mut s = String::new();
                write_synth_human(&mut s, trace, out_root.as_deref(), &summary, &stats);
                out.write_all(s.as_bytes())?;
                Ok(())
            }
        }
        TraceCommand::Root {
            file,
            out_root,
            index,
            seed,
            force,
            json,
        } => {
            let mut builder = WorkloadBuilder::new(TargetKey::Path);
            let report = read_log(file, |r| builder.add(r))?;
            let workload = builder.finish();
            let plan = crate::root::plan_root(&workload, index);
            plan.write(out_root, *seed, *force)?;
            if *json {
                return json_line(
                    out,
                    &RootOutput {
                        file: file.display().to_string(),
                        out_root: out_root.display().to_string(),
                        parse: &report,
                        files: plan.files.len(),
                        bytes: plan.bytes(),
                        skipped: &plan.skipped,
                    },
                );
            }
            let mut s = String::new();
            write_parse_human(&mut s, file, &report);
            let _ = writeln!(s, "root                 {}", out_root.display());
            let _ = writeln!(
                s,
                "files                {} ({} bytes)",
                plan.files.len(),
                plan.bytes()
            );
            let _ = writeln!(s, "targets left out     {}", plan.skipped.len());
            for (target, why) in &plan.skipped {
                let why = match why {
                    crate::root::Skipped::Refused(e) => format!("refused: {e}"),
                    crate::root::Skipped::NameTooLong => "a name is too long".into(),
                    crate::root::Skipped::AlsoADirectory => "other targets lie beneath it".into(),
                };
                let _ = writeln!(s, "  {target}  ({why})");
            }
            out.write_all(s.as_bytes())?;
            Ok(())
        }
    }
}

fn write_parse_human(s: &mut String, file: &Path, r: &ParseReport) {
    let _ = writeln!(s, "file                 {}", file.display());
    let _ = writeln!(
        s,
        "lines                {} ({} records, {} skipped, {} invalid)",
        r.lines,
        r.records,
        r.skipped_total(),
        r.invalid_total()
    );
    let list = |items: Vec<(&str, u64)>| {
        items
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let rows = [
        (
            "skipped",
            list(r.skipped.iter().map(|(k, v)| (k.name(), *v)).collect()),
        ),
        (
            "invalid",
            list(r.invalid.iter().map(|(k, v)| (k.name(), *v)).collect()),
        ),
        (
            "repaired",
            list(r.repaired.iter().map(|(k, v)| (k.name(), *v)).collect()),
        ),
    ];
    for (label, text) in rows {
        if !text.is_empty() {
            let _ = writeln!(s, "  {label:<18} {text}");
        }
    }
    for e in &r.examples {
        let (what, why) = e.kind.names();
        let _ = writeln!(s, "  line {:<13} {what} ({why}): {}", e.line, e.text);
    }
}

fn counts(m: &std::collections::BTreeMap<String, u64>) -> String {
    let mut v: Vec<_> = m.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter()
        .map(|(k, c)| format!("{k} {c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn write_stats_human(s: &mut String, st: &TraceStats) {
    let key = match st.target_key {
        TargetKey::Path => "path",
        TargetKey::Full => "path and query",
    };
    let _ = writeln!(s, "requests             {}", st.requests);
    let _ = writeln!(s, "unique targets       {} (by {key})", st.unique_targets);
    let _ = writeln!(s, "unique clients       {}", st.unique_clients);
    if let (Some(a), Some(b)) = (st.first_time, st.last_time) {
        let _ = writeln!(
            s,
            "time                 {} .. {} ({} s)",
            ClfTime(a),
            ClfTime(b),
            st.span_secs
        );
    }
    let _ = writeln!(
        s,
        "total size           {} ({} bytes; {} targets without a size)",
        human_bytes(st.total_bytes),
        st.total_bytes,
        st.targets_without_size
    );
    let _ = writeln!(
        s,
        "mean size            {:.0} bytes per target, {:.0} bytes per request",
        st.mean_target_bytes, st.mean_request_bytes
    );
    let _ = writeln!(
        s,
        "transferred          {} ({} bytes)",
        human_bytes(st.transferred_bytes),
        st.transferred_bytes
    );
    if !st.concentration.is_empty() {
        let pts: Vec<String> = [1u32, 5, 10, 20, 50]
            .iter()
            .map(|&p| {
                let c = &st.concentration[(p - 1) as usize];
                format!(
                    "{p}% ({}) -> {} of requests, {} of bytes",
                    c.targets,
                    pct(c.requests_share),
                    pct(c.bytes_share)
                )
            })
            .collect();
        let _ = writeln!(s, "concentration        most popular targets:");
        for p in pts {
            let _ = writeln!(s, "                       {p}");
        }
    }
    let cov: Vec<String> = st
        .coverage
        .iter()
        .map(|c| {
            format!(
                "{}%: {} ({} targets)",
                c.requests_percent,
                human_bytes(c.bytes),
                c.targets
            )
        })
        .collect();
    let _ = writeln!(s, "memory to cover      {}", cov.join(", "));
    let _ = writeln!(s, "methods              {}", counts(&st.methods));
    let _ = writeln!(s, "statuses             {}", counts(&st.statuses));
    let _ = writeln!(s, "protocols            {}", counts(&st.protocols));
    if !st.top_targets.is_empty() {
        let _ = writeln!(s, "top targets          requests   share      size  target");
        for t in &st.top_targets {
            let _ = writeln!(
                s,
                "                     {:>8} {:>7} {:>9}  {}",
                t.requests,
                pct(t.requests_share),
                human_bytes(t.bytes),
                t.target
            );
        }
    }
}

fn write_sessions_human(s: &mut String, st: &SessionStats) {
    let _ = writeln!(
        s,
        "grouping             same client, gap < {} s: one connection; gap < {} s: one pipelined batch",
        st.config.gap_secs, st.config.batch_secs
    );
    let _ = writeln!(s, "requests             {}", st.requests);
    let _ = writeln!(s, "clients              {}", st.clients);
    let _ = writeln!(
        s,
        "connections          {} ({} with a single request)",
        st.connections, st.single_request_connections
    );
    let _ = writeln!(
        s,
        "requests/connection  mean {:.2}, max {}",
        st.mean_requests_per_connection, st.max_requests_per_connection
    );
    let _ = writeln!(
        s,
        "batches              {} (mean {:.2} per connection; pipelined batches hold {:.2} requests on average, max {})",
        st.batches, st.mean_batches_per_connection, st.mean_pipelined_batch, st.max_batch
    );
    let _ = writeln!(
        s,
        "connection duration  mean {:.1} s",
        st.mean_connection_secs
    );
    let _ = writeln!(s, "requests per connection:");
    for b in &st.requests_per_connection {
        let range = if b.min == b.max {
            b.min.to_string()
        } else {
            format!("{}-{}", b.min, b.max)
        };
        let _ = writeln!(s, "  {range:>12} {:>10}", b.connections);
    }
}

fn write_synth_human(
    s: &mut String,
    trace: &Path,
    root: Option<&Path>,
    sum: &SynthSummary,
    st: &TraceStats,
) {
    let _ = writeln!(
        s,
        "trace                {} ({} requests)",
        trace.display(),
        sum.requests
    );
    match root {
        Some(r) => {
            let _ = writeln!(s, "document root        {}", r.display());
        }
        None => {
            let _ = writeln!(s, "document root        (not written)");
        }
    }
    let _ = writeln!(
        s,
        "site                 {} files ({} pages, {} objects), {} ({} bytes), largest {}",
        sum.files,
        sum.pages,
        sum.objects,
        human_bytes(sum.site_bytes),
        sum.site_bytes,
        human_bytes(sum.largest_file)
    );
    let _ = writeln!(
        s,
        "sessions             {} ({} page views), seed {}",
        sum.sessions, sum.page_views, sum.seed
    );
    if let (Some(a), Some(b)) = (sum.first_time, sum.last_time) {
        let _ = writeln!(s, "time                 {} .. {}", ClfTime(a), ClfTime(b));
    }
    let _ = writeln!(
        s,
        "requested            {} targets, {} ({} of requests to the top 10%)",
        st.unique_targets,
        human_bytes(st.total_bytes),
        pct(st.top10_share)
    );
    let cov: Vec<String> = st
        .coverage
        .iter()
        .map(|c| format!("{}%: {}", c.requests_percent, human_bytes(c.bytes)))
        .collect();
    let _ = writeln!(s, "memory to cover      {}", cov.join(", "));
}

/// Reads a whole log into a [`Workload`] (`-` for standard input).
pub fn load_workload(
    file: &Path,
    target_key: TargetKey,
) -> Result<(Workload, ParseReport), TraceError> {
    if file == Path::new("-") {
        let stdin = io::stdin();
        Ok(Workload::from_reader(
            BufReader::new(stdin.lock()),
            target_key,
        )?)
    } else {
        Workload::open(file, target_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct App {
        #[command(subcommand)]
        cmd: TraceCommand,
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65_536));
        assert_eq!(parse_size("650M"), Ok(650 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("10kB"), Ok(10_240));
        assert!(parse_size("x").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999T").is_err());
        assert_eq!(human_bytes(5), "5 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(650 << 20), "650.0 MiB");
    }

    #[test]
    fn parses_arguments() {
        let app = App::try_parse_from(["t", "stats", "log", "--json", "--top", "3"]).unwrap();
        assert_eq!(
            app.cmd,
            TraceCommand::Stats {
                file: "log".into(),
                json: true,
                top: 3,
                keep_query: false
            }
        );
        let app = App::try_parse_from(["t", "sessions", "-", "--gap-secs", "20"]).unwrap();
        assert!(matches!(
            app.cmd,
            TraceCommand::Sessions {
                gap_secs: 20,
                batch_secs: 5,
                ..
            }
        ));
        let app = App::try_parse_from([
            "t",
            "synth",
            "--trace",
            "t.log",
            "--total-bytes",
            "1M",
            "--zipf-alpha",
            "0.8",
        ])
        .unwrap();
        match app.cmd {
            TraceCommand::Synth {
                total_bytes,
                zipf_alpha,
                max_file_bytes,
                targets,
                ..
            } => {
                assert_eq!(total_bytes, Some(1 << 20));
                assert_eq!(zipf_alpha, 0.8);
                assert_eq!(max_file_bytes, 64 << 20);
                assert_eq!(targets, None);
            }
            c => panic!("{c:?}"),
        }
        assert!(App::try_parse_from(["t", "synth"]).is_err());
    }

    #[test]
    fn root_writes_the_logged_sizes_and_reports_what_it_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.log");
        std::fs::write(
            &log,
            "h - - [01/Jun/1995:00:00:59 -0600] \"GET /a/b.gif\" 200 10\n\
             h - - [01/Jun/1995:00:01:00 -0600] \"GET /a/b.gif?x=1 HTTP/1.0\" 200 30\n\
             h - - [01/Jun/1995:00:01:01 -0600] \"GET /a/ HTTP/1.0\" 200 5\n\
             h - - [01/Jun/1995:00:01:02 -0600] \"GET /../x HTTP/1.0\" 400 -\n",
        )
        .unwrap();
        let root = dir.path().join("root");
        let cmd = App::try_parse_from([
            "t",
            "root",
            log.to_str().unwrap(),
            "--out-root",
            root.to_str().unwrap(),
            "--json",
        ])
        .unwrap()
        .cmd;
        let mut out = Vec::new();
        run(&cmd, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (v["files"].as_u64(), v["bytes"].as_u64()),
            (Some(2), Some(35))
        );
        assert_eq!(v["skipped"][0][0], "/../x");
        assert_eq!(std::fs::metadata(root.join("a/b.gif")).unwrap().len(), 30);
        assert_eq!(
            std::fs::metadata(root.join("a/index.html")).unwrap().len(),
            5
        );
        // The root is not empty any more: a second run refuses it.
        let e = run(&cmd, &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("not empty"), "{e}");
    }

    #[test]
    fn stats_json_is_one_object() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.log");
        std::fs::write(
            &log,
            "h - - [01/Jun/1995:00:00:59 -0600] \"GET /a\" 200 10\nbad\n",
        )
        .unwrap();
        let mut out = Vec::new();
        run(
            &TraceCommand::Stats {
                file: log.clone(),
                json: true,
                top: 5,
                keep_query: false,
            },
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["requests"], 1);
        assert_eq!(v["parse"]["invalid"]["missing_timestamp"], 1);
        assert_eq!(v["coverage"][0]["requests_percent"], 97);

        let mut out = Vec::new();
        run(
            &TraceCommand::Stats {
                file: log.clone(),
                json: false,
                top: 5,
                keep_query: false,
            },
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("missing_timestamp 1"), "{text}");
        assert!(text.contains("requests             1"), "{text}");

        let err = run(
            &TraceCommand::Stats {
                file: dir.path().join("missing.log"),
                json: true,
                top: 5,
                keep_query: false,
            },
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(matches!(err, TraceError::Read { .. }), "{err}");
    }
}
