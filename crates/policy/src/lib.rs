//! Request dispatching policies of the switchyard layer-7 switch.
//!
//! A policy decides, for every parsed HTTP request, which back-end node serves it. The crate does
//! no I/O and reads no clock: time comes in as `now: Duration` since an origin the caller picks.
//! The same code runs behind a mutex in the switch, inside the discrete-event simulator and in
//! tests, and given the same calls it makes the same decisions.
//!
//! # The hooks
//!
//! [`Policy`] carries the hook points of the dispatcher module of seed 004 §4.1 — *initialization*
//! ([`Policy::init`]), *request parsing* ([`Policy::parse`]), *server selection*
//! ([`Policy::select`]), *post request* ([`Policy::post_request`]) and *shutdown*
//! ([`Policy::shutdown`]) — plus membership events ([`Policy::add_node`], [`Policy::node_up`],
//! [`Policy::node_down`]), connection events ([`Policy::connection_start`],
//! [`Policy::connection_end`]) and node load reports ([`Policy::load_report`]).
//!
//! Load is known two ways (seed 004 §2.2). The *centralized* monitor is the policy's own count:
//! each successful `select` adds a request to the chosen node and the matching `post_request`
//! takes it away (for `ext-lard`: one unit per connection the node handles plus the 1/N shares of
//! remote fetches). The *distributed* monitor is the nodes' own reports, pushed on events
//! (connection handed in / closed) rather than on a timer. `load_source` in [`PolicyConfig`]
//! chooses which one the load-aware policies use; `ext-lard` always takes the disk queue from the
//! reports.
//!
//! **Contract.** Every `Ok` from `select` must be followed by exactly one `post_request` with the
//! same connection and `decision.node()`, also when the request fails. Every connection the
//! caller announced (or used in a request) must end with `connection_end`.
//!
//! # The policies
//!
//! * **`rr`** — round robin over the nodes that are up.
//! * **`wrr`** — weighted round robin, smooth variant: in each cycle of `sum(weights)` picks node
//!   `i` gets exactly `w_i`, interleaved (the content-blind baseline of seed 003 §2.2 and §6).
//! * **`lc`** — least connections: the node with the fewest requests in flight; ties rotate.
//! * **`chash`** — consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA
//!   2018): a target goes to the first node clockwise from its hash on a ring of virtual points
//!   whose in-flight count stays within `ceil((1 + eps) × average)` (weighted by node weight).
//!   Removing a node moves only its targets; adding one moves only the targets it takes over.
//! * **`lard`** — locality-aware request distribution (seed 003 §2.3, §4.1): each target is
//!   mapped to a node; a request goes to the node of minimum aggregate cost
//!   `cost_balancing + cost_locality + cost_replacement` (seed 003 Fig. 4; load = requests in
//!   flight, defaults `L_idle` 30, `L_overload` 130, `MissCost` 50) and the mapping follows it.
//!   A mapped node keeps its target until its load exceeds `L_idle + MissCost − 1` while an idle
//!   node exists — the `T_low`/`T_high` rule of the original LARD (seed 003 footnote 2). When
//!   every node is above `L_overload` the request is refused with [`Reject::Overloaded`] so the
//!   switch can queue it or answer 503.
//! * **`lard-r`** — LARD with replication (Pai et al., ASPLOS 1998, reference 23 of seed 003): a
//!   *server set* per target. A request goes to the least loaded member unless a node outside the
//!   set is cheaper by the Fig. 4 costs, in which case that node joins the set; when the set has
//!   not changed for `K` seconds (`lard_r_shrink_secs`, default 20) its most loaded member is
//!   dropped. Hot targets thus spread over several nodes and fall back to one when they cool.
//! * **`ext-lard`** — extended LARD for persistent connections (seed 003 §4.2). The first request
//!   of a connection picks the *connection-handling node* by basic LARD. A later request stays on
//!   that node if it caches the target or its disk queue is below `disk_queue_threshold`
//!   (default 5) — and the node then caches the target; otherwise the Fig. 4 costs are computed
//!   over the handling node and the nodes that cache the target, and the request is served by
//!   back-end forwarding ([`Decision::Forward`], seed 003 §3.3) or, with `mechanism = "handoff"`
//!   (or `"auto"` and a large size hint, seed 003 §5), by moving the connection
//!   ([`Decision::Handoff`], multiple handoff, §3.2). The handling node carries one load unit per
//!   connection; each node that serves a forwarded request carries 1/N units, N being the size of
//!   the connection's previous batch of pipelined requests, until the batch is answered, the next
//!   batch starts or the connection ends. If the handling node has gone down, the next request
//!   on the connection is placed like a first request.
//! * **`cap`** — the client-aware policy (seed 004 §3): requests are sorted into service classes
//!   by URL pattern (`*.cgi`, `/cgi-bin/`, ...) and each class has its own round-robin pointer.
//!
//! With `cache_feedback`, the LARD family also learns what the nodes' caches hold:
//! [`Outcome::from_cache`], reported
//! with each finished request, is matched to its target (per connection, in selection order),
//! and a member that served the target from its cache and later without it counts as having
//! lost it (evicted). Its Fig. 4 cost is then the unmapped one, so past `L_idle` the target goes
//! to a less loaded node, and `ext-lard` does not fetch from it; its next hit restores it.
//!
//! No policy ever selects a node that is down or at its capacity cap. With no node up `select`
//! answers [`Reject::NoNode`]; with every node saturated, [`Reject::Overloaded`]. Nodes may join
//! at any time with [`Policy::add_node`].
//!
//! # Cost
//!
//! `select` is O(1) or O(log n) in the number of nodes n (a min-tree keeps the least loaded node),
//! plus O(set size) for the LARD family and the length of the ring walk for `chash`; it allocates
//! only when a target is seen for the first time (its key) or a connection's first remote fetch.
//! The LARD target table is bounded (`max_targets`, second-chance eviction). `node_down` of a LARD
//! policy walks the target table once.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use switchyard_policy::{build, ConnId, NodeSpec, Outcome, PolicyConfig, PolicyKind, Request};
//!
//! let mut p = build(&PolicyConfig::new(PolicyKind::Lard)).unwrap();
//! let now = Duration::ZERO;
//! p.init(&[NodeSpec::new(0), NodeSpec::new(1)], now).unwrap();
//! let req = Request::get(ConnId(7), "/index.html");
//! let d = p.select(&req, now).unwrap();
//! p.post_request(req.conn, d.node(), &Outcome::ok(200, 5120, false), now);
//! assert_eq!(p.select(&req, now).unwrap().node(), d.node());
//! ```

