//! The simulator against the real system: the same trace and policy replayed on real
//! `switchyard-node` nodes on loopback, and simulated; the two hit rates are compared.
//!
//! The nodes are started in-process on 127.0.0.1:0 over a document root holding the synthetic
//! site. A closed loop of client threads replays the trace in log order; for each connection the
//! policy (the same `switchyard-policy` object the simulator drives) chooses a node by its first
//! request — single handoff: HTTP/1.0 connections carry one request, HTTP/1.1 connections all
//! their requests — and the client sends the requests to that node over keep-alive HTTP
//! connections. The hit rate of the real run comes from the nodes' own cache counters; the
//! simulated one from a run of the same workload with the same policy, node count, cache size
//! and number of clients.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard_node::{NodeConfig, RunningNode};
use switchyard_policy::{
    build, ConnId, NodeId, NodeSpec, Outcome, PolicyConfig, PolicyKind, Request,
};
use switchyard_sim::workload::seed003_synth;
use switchyard_sim::{simulate, Http, RequestDistribution, SimConfig, SimWorkload};
use switchyard_trace::{synthesize, SessionConfig};

/// What to compare.
#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// Nodes.
    pub nodes: u32,
    /// Scale of the seed 003-shaped synthetic trace.
    pub scale: f64,
    /// Requests replayed.
    pub requests: u64,
    /// Seed of the trace.
    pub seed: u64,
    /// Cache budget per node.
    pub cache_bytes: u64,
    /// Client threads (the closed loop's population, in both runs).
    pub clients: usize,
    /// Policy.
    pub policy: PolicyKind,
    /// HTTP shape.
    pub http: Http,
}

/// Hits and misses of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct NodeHits {
    /// Cache hits.
    pub hits: u64,
    /// Cache misses.
    pub misses: u64,
}

/// The comparison.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckResult {
    /// Requests replayed.
    pub requests: u64,
    /// Connections replayed.
    pub connections: u64,
    /// Hit rate measured on the real nodes.
    pub real_hit_rate: f64,
    /// Hit rate of the simulation.
    pub sim_hit_rate: f64,
    /// Per node, real.
    pub real_nodes: Vec<NodeHits>,
    /// Per node, simulated.
    pub sim_nodes: Vec<NodeHits>,
    /// Responses that were not 200 with the full body.
    pub errors: u64,
    /// Wall time of the real replay.
    pub real_secs: f64,
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(Conn {
            reader: BufReader::with_capacity(64 * 1024, s.try_clone()?),
            writer: s,
        })
    }

    /// GET `path`; returns the status and the body length read.
    fn get(&mut self, path: &str) -> std::io::Result<(u16, u64)> {
        self.writer
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: sim\r\n\r\n").as_bytes())?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut len = 0u64;
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        std::io::copy(&mut (&mut self.reader).take(len), &mut std::io::sink())?;
        Ok((status, len))
    }
}

