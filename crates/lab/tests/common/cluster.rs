//! A mini switch and mini nodes, each on a thread inside its lab namespace,
//! that use the crate exactly as the real switch and node will: the switch
//! accepts, reads the request head, installs the steering entry, dumps the
//! socket and sends `Create` over a persistent TCP control connection; a node
//! restores, answers `Accepted`, serves the client directly and reports
//! `Closed`, or dumps again and sends `HandBack` (multiple handoff).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use switchyard_handoff::fdpass::{MsgReader, MsgWriter};
use switchyard_handoff::netns::NetNs;
use switchyard_handoff::proto::{DropReason, Message, Transfer};
use switchyard_handoff::repair;
use switchyard_handoff::steer::ebpf::{EbpfConfig, EbpfSteering};
use switchyard_handoff::steer::nft::NftSteering;
use switchyard_handoff::steer::{parse_mac, Flow, NoSocketDrop, Steering, Target};
use switchyard_lab::Role;

use super::{big_body, find, LabGuard};

pub const CONTROL_PORT: u16 = 7000;
pub const HTTP_PORT: u16 = 80;
/// How long the mini switch waits for a node's `Accepted` or `Drop`.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(5);

/// Steering backend of the mini switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Ebpf,
    Nft,
}

/// Options of a mini cluster.
#[derive(Debug, Clone)]
pub struct Opts {
    pub nodes: usize,
    pub backend: Backend,
    /// How long the switch keeps a steering entry after `Closed`
    /// (the FIN exchange still needs it).
    pub linger: Duration,
    /// Nodes that answer every `Create` with `Drop`.
    pub refusing_nodes: Vec<usize>,
    /// Nodes leave repair mode with a window probe (the default) or without.
    pub window_probe: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            nodes: 2,
            backend: Backend::Ebpf,
            linger: Duration::from_millis(500),
            refusing_nodes: vec![],
            window_probe: true,
        }
    }
}

/// What the mini switch counted.
#[derive(Debug, Default)]
pub struct Stats {
    pub handoffs: AtomicU64,
    pub hand_backs: AtomicU64,
    pub fallbacks: AtomicU64,
    /// Each fallback's reason, client and detail (a node's `Drop` detail,
    /// an errno).
    pub fallback_reasons: Mutex<Vec<(Fallback, SocketAddr, String)>>,
    pub closed: AtomicU64,
    pub dump_ns: Mutex<Vec<u64>>,
    /// Nodes whose control connection ended (after their entries went).
    pub nodes_lost: Mutex<Vec<usize>>,
    /// Signalled after every count, for [`Cluster::wait_for`].
    changed: Condvar,
    changed_lock: Mutex<()>,
}

/// Why the mini switch kept a connection and served it itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// No node was up.
    NoNode,
    /// `TCP_REPAIR` dump failed on the switch.
    DumpFailed,
    /// The node answered `Drop` with this reason.
    Dropped(DropReason),
    /// Neither `Accepted` nor `Drop` within the handoff timeout.
    Timeout,
    /// The control connection to the node ended before its answer.
    LinkLost,
}

impl Stats {
    /// Counts one on `counter` and wakes the waiters of [`Cluster::wait_for`].
    fn count(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        self.notify();
    }

    /// Wakes the waiters of [`Cluster::wait_for`] after a change.
    fn notify(&self) {
        // Taking the lock orders this after a waiter's check: a waiter that
        // found the old state is already waiting when the signal comes.
        let _g = self.changed_lock.lock().unwrap();
        self.changed.notify_all();
    }

    fn fallback(&self, why: Fallback, client: SocketAddr, detail: String) {
        dbg_log(format!("switch: fallback {why:?} {client}: {detail}"));
        self.fallback_reasons
            .lock()
            .unwrap()
            .push((why, client, detail));
        self.count(&self.fallbacks);
    }

    /// The fallbacks so far, with their reasons and clients.
    pub fn fallbacks_with_reasons(&self) -> Vec<(Fallback, SocketAddr, String)> {
        self.fallback_reasons.lock().unwrap().clone()
    }
}

pub struct Cluster {
    pub lab: LabGuard,
    pub stats: Arc<Stats>,
    pub vip: SocketAddr,
    pub steering: Arc<dyn Steering>,
    node_kill: Vec<Option<oneshot::Sender<()>>>,
    /// The nodes' threads (by index), then the switch's.
    threads: Vec<Option<std::thread::JoinHandle<()>>>,
    stop: Option<oneshot::Sender<()>>,
    drop_rules: Vec<(String, NoSocketDrop)>,
    backend: Backend,
}

