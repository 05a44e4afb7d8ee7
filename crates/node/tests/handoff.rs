//! The node's handoff receiver over real sockets, without privileges: a test
//! switch accepts real client connections, reads the first request, and
//! hands the socket to the node over its Unix control listener
//! (`SCM_RIGHTS`); the client is then answered by the node directly.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use switchyard_handoff::fdpass::{FdConn, FdReceiver, FdSender, MsgReader, MsgWriter};
use switchyard_handoff::proto::{DropReason, Message, RouteAction, Routing, Transfer};
use switchyard_handoff::repair::RepairState;

use common::{eventually, write, Client, TestNode};

const WAIT: Duration = Duration::from_secs(5);

/// A node with a Unix handoff listener in its own temporary directory.
fn node_with_handoff(
    fill: impl FnOnce(&Path),
    tweak: impl FnOnce(&mut switchyard_node::NodeConfig),
) -> (TestNode, tempfile::TempDir) {
    let sock_dir = tempfile::tempdir().unwrap();
    let path = sock_dir.path().join("node.sock");
    let node = TestNode::start(fill, |c| {
        c.handoff_unix = Some(path);
        c.workers = 2;
        tweak(c);
    });
    (node, sock_dir)
}

/// The test's switch: one control connection, and a listener for clients.
struct Switch {
    rt: tokio::runtime::Runtime,
    rx: FdReceiver,
    tx: FdSender,
    clients: TcpListener,
    next_id: u64,
    /// Messages received while waiting for another one.
    backlog: std::collections::VecDeque<Message>,
}

/// A client connection as the switch accepted it.
struct Handed {
    id: u64,
    client: Client,
    /// The switch's own copy of the socket.
    own: TcpStream,
}

impl Switch {
    fn connect(node: &TestNode) -> Switch {
        let path = node
            .node
            .as_ref()
            .unwrap()
            .handoff_unix()
            .unwrap()
            .to_path_buf();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let s = rt.block_on(tokio::net::UnixStream::connect(&path)).unwrap();
        let (rx, tx) = FdConn::new(s).split();
        let mut sw = Switch {
            rt,
            rx,
            tx,
            clients: TcpListener::bind("127.0.0.1:0").unwrap(),
            next_id: 1,
            backlog: Default::default(),
        };
        sw.send(
            &Message::Hello {
                name: "switch".into(),
            },
            None,
        );
        let (hello, _) = sw.recv();
        assert_eq!(
            hello,
            Message::Hello {
                name: node.addr.to_string()
            }
        );
        sw
    }

    fn send(&mut self, m: &Message, fd: Option<std::os::fd::BorrowedFd<'_>>) {
        self.rt.block_on(self.tx.send(m, fd)).unwrap();
    }

    fn recv(&mut self) -> (Message, Option<OwnedFd>) {
        self.try_recv(WAIT).expect("a control message")
    }

    fn try_recv(&mut self, wait: Duration) -> Option<(Message, Option<OwnedFd>)> {
        if let Some(m) = self.backlog.pop_front() {
            return Some((m, None));
        }
        let got = self
            .rt
            .block_on(async { tokio::time::timeout(wait, self.rx.recv()).await });
        match got {
            Ok(r) => r.expect("a valid control frame"),
            Err(_) => None,
        }
    }

    /// A client connects and sends `request`; the switch accepts it and
    /// reads the request head.
    fn accept(&mut self, request: &[u8]) -> (Client, TcpStream, Vec<u8>) {
        let mut client = Client::connect(self.clients.local_addr().unwrap());
        client.send(request);
        let (mut own, _) = self.clients.accept().unwrap();
        own.set_read_timeout(Some(WAIT)).unwrap();
        let mut pre = Vec::new();
        while !pre.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut b = [0u8; 4096];
            let n = own.read(&mut b).unwrap();
            assert!(n > 0, "client closed");
            pre.extend_from_slice(&b[..n]);
        }
        (client, own, pre)
    }

    /// Hand a new client connection to the node; returns the node's answer.
    fn create(&mut self, request: &[u8], route: Routing) -> (Handed, Message) {
        let (client, own, pre) = self.accept(request);
        let id = self.next_id;
        self.next_id += 1;
        let m = Message::Create {
            id,
            client: own.peer_addr().unwrap(),
            local: own.local_addr().unwrap(),
            transfer: Transfer::Fd,
            preread: pre,
            route,
        };
        self.send(&m, Some(own.as_fd()));
        // Reports about earlier connections may come first.
        let answer = loop {
            let got = self
                .rt
                .block_on(async { tokio::time::timeout(WAIT, self.rx.recv()).await });
            let (m, fd) = got
                .expect("an answer")
                .unwrap()
                .expect("an open connection");
            assert!(fd.is_none());
            if matches!(m, Message::Accepted { id: a } | Message::Drop { id: a, .. } if a == id) {
                break m;
            }
            self.backlog.push_back(m);
        };
        (Handed { id, client, own }, answer)
    }

    /// Hand a connection over and expect `Accepted`; the switch then closes
    /// its own copy.
    fn hand_in(&mut self, request: &[u8], route: Routing) -> (u64, Client) {
        let (h, answer) = self.create(request, route);
        assert_eq!(answer, Message::Accepted { id: h.id });
        drop(h.own);
        (h.id, h.client)
    }
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes()
}

