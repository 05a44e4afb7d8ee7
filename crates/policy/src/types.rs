//! Plain data passed between a policy and its caller (switch, simulator, tests).

use std::fmt;

/// Identifier of a back-end node, chosen by the caller (usually its index in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

/// Identifier of a client connection, chosen by the caller; unique among open connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// A back-end node as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSpec {
    /// The node's identifier.
    pub id: NodeId,
    /// Relative weight (used by `wrr` and by `chash` for its share of ring points).
    /// A weight of 0 means "never chosen by `wrr`/`chash`".
    pub weight: u32,
    /// Optional capacity cap in load units (in-flight requests; for `ext-lard`, connections
    /// plus remote-fetch shares). A node at its cap is not chosen; when every node that is up
    /// is at its cap, `select` answers [`Reject::Overloaded`].
    pub capacity: Option<u32>,
}

impl NodeSpec {
    /// A node of weight 1 without capacity cap.
    pub fn new(id: u32) -> Self {
        NodeSpec {
            id: NodeId(id),
            weight: 1,
            capacity: None,
        }
    }

    /// Same node with the given weight.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Same node with the given capacity cap.
    pub fn with_capacity(mut self, capacity: u32) -> Self {
        self.capacity = Some(capacity);
        self
    }
}

/// Service class of a request as found by [`crate::Policy::parse`]. Class 0 is the default class;
/// only `cap` defines others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RequestClass(pub u16);

impl RequestClass {
    /// The class of requests that match no configured pattern.
    pub const DEFAULT: RequestClass = RequestClass(0);
}

/// What the policy needs to know about one parsed HTTP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The client connection the request arrived on.
    pub conn: ConnId,
    /// Request method (`GET`, `HEAD`, ...).
    pub method: &'a str,
    /// Value of the Host header, if any.
    pub host: Option<&'a str>,
    /// The request target (path and query) — the "target" of seed 003.
    pub target: &'a str,
    /// Expected response size in bytes, when the caller knows it (e.g. from a previous response
    /// or a trace). `ext-lard` with `mechanism = "auto"` uses it to pick handoff over forwarding.
    pub size_hint: Option<u64>,
}

impl<'a> Request<'a> {
    /// A `GET` of `target` on `conn` without host or size hint.
    pub fn get(conn: ConnId, target: &'a str) -> Self {
        Request {
            conn,
            method: "GET",
            host: None,
            target,
            size_hint: None,
        }
    }

    /// The target without its query string.
    pub fn path(&self) -> &'a str {
        match self.target.find('?') {
            Some(i) => &self.target[..i],
            None => self.target,
        }
    }
}

/// Where and how a request is served. The mechanisms are those of seed 003 §3.
///
/// * [`Decision::Serve`]: `node` produces the response. If the connection has not been placed yet,
///   this is where it goes (single handoff, or the back-end connection of a relaying switch).
///   A relaying switch treats every decision as "send this request to `node()`"; a handoff switch
///   whose connection already sits on another node must move it (multiple handoff) or relay.
/// * [`Decision::Forward`]: back-end forwarding (seed 003 §3.3). The connection stays on
///   `handler`, which fetches the response from `source` and sends it on the client connection.
/// * [`Decision::Handoff`]: multiple handoff (seed 003 §3.2). The connection moves from `from` to
///   `to` once the responses already under way on `from` are acknowledged; `to` serves the request
///   and handles the connection from then on.
///
/// Only `ext-lard` produces `Forward` and `Handoff`; the other policies always answer `Serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// `node` serves the request from its own cache or disk.
    Serve {
        /// The node that serves the request (and handles the connection).
        node: NodeId,
        /// Whether the node should add the target to its memory cache after reading it
        /// (seed 003 §4.2 point 3: not when its disk is already busy).
        cache: bool,
    },
    /// The connection-handling node fetches the response from another node.
    Forward {
        /// The node that keeps the client connection and relays the response.
        handler: NodeId,
        /// The node that has the target cached and produces the response.
        source: NodeId,
    },
    /// The connection moves to another node, which serves this request.
    Handoff {
        /// The node that handles the connection now.
        from: NodeId,
        /// The node that serves the request and handles the connection afterwards.
        to: NodeId,
    },
}

