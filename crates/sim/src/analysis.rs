//! Multiple handoff versus back-end forwarding by response size (seed 003 §5, Figs. 5 and 6).
//!
//! The paper's analysis takes a four-node cluster and the pessimistic assumption that every
//! request after the first on a persistent connection is served by a node other than the one
//! handling the connection. Multiple handoff then pays a handoff per such request, back-end
//! forwarding pays the handling node's per-byte relaying; the first wins for large responses,
//! the second for small ones, and the crossover lies at 12 KB (Apache) and 6 KB (Flash),
//! nearly independent of the number of requests per connection.
//!
//! Two versions are computed here:
//!
//! * the closed form: per connection of `k` requests of `S` bytes, all cached, the CPU work is
//!   `connect + teardown + k·(request + S/512·transmit) + (k − 1)·X` with
//!   `X = handoff` or `X = forward_request + S/512·forward`, and `nodes` CPUs deliver
//!   `nodes·k / work` requests per second;
//! * the simulation of the same situation: a workload of connections of `k` requests of one size,
//!   served from memory (the disk costs nothing here), and [`Pessimistic`], a policy that sends
//!   every later request to the next node.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use switchyard_policy::{
    ConnId, Decision, LoadReport, NodeId, NodeSpec, Outcome, Policy, PolicyError, PolicyStats,
    Reject, Request, RequestClass,
};

use crate::config::{CpuCosts, DiskCosts, RequestDistribution, SimConfig};
use crate::plot::{Chart, Line};
use crate::sim::simulate_with_policy;
use crate::workload::{Http, SimWorkload, Targets};
use crate::SimError;

/// The pessimistic placement of seed 003 §5: the first request of a connection goes to the next
/// node in turn; every later request is served by the node after the one handling the
/// connection, by back-end forwarding or by handing the connection off. Not a dispatching policy
/// anyone should use — the bound of the analysis.
#[derive(Debug, Default)]
pub struct Pessimistic {
    handoff: bool,
    nodes: Vec<NodeId>,
    next: usize,
    conns: HashMap<ConnId, usize>,
    decisions: u64,
}

impl Pessimistic {
    /// The placement, moving connections (`handoff`) or forwarding responses.
    pub fn new(handoff: bool) -> Self {
        Pessimistic {
            handoff,
            ..Pessimistic::default()
        }
    }
}

impl Policy for Pessimistic {
    fn name(&self) -> &'static str {
        "pessimistic"
    }

    fn init(&mut self, nodes: &[NodeSpec], _now: Duration) -> Result<(), PolicyError> {
        self.nodes = nodes.iter().map(|n| n.id).collect();
        self.next = 0;
        self.conns.clear();
        Ok(())
    }

    fn add_node(&mut self, node: NodeSpec, _now: Duration) -> Result<(), PolicyError> {
        if self.nodes.contains(&node.id) {
            return Err(PolicyError::DuplicateNode(node.id));
        }
        self.nodes.push(node.id);
        Ok(())
    }

    fn node_up(&mut self, _node: NodeId, _now: Duration) {}

    fn node_down(&mut self, _node: NodeId, _now: Duration) {}

    fn connection_start(&mut self, _conn: ConnId, _now: Duration) {}

    fn connection_end(&mut self, conn: ConnId, _now: Duration) {
        self.conns.remove(&conn);
    }

    fn parse(&self, _req: &Request<'_>) -> RequestClass {
        RequestClass::DEFAULT
    }

    fn class_name(&self, _class: RequestClass) -> &str {
        "default"
    }

    fn select(&mut self, req: &Request<'_>, _now: Duration) -> Result<Decision, Reject> {
        let n = self.nodes.len();
        if n == 0 {
            return Err(Reject::NoNode);
        }
        self.decisions += 1;
        Ok(match self.conns.get(&req.conn).copied() {
            None => {
                let h = self.next;
                self.next = (self.next + 1) % n;
                self.conns.insert(req.conn, h);
                Decision::Serve {
                    node: self.nodes[h],
                    cache: true,
                }
            }
            Some(h) => {
                let to = (h + 1) % n;
                if self.handoff {
                    self.conns.insert(req.conn, to);
                    Decision::Handoff {
                        from: self.nodes[h],
                        to: self.nodes[to],
                    }
                } else {
                    Decision::Forward {
                        handler: self.nodes[h],
                        source: self.nodes[to],
                    }
                }
            }
        })
    }

    fn post_request(&mut self, _conn: ConnId, _node: NodeId, _outcome: &Outcome, _now: Duration) {}

    fn load_report(&mut self, _node: NodeId, _report: &LoadReport, _now: Duration) {}

    fn shutdown(&mut self) {
        self.conns.clear();
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: "pessimistic",
            decisions: self.decisions,
            ..PolicyStats::default()
        }
    }

    fn mapped_nodes(&self, _req: &Request<'_>) -> Vec<NodeId> {
        Vec::new()
    }
}

