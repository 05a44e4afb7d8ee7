//! The switch's Prometheus metrics and its `/status.json` page.
//!
//! Hot-path counters are plain atomics (those every response adds to, one set per worker); a
//! collector turns them, the per-node counters and the policy's own statistics into metric
//! families when `/metrics` is scraped:
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `switchyard_switch_requests_total` | `status` | responses sent to clients: relayed, the switch's own, and those nodes report for requests the switch dispatched on handed-off connections |
//! | `switchyard_switch_connections_total`, `_connections_active` | | client connections accepted, open |
//! | `switchyard_switch_accept_failures_total`, `_accept_backoffs_total` | | failed accepts; pauses of an accept loop out of descriptors or memory |
//! | `switchyard_switch_connections_shed_total` | | connections waiting on their clients closed to make room for new ones |
//! | `switchyard_switch_local_errors_total` | | node connections that failed for lack of local descriptors or memory (the node is not blamed) |
//! | `switchyard_switch_rejections_total` | `reason` | `connection_limit`, `queue_full`, `queue_timeout`, `no_node`, `bad_request` |
//! | `switchyard_switch_retries_total` | | requests sent again to another node |
//! | `switchyard_switch_queue_length` | | requests waiting for a node |
//! | `switchyard_switch_timeouts_total` | | client header, idle and send timeouts |
//! | `switchyard_switch_splice_bytes_total` | | response body bytes moved with splice(2) |
//! | `switchyard_switch_reloads_total`, `_node_transitions_total` | | reloads, nodes going down or up |
//! | `switchyard_switch_health_checks_total`, `_health_failures_total` | | active checks run, failed |
//! | `switchyard_switch_load_reports_total`, `_load_reports_invalid_total` | | node load reports taken, refused |
//! | `switchyard_switch_relay_seconds` | | histogram: request head parsed → response relayed (bounds 50 µs × 2.25^k) |
//! | `switchyard_switch_node_requests_total` | `node` | responses relayed from the node or reported served by it |
//! | `switchyard_switch_node_bytes_total` | `node` | response bytes of those |
//! | `switchyard_switch_node_active` | `node` | requests in flight on the node |
//! | `switchyard_switch_node_failures_total` | `node` | failed connections and requests |
//! | `switchyard_switch_node_connects_total` | `node` | connections opened to the node |
//! | `switchyard_switch_node_pool_idle` | `node` | idle pooled connections |
//! | `switchyard_switch_node_up` | `node` | 1 when the node may be chosen |
//! | `switchyard_switch_node_targets`, `_node_load` | `node` | targets the policy maps to it, its load |
//! | `switchyard_switch_node_reported_connections`, `_reported_disk_queue` | `node` | its last load report |
//! | `switchyard_switch_policy_*_total` | `policy` | `decisions`, `rejections`, `reassignments`, `spills`, `forwards`, `evictions` |
//! | `switchyard_switch_policy_targets_mapped`, `_replicas` | `policy` | mapped targets, extra replicas |
//! | `switchyard_handoff_fd_total`, `_repair_total` | | connections handed to nodes (same host, across hosts) |
//! | `switchyard_handoff_hand_backs_total` | | connections nodes gave back (multiple handoff) |
//! | `switchyard_handoff_backend_forwards_total` | | requests routed to another node's content (back-end forwarding) |
//! | `switchyard_handoff_fallbacks_total` | `reason` | handoffs that could not happen; relayed instead, except `abandoned` (closed unanswered) |
//! | `switchyard_handoff_abandoned_total` | `reason` | handoffs whose answer stayed unknown (`cancel_timeout`, `control_failed`) |
//! | `switchyard_handoff_late_accepts_total` | | handoffs accepted after the switch's `Cancel` (served by the node) |
//! | `switchyard_handoff_connections_active` | | connections living on nodes now |
//! | `switchyard_handoff_steering_entries` | | steering entries live |
//! | `switchyard_handoff_latency_seconds` | | histogram: handoff decision → node's `Accepted` |

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use switchyard_admin::encode::{counter, gauge, labelled, response_times};

pub use crate::counters::{Rejection, SwitchMetrics};
use crate::state::Shared;
use switchyard_admin::status::{HandoffStatus, NodeStatus, PolicyCounters, SwitchStatus};

/// Register the switch's metrics into `registry`.
pub(crate) fn register(registry: &mut Registry, shared: Arc<Shared>) {
    shared.handoffs.metrics.register(registry);
    registry.register_collector(Box::new(SwitchCollector { shared }));
}

/// A per-node family: name, help, counter (else gauge), values by node.
type NodeFamily = (&'static str, &'static str, bool, Vec<(String, u64)>);

#[derive(Debug)]
struct SwitchCollector {
    shared: Arc<Shared>,
}

