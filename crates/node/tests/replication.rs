//! Hot-object replication over real sockets: two cooperative nodes on one host. Each node's
//! document root holds the same names with its own name in the bodies, so a body says whose
//! disk it came from, and the metrics say which node answered.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, pattern, write, TestNode};
use switchyard_admin::cluster::ClusterStatus;
use switchyard_handoff::link::ControlAddr;
use switchyard_node::{ClusterConfig, ClusterMechanism, Member, NodeConfig};

const WAIT: Duration = Duration::from_secs(10);
const TARGETS: usize = 20;
const THRESHOLD: f64 = 4.0;
const BIG: usize = 200_000;
/// Big objects `/big0.bin` …: one of them is `n1`'s.
const BIGS: usize = 8;

fn fill(i: usize) -> impl FnOnce(&std::path::Path) {
    move |root| {
        for t in 0..TARGETS {
            write(root, &format!("t{t}.txt"), format!("n{i}:t{t}").as_bytes());
        }
        for k in 0..BIGS {
            write(root, &format!("big{k}.bin"), &pattern(BIG, i as u8 + 1));
        }
    }
}

struct Pair {
    nodes: Vec<TestNode>,
    mechanism: ClusterMechanism,
    _sockets: tempfile::TempDir,
}

impl Pair {
    /// Two members, `n0` and `n1`, hot from `THRESHOLD` references, each changed by `tweak`.
    /// `n0` serves the requests `n1` owns by `mechanism` (with `fetch`, from `n1`'s HTTP
    /// listener: cache forwarding with replication, seed 000's CF-REP); `n1` clones.
    fn start(mechanism: ClusterMechanism, tweak: impl Fn(&mut NodeConfig)) -> Pair {
        let sockets = tempfile::tempdir().unwrap();
        let members: Vec<Member> = (0..2)
            .map(|i| Member {
                name: format!("n{i}"),
                control: ControlAddr::Unix(sockets.path().join(format!("n{i}.sock"))),
            })
            .collect();
        let start = |i: usize, n1_http: Option<std::net::SocketAddr>| {
            TestNode::start(fill(i), |c| {
                c.workers = 2;
                let mut cluster = ClusterConfig::new(format!("n{i}"), members.clone());
                cluster.replication.hot_threshold = THRESHOLD;
                // No aging while a test runs: counts stay as the test made them.
                cluster.replication.aging_interval_ms = 3_600_000;
                if let Some(addr) = n1_http {
                    cluster.mechanism = ClusterMechanism::Fetch;
                    cluster.http.insert("n1".into(), addr);
                }
                c.cluster = Some(cluster);
                tweak(c);
            })
        };
        // With `fetch`, n0 needs n1's HTTP listener: n1 starts first.
        let n1 = start(1, None);
        let n1_http = (mechanism == ClusterMechanism::Fetch).then_some(n1.addr);
        let nodes = vec![start(0, n1_http), n1];
        for t in &nodes {
            assert!(t.rt.block_on(t.node.as_ref().unwrap().wait_for_peers(WAIT)));
        }
        Pair {
            nodes,
            mechanism,
            _sockets: sockets,
        }
    }

    /// Requests `n1` served for `n0`: clones it took, or fetches it answered.
    fn moved_to_n1(&self) -> f64 {
        match self.mechanism {
            ClusterMechanism::Clone => self.metric(1, "switchyard_node_clones_in_total"),
            ClusterMechanism::Fetch => {
                self.metric(1, "switchyard_node_cluster_relayed_in_requests_total")
            }
        }
    }

    fn metric(&self, i: usize, name: &str) -> f64 {
        self.nodes[i].metric(name)
    }

    /// Node `i`'s `/status.json`.
    fn status(&self, i: usize) -> ClusterStatus {
        let mut c = common::Client::connect(self.nodes[i].admin());
        c.send(b"GET /status.json HTTP/1.1\r\nHost: t\r\n\r\n");
        serde_json::from_slice(&c.response(false).body).unwrap()
    }

    /// A target of the `/tN.txt` set that `n1` owns, as `n0` routes it.
    fn owned_by_n1(&self) -> usize {
        let mut c = self.nodes[0].client();
        (0..TARGETS)
            .find(|t| c.get(&format!("/t{t}.txt")).body == format!("n1:t{t}").as_bytes())
            .expect("n1 owns one of 20 targets")
    }
}

