//! No connection is served twice: a node that answers a handoff only after the switch's
//! timeout fired either has the connection alone (a late `Accepted`: the switch writes nothing)
//! or gives it back (`Drop` answering the `Cancel`: the switch relays). A real switch, a real
//! client, a real node for relaying; the taker is scripted here on the real control protocol
//! (the handoff crate's reader and writer on a Unix socket), so that it can hold its answer
//! until the switch's `Cancel` proves the timeout fired.

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use common::{TestNode, TestSwitch};
use switchyard_handoff::fdpass::{self, Outgoing};
use switchyard_handoff::proto::{DropReason, Message, Transfer};
use switchyard_switch::config::{ControlAddr, Mechanism};
use switchyard_switch::NodeEntry;

/// How the scripted taker answers a `Create` once it has seen its `Cancel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Late {
    /// `Accepted`, then a response of its own on the passed descriptor.
    Accept,
    /// `Drop` with `Cancelled`; the descriptor is closed unused.
    Refuse,
}

/// The node's own response in the `Accept` case.
const NODE_RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nfrom taker";

/// What the scripted taker saw, in order.
#[derive(Debug)]
enum Seen {
    Hello,
    Create(u64),
    Cancel(u64),
    Answered,
}

/// A control listener at `path` that answers `Hello`, takes one `Create` with its descriptor,
/// waits for the switch's `Cancel` of it and answers as `late` says.
fn scripted_taker(path: PathBuf, late: Late) -> (tokio::runtime::Runtime, mpsc::Receiver<Seen>) {
    let (rt, listener) = common::control_listener(&path);
    let (seen, events) = mpsc::channel();
    rt.spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let (mut reader, mut writer) = fdpass::control_unix(s);
        let send = |m: Message| [Outgoing::plain(m)];
        let (m, _) = reader.recv().await.unwrap().unwrap();
        assert!(matches!(m, Message::Hello { .. }), "{m:?}");
        writer
            .send_batch(&send(Message::Hello {
                name: "scripted".into(),
            }))
            .await
            .unwrap();
        seen.send(Seen::Hello).unwrap();
        let (id, fd) = match next_frame(&mut reader, &mut writer).await {
            (
                Message::Create {
                    id,
                    transfer: Transfer::Fd,
                    ..
                },
                Some(fd),
            ) => (id, fd),
            (other, _) => panic!("unexpected {other:?}"),
        };
        seen.send(Seen::Create(id)).unwrap();
        // No answer until the switch gives up waiting and says so.
        match next_frame(&mut reader, &mut writer).await {
            (Message::Cancel { id: c }, None) if c == id => {}
            (other, _) => panic!("unexpected {other:?}"),
        }
        seen.send(Seen::Cancel(id)).unwrap();
        match late {
            Late::Accept => {
                writer
                    .send_batch(&send(Message::Accepted { id }))
                    .await
                    .unwrap();
                // Served only once the Accepted is written, as every taker does.
                let mut client = std::net::TcpStream::from(fd);
                client.write_all(NODE_RESPONSE).unwrap();
            }
            Late::Refuse => {
                drop(fd);
                writer
                    .send_batch(&send(Message::Drop {
                        id,
                        reason: DropReason::Cancelled,
                        detail: "cancelled before answered".into(),
                    }))
                    .await
                    .unwrap();
            }
        }
        seen.send(Seen::Answered).unwrap();
        // Keep the control connection open (a clean end would be an answer too).
        while let Ok(Some(_)) = reader.recv().await {}
    });
    (rt, events)
}

/// The next frame from the switch other than a `Ping` (each answered with its `Pong`).
async fn next_frame(
    reader: &mut fdpass::ControlReader,
    writer: &mut fdpass::ControlWriter,
) -> (Message, Option<std::os::fd::OwnedFd>) {
    loop {
        match reader.recv().await.unwrap().unwrap() {
            (Message::Ping { nonce }, _) => writer
                .send_batch(&[Outgoing::plain(Message::Pong { nonce })])
                .await
                .unwrap(),
            frame => return frame,
        };
    }
}

