//! `lard` and `lard-r`: locality-aware request distribution with the cost metrics of seed 003
//! §4.1 / Fig. 4, and its variant with replication (a server set per target).

use std::time::Duration;

use crate::config::PolicyConfig;
use crate::core::{Core, Pick, Strategy, INF, UNIT};
use crate::targets::{Awaiting, Entry, TargetTable};
use crate::types::{ConnId, NodeId, Outcome, PolicyStats, Reject, Request};

/// The three cost metrics of seed 003 Fig. 4, in fixed-point load units.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Costs {
    l_idle: u64,
    l_overload: u64,
    miss: u64,
}

impl Costs {
    pub fn new(cfg: &PolicyConfig) -> Self {
        Costs {
            l_idle: cfg.l_idle as u64 * UNIT,
            l_overload: cfg.l_overload as u64 * UNIT,
            miss: cfg.miss_cost as u64 * UNIT,
        }
    }

    /// `cost_balancing`: 0 below `L_idle`, infinite above `L_overload`, else `load - L_idle`.
    pub fn balancing(&self, load: u64) -> u64 {
        if load < self.l_idle {
            0
        } else if load > self.l_overload {
            INF
        } else {
            load - self.l_idle
        }
    }

    /// Aggregate cost on a node the target is mapped to: balancing + locality 1 + replacement 0.
    pub fn mapped(&self, load: u64) -> u64 {
        match self.balancing(load) {
            INF => INF,
            b => b + UNIT,
        }
    }

    /// Aggregate cost on a node the target is not mapped to: balancing + `MissCost` +
    /// replacement (0 below `L_idle`, else `MissCost`).
    pub fn unmapped(&self, load: u64) -> u64 {
        match self.balancing(load) {
            INF => INF,
            b => b + self.miss + if load < self.l_idle { 0 } else { self.miss },
        }
    }
}

/// Basic LARD over a target's member set: the node of minimum aggregate cost.
///
/// A member costs the mapped cost, or the unmapped one when it is known to have lost the
/// target from its cache ([`Entry::lost`]: it would read it from disk like any other node);
/// the cheapest member is found by cost. Among the other nodes the least loaded one is the
/// cheapest (the unmapped cost grows with load). Returns the slot and whether it is a new
/// member, or `None` when every cost is infinite. Ties stay on a member.
pub(crate) fn choose(core: &Core, costs: &Costs, e: &Entry) -> Option<(usize, bool)> {
    let mut best_member: Option<(u64, u64, usize)> = None;
    for &m in &e.members {
        let m = m as usize;
        if core.eligible(m) {
            let l = core.load(m);
            let c = if e.lost(m) {
                costs.unmapped(l)
            } else {
                costs.mapped(l)
            };
            if best_member.is_none_or(|(bc, bl, _)| (c, l) < (bc, bl)) {
                best_member = Some((c, l, m));
            }
        }
    }
    let cm = best_member.map_or(INF, |(c, _, _)| c);
    let other = core
        .least_loaded()
        .filter(|&l| !e.members.contains(&(l as u32)));
    let co = other.map_or(INF, |l| costs.unmapped(core.load(l)));
    if cm == INF && co == INF {
        None
    } else if co < cm {
        other.map(|l| (l, true))
    } else {
        best_member.map(|(_, _, m)| (m, false))
    }
}

/// `lard` (one node per target) and `lard-r` (a server set per target).
#[derive(Debug)]
pub(crate) struct Lard {
    replicate: bool,
    costs: Costs,
    shrink_after: Duration,
    table: TargetTable,
    /// Targets of requests not yet finished, to learn what the nodes' caches hold; `None`
    /// without `cache_feedback`.
    awaiting: Option<Awaiting>,
}

impl Lard {
    pub fn new(cfg: &PolicyConfig, replicate: bool) -> Self {
        Lard {
            replicate,
            costs: Costs::new(cfg),
            shrink_after: cfg.lard_r_shrink(),
            table: TargetTable::new(cfg.max_targets, cfg.host_in_key),
            awaiting: cfg.cache_feedback.then(Awaiting::default),
        }
    }

    fn select_single(
        &mut self,
        core: &mut Core,
        req: &Request<'_>,
        now: Duration,
    ) -> Result<Pick, Reject> {
        let (key, e, counts) = self.table.entry(req, &mut core.c.evictions);
        let (slot, fresh) = choose(core, &self.costs, e).ok_or_else(|| core.reject())?;
        if fresh {
            if let Some(&old) = e.members.first() {
                counts.remove(e, old as usize);
                core.c.reassignments += 1;
            }
            counts.add(e, slot);
            e.last_mod = now;
        }
        if let Some(a) = &mut self.awaiting {
            a.push(req.conn, key);
        }
        Ok(Pick::serve(slot))
    }

