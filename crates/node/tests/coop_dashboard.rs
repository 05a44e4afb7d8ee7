//! The cooperative cluster's dashboard over real sockets: any member's admin listener serves
//! the page and a stream of updates for the whole cluster, built from every member's
//! `/member.json`; traffic entering one member shows as requests, clones and hand-backs of
//! the others; a member whose admin listener never answers is shown down without holding up
//! the updates; a member killed is shown down. A member with a rescue driver shows its site's
//! rescue.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{write, Client, TestNode};
use switchyard_admin::cluster::MemberSample;
use switchyard_admin::dashboard::{Meta, State, Update};
use switchyard_handoff::link::ControlAddr;
use switchyard_node::{ClusterConfig, Member};

const WAIT: Duration = Duration::from_secs(10);
const TARGETS: usize = 30;

/// A viewer of `/events`.
struct Stream(BufReader<TcpStream>);

impl Stream {
    fn open(admin: SocketAddr) -> Stream {
        let mut s = TcpStream::connect(admin).unwrap();
        // Updates come every second: a read waiting longer than this means none came.
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /events HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        Stream(BufReader::new(s))
    }

    /// The next event's name and data.
    fn next(&mut self) -> (String, String) {
        let mut event = String::new();
        loop {
            let mut l = String::new();
            assert!(
                self.0.read_line(&mut l).expect("an event within 5 s") > 0,
                "the stream ended"
            );
            if let Some(v) = l.strip_prefix("event: ") {
                event = v.trim().to_owned();
            } else if let Some(d) = l.strip_prefix("data: ") {
                return (event, d.trim().to_owned());
            }
        }
    }

    fn meta(&mut self) -> Meta {
        loop {
            let (event, data) = self.next();
            if event == "meta" {
                return serde_json::from_str(&data).unwrap();
            }
        }
    }

    /// The next update; its JSON is under 4 KB.
    fn update(&mut self) -> Update {
        loop {
            let (event, data) = self.next();
            if event == "update" {
                assert!(data.len() < 4096, "{} bytes", data.len());
                return serde_json::from_str(&data).unwrap();
            }
        }
    }

    /// Updates until `f` holds (at most `n` of them, one a second).
    fn until(&mut self, n: usize, mut f: impl FnMut(&Update) -> bool) -> Option<Update> {
        (0..n).map(|_| self.update()).find(|u| f(u))
    }
}

fn get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let r = Client::connect(addr).get(path);
    (r.status, r.body)
}

#[test]
fn any_member_shows_the_whole_cluster_and_members_that_do_not_answer_as_down() {
    let sockets = tempfile::tempdir().unwrap();
    let members: Vec<Member> = (0..3)
        .map(|i| Member {
            name: format!("n{i}"),
            control: ControlAddr::Unix(sockets.path().join(format!("n{i}.sock"))),
        })
        .collect();
    let mut nodes: Vec<TestNode> = (0..3)
        .map(|i| {
            TestNode::start(
                |root| {
                    for t in 0..TARGETS {
                        write(root, &format!("t{t}.txt"), format!("n{i}:t{t}").as_bytes());
                    }
                },
                |c| {
                    c.workers = 2;
                    c.cluster = Some(ClusterConfig::new(format!("n{i}"), members.clone()));
                },
            )
        })
        .collect();
    for n in &nodes {
        assert!(n.rt.block_on(n.node.as_ref().unwrap().wait_for_peers(WAIT)));
    }
    // The admin listeners' addresses are known once they are bound: a membership reload
    // names them, with a fourth member whose admin listener takes connections and never
    // answers (and whose control connection never comes up).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut table = members.clone();
    table.push(Member {
        name: "ghost".into(),
        control: ControlAddr::Unix(sockets.path().join("ghost.sock")),
    });
    for (i, n) in nodes.iter().enumerate() {
        let mut cfg = ClusterConfig::new(format!("n{i}"), table.clone());
        for (j, m) in nodes.iter().enumerate() {
            cfg.admin.insert(format!("n{j}"), m.admin());
        }
        cfg.admin
            .insert("ghost".into(), silent.local_addr().unwrap());
        let _rt = n.rt.enter();
        n.node.as_ref().unwrap().reload_cluster(&cfg).unwrap();
    }

    // Every member serves its own figures, and the page.
    let (status, body) = get(nodes[1].admin(), "/member.json");
    assert_eq!(status, 200);
    let own: MemberSample = serde_json::from_slice(&body).unwrap();
    assert_eq!(own.name, "n1");
    let (status, page) = get(nodes[2].admin(), "/");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&page).contains("EventSource(\"events\")"));

    // Member 0's stream names every member.
    let mut stream = Stream::open(nodes[0].admin());
    // (A meta of the membership before the reload may come first.)
    let meta = (0..3)
        .map(|_| stream.meta())
        .find(|m| m.nodes.len() == 4)
        .expect("the reloaded membership");
    assert_eq!(meta.kind, "cooperative");
    assert_eq!(meta.mechanism, "clone");
    assert_eq!(meta.nodes, ["n0", "n1", "n2", "ghost"]);
    assert_eq!(meta.cols.last().map(String::as_str), Some("replicas"));

    // Traffic entering member 1 only: every member serves the targets it owns (clones), and
    // member 0's page shows it, with the ghost down all along and updates on time.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (stop, addr) = (stop.clone(), nodes[1].addr);
        std::thread::spawn(move || {
            let mut client = Client::connect(addr);
            // Bounded: 30 s at most whatever happens to the test.
            let end = Instant::now() + Duration::from_secs(30);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                let r = client.get(&format!("/t{}.txt", n as usize % TARGETS));
                assert_eq!(r.status, 200);
                n += 1;
            }
            n
        })
    };
    let mut last = Instant::now();
    let mut slowest = Duration::ZERO;
    let u = stream
        .until(10, |u| {
            slowest = slowest.max(last.elapsed());
            last = Instant::now();
            // (The entry member's hot targets come with its first full period of traffic.)
            u.n.iter().all(|r| r.state != State::Up || r.rps.0 > 0.0) && !u.map.hot.is_empty()
        })
        .expect("every member's requests and the hot targets show within 10 updates");
    assert!(u.n[..3].iter().all(|r| r.up && r.coop.is_some()), "{u:?}");
    assert_eq!(u.n[3].state, State::Down, "the ghost never answers");
    assert!(
        slowest < Duration::from_secs(3),
        "a member that never answers held an update up for {slowest:?}"
    );
    let clones: f64 = u.n.iter().map(|r| r.moves.0).sum();
    assert!(clones > 0.0, "clones to the owners: {u:?}");
    assert!(u.c.backs.is_some_and(|b| b.0 > 0.0), "hand-backs: {u:?}");
    assert!(
        u.map.hot.iter().all(|h| (h.1 as usize) < 3),
        "owned by n0..n2"
    );
    stop.store(true, Ordering::Relaxed);
    assert!(traffic.join().unwrap() > 0);

    // Member 2 killed: shown down, the others up.
    let mut killed = nodes.remove(2);
    drop(killed.node.take());
    drop(killed);
    let u = stream
        .until(5, |u| u.n[2].state == State::Down)
        .expect("the killed member shows down within 5 updates");
    assert!(u.n[0].up && u.n[1].up);
    drop(silent);
}

