//! Cooperative clusters without a front end (seed 000, Cyclone): six ways for nodes that
//! clients reach by layer-4 round robin to share their memories, on the decision code the real
//! nodes run.
//!
//! # What runs
//!
//! * **Owner map**: one `switchyard-policy` policy per node ([`CoopConfig::owner_policy`],
//!   `chash` with the node's defaults unless set), initialized with member ids that are the
//!   FNV-1a of the member names `n1` … `nN` (the demo's; from `n0`, the lab's, with
//!   [`CoopConfig::first_member`]), exactly as `switchyard node --cooperative` derives them,
//!   and driven as the node drives it: `connection_start`, `select` per
//!   request, `post_request` when the response is out, `connection_end`. Each node keeps its
//!   own policy, so a bounded-load policy sees only the requests that node dispatched.
//! * **Caches**: each node's object cache is a [`switchyard_cache::Cache`]; replication uses
//!   [`HotTargets`] on the owner (`reference` for every request it serves as owner, `ship` after
//!   it answered a request a peer moved to it while the object is in its memory) and
//!   [`Replicas`] on the holder (`get` before moving a request, `insert` with the copies, the age
//!   since the owner last checked the object and the freshness interval when a copy arrives).
//!
//! # The systems ([`System`], seed 000 §5)
//!
//! * **RR**: every node serves everything itself from its own cache and disk.
//! * **CF-LRU, CF-LFU** (cooperative caching with cache forwarding): a node serves the targets
//!   it owns from its own cache (or disk); for a target a peer owns it fetches the whole object
//!   from the owner's memory (the owner reads its cache, or its disk, and sends the object over
//!   its link) and then sends it to the client, keeping no copy, as the node's `fetch` mode
//!   does. So each node's cache holds only what it owns and the cluster's memory is one cache,
//!   which is how seed 000 §5.2 saw no disk access and no replacement for CF at 8 nodes. The
//!   owner's cache is LRU or LFU with aging.
//! * **CF-REP**: CF with hot-object replication. A fetched object is kept by the fetching node
//!   only when the owner says it is hot, in the replica cache; objects a node owns live in its
//!   object cache, LFU with aging. So the object caches hold no duplicates.
//! * **SC** (socket cloning): a request owned by a peer moves with its connection to the owner,
//!   which serves it from its cache (or disk) and answers the client over its own link. The
//!   clone costs [`CoopCosts::clone_us`], half on each node.
//! * **Cyclone**: SC with hot-object replication: a node holding a fresh replica serves the
//!   request itself; an owner that served a cloned request for a hot target sends the entry
//!   node a copy (over its link) right after the response.
//!
//! # The cost model
//!
//! Every node has a CPU and a disk, each a FIFO server, and an outgoing link shared by the
//! transfers in flight on it as TCP shares it ([`LinkModel::Shared`]: processor sharing, so a
//! small response is not held up behind a large one; [`LinkModel::Fifo`] sends one after the
//! other, which lets one large response idle the clients queued behind it). The CPU pays
//! [`CoopCosts`] (connection setup and teardown on the node the client reached, a per-request
//! cost on the node that answers, a transmit cost per 512 bytes sent, the clone and fetch
//! costs); the disk is the [`DiskCosts`] model of the switch simulator; the link carries every
//! byte that leaves the node, responses and copies for peers alike, at
//! [`CoopConfig::link_mbps`]. The available bandwidth of the cluster is `nodes × link rate`, and
//! efficiency is response bytes per second over it (seed 000 §5.2.2).
//!
//! Clients: a closed loop of [`CoopConfig::clients`] connections (38 in seed 000 §5.1) replaying
//! the workload's connections in order; the `k`-th connection of each replay reaches node
//! `k mod N` (LVS round robin). The requests of a connection go one at a time. The workload is replayed
//! [`CoopConfig::warmup_passes`] times before the pass that is measured, so that the caches are
//! warm as they were after the paper's 3.9 million requests. The measurement window runs from
//! the start of the measured pass's first connection to the start of its last one, so that the
//! whole population of clients is at work all along; every request finished in it counts.
//!
//! Not modelled: the per-packet cost of forwarding a clone's client acknowledgements (seed 000
//! §4.2 measured it as small), response headers beyond [`CoopConfig::header_bytes`], TCP's
//! slow start and round trips (a transfer gets its share of the link at once), and files
//! changing on disk (a replica's age is only the time since the owner's last check).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_cache::replication::{
    HotTargets, Lookup, ReplicaStats, Replicas, ReplicationSettings,
};
use switchyard_cache::Cache;
use switchyard_policy::{ConnId, NodeId, NodeSpec, Outcome, Policy, PolicyConfig};
use switchyard_trace::SynthConfig;

use crate::config::{us_to_ns, DiskCosts, Nanos};
use crate::engine::EventQueue;
use crate::workload::SimWorkload;
use crate::SimError;

/// One of the six systems of seed 000 §5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum System {
    /// Layer-4 round robin: each node serves everything itself.
    #[serde(rename = "RR")]
    Rr,
    /// Cooperative caching with cache forwarding, LRU caches.
    #[serde(rename = "CF-LRU")]
    CfLru,
    /// Cooperative caching with cache forwarding, LFU caches with aging.
    #[serde(rename = "CF-LFU")]
    CfLfu,
    /// Cache forwarding with hot-object replication.
    #[serde(rename = "CF-REP")]
    CfRep,
    /// Socket cloning.
    #[serde(rename = "SC")]
    Sc,
    /// Socket cloning with hot-object replication.
    #[serde(rename = "Cyclone")]
    Cyclone,
}

impl System {
    /// Every system, in the order of the paper's figures.
    pub const ALL: [System; 6] = [
        System::Rr,
        System::CfLru,
        System::CfLfu,
        System::CfRep,
        System::Sc,
        System::Cyclone,
    ];

    /// Its name in the paper.
    pub fn as_str(self) -> &'static str {
        match self {
            System::Rr => "RR",
            System::CfLru => "CF-LRU",
            System::CfLfu => "CF-LFU",
            System::CfRep => "CF-REP",
            System::Sc => "SC",
            System::Cyclone => "Cyclone",
        }
    }

    /// Whether hot objects are replicated.
    pub fn replicates(self) -> bool {
        matches!(self, System::CfRep | System::Cyclone)
    }

    fn forwards(self) -> bool {
        matches!(self, System::CfLru | System::CfLfu | System::CfRep)
    }

    fn clones(self) -> bool {
        matches!(self, System::Sc | System::Cyclone)
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for System {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        System::ALL
            .into_iter()
            .find(|x| x.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                SimError::Config(format!(
                    "unknown system `{s}` (known: RR, CF-LRU, CF-LFU, CF-REP, SC, Cyclone)"
                ))
            })
    }
}

/// CPU costs of a node in cooperative mode, in microseconds.
///
/// The paper gives one figure: a clone costs 46 µs in all on its Pentium III 733 nodes
/// (seed 000 §4.2). The others are chosen for a kernel web server (kHTTPd) on such a node: a
/// cached 6 KB response costs about 190 µs, so a node could send more than its 100 Mbit/s link
/// carries and the links, not the CPUs, limit a cluster that avoids its disks (as they did in
/// the paper's 8-node runs). A cache-forwarding fetch costs the fetching node a request and
/// reply exchange and copying the object into its cache, and the owner a lookup and sending it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoopCosts {
    /// Connection establishment on the node the client reached.
    pub connect_us: f64,
    /// Connection teardown on that node.
    pub teardown_us: f64,
    /// Per request, on the node that answers the client.
    pub request_us: f64,
    /// Per 512 bytes (or part) sent, to a client or to a peer.
    pub transmit_per_512_us: f64,
    /// A socket clone in all, half on the node that clones and half on the owner.
    pub clone_us: f64,
    /// A cache-forwarding fetch, on the fetching node (request, reply, bookkeeping).
    pub fetch_request_us: f64,
    /// A cache-forwarding fetch, on the owner (lookup and reply).
    pub fetch_serve_us: f64,
    /// Per 512 bytes received from a peer and stored (a fetched object or a replica).
    pub receive_per_512_us: f64,
}

impl Default for CoopCosts {
    fn default() -> Self {
        CoopCosts {
            connect_us: 30.0,
            teardown_us: 30.0,
            request_us: 80.0,
            transmit_per_512_us: 4.0,
            clone_us: 46.0,
            fetch_request_us: 120.0,
            fetch_serve_us: 60.0,
            receive_per_512_us: 4.0,
        }
    }
}

impl CoopCosts {
    fn check(&self) -> Result<(), SimError> {
        for (key, v) in [
            ("connect_us", self.connect_us),
            ("teardown_us", self.teardown_us),
            ("request_us", self.request_us),
            ("transmit_per_512_us", self.transmit_per_512_us),
            ("clone_us", self.clone_us),
            ("fetch_request_us", self.fetch_request_us),
            ("fetch_serve_us", self.fetch_serve_us),
            ("receive_per_512_us", self.receive_per_512_us),
        ] {
            if !(v.is_finite() && (0.0..=1e9).contains(&v)) {
                return Err(SimError::Config(format!(
                    "{key} must be a number of microseconds in 0..=1e9, got {v}"
                )));
            }
        }
        Ok(())
    }
}

