//! Cooperative mode with `mechanism = "fetch"` (seed 000's cooperative caching, "CF") over real
//! sockets: three nodes on one host; `n0` fetches each response whose owner is a peer from that
//! peer's HTTP listener, holds it whole, and sends it on its own connection; `n1` and `n2` clone
//! (the default). Every node's root holds the same names with its own name in the bodies, so a
//! response says whose it is.

mod common;

use std::io::Read;
use std::time::Duration;

use common::{eventually, pattern, served_by, write, TestNode};
use switchyard_handoff::link::ControlAddr;
use switchyard_node::{ClusterConfig, ClusterMechanism, Member};

const WAIT: Duration = Duration::from_secs(10);
const TARGETS: usize = 30;
/// Held whole (below `HOLD_MAX`).
const MEDIUM: usize = 512 << 10;
/// Relayed as it arrives (above `HOLD_MAX`).
const BIG: usize = 3 << 20;
const HOLD_MAX: u64 = 1 << 20;

/// Node `i`'s content: `/tN.txt` says `nI:tN`; `/medium.bin` and `/big-2.bin` are patterns
/// seeded by `i`.
fn fill(i: usize) -> impl FnOnce(&std::path::Path) {
    move |root| {
        for t in 0..TARGETS {
            write(root, &format!("t{t}.txt"), format!("n{i}:t{t}").as_bytes());
        }
        write(root, "medium.bin", &pattern(MEDIUM, i as u8 + 1));
        write(root, "big-2.bin", &pattern(BIG, i as u8 + 1));
    }
}

struct Cluster {
    nodes: Vec<TestNode>,
    _sockets: tempfile::TempDir,
}

fn members(sockets: &std::path::Path) -> Vec<Member> {
    (0..3)
        .map(|i| Member {
            name: format!("n{i}"),
            control: ControlAddr::Unix(sockets.join(format!("n{i}.sock"))),
        })
        .collect()
}

impl Cluster {
    /// `n1` and `n2` clone; `n0`, started last (when their HTTP listeners are known), fetches.
    /// `n1_http` overrides where `n0` fetches `n1`'s responses.
    fn start(n1_http: Option<std::net::SocketAddr>) -> Cluster {
        let sockets = tempfile::tempdir().unwrap();
        let members = members(sockets.path());
        let cluster = |i: usize| {
            let mut c = ClusterConfig::new(format!("n{i}"), members.clone());
            // Requests are counted as fetches, none turns into a local copy.
            c.replication.enabled = false;
            c
        };
        let peers: Vec<TestNode> = (1..3)
            .map(|i| {
                TestNode::start(fill(i), |c| {
                    c.workers = 2;
                    c.cluster = Some(cluster(i));
                })
            })
            .collect();
        let n0 = TestNode::start(fill(0), |c| {
            c.workers = 2;
            let mut cl = cluster(0);
            cl.mechanism = ClusterMechanism::Fetch;
            cl.fetch_hold_max_bytes = HOLD_MAX;
            cl.http
                .insert("n1".into(), n1_http.unwrap_or(peers[0].addr));
            cl.http.insert("n2".into(), peers[1].addr);
            c.cluster = Some(cl);
        });
        let mut nodes = vec![n0];
        nodes.extend(peers);
        for t in &nodes {
            let up = t.rt.block_on(t.node.as_ref().unwrap().wait_for_peers(WAIT));
            assert!(up, "every peer's control connection comes up");
        }
        Cluster {
            nodes,
            _sockets: sockets,
        }
    }

    /// The sum of every series of a (labelled) counter on node `i`.
    fn total(&self, i: usize, family: &str) -> f64 {
        self.nodes[i].total(family)
    }
}

/// The owner of every target as a cloning entry node (`n1`) routes it.
fn owners(c: &Cluster) -> Vec<String> {
    let mut client = c.nodes[1].client();
    (0..TARGETS)
        .map(|t| {
            let r = client.get(&format!("/t{t}.txt"));
            assert_eq!(r.status, 200);
            served_by(&r.body, t)
        })
        .collect()
}

/// The node index of member `name`.
fn index(name: &str) -> usize {
    name[1..].parse().unwrap()
}