impl Cluster {
    /// Waits until `f` holds (the switch counts an `Accepted` after the
    /// client may already have its response): rechecks after each count.
    pub fn wait_for(&self, what: &str, f: impl Fn(&Stats) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut g = self.stats.changed_lock.lock().unwrap();
        while !f(&self.stats) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out waiting for {what}: {:?}",
                self.stats
            );
            g = self.stats.changed.wait_timeout(g, left).unwrap().0;
        }
    }

    pub fn start(opts: Opts) -> Cluster {
        let lab = LabGuard::new(opts.nodes, 1, None);
        let topo = lab.topo.clone();
        let vip = SocketAddr::V4(SocketAddrV4::new(topo.vip, HTTP_PORT));
        let mut drop_rules = Vec::new();
        let mut node_kill = Vec::new();
        let mut threads = Vec::new();
        // Nodes first: their control listeners must be up before the switch.
        for (i, h) in topo.hosts_of(Role::Node).enumerate() {
            let ns = NetNs::open(&h.netns).unwrap();
            let rule = NoSocketDrop::install(Some(&ns), "t", topo.vip, Some(HTTP_PORT))
                .expect("node drop rule");
            drop_rules.push((h.netns.clone(), rule));
            let (kill_tx, kill_rx) = oneshot::channel();
            node_kill.push(Some(kill_tx));
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let ip = h.ip;
            let name = h.name.clone();
            let refuse = opts.refusing_nodes.contains(&i);
            let ropts = repair::RestoreOptions {
                window_probe: opts.window_probe,
            };
            threads.push(Some(std::thread::spawn(move || {
                let _g = ns.enter().unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(node_main(name, ip, refuse, ropts, kill_rx, ready_tx));
                rt.shutdown_background();
            })));
            ready_rx
                .recv_timeout(Duration::from_secs(10))
                .expect("node ready");
        }
        let sw = topo.host("switch").unwrap().clone();
        let sw_ns = NetNs::open(&sw.netns).unwrap();
        let steering: Arc<dyn Steering> = {
            let _g = sw_ns.enter().unwrap();
            match opts.backend {
                Backend::Ebpf => {
                    let mut cfg = EbpfConfig::new("eth0", &topo.prefix);
                    cfg.pin_dir = format!("/run/switchyard/bpf/{}", topo.prefix).into();
                    Arc::new(EbpfSteering::setup(&cfg, Some(&sw_ns)).expect("eBPF steering setup"))
                }
                Backend::Nft => Arc::new(
                    NftSteering::setup(Some(&sw_ns), "eth0", "t").expect("nft steering setup"),
                ),
            }
        };
        let nodes: Vec<(Ipv4Addr, [u8; 6])> = topo
            .hosts_of(Role::Node)
            .map(|h| (h.ip, parse_mac(&h.mac).unwrap()))
            .collect();
        let stats = Arc::new(Stats::default());
        let (stop, stop_rx) = oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        {
            let steering = steering.clone();
            let stats = stats.clone();
            let linger = opts.linger;
            threads.push(Some(std::thread::spawn(move || {
                let _g = sw_ns.enter().unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(switch_main(
                    vip, nodes, steering, stats, stop_rx, linger, ready_tx,
                ));
                rt.shutdown_background();
            })));
        }
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("switch ready");
        Cluster {
            lab,
            stats,
            vip,
            steering,
            node_kill,
            threads,
            stop: Some(stop),
            drop_rules,
            backend: opts.backend,
        }
    }

    /// Stops node `i` abruptly: its tasks and sockets go away as if its
    /// process had been killed. Returns once they are gone and the switch
    /// has seen its control connection end.
    pub fn kill_node(&mut self, i: usize) {
        if let Some(tx) = self.node_kill[i].take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.threads[i].take() {
            t.join().expect("node thread");
        }
        self.wait_for("the switch to see the node gone", |s| {
            s.nodes_lost.lock().unwrap().contains(&i)
        });
    }

    pub fn client_ns(&self) -> NetNs {
        self.lab.ns("client0")
    }

    pub fn switch_ns(&self) -> NetNs {
        self.lab.ns("switch")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        for k in self.node_kill.iter_mut() {
            if let Some(tx) = k.take() {
                let _ = tx.send(());
            }
        }
        for t in self.threads.drain(..).flatten() {
            let _ = t.join();
        }
        let sw_ns = self.lab.ns("switch");
        match self.backend {
            Backend::Ebpf => EbpfSteering::teardown(
                Some(&sw_ns),
                "eth0",
                std::path::Path::new(&format!("/run/switchyard/bpf/{}", self.lab.topo.prefix)),
            ),
            Backend::Nft => NftSteering::teardown(Some(&sw_ns), "t"),
        }
        for (ns, rule) in self.drop_rules.drain(..) {
            if let Ok(ns) = NetNs::open(&ns) {
                let _ = rule.remove(Some(&ns));
            }
        }
    }
}

