//! The switch's `/status.json`: the nodes, the policy and one-way delivery,
//! for people and scripts. These types are what the switch serializes and
//! what a reader of the page deserializes.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use switchyard_policy::Mechanism;

/// The whole page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SwitchStatus {
    /// The configuration generation in force (1 at start, one more per reload).
    pub generation: u64,
    /// The dispatching policy's name.
    pub policy: String,
    /// Client connections open.
    pub connections_active: u64,
    /// Requests waiting for a node below its in-flight cap.
    pub queue_length: u64,
    /// Requests retried on another node since start.
    pub retries: u64,
    /// The policy's counters.
    pub policy_stats: PolicyCounters,
    /// The nodes of the generation in force, by node id.
    pub nodes: Vec<NodeStatus>,
    /// How responses reach clients.
    pub mechanism: Mechanism,
    /// One-way delivery.
    pub handoff: HandoffStatus,
}

/// The policy's counters since start.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyCounters {
    /// Requests given a node.
    pub decisions: u64,
    /// Requests refused (no node up, or all saturated).
    pub rejections: u64,
    /// Targets mapped to at least one node (LARD family).
    pub targets_mapped: u64,
    /// Extra (target, node) mappings beyond the first per target.
    pub replicas: u64,
    /// Times a target's mapping moved to another node.
    pub reassignments: u64,
    /// Requests `chash` placed past their home node because of the load bound.
    pub spills: u64,
}

/// One node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node id: its index in the configured node list.
    pub id: u32,
    /// The node's HTTP address.
    pub addr: SocketAddr,
    /// Whether the node is taken into account.
    pub up: bool,
    /// Requests the switch has in flight on the node.
    pub active: u64,
    /// Requests sent to the node since start.
    pub requests: u64,
    /// Response bytes relayed from the node since start.
    pub bytes: u64,
    /// Failed requests or connections to the node since start.
    pub failures: u64,
    /// Idle pooled connections to the node.
    pub pool_idle: u64,
    /// Targets the policy maps to the node (LARD family).
    pub targets: u64,
    /// The load the policy uses for the node.
    pub load: f64,
}

/// One-way delivery counters since start, and the steering backend.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffStatus {
    /// Connections handed off as descriptors (same host).
    pub fd: u64,
    /// Connections handed off as `TCP_REPAIR` state (another host).
    pub repair: u64,
    /// Connections nodes gave back to the switch.
    pub hand_backs: u64,
    /// Requests a node served by fetching from another node.
    pub backend_forwards: u64,
    /// Handed-off connections open now.
    pub connections_active: u64,
    /// The steering backend in use (`ebpf`, `nftables`), if any.
    pub steering: Option<String>,
    /// Steering entries installed now.
    pub steering_entries: u64,
    /// Why steering is not available, if it is not.
    pub steering_error: Option<String>,
    /// Handoffs the node accepted after the switch's `Cancel` (served by the node).
    pub late_accepts: u64,
    /// Handoffs whose answer stayed unknown, closed unanswered, by reason.
    pub abandoned: BTreeMap<String, u64>,
    /// Handoffs that could not happen, by reason: relayed instead, except `abandoned`.
    pub fallbacks: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_json_with_the_page_s_field_names() {
        let s = SwitchStatus {
            generation: 2,
            policy: "ext-lard".into(),
            connections_active: 3,
            queue_length: 0,
            retries: 1,
            policy_stats: PolicyCounters {
                decisions: 10,
                ..PolicyCounters::default()
            },
            nodes: vec![NodeStatus {
                id: 0,
                addr: "127.0.0.1:8081".parse().unwrap(),
                up: true,
                active: 1,
                requests: 10,
                bytes: 4096,
                failures: 0,
                pool_idle: 2,
                targets: 5,
                load: 1.5,
            }],
            mechanism: Mechanism::Handoff,
            handoff: HandoffStatus {
                steering_error: Some("no \"bpf\"".into()),
                fallbacks: [("timeout".to_owned(), 4)].into_iter().collect(),
                ..HandoffStatus::default()
            },
        };
        let text = serde_json::to_string(&s).unwrap();
        for field in [
            "\"policy\":\"ext-lard\"",
            "\"addr\":\"127.0.0.1:8081\"",
            "\"up\":true",
            "\"mechanism\":\"handoff\"",
            "\"steering\":null",
            "\"steering_error\":\"no \\\"bpf\\\"\"",
            "\"fallbacks\":{\"timeout\":4}",
        ] {
            assert!(text.contains(field), "{field} missing in {text}");
        }
        let back: SwitchStatus = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
    }
}
