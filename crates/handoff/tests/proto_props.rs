//! Property tests of the control protocol: every message round-trips, every
//! split of a frame stream decodes to the same messages, and arbitrary bytes
//! never panic the decoder.

use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use switchyard_handoff::proto::{DropReason, FrameBuffer, Message, RouteAction, Routing, Transfer};
use switchyard_handoff::repair::{RepairState, RepairWindow};

fn addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(a, p)| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(a), p))),
        (any::<[u8; 16]>(), any::<u16>(), any::<u32>(), any::<u32>())
            .prop_map(|(a, p, f, s)| SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(a), p, f, s))),
    ]
}

fn state() -> impl Strategy<Value = RepairState> {
    (
        any::<(u32, u32)>(),
        0u32..65536,
        (0u8..15, 0u8..15, 0u8..8),
        any::<u32>(),
        any::<[u32; 5]>(),
        proptest::collection::vec(any::<u8>(), 0..300),
        proptest::collection::vec(any::<u8>(), 0..300),
        any::<u32>(),
    )
        .prop_map(
            |((s, r), mss, (sw, rw, o), ts, w, sq, rq, unsent)| RepairState {
                snd_seq: s,
                rcv_seq: r,
                mss,
                snd_wscale: sw,
                rcv_wscale: rw,
                options: o,
                timestamp: ts,
                window: RepairWindow {
                    snd_wl1: w[0],
                    snd_wnd: w[1],
                    max_window: w[2],
                    rcv_wnd: w[3],
                    rcv_wup: w[4],
                },
                send_unsent: if sq.is_empty() {
                    0
                } else {
                    unsent % (sq.len() as u32 + 1)
                },
                send_queue: sq,
                recv_queue: rq,
            },
        )
}

fn transfer() -> impl Strategy<Value = Transfer> {
    prop_oneof![
        Just(Transfer::Fd),
        state().prop_map(|s| Transfer::Repair(Box::new(s)))
    ]
}

fn reason() -> impl Strategy<Value = DropReason> {
    prop_oneof![
        Just(DropReason::Busy),
        Just(DropReason::RestoreFailed),
        Just(DropReason::NoPrivilege),
        Just(DropReason::ShuttingDown),
        Just(DropReason::Aborted),
        Just(DropReason::Cancelled),
        Just(DropReason::Other)
    ]
}

fn action() -> impl Strategy<Value = RouteAction> {
    prop_oneof![
        Just(RouteAction::Serve),
        Just(RouteAction::HandBack),
        addr().prop_map(RouteAction::Forward)
    ]
}

fn message() -> impl Strategy<Value = Message> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..500);
    prop_oneof![
        "[a-z0-9-]{0,40}".prop_map(|name| Message::Hello { name }),
        (
            any::<u64>(),
            addr(),
            addr(),
            transfer(),
            bytes(),
            prop_oneof![Just(Routing::Own), Just(Routing::Ask), Just(Routing::Once)]
        )
            .prop_map(
                |(id, client, local, transfer, preread, route)| Message::Create {
                    id,
                    client,
                    local,
                    transfer,
                    preread,
                    route
                }
            ),
        (
            any::<(u64, u64)>(),
            "[A-Z]{1,8}",
            proptest::option::of("\\PC{0,40}"),
            "/\\PC{0,80}"
        )
            .prop_map(|((id, seq), method, host, target)| Message::Route {
                id,
                seq,
                method,
                host,
                target
            }),
        (any::<(u64, u64)>(), action()).prop_map(|((id, seq), action)| Message::Routed {
            id,
            seq,
            action
        }),
        any::<(u64, u16, u64, bool)>().prop_map(|(id, status, bytes, from_cache)| {
            Message::Served {
                id,
                status,
                bytes,
                from_cache,
            }
        }),
        any::<u64>().prop_map(|id| Message::Accepted { id }),
        any::<u64>().prop_map(|id| Message::Cancel { id }),
        (any::<u64>(), reason(), "\\PC{0,60}").prop_map(|(id, reason, detail)| Message::Drop {
            id,
            reason,
            detail
        }),
        any::<(u64, u64, u64)>().prop_map(|(id, requests, bytes)| Message::Closed {
            id,
            requests,
            bytes
        }),
        (any::<u64>(), transfer(), bytes(), any::<(u64, u64)>()).prop_map(
            |(id, transfer, preread, (requests, bytes))| Message::HandBack {
                id,
                transfer,
                preread,
                requests,
                bytes
            }
        ),
        any::<u64>().prop_map(|nonce| Message::Ping { nonce }),
        any::<u64>().prop_map(|nonce| Message::Pong { nonce }),
    ]
}

proptest! {
    #[test]
    fn every_message_round_trips(m in message()) {
        let f = m.to_frame().unwrap();
        let (d, used) = Message::decode(&f).unwrap().unwrap();
        prop_assert_eq!(used, f.len());
        prop_assert_eq!(d, m);
    }

    #[test]
    fn any_split_of_a_stream_decodes_the_same(ms in proptest::collection::vec(message(), 1..8), cuts in proptest::collection::vec(1usize..200, 1..40)) {
        let stream: Vec<u8> = ms.iter().flat_map(|m| m.to_frame().unwrap()).collect();
        let mut fb = FrameBuffer::new();
        let mut got = Vec::new();
        let mut off = 0;
        let mut ci = 0;
        while off < stream.len() {
            let n = cuts[ci % cuts.len()].min(stream.len() - off);
            ci += 1;
            fb.extend(&stream[off..off + n]);
            off += n;
            while let Some(m) = fb.next_message().unwrap() {
                got.push(m);
            }
        }
        prop_assert_eq!(got, ms);
        prop_assert_eq!(fb.pending(), 0);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(Some((m, used))) = Message::decode(&data) {
            prop_assert!(used <= data.len());
            // what decodes re-encodes to the same bytes
            prop_assert_eq!(&m.to_frame().unwrap()[..], &data[..used]);
        }
    }

    #[test]
    fn mutated_frames_never_panic(m in message(), pos in any::<usize>(), byte in any::<u8>()) {
        let mut f = m.to_frame().unwrap();
        let i = pos % f.len();
        f[i] = byte;
        let _ = Message::decode(&f);
    }
}
