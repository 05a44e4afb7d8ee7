//! `ext-lard`: extended LARD for persistent connections (seed 003 §4.2).

use std::collections::HashMap;
use std::time::Duration;

use crate::config::{PersistentRouting, PolicyConfig};
use crate::core::{Basis, Core, Pick, Strategy, INF, UNIT};
use crate::lard::{choose, fill_table_stats, mapped_ids, Costs};
use crate::targets::{Awaiting, TargetTable};
use crate::types::{ConnId, NodeId, Outcome, PolicyStats, Reject, Request};

/// What the policy remembers of one client connection.
#[derive(Debug, Default)]
struct ConnState {
    /// Connection-handling node and its epoch when the connection was placed.
    handler: Option<(usize, u32)>,
    last_request: Option<Duration>,
    /// Requests in the current batch so far.
    batch_len: u32,
    /// Requests in the previous batch: the `N` of the 1/N rule.
    last_batch_len: u32,
    /// Requests selected and not yet finished.
    outstanding: u32,
    /// Remote-fetch shares charged for the current batch: (slot, fixed-point load).
    charges: Vec<(usize, u64)>,
}

fn release(core: &mut Core, charges: &mut Vec<(usize, u64)>) {
    for (slot, amount) in charges.drain(..) {
        core.sub_held(slot, amount);
    }
}

/// Extended LARD.
#[derive(Debug)]
pub(crate) struct ExtLard {
    costs: Costs,
    disk_threshold: u32,
    mechanism: PersistentRouting,
    handoff_min: u64,
    batch_gap: Duration,
    table: TargetTable,
    conns: HashMap<ConnId, ConnState>,
    /// Charge vectors of closed connections, reused.
    spare: Vec<Vec<(usize, u64)>>,
    /// Targets of requests not yet finished, to learn what the nodes' caches hold; `None`
    /// without `cache_feedback`.
    awaiting: Option<Awaiting>,
}

impl ExtLard {
    pub fn new(cfg: &PolicyConfig) -> Self {
        ExtLard {
            costs: Costs::new(cfg),
            disk_threshold: cfg.disk_queue_threshold,
            mechanism: cfg.mechanism,
            handoff_min: cfg.handoff_min_bytes,
            batch_gap: cfg.batch_gap(),
            table: TargetTable::new(cfg.max_targets, cfg.host_in_key),
            conns: HashMap::new(),
            spare: Vec::new(),
            awaiting: cfg.cache_feedback.then(Awaiting::default),
        }
    }

    fn new_state(spare: &mut Vec<Vec<(usize, u64)>>) -> ConnState {
        ConnState {
            charges: spare.pop().unwrap_or_default(),
            ..ConnState::default()
        }
    }

    fn close(&mut self, core: &mut Core, mut st: ConnState) {
        release(core, &mut st.charges);
        if let Some((h, _)) = st.handler {
            core.sub_held(h, UNIT);
            core.nodes[h].connections = core.nodes[h].connections.saturating_sub(1);
        }
        if self.spare.len() < 1024 {
            self.spare.push(st.charges);
        }
    }

    fn use_handoff(&self, req: &Request<'_>) -> bool {
        match self.mechanism {
            PersistentRouting::Forward => false,
            PersistentRouting::Handoff => true,
            PersistentRouting::Auto => req.size_hint.is_some_and(|s| s >= self.handoff_min),
        }
    }
}

