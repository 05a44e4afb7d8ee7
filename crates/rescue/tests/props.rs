//! Property tests of the rescue core, the redirector, the codec and the session: the
//! invariants of seed 001 under arbitrary measurements, messages, delays and broken
//! connections.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use proptest::prelude::*;
use switchyard_rescue::mesh::Mesh;
use switchyard_rescue::proto::code;
use switchyard_rescue::{
    Action, Candidate, Core, Grant, Inbound, Measurement, Message, PeerId, Received, RedirectPlan,
    RedirectTarget, Redirector, Request, RescueConfig, Response, Route, RouteQuery, Session, Sos,
    State,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// D_out = 1000 kB/s; short N_low and MaxIdle keep the runs small.
fn cfg(i: usize) -> RescueConfig {
    let mut c = RescueConfig::new(
        &format!("www.s{i}.example"),
        IpAddr::from([10, 0, 0, i as u8 + 1]),
        8080,
        1250.0,
    );
    c.n_low = 3;
    c.max_idle_secs = Some(5);
    c.retry_refused_intervals = 2;
    c.request_timeout_ms = 3000;
    c
}

fn sos() -> Sos {
    Sos {
        fqdn: "www.o.example".into(),
        ip: [1, 2, 3, 4].into(),
        port: 80,
        max_idle_secs: 5,
        want_kbps: None,
    }
}

/// Checks the state invariants of one core.
fn check_state(c: &Core) {
    let st = c.status();
    let giving = !st.origins.is_empty();
    let getting = !st.rescuers.is_empty() || st.pending_sos.is_some();
    assert!(!(giving && getting), "SOS and rescue at once: {st:?}");
    let expect = if getting {
        State::Sos
    } else if giving {
        State::Rescue
    } else {
        State::Normal
    };
    assert_eq!(c.state(), expect);
    match c.state() {
        State::Sos => assert_eq!(c.d_free(), 0.0),
        State::Normal => assert_eq!(c.d_free(), c.config().d_resc()),
        State::Rescue => assert!(c.d_free() >= 0.0 && c.d_free() <= c.config().d_resc()),
    }
}

/// What may happen to a lone core.
#[derive(Debug, Clone)]
enum Op {
    /// A control interval: own load (% of D_out), rescue load per origin peer, redirect levels
    /// (% of D_redi) per rescue server, redirects in the interval, candidate sizes.
    Tick {
        gap_ms: u64,
        own: u32,
        resc: Vec<(u8, u32)>,
        levels: Vec<u32>,
        redirects: u32,
        cands: Vec<(u8, u32)>,
    },
    Sos(u8),
    Rate(u8, u16),
    Shutdown(u8),
    Granted(u8, u16),
    Refused(u8),
    RateRefused(u8),
    Lost(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let peer = 0u8..6;
    prop_oneof![
        4 => (
            prop_oneof![Just(1000u64), 0u64..2500],
            0u32..140,
            prop::collection::vec((0u8..6, 0u32..120), 0..4),
            prop::collection::vec(0u32..120, 0..4),
            0u32..3000,
            prop::collection::vec((0u8..6, 0u32..8000), 0..5),
        )
            .prop_map(|(gap_ms, own, resc, levels, redirects, cands)| Op::Tick {
                gap_ms,
                own,
                resc,
                levels,
                redirects,
                cands
            }),
        2 => peer.clone().prop_map(Op::Sos),
        1 => (peer.clone(), 0u16..3000).prop_map(|(p, k)| Op::Rate(p, k)),
        1 => peer.clone().prop_map(Op::Shutdown),
        2 => (peer.clone(), 0u16..3000).prop_map(|(p, k)| Op::Granted(p, k)),
        1 => peer.clone().prop_map(Op::Refused),
        1 => peer.clone().prop_map(Op::RateRefused),
        1 => peer.prop_map(Op::Lost),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// One state at a time; no rescue while in SOS; at most one allocation round per interval,
    /// and it asks the largest eligible candidate; redirect plans only name rescue servers.
    #[test]
    fn core_invariants(ops in prop::collection::vec(op(), 1..120)) {
        let c0 = cfg(9);
        let mut core = Core::new(c0.clone()).unwrap();
        let mut now = Duration::ZERO;
        let mut last_round: Option<Duration> = None;
        // The model of the back-off: a candidate that refused or was lost while asked waits
        // `retry_refused_intervals` intervals.
        let mut ticks = 0u64;
        let mut backoff: BTreeMap<PeerId, u64> = BTreeMap::new();
        for op in ops {
            let before = core.state();
            let pending = core.status().pending_sos;
            match op {
                Op::Refused(p) | Op::Lost(p) if pending == Some(PeerId(p as u32)) => {
                    backoff.insert(PeerId(p as u32), ticks + c0.retry_refused_intervals as u64);
                }
                Op::Shutdown(p) | Op::Lost(p) if core.rescuers().any(|r| r == PeerId(p as u32)) => {
                    backoff.insert(PeerId(p as u32), ticks + c0.retry_refused_intervals as u64);
                }
                _ => {}
            }
            let acts = match &op {
                Op::Tick { gap_ms, own, resc, levels, redirects, cands } => {
                    now += ms(*gap_ms);
                    ticks += 1;
                    let mut m = Measurement {
                        elapsed: ms((*gap_ms).max(1)),
                        self_bytes: *own as u64 * 10 * gap_ms,
                        redirects: *redirects as u64,
                        redirect_bytes: *redirects as u64 * 468,
                        ..Measurement::default()
                    };
                    for (p, l) in resc {
                        m.rescue_bytes.insert(PeerId(*p as u32), *l as u64 * 10 * gap_ms);
                    }
                    let st = core.status();
                    for (r, l) in st.rescuers.iter().zip(levels) {
                        let b = r.grant.d_redi_kbps * *l as u64 * gap_ms / 100;
                        m.redirected.insert(r.peer, b);
                    }
                    let cands: Vec<Candidate> = cands
                        .iter()
                        .map(|(p, k)| Candidate { peer: PeerId(*p as u32), d_free_kbps: *k as f64, domain: None })
                        .collect();
                    let acts = core.on_tick(now, &m, &cands);
                    let soses: Vec<PeerId> = acts.iter().filter_map(|a| match a {
                        Action::Send { peer, request: Request::Sos(_) } => Some(*peer),
                        _ => None,
                    }).collect();
                    prop_assert!(soses.len() <= 1);
                    if let Some(p) = soses.first() {
                        if let Some(t) = last_round {
                            prop_assert!(now - t >= c0.control_interval(), "two rounds in one interval");
                        }
                        last_round = Some(now);
                        // Largest first (no domains given): the largest eligible candidate.
                        let chosen = cands.iter().filter(|c| c.peer == *p).map(|c| c.d_free_kbps).fold(f64::MIN, f64::max);
                        let best = cands
                            .iter()
                            .filter(|c| c.d_free_kbps >= c0.min_grant_kbps)
                            .filter(|c| !core.rescuers().any(|r| r == c.peer) && !core.origins().any(|o| o == c.peer))
                            .filter(|c| backoff.get(&c.peer).is_none_or(|&t| ticks >= t))
                            .map(|c| c.d_free_kbps)
                            .fold(f64::MIN, f64::max);
                        prop_assert_eq!(chosen, best);
                    }
                    acts
                }
                Op::Sos(p) => {
                    let acts = core.on_message(now, PeerId(*p as u32), Inbound::Request { seq: 1, request: Request::Sos(sos()) });
                    if before == State::Sos {
                        let rejected = matches!(&acts[0], Action::Reply { response: Response::Refused { code: code::REJECT, .. }, .. });
                        prop_assert!(rejected, "SOS accepted in SOS: {:?}", acts);
                        let added = acts.iter().any(|a| matches!(a, Action::OriginAdded { .. }));
                        prop_assert!(!added, "rescue while in SOS");
                    }
                    acts
                }
                Op::Rate(p, k) => core.on_message(now, PeerId(*p as u32), Inbound::Request { seq: 2, request: Request::Rate { kbps: *k as u64 } }),
                Op::Shutdown(p) => core.on_message(now, PeerId(*p as u32), Inbound::Request { seq: 3, request: Request::Shutdown }),
                Op::Granted(p, _) | Op::Refused(p) if pending != Some(PeerId(*p as u32)) => Vec::new(),
                Op::Granted(p, k) => core.on_message(now, PeerId(*p as u32), Inbound::Response {
                    seq: 1,
                    request: Request::Sos(sos()),
                    response: Response::Granted(Grant { alias: "r-vh1.example".into(), ip: [10, 9, 9, *p].into(), port: 80, d_redi_kbps: *k as u64 }),
                }),
                Op::Refused(p) => core.on_message(now, PeerId(*p as u32), Inbound::Response {
                    seq: 1,
                    request: Request::Sos(sos()),
                    response: Response::reject(),
                }),
                Op::RateRefused(p) => core.on_message(now, PeerId(*p as u32), Inbound::Response {
                    seq: 1,
                    request: Request::Rate { kbps: 1 },
                    response: Response::refused(code::NO_RELATIONSHIP),
                }),
                Op::Lost(p) => core.on_peer_lost(now, PeerId(*p as u32)),
            };
            check_state(&core);
            // SOS only from ticks; plans only name current rescue servers.
            if !matches!(op, Op::Tick { .. }) {
                let sos_sent = acts.iter().any(|a| matches!(a, Action::Send { request: Request::Sos(_), .. }));
                prop_assert!(!sos_sent, "SOS outside a tick");
            }
            for a in &acts {
                if let Action::Redirect(plan) = a {
                    let names: Vec<PeerId> = plan.targets.iter().map(|t| t.peer).collect();
                    let now_rescuers: Vec<PeerId> = core.rescuers().collect();
                    prop_assert_eq!(names, now_rescuers);
                    prop_assert!(plan.t_redi >= 0.0 && plan.t_redi <= c0.t_high);
                }
                if let Action::StateChanged { from, to } = a {
                    prop_assert_ne!(from, to);
                    // Never straight between SOS and rescue.
                    prop_assert!(!matches!((from, to), (State::Sos, State::Rescue) | (State::Rescue, State::Sos)));
                }
            }
        }
    }

    /// Allocation takes the candidates largest first, one per round (Fig. 11's order).
    #[test]
    fn large_rescue_servers_first(sizes in prop::collection::btree_set(1000u32..20000, 1..6)) {
        let sizes: Vec<u32> = sizes.into_iter().rev().collect();
        let mut origin = Core::new(cfg(9)).unwrap();
        // Candidates listed in an order unrelated to their size.
        let mut cands: Vec<Candidate> = sizes.iter().enumerate()
            .map(|(i, k)| Candidate { peer: PeerId(i as u32), d_free_kbps: *k as f64, domain: None })
            .collect();
        cands.sort_by_key(|c| (c.d_free_kbps as u32).wrapping_mul(2654435761));
        let mut asked = Vec::new();
        for t in 1..=sizes.len() as u64 * 2 {
            let mut m = Measurement { elapsed: ms(1000), self_bytes: 950_000, ..Measurement::default() };
            for r in origin.status().rescuers {
                m.redirected.insert(r.peer, r.grant.d_redi_kbps * 1000);
            }
            for a in origin.on_tick(ms(1000 * t), &m, &cands) {
                if let Action::Send { peer, request: Request::Sos(_) } = a {
                    asked.push(sizes[peer.0 as usize]);
                    origin.on_message(ms(1000 * t), peer, Inbound::Response {
                        seq: 1,
                        request: Request::Sos(sos()),
                        response: Response::Granted(Grant { alias: "a.b".into(), ip: [9, 9, 9, 9].into(), port: 80, d_redi_kbps: 100 }),
                    });
                }
            }
        }
        prop_assert_eq!(asked, sizes);
    }

    /// The redirector never exceeds D_out / A_redi redirects nor any D_redi budget in an
    /// interval, serves below the threshold, and never redirects the status page or a rescue
    /// server's own requests.
    #[test]
    fn redirect_bounds(
        d_out_kbps in 1u32..2000,
        t_redi in 0.0f64..0.75,
        budgets in prop::collection::vec(0u32..500, 1..5),
        reqs in prop::collection::vec((0u32..30, 0u64..2_000_000, 0u64..3_000_000, 0u8..10), 1..300),
        interval_ms in prop_oneof![Just(1000u64), 100u64..3000],
    ) {
        let mut c = cfg(0);
        c.large_file_bytes = 500_000;
        let mut r = Redirector::new(&c);
        let targets: Vec<RedirectTarget> = budgets.iter().enumerate().map(|(i, b)| RedirectTarget {
            peer: PeerId(i as u32),
            alias: format!("r{i}-vh1.example"),
            ip: [10, 1, 0, i as u8].into(),
            port: 80,
            d_redi: *b as f64 * 1000.0,
        }).collect();
        let plan = RedirectPlan {
            interval: 1,
            interval_len: ms(interval_ms),
            d_out: d_out_kbps as f64 * 1000.0,
            t_redi,
            a_redi: 468.0,
            targets: targets.clone(),
        };
        r.apply(plan.clone());
        let mut sent: BTreeMap<PeerId, u64> = BTreeMap::new();
        let mut n = 0u64;
        for (path, size, out, who) in reqs {
            let client: IpAddr = if who == 0 { [10, 1, 0, 0].into() } else { [192, 0, 2, who].into() };
            let path = if path == 0 { c.status_path.clone() } else { format!("/f{path}") };
            let q = RouteQuery { client, path: &path, size };
            match r.route(&q, out) {
                Route::Redirect(t) => {
                    prop_assert!(path != c.status_path && who != 0);
                    prop_assert!(out.saturating_add(size) as f64 > plan.threshold_bytes());
                    *sent.entry(t.peer).or_default() += size;
                    n += 1;
                }
                Route::Serve | Route::Refuse => {}
            }
        }
        prop_assert!(n <= plan.max_redirects());
        prop_assert!(n as f64 <= plan.d_out * interval_ms as f64 / 1000.0 / plan.a_redi);
        for t in &targets {
            let s = sent.get(&t.peer).copied().unwrap_or(0);
            prop_assert!(s as f64 <= t.d_redi * interval_ms as f64 / 1000.0);
            prop_assert_eq!(s, r.sent(t.peer));
        }
    }

    /// Whatever happens while the crowd is there — any loads, delays, lost messages and broken
    /// connections — once the load drops every relationship is released on both sides and
    /// every server is back to normal.
    #[test]
    fn every_relationship_is_released_once_load_drops(
        steps in prop::collection::vec((0u32..130, prop::collection::vec(0u32..60, 4), 0u8..8, 0u8..4, any::<bool>()), 1..60),
    ) {
        let n = 4;
        let mut mesh = Mesh::new((0..n).map(cfg).collect(), Duration::ZERO).unwrap();
        let cands = |me: usize, mesh: &Mesh| -> Vec<Candidate> {
            (0..n).filter(|&j| j != me).map(|j| Candidate {
                peer: Mesh::peer(j),
                d_free_kbps: mesh.nodes[j].core.d_free() / 1000.0,
                domain: None,
            }).collect()
        };
        let mut now = Duration::ZERO;
        for (origin_load, others, deliver, cut, tick_all) in steps {
            now += ms(1000);
            // Node 0 is the site with the crowd; the others have their own loads and serve
            // what they rescue.
            for i in 0..n {
                if i != 0 && !tick_all {
                    continue;
                }
                let mut m = Measurement::idle(ms(1000));
                m.self_bytes = if i == 0 { origin_load as u64 * 10_000 } else { others[i] as u64 * 10_000 };
                for o in mesh.nodes[i].core.origins().collect::<Vec<_>>() {
                    m.rescue_bytes.insert(o, others[0] as u64 * 3_000);
                }
                for r in mesh.nodes[i].core.status().rescuers {
                    m.redirected.insert(r.peer, r.grant.d_redi_kbps * others[3] as u64 * 20);
                }
                let c = cands(i, &mesh);
                mesh.tick_with(i, now, &m, &c);
            }
            // Deliver some of what is in flight, maybe break a connection.
            for _ in 0..deliver {
                if let Some(&(a, b)) = mesh.busy_links().first() {
                    mesh.deliver_one(now, a, b);
                }
            }
            if cut > 0 {
                let a = cut as usize % n;
                let b = (a + 1 + deliver as usize % (n - 1)) % n;
                if a != b {
                    mesh.cut(a, b, now);
                }
            }
            mesh.check_timeouts(now);
            for node in &mesh.nodes {
                check_state(&node.core);
            }
        }
        // The crowd is gone: nothing but idle intervals.
        let limit = 3 + 5 + 3 + 10;
        for _ in 0..limit {
            now += ms(1000);
            for i in 0..n {
                let c = cands(i, &mesh);
                mesh.tick_with(i, now, &Measurement::idle(ms(1000)), &c);
            }
            mesh.deliver_all(now);
            mesh.check_timeouts(now);
        }
        for (i, node) in mesh.nodes.iter().enumerate() {
            prop_assert_eq!(node.core.state(), State::Normal, "node {}: {:?}", i, node.core.status());
            prop_assert!(!node.redirector.plan().is_some_and(|p| p.is_active()));
        }
    }

    /// Every message encodes to one line that decodes to the same message.
    #[test]
    fn codec_round_trip(m in message()) {
        let line = m.to_line().unwrap();
        prop_assert!(line.len() <= switchyard_rescue::proto::MAX_LINE);
        prop_assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        prop_assert_eq!(Message::decode(&line[..line.len() - 1]).unwrap(), m);
    }

    /// Arbitrary lines never panic the decoder, and what decodes re-encodes to a line that
    /// decodes to the same message.
    #[test]
    fn decoder_total(line in prop::collection::vec(prop_oneof![Just(b' '), Just(b'1'), Just(b'.'), any::<u8>(), b'a'..=b'z', b'0'..=b'9'], 0..80)) {
        if let Ok(m) = Message::decode(&line) {
            let again = m.to_line().unwrap();
            prop_assert_eq!(Message::decode(&again[..again.len() - 1]).unwrap(), m);
        }
    }

    /// A session gives the same results however the stream is cut into reads.
    #[test]
    fn session_reads_are_split_invariant(
        msgs in prop::collection::vec(message(), 0..12),
        cuts in prop::collection::vec(0usize..400, 0..8),
    ) {
        let stream: Vec<u8> = msgs.iter().flat_map(|m| m.to_line().unwrap()).collect();
        let run = |pieces: Vec<&[u8]>| {
            let mut s = Session::new(ms(1000));
            let mut out: Vec<Received> = Vec::new();
            for p in pieces {
                match s.receive(p) {
                    Ok(v) => out.extend(v),
                    Err(e) => return (out, Some(e)),
                }
            }
            (out, None)
        };
        let whole = run(vec![&stream]);
        let mut points: Vec<usize> = cuts.into_iter().map(|c| c.min(stream.len())).collect();
        points.sort();
        let mut pieces = Vec::new();
        let mut last = 0;
        for p in points {
            pieces.push(&stream[last..p]);
            last = p;
        }
        pieces.push(&stream[last..]);
        let split = run(pieces);
        // The same error, or the same deliveries (a failing read loses what it decoded: the
        // connection ends with it).
        prop_assert_eq!(&split.1, &whole.1);
        let expected: Vec<Received> = msgs
            .iter()
            .map_while(|m| match m {
                Message::Request { seq, request } => Some(Received::Deliver(Inbound::Request {
                    seq: *seq,
                    request: request.clone(),
                })),
                Message::Response { .. } => None,
            })
            .collect();
        let requests = expected.len();
        if whole.1.is_none() {
            prop_assert_eq!(&split.0, &whole.0);
            prop_assert_eq!(&whole.0, &expected);
        } else {
            // A response nobody asked for ends the session, after at most the requests before it.
            prop_assert_eq!(&split.0[..], &expected[..split.0.len()]);
            prop_assert_eq!(&whole.0[..], &expected[..whole.0.len()]);
        }
        prop_assert_eq!(whole.1.is_some(), requests < msgs.len());
    }
}

fn name() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-z0-9]([a-z0-9_-]{0,10}[a-z0-9])?", 1..4).prop_map(|l| l.join("."))
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u16; 8]>().prop_map(IpAddr::from),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    let rate = 0u64..=switchyard_rescue::proto::MAX_RATE_KBPS;
    let request = prop_oneof![
        (name(), ip(), 1u16.., 1u32.., prop::option::of(rate.clone())).prop_map(
            |(fqdn, ip, port, max_idle_secs, want_kbps)| Request::Sos(Sos {
                fqdn,
                ip,
                port,
                max_idle_secs,
                want_kbps
            })
        ),
        rate.clone().prop_map(|kbps| Request::Rate { kbps }),
        Just(Request::Shutdown),
    ];
    let response = prop_oneof![
        Just(Response::Ok),
        (name(), ip(), 1u16.., rate).prop_map(|(alias, ip, port, d_redi_kbps)| {
            Response::Granted(Grant {
                alias,
                ip,
                port,
                d_redi_kbps,
            })
        }),
        (300u16..600, "[!-~]{1,32}").prop_map(|(code, reason)| Response::Refused { code, reason }),
    ];
    prop_oneof![
        (any::<u32>(), request).prop_map(|(seq, request)| Message::Request { seq, request }),
        (any::<u32>(), response).prop_map(|(seq, response)| Message::Response { seq, response }),
    ]
}
