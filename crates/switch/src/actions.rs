//! The switch's operator actions (`admin_actions = true`): `POST /actions/nodes/ID/VERB?g=GEN`
//! on the admin listener, where `ID` is the node's index in configuration generation `GEN` (the
//! dashboard's row) and `VERB` is `drain`, `down` or `up`. The generation guards against a
//! reload between the page's view and the click: a stale one is answered `409`. The guard
//! against other sites and the on/off switch are `switchyard_admin::actions`'.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use switchyard_admin::Page;

use crate::backend::Hold;
use crate::state::Shared;

/// What the operator asks of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// No new requests; those in flight finish.
    Drain,
    /// Out at once.
    Down,
    /// Back in service.
    Up,
}

/// One parsed action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    /// The node's index in the generation.
    pub node: usize,
    /// What to do.
    pub verb: Verb,
    /// The configuration generation the index belongs to.
    pub generation: u64,
}

impl Verb {
    /// The verb as written in the path.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Drain => "drain",
            Verb::Down => "down",
            Verb::Up => "up",
        }
    }
}

/// Parse `nodes/ID/VERB?g=GEN` (the target after `/actions/`).
pub fn parse(rest: &str) -> Result<Action, &'static str> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut parts = path.split('/');
    let (Some("nodes"), Some(id), Some(verb), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("unknown action: use POST /actions/nodes/ID/drain|down|up?g=GENERATION");
    };
    let node = id.parse().map_err(|_| "the node id is not a number")?;
    let verb = match verb {
        "drain" => Verb::Drain,
        "down" => Verb::Down,
        "up" => Verb::Up,
        _ => return Err("unknown verb: drain, down or up"),
    };
    let generation = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("g="))
        .ok_or("the configuration generation (?g=) is missing")?
        .parse()
        .map_err(|_| "the configuration generation is not a number")?;
    Ok(Action {
        node,
        verb,
        generation,
    })
}

fn json(status: u16, v: serde_json::Value) -> (u16, Page) {
    (
        status,
        Page {
            content_type: "application/json",
            body: v.to_string().into_bytes(),
        },
    )
}

/// Run the action at `rest`.
pub(crate) fn run(shared: &Arc<Shared>, rest: &str) -> (u16, Page) {
    let a = match parse(rest) {
        Ok(a) => a,
        Err(why) => return json(400, serde_json::json!({ "error": why })),
    };
    let g = shared.current();
    if a.generation != g.id {
        return json(
            409,
            serde_json::json!({
                "error": "the configuration changed since the page loaded its node list",
                "generation": g.id,
            }),
        );
    }
    let Some(b) = g.nodes.get(a.node) else {
        return json(404, serde_json::json!({ "error": "no such node" }));
    };
    match a.verb {
        Verb::Drain => shared.hold(b, Hold::Drain),
        Verb::Down => shared.hold(b, Hold::Down),
        Verb::Up => shared.release(b),
    }
    tracing::info!(node = %b.addr, verb = ?a.verb, "operator action");
    let in_flight = b.active.load(Relaxed);
    let state = match (b.hold(), in_flight) {
        (Some(Hold::Drain), 0) => "drained",
        (Some(Hold::Drain), _) => "draining",
        (Some(Hold::Down), _) => "marked down",
        (None, _) if b.is_up() => "up",
        (None, _) => "down",
    };
    json(
        200,
        serde_json::json!({
            "node": b.label,
            "state": state,
            "in_flight": in_flight,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse("nodes/2/drain?g=7"),
            Ok(Action {
                node: 2,
                verb: Verb::Drain,
                generation: 7
            })
        );
        assert_eq!(parse("nodes/0/up?x=1&g=1").unwrap().verb, Verb::Up);
        assert_eq!(parse("nodes/0/down?g=1").unwrap().verb, Verb::Down);
        for bad in [
            "nodes/0/drain",
            "nodes/x/drain?g=1",
            "nodes/0/reboot?g=1",
            "nodes/0/drain/more?g=1",
            "config?g=1",
            "nodes/0/up?g=zz",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
