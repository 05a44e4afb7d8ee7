//! The figures of a run (seed 003 §6: throughput, hit rate, CPU and disk idle time per node) and
//! their CSV and text forms. JSON comes from `serde`.

use std::fmt::Write as _;
use std::io::{self, Write};

use serde::Serialize;

use crate::config::RequestDistribution;
use crate::workload::Http;

/// Figures of one node over the measured part of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeResult {
    /// Node index.
    pub node: u32,
    /// Requests it served (produced the response of).
    pub requests: u64,
    /// Of which from its memory cache.
    pub hits: u64,
    /// Of which read from its disk.
    pub misses: u64,
    /// `hits / (hits + misses)`.
    pub hit_rate: f64,
    /// Response bytes it produced.
    pub bytes: u64,
    /// Client connections first handed to it.
    pub connections: u64,
    /// Connections handed to it later (multiple handoff).
    pub handoffs_in: u64,
    /// Requests it served for another node's connection (back-end forwarding).
    pub forwards_served: u64,
    /// Responses it fetched from another node and relayed to its client (back-end forwarding).
    pub forwards_relayed: u64,
    /// Share of the time its CPU was idle.
    pub cpu_idle: f64,
    /// Share of the time its disk was idle.
    pub disk_idle: f64,
    /// Bytes in its cache at the end.
    pub cached_bytes: u64,
    /// Objects in its cache at the end.
    pub cached_objects: u64,
}

/// Figures of one simulation run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// Series name given by a sweep (empty for a single run).
    pub label: String,
    /// Policy name.
    pub policy: String,
    /// RequestDistribution.
    pub mechanism: RequestDistribution,
    /// HTTP shape of the workload.
    pub http: Http,
    /// Cost preset name.
    pub preset: String,
    /// Nodes.
    pub nodes: u32,
    /// Client connections open at once (closed loop).
    pub clients: u32,
    /// Cache budget per node.
    pub cache_bytes: u64,
    /// Requests in the workload.
    pub requests: u64,
    /// Connections in the workload.
    pub connections: u64,
    /// Requests measured (after the warm-up).
    pub measured_requests: u64,
    /// Simulated seconds from the end of the warm-up to the last response.
    pub sim_secs: f64,
    /// Measured requests per simulated second: the cluster's throughput.
    pub throughput: f64,
    /// Share of measured requests served from a memory cache.
    pub hit_rate: f64,
    /// Response bandwidth in megabits per second.
    pub mbps: f64,
    /// Mean time from a request's (batch's) arrival to its last byte, milliseconds.
    pub mean_response_ms: f64,
    /// Mean over nodes of the CPU idle share.
    pub mean_cpu_idle: f64,
    /// Mean over nodes of the disk idle share.
    pub mean_disk_idle: f64,
    /// Busy share of the front end (0 when it is free).
    pub frontend_utilization: f64,
    /// Requests served by back-end forwarding.
    pub forwards: u64,
    /// Connections moved by multiple handoff.
    pub handoffs: u64,
    /// Times the policy refused a request (it waited at the front end).
    pub policy_rejections: u64,
    /// Targets moved between nodes by the policy.
    pub policy_reassignments: u64,
    /// Extra target-to-node mappings of the policy at the end.
    pub policy_replicas: u64,
    /// Per node.
    pub per_node: Vec<NodeResult>,
}

fn field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Header of [`write_runs_csv`].
pub const RUNS_CSV_HEADER: &str = "label,preset,policy,mechanism,http,nodes,clients,cache_bytes,requests,connections,measured_requests,sim_secs,throughput,hit_rate,mbps,mean_response_ms,mean_cpu_idle,mean_disk_idle,frontend_utilization,forwards,handoffs,policy_rejections,policy_reassignments,policy_replicas";

/// Header of [`write_nodes_csv`].
pub const NODES_CSV_HEADER: &str = "label,preset,policy,mechanism,http,nodes,node,requests,hits,misses,hit_rate,bytes,connections,handoffs_in,forwards_served,forwards_relayed,cpu_idle,disk_idle,cached_bytes,cached_objects";

/// One line per run.
pub fn write_runs_csv(out: &mut dyn Write, runs: &[RunResult]) -> io::Result<()> {
    writeln!(out, "{RUNS_CSV_HEADER}")?;
    for r in runs {
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.3},{:.6},{:.3},{:.3},{:.6},{:.6},{:.6},{},{},{},{},{}",
            field(&r.label),
            field(&r.preset),
            field(&r.policy),
            r.mechanism,
            r.http,
            r.nodes,
            r.clients,
            r.cache_bytes,
            r.requests,
            r.connections,
            r.measured_requests,
            r.sim_secs,
            r.throughput,
            r.hit_rate,
            r.mbps,
            r.mean_response_ms,
            r.mean_cpu_idle,
            r.mean_disk_idle,
            r.frontend_utilization,
            r.forwards,
            r.handoffs,
            r.policy_rejections,
            r.policy_reassignments,
            r.policy_replicas
        )?;
    }
    Ok(())
}