fn cluster_of(c: &mut NodeConfig) -> &mut ClusterConfig {
    c.cluster.as_mut().unwrap()
}

#[test]
fn a_hot_target_is_copied_to_the_peer_that_asks_and_served_there() {
    a_hot_target_is_copied_and_served_there(ClusterMechanism::Clone);
}

/// Cache forwarding with replication (CF-REP): the fetched response itself is the copy.
#[test]
fn a_hot_target_fetched_from_its_owner_is_kept_and_served_there() {
    a_hot_target_is_copied_and_served_there(ClusterMechanism::Fetch);
}

fn a_hot_target_is_copied_and_served_there(mechanism: ClusterMechanism) {
    let p = Pair::start(mechanism, |_| {});
    let t = p.owned_by_n1();
    let path = format!("/t{t}.txt");
    let body = format!("n1:t{t}");
    // The probe above was the first reference; the owner copies the target with the answer
    // that makes its count reach the threshold.
    let mut client = p.nodes[0].client();
    let before = p.moved_to_n1();
    for _ in 1..THRESHOLD as usize {
        let r = client.get(&path);
        assert_eq!((r.status, r.body.as_slice()), (200, body.as_bytes()));
        // The copy's terms are between the nodes only.
        assert_eq!(r.header("X-Switchyard-Copy"), None);
    }
    assert_eq!(p.moved_to_n1() - before, THRESHOLD - 1.0);
    assert_eq!(p.metric(1, "switchyard_node_objects_shipped_total"), 1.0);
    assert!(eventually(WAIT, || p.metric(0, "switchyard_node_replicas") == 1.0));
    assert_eq!(
        p.metric(0, "switchyard_node_replica_bytes"),
        body.len() as f64
    );
    // From now on n0 answers it itself, with the owner's bytes and validators.
    let from_owner = p.nodes[1].client().get(&path);
    let moved = p.moved_to_n1();
    for _ in 0..10 {
        let r = client.get(&path);
        assert_eq!((r.status, r.body.as_slice()), (200, body.as_bytes()));
        assert_eq!(r.header("ETag"), from_owner.header("ETag"));
        assert_eq!(
            r.header("Last-Modified"),
            from_owner.header("Last-Modified")
        );
        assert_eq!(r.header("Content-Type"), from_owner.header("Content-Type"));
    }
    assert_eq!(p.metric(0, "switchyard_node_replica_hits_total"), 10.0);
    assert_eq!(p.moved_to_n1(), moved);
    // A conditional request is answered from the copy as the owner would.
    let etag = from_owner.header("ETag").unwrap().to_owned();
    client.send(
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n").as_bytes(),
    );
    assert_eq!(client.response(false).status, 304);
    assert_eq!(p.metric(0, "switchyard_node_replica_hits_total"), 11.0);
    // The owner never got a copy of its own target, nor of a cold one.
    assert_eq!(p.metric(1, "switchyard_node_replicas"), 0.0);
    assert_eq!(p.metric(0, "switchyard_node_objects_shipped_total"), 0.0);

    // Each member's status page tells the same story.
    let (s0, s1) = (p.status(0), p.status(1));
    assert_eq!((s0.name.as_str(), s1.name.as_str()), ("n0", "n1"));
    assert_eq!(s0.policy, "chash");
    let names: Vec<(&str, bool, bool)> = s0
        .members
        .iter()
        .map(|m| (m.name.as_str(), m.this_node, m.up))
        .collect();
    assert_eq!(names, vec![("n0", true, true), ("n1", false, true)]);
    // n0 gave n1 every request for the target (the probe's search included).
    assert!(s0.members[1].routed > 1 + 3 + 10, "{:?}", s0.members[1]);
    assert_eq!(s0.members[1].clones, s0.members[1].hand_backs);
    let r0 = s0.replication.expect("replication on");
    assert_eq!((r0.replicas, r0.replica_hits), (1, 11));
    let r1 = s1.replication.expect("replication on");
    assert_eq!(r1.objects_shipped, 1);
    assert_eq!(
        r1.hottest.first().map(|h| h.0.as_str()),
        Some(path.as_str())
    );
    assert_eq!(s1.clones_outstanding, 0);
}

