//! Workload statistics, computed in one streaming pass.
//!
//! Definitions (seed 000 §5.1, seed 003 §6):
//!
//! * a **target** is identified by its [`TargetKey`] (the path by default);
//! * a target's **size** is the largest byte count logged for it: partial
//!   (206), not-modified (304) and aborted responses log fewer bytes or `-`,
//!   the largest one is the best estimate of the whole document;
//! * **total bytes** is the sum of target sizes (the memory to hold every
//!   requested target once); the **mean target size** divides it by the
//!   number of targets, the **mean request size** weighs each target's size by
//!   its requests (the "average size of the requested documents");
//! * **concentration of references**: targets sorted by decreasing request
//!   count (ties: smaller first, then by name); the share of requests (and of
//!   bytes) that go to the most popular *p* % of targets, *p* = 1…100, is the
//!   cumulative curve of seed 000 Fig. 10; the most popular *p* % are the
//!   first ⌈*p*·n/100⌉ targets. `top10_share` is the point *p* = 10;
//! * **coverage**: the memory needed to cover 97/98/99 % of requests is the
//!   total size of the shortest prefix of that order whose requests reach
//!   ⌈*q*·requests/100⌉ (seed 003 §6: "526/619/745 MB of memory to cover
//!   97/98/99% of all requests"). This is what a frequency-ordered cache
//!   holding exactly those targets would need.

use std::collections::BTreeMap;
use std::io::{self, BufRead};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hash::{FxMap, FxSet};
use crate::parse::{open_log, parse_reader, ParseReport};
use crate::record::{RecordRef, TargetKey};
use crate::TraceError;

/// The request shares for which [`TraceStats::coverage`] is computed.
pub const COVERAGE_PERCENTS: [u32; 3] = [97, 98, 99];

/// Distinct method or protocol labels kept before the rest are counted as `(other)`.
const MAX_LABELS: usize = 64;

/// Options for [`StatsBuilder`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsOptions {
    /// What identifies a target.
    pub target_key: TargetKey,
    /// How many of the most requested targets to list.
    pub top: usize,
}

impl Default for StatsOptions {
    fn default() -> Self {
        StatsOptions {
            target_key: TargetKey::Path,
            top: 10,
        }
    }
}

/// One point of the concentration curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Percentage of targets (the most popular ones), 1–100.
    pub targets_percent: u32,
    /// Number of targets that percentage stands for.
    pub targets: u64,
    /// Fraction of all requests that go to them.
    pub requests_share: f64,
    /// Fraction of the total size they take.
    pub bytes_share: f64,
}

/// Memory needed to cover a share of requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Share of requests, in percent.
    pub requests_percent: u32,
    /// Total size of the most popular targets that cover it.
    pub bytes: u64,
    /// How many targets that is.
    pub targets: u64,
}

/// One of the most requested targets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopTarget {
    /// The target's key.
    pub target: String,
    /// Requests for it.
    pub requests: u64,
    /// Its size (largest logged byte count).
    pub bytes: u64,
    /// Its share of all requests.
    pub requests_share: f64,
}

/// Summary statistics of a trace. See the [module documentation](self) for definitions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceStats {
    /// What identifies a target.
    pub target_key: TargetKey,
    /// Number of requests (records).
    pub requests: u64,
    /// Distinct targets requested.
    pub unique_targets: u64,
    /// Distinct clients.
    pub unique_clients: u64,
    /// Earliest request time (Unix seconds).
    pub first_time: Option<i64>,
    /// Latest request time (Unix seconds).
    pub last_time: Option<i64>,
    /// `last_time - first_time`.
    pub span_secs: i64,
    /// Sum of target sizes.
    pub total_bytes: u64,
    /// Targets whose size is unknown or zero (every response logged `-` or `0`).
    pub targets_without_size: u64,
    /// `total_bytes / unique_targets`.
    pub mean_target_bytes: f64,
    /// Mean over requests of the requested target's size.
    pub mean_request_bytes: f64,
    /// Sum of the logged byte counts.
    pub transferred_bytes: u64,
    /// Share of requests going to the most popular 10 % of targets.
    pub top10_share: f64,
    /// The cumulative concentration curve, one point per percent of targets.
    pub concentration: Vec<CurvePoint>,
    /// Memory needed to cover 97, 98 and 99 % of requests.
    pub coverage: Vec<Coverage>,
    /// Requests by method.
    pub methods: BTreeMap<String, u64>,
    /// Requests by status (`-` when not logged).
    pub statuses: BTreeMap<String, u64>,
    /// Requests by protocol (`none` for HTTP/0.9-style request lines).
    pub protocols: BTreeMap<String, u64>,
    /// The most requested targets.
    pub top_targets: Vec<TopTarget>,
}

