//! Cooperative mode across hosts with the real binaries: `switchyard lab up --cooperative`
//! starts three cooperative nodes in their own network namespaces behind the lab's layer-4
//! director (direct routing with nftables `fwd`, as this kernel has no IPVS), and no switch.
//! A request owned by another node than the one the director chose moves there with its
//! connection (`TCP_REPAIR`, steered from the entry node) and comes back once answered. Every
//! node serves its own document root, whose files name it, so each response says which node
//! served it. Needs root (namespaces, TCP_REPAIR, tc/eBPF, nftables): without it, or with
//! `SWITCHYARD_SKIP_ROOT_TESTS=1`, the runner reports the tests as ignored with the reason.
//!
//! `SWITCHYARD_COOP_REQUESTS` sets the size of the many-request run (default 2,000).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard_handoff::netns::NetNs;
use switchyard_testkit::http::{get_once, read_response};
use switchyard_testkit::root;
use switchyard_testkit::wait::{eventually, holds_for};

mod lab_support;
use lab_support::{read_all, Lab, SlowReader};

fn main() {
    root::main(root::tests![
        each_request_is_served_by_its_owner_across_hosts,
        a_killed_peer_loses_only_its_own_and_its_targets_move,
        hot_targets_are_copied_to_the_entry_node,
        many_cloned_requests_without_an_error,
        a_clone_answered_late_across_hosts_is_never_served_twice,
        a_slow_reader_of_a_clone_gets_the_whole_response,
    ]);
}

const NODES: usize = 3;
const TARGETS: usize = 30;
const BIG: usize = 5 * 1024 * 1024;
/// Files `/sN.bin` of [`MID`] bytes, for a client that reads slowly.
const MIDS: usize = 8;
/// Larger than a small client window, small enough for the owner's send buffer.
const MID: usize = 16 * 1024;
/// Connections [`Lab::owners`] learns the owner map through, each asking for every target.
const OWNER_CONNS: usize = 6;
/// Requests [`Lab::owners`] sends.
const OWNER_REQUESTS: usize = OWNER_CONNS * TARGETS;

/// Node `i`'s 5 MB file: a pattern of its own.
fn big(i: usize) -> Vec<u8> {
    (0..BIG)
        .map(|k| ((k as u32).wrapping_mul(2_654_435_761) >> 24) as u8 ^ (i as u8 + 1))
        .collect()
}

/// Node `i`'s `/sM.bin`: its name, then dots up to [`MID`] bytes.
fn mid(i: usize, m: usize) -> Vec<u8> {
    let mut v = format!("n{i}:s{m}:").into_bytes();
    v.resize(MID, b'.');
    v
}

