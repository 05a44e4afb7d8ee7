//! The node table shared by every policy, the load index, and the [`Engine`] that turns a
//! [`Strategy`] into a [`Policy`].

use std::time::Duration;

use crate::config::{LoadSource, PolicyConfig, WeightSpec};
use crate::error::PolicyError;
use crate::types::{
    ConnId, Decision, LoadReport, NodeId, NodeSpec, NodeStats, Outcome, PolicyStats, Reject,
    Request, RequestClass,
};
use crate::Policy;

/// Internal load values are fixed point: `UNIT` per load unit (one connection or request), so
/// that the 1/N shares of `ext-lard` add and subtract exactly.
pub(crate) const UNIT: u64 = 1000;
/// Largest accepted node weight.
pub(crate) const MAX_WEIGHT: u32 = 1000;
/// An infinite cost.
pub(crate) const INF: u64 = u64::MAX;

/// Which count is a node's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Basis {
    /// Requests selected and not yet finished.
    InFlight,
    /// Units the strategy holds on the node itself (`ext-lard`: connections and 1/N shares).
    Held,
}

/// Per-node state.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub id: NodeId,
    pub weight: u32,
    pub capacity: Option<u32>,
    pub up: bool,
    /// Bumped each time the node goes down, so that state tied to an earlier life is recognised.
    pub epoch: u32,
    pub in_flight: u32,
    /// Load held by the strategy (`Basis::Held`), fixed point.
    pub held: u64,
    pub connections: u64,
    pub report: Option<LoadReport>,
    basis_at_report: u64,
    pub selected: u64,
    pub completed: u64,
    pub bytes: u64,
    pub cache_hits: u64,
}

/// Counters kept by the engine and the strategies.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub decisions: u64,
    pub rejected_no_node: u64,
    pub rejected_overloaded: u64,
    pub rejected_shutdown: u64,
    pub reassignments: u64,
    pub spills: u64,
    pub forwards: u64,
    pub handoffs: u64,
    pub evictions: u64,
}

/// A strategy's choice, in node slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    Serve { slot: usize, cache: bool },
    Forward { handler: usize, source: usize },
    Handoff { from: usize, to: usize },
}

impl Pick {
    pub fn serve(slot: usize) -> Pick {
        Pick::Serve { slot, cache: true }
    }

    fn node(self) -> usize {
        match self {
            Pick::Serve { slot, .. } => slot,
            Pick::Forward { source, .. } => source,
            Pick::Handoff { to, .. } => to,
        }
    }
}

/// Min-tree over node slots keyed by (load or `INF` when not eligible, change sequence): the least
/// loaded eligible node in O(1), updates in O(log n). Among equal loads the node whose load
/// changed longest ago wins, which rotates ties.
#[derive(Debug, Clone, Default)]
struct MinTree {
    size: usize,
    keys: Vec<(u64, u64)>,
    tree: Vec<u32>,
}

impl MinTree {
    fn resize(&mut self, n: usize) {
        let size = n.next_power_of_two().max(1);
        let mut keys = vec![(INF, INF); size];
        let old = std::mem::take(&mut self.keys);
        for (i, k) in old.into_iter().enumerate().take(n) {
            keys[i] = k;
        }
        self.size = size;
        self.keys = keys;
        self.tree = vec![0; 2 * size];
        for i in 0..size {
            self.tree[size + i] = i as u32;
        }
        for k in (1..size).rev() {
            self.tree[k] = self.better(self.tree[2 * k], self.tree[2 * k + 1]);
        }
        if size == 1 {
            self.tree[1] = 0;
        }
    }

    fn better(&self, a: u32, b: u32) -> u32 {
        if self.keys[b as usize] < self.keys[a as usize] {
            b
        } else {
            a
        }
    }

    fn set(&mut self, i: usize, key: (u64, u64)) {
        self.keys[i] = key;
        let mut k = (self.size + i) / 2;
        while k >= 1 {
            self.tree[k] = self.better(self.tree[2 * k], self.tree[2 * k + 1]);
            k /= 2;
        }
    }

    fn min(&self) -> Option<usize> {
        if self.size == 0 {
            return None;
        }
        let i = self.tree[1] as usize;
        (self.keys[i].0 != INF).then_some(i)
    }
}

