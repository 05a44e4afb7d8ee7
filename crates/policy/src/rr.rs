//! `rr`: round robin over the nodes that are up, in the order they were added.

use std::time::Duration;

use crate::core::{Core, Pick, Strategy};
use crate::types::{Reject, Request};

/// The next eligible node at or after `*next` in slot order; advances `*next` past it.
pub(crate) fn rotate(core: &Core, next: &mut usize) -> Option<usize> {
    let n = core.nodes.len();
    for k in 0..n {
        let i = (*next + k) % n;
        if core.eligible(i) {
            *next = (i + 1) % n;
            return Some(i);
        }
    }
    None
}

/// Round robin: each node that is up (and below its capacity cap) in turn.
#[derive(Debug, Default)]
pub(crate) struct RoundRobin {
    next: usize,
}

impl Strategy for RoundRobin {
    fn name(&self) -> &'static str {
        "rr"
    }

    fn reset(&mut self) {
        self.next = 0;
    }

    fn select(
        &mut self,
        core: &mut Core,
        _req: &Request<'_>,
        _now: Duration,
    ) -> Result<Pick, Reject> {
        rotate(core, &mut self.next)
            .map(Pick::serve)
            .ok_or_else(|| core.reject())
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::*;
    use crate::{NodeId, PolicyKind};

    #[test]
    fn cycles_and_skips_down_nodes() {
        let mut p = policy(PolicyKind::Rr, 3);
        let seq: Vec<u32> = (0..6).map(|_| pick(&mut *p, "/a").0).collect();
        assert_eq!(seq, [0, 1, 2, 0, 1, 2]);
        p.node_down(NodeId(1), T0);
        let seq: Vec<u32> = (0..4).map(|_| pick(&mut *p, "/a").0).collect();
        assert_eq!(seq, [0, 2, 0, 2]);
    }
}