#![warn(missing_docs)]

use std::time::Duration;

mod cap;
mod chash;
mod config;
mod core;
mod error;
mod ext_lard;
mod hash;
mod lard;
mod lc;
mod mechanism;
mod rr;
mod targets;
mod types;
mod wrr;

pub use cap::Pattern as UrlPattern;
pub use config::{
    build, ClassSpec, LoadSource, PersistentRouting, PolicyConfig, PolicyKind, WeightSpec,
};
pub use error::PolicyError;
pub use mechanism::Mechanism;
pub use types::{
    ConnId, Decision, LoadReport, NodeId, NodeSpec, NodeStats, Outcome, PolicyStats, Reject,
    Request, RequestClass,
};

/// A dispatching policy: the hook points of seed 004 §4.1 plus membership, connection and load
/// events. Object safe; the switch holds a `Box<dyn Policy>` from [`build`].
pub trait Policy: Send {
    /// The policy's config name (`rr`, `lard-r`, ...).
    fn name(&self) -> &'static str;

    /// Initialization hook: forget all state and start with `nodes`, all up. Fails on a duplicate
    /// id or an invalid spec, leaving the policy without nodes.
    fn init(&mut self, nodes: &[NodeSpec], now: Duration) -> Result<(), PolicyError>;

    /// A node joins (up). Fails if the id is already known.
    fn add_node(&mut self, node: NodeSpec, now: Duration) -> Result<(), PolicyError>;

    /// A node is back up. Unknown ids are ignored.
    fn node_up(&mut self, node: NodeId, now: Duration);

    /// A node is down: it is not chosen until `node_up`, and the targets mapped to it are
    /// released so that their next requests place them elsewhere (counted in
    /// [`PolicyStats::reassignments`]). Unknown ids are ignored.
    fn node_down(&mut self, node: NodeId, now: Duration);

    /// A client connection was accepted (optional: `select` starts unknown connections too).
    fn connection_start(&mut self, conn: ConnId, now: Duration);

    /// A client connection closed; the policy drops what it knew of it.
    fn connection_end(&mut self, conn: ConnId, now: Duration);