    fn select_replicated(
        &mut self,
        core: &mut Core,
        req: &Request<'_>,
        now: Duration,
    ) -> Result<Pick, Reject> {
        let (key, e, counts) = self.table.entry(req, &mut core.c.evictions);
        let (slot, fresh) = choose(core, &self.costs, e).ok_or_else(|| core.reject())?;
        if let Some(a) = &mut self.awaiting {
            a.push(req.conn, key);
        }
        if fresh {
            // Grow (or, for an empty set, place) the server set.
            counts.add(e, slot);
            e.last_mod = now;
        } else if e.members.len() > 1 && now.saturating_sub(e.last_mod) > self.shrink_after {
            // The set has not had to grow for K: drop its most loaded member.
            if let Some(victim) = most_loaded_other(core, e, slot) {
                counts.remove(e, victim);
                e.last_mod = now;
            }
        }
        Ok(Pick::serve(slot))
    }
}

/// The most loaded member other than `keep`.
fn most_loaded_other(core: &Core, e: &Entry, keep: usize) -> Option<usize> {
    e.members
        .iter()
        .map(|&m| m as usize)
        .filter(|&m| m != keep)
        .max_by_key(|&m| (core.load(m), m))
}

impl Strategy for Lard {
    fn name(&self) -> &'static str {
        if self.replicate {
            "lard-r"
        } else {
            "lard"
        }
    }

    fn reset(&mut self) {
        self.table.clear();
        if let Some(a) = &mut self.awaiting {
            a.clear();
        }
    }

    fn connection_end(&mut self, _core: &mut Core, conn: ConnId, _now: Duration) {
        if let Some(a) = &mut self.awaiting {
            a.end(conn);
        }
    }

    /// The node's word on its cache for the target it served.
    fn post_request(
        &mut self,
        _core: &mut Core,
        conn: ConnId,
        slot: Option<usize>,
        outcome: &Outcome,
        _now: Duration,
    ) {
        let key = self.awaiting.as_mut().and_then(|a| a.pop(conn));
        if let (Some(key), Some(slot)) = (key, slot) {
            self.table.observe(&key, slot, outcome);
        }
    }

    fn node_down(&mut self, core: &mut Core, slot: usize, _now: Duration) {
        core.c.reassignments += self.table.prune_slot(slot);
    }

    fn select(
        &mut self,
        core: &mut Core,
        req: &Request<'_>,
        now: Duration,
    ) -> Result<Pick, Reject> {
        if self.replicate {
            self.select_replicated(core, req, now)
        } else {
            self.select_single(core, req, now)
        }
    }

    fn shutdown(&mut self, _core: &mut Core) {
        self.table.clear();
        if let Some(a) = &mut self.awaiting {
            a.clear();
        }
    }

    fn stats(&self, _core: &Core, st: &mut PolicyStats) {
        fill_table_stats(&self.table, st);
    }

    fn mapped(&self, core: &Core, req: &Request<'_>) -> Vec<NodeId> {
        mapped_ids(&self.table, core, req)
    }
}

pub(crate) fn fill_table_stats(table: &TargetTable, st: &mut PolicyStats) {
    st.targets_mapped = table.counts.mapped;
    st.replicas = table.counts.replicas;
    for (i, n) in st.nodes.iter_mut().enumerate() {
        n.targets = table.counts.per_node.get(i).copied().unwrap_or(0);
    }
}