/// One line per node of every run.
pub fn write_nodes_csv(out: &mut dyn Write, runs: &[RunResult]) -> io::Result<()> {
    writeln!(out, "{NODES_CSV_HEADER}")?;
    for r in runs {
        for n in &r.per_node {
            writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{:.6},{},{},{},{},{},{:.6},{:.6},{},{}",
                field(&r.label),
                field(&r.preset),
                field(&r.policy),
                r.mechanism,
                r.http,
                r.nodes,
                n.node,
                n.requests,
                n.hits,
                n.misses,
                n.hit_rate,
                n.bytes,
                n.connections,
                n.handoffs_in,
                n.forwards_served,
                n.forwards_relayed,
                n.cpu_idle,
                n.disk_idle,
                n.cached_bytes,
                n.cached_objects
            )?;
        }
    }
    Ok(())
}

/// A human-readable summary of a run.
pub fn describe(r: &RunResult) -> String {
    let mut s = String::new();
    let name = if r.label.is_empty() {
        format!("{} / {} / HTTP {}", r.policy, r.mechanism, r.http)
    } else {
        r.label.clone()
    };
    let _ = writeln!(
        s,
        "{name}: {} nodes ({} costs), {} clients, {} MB cache per node",
        r.nodes,
        r.preset,
        r.clients,
        r.cache_bytes / (1024 * 1024)
    );
    let _ = writeln!(
        s,
        "  throughput {:.1} req/s ({:.1} Mb/s), hit rate {:.2} %, {} requests in {:.2} simulated s, mean response {:.1} ms",
        r.throughput,
        r.mbps,
        r.hit_rate * 100.0,
        r.measured_requests,
        r.sim_secs,
        r.mean_response_ms
    );
    let _ = writeln!(
        s,
        "  idle: CPU {:.1} %, disk {:.1} % (mean over nodes); forwards {}, handoffs {}, policy refusals {}",
        r.mean_cpu_idle * 100.0,
        r.mean_disk_idle * 100.0,
        r.forwards,
        r.handoffs,
        r.policy_rejections
    );
    let _ = writeln!(
        s,
        "  node  requests   hit %  CPU idle %  disk idle %  connections"
    );
    for n in &r.per_node {
        let _ = writeln!(
            s,
            "  {:>4}  {:>8}  {:>6.2}  {:>10.1}  {:>11.1}  {:>11}",
            n.node,
            n.requests,
            n.hit_rate * 100.0,
            n.cpu_idle * 100.0,
            n.disk_idle * 100.0,
            n.connections
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunResult {
        RunResult {
            label: "a,b".into(),
            policy: "lard".into(),
            mechanism: RequestDistribution::Single,
            http: Http::V10,
            preset: "apache".into(),
            nodes: 1,
            clients: 29,
            cache_bytes: 1 << 20,
            requests: 10,
            connections: 10,
            measured_requests: 10,
            sim_secs: 1.0,
            throughput: 10.0,
            hit_rate: 0.5,
            mbps: 0.1,
            mean_response_ms: 3.0,
            mean_cpu_idle: 0.9,
            mean_disk_idle: 0.2,
            frontend_utilization: 0.0,
            forwards: 0,
            handoffs: 0,
            policy_rejections: 0,
            policy_reassignments: 0,
            policy_replicas: 0,
            per_node: vec![NodeResult {
                node: 0,
                requests: 10,
                hits: 5,
                misses: 5,
                hit_rate: 0.5,
                bytes: 100,
                connections: 10,
                handoffs_in: 0,
                forwards_served: 0,
                forwards_relayed: 0,
                cpu_idle: 0.9,
                disk_idle: 0.2,
                cached_bytes: 50,
                cached_objects: 5,
            }],
        }
    }

    #[test]
    fn csv_has_one_line_per_run_and_per_node() {
        let mut out = Vec::new();
        write_runs_csv(&mut out, &[run()]).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].starts_with("\"a,b\",apache,lard,single,1.0,1,29,"));
        let cols = RUNS_CSV_HEADER.split(',').count();
        // The quoted label holds one comma.
        assert_eq!(lines[1].split(',').count(), cols + 1);
        let mut out = Vec::new();
        write_nodes_csv(&mut out, &[run()]).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert_eq!(
            text.lines().nth(1).unwrap().split(',').count(),
            NODES_CSV_HEADER.split(',').count() + 1
        );
    }

    #[test]
    fn json_and_text() {
        let v = serde_json::to_value(run()).unwrap();
        assert_eq!(v["mechanism"], "single");
        assert_eq!(v["http"], "1.0");
        assert_eq!(v["per_node"][0]["hits"], 5);
        assert!(describe(&run()).contains("hit rate 50.00 %"));
    }
}