impl Collector for SwitchCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = &self.shared.metrics;
        labelled(
            &mut enc,
            "switchyard_switch_requests",
            "Responses sent to clients, by status code",
            "status",
            true,
            m.statuses(),
        )?;
        response_times(
            &mut enc,
            "switchyard_switch_relay_seconds",
            "Time from a parsed request head to its response relayed to the client",
            &m.relay_times(),
        )?;
        labelled(
            &mut enc,
            "switchyard_switch_rejections",
            "Requests and connections refused by the switch, by reason",
            "reason",
            true,
            Rejection::ALL
                .iter()
                .map(|r| (r.as_str().to_owned(), m.rejections(*r))),
        )?;
        let simple: [(&str, &str, u64); 15] = [
            (
                "switchyard_switch_connections",
                "Client connections accepted",
                m.connections_total.load(Relaxed),
            ),
            (
                "switchyard_switch_accept_failures",
                "Accepts that failed",
                self.shared.accepts.failures.load(Relaxed),
            ),
            (
                "switchyard_switch_accept_backoffs",
                "Pauses of an accept loop out of descriptors or memory",
                self.shared.accepts.backoffs.load(Relaxed),
            ),
            (
                "switchyard_switch_connections_shed",
                "Connections waiting on their clients closed to make room for new ones",
                self.shared.accepts.shed.load(Relaxed),
            ),
            (
                "switchyard_switch_local_errors",
                "Node connections that failed for lack of local descriptors or memory",
                self.shared.metrics.local_errors.load(Relaxed),
            ),
            (
                "switchyard_switch_retries",
                "Requests sent again to another node",
                m.retries.load(Relaxed),
            ),
            (
                "switchyard_switch_timeouts",
                "Client header, idle and send timeouts",
                m.timeouts.load(Relaxed),
            ),
            (
                "switchyard_switch_splice_bytes",
                "Response body bytes moved with splice",
                m.splice_bytes(),
            ),
            (
                "switchyard_switch_reloads",
                "Configuration reloads",
                m.reloads.load(Relaxed),
            ),
            (
                "switchyard_switch_node_transitions",
                "Nodes going down or coming up",
                m.node_transitions.load(Relaxed),
            ),
            (
                "switchyard_switch_health_checks",
                "Active health checks run",
                m.health_checks.load(Relaxed),
            ),
            (
                "switchyard_switch_health_failures",
                "Active health checks failed",
                m.health_failures.load(Relaxed),
            ),
            (
                "switchyard_switch_load_reports",
                "Node load reports applied",
                m.reports.load(Relaxed),
            ),
            (
                "switchyard_switch_load_reports_invalid",
                "Datagrams that were not reports of a known node",
                m.reports_invalid.load(Relaxed),
            ),
            (
                "switchyard_switch_policy_generation",
                "Configuration generation in force",
                self.shared.current().id,
            ),
        ];
        for (name, help, v) in simple {
            if name.ends_with("generation") {
                gauge(&mut enc, name, help, v as i64)?;
            } else {
                counter(&mut enc, name, help, v)?;
            }
        }
        gauge(
            &mut enc,
            "switchyard_switch_connections_active",
            "Client connections open",
            m.connections_active.load(Relaxed) as i64,
        )?;
        gauge(
            &mut enc,
            "switchyard_switch_queue_length",
            "Requests waiting for a node",
            self.shared.queue_len.load(Relaxed) as i64,
        )?;

        let g = self.shared.current();
        let stats = g.policy.lock().stats();
        let per_node = |f: &dyn Fn(usize) -> u64| -> Vec<(String, u64)> {
            g.nodes
                .iter()
                .enumerate()
                .map(|(i, b)| (b.label.clone(), f(i)))
                .collect()
        };
        let node_families: [NodeFamily; 11] = [
            (
                "switchyard_switch_node_requests",
                "Responses relayed from the node or reported served by it",
                true,
                per_node(&|i| g.nodes[i].requests()),
            ),
            (
                "switchyard_switch_node_bytes",
                "Response bytes relayed from the node or reported sent by it",
                true,
                per_node(&|i| g.nodes[i].bytes()),
            ),
            (
                "switchyard_switch_node_failures",
                "Failed connections and requests on the node",
                true,
                per_node(&|i| g.nodes[i].failures.load(Relaxed)),
            ),
            (
                "switchyard_switch_node_connects",
                "Connections opened to the node",
                true,
                per_node(&|i| g.nodes[i].connects.load(Relaxed)),
            ),
            (
                "switchyard_switch_node_active",
                "Requests in flight on the node",
                false,
                per_node(&|i| g.nodes[i].active.load(Relaxed)),
            ),
            (
                "switchyard_switch_node_pool_idle",
                "Idle pooled connections to the node",
                false,
                per_node(&|i| g.nodes[i].idle_count() as u64),
            ),
            (
                "switchyard_switch_node_up",
                "1 when the node may be chosen",
                false,
                per_node(&|i| g.nodes[i].is_up() as u64),
            ),
            (
                "switchyard_switch_node_targets",
                "Targets the policy maps to the node",
                false,
                per_node(&|i| stats.nodes.get(i).map_or(0, |n| n.targets)),
            ),
            (
                "switchyard_switch_node_load",
                "Load the policy uses for the node",
                false,
                per_node(&|i| stats.nodes.get(i).map_or(0, |n| n.load.round() as u64)),
            ),
            (
                "switchyard_switch_node_reported_connections",
                "Open connections in the node's last load report",
                false,
                per_node(&|i| {
                    g.nodes[i]
                        .last_report
                        .lock()
                        .map_or(0, |r| u64::from(r.active_connections))
                }),
            ),
            (
                "switchyard_switch_node_reported_disk_queue",
                "Disk queue in the node's last load report",
                false,
                per_node(&|i| {
                    g.nodes[i]
                        .last_report
                        .lock()
                        .map_or(0, |r| u64::from(r.disk_queue))
                }),
            ),
        ];
        for (name, help, is_counter, values) in node_families {
            labelled(&mut enc, name, help, "node", is_counter, values)?;
        }

        let policy = stats.policy.to_owned();
        let policy_families: [(&str, &str, bool, u64); 8] = [
            (
                "switchyard_switch_policy_decisions",
                "Requests the policy placed",
                true,
                stats.decisions,
            ),
            (
                "switchyard_switch_policy_rejections",
                "Requests the policy could not place",
                true,
                stats.rejections,
            ),
            (
                "switchyard_switch_policy_reassignments",
                "Targets moved to another node",
                true,
                stats.reassignments,
            ),
            (
                "switchyard_switch_policy_spills",
                "Requests placed past their home node by the load bound",
                true,
                stats.spills,
            ),
            (
                "switchyard_switch_policy_forwards",
                "Requests served by back-end forwarding",
                true,
                stats.forwards,
            ),
            (
                "switchyard_switch_policy_evictions",
                "Targets dropped from the full mapping table",
                true,
                stats.evictions,
            ),
            (
                "switchyard_switch_policy_targets_mapped",
                "Targets mapped to at least one node",
                false,
                stats.targets_mapped,
            ),
            (
                "switchyard_switch_policy_replicas",
                "Extra target-to-node mappings beyond the first",
                false,
                stats.replicas,
            ),
        ];
        for (name, help, is_counter, v) in policy_families {
            labelled(
                &mut enc,
                name,
                help,
                "policy",
                is_counter,
                [(policy.clone(), v)],
            )?;
        }
        Ok(())
    }
}

