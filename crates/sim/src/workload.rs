//! Workloads as the simulator replays them: client connections, each a sequence of pipelined
//! batches of requests for targets of known size.
//!
//! A [`SimWorkload`] comes from a `switchyard trace` [`Workload`] (an access log or a synthetic
//! trace) in one of two shapes (seed 003 §6):
//!
//! * [`Http::V10`]: every request on a connection of its own, in log order;
//! * [`Http::V11`]: requests grouped into persistent connections and pipelined batches by
//!   [`group_connections`] (same client, gaps under 15 s; batches under 5 s), connections in
//!   order of their first request.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use switchyard_trace::{group_connections, SessionConfig, SynthConfig, Workload};

use crate::SimError;

/// HTTP version of a workload's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Http {
    /// One request per connection.
    #[serde(rename = "1.0")]
    V10,
    /// Persistent connections with pipelined batches.
    #[serde(rename = "1.1")]
    V11,
}

impl Http {
    /// `1.0` or `1.1`.
    pub fn as_str(self) -> &'static str {
        match self {
            Http::V10 => "1.0",
            Http::V11 => "1.1",
        }
    }
}

impl fmt::Display for Http {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Http {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        match s.trim() {
            "1.0" | "10" | "http/1.0" | "HTTP/1.0" => Ok(Http::V10),
            "1.1" | "11" | "http/1.1" | "HTTP/1.1" => Ok(Http::V11),
            _ => Err(SimError::Config(format!(
                "unknown HTTP version `{s}` (1.0 or 1.1)"
            ))),
        }
    }
}

/// The targets of a workload: the key the policies see and the size the nodes serve.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Targets {
    /// Request target (path) of each target.
    pub keys: Vec<Box<str>>,
    /// Size in bytes of each target.
    pub sizes: Vec<u64>,
}

impl Targets {
    /// The targets of a trace workload.
    pub fn of(w: &Workload) -> Self {
        Targets {
            keys: w.targets.iter().map(|t| t.path.as_str().into()).collect(),
            sizes: w.targets.iter().map(|t| t.size).collect(),
        }
    }

    /// Number of targets.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
}

/// Connections, batches and requests in flat arrays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimWorkload {
    /// The targets, shared between the HTTP/1.0 and HTTP/1.1 shapes of one trace.
    pub targets: Arc<Targets>,
    /// The shape.
    pub http: Http,
    /// Target of every request, connection by connection, batch by batch.
    reqs: Vec<u32>,
    /// End (exclusive, into `reqs`) of every batch.
    batch_end: Vec<u32>,
    /// End (exclusive, into `batch_end`) of every connection.
    conn_end: Vec<u32>,
}

/// Figures describing a [`SimWorkload`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSummary {
    /// HTTP shape.
    pub http: Http,
    /// Requests.
    pub requests: u64,
    /// Connections.
    pub connections: u64,
    /// Pipelined batches.
    pub batches: u64,
    /// Distinct targets (requested or not).
    pub targets: u64,
    /// Total size of the targets.
    pub target_bytes: u64,
    /// Mean response size over the requests.
    pub mean_response_bytes: f64,
    /// Bytes of the most requested targets needed to cover 97/98/99 % of requests.
    pub memory_for_97_98_99: [u64; 3],
}

impl SimWorkload {
    /// The workload of a trace in the given shape (`session` only matters for HTTP/1.1).
    pub fn from_trace(w: &Workload, http: Http, session: &SessionConfig) -> Self {
        Self::with_targets(Arc::new(Targets::of(w)), w, http, session)
    }

    /// Same as [`SimWorkload::from_trace`] with targets already extracted (so that the two shapes
    /// of one trace share them).
    pub fn with_targets(
        targets: Arc<Targets>,
        w: &Workload,
        http: Http,
        session: &SessionConfig,
    ) -> Self {
        let mut reqs = Vec::with_capacity(w.requests.len());
        let mut batch_end = Vec::new();
        let mut conn_end = Vec::new();
        match http {
            Http::V10 => {
                for r in &w.requests {
                    reqs.push(r.target);
                    batch_end.push(reqs.len() as u32);
                    conn_end.push(batch_end.len() as u32);
                }
            }
            Http::V11 => {
                for c in group_connections(w, session) {
                    for b in &c.batches {
                        reqs.extend(b.requests.iter().map(|&i| w.requests[i].target));
                        batch_end.push(reqs.len() as u32);
                    }
                    conn_end.push(batch_end.len() as u32);
                }
            }
        }
        SimWorkload {
            targets,
            http,
            reqs,
            batch_end,
            conn_end,
        }
    }