/// Cluster bandwidth in Mb/s of the closed form, for back-end forwarding and multiple handoff.
pub fn model_mbps(cpu: &CpuCosts, nodes: u32, k: f64, size: f64) -> (f64, f64) {
    let blocks = size / 512.0;
    let base =
        cpu.connect_us + cpu.teardown_us + k * (cpu.request_us + blocks * cpu.transmit_per_512_us);
    let fwd = base + (k - 1.0) * (cpu.forward_request_us + blocks * cpu.forward_per_512_us);
    let ho = base + (k - 1.0) * cpu.handoff_us;
    let mbps = |work_us: f64| f64::from(nodes) * k / work_us * 1e6 * size * 8.0 / 1e6;
    (mbps(fwd), mbps(ho))
}

/// Response size (bytes) at which the closed form's two mechanisms deliver the same bandwidth.
pub fn model_crossover_bytes(cpu: &CpuCosts) -> Option<f64> {
    if cpu.forward_per_512_us <= 0.0 {
        return None;
    }
    Some(((cpu.handoff_us - cpu.forward_request_us) / cpu.forward_per_512_us * 512.0).max(0.0))
}

/// One response size of the comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CrossoverPoint {
    /// Response size in KB (1024 bytes).
    pub size_kb: f64,
    /// Closed form, back-end forwarding, Mb/s.
    pub model_forward_mbps: f64,
    /// Closed form, multiple handoff, Mb/s.
    pub model_handoff_mbps: f64,
    /// Simulated, back-end forwarding, Mb/s.
    pub sim_forward_mbps: f64,
    /// Simulated, multiple handoff, Mb/s.
    pub sim_handoff_mbps: f64,
}

/// The comparison for one cost model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Crossover {
    /// Cost preset name.
    pub preset: String,
    /// Nodes (4 in the paper).
    pub nodes: u32,
    /// Requests per connection.
    pub requests_per_connection: u32,
    /// By response size.
    pub points: Vec<CrossoverPoint>,
    /// Where the closed form's curves cross, KB.
    pub model_crossover_kb: Option<f64>,
    /// Where the simulated curves cross (linear interpolation between sizes), KB.
    pub sim_crossover_kb: Option<f64>,
}

/// Parameters of [`crossover`].
#[derive(Debug, Clone)]
pub struct CrossoverSpec {
    /// Costs and cluster (nodes, cache); policy and mechanism are set per run.
    pub base: SimConfig,
    /// Response sizes in KB.
    pub sizes_kb: Vec<f64>,
    /// Requests per connection (the first, then one pipelined batch of the rest).
    pub requests_per_connection: u32,
    /// Connections simulated per size.
    pub connections: u32,
}

impl CrossoverSpec {
    /// The paper's setting: four nodes, sizes from 1 to 32 KB, five requests per connection.
    pub fn paper(base: SimConfig) -> Self {
        let mut base = base;
        base.nodes = 4;
        base.clients = Some(64);
        CrossoverSpec {
            base,
            sizes_kb: vec![
                1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0,
                32.0,
            ],
            requests_per_connection: 5,
            connections: 3000,
        }
    }
}

fn crossing(points: &[(f64, f64, f64)]) -> Option<f64> {
    // (x, forward, handoff): first x where handoff catches up with forwarding.
    let d = |p: &(f64, f64, f64)| p.2 - p.1;
    for w in points.windows(2) {
        let (a, b) = (d(&w[0]), d(&w[1]));
        if a == 0.0 {
            return Some(w[0].0);
        }
        if a < 0.0 && b >= 0.0 {
            return Some(w[0].0 + (w[1].0 - w[0].0) * (-a) / (b - a));
        }
    }
    None
}

/// Runs the comparison.
pub fn crossover(spec: &CrossoverSpec) -> Result<Crossover, SimError> {
    if spec.base.nodes < 2 {
        return Err(SimError::Config(
            "the crossover analysis needs at least two nodes".into(),
        ));
    }
    let k = spec.requests_per_connection.max(2);
    const TARGETS: u32 = 64;
    let mut points = Vec::new();
    for &kb in &spec.sizes_kb {
        let size = (kb * 1024.0).round() as u64;
        let targets = Arc::new(Targets {
            keys: (0..TARGETS).map(|i| format!("/o{i}").into()).collect(),
            sizes: vec![size; TARGETS as usize],
        });
        let conns: Vec<Vec<Vec<u32>>> = (0..spec.connections)
            .map(|c| {
                let t = |j: u32| (c * 7 + j * 13) % TARGETS;
                vec![vec![t(0)], (1..k).map(t).collect()]
            })
            .collect();
        let w = SimWorkload::from_connections(targets, Http::V11, &conns)?;
        let run = |handoff: bool| -> Result<f64, SimError> {
            let mut c = spec.base.clone();
            c.mechanism = if handoff {
                RequestDistribution::Handoff
            } else {
                RequestDistribution::Forward
            };
            // The analysis is about CPU costs: every response comes from memory.
            c.disk = DiskCosts {
                seek_us: 0.0,
                per_4k_us: 0.0,
                extent_seek_us: 0.0,
                ..c.disk
            };
            c.warmup_requests = u64::from(k) * u64::from(spec.connections / 5);
            let r = simulate_with_policy(&c, &w, Box::new(Pessimistic::new(handoff)))?;
            Ok(r.mbps)
        };
        let (sf, sh) = (run(false)?, run(true)?);
        let (mf, mh) = model_mbps(&spec.base.cpu, spec.base.nodes, f64::from(k), size as f64);
        points.push(CrossoverPoint {
            size_kb: kb,
            model_forward_mbps: mf,
            model_handoff_mbps: mh,
            sim_forward_mbps: sf,
            sim_handoff_mbps: sh,
        });
    }
    let sim: Vec<_> = points
        .iter()
        .map(|p| (p.size_kb, p.sim_forward_mbps, p.sim_handoff_mbps))
        .collect();
    Ok(Crossover {
        preset: spec.base.preset.clone(),
        nodes: spec.base.nodes,
        requests_per_connection: k,
        model_crossover_kb: model_crossover_bytes(&spec.base.cpu).map(|b| b / 1024.0),
        sim_crossover_kb: crossing(&sim),
        points,
    })
}