/// How a node's outgoing link carries the transfers in flight on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkModel {
    /// As TCP shares a link between connections: processor sharing, each of the `n`
    /// transfers in flight moving at `1/n` of the rate, so that a small response is not held up
    /// behind a large one.
    #[default]
    Shared,
    /// One transfer after the other, in arrival order.
    Fifo,
}

impl FromStr for LinkModel {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "shared" => Ok(LinkModel::Shared),
            "fifo" => Ok(LinkModel::Fifo),
            _ => Err(SimError::Config(format!(
                "unknown link model `{s}` (known: shared, fifo)"
            ))),
        }
    }
}

/// One simulated cooperative cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct CoopConfig {
    /// Nodes.
    pub nodes: u32,
    /// The system.
    pub system: System,
    /// The owner map (default `chash` with the node's defaults).
    pub owner_policy: PolicyConfig,
    /// CPU costs.
    pub costs: CoopCosts,
    /// The disk: one per node, or the cluster's one file server ([`CoopConfig::shared_disk`]).
    pub disk: DiskCosts,
    /// Whether every node reads from one shared file server (seed 000 §5.1: the documents came
    /// over NFS from one server) rather than a disk of its own.
    pub shared_disk: bool,
    /// Payload rate of each node's outgoing link, megabits (10^6 bits) per second.
    pub link_mbps: f64,
    /// How a link carries the transfers in flight on it.
    pub link_model: LinkModel,
    /// Bytes of a response head, sent on the link with every response and not counted as
    /// throughput.
    pub header_bytes: u64,
    /// Object cache of each node, bytes.
    pub cache_bytes: u64,
    /// Largest object the object caches keep (the node's `cache_max_object_bytes`, 1 MiB by
    /// default): a larger one is read from the disk for every request, as the node sends it
    /// from the file.
    pub cache_max_object_bytes: u64,
    /// Replacement policy of the object caches of RR, SC and Cyclone (CF-LRU uses LRU, CF-LFU and
    /// CF-REP LFU with aging).
    pub cache_policy: switchyard_cache::PolicyKind,
    /// Replication settings (CF-REP and Cyclone): threshold, aging, replica bytes.
    pub replication: ReplicationSettings,
    /// How long a copy may be served after its owner last checked the object (the node's
    /// `cache_revalidate_ms`).
    pub replica_fresh: Duration,
    /// Client connections open at once.
    pub clients: u32,
    /// Unmeasured replays of the workload before the measured one.
    pub warmup_passes: u32,
    /// Whether each replay of the workload starts only once every request of the one before
    /// has been answered, as when a client replays a trace again after its first run ended
    /// (`bench/cyclone/sim-vs-real.sh`); otherwise the clients go on from one replay to the
    /// next without a pause, and the measured one starts with the queues the last one left.
    pub separate_passes: bool,
    /// The number in the first member's name: `n1` as `switchyard demo --cooperative` names
    /// its members (the default), `n0` as `switchyard lab up --cooperative` does. The owner map
    /// hashes the names, so a simulation compared with a real cluster must name its members as
    /// that cluster does, or it draws another map (other owners for the hot objects).
    pub first_member: u32,
}

/// The node's default `cache_max_object_bytes`.
pub const NODE_CACHE_MAX_OBJECT_BYTES: u64 = 1024 * 1024;

/// The name of member `i` (from 0) of a simulated cluster whose first member's name carries
/// the number `first` ([`CoopConfig::first_member`]).
pub fn member_name(first: u32, i: u32) -> String {
    format!("n{}", first + i)
}

/// A member's id in the owner map: FNV-1a of its name.
///
/// This must stay identical to `member_id` in `crates/node/src/coop.rs` (the node crate keeps it
/// private), so that the simulated owner map is the one real members compute; the test
/// `member_ids_match_the_nodes_vectors` holds both to the same FNV-1a test vectors.
pub fn member_id(name: &str) -> NodeId {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    NodeId(h)
}

/// The file server of the default configuration: the disk model of the switch simulator with
/// 5 ms per read instead of 28 ms of positioning, for a server whose own memory holds part of
/// the documents (seed 000 §5.1 gives no figure).
pub fn nfs_disk() -> DiskCosts {
    DiskCosts {
        seek_us: 5_000.0,
        ..DiskCosts::default()
    }
}

/// Default replication settings of the simulator: the node's (`[cluster.replication]`) with a
/// replica cache of `replica_bytes`.
pub fn default_replication(replica_bytes: u64) -> ReplicationSettings {
    ReplicationSettings {
        threshold: switchyard_cache::replication::DEFAULT_HOT_THRESHOLD,
        aging_interval: Duration::from_secs(10),
        aging_factor: 0.5,
        max_tracked: 65_536,
        replica_bytes,
        max_object_bytes: 1024 * 1024,
    }
}

impl CoopConfig {
    /// `nodes` nodes running `system` with 100 Mbit/s links, 100 MB object caches, 12 MB replica
    /// caches (seed 000 §3.3's share), 38 clients and one warm-up pass.
    pub fn new(nodes: u32, system: System) -> Self {
        CoopConfig {
            nodes,
            system,
            owner_policy: PolicyConfig::owner_map(),
            costs: CoopCosts::default(),
            disk: nfs_disk(),
            shared_disk: true,
            link_mbps: 100.0,
            link_model: LinkModel::Shared,
            header_bytes: 0,
            cache_bytes: 100_000_000,
            cache_max_object_bytes: NODE_CACHE_MAX_OBJECT_BYTES,
            cache_policy: switchyard_cache::PolicyKind::Lru,
            replication: default_replication(12_000_000),
            replica_fresh: Duration::from_secs(1),
            clients: 38,
            warmup_passes: 1,
            separate_passes: false,
            first_member: 1,
        }
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.nodes == 0 || self.nodes > 4096 {
            return Err(SimError::Config(format!(
                "nodes must be 1..=4096, got {}",
                self.nodes
            )));
        }
        if self.clients == 0 {
            return Err(SimError::Config("clients must be at least 1".into()));
        }
        if !(self.link_mbps.is_finite() && self.link_mbps > 0.0 && self.link_mbps <= 1e6) {
            return Err(SimError::Config(format!(
                "link rate must be in (0, 1e6] Mbit/s, got {}",
                self.link_mbps
            )));
        }
        if self.warmup_passes > 100 {
            return Err(SimError::Config("at most 100 warm-up passes".into()));
        }
        self.costs.check()?;
        self.disk.check()?;
        self.cache_policy
            .validate()
            .map_err(|e| SimError::Config(format!("cache policy: {e}")))?;
        self.replication
            .validate()
            .map_err(|e| SimError::Config(format!("replication: {e}")))?;
        self.owner_policy.validate()?;
        Ok(())
    }

    fn main_cache_kind(&self) -> switchyard_cache::PolicyKind {
        let lfu = switchyard_cache::PolicyKind::Lfu {
            aging_interval_ms: u64::try_from(self.replication.aging_interval.as_millis())
                .unwrap_or(u64::MAX),
            aging_factor: self.replication.aging_factor,
        };
        match self.system {
            System::CfLru => switchyard_cache::PolicyKind::Lru,
            System::CfLfu | System::CfRep => lfu,
            _ => self.cache_policy,
        }
    }

    /// Bytes per second one link carries.
    pub fn link_bytes_per_sec(&self) -> f64 {
        self.link_mbps * 1e6 / 8.0
    }
}

/// Where a request's response came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The object cache of the node the client reached.
    Local,
    /// The disk of the node the client reached.
    LocalDisk,
    /// A replica held by the node the client reached.
    Replica,
    /// The owner's memory (after a clone or a fetch).
    Owner,
    /// The owner's disk (after a clone or a fetch).
    OwnerDisk,
}

/// One finished request, as reported to an observer of [`simulate_coop_observed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoopCompletion {
    /// Index of the request in the workload (connection order).
    pub request: usize,
    /// Replay pass (0 is the first warm-up pass; the last pass is measured).
    pub pass: u32,
    /// Node the client reached.
    pub entry: u32,
    /// Node that sent the response.
    pub server: u32,
    /// Where the response came from.
    pub source: Source,
    /// Simulated time the last byte left.
    pub time: Nanos,
}

/// Figures of one node over the measurement window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoopNode {
    /// Node index (member `n{node + first_member}`, [`CoopConfig::first_member`]).
    pub node: u32,
    /// Client connections that reached it.
    pub connections: u64,
    /// Responses it sent.
    pub responses: u64,
    /// Bytes that left it: responses (with heads) and objects for peers.
    pub bytes_out: u64,
    /// Of which objects sent to peers (fetches and replicas).
    pub peer_bytes_out: u64,
    /// Share of the time its link was busy.
    pub link_utilization: f64,
    /// Share of the time its CPU was busy.
    pub cpu_utilization: f64,
    /// Share of the time its disk was busy.
    pub disk_utilization: f64,
    /// Bytes in its object cache at the end.
    pub cached_bytes: u64,
    /// Replicas it holds at the end.
    pub replicas: u64,
    /// Bytes of those replicas.
    pub replica_bytes: u64,
    /// Budget of its replica cache.
    pub replica_capacity: u64,
    /// Its replica cache's counters (whole run).
    pub replica_hits: u64,
    /// Copies it stored (whole run).
    pub replicas_stored: u64,
    /// Replicas it dropped because they were no longer fresh (whole run).
    pub replicas_expired: u64,
    /// Copies it sent as owner (whole run).
    pub copies_shipped: u64,
    /// Stale copies of its objects it renewed as owner without sending them again (whole run).
    pub copies_renewed: u64,
}

