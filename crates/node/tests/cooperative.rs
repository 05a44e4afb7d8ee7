//! Cooperative mode over real sockets: three nodes on one host, no front end. Each node's
//! document root holds the same file names with its own name in the bodies, so every response
//! says which node served it.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::time::Duration;

use common::{eventually, pattern, served_by, write, Client, TestNode};
use switchyard_handoff::link::ControlAddr;
use switchyard_node::{ClusterConfig, Member};

const WAIT: Duration = Duration::from_secs(10);
const TARGETS: usize = 30;
const BIG: usize = 5 << 20;

/// Node `i`'s content: `/tN.txt` says `nI:tN`, `/big.bin` is 5 MB of a pattern seeded by `i`.
fn fill(i: usize) -> impl FnOnce(&std::path::Path) {
    move |root| {
        for t in 0..TARGETS {
            write(root, &format!("t{t}.txt"), format!("n{i}:t{t}").as_bytes());
        }
        write(root, "big.bin", &pattern(BIG, i as u8 + 1));
    }
}

struct Cluster {
    nodes: Vec<Option<TestNode>>,
    _sockets: tempfile::TempDir,
}

impl Cluster {
    fn start(n: usize) -> Cluster {
        let sockets = tempfile::tempdir().unwrap();
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("n{i}"),
                control: ControlAddr::Unix(sockets.path().join(format!("n{i}.sock"))),
            })
            .collect();
        let nodes: Vec<Option<TestNode>> = (0..n)
            .map(|i| {
                Some(TestNode::start(fill(i), |c| {
                    c.workers = 2;
                    // These tests count clones: no target turns into a local copy
                    // (tests/replication.rs covers copies).
                    let mut cluster = ClusterConfig::new(format!("n{i}"), members.clone());
                    cluster.replication.enabled = false;
                    c.cluster = Some(cluster);
                }))
            })
            .collect();
        for t in nodes.iter().flatten() {
            let up = t.rt.block_on(t.node.as_ref().unwrap().wait_for_peers(WAIT));
            assert!(up, "every peer's control connection comes up");
        }
        Cluster {
            nodes,
            _sockets: sockets,
        }
    }

    fn node(&self, i: usize) -> &TestNode {
        self.nodes[i].as_ref().expect("a running node")
    }

    fn client(&self, i: usize) -> Client {
        self.node(i).client()
    }

    /// The sum of every series of a labelled counter on node `i`.
    fn total(&self, i: usize, family: &str) -> f64 {
        self.node(i).total(family)
    }
}

/// Serves every target once through each node's one keep-alive connection; returns the owner
/// of each target, checking that all entry nodes agree.
fn owners(c: &Cluster, entries: &[usize]) -> Vec<String> {
    let mut map: Vec<Option<String>> = vec![None; TARGETS];
    for &e in entries {
        let mut client = c.client(e);
        for (t, owner) in map.iter_mut().enumerate() {
            let r = client.get(&format!("/t{t}.txt"));
            assert_eq!(r.status, 200);
            let who = served_by(&r.body, t);
            match owner {
                Some(o) => assert_eq!(*o, who, "t{t}: entry n{e} disagrees on the owner"),
                None => *owner = Some(who),
            }
        }
    }
    map.into_iter().map(Option::unwrap).collect()
}

#[test]
fn requests_on_one_connection_are_each_served_by_their_owner() {
    let c = Cluster::start(3);
    let map = owners(&c, &[0, 1, 2]);
    let distinct: std::collections::HashSet<&String> = map.iter().collect();
    assert_eq!(
        distinct.len(),
        3,
        "every node owns some of 30 targets: {map:?}"
    );
    // Every node cloned the requests it does not own, and took each connection back.
    // (The last clone of a connection is counted by its entry node a moment after its
    // response reached the client: wait for the counts to settle.)
    for i in 0..3 {
        let foreign = map.iter().filter(|o| **o != format!("n{i}")).count() as f64;
        assert!(
            eventually(WAIT, || {
                c.total(i, "switchyard_node_clones_out_total") == foreign
                    && c.total(i, "switchyard_node_clone_hand_backs_total") == foreign
            }),
            "n{i}: {foreign} clones out and back"
        );
        assert_eq!(c.total(i, "switchyard_node_clone_fallbacks_total"), 0.0);
    }
    let clones_in: f64 = (0..3)
        .map(|i| c.total(i, "switchyard_node_clones_in_total"))
        .sum();
    let clones_out: f64 = (0..3)
        .map(|i| c.total(i, "switchyard_node_clones_out_total"))
        .sum();
    assert_eq!(clones_in, clones_out);
}

