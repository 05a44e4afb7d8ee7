//! Sweeps: many runs (series × cluster sizes) in one call, spread over threads, and the series
//! of seed 003 §6.1 (Figs. 7 and 8).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;
use switchyard_policy::PolicyKind;

use crate::config::{RequestDistribution, SimConfig};
use crate::report::RunResult;
use crate::sim::simulate;
use crate::workload::{Http, SimWorkload};
use crate::SimError;

/// One curve of a throughput-versus-nodes figure: a policy, a mechanism and an HTTP shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Series {
    /// Name in legends and CSV files.
    pub name: String,
    /// Dispatching policy.
    #[serde(serialize_with = "policy_name")]
    pub policy: PolicyKind,
    /// RequestDistribution.
    pub mechanism: RequestDistribution,
    /// HTTP shape of the workload.
    pub http: Http,
}

fn policy_name<S: serde::Serializer>(k: &PolicyKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(k.as_str())
}

impl fmt::Display for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// WRR over HTTP/1.0 with single handoff.
pub const WRR: &str = "WRR";
/// WRR over HTTP/1.1 with single handoff.
pub const WRR_PHTTP: &str = "WRR-PHTTP";
/// LARD over HTTP/1.0 with single handoff (seed 003 §6.1 item 1).
pub const SIMPLE_LARD: &str = "simple-LARD";
/// LARD over HTTP/1.1 with single handoff (item 2).
pub const SIMPLE_LARD_PHTTP: &str = "simple-LARD-PHTTP";
/// Extended LARD with multiple handoff (item 3).
pub const MULTI_HANDOFF: &str = "multiHandoff-extLARD-PHTTP";
/// Extended LARD with back-end forwarding (item 4).
pub const BE_FORWARD: &str = "BEforward-extLARD-PHTTP";
/// Extended LARD with the zero-cost ideal handoff (item 5).
pub const ZERO_COST: &str = "zeroCost-extLARD-PHTTP";
/// Extended LARD behind a relaying front end (seed 003 §3.1, §6.1 last paragraph).
pub const RELAY: &str = "relay-extLARD-PHTTP";

impl Series {
    /// A series.
    pub fn new(name: &str, policy: PolicyKind, mechanism: RequestDistribution, http: Http) -> Self {
        Series {
            name: name.to_owned(),
            policy,
            mechanism,
            http,
        }
    }

    /// The curves of seed 003 Figs. 7 and 8 (and the relaying front end of §6.1).
    pub fn paper() -> Vec<Series> {
        use PolicyKind::*;
        use RequestDistribution::*;
        vec![
            Series::new(ZERO_COST, ExtLard, Ideal, Http::V11),
            Series::new(RELAY, ExtLard, Relay, Http::V11),
            Series::new(MULTI_HANDOFF, ExtLard, Handoff, Http::V11),
            Series::new(BE_FORWARD, ExtLard, Forward, Http::V11),
            Series::new(SIMPLE_LARD, Lard, Single, Http::V10),
            Series::new(SIMPLE_LARD_PHTTP, Lard, Single, Http::V11),
            Series::new(WRR, Wrr, Single, Http::V10),
            Series::new(WRR_PHTTP, Wrr, Single, Http::V11),
        ]
    }

    /// Parses a list of series: `paper` (all of [`Series::paper`]), a paper series name, or
    /// `policy:mechanism:http` (e.g. `lard-r:single:1.0`), comma separated.
    pub fn parse_list(s: &str) -> Result<Vec<Series>, SimError> {
        let mut out = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if item.eq_ignore_ascii_case("paper") {
                out.extend(Series::paper());
                continue;
            }
            if let Some(p) = Series::paper()
                .into_iter()
                .find(|p| p.name.eq_ignore_ascii_case(item))
            {
                out.push(p);
                continue;
            }
            let parts: Vec<&str> = item.split(':').collect();
            if parts.len() != 3 {
                return Err(SimError::Config(format!(
                    "series `{item}`: expected `paper`, a paper series name or policy:mechanism:http"
                )));
            }
            let policy: PolicyKind = parts[0].parse()?;
            out.push(Series::new(
                item,
                policy,
                parts[1].parse()?,
                parts[2].parse()?,
            ));
        }
        if out.is_empty() {
            return Err(SimError::Config("no series given".into()));
        }
        Ok(out)
    }
}

/// The runs of a sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Everything but nodes, policy and mechanism, which each run sets.
    pub base: SimConfig,
    /// The curves.
    pub series: Vec<Series>,
    /// Cluster sizes.
    pub nodes: Vec<u32>,
    /// Worker threads (0: one per available core).
    pub threads: usize,
}

impl Sweep {
    /// The configuration of one run.
    pub fn config(&self, series: &Series, nodes: u32) -> SimConfig {
        let mut c = self.base.clone();
        c.nodes = nodes;
        c.policy.name = series.policy;
        c.mechanism = series.mechanism;
        c
    }

    /// Runs every (series, nodes) pair; results in series order, then nodes order, labelled with
    /// the series name. `w10` and `w11` are the HTTP/1.0 and HTTP/1.1 shapes of the workload
    /// (only those the series use are read).
    pub fn run(&self, w10: &SimWorkload, w11: &SimWorkload) -> Result<Vec<RunResult>, SimError> {
        let jobs: Vec<(&Series, u32)> = self
            .series
            .iter()
            .flat_map(|s| self.nodes.iter().map(move |&n| (s, n)))
            .collect();
        let configs: Vec<SimConfig> = jobs.iter().map(|(s, n)| self.config(s, *n)).collect();
        for c in &configs {
            c.validate()?;
        }
        let threads = match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
        .clamp(1, jobs.len().max(1));
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Result<RunResult, SimError>>>> =
            Mutex::new((0..jobs.len()).map(|_| None).collect());
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= jobs.len() {
                        break;
                    }
                    let (series, _) = jobs[i];
                    let w = match series.http {
                        Http::V10 => w10,
                        Http::V11 => w11,
                    };
                    let r = simulate(&configs[i], w).map(|mut r| {
                        r.label = series.name.clone();
                        r
                    });
                    results.lock().expect("no worker panics")[i] = Some(r);
                });
            }
        });
        results
            .into_inner()
            .expect("no worker panics")
            .into_iter()
            .map(|r| r.expect("every job ran"))
            .collect()
    }
}

/// The run of `series` at `nodes` among `runs`.
pub fn find<'a>(runs: &'a [RunResult], series: &str, nodes: u32) -> Option<&'a RunResult> {
    runs.iter().find(|r| r.label == series && r.nodes == nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_lists() {
        assert_eq!(Series::parse_list("paper").unwrap().len(), 8);
        let s = Series::parse_list("simple-lard, lard-r:single:1.0").unwrap();
        assert_eq!(s[0].name, SIMPLE_LARD);
        assert_eq!(s[1].policy, PolicyKind::LardR);
        assert_eq!(s[1].http, Http::V10);
        assert!(Series::parse_list("lard:warp:1.0").is_err());
        assert!(Series::parse_list("nope").is_err());
        assert!(Series::parse_list("").is_err());
    }
}