// ---------------------------------------------------------------- HTTP

pub enum ServeEnd {
    Closed {
        requests: u64,
        bytes: u64,
    },
    Moved {
        fd: OwnedFd,
        rest: Vec<u8>,
        requests: u64,
        bytes: u64,
    },
}

fn parse_head(buf: &[u8]) -> Option<(String, bool, usize)> {
    let end = find(buf, b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.lines();
    let first = lines.next().unwrap_or("");
    let path = first.split_whitespace().nth(1).unwrap_or("/").to_string();
    let close = lines.any(|l| {
        l.to_ascii_lowercase().starts_with("connection:")
            && l.to_ascii_lowercase().contains("close")
    });
    Some((path, !close, end + 4))
}

fn body_for(path: &str, name: &str) -> Vec<u8> {
    if path == "/big" {
        big_body()
    } else if let Some(k) = path.strip_prefix("/n/") {
        format!("resp {k} from {name}\n").into_bytes()
    } else if path.starts_with("/move") {
        format!("{path} served by {name}\n").into_bytes()
    } else {
        format!("hello from {name}\n").into_bytes()
    }
}

/// Serves HTTP on `s`; `rest` holds request bytes already read. A request
/// for `/move…` makes the server give the connection away after answering.
pub async fn serve(mut s: TcpStream, mut buf: Vec<u8>, name: &str, can_move: bool) -> ServeEnd {
    let mut requests = 0u64;
    let mut bytes = 0u64;
    let mut tmp = vec![0u8; 16 * 1024];
    loop {
        while let Some((path, keep, used)) = parse_head(&buf) {
            buf.drain(..used);
            let body = body_for(&path, name);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Served-By: {name}\r\n{}\r\n",
                body.len(),
                if keep { "" } else { "Connection: close\r\n" }
            );
            let mut out = head.into_bytes();
            out.extend_from_slice(&body);
            if s.write_all(&out).await.is_err() {
                return ServeEnd::Closed { requests, bytes };
            }
            requests += 1;
            bytes += out.len() as u64;
            if !keep {
                let _ = s.shutdown().await;
                return ServeEnd::Closed { requests, bytes };
            }
            if can_move && path.starts_with("/move") {
                let std = s.into_std().unwrap();
                let fd: OwnedFd = std.into();
                return ServeEnd::Moved {
                    fd,
                    rest: std::mem::take(&mut buf),
                    requests,
                    bytes,
                };
            }
        }
        let r = tokio::time::timeout(Duration::from_secs(15), s.read(&mut tmp)).await;
        match r {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&tmp[..n]),
            _ => return ServeEnd::Closed { requests, bytes },
        }
    }
}

// ---------------------------------------------------------------- node