/// A cooperative lab of [`NODES`] nodes, each with a document root whose files name it,
/// once every node's control connections to the others are up.
fn up(tag: char) -> Lab {
    let me = Lab::start(
        tag,
        &["--cooperative", "--nodes", &NODES.to_string()],
        |dir| {
            for i in 0..NODES {
                let root = dir.join(format!("roots/node{i}"));
                std::fs::create_dir_all(&root).unwrap();
                for t in 0..TARGETS {
                    std::fs::write(root.join(format!("t{t}.txt")), format!("n{i}:t{t}")).unwrap();
                }
                std::fs::write(root.join("big.bin"), big(i)).unwrap();
                for m in 0..MIDS {
                    std::fs::write(root.join(format!("s{m}.bin")), mid(i, m)).unwrap();
                }
            }
            let roots = dir.join("roots/{node}");
            vec!["--root".into(), roots.to_str().unwrap().to_owned()]
        },
    );
    assert_eq!(me.status["mechanism"], "cooperative");
    // Every node's control connections to the others come up in the background.
    let until = Instant::now() + Duration::from_secs(20);
    for i in 0..NODES {
        while me.metric(i, "switchyard_node_cluster_peers_up") < (NODES - 1) as f64 {
            assert!(
                Instant::now() < until,
                "node{i}'s peers never came up\n{}",
                me.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    me
}

/// What the cooperative suites read of the lab's nodes.
impl Lab {
    /// Node `i`'s Prometheus text, fetched from the client host.
    fn metrics(&self, i: usize) -> String {
        let (_, ip) = self.host(&format!("node{i}"));
        let admin: SocketAddr = format!("{ip}:9080").parse().unwrap();
        self.on_client(move || {
            let mut last = None;
            for _ in 0..5 {
                match get_once(admin, "/metrics") {
                    Ok((200, b)) => return String::from_utf8(b).unwrap(),
                    other => last = Some(format!("{other:?}")),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            panic!("node{i}'s metrics at {admin}: {last:?}")
        })
    }

    /// The sum of node `i`'s samples whose name (with labels) starts with `prefix`.
    fn metric(&self, i: usize, prefix: &str) -> f64 {
        sum_of(&self.metrics(i), prefix)
    }

    /// Requests each node routed as the connection's entry node: served as its own, cloned
    /// out, served from a copy or served after all.
    fn routed(&self) -> Vec<f64> {
        (0..NODES)
            .map(|i| {
                let m = self.metrics(i);
                sum_of(&m, "switchyard_node_cluster_owned_requests_total")
                    + sum_of(&m, "switchyard_node_clones_out_total")
                    + sum_of(&m, "switchyard_node_clone_fallbacks_total")
                    + sum_of(&m, "switchyard_node_replica_hits_total")
            })
            .collect()
    }

    /// [`Lab::routed`] once every one of the `sent` requests sent so far is counted (each is
    /// counted once, by its entry node; a clone when its `Accepted` has been read, which may
    /// be after the owner's answer has reached the client).
    fn settled(&self, sent: usize) -> Vec<f64> {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let now = self.routed();
            if now.iter().sum::<f64>() == sent as f64 {
                return now;
            }
            assert!(
                Instant::now() < until,
                "{sent} requests sent, routed {now:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The entry node of the connection that sent the one request after `before` (taken with
    /// [`Lab::settled`] for `sent` requests).
    fn entry_since(&self, before: &[f64], sent: usize) -> usize {
        let now = self.settled(sent + 1);
        (0..NODES)
            .find(|&i| now[i] > before[i])
            .expect("one node counted one more")
    }

    /// The owner of every target, as seen through several connections (every entry node
    /// must agree): [`OWNER_REQUESTS`] requests.
    fn owners(&self) -> Vec<usize> {
        let vip = self.vip();
        self.on_client(move || {
            let mut map: Vec<Option<usize>> = vec![None; TARGETS];
            for _ in 0..OWNER_CONNS {
                let mut c = Conn::open(vip);
                for (t, owner) in map.iter_mut().enumerate() {
                    let who = c.get_t(t).unwrap();
                    match owner {
                        Some(o) => assert_eq!(*o, who, "t{t}: entry nodes disagree on the owner"),
                        None => *owner = Some(who),
                    }
                }
            }
            map.into_iter().map(Option::unwrap).collect()
        })
    }
}

fn sum_of(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum()
}

/// Who served `/tN.txt`, from its body.
fn served_by(body: &[u8], t: usize) -> Result<usize, String> {
    let s = String::from_utf8_lossy(body);
    let (who, what) = s.split_once(':').ok_or_else(|| format!("odd body {s:?}"))?;
    if what != format!("t{t}") {
        return Err(format!("body {s:?} for t{t}"));
    }
    who.strip_prefix('n')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("odd body {s:?}"))
}

/// A keep-alive connection through the VIP.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(vip: SocketAddr) -> Conn {
        let s = TcpStream::connect_timeout(&vip, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn { s, buf: Vec::new() }
    }

    fn get_t(&mut self, t: usize) -> Result<usize, String> {
        self.s
            .write_all(format!("GET /t{t}.txt HTTP/1.1\r\nHost: lab\r\n\r\n").as_bytes())
            .map_err(|e| e.to_string())?;
        let r = read_response(&mut self.s, &mut self.buf).map_err(|e| format!("t{t}: {e}"))?;
        if r.status != 200 {
            return Err(format!("t{t}: status {}", r.status));
        }
        served_by(&r.body, t)
    }
}

/// Keep-alive, in order and pipelined 8 at a time; a 5 MB body through a clone; HTTP/1.0.
fn each_request_is_served_by_its_owner_across_hosts() {
    let lab = up('a');
    let vip = lab.vip();
    let owners = lab.owners();
    for i in 0..NODES {
        assert!(owners.contains(&i), "node{i} owns none of {owners:?}");
    }
    let before: f64 = (0..NODES)
        .map(|i| lab.metric(i, "switchyard_node_clones_out_total"))
        .sum();
    let o = owners.clone();
    lab.on_client(move || {
        // One keep-alive connection, 30 requests one after the other, each by its owner.
        let mut c = Conn::open(vip);
        for (t, &owner) in o.iter().enumerate() {
            assert_eq!(c.get_t(t), Ok(owner), "t{t}");
        }
        // Pipelined 8 at a time, answered in order by their owners.
        for chunk in (0..TARGETS).collect::<Vec<_>>().chunks(8) {
            let batch: String = chunk
                .iter()
                .map(|t| format!("GET /t{t}.txt HTTP/1.1\r\nHost: lab\r\n\r\n"))
                .collect();
            c.s.write_all(batch.as_bytes()).unwrap();
            for &t in chunk {
                let r = read_response(&mut c.s, &mut c.buf).unwrap();
                assert_eq!(r.status, 200);
                assert_eq!(served_by(&r.body, t), Ok(o[t]), "pipelined t{t}");
            }
        }
        // HTTP/1.0: one request per connection, answered and closed.
        for (t, &owner) in o.iter().enumerate().take(9) {
            let mut s = TcpStream::connect_timeout(&vip, Duration::from_secs(5)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(format!("GET /t{t}.txt HTTP/1.0\r\n\r\n").as_bytes())
                .unwrap();
            let mut all = Vec::new();
            s.read_to_end(&mut all).unwrap();
            let text = String::from_utf8_lossy(&all);
            assert!(
                text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
                "{text}"
            );
            assert!(
                text.ends_with(&format!("n{owner}:t{t}")),
                "HTTP/1.0 t{t}: {text}"
            );
        }
    });
    let after: f64 = (0..NODES)
        .map(|i| lab.metric(i, "switchyard_node_clones_out_total"))
        .sum();
    assert!(
        after - before >= 10.0,
        "requests were cloned across hosts: {before} -> {after}\n{}",
        lab.logs()
    );
    // A 5 MB body through a clone: connections until one's entry is not big.bin's owner.
    let mut through_a_clone = false;
    for _ in 0..20 {
        let clones = |lab: &Lab| -> f64 {
            (0..NODES)
                .map(|i| lab.metric(i, "switchyard_node_clones_out_total"))
                .sum()
        };
        let c0 = clones(&lab);
        let body = lab.on_client(move || {
            let mut c = Conn::open(vip);
            c.s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: lab\r\n\r\n")
                .unwrap();
            let r = read_response(&mut c.s, &mut c.buf).unwrap();
            assert_eq!(r.status, 200);
            // The connection came back and takes the next request.
            c.get_t(0).unwrap();
            r.body
        });
        assert!((0..NODES).any(|i| body == big(i)), "5 MB body differs");
        if clones(&lab) - c0 >= 1.0 && (0..NODES).any(|i| body == big(i)) {
            through_a_clone = true;
            break;
        }
    }
    assert!(
        through_a_clone,
        "no 5 MB body went through a clone\n{}",
        lab.logs()
    );
    // Nothing lost; every clone came back or ended at its owner (an HTTP/1.0 request, closed
    // there), once the owners' last reports have been read.
    let until = Instant::now() + Duration::from_secs(5);
    for i in 0..NODES {
        loop {
            let m = lab.metrics(i);
            assert_eq!(
                sum_of(&m, "switchyard_node_clones_lost_total"),
                0.0,
                "node{i} lost clones\n{}",
                lab.logs()
            );
            let out = sum_of(&m, "switchyard_node_clones_out_total");
            let ended = sum_of(&m, "switchyard_node_clone_hand_backs_total")
                + sum_of(&m, "switchyard_node_clones_closed_total");
            if out == ended {
                break;
            }
            assert!(
                Instant::now() < until,
                "node{i}: {out} clones out, {ended} back or closed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Node 2 is killed while clients load the cluster: connections on the other nodes carry on
/// (a connection fails only if node 2 held it at that moment: serving a request, or holding
/// it after its answer until the hand-back), the director
/// takes node 2 out, and node 2's targets are served by the others while the rest stay put.
fn a_killed_peer_loses_only_its_own_and_its_targets_move() {
    let lab = up('k');
    let vip = lab.vip();
    let owners = lab.owners();
    // Connections whose entry node is not node 2, found by which node routed their first
    // request.
    let mut conns = Vec::new();
    let mut sent = OWNER_REQUESTS;
    while conns.len() < 4 {
        let r0 = lab.settled(sent);
        let c = lab.on_client(move || {
            let mut c = Conn::open(vip);
            c.get_t(0).unwrap();
            c
        });
        let entry = lab.entry_since(&r0, sent);
        sent += 1;
        if entry != 2 {
            conns.push(c);
        }
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let (ns, _) = lab.host("client0");
    let threads: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(k, mut c)| {
            let (stop, failures, owners, ns) =
                (stop.clone(), failures.clone(), owners.clone(), ns.clone());
            std::thread::spawn(move || {
                let _g = NetNs::open(&ns).unwrap().enter().unwrap();
                c.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut n = 0usize;
                // The owner of the request before: a connection node 2 answered and had not
                // given back yet was node 2's when it died.
                let mut before = usize::MAX;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let t = (n * 7 + k) % TARGETS;
                    n += 1;
                    let at_node2 = owners[t] == 2 || before == 2;
                    before = owners[t];
                    match c.get_t(t) {
                        Ok(who) if who == owners[t] || owners[t] == 2 => {}
                        Ok(who) => {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("t{t} served by n{who}"));
                            return n;
                        }
                        Err(e) => {
                            if !at_node2 {
                                failures.lock().unwrap().push(format!("conn {k}: {e}"));
                            }
                            return n;
                        }
                    }
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on the pid the lab recorded for node 2's process.
    unsafe { libc::kill(lab.pid("node2") as i32, libc::SIGKILL) };
    // The director takes node 2 out, as a health checker would; the other buckets stay.
    let (sw, _) = lab.host("switch");
    let state =
        switchyard_lab::LabState::load(&lab.state_dir.path().join(format!("{}.json", lab.prefix)))
            .unwrap();
    switchyard_lab::cli::director(&state.topology, 80)
        .set_live(&NetNs::open(&sw).unwrap(), &[true, true, false])
        .unwrap();
    // The others notice node 2 is gone.
    let until = Instant::now() + Duration::from_secs(10);
    for i in 0..2 {
        while lab.metric(i, "switchyard_node_cluster_peers_up") > 1.0 {
            assert!(Instant::now() < until, "node{i} never saw node 2 go");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let done: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let failures = failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "{failures:?}\n{}", lab.logs());
    assert!(done.iter().all(|&n| n > 5), "load ran: {done:?}");
    // New connections: node 2's targets now on the others, every other target where it was.
    let o = owners.clone();
    lab.on_client(move || {
        for _ in 0..4 {
            let mut c = Conn::open(vip);
            for (t, &owner) in o.iter().enumerate() {
                let who = c.get_t(t).unwrap();
                if owner == 2 {
                    assert_ne!(who, 2, "t{t}");
                } else {
                    assert_eq!(who, owner, "t{t} moved though its owner is up");
                }
            }
        }
    });
}

/// A target requested over and over through an entry node that does not own it becomes hot:
/// its owner ships a copy with a clone, and the entry node serves it from then on (the owner
/// stops seeing those requests).
fn hot_targets_are_copied_to_the_entry_node() {
    let lab = up('r');
    let vip = lab.vip();
    let owners = lab.owners();
    // A connection and a target whose owner is not the connection's entry node.
    let mut sent = OWNER_REQUESTS;
    let (mut c, entry, t) = loop {
        let r0 = lab.settled(sent);
        let c = lab.on_client(move || {
            let mut c = Conn::open(vip);
            c.get_t(0).unwrap();
            c
        });
        let entry = lab.entry_since(&r0, sent);
        sent += 1;
        if let Some(t) = (0..TARGETS).find(|&t| owners[t] != entry) {
            break (c, entry, t);
        }
    };
    let owner = owners[t];
    let shipped0 = lab.metric(owner, "switchyard_node_objects_shipped_total");
    let mut n = 0;
    while lab.metric(entry, "switchyard_node_replica_hits_total") < 1.0 {
        for _ in 0..20 {
            assert_eq!(c.get_t(t).unwrap(), owner);
            n += 1;
        }
        assert!(
            n < 2_000,
            "no copy arrived after {n} requests\n{}",
            lab.logs()
        );
    }
    assert!(lab.metric(owner, "switchyard_node_objects_shipped_total") > shipped0);
    assert!(lab.metric(entry, "switchyard_node_replicas_received_total") >= 1.0);
    // From now on the entry node serves the target itself. A copy is trusted for the owner's
    // revalidation interval (1 s by default); after that one request goes to the owner again
    // and brings a fresh copy back. So the owner sees at most one request per second of the
    // run (and one more for a copy expiring as it starts), the entry node serves the rest.
    let clones_in = |lab: &Lab| lab.metric(owner, "switchyard_node_clones_in");
    let in0 = clones_in(&lab);
    let hits0 = lab.metric(entry, "switchyard_node_replica_hits_total");
    let started = Instant::now();
    for _ in 0..50 {
        assert_eq!(c.get_t(t).unwrap(), owner, "the copy is the owner's file");
    }
    let seconds = started.elapsed().as_secs_f64().ceil();
    let at_owner = clones_in(&lab) - in0;
    let here = lab.metric(entry, "switchyard_node_replica_hits_total") - hits0;
    assert!(
        at_owner <= seconds + 1.0,
        "the owner saw {at_owner} of 50 requests in {seconds} s"
    );
    assert_eq!(here + at_owner, 50.0, "every request served once");
}

/// A bounded run of requests from several keep-alive connections at once, most of them
/// cloned: every one answered by its owner (or a copy of its owner's file), none failed.
fn many_cloned_requests_without_an_error() {
    let total: usize = std::env::var("SWITCHYARD_COOP_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let lab = up('m');
    let vip = lab.vip();
    let owners = lab.owners();
    let clones0: f64 = (0..NODES)
        .map(|i| lab.metric(i, "switchyard_node_clones_out_total"))
        .sum();
    const CONNS: usize = 8;
    let (ns, _) = lab.host("client0");
    let started = Instant::now();
    let threads: Vec<_> = (0..CONNS)
        .map(|k| {
            let (owners, ns) = (owners.clone(), ns.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let _g = NetNs::open(&ns).unwrap().enter().unwrap();
                let mut c = Conn::open(vip);
                for n in 0..total / CONNS {
                    // A new connection now and then: new entry nodes.
                    if n % 50 == 49 {
                        c = Conn::open(vip);
                    }
                    let t = (n * 13 + k * 3) % TARGETS;
                    let who = c.get_t(t)?;
                    if who != owners[t] {
                        return Err(format!("t{t} answered with n{who}'s file"));
                    }
                }
                Ok(())
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let errors: Vec<_> = results.into_iter().filter_map(Result::err).collect();
    assert!(errors.is_empty(), "{errors:?}\n{}", lab.logs());
    let clones: f64 = (0..NODES)
        .map(|i| lab.metric(i, "switchyard_node_clones_out_total"))
        .sum::<f64>()
        - clones0;
    eprintln!(
        "{total} requests in {:?}, {clones} cloned across hosts",
        started.elapsed()
    );
    assert!(
        clones >= (total / 10) as f64,
        "only {clones} of {total} requests were cloned"
    );
    for i in 0..NODES {
        assert_eq!(lab.metric(i, "switchyard_node_clones_lost_total"), 0.0);
    }
}

/// What the scripted member does with a `Create` on receiving its `Cancel`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Script {
    /// `Accepted` (late), restore the connection and answer it itself.
    AcceptLate,
    /// `Drop`: the entry node serves the request.
    DropOnCancel,
    /// Nothing at all: the entry node abandons the connection.
    Silent,
}

const FAKE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nFAKE";

/// A member `n2` on node 2's host that answers `Hello` and follows `scripts` in turn for the
/// `Create`s it gets (from any peer), only once their `Cancel` arrives.
fn scripted_member(
    addr: SocketAddr,
    scripts: Vec<Script>,
    seen: std::sync::mpsc::Sender<Script>,
) -> impl FnOnce() {
    use switchyard_handoff::fdpass::{control_tcp, Outgoing};
    use switchyard_handoff::proto::{DropReason, Message, Transfer};
    move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            let scripts = Arc::new(Mutex::new(scripts.into_iter()));
            loop {
                let (s, _) = listener.accept().await.unwrap();
                let (scripts, seen) = (scripts.clone(), seen.clone());
                tokio::spawn(async move {
                    let (mut rx, mut tx) = control_tcp(s);
                    let mut held = std::collections::HashMap::new();
                    while let Ok(Some((m, _))) = rx.recv().await {
                        let reply = match m {
                            Message::Hello { .. } => Some(Message::Hello { name: "n2".into() }),
                            Message::Create {
                                id,
                                client,
                                local,
                                transfer: Transfer::Repair(state),
                                ..
                            } => {
                                let script =
                                    scripts.lock().unwrap().next().unwrap_or(Script::Silent);
                                seen.send(script).unwrap();
                                held.insert(id, (script, state, client, local));
                                None
                            }
                            Message::Cancel { id } => match held.remove(&id) {
                                Some((Script::AcceptLate, state, client, local)) => {
                                    let accepted = Message::Accepted { id };
                                    tx.send_batch(&[Outgoing::plain(accepted)]).await.unwrap();
                                    let r =
                                        switchyard_handoff::repair::restore(&state, local, client)
                                            .unwrap();
                                    let mut s = std::net::TcpStream::from(r.fd);
                                    s.write_all(FAKE).unwrap();
                                    s.shutdown(std::net::Shutdown::Write).unwrap();
                                    Some(Message::Closed {
                                        id,
                                        requests: 1,
                                        bytes: FAKE.len() as u64,
                                    })
                                }
                                Some((Script::DropOnCancel, ..)) => Some(Message::Drop {
                                    id,
                                    reason: DropReason::Cancelled,
                                    detail: String::new(),
                                }),
                                _ => None,
                            },
                            _ => None,
                        };
                        if let Some(r) = reply {
                            if tx.send_batch(&[Outgoing::plain(r)]).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
    }
}

/// Node 2 is replaced by a member that answers a clone only after its `Cancel`: a late
/// `Accepted` leaves the client with the member's answer alone, a `Drop` with the entry node's
/// alone, and no answer at all with none (the entry node closes its copy without a word).
fn a_clone_answered_late_across_hosts_is_never_served_twice() {
    let lab = up('s');
    let vip = lab.vip();
    let owners = lab.owners();
    let t = (0..TARGETS)
        .find(|&t| owners[t] == 2)
        .expect("a target of node 2");
    // SAFETY: kill(2) on the pid the lab recorded for node 2's process.
    unsafe { libc::kill(lab.pid("node2") as i32, libc::SIGKILL) };
    let until = Instant::now() + Duration::from_secs(10);
    for i in 0..2 {
        while lab.metric(i, "switchyard_node_cluster_peers_up") > 1.0 {
            assert!(Instant::now() < until, "node{i} never saw node 2 go");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (ns2, ip2) = lab.host("node2");
    let addr: SocketAddr = format!("{ip2}:7000").parse().unwrap();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    let member = scripted_member(
        addr,
        vec![Script::AcceptLate, Script::DropOnCancel, Script::Silent],
        seen_tx,
    );
    std::thread::spawn(move || {
        let _g = NetNs::open(&ns2).unwrap().enter().unwrap();
        member()
    });
    // Nodes 0 and 1 reconnect to "n2" and route its targets there again.
    for i in 0..2 {
        while lab.metric(i, "switchyard_node_cluster_peers_up") < 2.0 {
            assert!(
                Instant::now() < until + Duration::from_secs(10),
                "node{i} never reached the scripted member"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let lost0: f64 = (0..2)
        .map(|i| lab.metric(i, "switchyard_node_clones_lost_total"))
        .sum();
    for expect in [Script::AcceptLate, Script::DropOnCancel, Script::Silent] {
        // Connections the director gives node 2's host find no listener there; others reach
        // node 0 or 1.
        let all = lab.on_client(move || {
            let mut s = loop {
                if let Ok(s) = TcpStream::connect_timeout(&vip, Duration::from_secs(2)) {
                    break s;
                }
            };
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(
                format!("GET /t{t}.txt HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .unwrap();
            let mut all = Vec::new();
            let _ = s.read_to_end(&mut all);
            all
        });
        assert_eq!(seen.recv_timeout(Duration::from_secs(5)), Ok(expect));
        match expect {
            Script::AcceptLate => assert_eq!(all, FAKE, "only the member answers"),
            Script::DropOnCancel => {
                let text = String::from_utf8_lossy(&all);
                assert!(text.starts_with("HTTP/1.1 200"), "{text}");
                assert!(
                    text.ends_with(&format!("n0:t{t}")) || text.ends_with(&format!("n1:t{t}")),
                    "only the entry node answers: {text}"
                );
            }
            Script::Silent => assert!(all.is_empty(), "nobody answers: {all:?}"),
        }
    }
    let lost: f64 = (0..2)
        .map(|i| lab.metric(i, "switchyard_node_clones_lost_total"))
        .sum();
    assert_eq!(lost - lost0, 1.0, "the unanswered clone was abandoned");
}

/// The owner of a clone that has written its answer and shut its side down is not done with
/// the connection: the client may not have the answer yet, and its acknowledgements and window
/// updates reach the owner only through the entry node's steering entry, which goes 2 s after
/// the owner reports the clone closed. Here the client's window is small and it reads nothing
/// until the owner has queued the whole answer and shut down, and for longer than that linger
/// after; it still gets every byte, and the entry goes only once it has closed.
fn a_slow_reader_of_a_clone_gets_the_whole_response() {
    let lab = up('w');
    let vip = lab.vip();
    // Who owns each /sM.bin, from the bodies.
    let owners: Vec<usize> = lab.on_client(move || {
        (0..MIDS)
            .map(|m| {
                let (status, body) = get_once(vip, &format!("/s{m}.bin")).unwrap();
                assert_eq!((status, body.len()), (200, MID));
                let text = String::from_utf8_lossy(&body[..8]).into_owned();
                let who = text.strip_prefix('n').and_then(|r| r.split(':').next());
                who.and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("odd body {text:?}"))
            })
            .collect()
    });
    // Those clones' entries linger for the FIN exchange: let them go first.
    let entries = "switchyard_node_cluster_steering_entries";
    for i in 0..NODES {
        assert!(
            eventually(Duration::from_secs(10), || lab.metric(i, entries) == 0.0),
            "node{i}'s entries stay\n{}",
            lab.logs()
        );
    }
    let client = SlowReader::connect(&lab, read_all);
    // The entry node is the one holding the client's connection; ask for a file another owns.
    let dport = format!(":{}", client.port);
    let entry = (0..NODES)
        .find(|&i| {
            !lab.sockets(
                &format!("node{i}"),
                &["state", "established", "dport", "=", &dport],
            )
            .trim()
            .is_empty()
        })
        .expect("a node holds the client's connection");
    let m = (0..MIDS)
        .find(|&m| owners[m] != entry)
        .expect("a file another node owns");
    let owner = owners[m];
    client.ask(format!("GET /s{m}.bin HTTP/1.0\r\n\r\n").as_bytes());
    // The owner has queued the answer and shut its side down, with bytes the client has not
    // acknowledged: its restored socket is in FIN-WAIT-1 with a send queue.
    assert!(
        eventually(Duration::from_secs(10), || {
            lab.queued_close(&format!("node{owner}"), &["dport", "=", &dport])
        }),
        "node{owner} never queued the answer to /s{m}.bin\n{}",
        lab.logs()
    );
    assert_eq!(lab.metric(entry, entries), 1.0, "{}", lab.logs());
    // Had the owner reported the clone closed, the entry would go 2 s later (and within the
    // entry node's 100 ms expiry tick): watch it for longer than that before the client reads.
    assert!(
        holds_for(Duration::from_millis(2500), || lab.metric(entry, entries)
            == 1.0),
        "node{entry}'s steering entry went while the client had not the whole answer\n{}",
        lab.logs()
    );
    let (read, all) = client.read();
    assert!(
        read.is_ok(),
        "{read:?} after {} bytes\n{}",
        all.len(),
        lab.logs()
    );
    assert!(
        all.ends_with(&mid(owner, m)),
        "not node{owner}'s whole /s{m}.bin: {} bytes in all",
        all.len()
    );
    // Once the client has closed, so has the owner, and the entry goes.
    assert!(
        eventually(Duration::from_secs(10), || lab.metric(entry, entries)
            == 0.0),
        "node{entry}'s steering entry stays after the clone closed\n{}",
        lab.logs()
    );
    assert_eq!(lab.metric(entry, "switchyard_node_clones_lost_total"), 0.0);
}
