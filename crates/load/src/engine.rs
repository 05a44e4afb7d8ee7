//! Worker threads and the per-connection request/response machinery of the tokio engine,
//! and what both engines share ([`Shared`]: the run's rendered requests, the request budget,
//! redirect hops, the request log).
//!
//! Each worker thread runs a single-threaded tokio runtime owning its share of the
//! connections (like wrk). The closed loop over one URL runs on io_uring instead where the
//! kernel offers it (module `uring`). All request bytes are rendered before the run; a connection slot
//! owns its read buffer, response parser and timer, reused for every request, so the closed
//! loop does not allocate per request.
//!
//! Timeouts use one lazily re-armed timer per slot: it is only moved when it fires too early
//! for the request in progress, so a request normally costs no timer operation at all.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Sleep;

use crate::config::{Arrival, LoadConfig, ReplayRequest, ThinkTime, Workload};
use crate::request::{is_head, Origin, RequestTemplate, Url};
use crate::response::ResponseParser;
use crate::stats::{io_error_kind, ErrorKind, Progress, Recorder, SeriesAgg, Totals};

pub(crate) const INITIAL_BUF: usize = 16 * 1024;
const MAX_BUF: usize = 256 * 1024;
/// Pause of a closed-loop connection after a failed connection attempt.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// One request inside a rendered byte buffer.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    /// Its bytes; consecutive items of a batch are contiguous.
    pub range: Range<usize>,
    /// Whether it is a `HEAD` (the response has no body).
    pub head: bool,
    /// Index into [`Rendered::reqs`].
    pub tag: usize,
}

/// Pre-rendered requests of a run.
#[derive(Debug, Default)]
pub(crate) struct Rendered {
    pub bytes: Vec<u8>,
    pub items: Vec<Item>,
    pub reqs: Vec<ReplayRequest>,
    /// Sessions: for each, its batches as ranges of `items`, and its think times.
    pub sessions: Vec<(Vec<Range<usize>>, Vec<Duration>)>,
}

impl Rendered {
    pub fn build(cfg: &LoadConfig, template: &RequestTemplate) -> Rendered {
        let mut r = Rendered::default();
        match &cfg.workload {
            Workload::Url => {
                r.reqs.push(ReplayRequest {
                    method: cfg.method.clone(),
                    path: cfg.target.path.clone(),
                    host: None,
                });
                for _ in 0..cfg.pipeline.max(1) {
                    r.push(template, 0);
                }
            }
            Workload::Trace(reqs) => {
                r.reqs = reqs.clone();
                for i in 0..reqs.len() {
                    r.push(template, i);
                }
            }
            Workload::Sessions(sessions) => {
                for s in sessions {
                    let mut batches = Vec::with_capacity(s.batches.len());
                    for b in &s.batches {
                        let first = r.items.len();
                        for req in b {
                            r.reqs.push(req.clone());
                            r.push(template, r.reqs.len() - 1);
                        }
                        if r.items.len() > first {
                            batches.push(first..r.items.len());
                        }
                    }
                    r.sessions.push((batches, s.think_times.clone()));
                }
            }
        }
        r
    }

    fn push(&mut self, template: &RequestTemplate, tag: usize) {
        let req = &self.reqs[tag];
        let start = self.bytes.len();
        template.render_into(&mut self.bytes, &req.method, &req.path, req.host.as_deref());
        self.items.push(Item {
            range: start..self.bytes.len(),
            head: is_head(&req.method),
            tag,
        });
    }
}

/// State shared by all worker threads.
pub(crate) struct Shared {
    pub cfg: LoadConfig,
    pub addr: SocketAddr,
    pub template: RequestTemplate,
    pub rendered: Rendered,
    pub next: AtomicUsize,
    pub budget: Option<AtomicI64>,
    pub start: Instant,
    pub end: Option<Instant>,
    pub series: Arc<Mutex<SeriesAgg>>,
    pub request_log: Option<Mutex<std::fs::File>>,
    pub max_inflight_per_thread: usize,
    pub log_failed: AtomicBool,
}

impl Shared {
    /// Takes `n` requests from the request budget; false when it is used up.
    pub(crate) fn take_budget(&self, n: usize) -> bool {
        match &self.budget {
            None => true,
            Some(b) => b.fetch_sub(n as i64, Ordering::Relaxed) > 0,
        }
    }