async fn node_main(
    name: String,
    ip: Ipv4Addr,
    refuse: bool,
    ropts: repair::RestoreOptions,
    kill: oneshot::Receiver<()>,
    ready: std::sync::mpsc::Sender<()>,
) {
    let l = TcpListener::bind((ip, CONTROL_PORT)).await.unwrap();
    // Like the real node: an HTTP listener on every address, the VIP
    // included, which restored sockets bound to VIP:80 must coexist with.
    let http = {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_reuse_address(true).unwrap();
        s.bind(&SocketAddr::from(([0, 0, 0, 0], HTTP_PORT)).into())
            .unwrap();
        s.listen(16).unwrap();
        s
    };
    let _ = ready.send(());
    let run = async move {
        let Ok((ctl, _)) = l.accept().await else {
            return;
        };
        ctl.set_nodelay(true).unwrap();
        let (r, w) = ctl.into_split();
        let mut reader = MsgReader::new(r);
        let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
        let mut writer = MsgWriter::new(w);
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if writer.send(&m).await.is_err() {
                    break;
                }
            }
        });
        writer_hello(&tx, &name);
        while let Ok(Some(m)) = reader.recv().await {
            let Message::Create {
                id,
                client,
                local,
                transfer: Transfer::Repair(state),
                preread,
                ..
            } = m
            else {
                continue;
            };
            if refuse {
                let _ = tx.send(Message::Drop {
                    id,
                    reason: DropReason::Busy,
                    detail: "refusing (test)".into(),
                });
                continue;
            }
            dbg_log(format!(
                "{name}: create {id} {client} -> {local} state {:?}",
                (
                    state.snd_seq,
                    state.rcv_seq,
                    state.mss,
                    state.options,
                    state.window,
                    state.recv_queue.len(),
                    state.send_queue.len()
                )
            ));
            match repair::restore_with(&state, local, client, ropts) {
                Err(e) => {
                    dbg_log(format!("{name}: restore failed: {e}"));
                    // What the node's kernel still holds for this 4-tuple
                    // (an earlier connection from the same client port).
                    let held = std::process::Command::new("ss")
                        .args(["-tanoei", "dst", &client.to_string()])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_else(|e| format!("ss: {e}"));
                    let _ = tx.send(Message::Drop {
                        id,
                        reason: DropReason::RestoreFailed,
                        detail: format!("{name}: {e}; sockets to {client}: {held}"),
                    });
                }
                Ok(restored) => {
                    let _ = tx.send(Message::Accepted { id });
                    let std = std::net::TcpStream::from(restored.fd);
                    std.set_nonblocking(true).unwrap();
                    let mut s = TcpStream::from_std(std).unwrap();
                    let unsent = restored.unsent;
                    let tx = tx.clone();
                    let name = name.clone();
                    tokio::spawn(async move {
                        if !unsent.is_empty() {
                            use tokio::io::AsyncWriteExt;
                            if s.write_all(&unsent).await.is_err() {
                                return;
                            }
                        }
                        match serve(s, preread, &name, true).await {
                            ServeEnd::Closed { requests, bytes } => {
                                let _ = tx.send(Message::Closed {
                                    id,
                                    requests,
                                    bytes,
                                });
                            }
                            ServeEnd::Moved {
                                fd,
                                rest,
                                requests,
                                bytes,
                            } => {
                                // Hand back once everything sent is acknowledged.
                                let (fd, acked) = tokio::task::spawn_blocking(move || {
                                    let a = repair::wait_acked(fd.as_fd(), Duration::from_secs(5));
                                    (fd, a)
                                })
                                .await
                                .unwrap();
                                match repair::dump(fd.as_fd()) {
                                    Ok(state) => {
                                        dbg_log(format!(
                                            "{name}: hand-back {id} acked {acked:?} state {:?}",
                                            (
                                                state.snd_seq,
                                                state.rcv_seq,
                                                state.window,
                                                state.recv_queue.len(),
                                                state.send_queue.len(),
                                                rest.len()
                                            )
                                        ));
                                        drop(fd); // repair mode: nothing is sent
                                        let _ = tx.send(Message::HandBack {
                                            id,
                                            transfer: Transfer::Repair(Box::new(state)),
                                            preread: rest,
                                            requests,
                                            bytes,
                                        });
                                    }
                                    Err(e) => {
                                        eprintln!("{name}: dump for hand-back failed: {e}");
                                        let _ = tx.send(Message::Closed {
                                            id,
                                            requests,
                                            bytes,
                                        });
                                    }
                                }
                            }
                        }
                    });
                }
            }
        }
    };
    tokio::select! {
        _ = run => {}
        _ = kill => {}
    }
    drop(http);
}

fn writer_hello(tx: &mpsc::UnboundedSender<Message>, name: &str) {
    let _ = tx.send(Message::Hello {
        name: name.to_string(),
    });
}

// ---------------------------------------------------------------- switch

struct Conn {
    flow: Flow,
    node: usize,
    client: SocketAddr,
    local: SocketAddr,
}

/// The node's answer to a `Create`: `Ok` for `Accepted`, else its `Drop`.
type Answer = Result<(), (DropReason, String)>;
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>;