/// The node table: membership, loads, the load index and counters.
pub(crate) struct Core {
    pub nodes: Vec<Node>,
    /// (id, slot), sorted by id.
    ids: Vec<(u32, u32)>,
    tree: MinTree,
    basis: Basis,
    source: LoadSource,
    seq: u64,
    weight_overrides: Vec<WeightSpec>,
    pub up_count: usize,
    /// Sum of `in_flight` over nodes that are up.
    pub up_in_flight: u64,
    /// Sum of weights over nodes that are up.
    pub up_weight: u64,
    pub c: Counters,
    pub shut: bool,
}

impl Core {
    pub fn new(cfg: &PolicyConfig, basis: Basis) -> Self {
        Core {
            nodes: Vec::new(),
            ids: Vec::new(),
            tree: MinTree::default(),
            basis,
            source: cfg.load_source,
            seq: 0,
            weight_overrides: cfg.weights.clone(),
            up_count: 0,
            up_in_flight: 0,
            up_weight: 0,
            c: Counters::default(),
            shut: false,
        }
    }

    fn clear(&mut self) {
        self.nodes.clear();
        self.ids.clear();
        self.tree = MinTree::default();
        self.up_count = 0;
        self.up_in_flight = 0;
        self.up_weight = 0;
        self.shut = false;
    }

    /// The slot of a node id.
    pub fn slot(&self, id: NodeId) -> Option<usize> {
        self.ids
            .binary_search_by_key(&id.0, |&(i, _)| i)
            .ok()
            .map(|k| self.ids[k].1 as usize)
    }

    fn add(&mut self, spec: NodeSpec) -> Result<usize, PolicyError> {
        let weight = self
            .weight_overrides
            .iter()
            .find(|w| w.node == spec.id.0)
            .map_or(spec.weight, |w| w.weight);
        if weight > MAX_WEIGHT {
            return Err(PolicyError::InvalidNode {
                node: spec.id,
                reason: "weight above 1000",
            });
        }
        let pos = match self.ids.binary_search_by_key(&spec.id.0, |&(i, _)| i) {
            Ok(_) => return Err(PolicyError::DuplicateNode(spec.id)),
            Err(p) => p,
        };
        let slot = self.nodes.len();
        self.ids.insert(pos, (spec.id.0, slot as u32));
        self.nodes.push(Node {
            id: spec.id,
            weight,
            capacity: spec.capacity,
            up: true,
            epoch: 0,
            in_flight: 0,
            held: 0,
            connections: 0,
            report: None,
            basis_at_report: 0,
            selected: 0,
            completed: 0,
            bytes: 0,
            cache_hits: 0,
        });
        self.up_count += 1;
        self.up_weight += weight as u64;
        self.tree.resize(self.nodes.len());
        for i in 0..self.nodes.len() {
            self.refresh(i);
        }
        Ok(slot)
    }

    fn basis_load(&self, i: usize) -> u64 {
        let n = &self.nodes[i];
        match self.basis {
            Basis::InFlight => n.in_flight as u64 * UNIT,
            Basis::Held => n.held,
        }
    }

    /// The node's last report, brought up to date with what the switch saw since.
    fn reported_load(&self, i: usize) -> Option<u64> {
        let n = &self.nodes[i];
        n.report.map(|r| {
            (r.active_connections as u64 * UNIT + self.basis_load(i))
                .saturating_sub(n.basis_at_report)
        })
    }

    /// The load the policies use, fixed point (`UNIT` per unit).
    pub fn load(&self, i: usize) -> u64 {
        let b = self.basis_load(i);
        match self.source {
            LoadSource::Centralized => b,
            LoadSource::Reported => self.reported_load(i).unwrap_or(b),
            LoadSource::Max => b.max(self.reported_load(i).unwrap_or(0)),
        }
    }

    /// Up and below its capacity cap.
    pub fn eligible(&self, i: usize) -> bool {
        let n = &self.nodes[i];
        n.up && n.capacity.is_none_or(|c| self.load(i) < c as u64 * UNIT)
    }

