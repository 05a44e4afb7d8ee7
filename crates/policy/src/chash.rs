//! `chash`: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent
//! Hashing with Bounded Loads", SODA 2018).
//!
//! Each node owns `chash_points × weight` points on a 64-bit ring; a target hashes to a position
//! and its home is the node of the first point clockwise. A request goes to the first node
//! clockwise from that position whose in-flight count, after adding the request, stays within
//! `ceil((1 + eps) × (T + 1) × w_i / W)`, where `T` is the number of requests in flight on nodes
//! that are up and `W` the sum of their weights (for equal weights: `ceil((1 + eps) × average)`).
//! Such a node always exists, because not every node can be above the average. Down nodes are
//! skipped, which is the same as taking their points off the ring: removing a node moves only the
//! targets it owned, and adding one moves only the targets it takes over.

use std::time::Duration;

use crate::config::PolicyConfig;
use crate::core::{Core, Pick, Strategy};
use crate::hash::{key_hash, point_hash};
use crate::types::{NodeId, Reject, Request};

/// Most ring points of one node.
const MAX_POINTS_PER_NODE: u64 = 1 << 17;

/// Consistent hashing with bounded loads.
#[derive(Debug)]
pub(crate) struct BoundedChash {
    eps: f64,
    points: u32,
    host_in_key: bool,
    /// (position, slot), sorted.
    ring: Vec<(u64, u32)>,
    built_for: usize,
}

impl BoundedChash {
    pub fn new(cfg: &PolicyConfig) -> Self {
        BoundedChash {
            eps: cfg.eps,
            points: cfg.chash_points,
            host_in_key: cfg.host_in_key,
            ring: Vec::new(),
            built_for: 0,
        }
    }

    fn rebuild(&mut self, core: &Core) {
        self.ring.clear();
        for (slot, n) in core.nodes.iter().enumerate() {
            let k = (self.points as u64 * n.weight as u64).min(MAX_POINTS_PER_NODE);
            for j in 0..k as u32 {
                self.ring.push((point_hash(n.id.0, j), slot as u32));
            }
        }
        // Ties (practically impossible) are broken by node id, not by the order nodes were added.
        self.ring
            .sort_unstable_by_key(|&(h, s)| (h, core.nodes[s as usize].id));
        self.built_for = core.nodes.len();
    }

    fn start(&self, req: &Request<'_>) -> usize {
        let host = if self.host_in_key { req.host } else { None };
        let h = key_hash(host, req.target);
        self.ring.partition_point(|&(p, _)| p < h) % self.ring.len()
    }

    /// `(1 + eps) × (T + 1) / W`: a node of weight `w` may hold `ceil(scale × w)` requests,
    /// counting the one being placed.
    fn scale(&self, core: &Core) -> f64 {
        (1.0 + self.eps) * (core.up_in_flight + 1) as f64 / core.up_weight.max(1) as f64
    }
}

/// Most requests a node of weight `w` may have in flight after taking one more.
fn bound(scale: f64, w: u32) -> u64 {
    // Guard against 2.0000000001 from rounding in an exact product.
    (scale * w as f64 - 1e-9).ceil().max(1.0) as u64
}

impl Strategy for BoundedChash {
    fn name(&self) -> &'static str {
        "chash"
    }

    fn reset(&mut self) {
        self.ring.clear();
        self.built_for = 0;
    }

    fn membership(&mut self, core: &Core) {
        if core.nodes.len() != self.built_for {
            self.rebuild(core);
        }
    }

    fn select(
        &mut self,
        core: &mut Core,
        req: &Request<'_>,
        _now: Duration,
    ) -> Result<Pick, Reject> {
        if self.ring.is_empty() {
            return Err(Reject::NoNode);
        }
        let len = self.ring.len();
        let start = self.start(req);
        let home = self.ring[start].1 as usize;
        let scale = self.scale(core);
        let mut first_up = None;
        for k in 0..len {
            let slot = self.ring[(start + k) % len].1 as usize;
            if !core.nodes[slot].up {
                continue;
            }
            first_up.get_or_insert(slot);
            if core.eligible(slot)
                && (core.nodes[slot].in_flight as u64) < bound(scale, core.nodes[slot].weight)
            {
                if slot != home {
                    core.c.reassignments += 1;
                }
                if first_up != Some(slot) {
                    core.c.spills += 1;
                }
                return Ok(Pick::serve(slot));
            }
        }
        if first_up.is_none() {
            Err(Reject::NoNode)
        } else {
            Err(Reject::Overloaded)
        }
    }

    fn mapped(&self, core: &Core, req: &Request<'_>) -> Vec<NodeId> {
        if self.ring.is_empty() {
            return Vec::new();
        }
        let start = self.start(req);
        let len = self.ring.len();
        (0..len)
            .map(|k| self.ring[(start + k) % len].1 as usize)
            .find(|&s| core.nodes[s].up)
            .map(|s| core.nodes[s].id)
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::*;
    use crate::{NodeId, NodeSpec, Outcome, PolicyConfig, PolicyKind, Request};

    #[test]
    fn same_target_same_node_when_unloaded() {
        let mut p = policy(PolicyKind::Chash, 5);
        let home = p.mapped_nodes(&Request::get(CONN, "/x"))[0];
        for _ in 0..10 {
            let n = pick(&mut *p, "/x");
            assert_eq!(n, home);
            p.post_request(CONN, n, &Outcome::ok(200, 1, true), T0);
        }
        assert_eq!(p.stats().spills, 0);
    }

    #[test]
    fn hot_target_spills_within_the_bound() {
        let mut cfg = PolicyConfig::new(PolicyKind::Chash);
        cfg.eps = 0.0;
        let mut p = crate::build(&cfg).unwrap();
        p.init(&[NodeSpec::new(0), NodeSpec::new(1), NodeSpec::new(2)], T0)
            .unwrap();
        let mut counts = [0u32; 3];
        for _ in 0..9 {
            counts[pick(&mut *p, "/hot").0 as usize] += 1;
        }
        // eps = 0: perfectly even.
        assert_eq!(counts, [3, 3, 3]);
        assert!(p.stats().spills > 0);
    }

    #[test]
    fn all_down_is_no_node() {
        let mut p = policy(PolicyKind::Chash, 2);
        p.node_down(NodeId(0), T0);
        p.node_down(NodeId(1), T0);
        assert_eq!(
            p.select(&Request::get(CONN, "/"), T0),
            Err(crate::Reject::NoNode)
        );
        assert!(p.mapped_nodes(&Request::get(CONN, "/")).is_empty());
    }
}
