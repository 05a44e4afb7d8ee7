//! Seed 001 Fig. 7, replayed byte for byte: two cores joined by sessions in memory
//! (`switchyard_rescue::mesh`) produce exactly the figure's lines, driven only by measured
//! traffic on a virtual clock.

use std::time::Duration;

use switchyard_rescue::mesh::Mesh;
use switchyard_rescue::{
    Action, Candidate, Core, EndReason, Measurement, PeerId, Received, RescueConfig, Session, State,
};

const ORIGIN: usize = 0;
const RESCUE: usize = 1;

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// www.origin.com, 1.2.3.4:8080, D_out 1000 kB/s, MaxIdle 600 s as in the figure.
fn origin_cfg() -> RescueConfig {
    let mut c = RescueConfig::new("www.origin.com", "1.2.3.4".parse().unwrap(), 8080, 1250.0);
    c.max_idle_secs = Some(600);
    c
}

/// www.rescue.com, 5.6.7.8:8080, D_out 10000 kB/s, granting one origin at most 111.2 kB/s,
/// so that the first D_redi is D_alloc × T_coff = 100.08, on the wire 100 kB/s.
fn rescue_cfg() -> RescueConfig {
    let mut c = RescueConfig::new("www.rescue.com", "5.6.7.8".parse().unwrap(), 8080, 12500.0);
    c.max_grant_kbps = Some(111.2);
    c
}

fn own(bytes: u64) -> Measurement {
    Measurement {
        elapsed: s(1),
        self_bytes: bytes,
        ..Measurement::default()
    }
}

fn rescuing(bytes: u64) -> Measurement {
    let mut m = own(0);
    m.rescue_bytes.insert(Mesh::peer(ORIGIN), bytes);
    m
}

fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn example_1_establish_adjust_and_release() {
    let mut mesh = Mesh::new(vec![origin_cfg(), rescue_cfg()], s(0)).unwrap();
    let rescuer = [Candidate {
        peer: Mesh::peer(RESCUE),
        d_free_kbps: 5000.0,
        domain: None,
    }];

    // The origin's load passes T_alert: initial allocation.
    mesh.tick_with(ORIGIN, s(1), &own(600_000), &rescuer);
    mesh.deliver_all(s(1));
    assert_eq!(mesh.nodes[ORIGIN].core.state(), State::Sos);
    assert_eq!(mesh.nodes[RESCUE].core.state(), State::Rescue);

    // d_resc(S_o) = 185.334 kB/s > D_alloc = 111.2: D_redi = 100.08 / (185.334 / 111.2) → 60.
    mesh.tick_with(RESCUE, s(2), &rescuing(185_334), &[]);
    mesh.deliver_all(s(2));
    // 133.546 kB/s: D_redi = 60.048 / 1.201 → 50.
    mesh.tick_with(RESCUE, s(3), &rescuing(133_546), &[]);
    mesh.deliver_all(s(3));
    // Below D_init (100.08) with D_redi below it: back to D_init → 100.
    mesh.tick_with(RESCUE, s(4), &rescuing(90_000), &[]);
    mesh.deliver_all(s(4));

    // The crowd is gone: N_low = 30 intervals below T_low, then complete release. Meanwhile
    // the rescue server still serves 105 kB/s (between D_init and D_alloc: no RATE).
    for t in 5..35 {
        mesh.tick_with(ORIGIN, s(t), &own(1_000), &rescuer);
        mesh.tick_with(RESCUE, s(t), &rescuing(105_000), &[]);
        mesh.deliver_all(s(t));
    }

    let expected = lines(
        "
        0>1: 1 SOS www.origin.com 1.2.3.4 8080 600
        1>0: 1 200 OK www-vh1.rescue.com 5.6.7.8 8080 100
        1>0: 1 RATE 60
        0>1: 1 200 OK
        1>0: 2 RATE 50
        0>1: 2 200 OK
        1>0: 3 RATE 100
        0>1: 3 200 OK
        0>1: 2 SHUTDOWN
        1>0: 2 200 OK
        ",
    );
    assert_eq!(mesh.transcript(), expected);
    // Byte for byte: every line is exactly the figure's text and one `\n`.
    for (w, e) in mesh.wire.iter().zip(&expected) {
        let text = e.split_once(": ").unwrap().1;
        assert_eq!(w.line, format!("{text}\n").into_bytes());
    }

    for n in &mesh.nodes {
        assert_eq!(n.core.state(), State::Normal);
    }
    assert!(mesh.nodes[ORIGIN].events.contains(&Action::RescuerEnded {
        peer: Mesh::peer(RESCUE),
        reason: EndReason::CompleteRelease
    }));
    assert!(mesh.nodes[RESCUE].events.iter().any(|a| matches!(
        a,
        Action::OriginEnded { peer, alias, reason: EndReason::PeerShutdown, .. }
            if *peer == Mesh::peer(ORIGIN) && alias == "www-vh1.rescue.com"
    )));
    // The origin redirected within the last D_redi it heard, then stopped.
    let plan = mesh.nodes[ORIGIN].redirector.plan().unwrap();
    assert!(!plan.is_active());
    assert_eq!(mesh.broken, 0);
}