/// A switch whose one node has the scripted taker as its control listener and a real HTTP
/// node behind its address (for relaying), with a short handoff timeout.
fn setup(
    late: Late,
) -> (
    TestSwitch,
    TestNode,
    tokio::runtime::Runtime,
    mpsc::Receiver<Seen>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("taker.sock");
    let (rt, events) = scripted_taker(path.clone(), late);
    let node = TestNode::start(|r| common::write(r, "who", b"real node"), |_| {});
    let entry = NodeEntry {
        control: Some(ControlAddr::Unix(path)),
        ..NodeEntry::new(node.addr)
    };
    let sw = TestSwitch::start(&[node.addr], |c| {
        c.nodes = vec![entry];
        c.mechanism = Mechanism::Handoff;
        c.handoff_timeout_ms = 100;
        // One worker thread, so one control connection: the scripted taker takes one.
        c.workers = 1;
        // No health checks: every request the real node sees is a relayed one.
        c.health_interval_ms = 0;
    });
    assert!(matches!(
        events.recv_timeout(Duration::from_secs(10)),
        Ok(Seen::Hello)
    ));
    assert!(sw
        .rt
        .block_on(sw.sw().wait_for_controls(Duration::from_secs(10))));
    (sw, node, rt, events, dir)
}

/// Sends one request with `Connection: close` and reads everything until the end of the
/// connection.
fn exchange(sw: &TestSwitch) -> Vec<u8> {
    let mut c = std::net::TcpStream::connect(sw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /who HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut all = Vec::new();
    c.read_to_end(&mut all).unwrap();
    all
}

fn expect(events: &mpsc::Receiver<Seen>) -> Seen {
    events.recv_timeout(Duration::from_secs(10)).unwrap()
}

/// Counts the HTTP status lines in `bytes`.
fn responses(bytes: &[u8]) -> usize {
    bytes.windows(9).filter(|w| w == b"HTTP/1.1 ").count()
}

#[test]
fn a_late_accept_leaves_the_connection_to_the_node_alone() {
    let (sw, node, _rt, events, _dir) = setup(Late::Accept);
    let all = exchange(&sw);
    // The taker saw its Create and then the switch's Cancel: the timeout had fired.
    let Seen::Create(id) = expect(&events) else {
        panic!("expected the Create")
    };
    assert!(matches!(expect(&events), Seen::Cancel(c) if c == id));
    assert!(matches!(expect(&events), Seen::Answered));
    // Exactly the node's response, and the end of the connection: the switch wrote nothing.
    assert_eq!(
        String::from_utf8_lossy(&all),
        String::from_utf8_lossy(NODE_RESPONSE)
    );
    assert_eq!(responses(&all), 1);
    assert_eq!(node.requests(), 0, "the switch relayed the request too");
    let m = sw.sw().handoff_metrics();
    assert_eq!(m.late_accepts.get(), 1);
    assert_eq!(m.handoffs_fd.get(), 1);
    let status = {
        let mut a = common::Client::connect(sw.sw().admin_addr().unwrap());
        String::from_utf8(a.raw(b"GET /status.json HTTP/1.1\r\nHost: a\r\n\r\n").body).unwrap()
    };
    assert!(status.contains("\"late_accepts\":1,"), "{status}");
    assert!(status.contains("\"abandoned\":0"), "{status}");
    for reason in ["timeout", "refused", "control_lost", "abandoned"] {
        assert_eq!(m.fallbacks_for(reason), 0, "{reason}");
    }
}

#[test]
fn a_cancel_answered_with_drop_gets_the_connection_relayed_once() {
    let (sw, node, _rt, events, _dir) = setup(Late::Refuse);
    let all = exchange(&sw);
    let Seen::Create(id) = expect(&events) else {
        panic!("expected the Create")
    };
    assert!(matches!(expect(&events), Seen::Cancel(c) if c == id));
    assert!(matches!(expect(&events), Seen::Answered));
    // Exactly the relayed response of the real node.
    assert_eq!(responses(&all), 1, "{}", String::from_utf8_lossy(&all));
    assert!(
        all.ends_with(b"real node"),
        "{}",
        String::from_utf8_lossy(&all)
    );
    assert_eq!(node.requests(), 1);
    let m = sw.sw().handoff_metrics();
    assert_eq!(m.fallbacks_for("timeout"), 1);
    assert_eq!(m.late_accepts.get(), 0);
    assert_eq!(m.handoffs_fd.get(), 0);
    assert_eq!(m.fallbacks_for("abandoned"), 0);
}