    pub(crate) fn before_end(&self, now: Instant) -> bool {
        self.end.is_none_or(|e| now < e)
    }

    /// The next request of a redirect chain: `location`, from a response with `status` to
    /// `method` on `url`, as the `hops`-th redirect followed. Both engines follow redirects
    /// with it.
    pub(crate) fn redirect_hop(
        &self,
        url: &Url,
        method: &str,
        status: u16,
        location: &str,
        hops: u32,
    ) -> Result<Hop, ErrorKind> {
        if hops > self.cfg.max_redirects {
            return Err(ErrorKind::RedirectLimit);
        }
        let url = url.join(location).map_err(|_| ErrorKind::BadRedirect)?;
        let method = if status == 303 && !is_head(method) {
            "GET".to_owned()
        } else {
            method.to_owned()
        };
        let same = url.origin == self.cfg.target.origin;
        let host = (!same).then(|| url.origin.host_header());
        let mut bytes = Vec::with_capacity(128);
        self.template
            .render_into(&mut bytes, &method, &url.path, host.as_deref());
        Ok(Hop {
            head: is_head(&method),
            url,
            method,
            bytes,
            same,
        })
    }

    /// Appends one line of the request log to `log` (flushed to the file every 64 KiB).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn log_line(
        &self,
        log: &mut Vec<u8>,
        tag: usize,
        t0: Instant,
        times: Option<(Instant, Instant)>,
        status: u16,
        bytes: u64,
        outcome: &str,
    ) {
        let issue = t0.saturating_duration_since(self.start).as_micros();
        let (fb, done) = match times {
            Some((f, d)) => (
                f.saturating_duration_since(t0).as_micros().to_string(),
                d.saturating_duration_since(t0).as_micros().to_string(),
            ),
            None => (String::new(), String::new()),
        };
        let req = &self.rendered.reqs[tag];
        let _ = writeln!(
            log,
            "{issue},{},{},{status},{bytes},{fb},{done},{outcome}",
            req.method,
            csv_field(&req.path)
        );
        if log.len() >= 64 * 1024 {
            self.flush_log(log);
        }
    }

    /// Writes what `log` holds to the request log.
    pub(crate) fn flush_log(&self, log: &mut Vec<u8>) {
        if let Some(file) = &self.request_log {
            if let Ok(mut f) = file.lock() {
                if f.write_all(log).is_err() {
                    self.log_failed.store(true, Ordering::Relaxed);
                }
            }
        }
        log.clear();
    }
}

/// The next request of a redirect chain ([`Shared::redirect_hop`]).
pub(crate) struct Hop {
    pub url: Url,
    pub method: String,
    /// The rendered request.
    pub bytes: Vec<u8>,
    pub head: bool,
    /// Whether it goes to the target's own origin (over the same connection).
    pub same: bool,
}

/// What a connection reports about one request.
pub(crate) enum Outcome<'a> {
    Response {
        status: u16,
        first: Instant,
        done: Instant,
        wire: u64,
        body: u64,
        location: Option<&'a str>,
    },
    Error(ErrorKind),
    Timeout,
}

/// Whether a connection loop should go on after an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    /// The run ended while waiting; the outstanding requests were abandoned uncounted.
    Stop,
}

/// A lazily re-armed timer (see the module documentation).
struct Timer {
    sleep: Pin<Box<Sleep>>,
    armed: Instant,
}

impl Timer {
    fn new() -> Self {
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        Timer {
            sleep: Box::pin(tokio::time::sleep_until(far.into())),
            armed: far,
        }
    }

    /// Runs `fut` until it finishes or `limit` passes (`None`).
    async fn run<F: Future>(&mut self, limit: Instant, fut: F) -> Option<F::Output> {
        if self.armed > limit {
            self.sleep.as_mut().reset(limit.into());
            self.armed = limit;
        }
        let mut fut = std::pin::pin!(fut);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(v));
            }
            loop {
                match self.sleep.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) => {
                        if self.armed >= limit {
                            return Poll::Ready(None);
                        }
                        self.sleep.as_mut().reset(limit.into());
                        self.armed = limit;
                    }
                }
            }
        })
        .await
    }
}

/// A connection slot: the connection (if open) and everything reused across its requests.
pub(crate) struct Slot {
    conn: Option<TcpStream>,
    served: u32,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    read_at: Instant,
    parser: ResponseParser,
    timer: Timer,
    /// The last connection attempt failed.
    connect_failed: bool,
}