    /// A workload from explicit connections: each connection is a list of batches of target ids.
    pub fn from_connections(
        targets: Arc<Targets>,
        http: Http,
        conns: &[Vec<Vec<u32>>],
    ) -> Result<Self, SimError> {
        let mut w = SimWorkload {
            targets,
            http,
            reqs: Vec::new(),
            batch_end: Vec::new(),
            conn_end: Vec::new(),
        };
        for c in conns {
            if c.is_empty() || c.iter().any(|b| b.is_empty()) {
                return Err(SimError::Workload(
                    "connections and batches must not be empty".into(),
                ));
            }
            for b in c {
                for &t in b {
                    if t as usize >= w.targets.len() {
                        return Err(SimError::Workload(format!("unknown target id {t}")));
                    }
                    w.reqs.push(t);
                }
                w.batch_end.push(w.reqs.len() as u32);
            }
            w.conn_end.push(w.batch_end.len() as u32);
        }
        Ok(w)
    }

    /// Number of requests.
    pub fn requests(&self) -> usize {
        self.reqs.len()
    }

    /// Number of connections.
    pub fn connections(&self) -> usize {
        self.conn_end.len()
    }

    /// Target of request `i` (requests are numbered in connection order).
    pub fn target(&self, i: usize) -> u32 {
        self.reqs[i]
    }

    /// Batches of connection `c`, as a range of batch indices.
    pub(crate) fn conn_batches(&self, c: usize) -> std::ops::Range<usize> {
        let start = if c == 0 {
            0
        } else {
            self.conn_end[c - 1] as usize
        };
        start..self.conn_end[c] as usize
    }

    /// Requests of batch `b`, as a range of request indices.
    pub(crate) fn batch_reqs(&self, b: usize) -> std::ops::Range<usize> {
        let start = if b == 0 {
            0
        } else {
            self.batch_end[b - 1] as usize
        };
        start..self.batch_end[b] as usize
    }

    /// Requests of connection `c`, as a range of request indices.
    pub(crate) fn conn_requests(&self, c: usize) -> std::ops::Range<usize> {
        let b = self.conn_batches(c);
        let start = if b.start == 0 {
            0
        } else {
            self.batch_end[b.start - 1] as usize
        };
        start..self.batch_end[b.end - 1] as usize
    }

    /// The first `n` connections only (for quick runs and tests).
    pub fn truncated(&self, n: usize) -> SimWorkload {
        let n = n.min(self.connections());
        let batches = if n == 0 {
            0
        } else {
            self.conn_end[n - 1] as usize
        };
        let reqs = if batches == 0 {
            0
        } else {
            self.batch_end[batches - 1] as usize
        };
        SimWorkload {
            targets: self.targets.clone(),
            http: self.http,
            reqs: self.reqs[..reqs].to_vec(),
            batch_end: self.batch_end[..batches].to_vec(),
            conn_end: self.conn_end[..n].to_vec(),
        }
    }

    /// Figures describing the workload.
    pub fn summary(&self) -> WorkloadSummary {
        let sizes = &self.targets.sizes;
        let mut counts = vec![0u64; sizes.len()];
        let mut bytes = 0u128;
        for &t in &self.reqs {
            counts[t as usize] += 1;
            bytes += u128::from(sizes[t as usize]);
        }
        let mut order: Vec<usize> = (0..sizes.len()).filter(|&t| counts[t] > 0).collect();
        order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
        let total = self.reqs.len() as u64;
        let mut memory = [0u64; 3];
        for (k, pct) in [97u64, 98, 99].into_iter().enumerate() {
            let need = (total * pct).div_ceil(100);
            let (mut got, mut mem) = (0u64, 0u64);
            for &t in &order {
                if got >= need {
                    break;
                }
                got += counts[t];
                mem += sizes[t];
            }
            memory[k] = mem;
        }
        WorkloadSummary {
            http: self.http,
            requests: total,
            connections: self.connections() as u64,
            batches: self.batch_end.len() as u64,
            targets: sizes.len() as u64,
            target_bytes: sizes.iter().sum(),
            mean_response_bytes: if total == 0 {
                0.0
            } else {
                bytes as f64 / total as f64
            },
            memory_for_97_98_99: memory,
        }
    }
}