/// Read until the node closes the connection.
fn read_all(client: &mut Client) -> Vec<u8> {
    let mut all = Vec::new();
    client.stream.read_to_end(&mut all).unwrap();
    all
}

/// `Served` says whether the response came from the node's memory cache: the first handed-in
/// request for a file reads it from disk, the next one finds it cached.
#[test]
fn served_reports_say_whether_the_cache_had_the_response() {
    let (node, _dir) = node_with_handoff(|r| write(r, "a.txt", b"alpha"), |_| {});
    let mut sw = Switch::connect(&node);
    for want in [false, true] {
        let (id, mut client) = sw.hand_in(&get("/a.txt"), Routing::Own);
        assert_eq!(client.response(false).body, b"alpha");
        let (m, _) = sw.recv();
        let Message::Served {
            id: sid,
            status: 200,
            from_cache,
            ..
        } = m
        else {
            panic!("expected Served, got {m:?}");
        };
        assert_eq!((sid, from_cache), (id, want));
        drop(client);
        assert!(matches!(sw.recv().0, Message::Closed { id: cid, .. } if cid == id));
    }
}

#[test]
fn handed_in_connection_is_served_directly_and_reported() {
    let (node, _dir) = node_with_handoff(
        |r| {
            write(r, "a.txt", b"alpha");
            write(r, "b.txt", b"beta");
        },
        |_| {},
    );
    let mut sw = Switch::connect(&node);
    let (id, mut client) = sw.hand_in(&get("/a.txt"), Routing::Own);
    // A keep-alive request, then two pipelined ones, the last closing.
    client.send(&get("/b.txt"));
    client.send(
        b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\nGET /b.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    let all = read_all(&mut client);
    let text = String::from_utf8_lossy(&all);
    let starts: Vec<usize> = text.match_indices("HTTP/1.1 200").map(|(i, _)| i).collect();
    assert_eq!(starts.len(), 4, "{text}");
    let bodies: Vec<&str> = ["alpha", "beta", "alpha", "beta"].to_vec();
    let mut at = 0;
    for b in bodies {
        at += text[at..].find(b).expect("responses in order") + b.len();
    }
    // Only the first request was the switch's: one Served, then Closed.
    let (served, _) = sw.recv();
    assert_eq!(
        served,
        Message::Served {
            id,
            status: 200,
            bytes: starts[1] as u64,
            from_cache: false,
        }
    );
    let (closed, _) = sw.recv();
    assert_eq!(
        closed,
        Message::Closed {
            id,
            requests: 4,
            bytes: all.len() as u64
        }
    );
    assert!(sw.try_recv(Duration::from_millis(100)).is_none());
    assert_eq!(
        node.metric("switchyard_node_handoff_connections_total{transfer=\"fd\"}"),
        1.0
    );
    assert_eq!(node.metric("switchyard_node_connections_total"), 1.0);
    assert_eq!(node.metric("switchyard_node_connections_active"), 0.0);
    assert_eq!(
        node.metric("switchyard_node_handoff_control_connections"),
        1.0
    );
}

#[test]
fn several_control_connections_at_once() {
    let (node, _dir) = node_with_handoff(|r| write(r, "a.txt", b"alpha"), |_| {});
    let mut sws = [Switch::connect(&node), Switch::connect(&node)];
    let mut clients = Vec::new();
    for i in 0..4 {
        let (id, client) = sws[i % 2].hand_in(&get("/a.txt"), Routing::Own);
        clients.push((id, client));
    }
    for (_, c) in &mut clients {
        let r = c.response(false);
        assert_eq!((r.status, r.body.as_slice()), (200, &b"alpha"[..]));
    }
    for sw in sws.iter_mut() {
        for _ in 0..2 {
            assert!(matches!(sw.recv().0, Message::Served { status: 200, .. }));
        }
    }
    assert_eq!(node.metric("switchyard_node_connections_active"), 4.0);
}

#[test]
fn route_serve_forward_and_hand_back() {
    let (peer, _) = node_with_handoff(|r| write(r, "only-b.txt", b"from the peer"), |_| {});
    let (node, _dir) = node_with_handoff(|r| write(r, "a.txt", b"alpha"), |c| c.workers = 1);
    let mut sw = Switch::connect(&node);
    let (id, mut client) = sw.hand_in(&get("/a.txt"), Routing::Ask);
    let r = client.response(false);
    assert_eq!(r.body, b"alpha");
    assert!(matches!(sw.recv().0, Message::Served { status: 200, .. }));

    let route = |sw: &mut Switch, client: &mut Client, path: &str, seq: u64, action| {
        client.send(&get(path));
        let (m, _) = sw.recv();
        assert_eq!(
            m,
            Message::Route {
                id,
                seq,
                method: "GET".into(),
                host: Some("t".into()),
                target: path.into(),
            }
        );
        sw.send(&Message::Routed { id, seq, action }, None);
    };

    // Forward: the first node lacks the file, the peer has it; twice, over
    // one pooled node-to-node connection.
    for seq in [2, 3] {
        route(
            &mut sw,
            &mut client,
            "/only-b.txt",
            seq,
            RouteAction::Forward(peer.addr),
        );
        let r = client.response(false);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"from the peer");
        let (m, _) = sw.recv();
        let Message::Served {
            id: sid,
            status: 200,
            bytes,
            ..
        } = m
        else {
            panic!("expected Served, got {m:?}");
        };
        assert_eq!(sid, id);
        assert!(bytes > b"from the peer".len() as u64);
    }
    assert_eq!(peer.metric("switchyard_node_connections_total"), 1.0);
    assert_eq!(node.metric("switchyard_node_forwards_total"), 2.0);

    // Serve locally.
    route(&mut sw, &mut client, "/a.txt", 4, RouteAction::Serve);
    assert_eq!(client.response(false).body, b"alpha");
    assert!(matches!(sw.recv().0, Message::Served { status: 200, .. }));

    // A forward to a dead peer is served locally (404 here: the file is
    // only on the peer), before anything reached the client.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    route(
        &mut sw,
        &mut client,
        "/only-b.txt",
        5,
        RouteAction::Forward(dead),
    );
    assert_eq!(client.response(false).status, 404);
    assert!(matches!(sw.recv().0, Message::Served { status: 404, .. }));
    assert_eq!(node.metric("switchyard_node_forward_failures_total"), 1.0);

    // Hand back: the request stays unread and comes back with the socket.
    let next = get("/a.txt");
    route(&mut sw, &mut client, "/a.txt", 6, RouteAction::HandBack);
    let (m, fd) = sw.recv();
    let Message::HandBack {
        id: hid,
        transfer: Transfer::Fd,
        preread,
        requests,
        bytes: _,
    } = m
    else {
        panic!("expected HandBack, got {m:?}");
    };
    assert_eq!((hid, requests), (id, 5));
    assert_eq!(preread, next);
    let mut back = TcpStream::from(fd.expect("the socket comes back"));
    back.set_nonblocking(false).unwrap();
    back.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nswitch")
        .unwrap();
    let r = client.response(false);
    assert_eq!(r.body, b"switch");
    // The node is done with it: no Closed, and the client can still talk to
    // the switch on the same connection.
    assert!(sw.try_recv(Duration::from_millis(200)).is_none());
    client.send(b"PING");
    let mut b = [0u8; 4];
    back.set_read_timeout(Some(WAIT)).unwrap();
    back.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"PING");
    assert_eq!(node.metric("switchyard_node_handoff_hand_backs_total"), 1.0);
    assert_eq!(
        node.metric("switchyard_node_handoff_route_queries_total"),
        5.0
    );
    assert_eq!(node.metric("switchyard_node_connections_active"), 0.0);
}