impl Strategy for ExtLard {
    fn name(&self) -> &'static str {
        "ext-lard"
    }

    fn basis(&self) -> Basis {
        Basis::Held
    }

    fn reset(&mut self) {
        self.table.clear();
        self.conns.clear();
        if let Some(a) = &mut self.awaiting {
            a.clear();
        }
    }

    fn node_down(&mut self, core: &mut Core, slot: usize, _now: Duration) {
        core.c.reassignments += self.table.prune_slot(slot);
    }

    fn connection_start(&mut self, _core: &mut Core, conn: ConnId, _now: Duration) {
        if !self.conns.contains_key(&conn) {
            let st = Self::new_state(&mut self.spare);
            self.conns.insert(conn, st);
        }
    }

    fn connection_end(&mut self, core: &mut Core, conn: ConnId, _now: Duration) {
        if let Some(st) = self.conns.remove(&conn) {
            self.close(core, st);
        }
        if let Some(a) = &mut self.awaiting {
            a.end(conn);
        }
    }

    fn select(
        &mut self,
        core: &mut Core,
        req: &Request<'_>,
        now: Duration,
    ) -> Result<Pick, Reject> {
        let handoff = self.use_handoff(req);
        let spare = &mut self.spare;
        let st = self
            .conns
            .entry(req.conn)
            .or_insert_with(|| Self::new_state(spare));

        // Batches: requests closer than `batch_gap` belong together. A new batch ends the old
        // one's remote charges and fixes N for the new one (seed 003 §4.2).
        if let Some(t) = st.last_request {
            if now.saturating_sub(t) > self.batch_gap {
                release(core, &mut st.charges);
                st.last_batch_len = st.batch_len;
                st.batch_len = 0;
            }
        }
        st.last_request = Some(now);
        st.batch_len += 1;

        let handler = st
            .handler
            .filter(|&(h, epoch)| core.nodes[h].up && core.nodes[h].epoch == epoch)
            .map(|(h, _)| h);

        let Some(h) = handler else {
            // First request (or the handling node died): basic LARD picks the handling node.
            if let Some((old, _)) = st.handler.take() {
                core.sub_held(old, UNIT);
                core.nodes[old].connections = core.nodes[old].connections.saturating_sub(1);
            }
            let (key, e, counts) = self.table.entry(req, &mut core.c.evictions);
            let (slot, fresh) = choose(core, &self.costs, e).ok_or_else(|| core.reject())?;
            if let Some(a) = &mut self.awaiting {
                a.push(req.conn, key);
            }
            if fresh {
                counts.add(e, slot);
                e.last_mod = now;
            }
            st.handler = Some((slot, core.nodes[slot].epoch));
            core.add_held(slot, UNIT);
            core.nodes[slot].connections += 1;
            st.outstanding += 1;
            return Ok(Pick::serve(slot));
        };

        st.outstanding += 1;
        let (key, e, counts) = self.table.entry(req, &mut core.c.evictions);
        if let Some(a) = &mut self.awaiting {
            a.push(req.conn, key);
        }
        // A member that lost the target from its cache (it said so) no longer holds it.
        let member = e.members.contains(&(h as u32));
        let cached = member && !e.lost(h);
        let disk_queue = core.nodes[h].report.map_or(0, |r| r.disk_queue);
        if cached || disk_queue < self.disk_threshold {
            // Served by the handling node; read from its disk if needed and cached there.
            if !cached {
                counts.add(e, h);
                e.last_mod = now;
            }
            return Ok(Pick::serve(h));
        }

        // The handling node's disk is busy and it lacks the target: least cost among it and the
        // nodes that cache the target.
        let handler_cost = if core.eligible(h) {
            self.costs.unmapped(core.load(h))
        } else {
            INF
        };
        let mut best: Option<(u64, usize)> = None;
        for m in e.holders() {
            if core.eligible(m) {
                let c = self.costs.mapped(core.load(m));
                if c != INF && best.is_none_or(|(bc, _)| c < bc) {
                    best = Some((c, m));
                }
            }
        }
        match best {
            Some((c, m)) if c < handler_cost => {
                if handoff {
                    core.sub_held(h, UNIT);
                    core.nodes[h].connections = core.nodes[h].connections.saturating_sub(1);
                    core.add_held(m, UNIT);
                    core.nodes[m].connections += 1;
                    st.handler = Some((m, core.nodes[m].epoch));
                    core.c.handoffs += 1;
                    Ok(Pick::Handoff { from: h, to: m })
                } else {
                    // N: the batch's size as far as known (the previous batch's, or this one's
                    // so far); one connection puts at most one unit per batch on a node.
                    let n = st.last_batch_len.max(st.batch_len).max(1) as u64;
                    let have = st.charges.iter().find(|(s, _)| *s == m).map_or(0, |c| c.1);
                    let share = (UNIT / n).max(1).min(UNIT.saturating_sub(have));
                    core.add_held(m, share);
                    match st.charges.iter_mut().find(|(s, _)| *s == m) {
                        Some((_, a)) => *a += share,
                        None => st.charges.push((m, share)),
                    }
                    core.c.forwards += 1;
                    Ok(Pick::Forward {
                        handler: h,
                        source: m,
                    })
                }
            }
            // No node caches the target: the handling node reads it and keeps the first copy
            // (caching it replicates nothing).
            _ if e.members.is_empty() => {
                counts.add(e, h);
                e.last_mod = now;
                Ok(Pick::serve(h))
            }
            // The handling node is the target's node and lost it: it reads it and caches it
            // again (no other node holds it more cheaply).
            _ if member => Ok(Pick::serve(h)),
            // Read from the handling node's own disk without caching it there (its cache is
            // assumed to be thrashing). Never refused: the connection already sits there.
            _ => Ok(Pick::Serve {
                slot: h,
                cache: false,
            }),
        }
    }

    fn post_request(
        &mut self,
        core: &mut Core,
        conn: ConnId,
        slot: Option<usize>,
        outcome: &Outcome,
        _now: Duration,
    ) {
        let key = self.awaiting.as_mut().and_then(|a| a.pop(conn));
        if let (Some(key), Some(slot)) = (key, slot) {
            self.table.observe(&key, slot, outcome);
        }
        if let Some(st) = self.conns.get_mut(&conn) {
            st.outstanding = st.outstanding.saturating_sub(1);
            if st.outstanding == 0 {
                // Everything asked so far is answered: the batch is served.
                release(core, &mut st.charges);
            }
        }
    }

    fn shutdown(&mut self, core: &mut Core) {
        let conns: Vec<_> = self.conns.drain().map(|(_, st)| st).collect();
        for st in conns {
            self.close(core, st);
        }
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

#[cfg(test)]
mod tests {
    use crate::testutil::*;
    use crate::{
        ConnId, Decision, LoadReport, NodeId, Outcome, Policy, PolicyConfig, PolicyKind, Request,
    };
    use std::time::Duration;

    fn busy(p: &mut dyn Policy, n: NodeId, q: u32) {
        p.load_report(
            n,
            &LoadReport {
                disk_queue: q,
                ..Default::default()
            },
            T0,
        );
    }

    fn load(p: &dyn Policy, n: NodeId) -> f64 {
        p.stats().nodes.iter().find(|s| s.id == n).unwrap().load
    }

    /// Places `/t` on some node via a connection of its own; returns that node.
    fn place(p: &mut dyn Policy, conn: u64, t: &str) -> NodeId {
        let c = ConnId(conn);
        p.connection_start(c, T0);
        let n = p.select(&Request::get(c, t), T0).unwrap().node();
        p.post_request(c, n, &Outcome::ok(200, 1, false), T0);
        p.connection_end(c, T0);
        n
    }

    #[test]
    fn low_disk_queue_keeps_requests_on_the_handler() {
        let mut p = policy(PolicyKind::ExtLard, 3);
        let owner = place(&mut *p, 10, "/img");
        let c = ConnId(1);
        p.connection_start(c, T0);
        let h = p.select(&Request::get(c, "/page"), T0).unwrap().node();
        assert_ne!(
            h, owner,
            "ties rotate, so the second connection lands elsewhere"
        );
        busy(&mut *p, h, 4);
        let d = p.select(&Request::get(c, "/img"), T0).unwrap();
        assert_eq!(
            d,
            Decision::Serve {
                node: h,
                cache: true
            }
        );
        // Now /img is cached on h as well.
        assert_eq!(p.stats().replicas, 1);
    }

    #[test]
    fn busy_disk_forwards_with_one_over_n() {
        let mut p = policy(PolicyKind::ExtLard, 3);
        let owner = place(&mut *p, 10, "/img");
        let c = ConnId(1);
        p.connection_start(c, T0);
        let h = p.select(&Request::get(c, "/page"), T0).unwrap().node();
        p.post_request(c, h, &Outcome::default(), T0);
        busy(&mut *p, h, 5);
        // Second batch of 4 requests: N estimated from the previous batch (1) => 1 unit each.
        let t1 = Duration::from_secs(1);
        let d = p.select(&Request::get(c, "/img"), t1).unwrap();
        assert_eq!(
            d,
            Decision::Forward {
                handler: h,
                source: owner
            }
        );
        assert_eq!(load(&*p, owner), 1.0);
        let mut served = vec![d.node()];
        for t in ["/a", "/b", "/c"] {
            let d = p.select(&Request::get(c, t), t1).unwrap();
            // Nobody caches these: the handling node reads them and keeps
            // the first copy (caching them replicates nothing).
            assert_eq!(
                d,
                Decision::Serve {
                    node: h,
                    cache: true
                }
            );
            served.push(d.node());
        }
        // Third batch: N = 4, so each forward charges 1/4.
        for n in served {
            p.post_request(c, n, &Outcome::default(), t1);
        }
        assert_eq!(load(&*p, owner), 0.0);
        let t2 = Duration::from_secs(2);
        p.select(&Request::get(c, "/img"), t2).unwrap();
        assert_eq!(load(&*p, owner), 0.25);
        assert_eq!(load(&*p, h), 1.0);
        p.connection_end(c, t2);
        assert_eq!(load(&*p, owner), 0.0);
        assert_eq!(load(&*p, h), 0.0);
        assert_eq!(p.stats().forwards, 2);
    }

    #[test]
    fn handoff_mechanism_moves_the_connection() {
        let mut cfg = PolicyConfig::new(PolicyKind::ExtLard);
        cfg.mechanism = crate::PersistentRouting::Auto;
        let mut p = crate::build(&cfg).unwrap();
        p.init(&nodes(3), T0).unwrap();
        let owner = place(&mut *p, 10, "/big");
        let c = ConnId(1);
        let h = p.select(&Request::get(c, "/page"), T0).unwrap().node();
        busy(&mut *p, h, 9);
        let mut r = Request::get(c, "/big");
        r.size_hint = Some(1 << 20);
        let d = p.select(&r, T0).unwrap();
        assert_eq!(d, Decision::Handoff { from: h, to: owner });
        assert_eq!(load(&*p, h), 0.0);
        assert_eq!(load(&*p, owner), 1.0);
        assert_eq!(p.stats().handoffs, 1);
    }

    /// With its disk busy, a handling node fetches a target from the node that holds it in its
    /// cache; once that node said it lost the target, it is read on the handling node instead.
    #[test]
    fn a_target_its_holder_lost_is_not_fetched_from_it() {
        for lost in [false, true] {
            let mut cfg = PolicyConfig::new(PolicyKind::ExtLard);
            cfg.cache_feedback = true;
            let mut p = crate::build(&cfg).unwrap();
            p.init(&nodes(3), T0).unwrap();
            let c1 = ConnId(1);
            p.connection_start(c1, T0);
            let h = p.select(&Request::get(c1, "/img"), T0).unwrap().node();
            p.post_request(c1, h, &Outcome::ok(200, 1, false), T0);
            assert_eq!(p.select(&Request::get(c1, "/img"), T0).unwrap().node(), h);
            p.post_request(c1, h, &Outcome::ok(200, 1, true), T0);
            assert_eq!(p.select(&Request::get(c1, "/img"), T0).unwrap().node(), h);
            p.post_request(c1, h, &Outcome::ok(200, 1, !lost), T0);

            let c2 = ConnId(2);
            p.connection_start(c2, T0);
            let g = p.select(&Request::get(c2, "/page"), T0).unwrap().node();
            assert_ne!(g, h);
            p.post_request(c2, g, &Outcome::ok(200, 1, false), T0);
            busy(&mut *p, g, 5);
            let d = p.select(&Request::get(c2, "/img"), T0).unwrap();
            let want = if lost {
                Decision::Serve {
                    node: g,
                    cache: false,
                }
            } else {
                Decision::Forward {
                    handler: g,
                    source: h,
                }
            };
            assert_eq!(d, want, "lost {lost}");
        }
    }
}