/// An owner offers a copy with a fetched response only to a peer member asking from that
/// member's host, and never to a client that names no member or names the owner itself.
#[test]
fn a_copy_is_offered_only_to_a_member_that_fetches() {
    let p = Pair::start(ClusterMechanism::Fetch, |_| {});
    let t = p.owned_by_n1();
    let path = format!("/t{t}.txt");
    let mut client = p.nodes[0].client();
    for _ in 1..THRESHOLD as usize {
        client.get(&path);
    }
    assert_eq!(p.metric(1, "switchyard_node_objects_shipped_total"), 1.0);
    let ask = |member: &str| {
        let mut c = p.nodes[1].client();
        c.send(
            format!(
                "GET {path} HTTP/1.1\r\nHost: t\r\nX-Switchyard-Relay: 1\r\n\
                 X-Switchyard-Copy: 1048576 {member}\r\n\r\n"
            )
            .as_bytes(),
        );
        let r = c.response(false);
        assert_eq!(r.status, 200);
        r.header("X-Switchyard-Copy").map(str::to_owned)
    };
    for stranger in ["n9", "n1", "n0,n1", ""] {
        assert_eq!(ask(stranger), None, "{stranger:?}");
    }
    assert_eq!(p.metric(1, "switchyard_node_objects_shipped_total"), 1.0);
    // n0 is on this host: its name from here gets the terms, its holding counted once.
    let terms = ask("n0").expect("a member on this host gets a copy");
    assert!(terms.starts_with("copies=2 "), "{terms}");
    assert_eq!(p.metric(1, "switchyard_node_objects_shipped_total"), 2.0);
}

#[test]
fn cold_targets_stay_with_their_owner_and_the_replica_budget_holds() {
    cold_targets_stay_and_the_budget_holds(ClusterMechanism::Clone);
}

#[test]
fn cold_fetched_targets_stay_with_their_owner_and_the_replica_budget_holds() {
    cold_targets_stay_and_the_budget_holds(ClusterMechanism::Fetch);
}

fn cold_targets_stay_and_the_budget_holds(mechanism: ClusterMechanism) {
    // Room for the small targets, not for the big one.
    let p = Pair::start(mechanism, |c| {
        cluster_of(c).replication.replica_bytes = 100_000;
        cluster_of(c).replication.max_object_bytes = 1 << 20;
    });
    let t = p.owned_by_n1();
    let path = format!("/t{t}.txt");
    let mut client = p.nodes[0].client();
    // Below the threshold: cloned every time, no copy.
    for _ in 1..THRESHOLD as usize - 1 {
        assert_eq!(client.get(&path).status, 200);
    }
    assert_eq!(p.metric(1, "switchyard_node_objects_shipped_total"), 0.0);
    assert_eq!(p.metric(0, "switchyard_node_replicas"), 0.0);
    // A big object of n1's, asked of n0 (which fetches it with `fetch`): the copy is
    // offered and refused by n0's budget.
    let big = (0..BIGS)
        .map(|k| format!("/big{k}.bin"))
        .find(|path| {
            let r = client.get(path);
            assert_eq!(r.status, 200);
            r.body == pattern(BIG, 2)
        })
        .expect("n1 owns one of the big objects");
    for _ in 0..2 * THRESHOLD as usize {
        let r = client.get(&big);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, pattern(BIG, 2));
    }
    assert!(p.metric(1, "switchyard_node_objects_shipped_total") >= 1.0);
    let entry = 0;
    assert!(eventually(WAIT, || {
        p.metric(entry, "switchyard_node_replicas_rejected_total") >= 1.0
    }));
    assert_eq!(p.metric(entry, "switchyard_node_replicas"), 0.0);
    assert!(p.metric(entry, "switchyard_node_replica_bytes") <= 100_000.0);
    assert_eq!(p.metric(entry, "switchyard_node_replica_hits_total"), 0.0);
}

#[test]
fn a_changed_file_is_not_served_from_an_old_copy_beyond_the_revalidation_interval() {
    a_changed_file_is_not_served_from_an_old_copy(ClusterMechanism::Clone);
}

#[test]
fn a_changed_file_is_not_served_from_an_old_fetched_copy_beyond_the_revalidation_interval() {
    a_changed_file_is_not_served_from_an_old_copy(ClusterMechanism::Fetch);
}