    /// Re-keys a node in the load index after any change to its load or state.
    pub fn refresh(&mut self, i: usize) {
        self.seq += 1;
        let key = if self.eligible(i) {
            (self.load(i).min(INF - 1), self.seq)
        } else {
            (INF, self.seq)
        };
        self.tree.set(i, key);
    }

    /// The least loaded eligible node (ties rotate).
    pub fn least_loaded(&self) -> Option<usize> {
        self.tree.min()
    }

    /// Why nothing could be chosen.
    pub fn reject(&self) -> Reject {
        if self.up_count == 0 {
            Reject::NoNode
        } else {
            Reject::Overloaded
        }
    }

    /// Changes the load held on a node by a strategy.
    pub fn add_held(&mut self, i: usize, delta: u64) {
        self.nodes[i].held += delta;
        self.refresh(i);
    }

    /// Releases load held on a node by a strategy.
    pub fn sub_held(&mut self, i: usize, delta: u64) {
        self.nodes[i].held = self.nodes[i].held.saturating_sub(delta);
        self.refresh(i);
    }

    fn dispatched(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.in_flight += 1;
        n.selected += 1;
        if n.up {
            self.up_in_flight += 1;
        }
        self.c.decisions += 1;
        self.refresh(i);
    }

    fn finished(&mut self, i: usize, outcome: &Outcome) {
        let n = &mut self.nodes[i];
        if n.in_flight > 0 {
            n.in_flight -= 1;
            if n.up {
                self.up_in_flight -= 1;
            }
        }
        n.completed += 1;
        n.bytes += outcome.bytes;
        n.cache_hits += outcome.from_cache as u64;
        self.refresh(i);
    }

    fn set_up(&mut self, i: usize, up: bool) -> bool {
        let n = &mut self.nodes[i];
        if n.up == up {
            return false;
        }
        n.up = up;
        if up {
            self.up_count += 1;
            self.up_in_flight += n.in_flight as u64;
            self.up_weight += n.weight as u64;
        } else {
            n.epoch = n.epoch.wrapping_add(1);
            self.up_count -= 1;
            self.up_in_flight -= n.in_flight as u64;
            self.up_weight -= n.weight as u64;
        }
        self.refresh(i);
        true
    }

    fn report(&mut self, i: usize, r: &LoadReport) {
        self.nodes[i].basis_at_report = self.basis_load(i);
        self.nodes[i].report = Some(*r);
        self.refresh(i);
    }

    fn decision(&self, p: Pick) -> Decision {
        let id = |s: usize| self.nodes[s].id;
        match p {
            Pick::Serve { slot, cache } => Decision::Serve {
                node: id(slot),
                cache,
            },
            Pick::Forward { handler, source } => Decision::Forward {
                handler: id(handler),
                source: id(source),
            },
            Pick::Handoff { from, to } => Decision::Handoff {
                from: id(from),
                to: id(to),
            },
        }
    }

    fn stats(&self, name: &'static str) -> PolicyStats {
        let c = &self.c;
        PolicyStats {
            policy: name,
            decisions: c.decisions,
            rejections: c.rejected_no_node + c.rejected_overloaded + c.rejected_shutdown,
            rejected_no_node: c.rejected_no_node,
            rejected_overloaded: c.rejected_overloaded,
            targets_mapped: 0,
            replicas: 0,
            reassignments: c.reassignments,
            spills: c.spills,
            forwards: c.forwards,
            handoffs: c.handoffs,
            evictions: c.evictions,
            nodes: (0..self.nodes.len())
                .map(|i| {
                    let n = &self.nodes[i];
                    NodeStats {
                        id: n.id,
                        up: n.up,
                        weight: n.weight,
                        load: self.load(i) as f64 / UNIT as f64,
                        in_flight: n.in_flight,
                        selected: n.selected,
                        completed: n.completed,
                        bytes: n.bytes,
                        cache_hits: n.cache_hits,
                        targets: 0,
                        connections: n.connections,
                        report: n.report,
                    }
                })
                .collect(),
        }
    }
}

/// The part that differs between policies. The [`Engine`] does the bookkeeping common to all
/// (membership, in-flight counts, reports, counters) and calls these hooks.
pub(crate) trait Strategy: Send {
    fn name(&self) -> &'static str;

