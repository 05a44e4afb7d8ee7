//! The io_uring engine: the closed loop over the target URL, one request at a time on each
//! connection (wrk's workload).
//!
//! An epoll client wakes whenever one of its connections turns readable, reads the response,
//! writes the next request and sleeps again: on a machine whose cores are shared with the
//! server, most of its cost is those wake-ups and the system calls around them. Here each
//! worker thread owns one ring ([`IORING_SETUP_DEFER_TASKRUN`]: completions are gathered
//! only when the thread asks for them, and it is woken only when enough are in). Each request
//! is one linked chain, `connect` (for a new connection) → `send` → `recv`, whose `recv` is
//! the only completion the thread sees when all goes well; one `io_uring_enter` submits the
//! next requests of every connection served in the last round and waits for the next
//! responses.
//!
//! A wait may hold the responses already in for more: it asks for half of the requests in
//! flight but gives up a quarter of the recent response time after the first is in
//! ([`IORING_ENTER_EXT_ARG`]'s `min_wait_usec`: after it, one completion suffices), so a
//! response is observed at most that much after it arrived; the server then sees its requests
//! in bursts as well, and both sides wake less. Whether waits hold is tried and kept only where
//! it makes the loop faster ([`crate::moderation`]): against a slow server on idle cores it
//! would only make responses look later. The response time of a request runs from just before
//! the system call that sends it to just after the one that brings the last of its response,
//! as in the tokio engine.
//!
//! Timeouts are checked against the clock at each wake (a wait never lasts past the next
//! deadline check, the end of the run or a connection's back-off); a request that times out
//! has its chain cancelled and its connection closed once the kernel gave its buffer back.
//! Redirects are followed as in the tokio engine, on the same connection for the target's own
//! origin and on a new one otherwise (the next request of the loop then reconnects).
//!
//! Which runs this engine takes: [`unsupported`] names what it does not do (pipelining,
//! traces, sessions, think times, open loops), and [`probe`] whether the kernel offers the
//! ring it needs (Linux 6.12 and later). `--io auto` falls back to the tokio engine when
//! either says no.
//!
//! [`IORING_SETUP_DEFER_TASKRUN`]: https://man7.org/linux/man-pages/man2/io_uring_setup.2.html
//! [`IORING_ENTER_EXT_ARG`]: https://man7.org/linux/man-pages/man2/io_uring_enter.2.html

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};
use socket2::{Domain, SockAddr, Socket, Type};

use crate::config::{LoadConfig, ThinkTime, Workload};
use crate::engine::{fixed_address, is_redirect, prepare_read, Shared, INITIAL_BUF};
use crate::moderation::Moderation;
use crate::request::{Origin, Url};
use crate::response::ResponseParser;
use crate::stats::{io_error_kind, ErrorKind, Progress, Recorder, Totals};

/// Pause of a connection after a failed connection attempt (as in the tokio engine).
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);
/// Longest a response may wait to be observed while the thread waits for more.
const MAX_COALESCE: Duration = Duration::from_millis(1);
/// Most completions one wait asks for.
const MAX_WANT: usize = 64;
/// In-flight requests are checked against their deadlines every 1/64 of the timeout, within
/// these bounds (a request times out at most that late).
const SCAN_MIN: Duration = Duration::from_millis(1);
const SCAN_MAX: Duration = Duration::from_millis(100);

/// An entry's `user_data`: the connection's index, the chain's generation (16 bits) and the
/// operation (3 bits), so that a completion of an earlier chain is told apart.
const OP_CONNECT: u64 = 1;
const OP_SEND: u64 = 2;
const OP_RECV: u64 = 3;
const OP_CANCEL: u64 = 4;
const OP_BITS: u32 = 3;
const GEN_BITS: u32 = 16;

/// Why this engine cannot run `cfg`, if it cannot.
pub(crate) fn unsupported(cfg: &LoadConfig) -> Option<&'static str> {
    if cfg.rate_profile.is_some() {
        Some("open-loop rate profiles")
    } else if !matches!(cfg.workload, Workload::Url) {
        Some("trace and session replay")
    } else if cfg.pipeline > 1 {
        Some("pipelining")
    } else if cfg.think_time != ThinkTime::None {
        Some("think times")
    } else {
        None
    }
}

fn ring(entries: u32) -> std::io::Result<IoUring> {
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)?;
    if !ring.params().is_feature_min_timeout() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "io_uring without min_wait_usec (Linux before 6.12)",
        ));
    }
    Ok(ring)
}

