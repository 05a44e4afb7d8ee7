//! Grouping requests into HTTP/1.1 connections and pipelined batches.
//!
//! Logs do not record which requests shared a connection, so the heuristic
//! of seed 003 §6 reconstructs it:
//!
//! * the requests of one client, in time order, belong to one persistent
//!   connection as long as each follows the previous one by less than
//!   [`SessionConfig::gap_secs`] (15 s, the default idle timeout of servers
//!   of the time); a gap of that length or more starts a new connection;
//! * the first request of a connection is sent alone; every later request
//!   joins the current pipelined batch if it follows the previous request by
//!   less than [`SessionConfig::batch_secs`] (5 s), and starts a new batch
//!   otherwise. A client may pipeline all requests of a batch but waits for
//!   the responses before it sends the next batch.
//!
//! Requests with the same timestamp keep their log order.

use serde::{Deserialize, Serialize};

use crate::workload::Workload;

/// Thresholds of the connection heuristic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionConfig {
    /// A gap of at least this many seconds between two requests of a client
    /// closes the connection.
    pub gap_secs: i64,
    /// A gap of at least this many seconds inside a connection starts a new batch.
    pub batch_secs: i64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            gap_secs: 15,
            batch_secs: 5,
        }
    }
}

/// Requests a client pipelines together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Time of the batch's first request (Unix seconds).
    pub start: i64,
    /// Indices into [`Workload::requests`], in the order they are sent.
    pub requests: Vec<usize>,
}

/// One reconstructed persistent connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    /// Index into [`Workload::clients`].
    pub client: u32,
    /// Batches in the order they are sent; the first holds one request.
    pub batches: Vec<Batch>,
}

impl Connection {
    /// Time of the first request.
    pub fn start(&self) -> i64 {
        self.batches[0].start
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.batches.iter().map(|b| b.requests.len()).sum()
    }

    /// Always false: a connection has at least one request.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// All request indices in order.
    pub fn requests(&self) -> impl Iterator<Item = usize> + '_ {
        self.batches.iter().flat_map(|b| b.requests.iter().copied())
    }
}

/// Groups the requests of `workload` into connections, ordered by start
/// time (then by the log position of their first request).
pub fn group_connections(workload: &Workload, cfg: &SessionConfig) -> Vec<Connection> {
    let reqs = &workload.requests;
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_unstable_by_key(|&i| (reqs[i].client, reqs[i].time, i));
    let mut conns: Vec<Connection> = Vec::new();
    let mut prev: Option<(u32, i64)> = None;
    for i in order {
        let r = &reqs[i];
        match prev {
            Some((client, t)) if client == r.client && r.time - t < cfg.gap_secs => {
                let conn = conns.last_mut().expect("a connection is open");
                if conn.batches.len() > 1 && r.time - t < cfg.batch_secs {
                    let batch = conn.batches.last_mut().expect("a batch is open");
                    batch.requests.push(i);
                } else {
                    conn.batches.push(Batch {
                        start: r.time,
                        requests: vec![i],
                    });
                }
            }
            _ => conns.push(Connection {
                client: r.client,
                batches: vec![Batch {
                    start: r.time,
                    requests: vec![i],
                }],
            }),
        }
        prev = Some((r.client, r.time));
    }
    conns.sort_by_key(|c| (c.start(), c.batches[0].requests[0]));
    conns
}

/// Counts of connections with a given number of requests, in powers of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeBucket {
    /// Smallest number of requests in the bucket.
    pub min: u64,
    /// Largest number of requests in the bucket.
    pub max: u64,
    /// Connections in the bucket.
    pub connections: u64,
}

/// Summary of a grouping.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionStats {
    /// The thresholds used.
    pub config: SessionConfig,
    /// Requests grouped.
    pub requests: u64,
    /// Distinct clients.
    pub clients: u64,
    /// Connections.
    pub connections: u64,
    /// Pipelined batches (the first request of a connection is a batch of its own).
    pub batches: u64,
    /// Connections with a single request.
    pub single_request_connections: u64,
    /// Mean requests per connection.
    pub mean_requests_per_connection: f64,
    /// Largest number of requests on one connection.
    pub max_requests_per_connection: u64,
    /// Mean batches per connection.
    pub mean_batches_per_connection: f64,
    /// Mean requests per batch, over batches after the first of each connection.
    pub mean_pipelined_batch: f64,
    /// Largest batch.
    pub max_batch: u64,
    /// Mean connection duration (first to last request), seconds.
    pub mean_connection_secs: f64,
    /// Connections by number of requests: 1, 2–3, 4–7, 8–15, …
    pub requests_per_connection: Vec<SizeBucket>,
}