struct Sw {
    nodes: Vec<(Ipv4Addr, [u8; 6])>,
    up: Vec<AtomicBool>,
    writers: Vec<mpsc::UnboundedSender<Message>>,
    steering: Arc<dyn Steering>,
    stats: Arc<Stats>,
    conns: Mutex<HashMap<u64, Conn>>,
    pending: Pending,
    linger: Duration,
    next: AtomicU64,
}

impl Sw {
    fn target(&self, i: usize) -> Target {
        Target {
            ip: self.nodes[i].0,
            mac: self.nodes[i].1,
        }
    }

    fn pick(&self, after: usize) -> Option<usize> {
        let n = self.nodes.len();
        (1..=n)
            .map(|k| (after + k) % n)
            .find(|&i| self.up[i].load(Ordering::SeqCst))
    }

    fn remove_later(self: &Arc<Self>, flow: Flow) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(me.linger).await;
            let _ = me.steering.remove(&flow);
        });
    }
}

async fn switch_main(
    vip: SocketAddr,
    nodes: Vec<(Ipv4Addr, [u8; 6])>,
    steering: Arc<dyn Steering>,
    stats: Arc<Stats>,
    mut stop: oneshot::Receiver<()>,
    linger: Duration,
    ready: std::sync::mpsc::Sender<()>,
) {
    let listener = {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_reuse_address(true).unwrap();
        s.bind(&vip.into()).unwrap();
        s.listen(4096).unwrap();
        s.set_nonblocking(true).unwrap();
        TcpListener::from_std(s.into()).unwrap()
    };
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for (ip, _) in &nodes {
        // The nodes listen before the switch starts (`Cluster::start`).
        let ctl = TcpStream::connect((*ip, CONTROL_PORT))
            .await
            .unwrap_or_else(|e| panic!("control connection to {ip}: {e}"));
        ctl.set_nodelay(true).unwrap();
        let (r, w) = ctl.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
        let mut writer = MsgWriter::new(w);
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if writer.send(&m).await.is_err() {
                    break;
                }
            }
        });
        let _ = tx.send(Message::Hello {
            name: "switch".into(),
        });
        writers.push(tx);
        readers.push(MsgReader::new(r));
    }
    let sw = Arc::new(Sw {
        up: nodes.iter().map(|_| AtomicBool::new(true)).collect(),
        nodes,
        writers,
        steering,
        stats,
        conns: Mutex::new(HashMap::new()),
        pending: Arc::new(Mutex::new(HashMap::new())),
        linger,
        next: AtomicU64::new(1),
    });
    for (i, reader) in readers.into_iter().enumerate() {
        tokio::spawn(control_reader(sw.clone(), i, reader));
    }
    let _ = ready.send(());
    let mut rr = 0usize;
    loop {
        let (s, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => continue,
            },
            _ = &mut stop => break,
        };
        rr += 1;
        let sw = sw.clone();
        let start = rr;
        tokio::spawn(async move { handle_client(sw, s, peer, start).await });
    }
}

async fn control_reader(
    sw: Arc<Sw>,
    i: usize,
    mut reader: MsgReader<tokio::net::tcp::OwnedReadHalf>,
) {
    loop {
        let m = match reader.recv().await {
            Ok(Some(m)) => m,
            _ => break,
        };
        match m {
            Message::Accepted { id } => {
                if let Some(tx) = sw.pending.lock().unwrap().remove(&id) {
                    let _ = tx.send(Ok(()));
                }
            }
            Message::Drop { id, reason, detail } => {
                if let Some(tx) = sw.pending.lock().unwrap().remove(&id) {
                    let _ = tx.send(Err((reason, detail)));
                }
            }
            Message::Closed { id, .. } => {
                sw.stats.count(&sw.stats.closed);
                if let Some(c) = sw.conns.lock().unwrap().remove(&id) {
                    sw.remove_later(c.flow);
                }
            }
            Message::HandBack {
                id,
                transfer,
                preread,
                ..
            } => {
                sw.stats.count(&sw.stats.hand_backs);
                let next = sw.pick(i);
                let mut conns = sw.conns.lock().unwrap();
                let Some(c) = conns.get_mut(&id) else {
                    continue;
                };
                let Some(n) = next else { continue };
                // Repoint the 4-tuple in one step, then hand it on.
                sw.steering.insert(&c.flow, &sw.target(n)).expect("repoint");
                dbg_log(format!(
                    "switch: hand-back {id} from node {i} repointed to node {n}"
                ));
                c.node = n;
                let _ = sw.writers[n].send(Message::Create {
                    id,
                    client: c.client,
                    local: c.local,
                    transfer,
                    preread,
                    route: switchyard_handoff::proto::Routing::Own,
                });
                sw.stats.count(&sw.stats.handoffs);
            }
            _ => {}
        }
    }
    // The node is gone: its connections are lost; remove their entries so the
    // clients' next packets reach the switch (and get a reset) at once.
    sw.up[i].store(false, Ordering::SeqCst);
    let gone: Vec<Flow> = {
        let mut conns = sw.conns.lock().unwrap();
        let ids: Vec<u64> = conns
            .iter()
            .filter(|(_, c)| c.node == i)
            .map(|(id, _)| *id)
            .collect();
        ids.iter()
            .filter_map(|id| conns.remove(id))
            .map(|c| c.flow)
            .collect()
    };
    for f in gone {
        let _ = sw.steering.remove(&f);
    }
    sw.stats.nodes_lost.lock().unwrap().push(i);
    sw.stats.notify();
}

