//! A cooperative node's `/status.json`: the cluster as this member sees it — the members and
//! their control connections, where this node's requests went (the owner map at work), clones,
//! and hot-object replication. Every member serves its own view; the types are what the node
//! serializes and what a reader of the page deserializes.
//!
//! [`MemberSample`] is what a member serves at `/member.json` for the others' dashboards: its
//! own cumulative figures, from which any member builds the whole cluster's update.

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
    /// This member's flash-crowd rescue, with `[rescue.peering]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescue: Option<crate::status::RescueStatus>,
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

/// One member's own figures at one instant (`/member.json`): cumulative counters and gauges,
/// so that a reader that misses one loses nothing (rates come from the difference of two).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberSample {
    /// Its member name.
    pub name: String,
    /// Responses it sent so far.
    pub requests: u64,
    /// Response bytes it sent so far.
    pub bytes: u64,
    /// Client connections open on it now.
    pub connections: u64,
    /// Its own load in its owner map (requests in flight it serves as owner).
    pub load: f64,
    /// Targets its owner map gives it now (`lard`-family maps; 0 for `chash`, which keeps no
    /// table).
    pub targets: u64,
    /// Clones peers moved to it and it took, so far.
    pub clones_in: u64,
    /// Clones it gave back, so far.
    pub hand_backs: u64,
    /// Connections it cloned to an owner and lost (the owner's control connection ended while
    /// the owner held them, or nobody knows whether the owner took them), so far.
    pub clones_lost: u64,
    /// Requests owned by a peer that it served after all, so far, by reason.
    pub fallbacks: BTreeMap<String, u64>,
    /// Requests whose source (memory cache or disk) it knows, so far.
    pub cache_lookups: u64,
    /// Of those, answered from its memory cache.
    pub cache_hits: u64,
    /// Its response times so far: cumulative counts per bucket of
    /// `switchyard_admin::dashboard::latency` (trailing empty buckets left out).
    pub latency: Vec<u64>,
    /// Copies of peers' hot objects it holds now; `None` with replication off.
    pub replicas: Option<u64>,
    /// Targets in its owner map (`lard` family), and extra (target, member) mappings.
    pub targets_mapped: u64,
    /// Extra (target, member) mappings beyond the first per target.
    pub map_replicas: u64,
    /// The targets most requested of it during its last one-second period, most first:
    /// target, the member owning it, requests.
    pub hot: Vec<(String, String, u64)>,
}