impl Slot {
    fn new(capture_location: bool) -> Self {
        let mut parser = ResponseParser::new();
        parser.set_capture_location(capture_location);
        Slot {
            conn: None,
            served: 0,
            buf: vec![0; INITIAL_BUF],
            start: 0,
            end: 0,
            read_at: Instant::now(),
            parser,
            timer: Timer::new(),
            connect_failed: false,
        }
    }

    fn close(&mut self) {
        self.conn = None;
        self.start = 0;
        self.end = 0;
    }

    fn is_open(&self) -> bool {
        self.conn.is_some()
    }

    /// Makes room at the end of the buffer.
    fn prepare_read(&mut self) {
        prepare_read(&mut self.buf, &mut self.start, &mut self.end);
    }
}

/// Makes room at the end of a connection's read buffer, whose unparsed bytes are
/// `buf[start..end]`: starts over when all is parsed, moves what is left to the front when the
/// end is reached, and doubles the buffer (up to 256 KiB) when that is not enough.
pub(crate) fn prepare_read(buf: &mut Vec<u8>, start: &mut usize, end: &mut usize) {
    if *start == *end {
        *start = 0;
        *end = 0;
    } else if *end == buf.len() {
        if *start > 0 {
            buf.copy_within(*start..*end, 0);
            *end -= *start;
            *start = 0;
        } else if buf.len() < MAX_BUF {
            let n = (buf.len() * 2).min(MAX_BUF);
            buf.resize(n, 0);
        }
    }
}

/// A redirect waiting to be followed.
struct Pending {
    tag: usize,
    step: Option<usize>,
    t0: Instant,
    status: u16,
    location: String,
}

/// Per-thread worker state.
pub(crate) struct Worker {
    pub shared: Arc<Shared>,
    pub rec: RefCell<Recorder>,
    side_addrs: RefCell<Vec<(Origin, SocketAddr)>>,
    side_pool: RefCell<Vec<(Origin, Slot)>>,
    pool: RefCell<Vec<Slot>>,
    inflight: Cell<usize>,
    log: RefCell<Vec<u8>>,
    rng: Cell<u64>,
}

impl Worker {
    pub fn new(shared: Arc<Shared>, rec: Recorder, index: usize) -> Self {
        let seed = shared.cfg.seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Worker {
            shared,
            rec: RefCell::new(rec),
            side_addrs: RefCell::new(Vec::new()),
            side_pool: RefCell::new(Vec::new()),
            pool: RefCell::new(Vec::new()),
            inflight: Cell::new(0),
            log: RefCell::new(Vec::new()),
            rng: Cell::new(seed | 1),
        }
    }

    fn follow(&self) -> bool {
        self.shared.cfg.max_redirects > 0
    }

    fn new_slot(&self) -> Slot {
        Slot::new(self.follow())
    }