fn a_changed_file_is_not_served_from_an_old_copy(mechanism: ClusterMechanism) {
    const REVALIDATE: Duration = Duration::from_millis(300);
    let p = Pair::start(mechanism, |c| {
        c.cache_revalidate_ms = REVALIDATE.as_millis() as u64
    });
    let t = p.owned_by_n1();
    let path = format!("/t{t}.txt");
    let mut client = p.nodes[0].client();
    for _ in 1..THRESHOLD as usize {
        client.get(&path);
    }
    assert!(eventually(WAIT, || p.metric(0, "switchyard_node_replicas") == 1.0));
    let hits = p.metric(0, "switchyard_node_replica_hits_total");
    assert_eq!(client.get(&path).body, format!("n1:t{t}").as_bytes());
    assert_eq!(
        p.metric(0, "switchyard_node_replica_hits_total"),
        hits + 1.0
    );

    // The owner's file changes; from one revalidation interval on, nobody serves the old one.
    let new = format!("n1:t{t}:changed");
    write(p.nodes[1].root.path(), &format!("t{t}.txt"), new.as_bytes());
    let changed = Instant::now();
    let deadline = changed + WAIT;
    loop {
        let asked = Instant::now();
        let r = client.get(&path);
        assert_eq!(r.status, 200);
        if asked >= changed + REVALIDATE {
            assert_eq!(
                r.body,
                new.as_bytes(),
                "old bytes {:?} after the revalidation interval",
                asked - changed
            );
            break;
        }
        assert!(
            r.body == new.as_bytes() || r.body == format!("n1:t{t}").as_bytes(),
            "{:?}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(Instant::now() < deadline);
    }
    // The target is still hot: its new bytes are copied again and served here.
    assert!(eventually(WAIT, || {
        client.get(&path).body == new.as_bytes()
            && p.metric(1, "switchyard_node_objects_shipped_total") >= 2.0
    }));
    assert!(p.metric(0, "switchyard_node_replicas_expired_total") >= 1.0);
    // The changed object travelled whole: its old copy was not renewed.
    let old_len = format!("n1:t{t}").len();
    assert!(
        p.metric(1, "switchyard_node_objects_shipped_bytes_total") >= (old_len + new.len()) as f64
    );
}

#[test]
fn an_unchanged_copy_is_renewed_by_its_owner_rather_than_sent_again() {
    const REVALIDATE: Duration = Duration::from_millis(200);
    let p = Pair::start(ClusterMechanism::Clone, |c| {
        c.cache_revalidate_ms = REVALIDATE.as_millis() as u64
    });
    let t = p.owned_by_n1();
    let path = format!("/t{t}.txt");
    let body = format!("n1:t{t}");
    let mut client = p.nodes[0].client();
    for _ in 1..THRESHOLD as usize {
        client.get(&path);
    }
    assert!(eventually(WAIT, || p.metric(0, "switchyard_node_replicas") == 1.0));
    assert_eq!(p.metric(1, "switchyard_node_objects_shipped_total"), 1.0);
    // Requests over several revalidation intervals: each time the copy goes stale, one request
    // goes to the owner with the copy's entity tag and the owner renews the copy.
    let deadline = Instant::now() + WAIT;
    while p.metric(0, "switchyard_node_replicas_renewed_total") < 3.0 {
        let r = client.get(&path);
        assert_eq!((r.status, r.body.as_slice()), (200, body.as_bytes()));
        assert!(Instant::now() < deadline, "no renewals");
    }
    // The object crossed once; every check after that cost a few bytes.
    assert_eq!(p.metric(1, "switchyard_node_objects_shipped_total"), 1.0);
    assert_eq!(
        p.metric(1, "switchyard_node_objects_shipped_bytes_total"),
        body.len() as f64
    );
    assert!(p.metric(1, "switchyard_node_replica_renewals_sent_total") >= 3.0);
    assert!(p.metric(0, "switchyard_node_replicas_expired_total") >= 3.0);
    assert_eq!(p.metric(0, "switchyard_node_replicas_dropped_total"), 0.0);
    // Most requests were still answered from the copy.
    let hits = p.metric(0, "switchyard_node_replica_hits_total");
    let renewals = p.metric(0, "switchyard_node_replicas_renewed_total");
    assert!(hits > renewals, "hits {hits}, renewals {renewals}");
}
