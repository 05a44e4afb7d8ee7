//! `wrr`: weighted round robin, smooth variant: in every cycle of `W = sum of weights` picks
//! (weights divided by their greatest common divisor) node `i` is chosen exactly `w_i` times, and
//! the picks of a heavy node are spread over the cycle rather than bunched.

use std::time::Duration;

use crate::core::{Core, Pick, Strategy};
use crate::types::{Reject, Request};

/// Longest precomputed schedule; beyond it the smooth algorithm runs per pick (O(n)).
const MAX_SCHEDULE: u64 = 8192;

/// Weighted round robin.
#[derive(Debug, Default)]
pub(crate) struct WeightedRoundRobin {
    /// One cycle of slots; empty when `on_the_fly`.
    schedule: Vec<u32>,
    pos: usize,
    /// Per-slot current weight of the smooth algorithm, for the unscheduled case.
    current: Vec<i64>,
    on_the_fly: bool,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One step of smooth weighted round robin: every candidate's current weight grows by its
/// weight, the largest wins and loses the total. `weight(i) == 0` leaves slot `i` out.
#[allow(clippy::needless_range_loop)]
fn smooth_step(current: &mut [i64], weight: impl Fn(usize) -> i64) -> Option<usize> {
    let mut total = 0i64;
    let mut best: Option<usize> = None;
    for i in 0..current.len() {
        let w = weight(i);
        if w == 0 {
            continue;
        }
        current[i] += w;
        total += w;
        if best.is_none_or(|b| current[i] > current[b]) {
            best = Some(i);
        }
    }
    let b = best?;
    current[b] -= total;
    Some(b)
}

impl Strategy for WeightedRoundRobin {
    fn name(&self) -> &'static str {
        "wrr"
    }

    fn reset(&mut self) {
        *self = WeightedRoundRobin::default();
    }

    fn membership(&mut self, core: &Core) {
        let n = core.nodes.len();
        self.pos = 0;
        self.current = vec![0; n];
        self.schedule.clear();
        let up = |i: usize| core.nodes[i].up && core.nodes[i].weight > 0;
        let g = (0..n)
            .filter(|&i| up(i))
            .fold(0u64, |g, i| gcd(g, core.nodes[i].weight as u64));
        if g == 0 {
            self.on_the_fly = false;
            return;
        }
        let cycle: u64 = (0..n)
            .filter(|&i| up(i))
            .map(|i| core.nodes[i].weight as u64 / g)
            .sum();
        self.on_the_fly = cycle > MAX_SCHEDULE;
        if self.on_the_fly {
            return;
        }
        let mut cur = vec![0i64; n];
        let weight = |i: usize| {
            if up(i) {
                (core.nodes[i].weight as u64 / g) as i64
            } else {
                0
            }
        };
        self.schedule = (0..cycle)
            .map(|_| smooth_step(&mut cur, weight).expect("cycle > 0 implies a node") as u32)
            .collect();
    }

    fn select(
        &mut self,
        core: &mut Core,
        _req: &Request<'_>,
        _now: Duration,
    ) -> Result<Pick, Reject> {
        if self.on_the_fly {
            let weight = |i: usize| {
                if core.eligible(i) {
                    core.nodes[i].weight as i64
                } else {
                    0
                }
            };
            return smooth_step(&mut self.current, weight)
                .map(Pick::serve)
                .ok_or_else(|| {
                    if core.up_weight == 0 {
                        Reject::NoNode
                    } else {
                        core.reject()
                    }
                });
        }
        let len = self.schedule.len();
        if len == 0 {
            // Nothing up, or only nodes of weight 0.
            return Err(Reject::NoNode);
        }
        for _ in 0..len {
            let s = self.schedule[self.pos] as usize;
            self.pos = (self.pos + 1) % len;
            if core.eligible(s) {
                return Ok(Pick::serve(s));
            }
        }
        Err(core.reject())
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::*;
    use crate::{NodeId, NodeSpec, PolicyConfig, PolicyKind};

    #[test]
    fn weights_3_1_are_smooth_and_exact() {
        let mut p = crate::build(&PolicyConfig::new(PolicyKind::Wrr)).unwrap();
        p.init(&[NodeSpec::new(0).with_weight(3), NodeSpec::new(1)], T0)
            .unwrap();
        let seq: Vec<u32> = (0..8).map(|_| pick(&mut *p, "/").0).collect();
        assert_eq!(seq, [0, 0, 1, 0, 0, 0, 1, 0]);
    }

    #[test]
    fn large_weights_run_on_the_fly() {
        let mut p = crate::build(&PolicyConfig::new(PolicyKind::Wrr)).unwrap();
        p.init(
            &[
                NodeSpec::new(0).with_weight(997),
                NodeSpec::new(1).with_weight(991),
                NodeSpec::new(2).with_weight(983),
            ],
            T0,
        )
        .unwrap();
        let mut counts = [0u32; 3];
        for _ in 0..(997 + 991 + 983) {
            counts[pick(&mut *p, "/").0 as usize] += 1;
        }
        assert_eq!(counts, [997, 991, 983]);
        p.node_down(NodeId(0), T0);
        for _ in 0..100 {
            assert_ne!(pick(&mut *p, "/"), NodeId(0));
        }
    }

    #[test]
    fn zero_weight_only_is_no_node() {
        let mut p = crate::build(&PolicyConfig::new(PolicyKind::Wrr)).unwrap();
        p.init(&[NodeSpec::new(0).with_weight(0)], T0).unwrap();
        assert_eq!(
            p.select(&crate::Request::get(CONN, "/"), T0),
            Err(crate::Reject::NoNode)
        );
    }
}