/// Figures of one cooperative run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoopResult {
    /// System.
    pub system: System,
    /// Nodes.
    pub nodes: u32,
    /// Client connections open at once.
    pub clients: u32,
    /// Owner map policy.
    pub owner_policy: String,
    /// Object cache per node.
    pub cache_bytes: u64,
    /// Replica cache per node (0 for systems without replication).
    pub replica_bytes: u64,
    /// Link rate per node, Mbit/s.
    pub link_mbps: f64,
    /// Requests finished in the measurement window.
    pub measured_requests: u64,
    /// Simulated seconds of the measurement window.
    pub sim_secs: f64,
    /// Requests per second.
    pub throughput: f64,
    /// Response body megabytes (10^6 bytes) per second.
    pub mbytes_per_sec: f64,
    /// Response bytes per second over the cluster's available bandwidth (`nodes × link`).
    pub efficiency: f64,
    /// Share of requests answered from the entry node's object cache.
    pub local_hit_rate: f64,
    /// Share answered from the owner's memory (after a clone or fetch).
    pub owner_hit_rate: f64,
    /// Share answered from a replica on the entry node.
    pub replica_hit_rate: f64,
    /// Share that needed a disk read.
    pub disk_rate: f64,
    /// Clones per request.
    pub clones_per_request: f64,
    /// Cache-forwarding fetches per request.
    pub fetches_per_request: f64,
    /// Copies of hot objects sent to peers during the measurement window.
    pub copies_shipped: u64,
    /// Bytes sent between nodes over bytes sent to clients.
    pub peer_traffic_share: f64,
    /// Bytes out of the busiest node over the mean.
    pub max_bytes_over_mean: f64,
    /// Responses of the busiest node over the mean.
    pub max_responses_over_mean: f64,
    /// Mean time from a request to its first byte leaving the cluster, milliseconds.
    pub mean_first_byte_ms: f64,
    /// Mean time from a request to its last byte, milliseconds.
    pub mean_response_ms: f64,
    /// Mean CPU utilization.
    pub mean_cpu_utilization: f64,
    /// Mean link utilization.
    pub mean_link_utilization: f64,
    /// Requests the owner map sent away from a target's home node (bounded loads).
    pub owner_map_reassignments: u64,
    /// The measured pass as a whole, counted as a client replaying the trace once and the
    /// nodes' counters see it.
    pub pass: CoopPass,
    /// Per node.
    pub per_node: Vec<CoopNode>,
}

/// Figures of the measured pass as a whole: every request of it, wherever it finished, over
/// the time from its first request to its last response. This is what a real cluster
/// replaying the trace after a warm-up pass shows: the client's throughput over the pass and
/// the nodes' counters read before and after it (`bench/cyclone/sim-vs-real.sh`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CoopPass {
    /// Requests.
    pub requests: u64,
    /// Seconds from its first request to its last response.
    pub secs: f64,
    /// Requests per second over those seconds.
    pub throughput: f64,
    /// Response body megabytes (10^6 bytes) per second.
    pub mbytes_per_sec: f64,
    /// Share of requests answered from an object cache (the entry node's or the owner's):
    /// the nodes' cache hits over all requests.
    pub memory_hit_rate: f64,
    /// Share answered from the entry node's object cache.
    pub local_hit_rate: f64,
    /// Share answered from the owner's memory after a clone or fetch.
    pub owner_hit_rate: f64,
    /// Share answered from a replica.
    pub replica_hit_rate: f64,
    /// Share that needed a disk read (the nodes' cache misses over all requests).
    pub disk_rate: f64,
    /// Clones per request.
    pub clones_per_request: f64,
    /// Cache-forwarding fetches per request.
    pub fetches_per_request: f64,
    /// Copies of hot objects sent to peers for requests of the pass.
    pub copies_shipped: u64,
}

/// Runs `workload` on the cooperative cluster `cfg`.
pub fn simulate_coop(cfg: &CoopConfig, workload: &SimWorkload) -> Result<CoopResult, SimError> {
    simulate_coop_observed(cfg, workload, |_| {})
}

/// Like [`simulate_coop`], calling `observe` for every finished request in completion order.
pub fn simulate_coop_observed(
    cfg: &CoopConfig,
    workload: &SimWorkload,
    observe: impl FnMut(CoopCompletion),
) -> Result<CoopResult, SimError> {
    cfg.validate()?;
    if workload.requests() == 0 {
        return Err(SimError::Workload("the workload has no requests".into()));
    }
    Coop::new(cfg, workload, observe)?.run()
}

// ---- the model ----------------------------------------------------------------------------

/// A FIFO resource of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Res {
    Cpu,
    Disk,
}

/// An event: the job in service on a FIFO resource is done, or the first flow of a link's
/// flow set of a given generation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Done(Res, u32),
    Link(u32, u64),
}

#[derive(Debug, Clone, Copy)]
struct Job {
    dur: Nanos,
    slot: u32,
}

/// A FIFO server: the job at the head is in service.
#[derive(Debug, Default)]
struct Server {
    queue: VecDeque<Job>,
    started: Nanos,
    busy_ns: Nanos,
}

impl Server {
    fn busy_at(&self, now: Nanos) -> Nanos {
        match self.queue.front() {
            Some(_) => self.busy_ns + (now - self.started),
            None => self.busy_ns,
        }
    }
}

/// A node's outgoing link, carrying the transfers in flight on it (responses and objects for
/// peers) by [`LinkModel`].
///
/// A transfer's work is the time it would take alone on the link, in nanoseconds. Whenever the
/// set of transfers changes the link brings their remaining work up to date; `generation` tells
/// the completion event scheduled for the current set from those scheduled for earlier ones.
#[derive(Debug, Default)]
struct SharedLink {
    model: LinkModel,
    /// In arrival order.
    flows: Vec<Flow>,
    /// When the flows' remaining work was last brought up to date.
    updated: Nanos,
    busy_ns: Nanos,
    generation: u64,
}

#[derive(Debug, Clone, Copy)]
struct Flow {
    /// Work left, nanoseconds at the link's full rate.
    left: f64,
    slot: u32,
}

impl SharedLink {
    fn new(model: LinkModel) -> Self {
        SharedLink {
            model,
            ..SharedLink::default()
        }
    }

    /// How many flows move at once, each at that share of the rate.
    fn moving(&self) -> usize {
        match self.model {
            LinkModel::Shared => self.flows.len(),
            LinkModel::Fifo => self.flows.len().min(1),
        }
    }

    /// Brings the flows' remaining work up to `now`.
    fn update(&mut self, now: Nanos) {
        let elapsed = now.saturating_sub(self.updated);
        self.updated = now;
        let k = self.moving();
        if k == 0 || elapsed == 0 {
            return;
        }
        self.busy_ns += elapsed;
        let share = elapsed as f64 / k as f64;
        for f in &mut self.flows[..k] {
            f.left -= share;
        }
    }

    /// When the first flow in flight finishes, if any: whole nanoseconds, rounded up.
    fn next_completion(&self, now: Nanos) -> Option<Nanos> {
        let k = self.moving();
        let least = self.flows[..k]
            .iter()
            .map(|f| f.left)
            .fold(f64::INFINITY, f64::min);
        if !least.is_finite() {
            return None;
        }
        Some(now + (least.max(0.0) * k as f64).ceil() as Nanos)
    }

    /// Removes and returns the flows done by now (less than a nanosecond of work left at
    /// their share), in arrival order.
    fn take_finished(&mut self) -> Vec<u32> {
        let k = self.moving();
        let mut done = Vec::new();
        let mut i = 0;
        let mut moving = k;
        while i < moving {
            if self.flows[i].left * (k as f64) < 1.0 {
                done.push(self.flows.remove(i).slot);
                moving -= 1;
            } else {
                i += 1;
            }
        }
        done
    }