/// A synthetic trace shaped like seed 003's Rice University trace: about 31,000 targets covering
/// about 1 GB (1.015 GB in the paper), a working set well beyond one node's 85 MB cache, with the
/// request, session and size model of seed 004 Table 1 (`switchyard trace synth`).
///
/// `scale` shrinks the number of targets, their total size and the number of requests by the same
/// factor (with `cache_bytes` scaled alike by the caller, the cache-to-working-set ratios stay);
/// 1.0 is the full size.
pub fn seed003_synth(scale: f64, requests: u64, seed: u64) -> SynthConfig {
    let scale = scale.clamp(1e-4, 1.0);
    SynthConfig {
        seed,
        targets: Some(((31_000.0 * scale).round() as u64).max(10)),
        total_bytes: Some(((1.015e9 * scale).round() as u64).max(10_000)),
        zipf_alpha: SEED003_ZIPF_ALPHA,
        requests,
        clients: 20_000,
        session_interarrival_secs: 0.5,
        ..SynthConfig::default()
    }
}

/// Zipf exponent of [`seed003_synth`]'s page popularity, chosen so that the memory needed to
/// cover 97/98/99 % of requests matches what seed 003 reports for its trace (526/619/745 MB of
/// 1.015 GB; the full-size synthetic trace of 1,000,000 requests needs 515/608/721 MB).
pub const SEED003_ZIPF_ALPHA: f64 = 1.2;

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_trace::{Request, Target};

    fn trace() -> Workload {
        let req = |time, client, target| Request {
            time,
            client,
            target,
            method: 0,
            protocol: None,
            status: Some(200),
            bytes: None,
        };
        Workload {
            clients: vec!["a".into(), "b".into()],
            targets: vec![
                Target {
                    path: "/x".into(),
                    size: 10,
                },
                Target {
                    path: "/y".into(),
                    size: 20,
                },
            ],
            methods: vec!["GET".into()],
            requests: vec![req(0, 0, 0), req(0, 1, 1), req(1, 0, 1), req(1, 0, 0)],
            ..Workload::default()
        }
    }

    #[test]
    fn http10_is_one_request_per_connection() {
        let w = SimWorkload::from_trace(&trace(), Http::V10, &SessionConfig::default());
        assert_eq!(w.connections(), 4);
        assert_eq!(w.requests(), 4);
        assert_eq!(w.conn_batches(2), 2..3);
        assert_eq!(w.batch_reqs(2), 2..3);
        assert_eq!(w.target(1), 1);
    }

    #[test]
    fn http11_groups_connections_and_batches() {
        let w = SimWorkload::from_trace(&trace(), Http::V11, &SessionConfig::default());
        // Client a: [x] then [y, x] pipelined; client b: [y].
        assert_eq!(w.connections(), 2);
        assert_eq!(w.conn_batches(0), 0..2);
        assert_eq!(w.batch_reqs(0), 0..1);
        assert_eq!(w.batch_reqs(1), 1..3);
        assert_eq!(w.conn_batches(1), 2..3);
        let s = w.summary();
        assert_eq!(s.requests, 4);
        assert_eq!(s.batches, 3);
        assert_eq!(s.mean_response_bytes, 15.0);
        // 97 % of 4 requests needs all 4: both targets.
        assert_eq!(s.memory_for_97_98_99, [30, 30, 30]);
        let t = w.truncated(1);
        assert_eq!(t.requests(), 3);
        assert_eq!(t.connections(), 1);
    }

    #[test]
    fn explicit_connections_are_checked() {
        let targets = Arc::new(Targets {
            keys: vec!["/a".into()],
            sizes: vec![1],
        });
        assert!(
            SimWorkload::from_connections(targets.clone(), Http::V11, &[vec![vec![1]]]).is_err()
        );
        assert!(SimWorkload::from_connections(targets.clone(), Http::V11, &[vec![]]).is_err());
        let w = SimWorkload::from_connections(targets, Http::V11, &[vec![vec![0], vec![0, 0]]])
            .unwrap();
        assert_eq!(w.requests(), 3);
    }
}
