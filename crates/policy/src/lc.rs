//! `lc`: least connections — the node with the fewest requests in flight (or, with
//! `load_source = "reported"`, the lowest reported load). Ties go to the node whose load changed
//! longest ago, so equal nodes take turns.

use std::time::Duration;

use crate::core::{Core, Pick, Strategy};
use crate::types::{Reject, Request};

/// Least connections.
#[derive(Debug, Default)]
pub(crate) struct LeastConnections;

impl Strategy for LeastConnections {
    fn name(&self) -> &'static str {
        "lc"
    }

    fn select(
        &mut self,
        core: &mut Core,
        _req: &Request<'_>,
        _now: Duration,
    ) -> Result<Pick, Reject> {
        core.least_loaded()
            .map(Pick::serve)
            .ok_or_else(|| core.reject())
    }
}

#[cfg(test)]
mod tests {
    use crate::testutil::*;
    use crate::{NodeId, Outcome, PolicyKind};

    #[test]
    fn picks_the_emptiest_node() {
        let mut p = policy(PolicyKind::Lc, 3);
        let a = pick(&mut *p, "/a");
        let b = pick(&mut *p, "/a");
        let c = pick(&mut *p, "/a");
        let mut all = vec![a, b, c];
        all.sort();
        assert_eq!(all, [NodeId(0), NodeId(1), NodeId(2)]);
        p.post_request(CONN, b, &Outcome::ok(200, 10, true), T0);
        assert_eq!(pick(&mut *p, "/a"), b);
    }
}