#[test]
fn refused_at_the_cap_and_the_switch_still_serves_the_client() {
    // One connection slot. An accept loop waiting for a client holds none, so
    // a handed-in connection takes it; once a client holds it, a handed-in
    // connection finds none.
    let (node, _dir) = node_with_handoff(
        |r| write(r, "a.txt", b"alpha"),
        |c| {
            c.workers = 1;
            c.max_connections = Some(1);
        },
    );
    let mut sw = Switch::connect(&node);
    let (_, mut client) = sw.hand_in(
        b"GET /a.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        Routing::Own,
    );
    assert!(read_all(&mut client).ends_with(b"alpha"));
    assert!(eventually(WAIT, || {
        node.metric("switchyard_node_connections_active") == 0.0
    }));

    let mut holder = node.client();
    holder.send(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n");
    assert!(eventually(WAIT, || {
        node.metric("switchyard_node_connections_active") == 1.0
    }));
    let (mut h, answer) = sw.create(&get("/a.txt"), Routing::Own);
    let Message::Drop { id, reason, .. } = answer else {
        panic!("expected Drop, got {answer:?}");
    };
    assert_eq!((id, reason), (h.id, DropReason::Busy));
    h.own
        .write_all(b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy")
        .unwrap();
    let r = h.client.response(false);
    assert_eq!((r.status, r.body.as_slice()), (503, &b"busy"[..]));
    assert_eq!(
        node.metric("switchyard_node_handoff_refused_total{reason=\"busy\"}"),
        1.0
    );
}

#[test]
fn refused_while_shutting_down_and_socket_file_removed() {
    let (mut node, _dir) = node_with_handoff(|r| write(r, "a.txt", b"alpha"), |_| {});
    let path = node
        .node
        .as_ref()
        .unwrap()
        .handoff_unix()
        .unwrap()
        .to_path_buf();
    assert!(path.exists());
    let mut sw = Switch::connect(&node);
    // A client in the middle of its request keeps the node draining.
    let mut slow = node.client();
    slow.send(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n");
    assert!(eventually(WAIT, || {
        node.metric("switchyard_node_connections_active") == 1.0
    }));
    let running = node.node.take().unwrap();
    let addr = node.addr;
    let done = node.rt.spawn(running.shutdown(WAIT));
    // Shutting down has begun once the listener is gone.
    assert!(eventually(WAIT, || TcpStream::connect(addr).is_err()));

    let (mut h, answer) = sw.create(&get("/a.txt"), Routing::Own);
    let Message::Drop { reason, .. } = answer else {
        panic!("expected Drop, got {answer:?}");
    };
    assert_eq!(reason, DropReason::ShuttingDown);
    // The node did not shut the socket down: the switch answers on it.
    h.own
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nswitch")
        .unwrap();
    assert_eq!(h.client.response(false).body, b"switch");

    slow.send(b"\r\n");
    let r = slow.response(false);
    assert_eq!(r.body, b"alpha");
    assert_eq!(r.header("Connection"), Some("close"));
    node.rt.block_on(done).unwrap();
    assert!(!path.exists(), "socket file removed at shutdown");
    // The control connection is closed too.
    assert!(sw.try_recv(WAIT).is_none());
}

#[test]
fn garbage_on_a_control_connection_closes_only_that_connection() {
    let (node, _dir) = node_with_handoff(|r| write(r, "a.txt", b"alpha"), |_| {});
    let path = node
        .node
        .as_ref()
        .unwrap()
        .handoff_unix()
        .unwrap()
        .to_path_buf();
    let mut good = Switch::connect(&node);
    let mut bad = std::os::unix::net::UnixStream::connect(&path).unwrap();
    bad.set_read_timeout(Some(WAIT)).unwrap();
    bad.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut b = [0u8; 64];
    assert_eq!(bad.read(&mut b).unwrap(), 0, "the node closes it");
    // A Hello followed by a bad frame: also closed after the Hello answer.
    let mut bad2 = std::os::unix::net::UnixStream::connect(&path).unwrap();
    bad2.set_read_timeout(Some(WAIT)).unwrap();
    let mut frames = Message::Hello { name: "x".into() }.to_frame().unwrap();
    frames.extend_from_slice(b"SY\x01\x63\0\0\0\0");
    bad2.write_all(&frames).unwrap();
    let mut got = Vec::new();
    bad2.read_to_end(&mut got).unwrap();
    assert!(matches!(
        Message::decode(&got),
        Ok(Some((Message::Hello { .. }, _)))
    ));
    // The node and its other control connection carry on.
    let (_, mut client) = good.hand_in(&get("/a.txt"), Routing::Own);
    assert_eq!(client.response(false).body, b"alpha");
    let mut direct = node.client();
    assert_eq!(direct.get("/a.txt").status, 200);
    assert_eq!(
        node.metric("switchyard_node_handoff_control_connections"),
        1.0
    );
}

#[test]
fn tcp_control_listener_refuses_what_it_cannot_restore() {
    let (node, _dir) = node_with_handoff(
        |_| {},
        |c| c.handoff_listen = Some("127.0.0.1:0".parse().unwrap()),
    );
    let addr: SocketAddr = node.node.as_ref().unwrap().handoff_addr().unwrap();
    assert_ne!(addr.port(), 0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (r, w) = s.into_split();
        let (mut r, mut w) = (MsgReader::new(r), MsgWriter::new(w));
        w.send(&Message::Hello {
            name: "switch".into(),
        })
        .await
        .unwrap();
        let hello = tokio::time::timeout(WAIT, r.recv()).await.unwrap().unwrap();
        assert!(matches!(hello, Some(Message::Hello { .. })));
        w.send(&Message::Ping { nonce: 7 }).await.unwrap();
        let pong = tokio::time::timeout(WAIT, r.recv()).await.unwrap().unwrap();
        assert_eq!(pong, Some(Message::Pong { nonce: 7 }));
        // A documentation address this host does not hold: whether or not
        // the process may use TCP_REPAIR, the restore cannot succeed.
        w.send(&Message::Create {
            id: 3,
            client: "192.0.2.7:40000".parse().unwrap(),
            local: "192.0.2.1:80".parse().unwrap(),
            transfer: Transfer::Repair(Box::new(RepairState {
                mss: 1400,
                ..Default::default()
            })),
            preread: b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            route: Routing::Own,
        })
        .await
        .unwrap();
        let answer = tokio::time::timeout(WAIT, r.recv()).await.unwrap().unwrap();
        let Some(Message::Drop { id, reason, .. }) = answer else {
            panic!("expected Drop, got {answer:?}");
        };
        assert_eq!(id, 3);
        assert!(
            matches!(reason, DropReason::NoPrivilege | DropReason::RestoreFailed),
            "{reason:?}"
        );
    });
}

/// A one-shot peer: answers one request on each of `n` connections with
/// `answer`, then closes.
fn fake_peer(answer: &'static [u8], n: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for _ in 0..n {
            let Ok((mut s, _)) = l.accept() else { return };
            let mut req = Vec::new();
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut b = [0u8; 1024];
                match s.read(&mut b) {
                    Ok(0) | Err(_) => return,
                    Ok(k) => req.extend_from_slice(&b[..k]),
                }
            }
            let _ = s.write_all(answer);
        }
    });
    addr
}