#[test]
fn fetched_responses_are_the_owners_sent_by_the_entry_node() {
    let c = Cluster::start(None);
    let map = owners(&c);
    let foreign: Vec<usize> = (0..TARGETS).filter(|&t| map[t] != "n0").collect();
    assert!(
        !foreign.is_empty() && foreign.len() < TARGETS,
        "n0 owns some targets and not all: {map:?}"
    );
    let relayed_before: f64 = (1..3)
        .map(|i| c.total(i, "switchyard_node_cluster_relayed_in_requests_total"))
        .sum();
    // (The owners learnt above came through n1's clones.)
    let clones_in = |c: &Cluster| -> f64 {
        (0..3)
            .map(|i| c.total(i, "switchyard_node_clones_in_total"))
            .sum()
    };
    let clones_before = clones_in(&c);
    // One keep-alive connection to n0: every response is the owner's, and the connection
    // stays with n0 throughout (nothing is cloned).
    let mut client = c.nodes[0].client();
    for (t, owner) in map.iter().enumerate() {
        let r = client.get(&format!("/t{t}.txt"));
        assert_eq!(r.status, 200);
        assert_eq!(&served_by(&r.body, t), owner, "t{t}");
        // The same entity as the owner's own answer: validators and type included.
        let direct = c.nodes[index(owner)].client().get(&format!("/t{t}.txt"));
        for h in ["etag", "last-modified", "content-type", "content-length"] {
            assert_eq!(r.header(h), direct.header(h), "t{t}: {h}");
        }
        assert_eq!(
            r.header("x-switchyard-cache"),
            None,
            "no internal field leaks"
        );
    }
    let n = foreign.len() as f64;
    assert_eq!(c.total(0, "switchyard_node_cluster_fetches_total"), n);
    assert_eq!(c.total(0, "switchyard_node_cluster_fetches_held_total"), n);
    assert_eq!(
        c.total(0, "switchyard_node_cluster_fetch_failures_total"),
        0.0
    );
    assert_eq!(c.total(0, "switchyard_node_clones_out_total"), 0.0);
    // The owners served the fetches as requests forwarded to them, and moved none of them on.
    let relayed: f64 = (1..3)
        .map(|i| c.total(i, "switchyard_node_cluster_relayed_in_requests_total"))
        .sum();
    assert_eq!(relayed - relayed_before, n);
    assert_eq!(clones_in(&c), clones_before, "no connection moved");
    // Each fetch is counted by the peer it came from.
    let m = c.nodes[0].metrics();
    for p in ["n1", "n2"] {
        let want = map.iter().filter(|o| *o == p).count();
        let line = format!("switchyard_node_cluster_fetches_total{{peer=\"{p}\"}} {want}");
        assert!(m.lines().any(|l| l == line), "{line} in\n{m}");
    }
}

#[test]
fn large_bodies_are_byte_identical_held_or_relayed() {
    let c = Cluster::start(None);
    let owner_of = |path: &str, len: usize| {
        let r = c.nodes[1].client().get(path);
        assert_eq!(r.body.len(), len);
        (0..3)
            .find(|&i| r.body == pattern(len, i as u8 + 1))
            .expect("the body of one node")
    };
    let medium = owner_of("/medium.bin", MEDIUM);
    let big = owner_of("/big-2.bin", BIG);
    // (Names a peer owns in the default owner map, so that both are fetched.)
    assert!(
        medium != 0 && big != 0,
        "owners n{medium} and n{big}: rename the files"
    );
    let mut client = c.nodes[0].client();
    let (fetched, held) = (
        c.total(0, "switchyard_node_cluster_fetches_total"),
        c.total(0, "switchyard_node_cluster_fetches_held_total"),
    );
    let r = client.get("/medium.bin");
    assert_eq!(r.status, 200);
    assert!(
        r.body == pattern(MEDIUM, medium as u8 + 1),
        "the owner's bytes"
    );
    let r = client.get("/big-2.bin");
    assert_eq!(r.status, 200);
    assert!(r.body == pattern(BIG, big as u8 + 1), "the owner's bytes");
    assert_eq!(
        c.total(0, "switchyard_node_cluster_fetches_total") - fetched,
        2.0
    );
    // Only the medium body (below fetch_hold_max_bytes) is held before it is sent.
    let held_now = c.total(0, "switchyard_node_cluster_fetches_held_total") - held;
    assert_eq!(held_now, 1.0);

    // HTTP/1.0 without keep-alive: the whole body, then the close.
    {
        let mut s = std::net::TcpStream::connect(c.nodes[0].addr).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        std::io::Write::write_all(&mut s, b"GET /medium.bin HTTP/1.0\r\n\r\n").unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        let split = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&all[..split]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.0 200") || head.starts_with("http/1.1 200"));
        assert!(
            head.contains(&format!("content-length: {MEDIUM}")),
            "{head}"
        );
        assert!(all[split..] == pattern(MEDIUM, medium as u8 + 1)[..]);
    }
}

#[test]
fn an_unreachable_owner_is_served_here_and_counted() {
    // n1's HTTP listener is a port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = closed.local_addr().unwrap();
    drop(closed);
    let c = Cluster::start(Some(nowhere));
    let map = owners(&c);
    let t = map
        .iter()
        .position(|o| o == "n1")
        .expect("n1 owns some target");
    let mut client = c.nodes[0].client();
    let r = client.get(&format!("/t{t}.txt"));
    assert_eq!(r.status, 200, "the request is not lost");
    assert_eq!(
        served_by(&r.body, t),
        "n0",
        "served from the entry node's own root"
    );
    assert!(eventually(WAIT, || c
        .total(0, "switchyard_node_cluster_fetch_failures_total")
        == 1.0));
    assert_eq!(c.total(0, "switchyard_node_cluster_fetches_total"), 0.0);
    // The connection goes on: n2's targets are still fetched from n2.
    if let Some(t2) = map.iter().position(|o| o == "n2") {
        let r = client.get(&format!("/t{t2}.txt"));
        assert_eq!(served_by(&r.body, t2), "n2");
    }
}

#[test]
fn a_fetch_cluster_without_peer_listeners_is_refused() {
    let sockets = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let mut cluster = ClusterConfig::new("n0", members(sockets.path()));
    cluster.mechanism = ClusterMechanism::Fetch;
    cluster
        .http
        .insert("n1".into(), "127.0.0.1:1".parse().unwrap());
    let cfg = switchyard_node::NodeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: root.path().to_path_buf(),
        cluster: Some(cluster),
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt
        .block_on(switchyard_node::start(cfg))
        .err()
        .expect("refused");
    let e = e.to_string();
    assert!(e.contains("`n2` has none"), "{e}");
    // Nothing was bound or left behind: the control socket was never created.
    assert!(!sockets.path().join("n0.sock").exists());
}