    /// Request-parsing hook: the request's service class (only `cap` defines classes; the others
    /// answer [`RequestClass::DEFAULT`]).
    fn parse(&self, req: &Request<'_>) -> RequestClass;

    /// Name of a class returned by [`Policy::parse`].
    fn class_name(&self, class: RequestClass) -> &str;

    /// Server-selection hook: where and how to serve `req`.
    fn select(&mut self, req: &Request<'_>, now: Duration) -> Result<Decision, Reject>;

    /// Post-request hook: the request on `conn` served by `node` (the decision's
    /// [`Decision::node`]) has finished.
    fn post_request(&mut self, conn: ConnId, node: NodeId, outcome: &Outcome, now: Duration);

    /// A node's load report (distributed load monitor).
    fn load_report(&mut self, node: NodeId, report: &LoadReport, now: Duration);

    /// Shutdown hook: release state; later `select` calls answer [`Reject::ShuttingDown`]
    /// until the next `init`.
    fn shutdown(&mut self);

    /// Counters and per-node figures.
    fn stats(&self) -> PolicyStats;

    /// The nodes a target is currently mapped to (LARD family: its mapping or server set;
    /// `chash`: its home node; others: empty). For inspection and tests; allocates.
    fn mapped_nodes(&self, req: &Request<'_>) -> Vec<NodeId>;
}

#[cfg(test)]
pub(crate) mod testutil {
    use super::*;

    pub const T0: Duration = Duration::ZERO;
    pub const CONN: ConnId = ConnId(1);

    pub fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    pub fn nodes(n: u32) -> Vec<NodeSpec> {
        (0..n).map(NodeSpec::new).collect()
    }

    pub fn policy(kind: PolicyKind, n: u32) -> Box<dyn Policy> {
        let mut p = build(&PolicyConfig::new(kind)).unwrap();
        p.init(&nodes(n), T0).unwrap();
        p
    }

    pub fn pick(p: &mut dyn Policy, target: &str) -> NodeId {
        p.select(&Request::get(CONN, target), T0).unwrap().node()
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;

    #[test]
    fn shutdown_refuses_and_init_restarts() {
        for k in PolicyKind::ALL {
            let mut p = policy(k, 2);
            p.shutdown();
            assert_eq!(
                p.select(&Request::get(CONN, "/"), T0),
                Err(Reject::ShuttingDown),
                "{k}"
            );
            assert_eq!(p.stats().rejections, 1);
            p.init(&nodes(1), T0).unwrap();
            assert_eq!(pick(&mut *p, "/"), NodeId(0), "{k}");
        }
    }

    #[test]
    fn empty_and_late_joining_nodes() {
        for k in PolicyKind::ALL {
            let mut p = build(&PolicyConfig::new(k)).unwrap();
            p.init(&[], T0).unwrap();
            assert_eq!(
                p.select(&Request::get(CONN, "/"), T0),
                Err(Reject::NoNode),
                "{k}"
            );
            p.add_node(NodeSpec::new(4), T0).unwrap();
            assert_eq!(pick(&mut *p, "/"), NodeId(4), "{k}");
            assert!(p.add_node(NodeSpec::new(4), T0).is_err());
            assert_eq!(p.stats().rejected_no_node, 1);
        }
    }

    #[test]
    fn capacity_cap_gives_overloaded() {
        for k in PolicyKind::ALL {
            let mut p = build(&PolicyConfig::new(k)).unwrap();
            p.init(&[NodeSpec::new(0).with_capacity(1)], T0).unwrap();
            let c1 = ConnId(1);
            let d = p.select(&Request::get(c1, "/"), T0).unwrap();
            // A second connection cannot be placed: the only node is full.
            let r = p.select(&Request::get(ConnId(2), "/"), T0);
            assert_eq!(r, Err(Reject::Overloaded), "{k}");
            p.post_request(c1, d.node(), &Outcome::ok(200, 1, true), T0);
            p.connection_end(c1, T0);
            assert!(p.select(&Request::get(ConnId(2), "/"), T0).is_ok(), "{k}");
        }
    }

    #[test]
    fn policy_is_object_safe_and_send() {
        fn assert_send<T: Send + ?Sized>() {}
        assert_send::<dyn Policy>();
        let v: Vec<Box<dyn Policy>> = PolicyKind::ALL
            .iter()
            .map(|&k| build(&PolicyConfig::new(k)).unwrap())
            .collect();
        assert_eq!(v.len(), 8);
    }
}