/// A cooperative member with `[rescue.peering]`: its `/status.json` has its site's rescue
/// status and its dashboard's updates the rescue part (the site's name and peers in the
/// meta); a member without it has neither.
#[test]
fn a_member_with_a_rescue_driver_shows_its_site_s_rescue() {
    use switchyard_node::RescueConfig;
    use switchyard_rescue::{PeerConfig, PeeringConfig};
    use switchyard_rescue_driver::testcerts::TestCa;

    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let sockets = tempfile::tempdir().unwrap();
    let ca = TestCa::new("peers");
    let members: Vec<Member> = (0..2)
        .map(|i| Member {
            name: format!("n{i}"),
            control: ControlAddr::Unix(sockets.path().join(format!("n{i}.sock"))),
        })
        .collect();
    let (cert, key, ca_path) = ca.write_identity("site.test", sockets.path()).unwrap();
    let web = free_port();
    let mut rescue = RescueConfig::new("site.test", [127, 0, 0, 1].into(), web, 1000.0);
    rescue.d_out_kbps = Some(300.0);
    rescue.peering = Some(PeeringConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], free_port())),
        cert,
        key,
        ca: ca_path,
        // A peer that is not running: the site stays normal.
        peers: vec![PeerConfig {
            name: "rescue.test".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            d_free_kbps: None,
            domain: None,
        }],
    });
    let mut rescue = Some(rescue);
    let nodes: Vec<TestNode> = (0..2)
        .map(|i| {
            TestNode::start(
                |root| write(root, "t.txt", b"t"),
                |c| {
                    c.workers = 2;
                    c.cluster = Some(ClusterConfig::new(format!("n{i}"), members.clone()));
                    if i == 0 {
                        c.listen = SocketAddr::from(([127, 0, 0, 1], web));
                        c.rescue = rescue.take();
                    }
                },
            )
        })
        .collect();
    for n in &nodes {
        assert!(n.rt.block_on(n.node.as_ref().unwrap().wait_for_peers(WAIT)));
    }

    let (status, body) = get(nodes[0].admin(), "/status.json");
    assert_eq!(status, 200);
    let s: switchyard_admin::cluster::ClusterStatus = serde_json::from_slice(&body).unwrap();
    assert_eq!(s.members.len(), 2);
    let r = s.rescue.expect("the member's rescue status");
    assert_eq!(
        (r.server_name.as_str(), r.state.as_str()),
        ("site.test", "normal")
    );
    let (_, body) = get(nodes[1].admin(), "/status.json");
    let s: switchyard_admin::cluster::ClusterStatus = serde_json::from_slice(&body).unwrap();
    assert_eq!(s.rescue, None, "no driver, no rescue status");

    let mut with = Stream::open(nodes[0].admin());
    let meta = with.meta();
    let site = meta.site.expect("the site in the meta");
    assert_eq!(site.name, "site.test");
    assert_eq!(site.max.0, 300.0);
    assert_eq!(site.peers, ["rescue.test"]);
    let u = with.update();
    let r = u.r.expect("the rescue part");
    assert_eq!(r.st, "normal");
    assert!(r.rs.is_empty() && r.os.is_empty());

    let mut without = Stream::open(nodes[1].admin());
    assert_eq!(without.meta().site, None);
    assert_eq!(without.update().r, None);
}