impl SessionStats {
    /// Summarizes `conns`, a grouping of `workload`.
    pub fn new(workload: &Workload, conns: &[Connection], config: SessionConfig) -> Self {
        let n = conns.len() as f64;
        let mut batches = 0u64;
        let mut single = 0u64;
        let mut max_len = 0u64;
        let mut later_batches = 0u64;
        let mut later_requests = 0u64;
        let mut max_batch = 0u64;
        let mut duration = 0i64;
        let mut buckets: Vec<u64> = Vec::new();
        let mut clients = vec![false; workload.clients.len()];
        let mut distinct = 0u64;
        for c in conns {
            let len = c.len() as u64;
            batches += c.batches.len() as u64;
            single += u64::from(len == 1);
            max_len = max_len.max(len);
            for b in &c.batches[1..] {
                later_batches += 1;
                later_requests += b.requests.len() as u64;
            }
            for b in &c.batches {
                max_batch = max_batch.max(b.requests.len() as u64);
            }
            let last = c.requests().map(|i| workload.requests[i].time).max();
            duration += last.unwrap_or(c.start()) - c.start();
            let bucket = (u64::BITS - len.leading_zeros() - 1) as usize;
            if buckets.len() <= bucket {
                buckets.resize(bucket + 1, 0);
            }
            buckets[bucket] += 1;
            if let Some(seen) = clients.get_mut(c.client as usize) {
                distinct += u64::from(!*seen);
                *seen = true;
            }
        }
        let requests: u64 = conns.iter().map(|c| c.len() as u64).sum();
        let ratio = |a: f64, b: f64| if b == 0.0 { 0.0 } else { a / b };
        SessionStats {
            config,
            requests,
            clients: distinct,
            connections: conns.len() as u64,
            batches,
            single_request_connections: single,
            mean_requests_per_connection: ratio(requests as f64, n),
            max_requests_per_connection: max_len,
            mean_batches_per_connection: ratio(batches as f64, n),
            mean_pipelined_batch: ratio(later_requests as f64, later_batches as f64),
            max_batch,
            mean_connection_secs: ratio(duration as f64, n),
            requests_per_connection: buckets
                .iter()
                .enumerate()
                .map(|(b, &count)| SizeBucket {
                    min: 1 << b,
                    max: (1 << (b + 1)) - 1,
                    connections: count,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Request;

    fn workload(reqs: &[(u32, i64)]) -> Workload {
        let clients = reqs.iter().map(|r| r.0).max().map_or(0, |m| m + 1);
        Workload {
            clients: (0..clients).map(|c| format!("c{c}")).collect(),
            targets: vec![crate::workload::Target {
                path: "/".into(),
                size: 1,
            }],
            methods: vec!["GET".into()],
            requests: reqs
                .iter()
                .map(|&(client, time)| Request {
                    time,
                    client,
                    target: 0,
                    method: 0,
                    protocol: None,
                    status: Some(200),
                    bytes: Some(1),
                })
                .collect(),
            ..Workload::default()
        }
    }

    fn shape(conns: &[Connection]) -> Vec<(u32, Vec<Vec<usize>>)> {
        conns
            .iter()
            .map(|c| {
                (
                    c.client,
                    c.batches.iter().map(|b| b.requests.clone()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn seed_003_heuristic() {
        // Client 0: 0, 1, 2 (batch after the first), 8 (new batch: gap 6 s),
        // 9, then 24 (gap 15 s: new connection). Client 1 interleaved.
        let w = workload(&[
            (0, 0),
            (1, 1),
            (0, 1),
            (0, 2),
            (0, 8),
            (0, 9),
            (0, 24),
            (1, 30),
        ]);
        let conns = group_connections(&w, &SessionConfig::default());
        assert_eq!(
            shape(&conns),
            vec![
                (0, vec![vec![0], vec![2, 3], vec![4, 5]]),
                (1, vec![vec![1]]),
                (0, vec![vec![6]]),
                (1, vec![vec![7]]),
            ]
        );
        let s = SessionStats::new(&w, &conns, SessionConfig::default());
        assert_eq!(s.connections, 4);
        assert_eq!(s.requests, 8);
        assert_eq!(s.batches, 6);
        assert_eq!(s.clients, 2);
        assert_eq!(s.single_request_connections, 3);
        assert_eq!(s.max_requests_per_connection, 5);
        assert_eq!(s.mean_pipelined_batch, 2.0);
        assert_eq!(s.mean_connection_secs, 9.0 / 4.0);
        assert_eq!(
            s.requests_per_connection,
            vec![
                SizeBucket {
                    min: 1,
                    max: 1,
                    connections: 3
                },
                SizeBucket {
                    min: 2,
                    max: 3,
                    connections: 0
                },
                SizeBucket {
                    min: 4,
                    max: 7,
                    connections: 1
                },
            ]
        );
    }

    #[test]
    fn out_of_order_log_lines_are_sorted_per_client() {
        // Log order 5, 0, 14: sorted 0, 5, 14 -> one connection.
        let w = workload(&[(0, 5), (0, 0), (0, 14), (0, 14)]);
        let conns = group_connections(&w, &SessionConfig::default());
        assert_eq!(shape(&conns), vec![(0, vec![vec![1], vec![0], vec![2, 3]])]);
        let conns = group_connections(
            &w,
            &SessionConfig {
                gap_secs: 5,
                batch_secs: 5,
            },
        );
        assert_eq!(
            shape(&conns),
            vec![
                (0, vec![vec![1]]),
                (0, vec![vec![0]]),
                (0, vec![vec![2], vec![3]])
            ]
        );
    }

    #[test]
    fn empty() {
        let w = workload(&[]);
        let conns = group_connections(&w, &SessionConfig::default());
        assert!(conns.is_empty());
        let s = SessionStats::new(&w, &conns, SessionConfig::default());
        assert_eq!(s.connections, 0);
        assert_eq!(s.mean_requests_per_connection, 0.0);
    }
}