/// Whether this kernel offers the ring the engine needs (it may be absent, too old, or
/// disabled by `kernel.io_uring_disabled`).
pub(crate) fn probe() -> std::io::Result<()> {
    ring(4).map(drop)
}

/// Where a connection is in its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Ready for the next request of the loop.
    Idle,
    /// A chain is in the kernel; its `recv` will complete.
    Busy,
    /// After a failed connection attempt, until then.
    Backoff(Instant),
    /// The run (or its request budget) is over for this connection.
    Done,
}

/// A redirect being followed: the request that replaced the original one.
struct Hop {
    url: Url,
    method: String,
    hops: u32,
    bytes: Vec<u8>,
    head: bool,
    addr: SocketAddr,
}

/// One connection and its request in progress.
struct Conn {
    fd: Option<OwnedFd>,
    /// The address `fd` is connected (or connecting) to; boxed because the kernel reads it
    /// while a `connect` is in flight.
    peer: Option<Box<SockAddr>>,
    peer_addr: Option<SocketAddr>,
    /// Whether the chain in flight opens `fd`.
    connecting: bool,
    served: u32,
    served_before: u32,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    parser: ResponseParser,
    state: State,
    t0: Instant,
    first: Option<Instant>,
    got_any: bool,
    retried: bool,
    hop: Option<Hop>,
    /// Generation of the chain in flight.
    gen: u16,
    /// The request timed out: the chain is being cancelled.
    cancelled: bool,
}

impl Conn {
    fn new(follow: bool, now: Instant) -> Self {
        let mut parser = ResponseParser::new();
        parser.set_capture_location(follow);
        Conn {
            fd: None,
            peer: None,
            peer_addr: None,
            connecting: false,
            served: 0,
            served_before: 0,
            buf: vec![0; INITIAL_BUF],
            start: 0,
            end: 0,
            parser,
            state: State::Idle,
            t0: now,
            first: None,
            got_any: false,
            retried: false,
            hop: None,
            gen: 0,
            cancelled: false,
        }
    }

    fn close(&mut self) {
        self.fd = None;
        self.peer = None;
        self.peer_addr = None;
        self.start = 0;
        self.end = 0;
    }

    /// Makes room at the end of the buffer.
    fn prepare_read(&mut self) {
        prepare_read(&mut self.buf, &mut self.start, &mut self.end);
    }
}

/// One worker thread's ring, connections and records.
struct Engine {
    shared: Arc<Shared>,
    ring: IoUring,
    conns: Vec<Conn>,
    rec: Recorder,
    log: Vec<u8>,
    /// The address of the loop's requests.
    addr: SocketAddr,
    /// The loop's request, rendered.
    main: std::ops::Range<usize>,
    main_head: bool,
    main_tag: usize,
    /// Addresses of the other origins redirects led to.
    resolved: Vec<(Origin, SocketAddr)>,
    busy: usize,
    active: usize,
    /// Smoothed response time, nanoseconds.
    smoothed_ns: u64,
    /// Whether waits hold responses for more.
    moderation: Moderation,
    /// Responses completed since the last wait.
    answered: u64,
    next_scan: Instant,
}

/// Runs one worker thread's share of the closed loop on io_uring and returns what it
/// measured.
pub(crate) fn run_worker(
    shared: Arc<Shared>,
    progress: Arc<Progress>,
    connections: usize,
) -> std::io::Result<(Totals, Instant)> {
    let entries = (connections * 3 + 8).next_power_of_two().clamp(8, 1 << 15) as u32;
    let ring = ring(entries)?;
    // No rate steps: this engine runs closed loops only.
    let rec = Recorder::new(0, shared.start, shared.series.clone(), progress);
    let item = shared
        .rendered
        .items
        .first()
        .cloned()
        .ok_or_else(|| std::io::Error::other("no request to send"))?;
    let addr = match shared.cfg.spread.len() {
        0 => shared.addr,
        n => shared.cfg.spread[item.tag % n],
    };
    let now = Instant::now();
    let follow = shared.cfg.max_redirects > 0;
    let mut engine = Engine {
        conns: (0..connections).map(|_| Conn::new(follow, now)).collect(),
        shared,
        ring,
        rec,
        log: Vec::new(),
        addr,
        main: item.range,
        main_head: item.head,
        main_tag: item.tag,
        resolved: Vec::new(),
        busy: 0,
        active: connections,
        smoothed_ns: 0,
        moderation: Moderation::new(now),
        answered: 0,
        next_scan: now,
    };
    let start = engine.shared.start;
    if let Some(wait) = start.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
    let result = engine.run();
    let finished = Instant::now();
    let drained = engine.drain();
    result?;
    drained?;
    if !engine.log.is_empty() {
        let mut log = std::mem::take(&mut engine.log);
        engine.shared.flush_log(&mut log);
    }
    engine.rec.flush();
    Ok((engine.rec.totals, finished))
}