    fn busy_at(&self, now: Nanos) -> Nanos {
        if self.flows.is_empty() {
            self.busy_ns
        } else {
            self.busy_ns + now.saturating_sub(self.updated)
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    connections: u64,
    responses: u64,
    bytes_out: u64,
    peer_bytes_out: u64,
    shipped: u64,
}

struct Node {
    cpu: Server,
    disk: Server,
    link: SharedLink,
    cache: Cache<u32, ()>,
    /// When this node, as owner, last checked each object it caches against its disk.
    validated: HashMap<u32, Nanos>,
    owners: Box<dyn Policy>,
    hot: Option<HotTargets<u32, u32>>,
    replicas: Option<Replicas<u32, ()>>,
    c: Counters,
    /// Stale copies renewed as owner (whole run).
    renewed: u64,
    /// Busy times (CPU, disk, link) when the measurement window opens and closes.
    mark: (Nanos, Nanos, Nanos),
    mark_end: Option<(Nanos, Nanos, Nanos)>,
}

/// A step of a request's path, taken in order.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// CPU work on a node.
    Cpu(u32, Nanos),
    /// A disk read of the request's object on a node.
    Disk(u32),
    /// Bytes leaving a node: a response (to the client) or an object (to a peer).
    Link {
        node: u32,
        bytes: u64,
        response: bool,
    },
    /// The request's object enters a node's object cache.
    Insert(u32),
    /// `node` serves the object from its cache or disk for the client, as owner (counted by
    /// replication) or not; with `ship`, the owner of a cloned request for a hot target sends
    /// the entry node a copy as it answers.
    Serve {
        node: u32,
        owner: bool,
        ship: bool,
        check: bool,
    },
    /// `owner` sends the object to `entry`, which keeps it (CF) or keeps it only if hot (CF-REP).
    Fetch { owner: u32 },
    /// The entry node sends the object it holds to the client.
    Answer,
    /// The response is out: the request counts as done.
    Done,
    /// The owner, having answered a cloned request, may ship a copy to the entry node, or
    /// only renew the entry node's stale copy (`check`: the request came with its validator;
    /// the simulated objects never change, so a check always finds the copy current).
    Ship { owner: u32, check: bool },
    /// The owner's renewal of a stale copy arrives at the entry node.
    Renew { copies: u32, age: Nanos },
    /// A copy with `copies` copies, checked `age` ago, arrives at the entry node.
    Replica { copies: u32, age: Nanos },
    /// The connection ends.
    Close,
}

/// A client slot of the closed loop and what it is doing.
struct Slot {
    /// Connection being run (in replay order over all passes), `usize::MAX` when finished.
    seq: usize,
    conn: ConnId,
    entry: u32,
    /// Requests of the connection: next and end.
    next: usize,
    end: usize,
    /// Request under way.
    req: usize,
    target: u32,
    size: u64,
    steps: VecDeque<Step>,
    /// Node the owner map chose for the request under way (posted when it is answered).
    chosen: Option<u32>,
    source: Source,
    server: u32,
    start: Nanos,
    first_byte: Option<Nanos>,
    measured: bool,
    /// The connection's last steps (close, teardown) are under way.
    closing: bool,
    /// Work left after a response (a copy for the entry node), carried on without the client.
    background: bool,
}

impl Slot {
    /// A slot with nothing to run; `background` for one that carries work left after a
    /// response (copies sent to peers) rather than a client.
    fn idle(background: bool) -> Self {
        Slot {
            seq: usize::MAX,
            conn: ConnId(0),
            entry: 0,
            next: 0,
            end: 0,
            req: 0,
            target: 0,
            size: 0,
            steps: VecDeque::new(),
            chosen: None,
            source: Source::Local,
            server: 0,
            start: 0,
            first_byte: None,
            measured: false,
            closing: false,
            background,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    requests: u64,
    body_bytes: u64,
    local: u64,
    local_disk: u64,
    replica: u64,
    owner: u64,
    owner_disk: u64,
    clones: u64,
    fetches: u64,
    shipped: u64,
    first_byte_ns: u128,
    response_ns: u128,
    last_done: Nanos,
}

struct Coop<'a, F> {
    cfg: &'a CoopConfig,
    w: &'a SimWorkload,
    q: EventQueue<Ev>,
    nodes: Vec<Node>,
    index: HashMap<NodeId, u32>,
    slots: Vec<Slot>,
    /// Background slots free for reuse.
    idle: Vec<u32>,
    ready: VecDeque<u32>,
    next_seq: usize,
    total_seqs: usize,
    measure_from_seq: usize,
    measure_start: Option<Nanos>,
    /// Client slots waiting for the replay before theirs to end ([`CoopConfig::separate_passes`]).
    parked: Vec<u32>,
    /// Client connections under way.
    in_flight: usize,
    /// When the last connection started: every client is busy until then.
    measure_end: Option<Nanos>,
    reassign_mark: u64,
    /// Requests finished inside the measurement window (of any pass).
    t: Totals,
    /// Requests of the measured pass, wherever they finished.
    tm: Totals,
    observe: F,
    per_512: Nanos,
    recv_512: Nanos,
    link_ns_per_byte: f64,
    error: Option<SimError>,
}

fn blocks(size: u64, unit: u64) -> u64 {
    size.div_ceil(unit)
}

fn at(ns: Nanos) -> Duration {
    Duration::from_nanos(ns)
}

impl<'a, F: FnMut(CoopCompletion)> Coop<'a, F> {
    fn new(cfg: &'a CoopConfig, w: &'a SimWorkload, observe: F) -> Result<Self, SimError> {
        let specs: Vec<NodeSpec> = (0..cfg.nodes)
            .map(|i| NodeSpec::new(member_id(&member_name(cfg.first_member, i)).0))
            .collect();
        let mut index = HashMap::new();
        for (i, s) in specs.iter().enumerate() {
            if index.insert(s.id, i as u32).is_some() {
                return Err(SimError::Config(format!(
                    "member names hash to the same id at {} nodes",
                    cfg.nodes
                )));
            }
        }
        let kind = cfg.main_cache_kind();
        let mut nodes = Vec::with_capacity(cfg.nodes as usize);
        for _ in 0..cfg.nodes {
            let mut owners = switchyard_policy::build(&cfg.owner_policy)?;
            owners.init(&specs, Duration::ZERO)?;
            let (hot, replicas) = if cfg.system.replicates() {
                let bad = |e| SimError::Config(format!("replication: {e}"));
                (
                    Some(HotTargets::new(&cfg.replication).map_err(bad)?),
                    Some(Replicas::new(&cfg.replication).map_err(bad)?),
                )
            } else {
                (None, None)
            };
            let mut cache = Cache::with_kind(cfg.cache_bytes, kind);
            cache.set_max_object_bytes(Some(cfg.cache_max_object_bytes));
            nodes.push(Node {
                cpu: Server::default(),
                disk: Server::default(),
                link: SharedLink::new(cfg.link_model),
                cache,
                validated: HashMap::new(),
                owners,
                hot,
                replicas,
                renewed: 0,
                c: Counters::default(),
                mark: (0, 0, 0),
                mark_end: None,
            });
        }
        let conns = w.connections();
        let passes = cfg.warmup_passes as usize + 1;
        Ok(Coop {
            cfg,
            w,
            q: EventQueue::new(),
            nodes,
            index,
            slots: Vec::new(),
            idle: Vec::new(),
            ready: VecDeque::new(),
            next_seq: 0,
            total_seqs: conns * passes,
            measure_from_seq: conns * (passes - 1),
            measure_start: None,
            parked: Vec::new(),
            in_flight: 0,
            measure_end: None,
            reassign_mark: 0,
            t: Totals::default(),
            tm: Totals::default(),
            observe,
            per_512: us_to_ns(cfg.costs.transmit_per_512_us),
            recv_512: us_to_ns(cfg.costs.receive_per_512_us),
            link_ns_per_byte: 1e9 / cfg.link_bytes_per_sec(),
            error: None,
        })
    }

    fn now(&self) -> Nanos {
        self.q.now()
    }

    fn run(mut self) -> Result<CoopResult, SimError> {
        let population = (self.cfg.clients as usize).min(self.total_seqs);
        for s in 0..population {
            self.slots.push(Slot::idle(false));
            self.start_connection(s as u32);
        }
        self.drain();
        while let Some((_, ev)) = self.q.pop() {
            match ev {
                Ev::Done(res, n) => self.finish(res, n),
                Ev::Link(n, generation) => self.link_event(n, generation),
            }
            self.drain();
            if self.error.is_some() {
                break;
            }
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let want = self.w.requests() as u64;
        if self.tm.requests < want {
            return Err(SimError::Stalled {
                completed: self.tm.requests,
                requests: want,
            });
        }
        Ok(self.result())
    }

    // ---- servers ------------------------------------------------------------------------

    fn server(&mut self, res: Res, n: u32) -> &mut Server {
        let node = &mut self.nodes[n as usize];
        match res {
            Res::Cpu => &mut node.cpu,
            Res::Disk => &mut node.disk,
        }
    }

    /// Starts a transfer of `dur` nanoseconds (at the link's full rate) on `n`'s link.
    fn send(&mut self, n: u32, dur: Nanos, slot: u32) {
        let now = self.now();
        let link = &mut self.nodes[n as usize].link;
        if dur == 0 {
            self.ready.push_back(slot);
            return;
        }
        link.update(now);
        link.flows.push(Flow {
            left: dur as f64,
            slot,
        });
        self.reschedule_link(n);
    }

    /// Schedules the completion of the first flow of `n`'s link as it is now.
    fn reschedule_link(&mut self, n: u32) {
        let now = self.now();
        let link = &mut self.nodes[n as usize].link;
        link.generation += 1;
        if let Some(t) = link.next_completion(now) {
            let g = link.generation;
            self.q.schedule(t, Ev::Link(n, g));
        }
    }

    /// A completion scheduled on `n`'s link: the flows done go on (unless the set changed
    /// since the event was scheduled, which scheduled another).
    fn link_event(&mut self, n: u32, generation: u64) {
        let now = self.now();
        let link = &mut self.nodes[n as usize].link;
        if link.generation != generation {
            return;
        }
        link.update(now);
        let done = link.take_finished();
        self.ready.extend(done);
        self.reschedule_link(n);
    }

    /// Queues a job; one that costs nothing on an idle server is done at once.
    fn submit(&mut self, res: Res, n: u32, dur: Nanos, slot: u32) {
        let now = self.now();
        let s = self.server(res, n);
        if dur == 0 && s.queue.is_empty() {
            self.ready.push_back(slot);
            return;
        }
        s.queue.push_back(Job { dur, slot });
        if s.queue.len() == 1 {
            s.started = now;
            self.q.schedule(now + dur, Ev::Done(res, n));
        }
    }

    fn finish(&mut self, res: Res, n: u32) {
        let now = self.now();
        let s = self.server(res, n);
        let Some(job) = s.queue.pop_front() else {
            return;
        };
        s.busy_ns += job.dur;
        if let Some(next) = s.queue.front() {
            let d = next.dur;
            s.started = now;
            self.q.schedule(now + d, Ev::Done(res, n));
        }
        self.ready.push_back(job.slot);
    }

    fn drain(&mut self) {
        while let Some(s) = self.ready.pop_front() {
            self.advance(s);
        }
    }

    // ---- clients ------------------------------------------------------------------------

    fn start_connection(&mut self, s: u32) {
        let seq = self.next_seq;
        if seq >= self.total_seqs {
            self.slots[s as usize].seq = usize::MAX;
            return;
        }
        if self.cfg.separate_passes && seq > 0 && seq % self.w.connections() == 0 {
            // A new replay: it starts when every client has finished the one before.
            self.parked.push(s);
            if self.in_flight > 0 {
                return;
            }
            // The first of them takes the pass's first connection; the others follow.
            let parked = std::mem::take(&mut self.parked);
            let (first, rest) = parked.split_first().expect("at least this slot");
            self.start_pass_connection(*first);
            for &p in rest {
                self.start_connection(p);
            }
            return;
        }
        self.start_pass_connection(s);
    }

    /// Starts connection `next_seq` on slot `s`.
    fn start_pass_connection(&mut self, s: u32) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight += 1;
        let c = seq % self.w.connections();
        // Round robin within each replay of the trace: connection `c` of a pass reaches node
        // `c mod N`, as a client replaying the trace through a director's round robin (or
        // `switchyard load --spread`) sends it, so that a real replay's entry nodes are these.
        let entry = (c % self.cfg.nodes as usize) as u32;
        let reqs = self.w.conn_requests(c);
        let measured = seq >= self.measure_from_seq;
        if measured && self.measure_start.is_none() {
            self.measure_start = Some(self.now());
            self.mark();
        }
        let counting = self.counting();
        if self.next_seq == self.total_seqs && self.measure_start != Some(self.now()) {
            self.measure_end = Some(self.now());
            let now = self.now();
            for n in &mut self.nodes {
                n.mark_end = Some((n.cpu.busy_at(now), n.disk.busy_at(now), n.link.busy_at(now)));
            }
        }
        let connect = us_to_ns(self.cfg.costs.connect_us);
        let slot = &mut self.slots[s as usize];
        slot.seq = seq;
        slot.conn = ConnId(seq as u64);
        slot.entry = entry;
        slot.next = reqs.start;
        slot.end = reqs.end;
        slot.measured = measured;
        slot.steps.push_back(Step::Cpu(entry, connect));
        let now = at(self.q.now());
        let node = &mut self.nodes[entry as usize];
        node.owners.connection_start(ConnId(seq as u64), now);
        if counting {
            node.c.connections += 1;
        }
        self.next_request(s);
    }