    /// Sends `items` (pipelined when keep-alive is on) and reads their responses in order,
    /// reconnecting and re-sending unanswered requests when the server closes the connection.
    #[allow(clippy::too_many_arguments)]
    async fn exchange(
        &self,
        slot: &mut Slot,
        addr: SocketAddr,
        bytes: &[u8],
        items: &[Item],
        t0: Instant,
        abandon: Option<Instant>,
        sink: &mut dyn FnMut(&Item, Outcome<'_>),
    ) -> Flow {
        let cfg = &self.shared.cfg;
        let deadline = t0 + cfg.timeout;
        let (limit, abandon_first) = match abandon {
            Some(a) if a < deadline => (a, true),
            _ => (deadline, false),
        };
        let expire = |slot: &mut Slot, next: usize, sink: &mut dyn FnMut(&Item, Outcome<'_>)| {
            slot.close();
            if abandon_first {
                return Flow::Stop;
            }
            for it in &items[next..] {
                sink(it, Outcome::Timeout);
            }
            Flow::Continue
        };
        let mut next = 0usize;
        let mut retried = false;
        'outer: while next < items.len() {
            if slot.conn.is_none() {
                match slot
                    .timer
                    .run(limit, connect(addr, self.shared.cfg.local_addr))
                    .await
                {
                    None => return expire(slot, next, sink),
                    Some(Err(e)) => {
                        let kind = if e.kind() == std::io::ErrorKind::ConnectionRefused {
                            ErrorKind::ConnectRefused
                        } else {
                            ErrorKind::Connect
                        };
                        slot.connect_failed = true;
                        for it in &items[next..] {
                            sink(it, Outcome::Error(kind));
                        }
                        return Flow::Continue;
                    }
                    Some(Ok(s)) => {
                        slot.connect_failed = false;
                        let _ = s.set_nodelay(true);
                        slot.conn = Some(s);
                        slot.served = 0;
                        slot.start = 0;
                        slot.end = 0;
                        self.rec.borrow_mut().connection_opened();
                    }
                }
            }
            let last = if cfg.keep_alive {
                items.len()
            } else {
                next + 1
            };
            let served_before = slot.served;
            let wbytes = &bytes[items[next].range.start..items[last - 1].range.end];
            let stream = slot.conn.as_mut().expect("connected");
            match slot.timer.run(limit, stream.write_all(wbytes)).await {
                None => return expire(slot, next, sink),
                Some(Err(e)) => {
                    slot.close();
                    if served_before > 0 && !retried {
                        retried = true;
                        continue 'outer;
                    }
                    sink(&items[next], Outcome::Error(io_error_kind(&e)));
                    next += 1;
                    continue 'outer;
                }
                Some(Ok(())) => {}
            }
            let mut got_any = false;
            slot.parser.start(items[next].head);
            let mut first = (slot.start < slot.end).then_some(slot.read_at);
            loop {
                while slot.start < slot.end {
                    match slot.parser.parse(&slot.buf[slot.start..slot.end]) {
                        Err(_) => {
                            slot.close();
                            sink(&items[next], Outcome::Error(ErrorKind::BadResponse));
                            next += 1;
                            continue 'outer;
                        }
                        Ok(step) => {
                            slot.start += step.consumed;
                            if !step.complete {
                                break;
                            }
                            let info = *slot.parser.info();
                            let done = slot.read_at;
                            sink(
                                &items[next],
                                Outcome::Response {
                                    status: info.status,
                                    first: first.unwrap_or(done),
                                    done,
                                    wire: info.wire_bytes,
                                    body: info.body_bytes,
                                    location: slot.parser.location(),
                                },
                            );
                            next += 1;
                            slot.served += 1;
                            if !info.keep_alive || !cfg.keep_alive {
                                slot.close();
                                continue 'outer;
                            }
                            if next == last {
                                continue 'outer;
                            }
                            slot.parser.start(items[next].head);
                            first = (slot.start < slot.end).then_some(slot.read_at);
                        }
                    }
                }
                slot.prepare_read();
                let stream = slot.conn.as_mut().expect("connected");
                let tail = &mut slot.buf[slot.end..];
                match slot.timer.run(limit, stream.read(tail)).await {
                    None => return expire(slot, next, sink),
                    Some(Ok(0)) => {
                        let complete = slot.parser.finish_eof().is_ok();
                        slot.close();
                        if complete {
                            let info = *slot.parser.info();
                            let done = Instant::now();
                            sink(
                                &items[next],
                                Outcome::Response {
                                    status: info.status,
                                    first: first.unwrap_or(done),
                                    done,
                                    wire: info.wire_bytes,
                                    body: info.body_bytes,
                                    location: slot.parser.location(),
                                },
                            );
                            slot.served += 1;
                        } else if !got_any && served_before > 0 && !retried {
                            // A kept-alive connection the server had already closed.
                            retried = true;
                            continue 'outer;
                        } else {
                            sink(&items[next], Outcome::Error(ErrorKind::Closed));
                        }
                        next += 1;
                        continue 'outer;
                    }
                    Some(Ok(n)) => {
                        let now = Instant::now();
                        slot.end += n;
                        slot.read_at = now;
                        got_any = true;
                        if first.is_none() {
                            first = Some(now);
                        }
                    }
                    Some(Err(e)) => {
                        slot.close();
                        if !got_any && served_before > 0 && !retried {
                            retried = true;
                            continue 'outer;
                        }
                        sink(&items[next], Outcome::Error(io_error_kind(&e)));
                        next += 1;
                        continue 'outer;
                    }
                }
            }
        }
        Flow::Continue
    }