impl Engine {
    fn run(&mut self) -> std::io::Result<()> {
        let mut now = Instant::now();
        for i in 0..self.conns.len() {
            self.next_request(i, now)?;
        }
        // After a wait that ended with fewer completions than it asked for, the next one asks
        // for one: a quiet spell is not turned into a spin of short waits.
        let mut short = false;
        loop {
            if self.active == 0 {
                return Ok(());
            }
            let want = if short || !self.moderation.holding() {
                1
            } else {
                (self.busy / 2).clamp(1, MAX_WANT)
            };
            let timeout = self.next_timer(now).saturating_duration_since(now);
            let ts = types::Timespec::from(timeout);
            let coalesce = Duration::from_nanos(self.smoothed_ns / 4).min(MAX_COALESCE);
            let mut args = types::SubmitArgs::new().timespec(&ts);
            if want > 1 {
                args = args.min_wait_usec(coalesce.as_micros().max(1) as u32);
            }
            self.enter(want, &args)?;
            now = Instant::now();
            if !self.shared.before_end(now) {
                return Ok(());
            }
            let mut got = 0usize;
            loop {
                let Some(cqe) = self.ring.completion().next() else {
                    break;
                };
                got += 1;
                self.complete(cqe.user_data(), cqe.result(), now)?;
            }
            short = got < want;
            self.moderation
                .completed(std::mem::take(&mut self.answered), now);
            if now >= self.next_scan {
                self.timers(now)?;
            }
        }
    }