    /// Begins the connection's next request, or closes it.
    fn next_request(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        if slot.next >= slot.end {
            slot.closing = true;
            slot.steps.push_back(Step::Close);
            let teardown = us_to_ns(self.cfg.costs.teardown_us);
            slot.steps.push_back(Step::Cpu(slot.entry, teardown));
            self.ready.push_back(s);
            return;
        }
        let i = slot.next;
        slot.next += 1;
        let target = self.w.target(i);
        slot.req = i;
        slot.target = target;
        slot.size = self.w.targets.sizes[target as usize];
        slot.start = self.q.now();
        slot.first_byte = None;
        slot.chosen = None;
        self.route(s);
        self.ready.push_back(s);
    }

    /// The owner map's choice for the slot's request: a node index (`select` counted it).
    fn owner(&mut self, s: u32) -> Option<u32> {
        let now = at(self.now());
        let slot = &self.slots[s as usize];
        let key = &self.w.targets.keys[slot.target as usize];
        let req = switchyard_policy::Request::get(slot.conn, key);
        let node = &mut self.nodes[slot.entry as usize];
        let d = node.owners.select(&req, now).ok()?;
        let i = *self.index.get(&d.node())?;
        self.slots[s as usize].chosen = Some(i);
        Some(i)
    }

    /// Decides the path of the slot's request on its entry node.
    fn route(&mut self, s: u32) {
        let sys = self.cfg.system;
        let (e, t) = {
            let slot = &self.slots[s as usize];
            (slot.entry, slot.target)
        };
        let now = at(self.now());
        if sys == System::Rr {
            self.push(
                s,
                Step::Serve {
                    node: e,
                    owner: false,
                    ship: false,
                    check: false,
                },
            );
            return;
        }
        let owner = self.owner(s);
        let o = match owner {
            Some(o) if o != e => o,
            // Owned here (or no map): served here, counted as owner.
            _ => {
                self.push(
                    s,
                    Step::Serve {
                        node: e,
                        owner: owner.is_some(),
                        ship: false,
                        check: false,
                    },
                );
                return;
            }
        };
        let mut check = false;
        if let Some(r) = self.nodes[e as usize].replicas.as_mut() {
            match r.lookup(&t, now) {
                Lookup::Fresh(()) => {
                    self.set_source(s, Source::Replica, e);
                    self.push(s, Step::Answer);
                    return;
                }
                Lookup::Stale(()) => check = true,
                Lookup::Miss => {}
            }
        }
        if sys.forwards() {
            self.push(s, Step::Fetch { owner: o });
        } else {
            debug_assert!(sys.clones());
            let half = us_to_ns(self.cfg.costs.clone_us) / 2;
            self.push(s, Step::Cpu(e, half));
            self.push(s, Step::Cpu(o, us_to_ns(self.cfg.costs.clone_us) - half));
            self.push(
                s,
                Step::Serve {
                    node: o,
                    owner: true,
                    ship: sys.replicates(),
                    check,
                },
            );
            if self.counting() {
                self.t.clones += 1;
            }
            if self.slots[s as usize].measured {
                self.tm.clones += 1;
            }
        }
    }

    fn push(&mut self, s: u32, step: Step) {
        self.slots[s as usize].steps.push_back(step);
    }

    fn set_source(&mut self, s: u32, source: Source, server: u32) {
        let slot = &mut self.slots[s as usize];
        slot.source = source;
        slot.server = server;
    }

    /// Looks the object up in `node`'s cache (a reference), noting when the owner last
    /// checked it; whether it was there.
    fn lookup(&mut self, node: u32, t: u32) -> bool {
        let now = self.now();
        let fresh = self.cfg.replica_fresh.as_nanos() as Nanos;
        let n = &mut self.nodes[node as usize];
        if n.cache.get(&t, at(now)).is_none() {
            return false;
        }
        // A hit older than the revalidation interval is checked against the disk (a stat,
        // not charged).
        let v = n.validated.entry(t).or_insert(now);
        if now.saturating_sub(*v) >= fresh {
            *v = now;
        }
        true
    }

    fn transmit(&self, bytes: u64) -> Nanos {
        blocks(bytes, 512) * self.per_512
    }

    fn disk_read(&self, size: u64) -> Nanos {
        let d = &self.cfg.disk;
        let extents = blocks(size.max(1), d.extent_bytes) - 1;
        us_to_ns(d.seek_us)
            + blocks(size, 4096) * us_to_ns(d.per_4k_us)
            + extents * us_to_ns(d.extent_seek_us)
    }