#[derive(Clone, Copy, Default)]
struct Counter {
    requests: u64,
    size: u64,
}

/// Accumulates [`TraceStats`] one record at a time.
pub struct StatsBuilder {
    opts: StatsOptions,
    targets: FxMap<Box<str>, Counter>,
    clients: FxSet<Box<str>>,
    requests: u64,
    transferred: u64,
    first: Option<i64>,
    last: Option<i64>,
    methods: BTreeMap<String, u64>,
    protocols: BTreeMap<String, u64>,
    statuses: Vec<u64>,
    no_status: u64,
}

fn tally(map: &mut BTreeMap<String, u64>, label: &str) {
    if let Some(v) = map.get_mut(label) {
        *v += 1;
    } else if map.len() < MAX_LABELS {
        map.insert(label.to_owned(), 1);
    } else {
        *map.entry("(other)".to_owned()).or_insert(0) += 1;
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

impl StatsBuilder {
    /// A builder with no records yet.
    pub fn new(opts: StatsOptions) -> Self {
        StatsBuilder {
            opts,
            targets: FxMap::default(),
            clients: FxSet::default(),
            requests: 0,
            transferred: 0,
            first: None,
            last: None,
            methods: BTreeMap::new(),
            protocols: BTreeMap::new(),
            statuses: vec![0; 1000],
            no_status: 0,
        }
    }

    /// Counts one request.
    pub fn add(&mut self, r: &RecordRef<'_>) {
        self.requests += 1;
        let bytes = r.bytes.unwrap_or(0);
        self.transferred = self.transferred.saturating_add(bytes);
        self.first = Some(self.first.map_or(r.time, |t| t.min(r.time)));
        self.last = Some(self.last.map_or(r.time, |t| t.max(r.time)));
        let key = self.opts.target_key.key(&r.target);
        match self.targets.get_mut(key) {
            Some(c) => {
                c.requests += 1;
                c.size = c.size.max(bytes);
            }
            None => {
                self.targets.insert(
                    key.into(),
                    Counter {
                        requests: 1,
                        size: bytes,
                    },
                );
            }
        }
        if !self.clients.contains(r.client) {
            self.clients.insert(r.client.into());
        }
        tally(&mut self.methods, &r.method);
        tally(&mut self.protocols, r.protocol.as_deref().unwrap_or("none"));
        match r.status {
            Some(s) if usize::from(s) < self.statuses.len() => self.statuses[usize::from(s)] += 1,
            _ => self.no_status += 1,
        }
    }

    /// The statistics of everything added.
    pub fn finish(self) -> TraceStats {
        let mut targets: Vec<(Box<str>, Counter)> = self.targets.into_iter().collect();
        targets.sort_unstable_by(|a, b| {
            b.1.requests
                .cmp(&a.1.requests)
                .then(a.1.size.cmp(&b.1.size))
                .then_with(|| a.0.cmp(&b.0))
        });
        let n = targets.len() as u64;
        // Prefix sums: cum[k] = totals over the k most popular targets.
        let mut cum_requests = Vec::with_capacity(targets.len() + 1);
        let mut cum_bytes = Vec::with_capacity(targets.len() + 1);
        cum_requests.push(0u64);
        cum_bytes.push(0u64);
        let mut weighted: u128 = 0;
        let mut without_size = 0;
        for (_, c) in &targets {
            cum_requests.push(cum_requests.last().unwrap() + c.requests);
            cum_bytes.push(cum_bytes.last().unwrap().saturating_add(c.size));
            weighted += u128::from(c.requests) * u128::from(c.size);
            without_size += u64::from(c.size == 0);
        }
        let requests = self.requests;
        let total_bytes = *cum_bytes.last().unwrap();

        let concentration: Vec<CurvePoint> = if n == 0 {
            Vec::new()
        } else {
            (1..=100u32)
                .map(|p| {
                    let k = (u64::from(p) * n).div_ceil(100) as usize;
                    CurvePoint {
                        targets_percent: p,
                        targets: k as u64,
                        requests_share: ratio(cum_requests[k] as f64, requests as f64),
                        bytes_share: ratio(cum_bytes[k] as f64, total_bytes as f64),
                    }
                })
                .collect()
        };
        let coverage = COVERAGE_PERCENTS
            .iter()
            .map(|&q| {
                let needed = (u128::from(q) * u128::from(requests)).div_ceil(100) as u64;
                let k = cum_requests.partition_point(|&c| c < needed);
                let k = k.min(targets.len());
                Coverage {
                    requests_percent: q,
                    bytes: cum_bytes[k],
                    targets: k as u64,
                }
            })
            .collect();
        let top_targets = targets
            .iter()
            .take(self.opts.top)
            .map(|(k, c)| TopTarget {
                target: k.to_string(),
                requests: c.requests,
                bytes: c.size,
                requests_share: ratio(c.requests as f64, requests as f64),
            })
            .collect();
        let mut statuses: BTreeMap<String, u64> = self
            .statuses
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(s, &c)| (s.to_string(), c))
            .collect();
        if self.no_status > 0 {
            statuses.insert("-".to_owned(), self.no_status);
        }
        TraceStats {
            target_key: self.opts.target_key,
            requests,
            unique_targets: n,
            unique_clients: self.clients.len() as u64,
            first_time: self.first,
            last_time: self.last,
            span_secs: match (self.first, self.last) {
                (Some(a), Some(b)) => b - a,
                _ => 0,
            },
            total_bytes,
            targets_without_size: without_size,
            mean_target_bytes: ratio(total_bytes as f64, n as f64),
            mean_request_bytes: ratio(weighted as f64, requests as f64),
            transferred_bytes: self.transferred,
            top10_share: concentration
                .get(9)
                .map_or(0.0, |p: &CurvePoint| p.requests_share),
            concentration,
            coverage,
            methods: self.methods,
            statuses,
            protocols: self.protocols,
            top_targets,
        }
    }
}

impl TraceStats {
    /// The coverage entry for `percent`, if computed.
    pub fn coverage_for(&self, percent: u32) -> Option<&Coverage> {
        self.coverage.iter().find(|c| c.requests_percent == percent)
    }

    /// Statistics of a log read from `reader`, and the parse report.
    pub fn from_reader<R: BufRead>(
        reader: R,
        opts: StatsOptions,
    ) -> io::Result<(TraceStats, ParseReport)> {
        let mut builder = StatsBuilder::new(opts);
        let mut logs = parse_reader(reader);
        logs.for_each_record(|r| builder.add(r))?;
        Ok((builder.finish(), logs.into_report()))
    }

    /// Statistics of the log file at `path`, and the parse report.
    pub fn from_file(
        path: &Path,
        opts: StatsOptions,
    ) -> Result<(TraceStats, ParseReport), TraceError> {
        let mut builder = StatsBuilder::new(opts);
        let mut logs = open_log(path)?;
        logs.for_each_record(|r| builder.add(r))
            .map_err(|source| TraceError::Read {
                path: path.to_owned(),
                source,
            })?;
        Ok((builder.finish(), logs.into_report()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(lines: &[(&str, &str, Option<u64>)]) -> TraceStats {
        let mut log = String::new();
        for (client, target, bytes) in lines {
            let b = bytes.map_or("-".to_string(), |b| b.to_string());
            log.push_str(&format!(
                "{client} - - [01/Jun/1995:00:00:59 -0600] \"GET {target} HTTP/1.0\" 200 {b}\n"
            ));
        }
        TraceStats::from_reader(log.as_bytes(), StatsOptions::default())
            .unwrap()
            .0
    }

    #[test]
    fn empty() {
        let s = stats(&[]);
        assert_eq!(s.requests, 0);
        assert_eq!(s.unique_targets, 0);
        assert!(s.concentration.is_empty());
        assert_eq!(s.top10_share, 0.0);
        assert_eq!(s.coverage_for(99).unwrap().bytes, 0);
        assert_eq!(s.first_time, None);
    }

    #[test]
    fn sizes_counts_and_coverage() {
        // /a: 6 requests, size 100 (one 304-like 0 and one '-').
        // /b: 3 requests, size 1000. /c: 1 request, size 10. /a?x is /a.
        let mut lines = vec![("c1", "/a", Some(100)); 4];
        lines.push(("c2", "/a?x=1", Some(0)));
        lines.push(("c2", "/a", None));
        lines.extend([("c3", "/b", Some(1000)); 3]);
        lines.push(("c1", "/c", Some(10)));
        let s = stats(&lines);
        assert_eq!(s.requests, 10);
        assert_eq!(s.unique_targets, 3);
        assert_eq!(s.unique_clients, 3);
        assert_eq!(s.total_bytes, 1110);
        assert_eq!(s.transferred_bytes, 4 * 100 + 3000 + 10);
        assert_eq!(s.mean_target_bytes, 370.0);
        assert_eq!(s.mean_request_bytes, (600.0 + 3000.0 + 10.0) / 10.0);
        assert_eq!(s.targets_without_size, 0);
        // 10 % of 3 targets is 1 target (/a): 60 % of requests.
        assert_eq!(s.top10_share, 0.6);
        assert_eq!(s.concentration[9].targets, 1);
        assert_eq!(s.concentration[33].targets, 2);
        assert_eq!(s.concentration[99].requests_share, 1.0);
        assert_eq!(s.concentration[99].bytes_share, 1.0);
        // 97 % of 10 requests = 10 requests: all three targets.
        assert_eq!(
            s.coverage_for(97).copied(),
            Some(Coverage {
                requests_percent: 97,
                bytes: 1110,
                targets: 3
            })
        );
        assert_eq!(s.top_targets[0].target, "/a");
        assert_eq!(s.top_targets[0].requests, 6);
        assert_eq!(s.top_targets[1].target, "/b");
        assert_eq!(s.statuses["200"], 10);
        assert_eq!(s.protocols["HTTP/1.0"], 10);
    }

    #[test]
    fn coverage_takes_shortest_prefix() {
        // 97 requests to /hot, 2 to /warm, 1 to /cold.
        let mut lines = vec![("c", "/hot", Some(5)); 97];
        lines.extend([("c", "/warm", Some(7)); 2]);
        lines.push(("c", "/cold", Some(11)));
        let s = stats(&lines);
        assert_eq!(s.coverage_for(97).unwrap().bytes, 5);
        assert_eq!(s.coverage_for(98).unwrap().bytes, 12);
        assert_eq!(s.coverage_for(99).unwrap().bytes, 12);
        assert_eq!(s.coverage_for(99).unwrap().targets, 2);
    }

    #[test]
    fn full_key_keeps_queries() {
        let log = "h - - [01/Jun/1995:00:00:59 -0600] \"GET /a?1 HTTP/1.0\" 200 1\n\
                   h - - [01/Jun/1995:00:00:59 -0600] \"GET /a?2 HTTP/1.0\" 200 1\n";
        let opts = StatsOptions {
            target_key: TargetKey::Full,
            top: 1,
        };
        let (s, _) = TraceStats::from_reader(log.as_bytes(), opts).unwrap();
        assert_eq!(s.unique_targets, 2);
        assert_eq!(s.top_targets.len(), 1);
        let (s, _) = TraceStats::from_reader(log.as_bytes(), StatsOptions::default()).unwrap();
        assert_eq!(s.unique_targets, 1);
    }

    #[test]
    fn label_maps_are_bounded() {
        let mut b = StatsBuilder::new(StatsOptions::default());
        for i in 0..200 {
            let m = format!("M{i}");
            let r = crate::LogRecord {
                client: "c".into(),
                time: 0,
                method: m,
                target: "/".into(),
                protocol: None,
                status: None,
                bytes: None,
                referer: None,
                user_agent: None,
            };
            b.add(&r.as_ref());
        }
        let s = b.finish();
        assert_eq!(s.methods.len(), MAX_LABELS + 1);
        assert_eq!(s.methods["(other)"], 200 - MAX_LABELS as u64);
        assert_eq!(s.statuses["-"], 200);
        assert_eq!(s.targets_without_size, 1);
    }
}