async fn handle_client(sw: Arc<Sw>, mut s: TcpStream, peer: SocketAddr, rr: usize) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    // Read one whole request head.
    loop {
        if find(&buf, b"\r\n\r\n").is_some() {
            break;
        }
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut tmp)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&tmp[..n]),
            _ => return,
        }
    }
    let local = s.local_addr().unwrap();
    let Some(node) = sw.pick(rr) else {
        sw.stats.fallback(Fallback::NoNode, peer, String::new());
        serve(s, buf, "switch", false).await;
        return;
    };
    let flow = Flow::new(peer, local).unwrap();
    dbg_log(format!("switch: request from {peer} -> node {node}"));
    let t0 = Instant::now();
    // Steering entry first, then the dump.
    sw.steering
        .insert(&flow, &sw.target(node))
        .expect("steering insert");
    let std = s.into_std().unwrap();
    let fd: OwnedFd = std.into();
    let state = match repair::dump(fd.as_fd()) {
        Ok(st) => st,
        Err(e) => {
            let _ = sw.steering.remove(&flow);
            sw.stats.fallback(Fallback::DumpFailed, peer, e.to_string());
            let s = TcpStream::from_std(std::net::TcpStream::from(fd)).unwrap();
            serve(s, buf, "switch", false).await;
            return;
        }
    };
    sw.stats
        .dump_ns
        .lock()
        .unwrap()
        .push(t0.elapsed().as_nanos() as u64);
    let id = sw.next.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    sw.pending.lock().unwrap().insert(id, tx);
    sw.conns.lock().unwrap().insert(
        id,
        Conn {
            flow,
            node,
            client: peer,
            local,
        },
    );
    let _ = sw.writers[node].send(Message::Create {
        id,
        client: peer,
        local,
        transfer: Transfer::Repair(Box::new(state)),
        preread: buf.clone(),
        route: switchyard_handoff::proto::Routing::Own,
    });
    let answer = tokio::time::timeout(HANDOFF_TIMEOUT, rx).await;
    dbg_log(format!("switch: id {id} answer {answer:?}"));
    let (why, detail) = match answer {
        Ok(Ok(Ok(()))) => {
            sw.stats.count(&sw.stats.handoffs);
            drop(fd); // still in repair mode: closing sends nothing
            return;
        }
        Ok(Ok(Err((reason, detail)))) => (Fallback::Dropped(reason), detail),
        Ok(Err(_)) => (Fallback::LinkLost, String::new()),
        Err(_) => (
            Fallback::Timeout,
            format!("no answer in {HANDOFF_TIMEOUT:?}"),
        ),
    };
    // The node refused or failed: take the connection back and relay.
    sw.pending.lock().unwrap().remove(&id);
    sw.conns.lock().unwrap().remove(&id);
    let _ = sw.steering.remove(&flow);
    repair::leave_repair(fd.as_fd()).expect("leave repair mode");
    sw.stats.fallback(why, peer, detail);
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true).unwrap();
    let s = TcpStream::from_std(std).unwrap();
    serve(s, buf, "switch", false).await;
}

pub fn dbg_log(s: String) {
    if std::env::var_os("SY_TEST_DEBUG").is_some() {
        eprintln!(
            "[{:?}] {s}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros()
                % 100_000_000
        );
    }
}