#[test]
fn example_2_sos_refused_by_a_server_in_sos() {
    // Node 1 is itself in SOS (asking node 2) when node 0's SOS arrives.
    let third = RescueConfig::new("www.third.com", "9.9.9.9".parse().unwrap(), 80, 12500.0);
    let mut mesh = Mesh::new(vec![origin_cfg(), rescue_cfg(), third], s(0)).unwrap();
    let cand = |i: usize| Candidate {
        peer: Mesh::peer(i),
        d_free_kbps: 5000.0,
        domain: None,
    };
    mesh.tick_with(RESCUE, s(1), &own(6_000_000), &[cand(2)]);
    assert_eq!(mesh.nodes[RESCUE].core.state(), State::Sos);
    mesh.tick_with(ORIGIN, s(1), &own(600_000), &[cand(RESCUE)]);
    mesh.deliver_all(s(1));

    let between: Vec<String> = mesh
        .transcript()
        .into_iter()
        .filter(|l| l.starts_with("0>1") || l.starts_with("1>0"))
        .collect();
    assert_eq!(
        between,
        lines(
            "
            0>1: 1 SOS www.origin.com 1.2.3.4 8080 600
            1>0: 1 403 Reject
            "
        )
    );
    assert_eq!(mesh.nodes[ORIGIN].core.state(), State::Normal);
    assert_eq!(mesh.nodes[RESCUE].core.origins().count(), 0);
}

/// Writes the protocol actions through the session (what a driver does).
fn write(session: &mut Session, acts: Vec<Action>, out: &mut Vec<u8>) {
    for a in acts {
        match a {
            Action::Send { request, .. } => {
                out.extend(session.send_request(s(1), request).unwrap().1)
            }
            Action::Reply { seq, response, .. } => {
                out.extend(session.send_response(seq, response).unwrap())
            }
            _ => {}
        }
    }
}

/// The figure prints "S_r → S_o: 3 RATE 100" a second time, with no answer, just before the
/// origin's SHUTDOWN — a repetition in the text, since each RATE gets its `200 OK`. Fed to an
/// origin, the repeated line is answered like the first and changes nothing.
#[test]
fn the_repeated_rate_line_of_the_figure_is_harmless() {
    let mut core = Core::new(origin_cfg()).unwrap();
    let mut session = core.new_session();
    let rescuer = PeerId(1);
    let cand = [Candidate {
        peer: rescuer,
        d_free_kbps: 5000.0,
        domain: None,
    }];
    let mut out = Vec::new();
    let acts = core.on_tick(s(1), &own(600_000), &cand);
    write(&mut session, acts, &mut out);
    let from_rescuer = b"1 200 OK www-vh1.rescue.com 5.6.7.8 8080 100\n1 RATE 60\n2 RATE 50\n3 RATE 100\n3 RATE 100\n";
    for got in session.receive(from_rescuer).unwrap() {
        let Received::Deliver(msg) = got else {
            panic!("{got:?}")
        };
        let acts = core.on_message(s(1), rescuer, msg);
        write(&mut session, acts, &mut out);
    }
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "1 SOS www.origin.com 1.2.3.4 8080 600\n1 200 OK\n2 200 OK\n3 200 OK\n3 200 OK\n"
    );
    assert_eq!(core.status().rescuers[0].grant.d_redi_kbps, 100);
}