impl Decision {
    /// The node that produces the response; pass it to [`crate::Policy::post_request`].
    pub fn node(&self) -> NodeId {
        match *self {
            Decision::Serve { node, .. } => node,
            Decision::Forward { source, .. } => source,
            Decision::Handoff { to, .. } => to,
        }
    }

    /// The node that holds the client connection once the decision is carried out.
    pub fn handler(&self) -> NodeId {
        match *self {
            Decision::Serve { node, .. } => node,
            Decision::Forward { handler, .. } => handler,
            Decision::Handoff { to, .. } => to,
        }
    }
}

/// Why no node was chosen. The switch answers 503 (with Retry-After) or queues the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Reject {
    /// No node is up.
    #[error("no back-end node is up")]
    NoNode,
    /// Every node that is up is saturated (capacity cap reached, or above `L_overload` for the
    /// LARD family).
    #[error("every back-end node is saturated")]
    Overloaded,
    /// [`crate::Policy::shutdown`] was called.
    #[error("the dispatcher is shutting down")]
    ShuttingDown,
}

/// How a request ended, reported through [`crate::Policy::post_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// HTTP status of the response; 0 when no response was produced (node failed, client gone).
    pub status: u16,
    /// Response bytes sent.
    pub bytes: u64,
    /// Whether the node served it from its memory cache.
    pub from_cache: bool,
}

impl Outcome {
    /// A completed response.
    pub fn ok(status: u16, bytes: u64, from_cache: bool) -> Self {
        Outcome {
            status,
            bytes,
            from_cache,
        }
    }

    /// A request that produced no response.
    pub fn failed() -> Self {
        Outcome::default()
    }
}

/// A node's own view of its load, pushed on events (connection handed in / closed) — the
/// distributed load monitor of seed 004 §2.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadReport {
    /// Connections open on the node.
    pub active_connections: u32,
    /// Disk reads queued on the node (`ext-lard` compares it with `disk_queue_threshold`).
    pub disk_queue: u32,
    /// Cache hits since the node started.
    pub cache_hits: u64,
    /// Cache misses since the node started.
    pub cache_misses: u64,
    /// Response bytes sent since the node started.
    pub bytes_out: u64,
}

/// Per-node figures in [`PolicyStats`].
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStats {
    /// The node.
    pub id: NodeId,
    /// Whether the node is up.
    pub up: bool,
    /// Configured weight.
    pub weight: u32,
    /// Load the policy uses for the node, in load units (may be fractional for `ext-lard`).
    pub load: f64,
    /// Requests selected for the node and not yet finished.
    pub in_flight: u32,
    /// Requests selected for the node since start.
    pub selected: u64,
    /// Requests finished on the node since start.
    pub completed: u64,
    /// Response bytes reported through `post_request`.
    pub bytes: u64,
    /// Requests reported as served from the node's cache.
    pub cache_hits: u64,
    /// Targets currently mapped to the node (LARD family).
    pub targets: u64,
    /// Client connections the node handles (`ext-lard`).
    pub connections: u64,
    /// The last load report from the node, if any.
    pub report: Option<LoadReport>,
}

/// Counters of a policy, for metrics and the dashboard.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyStats {
    /// Policy name.
    pub policy: &'static str,
    /// Successful `select` calls.
    pub decisions: u64,
    /// Failed `select` calls (all reasons).
    pub rejections: u64,
    /// Of which: no node up.
    pub rejected_no_node: u64,
    /// Of which: every node saturated.
    pub rejected_overloaded: u64,
    /// Targets currently mapped to at least one node (LARD family; 0 for the others).
    pub targets_mapped: u64,
    /// Extra (target, node) mappings beyond the first per target (`lard-r`, `ext-lard`).
    pub replicas: u64,
    /// Times a target's mapping moved to another node: load-driven moves (`lard`), targets left
    /// without any node when their node went down (LARD family), requests not served at their
    /// home point (`chash`).
    pub reassignments: u64,
    /// Requests that `chash` placed past their home node because of the load bound.
    pub spills: u64,
    /// Requests served by back-end forwarding (`ext-lard`).
    pub forwards: u64,
    /// Connections moved between nodes (`ext-lard` with handoff).
    pub handoffs: u64,
    /// Targets dropped from the mapping table because it was full.
    pub evictions: u64,
    /// Per-node figures, in the order nodes were added.
    pub nodes: Vec<NodeStats>,
}