#[test]
fn pipelined_requests_are_answered_in_order_by_their_owners() {
    let c = Cluster::start(3);
    let map = owners(&c, &[0]);
    let mut client = c.client(1);
    for batch in (0..TARGETS).collect::<Vec<_>>().chunks(8) {
        let mut req = Vec::new();
        for t in batch {
            req.extend_from_slice(
                format!("GET /t{t}.txt HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes(),
            );
        }
        client.send(&req);
        for &t in batch {
            let r = client.response(false);
            assert_eq!(r.status, 200);
            assert_eq!(served_by(&r.body, t), map[t], "t{t} in a pipelined batch");
        }
    }
}

#[test]
fn a_large_body_and_http_1_0_go_through_a_clone() {
    let c = Cluster::start(3);
    // The owner of /big.bin, then an entry node that is not its owner.
    let mut probe = c.client(0);
    let r = probe.get("/big.bin");
    assert_eq!(r.body.len(), BIG);
    let owner = (0..3)
        .find(|&i| r.body == pattern(BIG, i as u8 + 1))
        .expect("the body of one node");
    let entry = (owner + 1) % 3;
    let mut client = c.client(entry);
    for _ in 0..2 {
        let r = client.get("/big.bin");
        assert_eq!(r.status, 200);
        assert!(
            r.body == pattern(BIG, owner as u8 + 1),
            "5 MB from the owner n{owner}"
        );
        // The connection came back: a small request after it is routed again.
        let r = client.get("/t0.txt");
        assert_eq!(r.status, 200);
    }

    // HTTP/1.0 without keep-alive: the owner answers and closes.
    let map = owners(&c, &[entry]);
    let t = (0..TARGETS)
        .find(|&t| map[t] != format!("n{entry}"))
        .unwrap();
    // The entry node's own view of in-flight requests (bounded loads) must be back to zero,
    // or the owner it picks may be another: the last clone of the probe finishes at the entry
    // node only after the client has its response.
    let quiet = || c.total(entry, "switchyard_node_clones_outstanding") == 0.0;
    assert!(eventually(WAIT, quiet));
    let mut s = std::net::TcpStream::connect(c.node(entry).addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    std::io::Write::write_all(&mut s, format!("GET /t{t}.txt HTTP/1.0\r\n\r\n").as_bytes())
        .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(
        text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
        "{text}"
    );
    assert!(text.ends_with(&format!("{}:t{t}", map[t])), "{text}");
    // The clone ended at its owner; the entry node hears of it (and counts the owner's
    // request finished) after the client has seen the end.
    assert!(eventually(WAIT, || c
        .total(entry, "switchyard_node_clones_closed_total")
        >= 1.0));
    // HTTP/1.0 keep-alive: two requests, both owners'.
    assert!(eventually(WAIT, quiet));
    let mut client = c.client(entry);
    for _ in 0..2 {
        client.send(format!("GET /t{t}.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").as_bytes());
        let r = client.response(false);
        assert_eq!(served_by(&r.body, t), map[t]);
    }
    assert_eq!(c.total(entry, "switchyard_node_clones_lost_total"), 0.0);
}

#[test]
fn a_peer_that_stops_loses_only_its_targets_and_no_other_connection() {
    let mut c = Cluster::start(3);
    let map = owners(&c, &[0]);
    let mut keep = c.client(0);
    assert_eq!(keep.get("/t0.txt").status, 200);
    // n2 goes away.
    drop(c.nodes[2].take());
    assert!(eventually(WAIT, || {
        c.total(0, "switchyard_node_cluster_peers_up") == 1.0
            && c.total(1, "switchyard_node_cluster_peers_up") == 1.0
    }));
    // The open connection on n0 goes on; every target is served, n2's by someone else, the
    // others by their old owners.
    let mut moved: HashMap<usize, String> = HashMap::new();
    let mut other = c.client(1);
    for client in [&mut keep, &mut other] {
        for (t, old) in map.iter().enumerate() {
            let r = client.get(&format!("/t{t}.txt"));
            assert_eq!(r.status, 200);
            let who = served_by(&r.body, t);
            if old == "n2" {
                assert_ne!(who, "n2");
                if let Some(m) = moved.insert(t, who.clone()) {
                    assert_eq!(m, who, "t{t}: n0 and n1 agree on its new owner");
                }
            } else {
                assert_eq!(&who, old, "t{t} moved though its owner stayed");
            }
        }
    }
    assert!(!moved.is_empty(), "n2 owned some targets");
}

#[test]
fn thousands_of_cloned_requests_without_an_error() {
    let c = Cluster::start(3);
    let map = owners(&c, &[0]);
    let addrs: Vec<_> = (0..3).map(|i| c.node(i).addr).collect();
    let per_thread = 2_500;
    let threads: Vec<_> = (0..4)
        .map(|k| {
            let addr = addrs[k % 3];
            let map = map.clone();
            std::thread::spawn(move || {
                let mut client = Client::connect(addr);
                for n in 0..per_thread {
                    let t = (n * 7 + k) % TARGETS;
                    let r = client.try_get(&format!("/t{t}.txt")).expect("an answer");
                    assert_eq!(r.status, 200);
                    // Concurrent requests may spill over from a busy owner (bounded loads):
                    // the body must be the target's, from some member.
                    let who = served_by(&r.body, t);
                    assert!(map.contains(&who), "{who}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let clones: f64 = (0..3)
        .map(|i| c.total(i, "switchyard_node_clones_out_total"))
        .sum();
    assert!(clones > 5_000.0, "most requests were cloned: {clones}");
    for i in 0..3 {
        assert_eq!(c.total(i, "switchyard_node_clones_lost_total"), 0.0);
        assert_eq!(c.total(i, "switchyard_node_clone_fallbacks_total"), 0.0);
    }
}

/// What a scripted peer does with the first `Create` it gets.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Script {
    /// Answer nothing until the `Cancel`, then `Accepted`, and serve the connection itself.
    AcceptLate,
    /// Answer the `Cancel` with `Drop`.
    DropOnCancel,
    /// Never answer.
    Silent,
}

const FAKE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nFAKE";

/// A peer `n1` that follows `script` on its control socket at `path`; it reports each frame
/// it reads on `seen` and closes everything once `done` fires.
fn scripted_peer(
    path: std::path::PathBuf,
    script: Script,
    seen: std::sync::mpsc::Sender<&'static str>,
    done: tokio::sync::oneshot::Receiver<()>,
) -> std::thread::JoinHandle<()> {
    use switchyard_handoff::fdpass::FdConn;
    use switchyard_handoff::proto::{DropReason, Message};
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::UnixListener::from_std(listener).unwrap();
            let (s, _) = listener.accept().await.unwrap();
            let (mut rx, mut tx) = FdConn::new(s).split();
            let mut held = None;
            let script_run = async {
                loop {
                    let Ok(Some((m, fd))) = rx.recv().await else {
                        return;
                    };
                    match m {
                        Message::Hello { .. } => {
                            let hello = Message::Hello { name: "n1".into() };
                            tx.send(&hello, None).await.unwrap();
                        }
                        Message::Create { id, .. } => {
                            seen.send("create").unwrap();
                            held = fd.map(|f| (id, f));
                        }
                        Message::Cancel { id } => {
                            seen.send("cancel").unwrap();
                            match script {
                                Script::AcceptLate => {
                                    tx.send(&Message::Accepted { id }, None).await.unwrap();
                                    let (_, fd) = held.take().unwrap();
                                    let mut s = std::net::TcpStream::from(fd);
                                    std::io::Write::write_all(&mut s, FAKE).unwrap();
                                    let closed = Message::Closed {
                                        id,
                                        requests: 1,
                                        bytes: FAKE.len() as u64,
                                    };
                                    tx.send(&closed, None).await.unwrap();
                                    s.shutdown(std::net::Shutdown::Both).unwrap();
                                }
                                Script::DropOnCancel => {
                                    let d = Message::Drop {
                                        id,
                                        reason: DropReason::Cancelled,
                                        detail: String::new(),
                                    };
                                    tx.send(&d, None).await.unwrap();
                                    held = None;
                                }
                                Script::Silent => {}
                            }
                        }
                        _ => {}
                    }
                }
            };
            tokio::select! {
                _ = script_run => {}
                _ = done => {}
            }
        });
    })
}

/// A clone whose answer comes late, or as a `Drop`, or never: the client gets exactly one
/// answer (or none), never one from each node.
#[test]
fn a_clone_answered_late_is_never_served_twice() {
    for script in [Script::AcceptLate, Script::DropOnCancel, Script::Silent] {
        let sockets = tempfile::tempdir().unwrap();
        let members = vec![
            Member {
                name: "n0".into(),
                control: ControlAddr::Unix(sockets.path().join("n0.sock")),
            },
            Member {
                name: "n1".into(),
                control: ControlAddr::Unix(sockets.path().join("n1.sock")),
            },
        ];
        let (seen_tx, seen) = std::sync::mpsc::channel();
        let (done, done_rx) = tokio::sync::oneshot::channel();
        let peer = scripted_peer(sockets.path().join("n1.sock"), script, seen_tx, done_rx);
        let mut stop_peer = Some(move || {
            let _ = done.send(());
            peer.join().unwrap();
        });
        let node = TestNode::start(fill(0), |c| {
            c.workers = 1;
            let mut cl = ClusterConfig::new("n0", members.clone());
            cl.clone_timeout_ms = 100;
            c.cluster = Some(cl);
        });
        assert!(node
            .rt
            .block_on(node.node.as_ref().unwrap().wait_for_peers(WAIT)));
        // Requests until one belongs to n1: its Create reaches the scripted peer.
        let mut t = 0;
        let mut client = loop {
            // Either the node serves it (it counts the request as its own) or it clones it.
            let owned = |n: &TestNode| n.metric("switchyard_node_cluster_owned_requests_total");
            let before = owned(&node);
            let mut client = node.client();
            client.send(
                format!("GET /t{t}.txt HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            );
            let mut cloned = false;
            assert!(eventually(WAIT, || {
                cloned = seen.try_recv() == Ok("create");
                cloned || owned(&node) > before
            }));
            if cloned {
                break client;
            }
            // Served here (owned by n0): its own answer.
            let r = client.response(false);
            assert_eq!(served_by(&r.body, t), "n0");
            t += 1;
            assert!(t < TARGETS, "n1 owns none of the targets");
        };
        assert_eq!(
            seen.recv_timeout(WAIT),
            Ok("cancel"),
            "{script:?}: the node cancels"
        );
        let mut all = Vec::new();
        client.stream.set_read_timeout(Some(WAIT)).unwrap();
        if script == Script::Silent {
            // Abandoned: the node closed its copy without a word; the peer still holds one.
            assert!(eventually(WAIT, || node
                .metric("switchyard_node_clones_lost_total{peer=\"n1\"}")
                == 1.0));
            stop_peer.take().unwrap()();
        }
        client.stream.read_to_end(&mut all).unwrap();
        match script {
            Script::AcceptLate => assert_eq!(all, FAKE, "only the peer answers"),
            Script::DropOnCancel => {
                let text = String::from_utf8_lossy(&all);
                assert!(text.starts_with("HTTP/1.1 200"), "{text}");
                assert!(
                    text.ends_with(&format!("n0:t{t}")),
                    "only this node answers: {text}"
                );
                assert_eq!(
                    node.metric("switchyard_node_clone_fallbacks_total{reason=\"refused\"}"),
                    1.0
                );
            }
            Script::Silent => assert!(all.is_empty(), "nobody answers: {all:?}"),
        }
        if let Some(stop) = stop_peer.take() {
            stop();
        }
    }
}

/// A membership reload (SIGHUP): a member joins and only the targets that now hash to it move
/// there; it leaves again and every target goes back to where it was. Connections accepted
/// after the reload follow the new map.
#[test]
fn a_reload_adds_and_removes_members_and_only_their_targets_move() {
    let sockets = tempfile::tempdir().unwrap();
    let dir = sockets.path().to_path_buf();
    let member = |i: usize| Member {
        name: format!("n{i}"),
        control: ControlAddr::Unix(dir.join(format!("n{i}.sock"))),
    };
    let cluster = |name: usize, n: usize| {
        let mut c = ClusterConfig::new(format!("n{name}"), (0..n).map(member).collect());
        c.replication.enabled = false;
        c
    };
    // n0 and n1 know only each other; n2 knows all three.
    let nodes: Vec<Option<TestNode>> = (0..3)
        .map(|i| {
            let members = if i == 2 { 3 } else { 2 };
            Some(TestNode::start(fill(i), |c| {
                c.workers = 2;
                c.cluster = Some(cluster(i, members));
            }))
        })
        .collect();
    let c = Cluster {
        nodes,
        _sockets: sockets,
    };
    for i in 0..3 {
        let t = c.node(i);
        assert!(t.rt.block_on(t.node.as_ref().unwrap().wait_for_peers(WAIT)));
    }
    let two = owners(&c, &[0, 1]);
    assert!(!two.contains(&"n2".to_owned()), "{two:?}");

    let reload = |i: usize, members: usize| {
        let t = c.node(i);
        let node = t.node.as_ref().unwrap();
        t.rt.block_on(async { node.reload_cluster(&cluster(i, members)) })
            .unwrap();
        assert!(
            t.rt.block_on(node.wait_for_peers(WAIT)),
            "n{i}'s peers come up"
        );
    };
    reload(0, 3);
    reload(1, 3);
    let three = owners(&c, &[0, 1, 2]);
    let moved: Vec<usize> = (0..TARGETS).filter(|&t| two[t] != three[t]).collect();
    for &t in &moved {
        assert_eq!(three[t], "n2", "t{t} moved between the members that stayed");
    }
    assert!(
        (1..=20).contains(&moved.len()),
        "about a third of the targets move to the new member: {moved:?}"
    );

    // n2 leaves: every target goes back.
    reload(0, 2);
    reload(1, 2);
    assert_eq!(owners(&c, &[0, 1]), two);
    // A reload cannot rename the node.
    let t = c.node(0);
    let e =
        t.rt.block_on(async { t.node.as_ref().unwrap().reload_cluster(&cluster(5, 2)) });
    assert!(e.is_err());
}

/// A member that drains while it serves a clone finishes that response and hands the
/// connection back: the client reads the whole body and its next request on the same
/// connection is answered by the node it connected to.
#[test]
fn a_draining_owner_finishes_its_clone_and_hands_the_connection_back() {
    let mut c = Cluster::start(2);
    // Who owns the big file, and which node the client uses: the other one.
    let owner = {
        let r = c.client(0).get("/big.bin");
        assert_eq!(r.status, 200);
        if r.body == pattern(BIG, 1) {
            0
        } else {
            1
        }
    };
    let entry = 1 - owner;
    let clones_before = c.total(owner, "switchyard_node_clones_in_total");
    let mut client = c.client(entry);
    // The request goes to the owner; the client reads nothing yet, so the owner is still
    // sending when it is told to stop.
    client.send(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(eventually(WAIT, || c
        .total(owner, "switchyard_node_clones_in_total")
        > clones_before));
    let draining = c.nodes[owner].take().unwrap();
    let stopped = std::thread::spawn(move || drop(draining));
    let r = client.response(false);
    assert_eq!(r.status, 200);
    assert!(
        r.body == pattern(BIG, owner as u8 + 1),
        "the whole body, from its owner"
    );
    // The connection came back to its entry node, which answers the next request itself.
    let r = client.get("/t0.txt");
    assert_eq!(r.status, 200);
    assert_eq!(served_by(&r.body, 0), format!("n{entry}"));
    stopped.join().unwrap();
    assert_eq!(c.total(entry, "switchyard_node_clones_lost_total"), 0.0);
}