    /// Submits what is queued and waits as `args` say for `want` completions. A wait that
    /// timed out or was interrupted is no error, nor a completion queue too full to take more
    /// submissions (the caller reaps first).
    fn enter(&mut self, want: usize, args: &types::SubmitArgs<'_, '_>) -> std::io::Result<()> {
        match self.ring.submitter().submit_with_args(want, args) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// When the thread must look at the clock next whatever completes: the next deadline
    /// check, the end of the run.
    fn next_timer(&self, now: Instant) -> Instant {
        let mut t = self.next_scan.max(now);
        if let Some(end) = self.shared.end {
            t = t.min(end);
        }
        t
    }

    /// Times out requests past their deadline and ends connection back-offs.
    fn timers(&mut self, now: Instant) -> std::io::Result<()> {
        let timeout = self.shared.cfg.timeout;
        self.next_scan = now + (timeout / 64).clamp(SCAN_MIN, SCAN_MAX);
        for i in 0..self.conns.len() {
            let c = &mut self.conns[i];
            match c.state {
                State::Busy if !c.cancelled && now.duration_since(c.t0) >= timeout => {
                    c.cancelled = true;
                    let fd = c.fd.as_ref().map(|f| f.as_raw_fd());
                    self.rec.timeout(None, now);
                    self.log_outcome(None, 0, 0, "timeout", i);
                    if let Some(fd) = fd {
                        let cancel = opcode::AsyncCancel2::new(
                            types::CancelBuilder::fd(types::Fd(fd)).all(),
                        )
                        .build()
                        .user_data(ud(i, self.conns[i].gen, OP_CANCEL));
                        self.push(&[cancel])?;
                    }
                }
                State::Backoff(until) if now >= until => self.next_request(i, now)?,
                State::Backoff(until) => self.next_scan = self.next_scan.min(until),
                _ => {}
            }
        }
        Ok(())
    }

    /// Connection `i` could not connect: it tries again after a pause, so that a refusing
    /// server does not turn the loop into a spin.
    fn back_off(&mut self, i: usize, now: Instant) {
        let until = now + CONNECT_BACKOFF;
        self.conns[i].state = State::Backoff(until);
        self.next_scan = self.next_scan.min(until);
    }

    /// Queues `entries` (one chain, or one entry) together: a chain split over two
    /// submissions would lose its links.
    fn push(&mut self, entries: &[squeue::Entry]) -> std::io::Result<()> {
        let room = |ring: &mut IoUring| {
            let sq = ring.submission();
            sq.capacity() - sq.len()
        };
        while room(&mut self.ring) < entries.len() {
            self.ring.submit()?;
        }
        // SAFETY: every buffer and address an entry points to lives in `self.conns` (or in
        // `self.shared`) and is neither moved nor freed until the chain has ended: its `recv`
        // completed, or an earlier step failed and the kernel dropped the rest.
        unsafe { self.ring.submission().push_multiple(entries) }
            .map_err(|_| std::io::Error::other("submission queue full"))
    }

    /// Starts the loop's next request on connection `i`, or retires it when the run or its
    /// request budget is over.
    fn next_request(&mut self, i: usize, now: Instant) -> std::io::Result<()> {
        let shared = &*self.shared;
        if !shared.before_end(now) || !shared.take_budget(1) {
            self.conns[i].state = State::Done;
            self.active -= 1;
            return Ok(());
        }
        self.rec.started(1, now);
        let c = &mut self.conns[i];
        c.t0 = now;
        c.retried = false;
        c.hop = None;
        if c.peer_addr.is_some_and(|a| a != self.addr) {
            c.close();
        }
        self.issue(i)
    }

    /// Sends connection `i`'s current request (the loop's, or the redirect it follows),
    /// connecting first when it has no connection.
    fn issue(&mut self, i: usize) -> std::io::Result<()> {
        let addr = self.conns[i].hop.as_ref().map_or(self.addr, |h| h.addr);
        let c = &mut self.conns[i];
        if c.fd.is_some() && c.peer_addr != Some(addr) {
            c.close();
        }
        let mut connect = None;
        c.gen = c.gen.wrapping_add(1);
        let gen = c.gen;
        if c.fd.is_none() {
            let sock = match new_socket(addr, self.shared.cfg.local_addr) {
                Ok(s) => s,
                Err(_) => {
                    // Out of descriptors or ports: a failed connection attempt.
                    self.rec.error(None, ErrorKind::Connect, Instant::now());
                    self.log_outcome(None, 0, 0, ErrorKind::Connect.name(), i);
                    self.back_off(i, Instant::now());
                    return Ok(());
                }
            };
            let sa = Box::new(SockAddr::from(addr));
            let fd = OwnedFd::from(sock);
            connect = Some(
                opcode::Connect::new(types::Fd(fd.as_raw_fd()), sa.as_ptr().cast(), sa.len())
                    .build()
                    .flags(squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS)
                    .user_data(ud(i, gen, OP_CONNECT)),
            );
            c.fd = Some(fd);
            c.peer = Some(sa);
            c.peer_addr = Some(addr);
            c.served = 0;
            c.connecting = true;
        } else {
            c.connecting = false;
        }
        let fd = types::Fd(c.fd.as_ref().expect("connected").as_raw_fd());
        let (bytes, head) = match &c.hop {
            Some(h) => (&h.bytes[..], h.head),
            None => (
                &self.shared.rendered.bytes[self.main.clone()],
                self.main_head,
            ),
        };
        let send = opcode::Send::new(fd, bytes.as_ptr(), bytes.len() as u32)
            .flags(libc::MSG_NOSIGNAL | libc::MSG_WAITALL)
            .build()
            .flags(squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS)
            .user_data(ud(i, gen, OP_SEND));
        c.parser.start(head);
        c.served_before = c.served;
        c.got_any = false;
        c.first = None;
        c.cancelled = false;
        c.prepare_read();
        let recv = recv_entry(c, fd, i);
        c.state = State::Busy;
        self.busy += 1;
        match connect {
            Some(connect) => self.push(&[connect, send, recv]),
            None => self.push(&[send, recv]),
        }
    }

    /// Handles one completion.
    ///
    /// `connect` and `send` complete silently when they succeed (`SKIP_SUCCESS`); when one
    /// fails, its completion ends the chain: the kernel cancels the steps linked after it
    /// without a completion of their own, before they touch the buffer. Otherwise the
    /// chain's `recv` ends it.
    fn complete(&mut self, user_data: u64, res: i32, now: Instant) -> std::io::Result<()> {
        let (i, gen, op) = parse_ud(user_data);
        if op == OP_CANCEL || self.conns[i].gen != gen || self.conns[i].state != State::Busy {
            return Ok(());
        }
        if op == OP_RECV && res >= 0 && !self.conns[i].cancelled {
            return self.received(i, res, now);
        }
        // The chain is over: failed, or cancelled because the request timed out.
        self.busy -= 1;
        let c = &mut self.conns[i];
        c.close();
        if c.cancelled {
            // Timed out and already counted.
            c.cancelled = false;
            return self.next_request(i, now);
        }
        let errno = -res;
        if op == OP_CONNECT {
            let kind = if errno == libc::ECONNREFUSED {
                ErrorKind::ConnectRefused
            } else {
                ErrorKind::Connect
            };
            self.rec.error(None, kind, now);
            self.log_outcome(None, 0, 0, kind.name(), i);
            self.back_off(i, now);
            return Ok(());
        }
        let kind = io_error_kind(&std::io::Error::from_raw_os_error(errno));
        self.failed_or_retry(i, kind, now)
    }

    /// The `recv` of connection `i`'s chain brought `res` bytes (0: the server closed).
    fn received(&mut self, i: usize, res: i32, now: Instant) -> std::io::Result<()> {
        let c = &mut self.conns[i];
        if c.connecting {
            c.connecting = false;
            self.rec.connection_opened();
        }
        if res == 0 {
            self.busy -= 1;
            let complete = c.parser.finish_eof().is_ok();
            c.close();
            if complete {
                c.served += 1;
                return self.response(i, now);
            }
            return self.failed_or_retry(i, ErrorKind::Closed, now);
        }
        c.end += res as usize;
        c.got_any = true;
        c.first.get_or_insert(now);
        // One request at a time: the buffer holds at most the rest of this response.
        match c.parser.parse(&c.buf[c.start..c.end]) {
            Err(_) => {
                self.busy -= 1;
                c.close();
                self.fail(i, ErrorKind::BadResponse, now);
                return self.next_request(i, now);
            }
            Ok(step) => {
                c.start += step.consumed;
                if step.complete {
                    self.busy -= 1;
                    c.served += 1;
                    let info = *c.parser.info();
                    if !info.keep_alive || !self.shared.cfg.keep_alive {
                        c.close();
                    }
                    return self.response(i, now);
                }
            }
        }
        // More of the response is to come.
        c.prepare_read();
        let fd = types::Fd(c.fd.as_ref().expect("open").as_raw_fd());
        let entry = recv_entry(c, fd, i);
        self.push(&[entry])
    }

    /// Connection `i` failed with `kind` before its response was complete: a kept-alive
    /// connection the server had closed gets the request once more on a new one.
    fn failed_or_retry(&mut self, i: usize, kind: ErrorKind, now: Instant) -> std::io::Result<()> {
        let c = &mut self.conns[i];
        if !c.got_any && c.served_before > 0 && !c.retried {
            c.retried = true;
            return self.issue(i);
        }
        self.fail(i, kind, now);
        self.next_request(i, now)
    }

    fn fail(&mut self, i: usize, kind: ErrorKind, now: Instant) {
        self.rec.error(None, kind, now);
        self.log_outcome(None, 0, 0, kind.name(), i);
        self.conns[i].hop = None;
    }

    /// Connection `i` has its complete response (in its parser).
    fn response(&mut self, i: usize, done: Instant) -> std::io::Result<()> {
        let c = &mut self.conns[i];
        let info = *c.parser.info();
        let first = c.first.unwrap_or(done);
        let t0 = c.t0;
        if self.shared.cfg.max_redirects > 0 && is_redirect(info.status) {
            if let Some(location) = c.parser.location().map(str::to_owned) {
                self.rec
                    .redirect_response(None, done, info.wire_bytes, info.body_bytes);
                return self.follow(i, info.status, &location, done);
            }
        }
        self.rec.response(
            None,
            t0,
            first,
            done,
            info.status,
            info.wire_bytes,
            info.body_bytes,
        );
        self.answered += 1;
        let took = done.saturating_duration_since(t0).as_nanos() as u64;
        self.smoothed_ns = self.smoothed_ns - self.smoothed_ns / 8 + took / 8;
        self.log_outcome(Some((first, done)), info.status, info.body_bytes, "ok", i);
        self.conns[i].hop = None;
        self.next_request(i, done)
    }

    /// Follows a redirect of connection `i`'s request to `location`.
    fn follow(
        &mut self,
        i: usize,
        status: u16,
        location: &str,
        now: Instant,
    ) -> std::io::Result<()> {
        let shared = self.shared.clone();
        let (url, method, hops) = match self.conns[i].hop.take() {
            Some(h) => (h.url, h.method, h.hops + 1),
            None => {
                let req = &shared.rendered.reqs[self.main_tag];
                let url = Url {
                    origin: shared.cfg.target.origin.clone(),
                    path: req.path.clone(),
                };
                (url, req.method.clone(), 1)
            }
        };
        let next = match shared.redirect_hop(&url, &method, status, location, hops) {
            Ok(h) => h,
            Err(kind) => {
                self.fail(i, kind, now);
                return self.next_request(i, now);
            }
        };
        self.rec.redirect_followed();
        let addr = if next.same {
            Some(self.addr)
        } else {
            self.resolve(&next.url.origin)
        };
        let Some(addr) = addr else {
            self.fail(i, ErrorKind::BadRedirect, now);
            return self.next_request(i, now);
        };
        self.conns[i].hop = Some(Hop {
            url: next.url,
            method: next.method,
            hops,
            bytes: next.bytes,
            head: next.head,
            addr,
        });
        self.conns[i].retried = false;
        self.issue(i)
    }

    /// The address of another origin a redirect leads to: `--resolve`, or the system's
    /// resolver once per origin and thread (the thread waits for it).
    fn resolve(&mut self, origin: &Origin) -> Option<SocketAddr> {
        if let Some((_, a)) = self.resolved.iter().find(|(o, _)| o == origin) {
            return Some(*a);
        }
        let addr = fixed_address(&self.shared.cfg.resolve, origin)
            .or_else(|| origin.socket_string().to_socket_addrs().ok()?.next())?;
        self.resolved.push((origin.clone(), addr));
        Some(addr)
    }

    fn log_outcome(
        &mut self,
        times: Option<(Instant, Instant)>,
        status: u16,
        body: u64,
        outcome: &str,
        i: usize,
    ) {
        if self.shared.request_log.is_some() {
            let t0 = self.conns[i].t0;
            self.shared.log_line(
                &mut self.log,
                self.main_tag,
                t0,
                times,
                status,
                body,
                outcome,
            );
        }
    }

    /// At the end of the run: cancels what is still in flight (those requests are not
    /// counted, as in the tokio engine) and waits until the kernel has let go of every
    /// buffer, then closes the connections.
    fn drain(&mut self) -> std::io::Result<()> {
        if self.busy > 0 {
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(ud(0, 0, OP_CANCEL));
            self.push(&[cancel])?;
        }
        let limit = Instant::now() + Duration::from_secs(5);
        while self.busy > 0 {
            let left = limit.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "io_uring requests still in flight 5 s after cancelling them",
                ));
            }
            let ts = types::Timespec::from(left.min(Duration::from_millis(100)));
            self.enter(1, &types::SubmitArgs::new().timespec(&ts))?;
            while let Some(cqe) = self.ring.completion().next() {
                // Any completion of a chain but a cancel ends it here (a `recv` is not armed
                // again).
                let (i, gen, op) = parse_ud(cqe.user_data());
                if op == OP_CANCEL {
                    continue;
                }
                let c = &mut self.conns[i];
                if c.gen == gen && c.state == State::Busy {
                    c.state = State::Done;
                    self.busy -= 1;
                }
            }
        }
        for c in &mut self.conns {
            c.close();
        }
        Ok(())
    }
}