    /// Takes the slot's steps until one waits for a server.
    fn advance(&mut self, s: u32) {
        loop {
            let Some(step) = self.slots[s as usize].steps.pop_front() else {
                self.after(s);
                return;
            };
            let now = self.now();
            let (e, t, size) = {
                let slot = &self.slots[s as usize];
                (slot.entry, slot.target, slot.size)
            };
            match step {
                Step::Cpu(n, d) => {
                    self.submit(Res::Cpu, n, d, s);
                    return;
                }
                Step::Disk(n) => {
                    let d = self.disk_read(size);
                    let n = if self.cfg.shared_disk { 0 } else { n };
                    self.submit(Res::Disk, n, d, s);
                    return;
                }
                Step::Link {
                    node,
                    bytes,
                    response,
                } => {
                    let counting = self.counting();
                    let slot = &mut self.slots[s as usize];
                    if response {
                        slot.first_byte = Some(now);
                    }
                    if counting {
                        let c = &mut self.nodes[node as usize].c;
                        c.bytes_out += bytes;
                        if response {
                            c.responses += 1;
                        } else {
                            c.peer_bytes_out += bytes;
                        }
                    }
                    let d = (bytes as f64 * self.link_ns_per_byte).round() as Nanos;
                    self.send(node, d, s);
                    return;
                }
                Step::Insert(n) => {
                    let node = &mut self.nodes[n as usize];
                    node.cache.insert(t, (), size, at(now));
                    node.validated.insert(t, now);
                }
                Step::Serve {
                    node,
                    owner,
                    ship,
                    check,
                } => {
                    if owner {
                        if let Some(h) = self.nodes[node as usize].hot.as_mut() {
                            h.reference(&t, at(now));
                        }
                    }
                    let hit = self.lookup(node, t);
                    let source = match (node == e, hit) {
                        (true, true) => Source::Local,
                        (true, false) => Source::LocalDisk,
                        (false, true) => Source::Owner,
                        (false, false) => Source::OwnerDisk,
                    };
                    self.set_source(s, source, node);
                    let mut front = Vec::with_capacity(6);
                    let request = us_to_ns(self.cfg.costs.request_us);
                    if hit {
                        front.push(Step::Cpu(node, request + self.transmit(size)));
                    } else {
                        front.push(Step::Cpu(node, request));
                        front.push(Step::Disk(node));
                        front.push(Step::Insert(node));
                        front.push(Step::Cpu(node, self.transmit(size)));
                    }
                    if ship {
                        // As the node does (`Dispatch::answered`): the copy goes out on the
                        // control connection as soon as the response is produced, beside it on
                        // the owner's link, so that it is in place when the connection returns.
                        front.push(Step::Ship { owner: node, check });
                    }
                    front.push(Step::Link {
                        node,
                        bytes: size + self.cfg.header_bytes,
                        response: true,
                    });
                    front.push(Step::Done);
                    self.prepend(s, front);
                }
                Step::Fetch { owner: o } => {
                    if let Some(h) = self.nodes[o as usize].hot.as_mut() {
                        h.reference(&t, at(now));
                    }
                    let hit = self.lookup(o, t);
                    self.set_source(
                        s,
                        if hit {
                            Source::Owner
                        } else {
                            Source::OwnerDisk
                        },
                        e,
                    );
                    if self.counting() {
                        self.t.fetches += 1;
                    }
                    if self.slots[s as usize].measured {
                        self.tm.fetches += 1;
                    }
                    let c = self.cfg.costs;
                    let mut front = vec![Step::Cpu(e, us_to_ns(c.fetch_request_us) / 2)];
                    front.push(Step::Cpu(o, us_to_ns(c.fetch_serve_us)));
                    if !hit {
                        front.push(Step::Disk(o));
                        front.push(Step::Insert(o));
                    }
                    front.push(Step::Cpu(o, self.transmit(size)));
                    front.push(Step::Link {
                        node: o,
                        bytes: size,
                        response: false,
                    });
                    let receive = blocks(size, 512) * self.recv_512;
                    front.push(Step::Cpu(
                        e,
                        us_to_ns(c.fetch_request_us) - us_to_ns(c.fetch_request_us) / 2 + receive,
                    ));
                    if self.cfg.system.replicates() {
                        // CF-REP: kept only as a replica, when the owner says it is hot.
                        front.push(Step::Ship {
                            owner: o,
                            check: false,
                        });
                    }
                    // CF-LRU and CF-LFU keep nothing they fetched, as the node's `fetch` mode:
                    // the cluster's memory stays one cache of what each node owns.
                    front.push(Step::Answer);
                    self.prepend(s, front);
                }
                Step::Answer => {
                    let request = us_to_ns(self.cfg.costs.request_us);
                    let front = vec![
                        Step::Cpu(e, request + self.transmit(size)),
                        Step::Link {
                            node: e,
                            bytes: size + self.cfg.header_bytes,
                            response: true,
                        },
                        Step::Done,
                    ];
                    self.prepend(s, front);
                }
                Step::Ship { owner: o, check } => {
                    // Only an object in the owner's memory is copied (`Replication::offer`).
                    let node = &mut self.nodes[o as usize];
                    if !node.cache.contains(&t) {
                        continue;
                    }
                    let age = now.saturating_sub(node.validated.get(&t).copied().unwrap_or(now));
                    let Some(copies) = node.hot.as_mut().and_then(|h| h.ship(&t, size, e, at(now)))
                    else {
                        continue;
                    };
                    if check {
                        // A few bytes on the control connection, not charged.
                        node.renewed += 1;
                        self.prepend(s, vec![Step::Renew { copies, age }]);
                        continue;
                    }
                    if self.counting() {
                        self.nodes[o as usize].c.shipped += 1;
                    }
                    if self.slots[s as usize].measured {
                        self.tm.shipped += 1;
                    }
                    if self.cfg.system.clones() {
                        // Sent over the owner's link while the response is: carried on by a
                        // background slot of its own.
                        let copy = vec![
                            Step::Cpu(o, self.transmit(size)),
                            Step::Link {
                                node: o,
                                bytes: size,
                                response: false,
                            },
                            Step::Cpu(e, blocks(size, 512) * self.recv_512),
                            Step::Replica { copies, age },
                        ];
                        self.fork(s, copy);
                    } else {
                        // CF-REP: the object just fetched is the copy.
                        self.prepend(s, vec![Step::Replica { copies, age }]);
                    }
                }
                Step::Replica { copies, age } => {
                    let fresh = self.cfg.replica_fresh;
                    if let Some(r) = self.nodes[e as usize].replicas.as_mut() {
                        r.insert(t, (), size, copies, at(age), fresh, at(now));
                    }
                }
                Step::Renew { copies, age } => {
                    let fresh = self.cfg.replica_fresh;
                    if let Some(r) = self.nodes[e as usize].replicas.as_mut() {
                        r.renew(&t, |()| true, copies, at(age), fresh, at(now));
                    }
                }
                Step::Done => {
                    self.done(s);
                    if !self.slots[s as usize].steps.is_empty() {
                        self.detach(s);
                    }
                }
                Step::Close => {
                    let slot = &self.slots[s as usize];
                    let (conn, entry) = (slot.conn, slot.entry);
                    self.nodes[entry as usize]
                        .owners
                        .connection_end(conn, at(now));
                }
            }
        }
    }

    /// Moves the steps left after a response to a background slot, so that the client goes on.
    fn detach(&mut self, s: u32) {
        let steps = std::mem::take(&mut self.slots[s as usize].steps);
        self.fork(s, steps.into());
    }

    /// Runs `steps` for slot `s`'s request on a background slot, beside `s`'s own.
    fn fork(&mut self, s: u32, steps: Vec<Step>) {
        let b = match self.idle.pop() {
            Some(b) => b,
            None => {
                self.slots.push(Slot::idle(true));
                (self.slots.len() - 1) as u32
            }
        };
        let steps: VecDeque<Step> = steps.into();
        let (entry, target, size, measured) = {
            let f = &self.slots[s as usize];
            (f.entry, f.target, f.size, f.measured)
        };
        let bg = &mut self.slots[b as usize];
        bg.steps = steps;
        bg.entry = entry;
        bg.target = target;
        bg.size = size;
        bg.measured = measured;
        self.ready.push_back(b);
    }

    fn prepend(&mut self, s: u32, front: Vec<Step>) {
        let steps = &mut self.slots[s as usize].steps;
        for st in front.into_iter().rev() {
            steps.push_front(st);
        }
    }

    /// The slot's steps are all taken: the next request, the next connection, or nothing.
    fn after(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        if slot.background {
            self.idle.push(s);
            return;
        }
        if slot.seq == usize::MAX {
            return;
        }
        if std::mem::take(&mut slot.closing) {
            self.in_flight -= 1;
            self.start_connection(s);
        } else {
            self.next_request(s);
        }
    }

    /// The response is out.
    fn done(&mut self, s: u32) {
        let now = self.now();
        let (conn, entry, chosen, req, source, server, measured, start, first, size, seq) = {
            let sl = &mut self.slots[s as usize];
            (
                sl.conn,
                sl.entry,
                sl.chosen.take(),
                sl.req,
                sl.source,
                sl.server,
                sl.measured,
                sl.start,
                sl.first_byte.unwrap_or(now),
                sl.size,
                sl.seq,
            )
        };
        if let Some(c) = chosen {
            let id = NodeId(member_id(&member_name(self.cfg.first_member, c)).0);
            self.nodes[entry as usize].owners.post_request(
                conn,
                id,
                &Outcome::ok(200, size, source != Source::OwnerDisk),
                at(now),
            );
        }
        let conns = self.w.connections();
        let pass = (seq / conns) as u32;
        (self.observe)(CoopCompletion {
            request: req,
            pass,
            entry,
            server,
            source,
            time: now,
        });
        let counting = self.counting();
        for (t, on) in [(&mut self.t, counting), (&mut self.tm, measured)] {
            if !on {
                continue;
            }
            t.requests += 1;
            t.body_bytes += size;
            match source {
                Source::Local => t.local += 1,
                Source::LocalDisk => t.local_disk += 1,
                Source::Replica => t.replica += 1,
                Source::Owner => t.owner += 1,
                Source::OwnerDisk => t.owner_disk += 1,
            }
            t.first_byte_ns += u128::from(first - start);
            t.response_ns += u128::from(now - start);
            t.last_done = now;
        }
    }

    /// Whether the measurement window is open: from the start of the measured pass's first
    /// connection to the start of its last one (so that the whole population is at work).
    fn counting(&self) -> bool {
        self.measure_start.is_some() && self.measure_end.is_none()
    }

    /// Busy times when the measured pass starts.
    fn mark(&mut self) {
        let now = self.now();
        for n in &mut self.nodes {
            n.mark = (n.cpu.busy_at(now), n.disk.busy_at(now), n.link.busy_at(now));
        }
        self.reassign_mark = self
            .nodes
            .iter()
            .map(|n| n.owners.stats().reassignments)
            .sum();
    }