#[test]
fn forwarding_relays_every_framing_and_falls_back_before_the_first_byte() {
    let big = common::pattern(300_000, 7);
    let big2 = big.clone();
    let (peer, _) = node_with_handoff(move |r| write(r, "big.bin", &big2), |_| {});
    let (node, _dir) = node_with_handoff(|r| write(r, "a.txt", b"alpha"), |c| c.workers = 1);
    let mut sw = Switch::connect(&node);
    let (id, mut client) = sw.hand_in(&get("/a.txt"), Routing::Ask);
    assert_eq!(client.response(false).body, b"alpha");
    assert!(matches!(sw.recv().0, Message::Served { .. }));
    let mut seq = 1;
    let mut ask = |sw: &mut Switch, client: &mut Client, req: &[u8], action| {
        seq += 1;
        client.send(req);
        let (m, _) = sw.recv();
        assert!(
            matches!(m, Message::Route { seq: s, .. } if s == seq),
            "{m:?}"
        );
        sw.send(&Message::Routed { id, seq, action }, None);
    };

    // A large body crosses several flushes.
    ask(
        &mut sw,
        &mut client,
        &get("/big.bin"),
        RouteAction::Forward(peer.addr),
    );
    let r = client.response(false);
    assert_eq!(r.status, 200);
    assert!(r.body == big, "large forwarded body differs");
    // The peer said whether its cache had it (not yet: it read it from disk); the client never
    // sees that answer.
    assert_eq!(r.header("X-Switchyard-Cache"), None);
    let (m, _) = sw.recv();
    assert!(
        matches!(m, Message::Served { status: 200, bytes, from_cache: false, .. } if bytes > 300_000),
        "{m:?}"
    );

    // HEAD: the head only.
    ask(
        &mut sw,
        &mut client,
        b"HEAD /big.bin HTTP/1.1\r\nHost: t\r\n\r\n",
        RouteAction::Forward(peer.addr),
    );
    let r = client.response(true);
    assert_eq!(r.header("Content-Length"), Some("300000"));
    assert_eq!(r.header("X-Switchyard-Cache"), None);
    // Now it came from the peer's cache.
    assert!(matches!(
        sw.recv().0,
        Message::Served {
            status: 200,
            from_cache: true,
            ..
        }
    ));

    // A chunked answer goes through as chunks; hop-by-hop fields do not.
    let chunked = fake_peer(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        1,
    );
    ask(
        &mut sw,
        &mut client,
        &get("/c"),
        RouteAction::Forward(chunked),
    );
    let mut raw = Vec::new();
    while !raw.ends_with(b"0\r\n\r\n") {
        let mut b = [0u8; 1024];
        let n = client.stream.read(&mut b).unwrap();
        assert!(n > 0);
        raw.extend_from_slice(&b[..n]);
    }
    let text = String::from_utf8(raw).unwrap();
    assert!(text.contains("Transfer-Encoding: chunked"), "{text}");
    assert!(!text.contains("Keep-Alive"), "{text}");
    assert!(
        text.ends_with("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
        "{text}"
    );
    assert!(matches!(sw.recv().0, Message::Served { status: 200, .. }));

    // A peer that breaks off mid-body before anything reached the client,
    // and one with an ambiguous head: both served here instead.
    let short = fake_peer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", 1);
    ask(
        &mut sw,
        &mut client,
        &get("/a.txt"),
        RouteAction::Forward(short),
    );
    assert_eq!(client.response(false).body, b"alpha");
    assert!(matches!(sw.recv().0, Message::Served { status: 200, .. }));
    let bad = fake_peer(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc",
        1,
    );
    ask(
        &mut sw,
        &mut client,
        &get("/a.txt"),
        RouteAction::Forward(bad),
    );
    assert_eq!(client.response(false).body, b"alpha");
    assert!(matches!(sw.recv().0, Message::Served { status: 200, .. }));
    assert_eq!(node.metric("switchyard_node_forward_failures_total"), 2.0);
    assert_eq!(node.metric("switchyard_node_forwards_total"), 3.0);

    // An HTTP/1.0 client keeps its version and keep-alive; a body that runs
    // until the peer closes ends the client connection too.
    let until_close = fake_peer(b"HTTP/1.1 200 OK\r\n\r\nuntil close", 1);
    ask(
        &mut sw,
        &mut client,
        b"GET /u HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        RouteAction::Forward(until_close),
    );
    let all = read_all(&mut client);
    let text = String::from_utf8(all).unwrap();
    assert!(text.contains("Connection: close"), "{text}");
    assert!(text.ends_with("\r\n\r\nuntil close"), "{text}");
    assert!(matches!(sw.recv().0, Message::Served { status: 200, .. }));
    assert!(matches!(sw.recv().0, Message::Closed { requests: 7, .. }));
}

#[test]
fn unanswered_or_orphaned_route_queries_are_served_locally() {
    let (node, _dir) = node_with_handoff(|r| write(r, "a.txt", b"alpha"), |_| {});
    let mut sw = Switch::connect(&node);
    let (id, mut client) = sw.hand_in(&get("/a.txt"), Routing::Ask);
    assert_eq!(client.response(false).body, b"alpha");
    assert!(matches!(sw.recv().0, Message::Served { .. }));
    // No answer: served after the route timeout, with no Served report.
    let t = std::time::Instant::now();
    client.send(&get("/a.txt"));
    assert!(matches!(sw.recv().0, Message::Route { seq: 2, .. }));
    assert_eq!(client.response(false).body, b"alpha");
    assert!(t.elapsed() >= Duration::from_millis(1900));
    // A late answer is ignored.
    sw.send(
        &Message::Routed {
            id,
            seq: 2,
            action: RouteAction::HandBack,
        },
        None,
    );
    assert!(sw.try_recv(Duration::from_millis(100)).is_none());
    assert_eq!(
        node.metric("switchyard_node_handoff_route_timeouts_total"),
        1.0
    );
    // The switch goes away: later requests are served at once.
    drop(sw);
    assert!(eventually(WAIT, || {
        node.metric("switchyard_node_handoff_control_connections") == 0.0
    }));
    let t = std::time::Instant::now();
    assert_eq!(client.get("/a.txt").body, b"alpha");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(
        node.metric("switchyard_node_handoff_route_timeouts_total"),
        2.0
    );
}