    /// Which count is a node's load.
    fn basis(&self) -> Basis {
        Basis::InFlight
    }

    /// Forget all state (called by `init` before the nodes are added).
    fn reset(&mut self) {}

    /// Nodes were added or went up or down.
    fn membership(&mut self, _core: &Core) {}

    /// A node went down (after the core marked it down).
    fn node_down(&mut self, _core: &mut Core, _slot: usize, _now: Duration) {}

    fn connection_start(&mut self, _core: &mut Core, _conn: ConnId, _now: Duration) {}

    fn connection_end(&mut self, _core: &mut Core, _conn: ConnId, _now: Duration) {}

    fn classify(&self, _req: &Request<'_>) -> RequestClass {
        RequestClass::DEFAULT
    }

    fn class_name(&self, _class: RequestClass) -> Option<&str> {
        None
    }

    fn select(&mut self, core: &mut Core, req: &Request<'_>, now: Duration)
        -> Result<Pick, Reject>;

    /// A request finished on node `slot` (`None`: a node no longer known) with `outcome`.
    fn post_request(
        &mut self,
        _core: &mut Core,
        _conn: ConnId,
        _slot: Option<usize>,
        _outcome: &Outcome,
        _now: Duration,
    ) {
    }

    fn shutdown(&mut self, _core: &mut Core) {}

    /// Fill the strategy's figures (targets, replicas, per-node targets).
    fn stats(&self, _core: &Core, _st: &mut PolicyStats) {}

    fn mapped(&self, _core: &Core, _req: &Request<'_>) -> Vec<NodeId> {
        Vec::new()
    }
}

/// A [`Strategy`] with the common bookkeeping: the [`Policy`] the factory hands out.
pub(crate) struct Engine<S> {
    core: Core,
    s: S,
}

impl<S: Strategy> Engine<S> {
    pub fn new(cfg: &PolicyConfig, s: S) -> Self {
        Engine {
            core: Core::new(cfg, s.basis()),
            s,
        }
    }
}

impl<S: Strategy> Policy for Engine<S> {
    fn name(&self) -> &'static str {
        self.s.name()
    }

    fn init(&mut self, nodes: &[NodeSpec], _now: Duration) -> Result<(), PolicyError> {
        self.core.clear();
        self.s.reset();
        for spec in nodes {
            if let Err(e) = self.core.add(*spec) {
                self.core.clear();
                self.s.reset();
                return Err(e);
            }
        }
        self.s.membership(&self.core);
        Ok(())
    }

    fn add_node(&mut self, spec: NodeSpec, _now: Duration) -> Result<(), PolicyError> {
        self.core.add(spec)?;
        self.s.membership(&self.core);
        Ok(())
    }

    fn node_up(&mut self, node: NodeId, _now: Duration) {
        if let Some(i) = self.core.slot(node) {
            if self.core.set_up(i, true) {
                self.s.membership(&self.core);
            }
        }
    }

    fn node_down(&mut self, node: NodeId, now: Duration) {
        if let Some(i) = self.core.slot(node) {
            if self.core.set_up(i, false) {
                self.s.node_down(&mut self.core, i, now);
                self.s.membership(&self.core);
            }
        }
    }

    fn connection_start(&mut self, conn: ConnId, now: Duration) {
        self.s.connection_start(&mut self.core, conn, now);
    }

    fn connection_end(&mut self, conn: ConnId, now: Duration) {
        self.s.connection_end(&mut self.core, conn, now);
    }

    fn parse(&self, req: &Request<'_>) -> RequestClass {
        self.s.classify(req)
    }

    fn class_name(&self, class: RequestClass) -> &str {
        self.s.class_name(class).unwrap_or("default")
    }

    fn select(&mut self, req: &Request<'_>, now: Duration) -> Result<Decision, Reject> {
        let r = if self.core.shut {
            Err(Reject::ShuttingDown)
        } else {
            self.s.select(&mut self.core, req, now)
        };
        match r {
            Ok(p) => {
                self.core.dispatched(p.node());
                Ok(self.core.decision(p))
            }
            Err(e) => {
                let c = &mut self.core.c;
                match e {
                    Reject::NoNode => c.rejected_no_node += 1,
                    Reject::Overloaded => c.rejected_overloaded += 1,
                    Reject::ShuttingDown => c.rejected_shutdown += 1,
                }
                Err(e)
            }
        }
    }