fn ud(i: usize, gen: u16, op: u64) -> u64 {
    ((i as u64) << (GEN_BITS + OP_BITS)) | (u64::from(gen) << OP_BITS) | op
}

fn parse_ud(user_data: u64) -> (usize, u16, u64) {
    (
        (user_data >> (GEN_BITS + OP_BITS)) as usize,
        (user_data >> OP_BITS) as u16,
        user_data & ((1 << OP_BITS) - 1),
    )
}

/// A `recv` into the free end of connection `i`'s buffer.
fn recv_entry(c: &mut Conn, fd: types::Fd, i: usize) -> squeue::Entry {
    let gen = c.gen;
    let tail = &mut c.buf[c.end..];
    opcode::Recv::new(fd, tail.as_mut_ptr(), tail.len() as u32)
        .build()
        .user_data(ud(i, gen, OP_RECV))
}

/// A TCP socket for `addr` (blocking: io_uring waits on it itself), bound to `local` if
/// given, with Nagle off.
fn new_socket(addr: SocketAddr, local: Option<std::net::IpAddr>) -> std::io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM.cloexec(), None)?;
    sock.set_tcp_nodelay(true)?;
    if let Some(ip) = local {
        sock.bind(&SockAddr::from(SocketAddr::new(ip, 0)))?;
    }
    Ok(sock)
}