    /// Runs one batch of pre-rendered items on `slot` and records the outcomes, following
    /// redirects afterwards; `t0` is when the batch is sent.
    #[allow(clippy::too_many_arguments)]
    async fn run_items(
        &self,
        slot: &mut Slot,
        items: &[Item],
        t0: Instant,
        step: Option<usize>,
        abandon: Option<Instant>,
        pending: &mut Vec<Pending>,
    ) -> Flow {
        let shared = &*self.shared;
        let follow = self.follow();
        let logging = shared.request_log.is_some();
        let mut sink = |it: &Item, o: Outcome<'_>| {
            let mut rec = self.rec.borrow_mut();
            match o {
                Outcome::Response {
                    status,
                    first,
                    done,
                    wire,
                    body,
                    location,
                } => {
                    if abandon.is_some_and(|end| done > end) {
                        // Completed after the end of the run: not counted.
                        return;
                    }
                    if follow && is_redirect(status) {
                        if let Some(loc) = location {
                            rec.redirect_response(step, done, wire, body);
                            pending.push(Pending {
                                tag: it.tag,
                                step,
                                t0,
                                status,
                                location: loc.to_owned(),
                            });
                            return;
                        }
                    }
                    rec.response(step, t0, first, done, status, wire, body);
                    if logging {
                        drop(rec);
                        self.log_line(it.tag, t0, Some((first, done)), status, body, "ok");
                    }
                }
                Outcome::Error(kind) => {
                    let now = Instant::now();
                    if abandon.is_some_and(|end| now > end) {
                        return;
                    }
                    rec.error(step, kind, now);
                    if logging {
                        drop(rec);
                        self.log_line(it.tag, t0, None, 0, 0, kind.name());
                    }
                }
                Outcome::Timeout => {
                    rec.timeout(step, Instant::now());
                    if logging {
                        drop(rec);
                        self.log_line(it.tag, t0, None, 0, 0, "timeout");
                    }
                }
            }
        };
        let addr = match (items.first(), shared.cfg.spread.len()) {
            (Some(first), n) if n > 0 => shared.cfg.spread[first.tag % n],
            _ => shared.addr,
        };
        let flow = self
            .exchange(
                slot,
                addr,
                &shared.rendered.bytes,
                items,
                t0,
                abandon,
                &mut sink,
            )
            .await;
        if flow == Flow::Stop {
            pending.clear();
            return flow;
        }
        if !pending.is_empty() {
            return self.follow_redirects(slot, pending, abandon).await;
        }
        Flow::Continue
    }

    /// Follows the redirects collected by [`run_items`](Self::run_items), in order.
    async fn follow_redirects(
        &self,
        main: &mut Slot,
        pending: &mut Vec<Pending>,
        abandon: Option<Instant>,
    ) -> Flow {
        let shared = &*self.shared;
        let cfg = &shared.cfg;
        let list = std::mem::take(pending);
        let mut flow = Flow::Continue;
        for p in &list {
            let req = &shared.rendered.reqs[p.tag];
            let mut url = Url {
                origin: cfg.target.origin.clone(),
                path: req.path.clone(),
            };
            let mut method = req.method.clone();
            let mut status = p.status;
            let mut location = p.location.clone();
            let mut hops = 1u32;
            let fail = |kind: ErrorKind| {
                self.rec.borrow_mut().error(p.step, kind, Instant::now());
                if shared.request_log.is_some() {
                    self.log_line(p.tag, p.t0, None, 0, 0, kind.name());
                }
            };
            loop {
                let hop = match shared.redirect_hop(&url, &method, status, &location, hops) {
                    Ok(h) => h,
                    Err(kind) => {
                        fail(kind);
                        break;
                    }
                };
                self.rec.borrow_mut().redirect_followed();
                let Hop {
                    url: next_url,
                    method: next_method,
                    bytes,
                    head,
                    same,
                } = hop;
                url = next_url;
                method = next_method;
                let items = [Item {
                    range: 0..bytes.len(),
                    head,
                    tag: p.tag,
                }];
                let mut result: Option<(u16, Instant, Instant, u64, u64, Option<String>)> = None;
                let mut other: Option<Outcome<'static>> = None;
                let mut sink = |_: &Item, o: Outcome<'_>| match o {
                    Outcome::Response {
                        status,
                        first,
                        done,
                        wire,
                        body,
                        location,
                    } => {
                        let loc = if is_redirect(status) {
                            location.map(str::to_owned)
                        } else {
                            None
                        };
                        result = Some((status, first, done, wire, body, loc));
                    }
                    Outcome::Error(k) => other = Some(Outcome::Error(k)),
                    Outcome::Timeout => other = Some(Outcome::Timeout),
                };
                let f = if same {
                    self.exchange(main, shared.addr, &bytes, &items, p.t0, abandon, &mut sink)
                        .await
                } else {
                    let addr = match self.resolve(&url.origin).await {
                        Some(a) => a,
                        None => {
                            fail(ErrorKind::BadRedirect);
                            break;
                        }
                    };
                    let taken = {
                        let mut pool = self.side_pool.borrow_mut();
                        pool.iter()
                            .position(|(o, _)| *o == url.origin)
                            .map(|i| pool.swap_remove(i).1)
                    };
                    let mut side = taken.unwrap_or_else(|| self.new_slot());
                    let f = self
                        .exchange(&mut side, addr, &bytes, &items, p.t0, abandon, &mut sink)
                        .await;
                    if side.is_open() {
                        self.side_pool.borrow_mut().push((url.origin.clone(), side));
                    }
                    f
                };
                if f == Flow::Stop {
                    flow = Flow::Stop;
                    break;
                }
                match (result, other) {
                    (Some((st, first, done, wire, body, loc)), _) => {
                        if let Some(loc) = loc {
                            self.rec
                                .borrow_mut()
                                .redirect_response(p.step, done, wire, body);
                            status = st;
                            location = loc;
                            hops += 1;
                            continue;
                        }
                        if abandon.is_some_and(|end| done > end) {
                            break;
                        }
                        self.rec
                            .borrow_mut()
                            .response(p.step, p.t0, first, done, st, wire, body);
                        if shared.request_log.is_some() {
                            self.log_line(p.tag, p.t0, Some((first, done)), st, body, "ok");
                        }
                    }
                    (None, Some(Outcome::Timeout)) => {
                        self.rec.borrow_mut().timeout(p.step, Instant::now());
                        if shared.request_log.is_some() {
                            self.log_line(p.tag, p.t0, None, 0, 0, "timeout");
                        }
                    }
                    (None, Some(Outcome::Error(k))) => fail(k),
                    _ => fail(ErrorKind::Io),
                }
                break;
            }
            if flow == Flow::Stop {
                break;
            }
        }
        // Give the allocation back for reuse.
        *pending = list;
        pending.clear();
        flow
    }

    async fn resolve(&self, origin: &Origin) -> Option<SocketAddr> {
        if let Some((_, a)) = self.side_addrs.borrow().iter().find(|(o, _)| o == origin) {
            return Some(*a);
        }
        if let Some(a) = fixed_address(&self.shared.cfg.resolve, origin) {
            self.side_addrs.borrow_mut().push((origin.clone(), a));
            return Some(a);
        }
        let addr = tokio::net::lookup_host(origin.socket_string())
            .await
            .ok()?
            .next()?;
        self.side_addrs.borrow_mut().push((origin.clone(), addr));
        Some(addr)
    }

    /// Appends one line to the thread's share of the request log.
    fn log_line(
        &self,
        tag: usize,
        t0: Instant,
        times: Option<(Instant, Instant)>,
        status: u16,
        bytes: u64,
        outcome: &str,
    ) {
        let mut log = self.log.borrow_mut();
        self.shared
            .log_line(&mut log, tag, t0, times, status, bytes, outcome);
    }

    fn think(&self, session_gap: Option<Duration>) -> Option<Duration> {
        match self.shared.cfg.think_time {
            ThinkTime::None => None,
            ThinkTime::Fixed(d) => Some(d),
            ThinkTime::Trace(scale) => session_gap.map(|g| g.mul_f64(scale.max(0.0))),
        }
    }

    /// Closed loop: counts `items` as started at `t0` (the caller's clock reading, just
    /// before), runs them, and after a failed connection attempt waits a little so that a
    /// refusing server does not turn the loop into a spin.
    async fn closed_items(
        &self,
        slot: &mut Slot,
        items: &[Item],
        t0: Instant,
        pending: &mut Vec<Pending>,
    ) -> Flow {
        self.rec.borrow_mut().started(items.len(), t0);
        let flow = self
            .run_items(slot, items, t0, None, self.shared.end, pending)
            .await;
        if flow == Flow::Continue && slot.connect_failed && !self.pause(Some(CONNECT_BACKOFF)).await
        {
            return Flow::Stop;
        }
        flow
    }

    /// Sleeps for a think time, but not past the end of the run. False when the run ended.
    async fn pause(&self, d: Option<Duration>) -> bool {
        if let Some(d) = d.filter(|d| !d.is_zero()) {
            let until = Instant::now() + d;
            let until = self.shared.end.map_or(until, |e| e.min(until));
            tokio::time::sleep_until(until.into()).await;
        }
        self.shared.before_end(Instant::now())
    }

    /// The configured think time between a closed loop's batches, if any. False when the run
    /// ended during it; with no think time, true at once (the loop checks the end of the run
    /// with its next batch's clock reading).
    async fn think_between(&self) -> bool {
        match self.think(None) {
            Some(d) if !d.is_zero() => self.pause(Some(d)).await,
            _ => true,
        }
    }

    /// Closed loop over the target URL (with `pipeline` requests per write).
    async fn url_loop(self: Rc<Self>) {
        let shared = self.shared.clone();
        let items = &shared.rendered.items[..];
        let mut slot = self.new_slot();
        let mut pending = Vec::new();
        loop {
            // One clock reading per batch: the end of the run is checked with the time the
            // batch starts at.
            let now = Instant::now();
            if !shared.before_end(now) || !shared.take_budget(items.len()) {
                break;
            }
            if self.closed_items(&mut slot, items, now, &mut pending).await == Flow::Stop {
                break;
            }
            if !self.think_between().await {
                break;
            }
        }
    }

    /// Closed loop over the trace in log order: each connection takes the next request.
    async fn trace_loop(self: Rc<Self>) {
        let shared = self.shared.clone();
        let items = &shared.rendered.items[..];
        if items.is_empty() {
            return;
        }
        let mut slot = self.new_slot();
        let mut pending = Vec::new();
        loop {
            let now = Instant::now();
            if !shared.before_end(now) || !shared.take_budget(1) {
                break;
            }
            let mut i = shared.next.fetch_add(1, Ordering::Relaxed);
            if i >= items.len() {
                if !shared.cfg.loop_trace {
                    break;
                }
                i %= items.len();
            }
            let one = std::slice::from_ref(&items[i]);
            if self.closed_items(&mut slot, one, now, &mut pending).await == Flow::Stop {
                break;
            }
            if !self.think_between().await {
                break;
            }
        }
    }

    /// Session replay: each slot takes the next session, opens a connection, sends its
    /// batches pipelined with think times in between, and closes the connection.
    async fn session_loop(self: Rc<Self>) {
        let shared = self.shared.clone();
        let sessions = &shared.rendered.sessions;
        if sessions.is_empty() {
            return;
        }
        let mut slot = self.new_slot();
        let mut pending = Vec::new();
        'sessions: loop {
            if !shared.before_end(Instant::now()) {
                break;
            }
            let mut i = shared.next.fetch_add(1, Ordering::Relaxed);
            if i >= sessions.len() {
                if !shared.cfg.loop_trace {
                    break;
                }
                i %= sessions.len();
            }
            let (batches, thinks) = &sessions[i];
            let n: usize = batches.iter().map(|b| b.len()).sum();
            if !shared.take_budget(n) {
                break;
            }
            slot.close();
            for (b, range) in batches.iter().enumerate() {
                if b > 0 {
                    let gap = thinks.get(b - 1).copied();
                    if !self.pause(self.think(gap)).await {
                        break 'sessions;
                    }
                }
                let items = &shared.rendered.items[range.clone()];
                let t0 = Instant::now();
                if self.closed_items(&mut slot, items, t0, &mut pending).await == Flow::Stop {
                    break 'sessions;
                }
            }
            slot.close();
        }
    }

    fn next_uniform(&self) -> f64 {
        // xorshift64*
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((r >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Open loop: issues requests on the rate profile's schedule, whatever the responses do.
    async fn open_loop(self: Rc<Self>, index: usize, threads: usize) {
        let shared = self.shared.clone();
        let profile = shared.cfg.rate_profile.clone().unwrap_or_default();
        let trace_len = shared.rendered.items.len();
        let mut step_start = shared.start;
        'steps: for (si, step) in profile.steps.iter().enumerate() {
            let step_end = step_start + step.duration;
            if step.rate > 0.0 {
                let period = threads as f64 / step.rate;
                let mut k = 0u64;
                let mut t = step_start;
                loop {
                    let due = match shared.cfg.arrival {
                        Arrival::Uniform => {
                            step_start
                                + Duration::from_secs_f64(
                                    (k as f64 * threads as f64 + index as f64) / step.rate,
                                )
                        }
                        Arrival::Poisson => {
                            t += Duration::from_secs_f64(-self.next_uniform().ln() * period);
                            t
                        }
                    };
                    if due >= step_end {
                        break;
                    }
                    k += 1;
                    if due > Instant::now() {
                        tokio::time::sleep_until(due.into()).await;
                    }
                    if !shared.take_budget(1) {
                        break 'steps;
                    }
                    let now = Instant::now();
                    self.rec.borrow_mut().issued(Some(si), now);
                    if self.inflight.get() >= shared.max_inflight_per_thread {
                        self.rec
                            .borrow_mut()
                            .error(Some(si), ErrorKind::ClientLimit, now);
                        continue;
                    }
                    let item = match &shared.cfg.workload {
                        Workload::Trace(_) if trace_len > 0 => {
                            shared.next.fetch_add(1, Ordering::Relaxed) % trace_len
                        }
                        _ => 0,
                    };
                    self.inflight.set(self.inflight.get() + 1);
                    let w = self.clone();
                    tokio::task::spawn_local(async move {
                        let mut slot = w.pool.borrow_mut().pop().unwrap_or_else(|| w.new_slot());
                        let mut pending = Vec::new();
                        let items = std::slice::from_ref(&w.shared.rendered.items[item]);
                        w.run_items(
                            &mut slot,
                            items,
                            Instant::now(),
                            Some(si),
                            None,
                            &mut pending,
                        )
                        .await;
                        w.pool.borrow_mut().push(slot);
                        w.inflight.set(w.inflight.get() - 1);
                    });
                }
            }
            step_start = step_end;
            let now = Instant::now();
            if step_end > now {
                tokio::time::sleep_until(step_end.into()).await;
            }
        }
        // Wait for the requests still in flight (bounded by the timeout).
        while self.inflight.get() > 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

pub(crate) fn is_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

fn csv_field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        std::borrow::Cow::Owned(format!("\"{}\"", s.replace('"', "\"\"")))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// Runs one worker thread to completion and returns what it measured.
pub(crate) fn run_worker(
    shared: Arc<Shared>,
    progress: Arc<Progress>,
    index: usize,
    threads: usize,
    connections: usize,
) -> std::io::Result<(Totals, Instant)> {
    // I/O and timers only: the process driver of `enable_all` looks for exited children at
    // every park of the loop (1 % of the generator's user time), and a worker starts none.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let steps = shared
        .cfg
        .rate_profile
        .as_ref()
        .map_or(0, |p| p.steps.len());
    let rec = Recorder::new(steps, shared.start, shared.series.clone(), progress);
    let worker = Rc::new(Worker::new(shared.clone(), rec, index));
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let now = Instant::now();
        if shared.start > now {
            tokio::time::sleep_until(shared.start.into()).await;
        }
        if shared.cfg.rate_profile.is_some() {
            worker.clone().open_loop(index, threads).await;
            return;
        }
        let mut handles = Vec::with_capacity(connections);
        for _ in 0..connections {
            let w = worker.clone();
            handles.push(tokio::task::spawn_local(async move {
                match w.shared.cfg.workload {
                    Workload::Url => w.url_loop().await,
                    Workload::Trace(_) => w.trace_loop().await,
                    Workload::Sessions(_) => w.session_loop().await,
                }
            }));
        }
        for h in handles {
            let _ = h.await;
        }
    });
    let finished = Instant::now();
    drop(local);
    drop(rt);
    let worker = Rc::try_unwrap(worker).unwrap_or_else(|_| panic!("worker still shared"));
    {
        let mut log = worker.log.borrow_mut();
        if !log.is_empty() {
            worker.shared.flush_log(&mut log);
        }
    }
    let mut rec = worker.rec.into_inner();
    rec.flush();
    Ok((rec.totals, finished))
}

/// A connection to `addr`, from `local` when given.
async fn connect(addr: SocketAddr, local: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let Some(ip) = local else {
        return TcpStream::connect(addr).await;
    };
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    sock.bind(SocketAddr::new(ip, 0))?;
    sock.connect(addr).await
}

/// The fixed address (`--resolve`) of `origin`, if one is given.
pub(crate) fn fixed_address(
    resolve: &[(String, SocketAddr)],
    origin: &Origin,
) -> Option<SocketAddr> {
    let key = origin.socket_string();
    resolve
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(&key))
        .map(|(_, a)| *a)
}