/// `/status.json`: the nodes and the policy, for people and scripts.
pub(crate) fn status(shared: &Shared) -> SwitchStatus {
    let g = shared.current();
    let stats = g.policy.lock().stats();
    let m = &shared.metrics;
    let nodes = g
        .nodes
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let ns = stats.nodes.get(i);
            NodeStatus {
                id: i as u32,
                addr: b.addr,
                up: b.is_up(),
                active: b.active.load(Relaxed),
                requests: b.requests(),
                bytes: b.bytes(),
                failures: b.failures.load(Relaxed),
                pool_idle: b.idle_count() as u64,
                targets: ns.map_or(0, |n| n.targets),
                load: ns.map_or(0.0, |n| n.load),
            }
        })
        .collect();
    let h = &shared.handoffs;
    SwitchStatus {
        generation: g.id,
        policy: stats.policy.to_owned(),
        connections_active: m.connections_active.load(Relaxed),
        queue_length: shared.queue_len.load(Relaxed) as u64,
        retries: m.retries.load(Relaxed),
        policy_stats: PolicyCounters {
            decisions: stats.decisions,
            rejections: stats.rejections,
            targets_mapped: stats.targets_mapped,
            replicas: stats.replicas,
            reassignments: stats.reassignments,
            spills: stats.spills,
        },
        nodes,
        mechanism: g.cfg.mechanism,
        handoff: HandoffStatus {
            fd: h.metrics.handoffs_fd.get(),
            repair: h.metrics.handoffs_repair.get(),
            hand_backs: h.metrics.hand_backs.get(),
            backend_forwards: h.metrics.backend_forwards.get(),
            connections_active: h.metrics.handed_active.get().max(0) as u64,
            steering: h.steering_kind().map(str::to_owned),
            steering_entries: h.steering_live() as u64,
            steering_error: h.steering_error.clone(),
            late_accepts: h.metrics.late_accepts.get(),
            abandoned: ["cancel_timeout", "control_failed"]
                .into_iter()
                .map(|r| (r.to_owned(), h.metrics.abandoned_for(r)))
                .collect(),
            fallbacks: h
                .fallbacks()
                .map(|(reason, n)| (reason.to_owned(), n))
                .collect(),
        },
        rescue: shared.rescue.as_ref().map(|r| r.driver.status()),
    }
}

/// `/status.json` as JSON text.
pub(crate) fn status_json(shared: &Shared) -> String {
    // Plain data with string keys: serialization cannot fail.
    serde_json::to_string(&status(shared)).unwrap_or_default()
}