    fn result(&self) -> CoopResult {
        let cfg = self.cfg;
        let start = self.measure_start.unwrap_or(0);
        let now = self.now();
        // The window, or (too few connections for one) the measured pass to its last response.
        let (t, end, window) = match self.measure_end {
            Some(end) if self.t.requests > 0 && end > start => (&self.t, end, true),
            _ => (&self.tm, self.tm.last_done, false),
        };
        let span = end.saturating_sub(start).max(1);
        let secs = span as f64 / 1e9;
        let n = t.requests.max(1) as f64;
        let per_node: Vec<CoopNode> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let util = |busy: Nanos, mark: Nanos| (busy - mark) as f64 / span as f64;
                let busy = match (window, node.mark_end) {
                    (true, Some(m)) => m,
                    _ => (
                        node.cpu.busy_at(now),
                        node.disk.busy_at(now),
                        node.link.busy_at(now),
                    ),
                };
                let rs = node
                    .replicas
                    .as_ref()
                    .map_or(ReplicaStats::default(), |r| r.stats());
                CoopNode {
                    node: i as u32,
                    connections: node.c.connections,
                    responses: node.c.responses,
                    bytes_out: node.c.bytes_out,
                    peer_bytes_out: node.c.peer_bytes_out,
                    link_utilization: util(busy.2, node.mark.2),
                    cpu_utilization: util(busy.0, node.mark.0),
                    disk_utilization: util(busy.1, node.mark.1),
                    cached_bytes: node.cache.used_bytes(),
                    replicas: node.replicas.as_ref().map_or(0, |r| r.len() as u64),
                    replica_bytes: node.replicas.as_ref().map_or(0, |r| r.bytes()),
                    replica_capacity: node.replicas.as_ref().map_or(0, |r| r.capacity_bytes()),
                    replica_hits: rs.hits,
                    replicas_stored: rs.stored,
                    replicas_expired: rs.expired,
                    copies_shipped: node.hot.as_ref().map_or(0, |h| h.shipped()) - node.renewed,
                    copies_renewed: node.renewed,
                }
            })
            .collect();
        let max_over_mean = |f: &dyn Fn(&CoopNode) -> f64| {
            let v: Vec<f64> = per_node.iter().map(f).collect();
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            if mean > 0.0 {
                v.iter().cloned().fold(0.0, f64::max) / mean
            } else {
                0.0
            }
        };
        let peer: u64 = per_node.iter().map(|p| p.peer_bytes_out).sum();
        let out: u64 = per_node.iter().map(|p| p.bytes_out).sum();
        let mean = |f: &dyn Fn(&CoopNode) -> f64| {
            per_node.iter().map(f).sum::<f64>() / per_node.len() as f64
        };
        let reassignments: u64 = self
            .nodes
            .iter()
            .map(|n| n.owners.stats().reassignments)
            .sum();
        CoopResult {
            system: cfg.system,
            nodes: cfg.nodes,
            clients: cfg.clients,
            owner_policy: cfg.owner_policy.name.as_str().to_owned(),
            cache_bytes: cfg.cache_bytes,
            replica_bytes: if cfg.system.replicates() {
                cfg.replication.replica_bytes
            } else {
                0
            },
            link_mbps: cfg.link_mbps,
            measured_requests: t.requests,
            sim_secs: secs,
            throughput: t.requests as f64 / secs,
            mbytes_per_sec: t.body_bytes as f64 / secs / 1e6,
            efficiency: t.body_bytes as f64 / secs / (cfg.nodes as f64 * cfg.link_bytes_per_sec()),
            local_hit_rate: t.local as f64 / n,
            owner_hit_rate: t.owner as f64 / n,
            replica_hit_rate: t.replica as f64 / n,
            disk_rate: (t.local_disk + t.owner_disk) as f64 / n,
            clones_per_request: t.clones as f64 / n,
            fetches_per_request: t.fetches as f64 / n,
            copies_shipped: self.nodes.iter().map(|x| x.c.shipped).sum(),
            peer_traffic_share: if out > peer {
                peer as f64 / (out - peer) as f64
            } else {
                0.0
            },
            max_bytes_over_mean: max_over_mean(&|p| p.bytes_out as f64),
            max_responses_over_mean: max_over_mean(&|p| p.responses as f64),
            mean_first_byte_ms: t.first_byte_ns as f64 / n / 1e6,
            mean_response_ms: t.response_ns as f64 / n / 1e6,
            mean_cpu_utilization: mean(&|p| p.cpu_utilization),
            mean_link_utilization: mean(&|p| p.link_utilization),
            owner_map_reassignments: reassignments - self.reassign_mark,
            pass: self.pass(),
            per_node,
        }
    }

    /// The measured pass as a whole.
    fn pass(&self) -> CoopPass {
        let t = &self.tm;
        let secs = t
            .last_done
            .saturating_sub(self.measure_start.unwrap_or(0))
            .max(1) as f64
            / 1e9;
        let n = t.requests.max(1) as f64;
        CoopPass {
            requests: t.requests,
            secs,
            throughput: t.requests as f64 / secs,
            mbytes_per_sec: t.body_bytes as f64 / secs / 1e6,
            memory_hit_rate: (t.local + t.owner) as f64 / n,
            local_hit_rate: t.local as f64 / n,
            owner_hit_rate: t.owner as f64 / n,
            replica_hit_rate: t.replica as f64 / n,
            disk_rate: (t.local_disk + t.owner_disk) as f64 / n,
            clones_per_request: t.clones as f64 / n,
            fetches_per_request: t.fetches as f64 / n,
            copies_shipped: t.shipped,
        }
    }
}

// ---- workloads and sweeps -------------------------------------------------------------------

/// Files of the UC Berkeley trace seed 000 §5.1 replayed.
pub const BERKELEY_FILES: u64 = switchyard_trace::synth::CYCLONE_FILES;
/// Their total size, bytes (about 650 MB).
pub const BERKELEY_BYTES: u64 = switchyard_trace::synth::CYCLONE_BYTES;

/// A synthetic trace shaped like seed 000's ([`SynthConfig::cyclone`]: 74,820 files, about
/// 650 MB, Zipf-like popularity), `scale` times as large in files and bytes (0 < scale <= 1),
/// with `requests` requests.
pub fn berkeley_synth(scale: f64, requests: u64, zipf_alpha: f64, seed: u64) -> SynthConfig {
    SynthConfig::cyclone(scale, requests, zipf_alpha, seed)
}

