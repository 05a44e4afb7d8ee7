//! Micro-benchmark: the switch-side and node-side cost of one TCP handoff.
//!
//! Needs root. Builds a lab (client, switch, one node) in network
//! namespaces, attaches the eBPF steering program, and for each of N client
//! connections measures on the switch `steer.insert` + `repair::dump` +
//! `close` (the socket leaves silently), and on the node `repair::restore`
//! (socket → bound to the VIP → repaired → out of repair mode). The node then
//! answers the client, which checks the response, so every measured handoff
//! really worked. Prints median and p99 in µs.
//!
//! `cargo bench -p switchyard-lab --bench handoff_micro [-- N]`
//! (bench/handoff-micro/run.sh)

use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use switchyard_handoff::netns::{self, NetNs};
use switchyard_handoff::proto::{Message, Transfer};
use switchyard_handoff::repair::{self, RepairState};
use switchyard_handoff::steer::ebpf::{EbpfConfig, EbpfSteering};
use switchyard_handoff::steer::{parse_mac, Flow, NoSocketDrop, Steering, Target};
use switchyard_lab::{LabSpec, Role, Topology};

struct Guard(String);
impl Drop for Guard {
    fn drop(&mut self) {
        Topology::teardown(&self.0);
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    if std::env::var("SWITCHYARD_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        println!("SKIP handoff_micro: SWITCHYARD_SKIP_ROOT_TESTS=1");
        return;
    }
    if !netns::has_admin_caps() {
        eprintln!("handoff_micro needs root (network namespaces, TCP_REPAIR, eBPF)");
        std::process::exit(1);
    }
    let prefix = format!("sybm{}", std::process::id() % 100_000);
    Topology::teardown(&prefix);
    let topo = Topology::build(&LabSpec {
        prefix: prefix.clone(),
        clients: 1,
        nodes: 1,
        link_mbit: None,
    })
    .expect("lab");
    let _guard = Guard(prefix.clone());
    {
        // never hang: remove the lab and fail after 5 minutes
        let prefix = prefix.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(300));
            eprintln!("handoff_micro: timed out");
            Topology::teardown(&prefix);
            std::process::exit(1);
        });
    }
    let sw_ns = topo.netns("switch").unwrap();
    let node = topo.hosts_of(Role::Node).next().unwrap().clone();
    let node_ns = NetNs::open(&node.netns).unwrap();
    let _rule = NoSocketDrop::install(Some(&node_ns), "bm", topo.vip, Some(80)).unwrap();
    let pin = std::path::PathBuf::from(format!("/run/switchyard/bpf/{prefix}"));
    let steering = {
        let _g = sw_ns.enter().unwrap();
        let mut cfg = EbpfConfig::new("eth0", &prefix);
        cfg.pin_dir = pin.clone();
        EbpfSteering::setup(&cfg, Some(&sw_ns)).expect("eBPF steering")
    };
    let target = Target {
        ip: node.ip,
        mac: parse_mac(&node.mac).unwrap(),
    };
    let vip = SocketAddr::V4(SocketAddrV4::new(topo.vip, 80));

    // node: restores and answers
    let (to_node, node_rx) = mpsc::channel::<(Vec<u8>, SocketAddr, SocketAddr)>();
    let node_thread = std::thread::spawn(move || {
        let _g = node_ns.enter().unwrap();
        // like a real node: a wildcard listener on the same port
        let _l = std::net::TcpListener::bind("0.0.0.0:80").unwrap();
        let mut restore_us = Vec::new();
        let mut restore_nowp_us = Vec::new();
        let mut k = 0usize;
        let mut decode_us = Vec::new();
        for (frame, client, local) in node_rx {
            let t0 = Instant::now();
            let (m, _) = Message::decode(&frame).unwrap().unwrap();
            let t1 = Instant::now();
            let Message::Create {
                transfer: Transfer::Repair(state),
                ..
            } = m
            else {
                panic!()
            };
            // every other handoff without the window probe
            k += 1;
            let probe = k % 2 == 1;
            let opts = repair::RestoreOptions {
                window_probe: probe,
            };
            let fd = match repair::restore_with(&state, local, client, opts) {
                Ok(r) if r.unsent.is_empty() => r.fd,
                Ok(r) => {
                    eprintln!("{client}: {} bytes left unsent by the dump", r.unsent.len());
                    std::process::exit(1);
                }
                Err(e) => {
                    eprintln!("restore failed for {client}: {e}");
                    std::process::exit(1);
                }
            };
            let t2 = Instant::now();
            decode_us.push((t1 - t0).as_secs_f64() * 1e6);
            if probe {
                restore_us.push((t2 - t1).as_secs_f64() * 1e6);
            } else {
                restore_nowp_us.push((t2 - t1).as_secs_f64() * 1e6);
            }
            let mut s = std::net::TcpStream::from(fd);
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .unwrap();
        }
        (restore_us, restore_nowp_us, decode_us)
    });

    let listener = {
        let _g = sw_ns.enter().unwrap();
        std::net::TcpListener::bind(vip).unwrap()
    };
    // client: one request per connection
    let client_ns = topo.netns("client0").unwrap();
    let client = std::thread::spawn(move || {
        let _g = client_ns.enter().unwrap();
        for i in 0..n {
            let mut s = std::net::TcpStream::connect_timeout(&vip, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("connect {i}: {e}"));
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut r = String::new();
            s.read_to_string(&mut r).unwrap();
            assert!(r.ends_with("ok"), "bad response {r:?}");
        }
    });

    // switch: accept, read, then steer + dump + close (measured)
    let (steer_us, dump_us, total_us, encode_us, close_us) = {
        let _g = sw_ns.enter().unwrap();
        let l = listener;
        let (mut steer_us, mut dump_us, mut total_us, mut encode_us) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut flows = Vec::new();
        let mut close_us = Vec::new();
        let mut frame = Vec::with_capacity(512);
        for _ in 0..n {
            let (mut s, peer) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let mut got = 0;
            while !buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                got += s.read(&mut buf[got..]).unwrap();
            }
            let local = s.local_addr().unwrap();
            let fd: OwnedFd = s.into();
            let flow = Flow::new(peer, local).unwrap();
            let t0 = Instant::now();
            steering.insert(&flow, &target).unwrap();
            let t1 = Instant::now();
            let state: RepairState = repair::dump(fd.as_fd()).expect("dump");
            let tc = Instant::now();
            drop(fd);
            let t2 = Instant::now();
            close_us.push((t2 - tc).as_secs_f64() * 1e6);
            frame.clear();
            Message::Create {
                id: 1,
                client: peer,
                local,
                transfer: Transfer::Repair(Box::new(state)),
                preread: buf[..got].to_vec(),
                route: switchyard_handoff::proto::Routing::Own,
            }
            .encode(&mut frame)
            .unwrap();
            let t3 = Instant::now();
            steer_us.push((t1 - t0).as_secs_f64() * 1e6);
            dump_us.push((t2 - t1).as_secs_f64() * 1e6);
            total_us.push((t2 - t0).as_secs_f64() * 1e6);
            encode_us.push((t3 - t2).as_secs_f64() * 1e6);
            to_node.send((frame.clone(), peer, local)).unwrap();
            flows.push(flow);
        }
        drop(to_node);
        client.join().expect("client");
        for f in &flows {
            let _ = steering.remove(f);
        }
        (steer_us, dump_us, total_us, encode_us, close_us)
    };
    let (restore_us, restore_nowp_us, decode_us) = node_thread.join().unwrap();
    EbpfSteering::teardown(Some(&sw_ns), "eth0", &pin);
    let line = |name: &str, mut v: Vec<f64>| {
        let med = pct(&mut v, 0.5);
        let p99 = pct(&mut v, 0.99);
        println!("{name:<44} median {med:>7.1} µs   p99 {p99:>7.1} µs");
        med
    };
    println!(
        "handoff micro-benchmark: {n} handoffs, client → switch → node (namespaces, eBPF steering)"
    );
    line("switch: eBPF steering insert", steer_us);
    line("switch: TCP_REPAIR dump + close", dump_us);
    line("switch:   of which close (repair mode)", close_us);
    let sw = line("switch side total (steer + dump + close)", total_us);
    line("switch: encode Create frame", encode_us);
    line("node: decode Create frame", decode_us);
    let nd = line("node side: restore, window probe (default)", restore_us);
    let nd2 = line("node side: restore, no window probe", restore_nowp_us);
    println!(
        "targets (median): switch <= 15 µs: {}, node <= 40 µs: {} (default), {} (no probe)",
        if sw <= 15.0 { "met" } else { "NOT met" },
        if nd <= 40.0 { "met" } else { "NOT met" },
        if nd2 <= 40.0 { "met" } else { "NOT met" }
    );
}
