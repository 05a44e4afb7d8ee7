//! A cooperative node's `/status.json`: the cluster as this member sees it — the members and
//! their control connections, where this node's requests went (the owner map at work), clones,
//! and hot-object replication. Every member serves its own view; the types are what the node
//! serializes and what a reader of the page deserializes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The whole page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// This node's member name.
    pub name: String,
    /// The owner map's policy.
    pub policy: String,
    /// Every member, this node included, in configuration order.
    pub members: Vec<MemberStatus>,
    /// Requests cloned to their owners and not finished yet.
    pub clones_outstanding: u64,
    /// Requests owned by a peer served here after all, by reason.
    pub fallbacks: BTreeMap<String, u64>,
    /// Hot-object replication; `None` when it is off.
    pub replication: Option<ReplicationStatus>,
}

/// One member, as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Its name.
    pub name: String,
    /// Its control address (`unix:PATH` or `IP:PORT`).
    pub control: String,
    /// This node itself.
    pub this_node: bool,
    /// Whether it counts in the owner map (its control connection is up; always for this node).
    pub up: bool,
    /// Requests this node's owner map gave it since start: the map's share for each member.
    pub routed: u64,
    /// Connections cloned to it (it accepted them).
    pub clones: u64,
    /// Clones it gave back.
    pub hand_backs: u64,
    /// Clones lost with its control connection or abandoned.
    pub lost: u64,
}

/// Replication counters and the hottest targets this node owns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicationStatus {
    /// Copies of peers' hot objects held here.
    pub replicas: u64,
    /// Their bytes.
    pub replica_bytes: u64,
    /// The replica cache's budget.
    pub replica_capacity_bytes: u64,
    /// Requests for a peer's target served here from a copy.
    pub replica_hits: u64,
    /// Copies of this node's hot objects sent to peers.
    pub objects_shipped: u64,
    /// Targets this node owns that are hot now, hottest first (at most ten): target and aged
    /// reference count.
    pub hottest: Vec<(String, f64)>,
}
