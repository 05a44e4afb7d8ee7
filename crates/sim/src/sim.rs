//! The cluster model: clients, front end, nodes (CPU, disk, cache) and the mechanisms, driven by
//! the event queue and by a real [`switchyard_policy::Policy`].

use std::collections::VecDeque;
use std::time::Duration;

use switchyard_cache::Cache;
use switchyard_policy::{
    build, ConnId, Decision, LoadReport, NodeId, NodeSpec, Outcome, Policy, PolicyKind, Reject,
    Request,
};

use crate::config::{us_to_ns, Nanos, Pipelining, RequestDistribution, SimConfig};
use crate::engine::EventQueue;
use crate::report::{NodeResult, RunResult};
use crate::workload::SimWorkload;
use crate::SimError;

/// One finished request, as reported to an observer of [`simulate_observed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Index of the request in the workload (connection order).
    pub request: usize,
    /// Node that served it.
    pub node: u32,
    /// Simulated time of completion.
    pub time: Nanos,
    /// Whether it was served from the node's memory cache.
    pub hit: bool,
}

/// Runs `workload` on the cluster described by `cfg`.
pub fn simulate(cfg: &SimConfig, workload: &SimWorkload) -> Result<RunResult, SimError> {
    simulate_observed(cfg, workload, |_| {})
}

/// Like [`simulate`], calling `observe` for every finished request, in completion order.
pub fn simulate_observed(
    cfg: &SimConfig,
    workload: &SimWorkload,
    observe: impl FnMut(Completion),
) -> Result<RunResult, SimError> {
    cfg.validate()?;
    let mut pcfg = cfg.policy.clone();
    if pcfg.name == PolicyKind::ExtLard {
        pcfg.mechanism = match cfg.mechanism {
            RequestDistribution::Handoff
            | RequestDistribution::Ideal
            | RequestDistribution::Relay => switchyard_policy::PersistentRouting::Handoff,
            _ => switchyard_policy::PersistentRouting::Forward,
        };
    }
    let policy = build(&pcfg)?;
    Sim::new(cfg, workload, policy, observe).run()
}

/// Like [`simulate`] with a policy built by the caller (for policies outside
/// `switchyard-policy`, such as the pessimistic one of the §5 analysis). The policy is
/// initialized by the simulator.
pub fn simulate_with_policy(
    cfg: &SimConfig,
    workload: &SimWorkload,
    policy: Box<dyn Policy>,
) -> Result<RunResult, SimError> {
    cfg.validate()?;
    Sim::new(cfg, workload, policy, |_| {}).run()
}

const NO_OWNER: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
enum Ev {
    Cpu(u32),
    Disk(u32),
    Front,
}

#[derive(Debug, Clone, Copy)]
struct Job {
    dur: Nanos,
    owner: u32,
}

/// A FIFO server (a CPU or a disk): the job at the head is in service.
#[derive(Debug, Default)]
struct Server {
    queue: VecDeque<Job>,
    started: Nanos,
    busy_ns: Nanos,
}