    fn post_request(&mut self, conn: ConnId, node: NodeId, outcome: &Outcome, now: Duration) {
        let slot = self.core.slot(node);
        if let Some(i) = slot {
            self.core.finished(i, outcome);
        }
        self.s
            .post_request(&mut self.core, conn, slot, outcome, now);
    }

    fn load_report(&mut self, node: NodeId, report: &LoadReport, _now: Duration) {
        if let Some(i) = self.core.slot(node) {
            self.core.report(i, report);
        }
    }

    fn shutdown(&mut self) {
        self.core.shut = true;
        self.s.shutdown(&mut self.core);
    }

    fn stats(&self) -> PolicyStats {
        let mut st = self.core.stats(self.s.name());
        self.s.stats(&self.core, &mut st);
        st
    }

    fn mapped_nodes(&self, req: &Request<'_>) -> Vec<NodeId> {
        self.s.mapped(&self.core, req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PolicyKind;

    fn core(n: u32) -> Core {
        let mut c = Core::new(&PolicyConfig::new(PolicyKind::Lc), Basis::InFlight);
        for i in 0..n {
            c.add(NodeSpec::new(i)).unwrap();
        }
        c
    }

    #[test]
    fn min_tree_tracks_least_loaded_and_rotates_ties() {
        let mut c = core(3);
        // All at zero: the least recently touched first, i.e. slot 0, then after touching it 1...
        let a = c.least_loaded().unwrap();
        c.dispatched(a);
        c.finished(a, &Outcome::default());
        let b = c.least_loaded().unwrap();
        assert_ne!(a, b);
        c.dispatched(b);
        c.dispatched(b);
        let m = c.least_loaded().unwrap();
        assert_ne!(m, b);
        c.set_up(m, false);
        let m2 = c.least_loaded().unwrap();
        assert!(m2 != m && m2 != b);
        c.set_up(m2, false);
        assert_eq!(c.least_loaded(), Some(b));
        c.set_up(b, false);
        assert_eq!(c.least_loaded(), None);
        assert_eq!(c.reject(), Reject::NoNode);
    }

    #[test]
    fn capacity_makes_a_node_ineligible() {
        let mut c = Core::new(&PolicyConfig::new(PolicyKind::Lc), Basis::InFlight);
        c.add(NodeSpec::new(7).with_capacity(1)).unwrap();
        assert!(c.eligible(0));
        c.dispatched(0);
        assert!(!c.eligible(0));
        assert_eq!(c.least_loaded(), None);
        assert_eq!(c.reject(), Reject::Overloaded);
    }

    #[test]
    fn duplicate_and_heavy_nodes_are_refused() {
        let mut c = core(2);
        assert_eq!(
            c.add(NodeSpec::new(1)),
            Err(PolicyError::DuplicateNode(NodeId(1)))
        );
        assert!(c.add(NodeSpec::new(9).with_weight(MAX_WEIGHT + 1)).is_err());
        assert_eq!(c.slot(NodeId(1)), Some(1));
        assert_eq!(c.slot(NodeId(9)), None);
    }

    #[test]
    fn reported_load_is_corrected_by_local_changes() {
        let mut cfg = PolicyConfig::new(PolicyKind::Lc);
        cfg.load_source = LoadSource::Reported;
        let mut c = Core::new(&cfg, Basis::InFlight);
        c.add(NodeSpec::new(0)).unwrap();
        c.dispatched(0);
        assert_eq!(c.load(0), UNIT);
        c.report(
            0,
            &LoadReport {
                active_connections: 10,
                ..Default::default()
            },
        );
        assert_eq!(c.load(0), 10 * UNIT);
        c.dispatched(0);
        assert_eq!(c.load(0), 11 * UNIT);
        c.finished(0, &Outcome::default());
        c.finished(0, &Outcome::default());
        assert_eq!(c.load(0), 9 * UNIT);
    }
}