/// Runs the comparison.
pub fn run_check(cfg: &CheckConfig) -> CheckResult {
    let synth = synthesize(&seed003_synth(cfg.scale, cfg.requests, cfg.seed)).unwrap();
    let root = tempfile::tempdir().unwrap();
    synth.write_docroot(root.path(), false).unwrap();
    let w = SimWorkload::from_trace(&synth.workload, cfg.http, &SessionConfig::default());

    // The simulation.
    let mut sc = SimConfig::new(cfg.nodes, cfg.policy, RequestDistribution::Single);
    sc.cache_bytes = cfg.cache_bytes;
    sc.cache_max_object_bytes = Some(cfg.cache_bytes);
    sc.clients = Some(cfg.clients as u32);
    let sim = simulate(&sc, &w).unwrap();

    // The real nodes.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let nodes: Vec<RunningNode> = (0..cfg.nodes)
        .map(|_| {
            let nc = NodeConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                root: root.path().to_path_buf(),
                workers: 1,
                cache_bytes: cfg.cache_bytes,
                cache_max_object_bytes: cfg.cache_bytes,
                // Hits stay hits: the files do not change during the run.
                cache_revalidate_ms: 3_600_000,
                ..NodeConfig::default()
            };
            rt.block_on(switchyard_node::start(nc)).unwrap()
        })
        .collect();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr()).collect();
    let mut pc = PolicyConfig::new(cfg.policy);
    pc.batch_gap_ms = 0;
    let mut policy = build(&pc).unwrap();
    let specs: Vec<NodeSpec> = (0..cfg.nodes).map(NodeSpec::new).collect();
    policy.init(&specs, Duration::ZERO).unwrap();
    let policy = Arc::new(Mutex::new(policy));

    // Connections in workload order, each its list of target ids.
    let conns: Vec<Vec<u32>> = {
        let mut v = Vec::with_capacity(w.connections());
        let mut i = 0usize;
        let grouped = match cfg.http {
            Http::V10 => None,
            Http::V11 => Some(switchyard_trace::group_connections(
                &synth.workload,
                &SessionConfig::default(),
            )),
        };
        match grouped {
            None => {
                for r in &synth.workload.requests {
                    v.push(vec![r.target]);
                }
            }
            Some(g) => {
                for c in g {
                    v.push(
                        c.requests()
                            .map(|k| synth.workload.requests[k].target)
                            .collect(),
                    );
                }
            }
        }
        for c in &v {
            for &t in c {
                assert_eq!(t, w.target(i), "same request order as the simulator");
                i += 1;
            }
        }
        v
    };
    let paths: Vec<String> = synth
        .workload
        .targets
        .iter()
        .map(|t| t.path.clone())
        .collect();
    let sizes: Vec<u64> = synth.workload.targets.iter().map(|t| t.size).collect();
    let next = AtomicUsize::new(0);
    let errors = AtomicUsize::new(0);
    let origin = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..cfg.clients {
            s.spawn(|| {
                let mut open: Vec<Option<Conn>> = (0..addrs.len()).map(|_| None).collect();
                loop {
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    let Some(reqs) = conns.get(c) else { break };
                    let id = ConnId(c as u64);
                    let first = reqs[0] as usize;
                    let now = origin.elapsed();
                    let r = Request {
                        conn: id,
                        method: "GET",
                        host: None,
                        target: &paths[first],
                        size_hint: Some(sizes[first]),
                    };
                    let node = {
                        let mut p = policy.lock().unwrap();
                        p.connection_start(id, now);
                        p.select(&r, now).expect("a node").node()
                    };
                    let n = node.0 as usize;
                    let mut bytes = 0;
                    for &t in reqs {
                        if open[n].is_none() {
                            open[n] = Some(Conn::open(addrs[n]).unwrap());
                        }
                        match open[n].as_mut().unwrap().get(&paths[t as usize]) {
                            Ok((200, len)) if len == sizes[t as usize] => bytes += len,
                            _ => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                open[n] = None;
                            }
                        }
                    }
                    let now = origin.elapsed();
                    let mut p = policy.lock().unwrap();
                    p.post_request(id, NodeId(n as u32), &Outcome::ok(200, bytes, false), now);
                    p.connection_end(id, now);
                }
            });
        }
    });
    let real_secs = origin.elapsed().as_secs_f64();
    let real_nodes: Vec<NodeHits> = nodes
        .iter()
        .map(|n| {
            let s = n.store().cache_stats();
            NodeHits {
                hits: s.hits,
                misses: s.misses,
            }
        })
        .collect();
    for n in nodes {
        rt.block_on(n.shutdown(Duration::from_secs(2)));
    }
    let hits: u64 = real_nodes.iter().map(|n| n.hits).sum();
    let total: u64 = real_nodes.iter().map(|n| n.hits + n.misses).sum();
    CheckResult {
        requests: w.requests() as u64,
        connections: w.connections() as u64,
        real_hit_rate: hits as f64 / total.max(1) as f64,
        sim_hit_rate: sim.hit_rate,
        real_nodes,
        sim_nodes: sim
            .per_node
            .iter()
            .map(|n| NodeHits {
                hits: n.hits,
                misses: n.misses,
            })
            .collect(),
        errors: errors.load(Ordering::Relaxed) as u64,
        real_secs,
    }
}