/// The chart of seed 003 Figs. 5 and 6: bandwidth versus response size, simulated (solid) and
/// closed form (dashed).
pub fn crossover_chart(c: &Crossover) -> Chart {
    let get = |f: fn(&CrossoverPoint) -> f64| -> Vec<(f64, f64)> {
        c.points.iter().map(|p| (p.size_kb, f(p))).collect()
    };
    Chart {
        title: format!(
            "{}: multiple handoff vs back-end forwarding, {} nodes",
            c.preset, c.nodes
        ),
        x_label: "average response size (KB)".into(),
        y_label: "cluster bandwidth (Mb/s)".into(),
        lines: vec![
            Line {
                name: "back-end forwarding".into(),
                points: get(|p| p.sim_forward_mbps),
                dashed: false,
            },
            Line {
                name: "multiple handoff".into(),
                points: get(|p| p.sim_handoff_mbps),
                dashed: false,
            },
            Line {
                name: "forwarding (closed form)".into(),
                points: get(|p| p.model_forward_mbps),
                dashed: true,
            },
            Line {
                name: "handoff (closed form)".into(),
                points: get(|p| p.model_handoff_mbps),
                dashed: true,
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Preset;
    use switchyard_policy::PolicyKind;

    #[test]
    fn closed_form_crosses_at_the_papers_sizes() {
        for (p, kb) in [(Preset::Apache, 12.0), (Preset::Flash, 6.0)] {
            let cpu = p.cpu();
            assert_eq!(model_crossover_bytes(&cpu), Some(kb * 1024.0));
            for k in [2.0, 5.0, 20.0] {
                let (f, h) = model_mbps(&cpu, 4, k, kb * 1024.0 * 0.5);
                assert!(f > h, "{p}: forwarding wins small responses");
                let (f, h) = model_mbps(&cpu, 4, k, kb * 1024.0 * 2.0);
                assert!(h > f, "{p}: handoff wins large responses");
            }
        }
    }

    #[test]
    fn crossing_interpolates() {
        assert_eq!(crossing(&[(1.0, 10.0, 8.0), (3.0, 10.0, 12.0)]), Some(2.0));
        assert_eq!(crossing(&[(1.0, 10.0, 8.0), (3.0, 10.0, 9.0)]), None);
    }

    #[test]
    fn pessimistic_sends_later_requests_elsewhere() {
        let mut p = Pessimistic::new(false);
        p.init(&[NodeSpec::new(0), NodeSpec::new(1)], Duration::ZERO)
            .unwrap();
        let c = ConnId(1);
        let r = Request::get(c, "/a");
        assert_eq!(
            p.select(&r, Duration::ZERO).unwrap(),
            Decision::Serve {
                node: NodeId(0),
                cache: true
            }
        );
        assert_eq!(
            p.select(&r, Duration::ZERO).unwrap(),
            Decision::Forward {
                handler: NodeId(0),
                source: NodeId(1)
            }
        );
        let mut h = Pessimistic::new(true);
        h.init(&[NodeSpec::new(0), NodeSpec::new(1)], Duration::ZERO)
            .unwrap();
        h.select(&r, Duration::ZERO).unwrap();
        assert_eq!(
            h.select(&r, Duration::ZERO).unwrap(),
            Decision::Handoff {
                from: NodeId(0),
                to: NodeId(1)
            }
        );
        assert_eq!(
            h.select(&r, Duration::ZERO).unwrap(),
            Decision::Handoff {
                from: NodeId(1),
                to: NodeId(0)
            }
        );
    }

    #[test]
    fn simulated_crossover_is_near_the_closed_form() {
        let base = SimConfig::new(4, PolicyKind::Rr, RequestDistribution::Forward)
            .with_preset(Preset::Flash);
        let mut spec = CrossoverSpec::paper(base);
        spec.sizes_kb = vec![4.0, 5.0, 6.0, 7.0, 8.0];
        spec.connections = 1000;
        let c = crossover(&spec).unwrap();
        let x = c
            .sim_crossover_kb
            .unwrap_or_else(|| panic!("no crossing: {:#?}", c.points));
        assert!((x - 6.0).abs() < 1.0, "{x}");
        assert_eq!(c.model_crossover_kb, Some(6.0));
    }
}