/// Runs every system at every cluster size on `workload`, `threads` runs at a time (0: one
/// per core), in the order systems × nodes.
pub fn sweep_coop(
    base: &CoopConfig,
    systems: &[System],
    nodes: &[u32],
    workload: &SimWorkload,
    threads: usize,
) -> Result<Vec<CoopResult>, SimError> {
    let jobs: Vec<CoopConfig> = systems
        .iter()
        .flat_map(|&system| {
            nodes.iter().map(move |&n| CoopConfig {
                nodes: n,
                system,
                ..base.clone()
            })
        })
        .collect();
    for j in &jobs {
        j.validate()?;
    }
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(jobs.len())
    .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<Result<CoopResult, SimError>>>> =
        std::sync::Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let r = simulate_coop(job, workload);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(SimError::Config("a run did not finish".into()))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Http, Targets};
    use std::sync::Arc;

    fn run_link(model: LinkModel, jobs: &[(Nanos, Nanos)]) -> Vec<(u32, Nanos)> {
        // (arrival, work) per job; returns (job, completion) in completion order.
        let mut link = SharedLink::new(model);
        let mut done = Vec::new();
        let mut arrivals = jobs.iter().enumerate().peekable();
        let mut now = 0;
        loop {
            let next_arrival = arrivals.peek().map(|(_, j)| j.0);
            let next_done = link.next_completion(now);
            let arrival_first = match (next_arrival, next_done) {
                (None, None) => return done,
                (Some(a), Some(d)) => a <= d,
                (a, _) => a.is_some(),
            };
            if arrival_first {
                let (i, &(at, work)) = arrivals.next().unwrap();
                now = at;
                link.update(now);
                link.flows.push(Flow {
                    left: work as f64,
                    slot: i as u32,
                });
            } else if let Some(d) = next_done {
                now = d;
                link.update(now);
                done.extend(link.take_finished().into_iter().map(|s| (s, now)));
            }
        }
    }

    #[test]
    fn a_shared_link_lets_a_small_transfer_pass_a_large_one() {
        // A 10 ms transfer, then 1 ms later a 1 ms one.
        let jobs = [(0, 10_000_000), (1_000_000, 1_000_000)];
        // Shared: from 1 ms both move at half speed, the small one is done at 3 ms; the large
        // one has 9 - 1 = 8 ms left, alone: done at 11 ms.
        assert_eq!(
            run_link(LinkModel::Shared, &jobs),
            vec![(1, 3_000_000), (0, 11_000_000)]
        );
        // FIFO: the small one waits for the large one.
        assert_eq!(
            run_link(LinkModel::Fifo, &jobs),
            vec![(0, 10_000_000), (1, 11_000_000)]
        );
        // Busy all along either way: the link is work conserving.
        let mut l = SharedLink::new(LinkModel::Shared);
        l.flows.push(Flow { left: 5.0, slot: 0 });
        l.update(3);
        assert_eq!(l.busy_at(4), 4);
    }

    #[test]
    fn equal_transfers_on_a_shared_link_finish_together() {
        let jobs = [(0, 4_000), (0, 4_000), (0, 4_000)];
        let done = run_link(LinkModel::Shared, &jobs);
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|&(_, t)| t == 12_000), "{done:?}");
        assert!("tcp".parse::<LinkModel>().is_err());
        assert_eq!("FIFO".parse::<LinkModel>().unwrap(), LinkModel::Fifo);
    }

    #[test]
    fn member_ids_match_the_nodes_vectors() {
        // The FNV-1a test vectors `member_id` of crates/node/src/coop.rs is held to.
        assert_eq!(member_id("").0, 0x811c_9dc5);
        assert_eq!(member_id("a").0, 0xe40c_292c);
        assert_eq!(member_id("foobar").0, 0xbf9c_f968);
        assert_eq!(member_name(1, 0), "n1");
        assert_eq!(member_name(0, 7), "n7");
    }

    #[test]
    fn systems_parse_by_their_paper_names() {
        for s in System::ALL {
            assert_eq!(s.as_str().to_lowercase().parse::<System>().unwrap(), s);
        }
        assert!("LARD".parse::<System>().is_err());
        assert_eq!(serde_json::to_value(System::CfRep).unwrap(), "CF-REP");
    }

    #[test]
    fn bad_configurations_are_refused() {
        let ok = CoopConfig::new(2, System::Cyclone);
        assert!(ok.validate().is_ok());
        for bad in [
            CoopConfig {
                nodes: 0,
                ..ok.clone()
            },
            CoopConfig {
                clients: 0,
                ..ok.clone()
            },
            CoopConfig {
                link_mbps: 0.0,
                ..ok.clone()
            },
            CoopConfig {
                link_mbps: f64::NAN,
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let mut c = ok.clone();
        c.costs.clone_us = -1.0;
        assert!(c.validate().is_err());
        let mut c = ok;
        c.replication.threshold = 0.0;
        assert!(c.validate().is_err());
    }

    fn tiny() -> SimWorkload {
        let targets = Arc::new(Targets {
            keys: (0..8).map(|i| format!("/f{i}").into()).collect(),
            sizes: vec![10_000; 8],
        });
        let conns: Vec<Vec<Vec<u32>>> = (0..400).map(|i| vec![vec![i % 8]]).collect();
        SimWorkload::from_connections(targets, Http::V10, &conns).unwrap()
    }

    #[test]
    fn one_node_serves_everything_itself_whatever_the_system() {
        let w = tiny();
        let mut first = None;
        for s in System::ALL {
            let r = simulate_coop(&CoopConfig::new(1, s), &w).unwrap();
            // The window: from the second pass's first connection to its last one's start.
            assert!((330..=400).contains(&r.measured_requests), "{r:?}");
            assert_eq!(r.clones_per_request + r.fetches_per_request, 0.0);
            // Warm after one pass: every object is cached.
            assert_eq!(r.local_hit_rate, 1.0, "{s}");
            let t = r.throughput;
            assert!((t - *first.get_or_insert(t)).abs() < 1e-6 * t, "{s}: {t}");
        }
    }

    #[test]
    fn a_cached_response_is_limited_by_the_link() {
        // 40 clients, one node, 10 kB responses from memory: 100 Mbit/s carry 1250 a second.
        let r = simulate_coop(&CoopConfig::new(1, System::Rr), &tiny()).unwrap();
        assert!((r.efficiency - 1.0).abs() < 0.02, "{}", r.efficiency);
        assert!((r.throughput - 1250.0).abs() < 25.0, "{}", r.throughput);
        assert!(r.per_node[0].link_utilization > 0.98);
    }

    #[test]
    fn the_pass_counts_every_request_of_it_once() {
        let w = tiny();
        for s in [System::Rr, System::Sc, System::Cyclone] {
            let r = simulate_coop(&CoopConfig::new(4, s), &w).unwrap();
            let p = &r.pass;
            assert_eq!(p.requests, 400, "{s}");
            assert!(
                (p.memory_hit_rate + p.replica_hit_rate + p.disk_rate - 1.0).abs() < 1e-9,
                "{s}: {p:?}"
            );
            assert!(
                (p.memory_hit_rate - p.local_hit_rate - p.owner_hit_rate).abs() < 1e-9,
                "{s}"
            );
            // From the first request to the last response: 400 requests of 10 kB on links of
            // 12.5 MB/s each, no faster than the four links carry them.
            assert!(
                p.secs >= 400.0 * 10_000.0 / (4.0 * 12.5e6),
                "{s}: {}",
                p.secs
            );
            assert!((p.throughput - 400.0 / p.secs).abs() < 1e-6 * p.throughput);
        }
        // SC: every request of the pass answered by a node other than its entry was cloned.
        let mut moved = 0;
        let sc = simulate_coop_observed(&CoopConfig::new(4, System::Sc), &w, |c| {
            if c.pass == 1 && c.server != c.entry {
                moved += 1;
            }
        })
        .unwrap();
        assert!(moved > 0);
        assert_eq!(sc.pass.clones_per_request, f64::from(moved) / 400.0);
    }

    #[test]
    fn separate_passes_start_the_measured_one_on_idle_nodes() {
        // 40 clients, one node whose disk is slow: the warm-up pass's misses queue there.
        let w = tiny();
        let mut cfg = CoopConfig::new(1, System::Rr);
        cfg.shared_disk = false;
        cfg.cache_bytes = 30_000; // three of the eight objects: most requests miss
        let mut starts = Vec::new();
        for separate in [false, true] {
            cfg.separate_passes = separate;
            let mut last_warm = 0;
            let mut first_measured = Nanos::MAX;
            let r = simulate_coop_observed(&cfg, &w, |c| {
                if c.pass == 0 {
                    last_warm = last_warm.max(c.time);
                } else {
                    first_measured = first_measured.min(c.time);
                }
            })
            .unwrap();
            assert_eq!(r.pass.requests, 400);
            // With the pause nothing of the measured pass is answered before the warm-up's last
            // response; without it the two overlap.
            assert_eq!(first_measured > last_warm, separate);
            starts.push(r.pass.secs);
        }
        // Without the pause the measured pass starts behind the warm-up's queue of misses.
        assert!(starts[1] < starts[0], "{starts:?}");
        // Every pass boundary holds when there are fewer connections than clients.
        cfg.clients = 1000;
        assert_eq!(simulate_coop(&cfg, &w).unwrap().pass.requests, 400);
    }

    #[test]
    fn an_object_larger_than_the_caches_take_is_read_from_the_disk_every_time() {
        let targets = Arc::new(Targets {
            keys: vec!["/big".into(), "/small".into()],
            sizes: vec![2 * NODE_CACHE_MAX_OBJECT_BYTES, 1000],
        });
        let conns: Vec<Vec<Vec<u32>>> = (0..200).map(|i| vec![vec![i % 2]]).collect();
        let w = SimWorkload::from_connections(targets, Http::V10, &conns).unwrap();
        let mut cfg = CoopConfig::new(1, System::Rr);
        cfg.clients = 4;
        // As the node does: the cache has room, but the object is above its bound.
        let r = simulate_coop(&cfg, &w).unwrap();
        assert!((r.pass.disk_rate - 0.5).abs() < 1e-9, "{:?}", r.pass);
        assert!((r.pass.memory_hit_rate - 0.5).abs() < 1e-9, "{:?}", r.pass);
        // Without the bound it is cached like the other.
        cfg.cache_max_object_bytes = u64::MAX;
        let r = simulate_coop(&cfg, &w).unwrap();
        assert_eq!(r.pass.disk_rate, 0.0, "{:?}", r.pass);
    }

    /// The owner map hashes the members' names: the same cluster named from `n0` (the lab's
    /// names) or from `n1` (the demo's) gives its objects other owners, and so other nodes
    /// their bytes; a simulation compared with a real cluster must use that cluster's names.
    #[test]
    fn members_named_from_another_number_draw_another_owner_map() {
        let w = tiny();
        let mut from0 = CoopConfig::new(4, System::Sc);
        from0.first_member = 0;
        let a = simulate_coop(&from0, &w).unwrap();
        let again = simulate_coop(&from0, &w).unwrap();
        let b = simulate_coop(&CoopConfig::new(4, System::Sc), &w).unwrap();
        let bytes = |r: &CoopResult| r.per_node.iter().map(|n| n.bytes_out).collect::<Vec<_>>();
        assert_eq!(bytes(&a), bytes(&again), "one naming, one map");
        assert_ne!(bytes(&a), bytes(&b), "other names, the same map");
    }

    #[test]
    fn cloning_and_forwarding_follow_the_owner_map() {
        let w = tiny();
        let sc = simulate_coop(&CoopConfig::new(4, System::Sc), &w).unwrap();
        let cf = simulate_coop(&CoopConfig::new(4, System::CfLru), &w).unwrap();
        // Connections go round robin, targets to their owners: 3 in 4 requests are remote
        // (more or less, by the owner map).
        assert!(sc.clones_per_request > 0.5, "{}", sc.clones_per_request);
        assert_eq!(sc.replica_hit_rate, 0.0);
        assert!((sc.local_hit_rate + sc.owner_hit_rate + sc.disk_rate - 1.0).abs() < 1e-9);
        assert!(sc.local_hit_rate + sc.owner_hit_rate > 0.9, "{sc:?}");
        // CF keeps nothing it fetched: every request a peer owns is fetched from the owner,
        // as often as SC clones, and only the entry node's own targets are answered locally.
        assert!(
            (cf.fetches_per_request - sc.clones_per_request).abs() < 0.02,
            "{} vs {}",
            cf.fetches_per_request,
            sc.clones_per_request
        );
        assert!(
            (cf.local_hit_rate + cf.disk_rate + cf.owner_hit_rate - 1.0).abs() < 1e-9,
            "{cf:?}"
        );
        assert!(
            cf.local_hit_rate < 1.0 - cf.fetches_per_request + 0.02,
            "{cf:?}"
        );
    }
}
