//! Connections that fail: a lost connection or an unanswered request ends the relationship on
//! both sides, on the virtual clock of the in-memory mesh.

use std::time::Duration;

use switchyard_rescue::mesh::Mesh;
use switchyard_rescue::{Action, Candidate, EndReason, Measurement, RescueConfig, State};

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn mesh() -> Mesh {
    let o = RescueConfig::new("www.origin.com", "1.2.3.4".parse().unwrap(), 80, 1250.0);
    let r = RescueConfig::new("www.rescue.com", "5.6.7.8".parse().unwrap(), 80, 12500.0);
    Mesh::new(vec![o, r], s(0)).unwrap()
}

fn busy() -> Measurement {
    Measurement {
        elapsed: s(1),
        self_bytes: 800_000,
        ..Measurement::default()
    }
}

fn cands() -> Vec<Candidate> {
    vec![Candidate {
        peer: Mesh::peer(1),
        d_free_kbps: 5000.0,
        domain: None,
    }]
}

fn established() -> Mesh {
    let mut m = mesh();
    m.tick_with(0, s(1), &busy(), &cands());
    m.deliver_all(s(1));
    assert_eq!(m.nodes[0].core.state(), State::Sos);
    assert_eq!(m.nodes[1].core.state(), State::Rescue);
    assert!(m.nodes[0].redirector.plan().unwrap().is_active());
    m
}

fn ended(m: &Mesh, node: usize) -> Vec<EndReason> {
    m.nodes[node]
        .events
        .iter()
        .filter_map(|a| match a {
            Action::RescuerEnded { reason, .. } | Action::OriginEnded { reason, .. } => {
                Some(*reason)
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_lost_connection_ends_the_relationship_on_both_sides() {
    let mut m = established();
    m.cut(0, 1, s(2));
    for n in 0..2 {
        assert_eq!(m.nodes[n].core.state(), State::Normal, "node {n}");
        assert_eq!(ended(&m, n), vec![EndReason::ConnectionLost]);
    }
    assert!(!m.nodes[0].redirector.plan().unwrap().is_active());
}

#[test]
fn an_unanswered_rate_times_out_and_ends_both_sides() {
    let mut m = established();
    // The rescue server serves more than D_alloc (5000 kB/s) for the origin: D_redi falls and
    // a RATE goes out, but the origin never answers (its bytes stay in flight).
    let mut heavy = Measurement::idle(s(1));
    heavy.rescue_bytes.insert(Mesh::peer(0), 6_000_000);
    m.tick_with(1, s(2), &heavy, &[]);
    assert_eq!(m.busy_links(), vec![(1, 0)]);
    m.check_timeouts(s(11));
    assert_eq!(m.nodes[1].core.state(), State::Rescue, "not late yet");
    m.check_timeouts(s(12));
    assert_eq!(m.broken, 1);
    for n in 0..2 {
        assert_eq!(m.nodes[n].core.state(), State::Normal, "node {n}");
    }
    assert!(
        m.busy_links().is_empty(),
        "what was in flight is gone with the connection"
    );
}

#[test]
fn an_unanswered_sos_times_out_and_the_candidate_waits() {
    let mut m = mesh();
    m.tick_with(0, s(1), &busy(), &cands());
    assert_eq!(m.nodes[0].core.state(), State::Sos);
    m.check_timeouts(s(11));
    assert_eq!(m.nodes[0].core.state(), State::Normal);
    // The same candidate is not asked again at once.
    m.tick_with(0, s(12), &busy(), &cands());
    assert_eq!(m.nodes[0].core.state(), State::Normal);
    assert!(m.busy_links().is_empty());
}

#[test]
fn crossing_shutdowns_are_harmless() {
    let mut m = established();
    // Both sides end the relationship at once: each answers the other's SHUTDOWN with 200.
    m.apply(
        0,
        s(3),
        vec![Action::Send {
            peer: Mesh::peer(1),
            request: switchyard_rescue::Request::Shutdown,
        }],
    );
    m.apply(
        1,
        s(3),
        vec![Action::Send {
            peer: Mesh::peer(0),
            request: switchyard_rescue::Request::Shutdown,
        }],
    );
    m.deliver_all(s(3));
    assert_eq!(m.broken, 0);
    for n in 0..2 {
        assert_eq!(m.nodes[n].core.state(), State::Normal, "node {n}");
    }
}