pub(crate) fn mapped_ids(table: &TargetTable, core: &Core, req: &Request<'_>) -> Vec<NodeId> {
    table.get(req).map_or_else(Vec::new, |e| {
        e.members
            .iter()
            .map(|&s| core.nodes[s as usize].id)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use crate::{NodeSpec, Outcome, Policy, PolicyKind};

    #[test]
    fn fig4_costs() {
        let c = Costs::new(&PolicyConfig::new(PolicyKind::Lard));
        assert_eq!(c.balancing(29 * UNIT), 0);
        assert_eq!(c.balancing(30 * UNIT), 0);
        assert_eq!(c.balancing(31 * UNIT), UNIT);
        assert_eq!(c.balancing(130 * UNIT), 100 * UNIT);
        assert_eq!(c.balancing(131 * UNIT), INF);
        assert_eq!(c.mapped(10 * UNIT), UNIT);
        assert_eq!(c.unmapped(10 * UNIT), 50 * UNIT);
        assert_eq!(c.unmapped(40 * UNIT), (10 + 50 + 50) * UNIT);
        assert_eq!(c.unmapped(200 * UNIT), INF);
    }

    fn hold(p: &mut dyn Policy, target: &str, k: usize) -> Vec<NodeId> {
        (0..k).map(|_| pick(p, target)).collect()
    }

    #[test]
    fn lard_keeps_then_moves_a_target() {
        let mut p = policy(PolicyKind::Lard, 2);
        // With defaults, the mapped node keeps the target up to load L_idle + MissCost - 1 = 79
        // (cost 50 = idle node's 50: ties stay), then the idle node is cheaper.
        let first = hold(&mut *p, "/a", 80);
        assert!(first.iter().all(|&n| n == first[0]));
        let next = pick(&mut *p, "/a");
        assert_ne!(next, first[0]);
        assert_eq!(p.stats().reassignments, 1);
        assert_eq!(p.mapped_nodes(&Request::get(CONN, "/a")), vec![next]);
    }

    #[test]
    fn lard_rejects_when_all_overloaded() {
        let mut cfg = PolicyConfig::new(PolicyKind::Lard);
        cfg.l_idle = 1;
        cfg.l_overload = 2;
        cfg.miss_cost = 1;
        let mut p = crate::build(&cfg).unwrap();
        p.init(&[NodeSpec::new(0)], T0).unwrap();
        hold(&mut *p, "/a", 3);
        assert_eq!(
            p.select(&Request::get(CONN, "/a"), T0),
            Err(Reject::Overloaded)
        );
        p.post_request(CONN, NodeId(0), &Outcome::ok(200, 1, true), T0);
        assert!(p.select(&Request::get(CONN, "/a"), T0).is_ok());
        assert_eq!(p.stats().rejected_overloaded, 1);
    }

    #[test]
    fn lard_node_down_orphans_and_counts() {
        let mut p = policy(PolicyKind::Lard, 2);
        let n = pick(&mut *p, "/a");
        p.post_request(CONN, n, &Outcome::ok(200, 1, true), T0);
        assert_eq!(p.stats().targets_mapped, 1);
        p.node_down(n, T0);
        let st = p.stats();
        assert_eq!((st.targets_mapped, st.reassignments), (0, 1));
        let m = pick(&mut *p, "/a");
        assert_ne!(m, n);
        assert_eq!(p.stats().reassignments, 1);
    }

    #[test]
    fn lard_r_grows_then_shrinks_after_k() {
        let mut p = policy(PolicyKind::LardR, 3);
        let held = hold(&mut *p, "/hot", 81);
        assert_eq!(p.stats().replicas, 1);
        assert_eq!(p.mapped_nodes(&Request::get(CONN, "/hot")).len(), 2);
        for n in held {
            p.post_request(CONN, n, &Outcome::ok(200, 1, true), T0);
        }
        // Not yet K (20 s) since the set grew: stays.
        let a = pick(&mut *p, "/hot");
        p.post_request(CONN, a, &Outcome::ok(200, 1, true), secs(19));
        assert_eq!(p.stats().replicas, 1);
        let b = p
            .select(&Request::get(CONN, "/hot"), secs(21))
            .unwrap()
            .node();
        p.post_request(CONN, b, &Outcome::ok(200, 1, true), secs(21));
        assert_eq!(p.stats().replicas, 0);
        assert_eq!(p.mapped_nodes(&Request::get(CONN, "/hot")), vec![b]);
    }

    /// A node that served a target from its cache and later without has lost it: past L_idle
    /// the target goes to a less loaded node, where a node still holding it keeps it.
    fn with_feedback(kind: PolicyKind, n: u32) -> Box<dyn Policy> {
        let mut cfg = PolicyConfig::new(kind);
        cfg.cache_feedback = true;
        let mut p = crate::build(&cfg).unwrap();
        p.init(&nodes(n), T0).unwrap();
        p
    }

    #[test]
    fn lard_moves_a_target_its_node_lost_from_cache() {
        for (feedback, lost) in [(true, false), (true, true), (false, true)] {
            let mut p = if feedback {
                with_feedback(PolicyKind::Lard, 2)
            } else {
                policy(PolicyKind::Lard, 2)
            };
            let x = pick(&mut *p, "/a");
            // The first fetch is a miss, as always: nothing is learnt from it.
            p.post_request(CONN, x, &Outcome::ok(200, 1, false), T0);
            assert_eq!(pick(&mut *p, "/a"), x);
            p.post_request(CONN, x, &Outcome::ok(200, 1, true), T0);
            // Load 36 on x: past L_idle, still cheaper than moving while x holds the target.
            assert!(hold(&mut *p, "/a", 36).iter().all(|&n| n == x));
            // One of them finishes from the cache, or not: x lost it.
            p.post_request(CONN, x, &Outcome::ok(200, 1, !lost), T0);
            // Without `cache_feedback` the word is not taken.
            let moved = feedback && lost;
            let next = pick(&mut *p, "/a");
            assert_eq!(next != x, moved, "feedback {feedback} lost {lost}");
            assert_eq!(p.stats().reassignments, u64::from(moved));
        }
    }

    /// Below L_idle a node that lost the target keeps it (moving buys nothing), and its next
    /// hit makes it a holder again.
    #[test]
    fn lard_keeps_a_lost_target_on_an_idle_node() {
        let mut p = with_feedback(PolicyKind::Lard, 2);
        let x = pick(&mut *p, "/a");
        p.post_request(CONN, x, &Outcome::ok(200, 1, true), T0);
        assert_eq!(pick(&mut *p, "/a"), x);
        p.post_request(CONN, x, &Outcome::ok(200, 1, false), T0);
        assert_eq!(pick(&mut *p, "/a"), x);
        p.post_request(CONN, x, &Outcome::ok(200, 1, true), T0);
        assert!(hold(&mut *p, "/a", 36).iter().all(|&n| n == x));
        assert_eq!(pick(&mut *p, "/a"), x);
        assert_eq!(p.stats().reassignments, 0);
    }
}