impl Server {
    fn busy_at(&self, now: Nanos) -> Nanos {
        if self.queue.is_empty() {
            self.busy_ns
        } else {
            self.busy_ns + (now - self.started)
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct NodeCounters {
    requests: u64,
    hits: u64,
    misses: u64,
    bytes: u64,
    connections: u64,
    handoffs_in: u64,
    forwards_served: u64,
    forwards_relayed: u64,
}

struct Node {
    cpu: Server,
    disk: Server,
    cache: Cache<u32, ()>,
    active_connections: u32,
    c: NodeCounters,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Front,
    Cpu,
    Disk,
    Transmit,
    Forward,
    Relay,
}

/// A request under way.
#[derive(Debug, Clone, Copy)]
struct Req {
    /// Client slot of its connection.
    slot: u32,
    /// Index in the workload.
    req: u32,
    target: u32,
    size: u64,
    decision: Decision,
    /// Node that produces the response.
    serve: u32,
    /// Node that relays it (back-end forwarding).
    relay_by: Option<u32>,
    /// Add the target to the serving node's cache after a disk read.
    cache: bool,
    hit: bool,
    /// Extra CPU on the serving node before the request (connection setup, handoff).
    pre_ns: Nanos,
    /// The connection's first request.
    first: bool,
    stage: Stage,
}

/// A client slot of the closed loop and the connection it is running.
struct Active {
    /// Workload connection, `usize::MAX` when the slot has nothing left to do.
    conn: usize,
    id: ConnId,
    /// Node holding the connection (not used by the relaying front end).
    handler: Option<u32>,
    batch: usize,
    batch_last: usize,
    /// Next request of the batch to submit to the policy, and the batch's end.
    next_req: usize,
    req_end: usize,
    /// Requests placed by the policy and not started yet.
    decided: VecDeque<(u32, Decision)>,
    /// Requests started and not finished.
    outstanding: u32,
    /// Single handoff: the connection's one decision, and what to report for it.
    single: Option<Decision>,
    conn_bytes: u64,
    first_hit: bool,
    waiting: bool,
    batch_arrival: Nanos,
    started: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    completed: u64,
    response_ns: u128,
}

#[derive(Clone)]
struct Snapshot {
    time: Nanos,
    totals: Totals,
    nodes: Vec<(NodeCounters, Nanos, Nanos)>,
    front_busy: Nanos,
}

struct Costs {
    connect: Nanos,
    teardown: Nanos,
    request: Nanos,
    per_512: Nanos,
    handoff: Nanos,
    fwd_request: Nanos,
    fwd_512: Nanos,
    seek: Nanos,
    per_4k: Nanos,
    extent: u64,
    extent_seek: Nanos,
    fe_conn: Nanos,
    fe_request: Nanos,
    fe_handoff: Nanos,
    fe_512: Nanos,
    fe_free: bool,
}

fn blocks(size: u64, unit: u64) -> u64 {
    size.div_ceil(unit)
}

impl Costs {
    fn new(cfg: &SimConfig) -> Self {
        let c = &cfg.cpu;
        let d = &cfg.disk;
        let f = &cfg.frontend;
        let relay = cfg.mechanism == RequestDistribution::Relay;
        Costs {
            // A relaying front end keeps persistent connections to the nodes: they see no
            // client connections.
            connect: if relay { 0 } else { us_to_ns(c.connect_us) },
            teardown: if relay { 0 } else { us_to_ns(c.teardown_us) },
            request: us_to_ns(c.request_us),
            per_512: us_to_ns(c.transmit_per_512_us),
            handoff: match cfg.mechanism {
                RequestDistribution::Ideal => 0,
                _ => us_to_ns(c.handoff_us),
            },
            fwd_request: us_to_ns(c.forward_request_us),
            fwd_512: us_to_ns(c.forward_per_512_us),
            seek: us_to_ns(d.seek_us),
            per_4k: us_to_ns(d.per_4k_us),
            extent: d.extent_bytes,
            extent_seek: us_to_ns(d.extent_seek_us),
            fe_conn: us_to_ns(f.connection_us),
            fe_request: us_to_ns(f.request_us),
            fe_handoff: if cfg.mechanism == RequestDistribution::Ideal {
                0
            } else {
                us_to_ns(f.handoff_us)
            },
            fe_512: if relay {
                us_to_ns(f.relay_per_512_us)
            } else {
                0
            },
            fe_free: f.is_free(),
        }
    }

    fn transmit(&self, size: u64) -> Nanos {
        blocks(size, 512) * self.per_512
    }

    fn disk_read(&self, size: u64) -> Nanos {
        let extents = blocks(size.max(1), self.extent) - 1;
        self.seek + blocks(size, 4096) * self.per_4k + extents * self.extent_seek
    }

    fn forward(&self, size: u64) -> Nanos {
        self.fwd_request + blocks(size, 512) * self.fwd_512
    }
}

struct Sim<'a, F> {
    cfg: &'a SimConfig,
    w: &'a SimWorkload,
    policy: Box<dyn Policy>,
    q: EventQueue<Ev>,
    nodes: Vec<Node>,
    front: Server,
    slots: Vec<Active>,
    reqs: Vec<Req>,
    free_reqs: Vec<u32>,
    next_conn: usize,
    waiting: VecDeque<usize>,
    retrying: bool,
    ready: VecDeque<u32>,
    costs: Costs,
    totals: Totals,
    snapshot: Option<Snapshot>,
    end: Option<Snapshot>,
    observe: F,
    error: Option<SimError>,
}

fn dur(ns: Nanos) -> Duration {
    Duration::from_nanos(ns)
}

impl<'a, F: FnMut(Completion)> Sim<'a, F> {
    fn new(cfg: &'a SimConfig, w: &'a SimWorkload, policy: Box<dyn Policy>, observe: F) -> Self {
        let nodes = (0..cfg.nodes)
            .map(|_| {
                let mut cache = Cache::with_kind(cfg.cache_bytes, cfg.cache_policy);
                cache.set_max_object_bytes(cfg.cache_max_object_bytes);
                Node {
                    cpu: Server::default(),
                    disk: Server::default(),
                    cache,
                    active_connections: 0,
                    c: NodeCounters::default(),
                }
            })
            .collect();
        Sim {
            cfg,
            w,
            policy,
            q: EventQueue::new(),
            nodes,
            front: Server::default(),
            slots: Vec::new(),
            reqs: Vec::new(),
            free_reqs: Vec::new(),
            next_conn: 0,
            waiting: VecDeque::new(),
            retrying: false,
            ready: VecDeque::new(),
            costs: Costs::new(cfg),
            totals: Totals::default(),
            snapshot: None,
            end: None,
            observe,
            error: None,
        }
    }

    fn now(&self) -> Nanos {
        self.q.now()
    }

    fn run(mut self) -> Result<RunResult, SimError> {
        let specs: Vec<NodeSpec> = (0..self.cfg.nodes).map(NodeSpec::new).collect();
        self.policy.init(&specs, Duration::ZERO)?;
        let population = (self.cfg.client_population() as usize).min(self.w.connections());
        for s in 0..population {
            self.slots.push(Active {
                conn: usize::MAX,
                id: ConnId(0),
                handler: None,
                batch: 0,
                batch_last: 0,
                next_req: 0,
                req_end: 0,
                decided: VecDeque::new(),
                outstanding: 0,
                single: None,
                conn_bytes: 0,
                first_hit: false,
                waiting: false,
                batch_arrival: 0,
                started: false,
            });
            self.start_connection(s);
        }
        self.drain_ready();
        while let Some((_, ev)) = self.q.pop() {
            if self.error.is_some() {
                break;
            }
            let owner = match ev {
                Ev::Cpu(n) => self.finish_job(Some(n), false),
                Ev::Disk(n) => self.finish_job(Some(n), true),
                Ev::Front => self.finish_job(None, false),
            };
            if owner != NO_OWNER {
                self.step(owner as usize);
            }
            self.drain_ready();
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if (self.totals.completed as usize) < self.w.requests() {
            return Err(SimError::Stalled {
                completed: self.totals.completed,
                requests: self.w.requests() as u64,
            });
        }
        Ok(self.result())
    }

    // ---- servers -------------------------------------------------------------------------

    fn server(&mut self, node: Option<u32>, disk: bool) -> &mut Server {
        match node {
            None => &mut self.front,
            Some(n) if disk => &mut self.nodes[n as usize].disk,
            Some(n) => &mut self.nodes[n as usize].cpu,
        }
    }

    fn event(node: Option<u32>, disk: bool) -> Ev {
        match node {
            None => Ev::Front,
            Some(n) if disk => Ev::Disk(n),
            Some(n) => Ev::Cpu(n),
        }
    }

    /// Queues a job; a job that costs nothing on an idle server completes at once.
    fn submit(&mut self, node: Option<u32>, disk: bool, dur: Nanos, owner: u32) {
        let now = self.now();
        let s = self.server(node, disk);
        if dur == 0 && s.queue.is_empty() {
            if owner != NO_OWNER {
                self.ready.push_back(owner);
            }
            return;
        }
        s.queue.push_back(Job { dur, owner });
        if s.queue.len() == 1 {
            s.started = now;
            self.q.schedule(now + dur, Self::event(node, disk));
        }
    }

    /// The job in service on a server is done: start the next one; returns the done job's owner.
    fn finish_job(&mut self, node: Option<u32>, disk: bool) -> u32 {
        let now = self.now();
        let s = self.server(node, disk);
        let job = s.queue.pop_front().expect("a job is in service");
        s.busy_ns += job.dur;
        let next = s.queue.front().map(|j| j.dur);
        if let Some(d) = next {
            s.started = now;
            self.q.schedule(now + d, Self::event(node, disk));
        }
        if disk {
            if let Some(n) = node {
                self.report(n);
            }
        }
        job.owner
    }

    fn drain_ready(&mut self) {
        while let Some(s) = self.ready.pop_front() {
            self.step(s as usize);
        }
    }

    fn report(&mut self, n: u32) {
        let node = &self.nodes[n as usize];
        let r = LoadReport {
            active_connections: node.active_connections,
            disk_queue: node.disk.queue.len() as u32,
            cache_hits: node.c.hits,
            cache_misses: node.c.misses,
            bytes_out: node.c.bytes,
        };
        let now = dur(self.now());
        self.policy.load_report(NodeId(n), &r, now);
    }

    // ---- connections ---------------------------------------------------------------------

    fn start_connection(&mut self, s: usize) {
        if self.next_conn >= self.w.connections() {
            self.slots[s].conn = usize::MAX;
            return;
        }
        let c = self.next_conn;
        self.next_conn += 1;
        let batches = self.w.conn_batches(c);
        let now = self.now();
        let a = &mut self.slots[s];
        a.conn = c;
        a.id = ConnId(c as u64);
        a.handler = None;
        a.batch = batches.start;
        a.batch_last = batches.end;
        let reqs = self.w.batch_reqs(batches.start);
        a.next_req = reqs.start;
        a.req_end = reqs.end;
        a.decided.clear();
        a.outstanding = 0;
        a.single = None;
        a.conn_bytes = 0;
        a.first_hit = false;
        a.waiting = false;
        a.batch_arrival = now;
        a.started = false;
        let id = a.id;
        self.policy.connection_start(id, dur(now));
        self.select_pending(s);
        self.dispatch(s);
    }

    fn end_connection(&mut self, s: usize) {
        let now = self.now();
        let a = &self.slots[s];
        let (id, handler, single, bytes, hit) =
            (a.id, a.handler, a.single, a.conn_bytes, a.first_hit);
        if let Some(d) = single {
            self.policy
                .post_request(id, d.node(), &Outcome::ok(200, bytes, hit), dur(now));
        }
        if let Some(h) = handler {
            let node = &mut self.nodes[h as usize];
            node.active_connections -= 1;
            let t = self.costs.teardown;
            self.submit(Some(h), false, t, NO_OWNER);
            self.report(h);
        }
        self.policy.connection_end(id, dur(now));
        // The load the connection held is released: requests waiting at the front end go
        // first, then the slot's next connection.
        self.retry_waiting();
        self.start_connection(s);
    }

    /// Asks the policy about the requests of the current batch that have no decision yet. A
    /// request the policy refuses waits at the front end (with the rest of its batch).
    fn select_pending(&mut self, s: usize) {
        let now = self.now();
        loop {
            let a = &self.slots[s];
            if a.next_req >= a.req_end {
                return;
            }
            let req = a.next_req as u32;
            if let Some(d) = a.single {
                // Single handoff: every later request is served where the connection is.
                let a = &mut self.slots[s];
                let node = d.handler();
                a.decided
                    .push_back((req, Decision::Serve { node, cache: true }));
                a.next_req += 1;
                continue;
            }
            let t = self.w.target(req as usize) as usize;
            let r = Request {
                conn: a.id,
                method: "GET",
                host: None,
                target: &self.w.targets.keys[t],
                size_hint: Some(self.w.targets.sizes[t]),
            };
            match self.policy.select(&r, dur(now)) {
                Ok(d) => {
                    if d.node().0 >= self.cfg.nodes || d.handler().0 >= self.cfg.nodes {
                        self.error = Some(SimError::Policy(format!(
                            "policy chose an unknown node: {d:?}"
                        )));
                        return;
                    }
                    let a = &mut self.slots[s];
                    if !self.cfg.mechanism.per_request() {
                        a.single = Some(d);
                    }
                    a.decided.push_back((req, d));
                    a.next_req += 1;
                }
                Err(Reject::Overloaded) => {
                    let a = &mut self.slots[s];
                    if !a.waiting {
                        a.waiting = true;
                        self.waiting.push_back(s);
                    }
                    return;
                }
                Err(e) => {
                    self.error = Some(SimError::Policy(e.to_string()));
                    return;
                }
            }
        }
    }

    /// Whether starting `d` now would move the connection to another node.
    fn moves(&self, a: &Active, d: &Decision) -> bool {
        match (a.handler, d) {
            (Some(h), Decision::Serve { node, .. }) => {
                node.0 != h && self.cfg.mechanism != RequestDistribution::Forward
            }
            (Some(h), Decision::Handoff { to, .. }) => to.0 != h,
            _ => false,
        }
    }

    /// Starts what the connection may start now; moves to its next batch or ends it when the
    /// batch is answered.
    fn dispatch(&mut self, s: usize) {
        loop {
            if self.error.is_some() {
                return;
            }
            let a = &self.slots[s];
            if a.conn == usize::MAX {
                return;
            }
            if let Some(&(req, d)) = a.decided.front() {
                // Serial pipelining starts one request at a time. A multiple handoff waits
                // until the responses under way on the connection are sent (seed 003 §7.2);
                // the ideal handoff does not wait.
                let busy = a.outstanding > 0;
                if busy
                    && (self.cfg.pipelining == Pipelining::Serial
                        || (self.cfg.mechanism == RequestDistribution::Handoff
                            && self.moves(a, &d)))
                {
                    return;
                }
                self.slots[s].decided.pop_front();
                self.start_request(s, req, d);
                continue;
            }
            if a.outstanding > 0 || a.next_req < a.req_end {
                // Responses still under way, or requests waiting at the front end.
                return;
            }
            if a.batch + 1 < a.batch_last {
                let a = &mut self.slots[s];
                a.batch += 1;
                let reqs = self.w.batch_reqs(a.batch);
                a.next_req = reqs.start;
                a.req_end = reqs.end;
                a.batch_arrival = self.q.now();
                self.select_pending(s);
                continue;
            }
            self.end_connection(s);
            return;
        }
    }

    // ---- requests ------------------------------------------------------------------------

    fn start_request(&mut self, s: usize, req: u32, d: Decision) {
        let target = self.w.target(req as usize);
        let size = self.w.targets.sizes[target as usize];
        let mech = self.cfg.mechanism;
        let a = &mut self.slots[s];
        let first = !a.started;
        a.started = true;
        a.outstanding += 1;
        let mut pre = 0;
        let mut fe = self.costs.fe_request + if first { self.costs.fe_conn } else { 0 };
        let serve_cache = match d {
            Decision::Serve { cache, .. } => cache,
            _ => true,
        };
        let (serve, relay_by, cache) = if mech == RequestDistribution::Relay {
            (d.node().0, None, serve_cache)
        } else {
            let handler = a.handler;
            let (serve, relay_by, cache, handoff) = match (handler, d) {
                (None, _) => (d.handler().0, None, serve_cache, false),
                (Some(h), Decision::Serve { node, cache }) if node.0 == h => {
                    (h, None, cache, false)
                }
                (Some(h), Decision::Serve { node, .. }) => {
                    if mech == RequestDistribution::Forward {
                        (node.0, Some(h), true, false)
                    } else {
                        (node.0, None, true, true)
                    }
                }
                (Some(h), Decision::Forward { source, .. }) => (source.0, Some(h), true, false),
                (Some(h), Decision::Handoff { to, .. }) if to.0 == h => (h, None, true, false),
                (Some(_), Decision::Handoff { to, .. }) => (to.0, None, true, true),
            };
            match handler {
                None => {
                    pre += self.costs.connect;
                    a.handler = Some(serve);
                    let node = &mut self.nodes[serve as usize];
                    node.active_connections += 1;
                    node.c.connections += 1;
                    self.report(serve);
                }
                Some(h) if handoff => {
                    pre += self.costs.handoff;
                    fe += self.costs.fe_handoff;
                    a.handler = Some(serve);
                    self.nodes[h as usize].active_connections -= 1;
                    let node = &mut self.nodes[serve as usize];
                    node.active_connections += 1;
                    node.c.handoffs_in += 1;
                    self.report(h);
                    self.report(serve);
                }
                Some(_) => {}
            }
            (serve, relay_by, cache)
        };
        let now = self.now();
        let hit = self.nodes[serve as usize]
            .cache
            .get(&target, dur(now))
            .is_some();
        let r = Req {
            slot: s as u32,
            req,
            target,
            size,
            decision: d,
            serve,
            relay_by,
            cache,
            hit,
            pre_ns: pre,
            first,
            stage: Stage::Front,
        };
        let id = match self.free_reqs.pop() {
            Some(i) => {
                self.reqs[i as usize] = r;
                i
            }
            None => {
                self.reqs.push(r);
                (self.reqs.len() - 1) as u32
            }
        };
        if fe > 0 && !self.costs.fe_free {
            self.submit(None, false, fe, id);
        } else {
            self.begin_service(id);
        }
    }

    fn begin_service(&mut self, id: u32) {
        let r = &mut self.reqs[id as usize];
        let mut cpu = r.pre_ns + self.costs.request;
        if r.hit {
            cpu += self.costs.transmit(r.size);
        }
        r.stage = Stage::Cpu;
        let serve = r.serve;
        self.submit(Some(serve), false, cpu, id);
    }

    /// The current job of request `id` is done.
    fn step(&mut self, id: usize) {
        let r = self.reqs[id];
        let id32 = id as u32;
        match r.stage {
            Stage::Front => self.begin_service(id32),
            Stage::Cpu if !r.hit => {
                self.reqs[id].stage = Stage::Disk;
                let d = self.costs.disk_read(r.size);
                self.submit(Some(r.serve), true, d, id32);
                self.report(r.serve);
            }
            Stage::Cpu | Stage::Transmit => self.after_transmit(id32, &r),
            Stage::Disk => {
                if r.cache {
                    let now = dur(self.now());
                    let node = &mut self.nodes[r.serve as usize];
                    // Evicted objects carry no data in the simulator.
                    drop(node.cache.insert(r.target, (), r.size, now));
                }
                self.reqs[id].stage = Stage::Transmit;
                let t = self.costs.transmit(r.size);
                self.submit(Some(r.serve), false, t, id32);
            }
            Stage::Forward => self.after_forward(id32, &r),
            Stage::Relay => self.complete(id32),
        }
    }

    fn after_transmit(&mut self, id: u32, r: &Req) {
        if let Some(h) = r.relay_by {
            self.reqs[id as usize].stage = Stage::Forward;
            let f = self.costs.forward(r.size);
            self.submit(Some(h), false, f, id);
        } else {
            self.after_forward(id, r);
        }
    }

    fn after_forward(&mut self, id: u32, r: &Req) {
        if self.costs.fe_512 > 0 {
            self.reqs[id as usize].stage = Stage::Relay;
            let t = blocks(r.size, 512) * self.costs.fe_512;
            self.submit(None, false, t, id);
        } else {
            self.complete(id);
        }
    }

    fn complete(&mut self, id: u32) {
        let now = self.now();
        let r = self.reqs[id as usize];
        self.free_reqs.push(id);
        {
            let node = &mut self.nodes[r.serve as usize];
            node.c.requests += 1;
            node.c.bytes += r.size;
            if r.hit {
                node.c.hits += 1;
            } else {
                node.c.misses += 1;
            }
            if let Some(h) = r.relay_by {
                node.c.forwards_served += 1;
                self.nodes[h as usize].c.forwards_relayed += 1;
            }
        }
        let s = r.slot as usize;
        let a = &mut self.slots[s];
        a.outstanding -= 1;
        if r.first {
            a.first_hit = r.hit;
        }
        a.conn_bytes += r.size;
        let conn = a.id;
        let arrival = a.batch_arrival;
        if self.cfg.mechanism.per_request() {
            self.policy.post_request(
                conn,
                r.decision.node(),
                &Outcome::ok(200, r.size, r.hit),
                dur(now),
            );
        }
        self.totals.completed += 1;
        self.totals.response_ns += u128::from(now - arrival);
        (self.observe)(Completion {
            request: r.req as usize,
            node: r.serve,
            time: now,
            hit: r.hit,
        });
        if self.cfg.warmup_requests > 0 && self.totals.completed == self.cfg.warmup_requests {
            self.snapshot = Some(self.take_snapshot());
        }
        if self.totals.completed == self.w.requests() as u64 {
            self.end = Some(self.take_snapshot());
        }
        self.retry_waiting();
        self.dispatch(s);
    }

    /// Requests the front end could not place are tried again after each completion and each
    /// connection end, oldest first, until one is refused again.
    fn retry_waiting(&mut self) {
        if self.retrying {
            return;
        }
        self.retrying = true;
        while let Some(w) = self.waiting.pop_front() {
            self.slots[w].waiting = false;
            let before = self.slots[w].next_req;
            self.select_pending(w);
            let refused = self.slots[w].waiting;
            if refused {
                // Queued again at the back: it keeps its place at the front instead.
                let back = self.waiting.pop_back().expect("just queued");
                self.waiting.push_front(back);
            }
            if self.slots[w].next_req != before {
                self.dispatch(w);
            }
            if refused {
                break;
            }
        }
        self.retrying = false;
    }

    // ---- results -------------------------------------------------------------------------

    fn take_snapshot(&self) -> Snapshot {
        let now = self.now();
        Snapshot {
            time: now,
            totals: self.totals,
            nodes: self
                .nodes
                .iter()
                .map(|n| (n.c, n.cpu.busy_at(now), n.disk.busy_at(now)))
                .collect(),
            front_busy: self.front.busy_at(now),
        }
    }

    fn result(&self) -> RunResult {
        let zero = Snapshot {
            time: 0,
            totals: Totals::default(),
            nodes: vec![(NodeCounters::default(), 0, 0); self.nodes.len()],
            front_busy: 0,
        };
        let end = self.end.clone().unwrap_or_else(|| self.take_snapshot());
        let base = self.snapshot.clone().unwrap_or(zero);
        let span = end.time.saturating_sub(base.time);
        let secs = span as f64 / 1e9;
        let frac = |busy: Nanos| {
            if span == 0 {
                0.0
            } else {
                (busy as f64 / span as f64).min(1.0)
            }
        };
        let mut per_node = Vec::with_capacity(self.nodes.len());
        for (i, ((c1, cpu1, disk1), (c0, cpu0, disk0))) in
            end.nodes.iter().zip(&base.nodes).enumerate()
        {
            let hits = c1.hits - c0.hits;
            let misses = c1.misses - c0.misses;
            let cache = &self.nodes[i].cache;
            per_node.push(NodeResult {
                node: i as u32,
                requests: c1.requests - c0.requests,
                hits,
                misses,
                hit_rate: ratio(hits, hits + misses),
                bytes: c1.bytes - c0.bytes,
                connections: c1.connections - c0.connections,
                handoffs_in: c1.handoffs_in - c0.handoffs_in,
                forwards_served: c1.forwards_served - c0.forwards_served,
                forwards_relayed: c1.forwards_relayed - c0.forwards_relayed,
                cpu_idle: 1.0 - frac(cpu1 - cpu0),
                disk_idle: 1.0 - frac(disk1 - disk0),
                cached_bytes: cache.used_bytes(),
                cached_objects: cache.len() as u64,
            });
        }
        let measured = end.totals.completed - base.totals.completed;
        let hits: u64 = per_node.iter().map(|n| n.hits).sum();
        let bytes: u64 = per_node.iter().map(|n| n.bytes).sum();
        let ps = self.policy.stats();
        let nn = per_node.len().max(1) as f64;
        RunResult {
            label: String::new(),
            policy: self.policy.name().to_owned(),
            mechanism: self.cfg.mechanism,
            http: self.w.http,
            preset: self.cfg.preset.clone(),
            nodes: self.cfg.nodes,
            clients: (self.cfg.client_population() as usize).min(self.w.connections()) as u32,
            cache_bytes: self.cfg.cache_bytes,
            requests: self.w.requests() as u64,
            connections: self.w.connections() as u64,
            measured_requests: measured,
            sim_secs: secs,
            throughput: if secs > 0.0 {
                measured as f64 / secs
            } else {
                0.0
            },
            hit_rate: ratio(hits, measured),
            mbps: if secs > 0.0 {
                bytes as f64 * 8.0 / secs / 1e6
            } else {
                0.0
            },
            mean_response_ms: if measured == 0 {
                0.0
            } else {
                (end.totals.response_ns - base.totals.response_ns) as f64 / measured as f64 / 1e6
            },
            mean_cpu_idle: per_node.iter().map(|n| n.cpu_idle).sum::<f64>() / nn,
            mean_disk_idle: per_node.iter().map(|n| n.disk_idle).sum::<f64>() / nn,
            frontend_utilization: frac(end.front_busy - base.front_busy),
            forwards: per_node.iter().map(|n| n.forwards_served).sum(),
            handoffs: per_node.iter().map(|n| n.handoffs_in).sum(),
            policy_rejections: ps.rejections,
            policy_reassignments: ps.reassignments,
            policy_replicas: ps.replicas,
            per_node,
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CpuCosts;
    use crate::workload::{Http, Targets};
    use std::sync::Arc;

    fn targets(sizes: &[u64]) -> Arc<Targets> {
        Arc::new(Targets {
            keys: (0..sizes.len()).map(|i| format!("/t{i}").into()).collect(),
            sizes: sizes.to_vec(),
        })
    }

    fn cfg(nodes: u32, policy: PolicyKind, mech: RequestDistribution) -> SimConfig {
        let mut c = SimConfig::new(nodes, policy, mech);
        c.clients = Some(1);
        c
    }

    #[test]
    fn one_cached_request_costs_what_the_preset_says() {
        // Two requests for one 8 KB target on one connection each, one client: the first misses
        // (disk: 28 ms + 2 × 410 µs), the second hits.
        let w = SimWorkload::from_connections(
            targets(&[8192]),
            Http::V10,
            &[vec![vec![0]], vec![vec![0]]],
        )
        .unwrap();
        let c = cfg(1, PolicyKind::Rr, RequestDistribution::Single);
        let mut times = Vec::new();
        let r = simulate_observed(&c, &w, |done| times.push((done.time, done.hit))).unwrap();
        let a = CpuCosts::APACHE;
        let cpu = (a.connect_us + a.request_us + 16.0 * a.transmit_per_512_us) * 1000.0;
        let disk = (28_000.0 + 2.0 * 410.0) * 1000.0;
        assert_eq!(times[0], ((cpu + disk) as u64, false));
        // The second connection starts at once; the first one's teardown is queued before it.
        let second = times[0].0
            + ((a.teardown_us + a.connect_us + a.request_us) * 1000.0) as u64
            + (16.0 * a.transmit_per_512_us * 1000.0) as u64;
        assert_eq!(times[1], (second, true));
        assert_eq!(r.measured_requests, 2);
        assert_eq!(r.hit_rate, 0.5);
        assert_eq!(r.per_node[0].connections, 2);
    }

    #[test]
    fn disk_model_charges_extents() {
        let c = Costs::new(&SimConfig::new(
            1,
            PolicyKind::Rr,
            RequestDistribution::Single,
        ));
        assert_eq!(c.disk_read(0), 28_000_000);
        assert_eq!(c.disk_read(4096), 28_410_000);
        assert_eq!(c.disk_read(44 * 1024), 28_000_000 + 11 * 410_000);
        assert_eq!(
            c.disk_read(44 * 1024 + 1),
            28_000_000 + 12 * 410_000 + 14_000_000
        );
        assert_eq!(c.transmit(513), 48_000);
    }

    #[test]
    fn forwarding_and_handoff_are_charged_where_they_happen() {
        // Connection: [t0] then [t1]; rr puts t0 on node 0 and t1 on node 1.
        let w = SimWorkload::from_connections(
            targets(&[1024, 1024]),
            Http::V11,
            &[vec![vec![0], vec![1]]],
        )
        .unwrap();
        let fwd = simulate(&cfg(2, PolicyKind::Rr, RequestDistribution::Forward), &w).unwrap();
        assert_eq!(fwd.forwards, 1);
        assert_eq!(fwd.per_node[0].forwards_relayed, 1);
        assert_eq!(fwd.per_node[1].forwards_served, 1);
        assert_eq!(fwd.per_node[0].connections, 1);
        let ho = simulate(&cfg(2, PolicyKind::Rr, RequestDistribution::Handoff), &w).unwrap();
        assert_eq!(ho.handoffs, 1);
        assert_eq!(ho.per_node[1].handoffs_in, 1);
        let single = simulate(&cfg(2, PolicyKind::Rr, RequestDistribution::Single), &w).unwrap();
        assert_eq!(single.per_node[0].requests, 2);
        assert_eq!(single.handoffs + single.forwards, 0);
        let ideal = simulate(&cfg(2, PolicyKind::Rr, RequestDistribution::Ideal), &w).unwrap();
        assert!(ideal.sim_secs < ho.sim_secs);
        let relay = simulate(&cfg(2, PolicyKind::Rr, RequestDistribution::Relay), &w).unwrap();
        assert_eq!(relay.per_node[0].connections, 0);
        assert_eq!(relay.per_node[1].requests, 1);
    }

    #[test]
    fn warmup_is_left_out_of_the_figures() {
        let conns: Vec<Vec<Vec<u32>>> = (0..50).map(|i| vec![vec![i % 5]]).collect();
        let w = SimWorkload::from_connections(targets(&[100; 5]), Http::V10, &conns).unwrap();
        let mut c = cfg(1, PolicyKind::Rr, RequestDistribution::Single);
        c.warmup_requests = 5;
        let r = simulate(&c, &w).unwrap();
        assert_eq!(r.measured_requests, 45);
        assert_eq!(r.hit_rate, 1.0);
        assert!(r.mean_disk_idle > 0.999);
    }

    #[test]
    fn lard_rejections_wait_at_the_front_end() {
        // L_overload 1: with 4 clients and one node the policy refuses most first requests; they
        // wait and every request still completes exactly once.
        let conns: Vec<Vec<Vec<u32>>> = (0..40).map(|i| vec![vec![i % 3]]).collect();
        let w = SimWorkload::from_connections(targets(&[100; 3]), Http::V10, &conns).unwrap();
        let mut c = cfg(1, PolicyKind::Lard, RequestDistribution::Single);
        c.policy.l_idle = 0;
        c.policy.l_overload = 1;
        c.clients = Some(4);
        let mut seen = [0; 40];
        let r = simulate_observed(&c, &w, |d| seen[d.request] += 1).unwrap();
        assert!(seen.iter().all(|&n| n == 1));
        assert!(r.policy_rejections > 0);
    }
}
