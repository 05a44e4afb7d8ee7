//! One client connection: read requests, answer them in order.
//!
//! The loop parses every complete request already buffered before it
//! writes, so pipelined requests are answered in order with as few
//! writes as possible; it flushes before it would block on a read.
//!
//! Memory per idle connection is kept small on purpose (the node must hold
//! tens of thousands of idle keep-alive connections): an idle connection
//! holds no buffers, since it waits for readability first and allocates
//! only when bytes arrive, and the work of answering a request lives in a
//! separately boxed future, so the task that sleeps between requests is
//! only the small state of waiting for the next head. A plain connection
//! that stays idle longer ([`serve_parking`]) gives up even that task: it
//! is handed back to be parked in its worker's table
//! (`switchyard_runtime::park`) and served by a new task when its client
//! sends again.
//!
//! A connection handed in by a switch runs the same loop with a [`Router`]
//! attached ([`serve_routed`]): before each request it asks the router how
//! to serve it (here, fetched from another node, or given back), and tells
//! it about each response it chose to have served here once that response
//! is complete and once it is written. The loop knows nothing of switches or
//! control connections: `crate::handoff` implements the router. Ordinary
//! accepted connections carry no router and take the same path as before.
//!
//! Requests for the paths of `[dynamic]` go to the application server
//! ([`dynamic`]) on whichever connection they arrive, routed or not.

mod dynamic;

use std::cell::RefCell;
use std::fs::File;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::timeout_at;

use switchyard_http::conditional::{if_range_allows, none_match, not_modified_since};
use switchyard_http::path;
use switchyard_http::range::{evaluate, RangeDecision};
use switchyard_http::request::{BodyFraming, Limits, Method, RequestHead, Version};
use switchyard_http::response::{DateCache, ResponseHead};
use switchyard_http::upstream::client_response_head;
use switchyard_runtime::{ClientSocket, WaitTimer};
use switchyard_upstream::splice::{send_to_client, send_to_client_or_wait, GATHER_MIN};

use crate::forward;
use crate::fs::FileInfo;
use crate::metrics::NodeMetrics;
use crate::store::{CachedObject, Content, Resolved, Store};
use switchyard_runtime::request::{self as reading, BodyError, ClientConn, ClientParts};
use switchyard_runtime::request::{HeadEnd, HeadWait, Idle, Next};
use switchyard_runtime::shed::{Waiting, WaitingClients};
use switchyard_runtime::spare;

// The rescue server's requests (`crate::rescue`), answered with the loop's own helpers.
#[path = "rescue/serve.rs"]
mod rescue_serve;
pub(crate) use dynamic::Dynamic;

/// Buffered responses are flushed once this much is pending.
const FLUSH_AT: usize = 64 * 1024;

/// Shared by every connection of a node.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) limits: Limits,
    pub(crate) store: Arc<Store>,
    pub(crate) metrics: Arc<NodeMetrics>,
    pub(crate) header_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) send_timeout: Duration,
    /// Connections waiting on their clients, to shed for new ones when every slot is taken.
    pub(crate) waiting: Arc<WaitingClients>,
    /// Hot-object replication, in a cooperative cluster that has it on.
    pub(crate) replication: Option<Arc<crate::replica::Replication>>,
    /// The rescue server's virtual hosts and proxy, on a node with a `[rescue]` table.
    pub(crate) rescue: Option<Arc<crate::rescue::RescueProxy>>,
    /// The rescue driver's request path (meter and redirector), with `[rescue.peering]`.
    pub(crate) traffic: Option<Arc<switchyard_rescue_driver::Traffic>>,
    /// The application server for dynamic paths, if `[dynamic]` is configured.
    pub(crate) dynamic: Option<Dynamic>,
}

/// What the loop does with a request of a routed connection.
pub(crate) enum Step {
    /// Serve it here; `dispatched` when the router chose this (the router
    /// hears of its response through [`Router::answered`]).
    Local { dispatched: bool },
    /// Fetch it from the node whose HTTP listener is at this address.
    Forward(SocketAddr),
    /// End the loop with this request unread: the connection goes elsewhere.
    HandBack,
    /// Serve it here from this object (a replica of a peer's), not from the store; dispatched.
    Replica(Arc<CachedObject>),
    /// Fetch the whole response from a peer's HTTP listener, hold it, then send it (a
    /// cooperative cluster's `fetch` mechanism).
    Fetch(Fetch),
    /// Serve it here, as the target's owner, for a peer that fetches it and keeps the
    /// response as its copy if the target is hot; dispatched.
    Copy(CopyTo),
}

/// A peer fetching a request from its owner and asking for a copy ([`Step::Copy`]).
#[derive(Debug)]
pub(crate) struct CopyTo {
    /// The object's key in the store.
    pub key: String,
    /// The peer's member name.
    pub peer: String,
    /// The largest body the peer holds whole.
    pub max_bytes: u64,
}

/// What a fetching node needs to keep a copy that comes with the response ([`Fetch::copy`]).
#[derive(Debug)]
pub(crate) struct FetchCopy {
    pub replication: Arc<crate::replica::Replication>,
    /// The object's key in the store.
    pub key: String,
    /// This node's member name, which the owner counts among the copy's holders.
    pub me: String,
}

/// A request a cooperative node fetches from its owner ([`Step::Fetch`]).
#[derive(Debug)]
pub(crate) struct Fetch {
    /// The owner's HTTP listener.
    pub addr: SocketAddr,
    /// The largest response held whole; a larger one is relayed as it arrives.
    pub hold_max: u64,
    /// Where the fetch is counted.
    pub counts: Arc<FetchCounts>,
    /// With replication: ask the owner for the response as a copy of a hot object.
    pub copy: Option<FetchCopy>,
}

/// Counters of the fetches from one peer.
#[derive(Debug, Default)]
pub(crate) struct FetchCounts {
    /// Responses fetched and sent to the client.
    pub fetched: AtomicU64,
    /// Of those, the ones held whole before they were sent.
    pub held: AtomicU64,
    /// Bytes sent to clients from fetched responses (heads and bodies).
    pub bytes: AtomicU64,
    /// Fetches that failed before anything reached the client (the request was served here).
    pub failed: AtomicU64,
}

/// Decides, request by request, how a routed connection is served, and
/// hears about the responses it dispatched.
pub(crate) trait Router: Send {
    /// Whether [`Router::route`] will wait for an answer from elsewhere for
    /// the next request (the loop writes earlier responses first).
    fn asks(&self) -> bool;

    /// Whether the connection goes elsewhere now, before another request is
    /// read (a clone whose one request is answered): the loop writes what it
    /// produced and ends with whatever the client sent meanwhile unread.
    fn leaves(&self) -> bool {
        false
    }

    /// How to serve the request whose head is `head`.
    fn route(&mut self, head: &RequestHead) -> impl Future<Output = Step> + Send;

    /// The response to a dispatched request is complete in the output:
    /// its status and length.
    fn answered(&mut self, status: u16, bytes: u64);

    /// Whether the body of the response about to be reported by
    /// [`Router::answered`] came from the memory cache (told just before it,
    /// for a router that passes it on).
    fn cache_hit(&mut self, _hit: bool) {}

    /// Everything produced so far has been written to the client.
    fn flushed(&mut self);

    /// Whether the client's packets reach this host only through another host's steering
    /// entry (a connection restored here with `TCP_REPAIR`), which that host removes soon
    /// after this one reports the connection closed. A close then shuts down the sending side
    /// and waits for the client's own close, up to the send timeout, before the loop ends: a
    /// response written into the socket is not yet received, and the client's
    /// acknowledgements and window updates for its tail must still find this host. Closed at
    /// once, the report would let the entry go while they are on their way, and the client
    /// would wait for the rest for ever.
    fn steered(&self) -> bool {
        false
    }

    /// Whether a connection with this router stays on this host for good. The node's shutdown
    /// then ends its waits on its client itself ([`WaitingClients::close_all`]), and the
    /// waits need not watch the stop signal. One that may still move elsewhere as it drains
    /// keeps watching the signal: its closed reading side would go with it.
    const STAYS: bool = false;
}

/// The router of an ordinary accepted connection: there is none.
pub(crate) enum Unrouted {}

impl Router for Unrouted {
    const STAYS: bool = true;

    fn asks(&self) -> bool {
        match *self {}
    }

    async fn route(&mut self, _: &RequestHead) -> Step {
        match *self {}
    }

    fn answered(&mut self, _: u16, _: u64) {
        match *self {}
    }

    fn flushed(&mut self) {
        match *self {}
    }
}

thread_local! {
    /// The `Date` and `Server` lines, formatted once per second per worker thread.
    static DATE: RefCell<DateCache> = RefCell::new(DateCache::default());
}

/// Run `f` with the current `Date` and `Server` header lines ([`DateCache::lines`]).
fn with_date<R>(f: impl FnOnce(&str) -> R) -> R {
    DATE.with(|d| f(d.borrow_mut().lines(SystemTime::now())))
}

/// Where sendfile reads a body from.
enum SendSource {
    /// A file too large for the cache, opened for this response.
    Disk(File),
    /// A cached object kept in the store's memfd arena.
    Cached(Arc<CachedObject>),
}

impl SendSource {
    /// The file and where the body starts in it.
    fn file(&self) -> Option<(&File, u64)> {
        match self {
            SendSource::Disk(f) => Some((f, 0)),
            SendSource::Cached(o) => match &o.content {
                Content::Arena(s) => Some((s.file(), s.offset())),
                Content::Inline(_) => None,
            },
        }
    }
}

/// A response body.
enum Body {
    Empty,
    /// A redirect to a rescue server, already in the output and already counted by the
    /// rescue meter (as a redirect, not as served bytes).
    Redirected,
    /// Small: copied behind the head.
    Bytes(Bytes),
    /// Sent with sendfile(2).
    File {
        src: SendSource,
        offset: u64,
        len: u64,
    },
    /// Read with `O_DIRECT` piece by piece and sent ([`crate::store::Resolved::Direct`]).
    Direct {
        file: Arc<File>,
        offset: u64,
        len: u64,
    },
}

struct Conn<'a, R: Router> {
    /// Listed as waiting on the client since the last write of an answer
    /// ([`ClientConn::take_ticket`]). Declared before `stream`: it must leave the list
    /// before the socket closes.
    listed: Option<Waiting>,
    /// The response being written is the connection's last: see [`Conn::write_out`].
    closing: bool,
    ctx: &'a Ctx,
    /// Bare until the connection must wait ([`ClientSocket`]).
    stream: ClientSocket,
    buf: BytesMut,
    out: Vec<u8>,
    /// Start times of responses buffered in `out`, observed at flush.
    pending: Vec<Instant>,
    shutdown: watch::Receiver<bool>,
    stats: ConnStats,
    /// Status of the last response produced.
    last_status: u16,
    /// Whether the body of the last response produced came from the memory cache.
    last_hit: bool,
    /// Set on routed connections (handed in by a switch).
    router: Option<&'a mut R>,
    /// The object the request being answered is served from, when its router chose one.
    replica: Option<Arc<CachedObject>>,
    /// The peer the response being answered may become a copy for ([`Step::Copy`]).
    copy_to: Option<CopyTo>,
    /// How long a keep-alive connection waits in its task before it is parked; none: never
    /// parked (routed connections, which their router follows).
    park_after: Option<Duration>,
    /// The timer of its waits on the client, kept from one to the next.
    timer: WaitTimer,
}

/// Why the connection loop ended.
enum End {
    /// Peer closed, idle timeout, shutdown while idle, or our close done.
    Quiet,
    /// Send this status and close.
    Error(u16),
    /// I/O failed; nothing more can be sent.
    Broken,
    /// The router takes the connection back: everything answered is sent,
    /// and the next request is still unread in `buf`.
    Moved,
    /// Everything answered is sent and the connection has been idle for the parking delay:
    /// it waits on without a task ([`serve_parking`]).
    Park(Idle),
}

impl From<io::Error> for End {
    fn from(_: io::Error) -> End {
        End::Broken
    }
}

/// What one connection did, for the switch's notify-close message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Requests answered (any status).
    pub requests: u64,
    /// Response bytes written.
    pub bytes: u64,
}

impl std::ops::AddAssign for ConnStats {
    fn add_assign(&mut self, o: ConnStats) {
        self.requests += o.requests;
        self.bytes += o.bytes;
    }
}

/// How a routed connection's loop ended.
pub(crate) enum Outcome {
    /// The connection is closed (or broken).
    Closed(ConnStats),
    /// The router asked for the connection back: everything answered has
    /// been written; `rest` holds the next request's bytes, unread.
    Moved {
        stream: TcpStream,
        rest: BytesMut,
        stats: ConnStats,
    },
}

/// Where [`serve_parking`] begins.
pub(crate) enum Start {
    /// A connection just accepted; `preread` holds request bytes already taken from the
    /// socket by whoever accepted it, answered first.
    New { preread: BytesMut },
    /// A parked connection whose client sent again (or closed): it has answered before, and
    /// `ticket` is its place in the waiting list.
    Resumed { ticket: Option<Waiting> },
}

/// How [`serve_parking`] ended.
pub(crate) enum Served {
    /// The connection is closed, after what it did since it was last (re)started.
    Closed(ConnStats),
    /// The connection is idle, without buffers: park it until `idle.until`.
    Idle { stream: TcpStream, idle: Idle },
}

/// Serve an accepted connection until it closes or has waited `park_after` for its client's
/// next request; in the latter case it is given back to be parked
/// ([`switchyard_runtime::park`]), and served again from [`Start::Resumed`] when its client
/// sends.
pub(crate) async fn serve_parking(
    ctx: &Ctx,
    stream: ClientSocket,
    shutdown: watch::Receiver<bool>,
    start: Start,
    park_after: Duration,
) -> Served {
    let (first, listed, buf) = match start {
        Start::New { preread } => (true, None, preread),
        Start::Resumed { ticket } => (false, ticket, BytesMut::new()),
    };
    let mut conn = Conn::<Unrouted> {
        ctx,
        stream,
        buf,
        out: Vec::new(),
        pending: Vec::new(),
        shutdown,
        stats: ConnStats::default(),
        last_status: 0,
        last_hit: false,
        router: None,
        replica: None,
        copy_to: None,
        listed,
        closing: false,
        park_after: Some(park_after),
        timer: WaitTimer::new(),
    };
    match conn.run(first).await {
        End::Error(status) => {
            Box::pin(conn.fail(status)).await;
            Served::Closed(conn.stats)
        }
        // (A connection that waited is registered; a failure here closed it.)
        End::Park(idle) => match conn.stream.into_registered() {
            Ok(stream) => Served::Idle { stream, idle },
            Err(_) => Served::Closed(conn.stats),
        },
        End::Quiet | End::Broken | End::Moved => Served::Closed(conn.stats),
    }
}

/// Serve a routed connection: like [`serve_parking`] (but never parked), with `router` consulted
/// before each request and told about each response it dispatched.
pub(crate) async fn serve_routed<R: Router>(
    ctx: &Ctx,
    stream: TcpStream,
    shutdown: watch::Receiver<bool>,
    preread: BytesMut,
    router: &mut R,
) -> Outcome {
    let mut conn = Conn {
        ctx,
        stream: stream.into(),
        buf: preread,
        out: Vec::new(),
        pending: Vec::new(),
        shutdown,
        stats: ConnStats::default(),
        last_status: 0,
        last_hit: false,
        router: Some(router),
        replica: None,
        copy_to: None,
        listed: None,
        closing: false,
        park_after: None,
        timer: WaitTimer::new(),
    };
    match conn.run(true).await {
        End::Error(status) => {
            Box::pin(conn.fail(status)).await;
            Outcome::Closed(conn.stats)
        }
        End::Moved => match conn.stream.into_registered() {
            Ok(stream) => Outcome::Moved {
                stream,
                rest: conn.buf,
                stats: conn.stats,
            },
            Err(_) => Outcome::Closed(conn.stats),
        },
        End::Quiet | End::Broken | End::Park(_) => Outcome::Closed(conn.stats),
    }
}

/// Whether a request can be fetched from another node: GET or HEAD
/// (idempotent, so a failed fetch can be served here instead) without a body.
fn forwardable(head: &RequestHead) -> bool {
    matches!(head.method, Method::Get | Method::Head)
        && head.framing == BodyFraming::None
        && !head.expect_continue
}

/// What became of a forwarded request.
enum Forwarded {
    /// Answered from the peer; `Some` ends the connection.
    Done(Option<End>),
    /// Answered from the peer, the whole response held here before any of it was sent.
    Held(Option<End>),
    /// Nothing reached the client: serve the request here.
    NotSent,
}

/// A forwarded response goes through the connection's output buffer.
impl<R: Router> switchyard_upstream::Client for Conn<'_, R> {
    fn pending(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    async fn write_pending(&mut self) -> io::Result<()> {
        self.flush().await
    }

    fn socket(&mut self) -> io::Result<&TcpStream> {
        self.stream.registered().map(|s| &*s)
    }
}

/// Requests are read with the runtime's helpers; the loop's pipelined
/// responses are written before it waits for more.
impl<R: Router> ClientConn for Conn<'_, R> {
    fn parts(&mut self) -> ClientParts<'_> {
        ClientParts {
            stream: &mut self.stream,
            buf: &mut self.buf,
            shutdown: &mut self.shutdown,
            timer: &mut self.timer,
        }
    }

    fn before_wait(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        self.flush()
    }

    fn idle(&mut self) {
        spare::give_vec(std::mem::take(&mut self.out));
    }

    async fn send_continue(&mut self) -> io::Result<()> {
        self.out.extend_from_slice(reading::CONTINUE);
        self.flush().await
    }

    fn waiting_list(&self) -> Option<&Arc<WaitingClients>> {
        Some(&self.ctx.waiting)
    }

    fn take_ticket(&mut self) -> Option<Waiting> {
        self.listed.take()
    }

    fn list_closed_at_shutdown(&self) -> bool {
        self.ends_at_shutdown()
    }
}

impl<R: Router> Conn<'_, R> {
    /// Serve requests until the connection ends; `first`: it has answered none yet.
    async fn run(&mut self, mut first: bool) -> End {
        loop {
            let head = match self.next_head(first).await {
                Ok(h) => h,
                Err(e) => return e,
            };
            // A plain request is answered in the loop's own future, with no allocation per
            // request (the connection's whole future is boxed once, `Plain::spawn`); the
            // routed path's state is larger and boxed, so that a plain connection holds no
            // room for it.
            let end = if self.router.is_some() {
                Box::pin(self.routed(head)).await
            } else {
                self.handle(head).await
            };
            if let Some(end) = end {
                return end;
            }
            if self.router.as_deref().is_some_and(R::leaves) {
                if self.flush().await.is_err() {
                    return End::Broken;
                }
                return End::Moved;
            }
            if first {
                // The connection carries a second response: from now on a
                // small write must not wait behind an unacknowledged one
                // (Nagle). A one-request connection never needs the call.
                let _ = self.stream.set_nodelay(true);
                first = false;
            }
        }
    }

    /// Room for `n` more bytes in `out`; after an idle wait, in a buffer an earlier request
    /// on this thread gave back (a fresh one grew twice per request, head then body: about
    /// 600 instructions of allocation and copying at 1 KiB).
    fn room(&mut self, n: usize) {
        if self.out.capacity() == 0 {
            self.out = spare::take_vec();
        }
        self.out.reserve(n);
    }

    /// Bytes of responses produced so far: written, or waiting in `out`.
    fn produced(&self) -> u64 {
        self.stats.bytes + self.out.len() as u64
    }

    fn count_status(&mut self, code: u16) {
        self.last_status = code;
        self.last_hit = false;
        self.ctx.metrics.count_status(code);
    }

    /// Answer one request of a routed connection as its router says.
    async fn routed(&mut self, head: RequestHead) -> Option<End> {
        if self.router.as_deref().is_some_and(R::asks) {
            // The answer takes a round trip: let the client have the
            // earlier responses meanwhile.
            if self.flush().await.is_err() {
                return Some(End::Broken);
            }
        }
        let step = match self.router.as_deref_mut() {
            Some(d) => d.route(&head).await,
            None => Step::Local { dispatched: false },
        };
        let before = self.produced();
        let (end, dispatched) = match step {
            Step::HandBack => {
                if self.flush().await.is_err() {
                    return Some(End::Broken);
                }
                return Some(End::Moved);
            }
            // A dynamic request is answered by this node's own application server.
            Step::Forward(peer) if forwardable(&head) && !self.is_dynamic(&head) => {
                match self.forward(&head, peer, None).await {
                    Forwarded::Done(end) | Forwarded::Held(end) => (end, true),
                    Forwarded::NotSent => (self.handle(head).await, true),
                }
            }
            Step::Forward(_) => (self.handle(head).await, true),
            Step::Fetch(f) if forwardable(&head) && !self.is_dynamic(&head) => {
                let before = self.produced();
                let fetched = match self.forward(&head, f.addr, Some(&f)).await {
                    Forwarded::Done(end) => Some((end, false)),
                    Forwarded::Held(end) => Some((end, true)),
                    Forwarded::NotSent => None,
                };
                match fetched {
                    Some((end, held)) => {
                        f.counts.fetched.fetch_add(1, Relaxed);
                        f.counts.held.fetch_add(u64::from(held), Relaxed);
                        f.counts.bytes.fetch_add(self.produced() - before, Relaxed);
                        (end, true)
                    }
                    None => {
                        f.counts.failed.fetch_add(1, Relaxed);
                        (self.handle(head).await, true)
                    }
                }
            }
            Step::Fetch(_) => (self.handle(head).await, true),
            Step::Local { dispatched } => (self.handle(head).await, dispatched),
            Step::Replica(object) => {
                self.replica = Some(object);
                let end = self.handle(head).await;
                self.replica = None;
                (end, true)
            }
            Step::Copy(to) => {
                self.copy_to = Some(to);
                let end = self.handle(head).await;
                self.copy_to = None;
                (end, true)
            }
        };
        if dispatched {
            let bytes = self.produced() - before;
            let status = self.last_status;
            let hit = self.last_hit;
            if let Some(d) = self.router.as_deref_mut() {
                d.cache_hit(hit);
                d.answered(status, bytes);
                // A connection that ended quietly has flushed everything.
                if matches!(end, Some(End::Quiet)) {
                    d.flushed();
                }
            }
        }
        end
    }

    /// Fetch the response to `head` from the node whose HTTP listener is at
    /// `peer` (back-end forwarding) and send it to the client with the
    /// client's own keep-alive and version. With `fetch`, a response whose body
    /// is delimited by a `Content-Length` of at most its `hold_max` bytes (or has
    /// none) is read whole before any of it is written (store and forward,
    /// as cooperative caching forwards a cache copy), and kept as a copy of a hot
    /// object when the fetch asks for one and the owner offers it; others are
    /// relayed as they arrive.
    async fn forward(
        &mut self,
        head: &RequestHead,
        peer: SocketAddr,
        fetch: Option<&Fetch>,
    ) -> Forwarded {
        let hold = fetch.map(|f| f.hold_max);
        let copy = fetch
            .and_then(|f| f.copy.as_ref())
            .filter(|_| head.method == Method::Get);
        let started = Instant::now();
        let http10 = head.version == Version::Http10;
        let mut req = Vec::with_capacity(head.head_len + 64);
        let client_ip = self.stream.peer_addr().ok().map(|a| a.ip().to_string());
        switchyard_http::upstream::forward_request_head(
            &self.buf[..head.head_len],
            head.plain,
            http10,
            client_ip.as_deref(),
            &mut req,
        );
        // The peer says whether its response came from its cache: the switch's policy hears
        // it of the source, with this response's `Served`.
        switchyard_http::upstream::ask_cache_report(&mut req);
        if let (Some(c), Some(max)) = (copy, hold) {
            switchyard_http::upstream::ask_copy(&mut req, &c.me, max);
        }
        // A peer with the same limits would refuse a head that the added fields took over
        // them: such a request is served here instead.
        if !switchyard_http::upstream::forwarded_head_fits(&req, &self.ctx.limits) {
            return Forwarded::NotSent;
        }
        let until = tokio::time::Instant::now() + self.ctx.send_timeout;
        let is_head = head.method == Method::Head;
        let ctx = self.ctx;
        let metrics = &ctx.metrics.handoff;
        let (mut pc, r) = match forward::exchange(peer, &req, is_head, until).await {
            Ok(ok) => ok,
            Err(e) => {
                metrics.forward_failures.fetch_add(1, Relaxed);
                tracing::debug!(%peer, error = %e, "forward failed; serving locally");
                return Forwarded::NotSent;
            }
        };
        let meta = r.meta;
        let chunked = meta.body == switchyard_http::upstream::BodyLength::Chunked;
        if chunked && http10 {
            // An HTTP/1.0 client cannot take a chunked body.
            metrics.forward_failures.fetch_add(1, Relaxed);
            return Forwarded::NotSent;
        }
        let keep = head.keep_alive
            && !self.stopping()
            && meta.body != switchyard_http::upstream::BodyLength::UntilClose;
        let before = self.produced();
        let deadline = switchyard_upstream::Deadline::At(until);
        let held = match (hold, meta.body) {
            (Some(max), switchyard_http::upstream::BodyLength::Length(n)) if n <= max => true,
            (Some(_), switchyard_http::upstream::BodyLength::None) => true,
            _ => false,
        };
        if held {
            let collected = switchyard_upstream::read_body(
                &mut pc,
                meta.body,
                meta.keep_alive,
                u64::MAX,
                deadline,
            )
            .await;
            let body = match collected {
                Ok(switchyard_upstream::Collected::Body { body, reusable }) => {
                    if reusable {
                        forward::check_in(pc);
                    }
                    body
                }
                // (Not with an unbounded limit.)
                Ok(switchyard_upstream::Collected::TooLarge) => return Forwarded::NotSent,
                Err(e) => {
                    metrics.forward_failures.fetch_add(1, Relaxed);
                    tracing::debug!(%peer, error = %e, "fetched response broke off; serving locally");
                    return Forwarded::NotSent;
                }
            };
            if let Some(c) = copy.filter(|_| meta.status == 200) {
                if let Some(offer) = switchyard_http::upstream::CopyOffer::from_head(&r.head) {
                    c.replication.receive_fetched(&c.key, offer, body.to_vec());
                }
            }
            self.room(1024 + body.len());
            client_response_head(&r.head, &meta, keep, http10, &mut self.out);
            self.out.extend_from_slice(&body);
            return self
                .forwarded(head, &r.head, meta.status, started, before, keep, true)
                .await;
        }
        let out_mark = self.out.len();
        let written_mark = self.stats.bytes;
        self.room(1024);
        client_response_head(&r.head, &meta, keep, http10, &mut self.out);
        let opts = switchyard_upstream::RelayOptions {
            deadline: switchyard_upstream::Deadline::At(until),
            flush_at: FLUSH_AT,
            // Written with the responses that follow, or when the connection closes.
            flush_end: false,
            direct: None,
        };
        let relayed =
            switchyard_upstream::relay_body(&mut pc, meta.body, meta.keep_alive, self, opts).await;
        match relayed {
            Ok(done) if done.reusable => forward::check_in(pc),
            Ok(_) => {}
            Err(e) => {
                metrics.forward_failures.fetch_add(1, Relaxed);
                tracing::debug!(%peer, error = %e, "forwarded response broke off");
                if self.stats.bytes == written_mark {
                    // Nothing of it reached the client: serve it here instead.
                    self.out.truncate(out_mark);
                    return Forwarded::NotSent;
                }
                return Forwarded::Done(Some(End::Broken));
            }
        }
        self.forwarded(head, &r.head, meta.status, started, before, keep, false)
            .await
    }

    /// The forwarded response to `head` (from a peer's response head `peer_head` with
    /// `status`, started at `started`, output from `before` on) is in the output: count it,
    /// and close or flush as due. `held`: it was held whole before it was written.
    #[allow(clippy::too_many_arguments)]
    async fn forwarded(
        &mut self,
        head: &RequestHead,
        peer_head: &[u8],
        status: u16,
        started: Instant,
        before: u64,
        keep: bool,
        held: bool,
    ) -> Forwarded {
        let metrics = &self.ctx.metrics.handoff;
        self.stats.requests += 1;
        self.buf.advance(head.head_len);
        self.count_status(status);
        self.last_hit = switchyard_http::upstream::from_cache(peer_head);
        metrics.forwards.fetch_add(1, Relaxed);
        metrics
            .forward_bytes
            .fetch_add(self.produced() - before, Relaxed);
        self.pending.push(started);
        let end = if !keep {
            Some(self.close().await)
        } else if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
            Some(End::Broken)
        } else {
            None
        };
        if held {
            Forwarded::Held(end)
        } else {
            Forwarded::Done(end)
        }
    }

    /// Whether the request goes to the application server.
    fn is_dynamic(&self, head: &RequestHead) -> bool {
        self.ctx.dynamic.as_ref().is_some_and(|d| d.serves(head))
    }

    /// Answer one request; `Some` ends the connection.
    async fn handle(&mut self, head: RequestHead) -> Option<End> {
        let ctx = self.ctx;
        // The application server serves this site's own names only: on a rescue server, the
        // names of the origins it rescues (and names it does not serve) go to the proxy below.
        let own_site = || ctx.rescue.as_ref().is_none_or(|r| r.is_own(&head));
        if let Some(app) = ctx
            .dynamic
            .as_ref()
            .filter(|d| d.serves(&head) && own_site())
        {
            // Boxed: an exchange with the application server holds more state than the
            // rest of a request, and the loop that answers every request would hold room
            // for it.
            return Box::pin(self.dynamic(head, app)).await;
        }
        let started = Instant::now();
        self.stats.requests += 1;
        self.buf.advance(head.head_len);
        let http10 = head.version == Version::Http10;
        if self.ctx.rescue.is_some() {
            if let Some(end) = Box::pin(self.rescue(&head, started)).await {
                return end;
            }
        }
        if !matches!(head.method, Method::Get | Method::Head) {
            // Bodies of refused methods are not read: answer and close.
            let status = if head.method == Method::Other {
                501
            } else {
                405
            };
            let keep = head.keep_alive && head.framing == BodyFraming::None && !self.stopping();
            self.room(512);
            self.error_response(status, keep, head.method, http10);
            self.pending.push(started);
            return if keep { None } else { Some(self.close().await) };
        }
        if head.framing != BodyFraming::None {
            // Boxed, as a body on a GET is rare: see `dynamic` above.
            if let Err(e) = Box::pin(self.discard_body(&head)).await {
                return Some(e);
            }
        }
        let keep = head.keep_alive && !self.stopping();
        self.closing = !keep;
        // A response head is a few hundred bytes; reserve once rather than
        // growing an empty buffer piece by piece.
        self.room(1024);
        let before = self.produced();
        let body = self.respond(&head, keep).await;
        let metered = matches!(body, Body::Redirected);
        match body {
            Body::Empty | Body::Redirected => {}
            // A large cached body leaves with the head in one gathered send rather than being
            // copied behind it; a small one is cheaper copied, and so batched with the answers
            // to any requests pipelined behind it.
            Body::Bytes(b) if b.len() >= GATHER_MIN => {
                if self.write_out_with(&b, false).await.is_err() {
                    return Some(End::Broken);
                }
            }
            Body::Bytes(b) => self.out.extend_from_slice(&b),
            Body::File { src, offset, len } => {
                let Some((file, start)) = src.file() else {
                    return Some(End::Broken);
                };
                if self.write_out(true).await.is_err()
                    || self.sendfile(file, start + offset, len).await.is_err()
                {
                    return Some(End::Broken);
                }
            }
            Body::Direct { file, offset, len } => {
                if self.write_out(true).await.is_err()
                    || self.send_direct(file, offset, len).await.is_err()
                {
                    return Some(End::Broken);
                }
            }
        }
        if let Some(t) = self.ctx.traffic.as_ref().filter(|_| !metered) {
            // The site's own response, head and body (seed 001 §4.3: outbound HTTP only).
            t.served(self.produced() - before);
        }
        self.pending.push(started);
        if !keep {
            return Some(self.close().await);
        }
        if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
            return Some(End::Broken);
        }
        None
    }

    /// Send an error status, then close; the client may still be sending
    /// (that is often why it failed), so always linger.
    async fn fail(&mut self, status: u16) {
        self.closing = true;
        self.error_response(status, false, Method::Get, false);
        if self.flush().await.is_ok() {
            self.linger().await;
        }
    }

    /// A `302` to `location` with an empty body, queued in the output.
    pub(crate) fn redirect_response(&mut self, location: &str, keep: bool, http10: bool) {
        with_date(|date_server| {
            ResponseHead::new(&mut self.out, 302)
                .lines(date_server)
                .header("Location", location)
                .content_length(0)
                .connection(keep, http10)
                .finish()
        });
        self.count_status(302);
    }

    fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Flush what is pending, then close. When the client has sent
    /// nothing beyond what was answered, closing at once is safe;
    /// otherwise linger so that unread bytes cannot turn our close into a
    /// reset that destroys the response.
    async fn close(&mut self) -> End {
        self.closing = true;
        if self.flush().await.is_err() {
            return End::Broken;
        }
        if !self.buf.is_empty() || self.steered() {
            self.linger().await;
        }
        End::Quiet
    }

    /// Whether the router says the connection's packets come through another host's
    /// steering ([`Router::steered`]).
    fn steered(&self) -> bool {
        self.router.as_ref().is_some_and(|r| r.steered())
    }

    /// Parse the next request head, reading (and flushing) as needed.
    async fn next_head(&mut self, first: bool) -> Result<RequestHead, End> {
        let park_after = self.park_after;
        let ctx = self.ctx;
        let wait = HeadWait {
            limits: &ctx.limits,
            header: ctx.header_timeout,
            idle: ctx.idle_timeout,
            first,
            read_early: true,
        };
        match reading::next_head_or_park(self, wait, park_after).await {
            Ok(Next::Head(h)) => Ok(h),
            Ok(Next::Park(idle)) => Err(End::Park(idle)),
            Err(HeadEnd::Bad(e)) => {
                // The responses before it go out with the error response.
                tracing::debug!(error = %e, "bad request");
                Err(End::Error(e.status()))
            }
            Err(HeadEnd::Closed) => Err(End::Quiet),
            Err(HeadEnd::IdleTimeout) => {
                self.count_timeout();
                Err(End::Quiet)
            }
            Err(HeadEnd::TimedOut) => {
                self.count_timeout();
                Err(End::Error(408))
            }
            Err(HeadEnd::Broken) => Err(End::Broken),
        }
    }

    fn count_timeout(&self) {
        self.ctx.metrics.timeouts.fetch_add(1, Relaxed);
    }

    /// Read and drop a request body (GET and HEAD bodies carry no meaning).
    async fn discard_body(&mut self, head: &RequestHead) -> Result<(), End> {
        let max = self.ctx.limits.max_body_bytes;
        let timeout = self.ctx.header_timeout;
        match reading::read_body(self, head, max, timeout, None).await {
            Ok(()) => Ok(()),
            Err(BodyError::Malformed(_)) => Err(End::Error(400)),
            Err(BodyError::TooLarge) => Err(End::Error(413)),
            Err(BodyError::TimedOut) => {
                self.count_timeout();
                Err(End::Error(408))
            }
            Err(BodyError::Broken) => Err(End::Broken),
        }
    }

    /// During a rescue (seed 001 §4.4.4): redirect a request for the site's own file of `size`
    /// bytes to a rescue server, or refuse it at the redirect bound; `None` serves it here.
    /// The redirect is counted with its real size (A_redi).
    fn rescue_redirect(
        &mut self,
        t: &switchyard_rescue_driver::Traffic,
        head: &RequestHead,
        keep: bool,
        size: u64,
    ) -> Option<Body> {
        if !head.target.starts_with('/') {
            return None;
        }
        let client = self.stream.peer_addr().ok()?.ip();
        let http10 = head.version == Version::Http10;
        match t.route(client, &head.target, size) {
            switchyard_rescue_driver::Verdict::Serve => None,
            switchyard_rescue_driver::Verdict::Refuse => {
                self.error_response(503, keep, head.method, http10);
                Some(Body::Empty)
            }
            switchyard_rescue_driver::Verdict::Redirect { peer, location } => {
                let mark = self.out.len();
                self.redirect_response(&location, keep, http10);
                t.redirected(peer, (self.out.len() - mark) as u64, size);
                Some(Body::Redirected)
            }
        }
    }

    /// Write the response head for `head` into `out` and return its body.
    async fn respond(&mut self, head: &RequestHead, keep: bool) -> Body {
        let clean = match path::normalize(&head.target) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(target = %head.target, error = %e, "refused path");
                self.error_response(400, keep, head.method, head.version == Version::Http10);
                return Body::Empty;
            }
        };
        let resolved = match self.replica.take() {
            Some(object) => Resolved::Memory { object, hit: true },
            None => self.ctx.store.resolve(&clean).await,
        };
        let size = match &resolved {
            Resolved::Memory { object, .. } => Some(object.info.len),
            Resolved::File(_, info) => Some(info.len),
            _ => None,
        };
        if let (Some(size), Some(t)) = (size, self.ctx.traffic.clone()) {
            if let Some(body) = self.rescue_redirect(&t, head, keep, size) {
                return body;
            }
        }
        match resolved {
            Resolved::Memory { object, hit } => {
                let src = match &object.content {
                    Content::Inline(b) => Source::Memory(b.clone()),
                    Content::Arena(_) => Source::File(SendSource::Cached(object.clone())),
                };
                let body = self.entity(head, keep, &object.info, src, hit);
                self.last_hit = hit;
                body
            }
            Resolved::File(file, info) => self.entity(
                head,
                keep,
                &info,
                Source::File(SendSource::Disk(file)),
                false,
            ),
            Resolved::Direct(file, info) => {
                self.entity(head, keep, &info, Source::Direct(file), false)
            }
            Resolved::Redirect(location) => {
                let query = head.target.find('?').map_or("", |i| &head.target[i..]);
                let location = format!("{location}{query}");
                with_date(|date_server| {
                    ResponseHead::new(&mut self.out, 301)
                        .lines(date_server)
                        .header("Location", &location)
                        .content_length(0)
                        .connection(keep, head.version == Version::Http10)
                        .finish()
                });
                self.count_status(301);
                Body::Empty
            }
            Resolved::NotFound => {
                self.error_response(404, keep, head.method, head.version == Version::Http10);
                Body::Empty
            }
            Resolved::Forbidden => {
                self.error_response(403, keep, head.method, head.version == Version::Http10);
                Body::Empty
            }
            Resolved::Failed(e) => {
                tracing::warn!(path = %clean.path, error = %e, "read failed");
                self.error_response(500, keep, head.method, head.version == Version::Http10);
                Body::Empty
            }
        }
    }

    /// A 200, 206, 304 or 416 for an existing file; `hit` when it came from the memory cache
    /// (told to a relaying switch that asks, [`switchyard_http::upstream::CACHE_HEADER`]).
    fn entity(
        &mut self,
        head: &RequestHead,
        keep: bool,
        info: &FileInfo,
        src: Source,
        hit: bool,
    ) -> Body {
        let http10 = head.version == Version::Http10;
        let cache_answer = head
            .cache_report
            .then_some(if hit { "hit" } else { "miss" });
        let not_modified = match (&head.if_none_match, &head.if_modified_since) {
            (Some(inm), _) => none_match(inm, &info.etag),
            (None, Some(ims)) => not_modified_since(ims, info.mtime),
            (None, None) => false,
        };
        if not_modified {
            with_date(|date_server| {
                let mut h = ResponseHead::new(&mut self.out, 304)
                    .lines(date_server)
                    .header("ETag", &info.etag)
                    .header("Last-Modified", &info.last_modified);
                if let Some(v) = cache_answer {
                    h = h.header(switchyard_http::upstream::CACHE_HEADER, v);
                }
                h.connection(keep, http10).finish()
            });
            self.count_status(304);
            return Body::Empty;
        }
        let mut decision = RangeDecision::Full;
        if let (Method::Get, Some(range)) = (head.method, &head.range) {
            let honour = head
                .if_range
                .as_deref()
                .is_none_or(|ir| if_range_allows(ir, &info.etag, info.mtime));
            if honour {
                decision = evaluate(range, info.len);
            }
        }
        let (status, start, len) = match decision {
            RangeDecision::Full => (200, 0, info.len),
            RangeDecision::Partial { start, end } => (206, start, end - start + 1),
            RangeDecision::Unsatisfiable => (416, 0, 0),
        };
        // A peer fetching a hot object whole may keep it as its copy, if the object is (now) in
        // memory here: as a cloning peer gets one after the owner answered.
        let copy = match (&self.copy_to, &self.ctx.replication, decision) {
            (Some(to), Some(r), RangeDecision::Full) if head.method == Method::Get => {
                r.copy_offer(&self.ctx.store, &to.key, &to.peer, to.max_bytes)
            }
            _ => None,
        };
        let content_range = match decision {
            RangeDecision::Full => None,
            RangeDecision::Partial { start, end } => {
                Some(format!("bytes {start}-{end}/{}", info.len))
            }
            RangeDecision::Unsatisfiable => Some(format!("bytes */{}", info.len)),
        };
        with_date(|date_server| {
            let mut h = ResponseHead::new(&mut self.out, status)
                .lines(date_server)
                .lines(&info.fields);
            if let Some(cr) = &content_range {
                h = h.header("Content-Range", cr);
            }
            if let Some(v) = cache_answer {
                h = h.header(switchyard_http::upstream::CACHE_HEADER, v);
            }
            if let Some(offer) = &copy {
                h = h.header(
                    switchyard_http::upstream::COPY_HEADER,
                    &offer.header_value(),
                );
            }
            h.content_length(len).connection(keep, http10).finish()
        });
        self.count_status(status);
        if head.method == Method::Head || len == 0 {
            return Body::Empty;
        }
        match src {
            Source::Memory(b) => Body::Bytes(b.slice(start as usize..(start + len) as usize)),
            Source::File(src) => Body::File {
                src,
                offset: start,
                len,
            },
            Source::Direct(file) => Body::Direct {
                file,
                offset: start,
                len,
            },
        }
    }

    /// A short text error response.
    fn error_response(&mut self, status: u16, keep: bool, method: Method, http10: bool) {
        let reason = switchyard_http::status::reason(status);
        let body = format!("{status} {reason}\n");
        with_date(|date_server| {
            let mut h = ResponseHead::new(&mut self.out, status)
                .lines(date_server)
                .header("Content-Type", "text/plain; charset=utf-8")
                .content_length(body.len() as u64)
                .connection(keep, http10);
            if status == 405 {
                h = h.header("Allow", "GET, HEAD");
            }
            h.finish()
        });
        if method != Method::Head {
            self.out.extend_from_slice(body.as_bytes());
        }
        self.count_status(status);
    }

    /// Write everything in `out`, then account for the responses in it.
    async fn flush(&mut self) -> io::Result<()> {
        self.write_out(false).await
    }

    /// Write everything in `out`. With `more`, the kernel is told that
    /// more data follows (MSG_MORE), so a head and the sendfile body behind
    /// it leave in full segments rather than a small one first.
    ///
    /// The connection is listed as waiting on its client ([`WaitingClients`]) from the write on,
    /// for the wait for its next request; one that closes after this response (`closing`) waits
    /// on its client only if the write itself must wait, and is listed only then. Nothing to
    /// write lists nothing.
    async fn write_out(&mut self, more: bool) -> io::Result<()> {
        self.write_out_with(&[], more).await
    }

    /// [`Self::write_out`], with `body` sent behind `out` in the same system call.
    async fn write_out_with(&mut self, body: &[u8], more: bool) -> io::Result<()> {
        let at_shutdown = self.ends_at_shutdown();
        let (waiting, listed, fd) = (&self.ctx.waiting, &mut self.listed, self.stream.raw_fd());
        let lazy = self.closing || (self.out.is_empty() && body.is_empty());
        if !lazy {
            *listed = Some(waiting.enter(fd, at_shutdown));
        }
        let parts = [&self.out[..], body];
        let limit = self.ctx.send_timeout;
        let (done, sent) = send_to_client_or_wait(&mut self.stream, &parts, more, limit, || {
            if lazy {
                *listed = Some(waiting.enter(fd, at_shutdown));
            }
        })
        .await;
        self.note_timeout(&sent);
        sent?;
        self.ctx.metrics.count_bytes(done as u64, 0);
        self.stats.bytes += done as u64;
        self.out.clear();
        for t in self.pending.drain(..) {
            self.ctx.metrics.observe_response(t.elapsed());
        }
        if let Some(d) = self.router.as_deref_mut() {
            d.flushed();
        }
        Ok(())
    }

    /// List the connection as waiting on its client from now on ([`WaitingClients::enter`]).
    fn list_waiting(&mut self) {
        let at_shutdown = self.ends_at_shutdown();
        self.listed = Some(self.ctx.waiting.enter(self.stream.raw_fd(), at_shutdown));
    }

    /// Whether a listing made now may be ended by the node's shutdown
    /// ([`WaitingClients::close_all`]): the connection stays on this host, and nothing of a
    /// next request has been read (a client part-way through one may finish it).
    fn ends_at_shutdown(&self) -> bool {
        R::STAYS && self.buf.is_empty()
    }

    /// Send `len` bytes of `file` from `offset` with sendfile(2).
    async fn sendfile(&mut self, file: &File, offset: u64, len: u64) -> io::Result<()> {
        let mut off = offset as i64;
        let mut left = len;
        let until = tokio::time::Instant::now() + self.ctx.send_timeout;
        while left > 0 {
            if !self.closing {
                self.list_waiting();
            }
            let sent = self.stream.now(tokio::io::Interest::WRITABLE, |to| {
                let chunk = left.min(1 << 30) as usize;
                nix::sys::sendfile::sendfile64(to, file.as_fd(), Some(&mut off), chunk)
                    .map_err(io::Error::from)
            });
            match sent {
                Ok(0) => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank"));
                }
                Ok(n) => {
                    left -= n as u64;
                    self.stats.bytes += n as u64;
                    self.ctx.metrics.count_bytes(n as u64, n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.closing {
                        self.list_waiting();
                    }
                    // The first wait registers a bare socket.
                    if timeout_at(until, self.stream.registered()?.writable())
                        .await
                        .is_err()
                    {
                        self.count_timeout();
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Send `len` bytes of `file` (opened with `O_DIRECT`) from `offset`: each piece is read
    /// on the blocking pool while no other piece is in flight, then written out. A read that
    /// fails after the head has gone ends the connection, as a failed sendfile does.
    async fn send_direct(&mut self, file: Arc<File>, offset: u64, len: u64) -> io::Result<()> {
        let mut off = offset;
        let end = offset + len;
        while off < end {
            let n = (end - off).min(crate::disk::DIRECT_CHUNK as u64) as usize;
            let piece = match self.ctx.store.read_direct(file.clone(), off, n).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, offset = off, "O_DIRECT read failed mid-body");
                    return Err(e);
                }
            };
            off += n as u64;
            self.send_bytes(&piece, off < end).await?;
        }
        Ok(())
    }

    /// Write all of `bytes`, with MSG_MORE when `more` follows.
    async fn send_bytes(&mut self, bytes: &[u8], more: bool) -> io::Result<()> {
        self.list_waiting();
        let limit = self.ctx.send_timeout;
        let (done, sent) = send_to_client(&mut self.stream, bytes, more, limit).await;
        self.stats.bytes += done as u64;
        self.ctx.metrics.count_bytes(done as u64, 0);
        self.note_timeout(&sent);
        sent
    }

    /// Count a send that ran out of time.
    fn note_timeout(&self, sent: &io::Result<()>) {
        if sent
            .as_ref()
            .is_err_and(|e| e.kind() == io::ErrorKind::TimedOut)
        {
            self.count_timeout();
        }
    }

    /// Close the sending side, then read and drop what the client still
    /// sends for a moment, so that our last response is not destroyed by a
    /// reset caused by unread data (a "lingering close"). A steered connection
    /// ([`Router::steered`]) waits for the client's close up to the send timeout.
    async fn linger(&mut self) {
        // It waits on its client now (a closing connection's answer may have left unlisted).
        // Its lingering is not cut short at shutdown: it ends soon by itself.
        self.listed = Some(self.ctx.waiting.enter(self.stream.raw_fd(), false));
        let until = tokio::time::Instant::now()
            + if self.steered() {
                self.ctx.send_timeout
            } else {
                switchyard_runtime::close::LINGER_TIME
            };
        if let Ok(stream) = self.stream.registered() {
            switchyard_runtime::close::linger_until(stream, until).await;
        }
    }
}

/// Where an entity's bytes are.
enum Source {
    Memory(Bytes),
    File(SendSource),
    /// A file opened with `O_DIRECT`.
    Direct(Arc<File>),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    fn ctx(root: &std::path::Path) -> Arc<super::Ctx> {
        let cfg = crate::config::NodeConfig {
            root: root.into(),
            ..Default::default()
        };
        Arc::new(super::Ctx {
            limits: Default::default(),
            store: Arc::new(crate::store::Store::new(&cfg).unwrap()),
            metrics: Default::default(),
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            send_timeout: Duration::from_secs(5),
            waiting: Default::default(),
            replication: None,
            rescue: None,
            traffic: None,
            dynamic: None,
        })
    }

    /// Bytes read by whoever accepted the connection are answered first,
    /// before anything the client sends afterwards; the figures returned
    /// are what a notify-close message reports.
    #[test]
    fn preread_bytes_are_served_first_and_counted() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("a.txt"), b"alpha").unwrap();
            std::fs::write(dir.path().join("b.txt"), b"beta").unwrap();
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut client = tokio::net::TcpStream::connect(l.local_addr().unwrap())
                .await
                .unwrap();
            let (server, _) = l.accept().await.unwrap();
            let (_tx, rx) = tokio::sync::watch::channel(false);
            let pre = bytes::BytesMut::from(&b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /b.t"[..]);
            let ctx = ctx(dir.path());
            let task = tokio::spawn(async move {
                let start = super::Start::New { preread: pre };
                super::serve_parking(&ctx, server.into(), rx, start, Duration::from_secs(60)).await
            });
            client
                .write_all(b"xt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut all = Vec::new();
            client.read_to_end(&mut all).await.unwrap();
            let text = String::from_utf8(all.clone()).unwrap();
            let a = text.find("alpha").expect("first response");
            let b = text.find("beta").expect("second response");
            assert!(a < b);
            let super::Served::Closed(stats) = task.await.unwrap() else {
                panic!("the connection closed after its last request");
            };
            assert_eq!(stats.requests, 2);
            assert_eq!(stats.bytes, all.len() as u64);
        });
    }

    /// A bare client socket (as the accept loop hands it over) whose request has arrived, and
    /// the client's end.
    async fn bare_with_request(
        request: &[u8],
    ) -> (switchyard_runtime::ClientSocket, tokio::net::TcpStream) {
        use tokio::io::AsyncWriteExt;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        client.write_all(request).await.unwrap();
        let (server, _) = l.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let mut p = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&server),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1, "no request");
        (switchyard_runtime::ClientSocket::bare(server), client)
    }

    /// A request answered in full at once and closed never waits on its client, so it is never
    /// listed among the connections that do (a cross-thread lock and a tree insert and removal
    /// each, twice per request); one that lingers for its client to close, or whose last
    /// response must wait for its client to read, is listed while it waits, and so can still be
    /// shed.
    #[tokio::test]
    async fn a_closing_connection_is_listed_only_if_its_answer_waits() {
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), b"alpha").unwrap();
        // Far beyond what loopback buffers hold for a client that does not read.
        let big = vec![b'z'; 16 << 20];
        std::fs::write(dir.path().join("big"), &big).unwrap();
        let ctx = ctx(dir.path());
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let start = || super::Start::New {
            preread: bytes::BytesMut::new(),
        };

        let entered = ctx.waiting.entered();
        tokio::pin!(entered);
        entered.as_mut().enable();
        let (server, mut client) =
            bare_with_request(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        let served =
            super::serve_parking(&ctx, server, rx.clone(), start(), Duration::from_secs(60));
        assert!(matches!(served.await, super::Served::Closed(_)));
        let mut all = Vec::new();
        client.read_to_end(&mut all).await.unwrap();
        assert!(all.ends_with(b"alpha"), "{all:?}");
        let listed = tokio::time::timeout(Duration::ZERO, &mut entered)
            .await
            .is_ok();
        assert!(!listed, "a connection that never waited was listed");

        // Bytes behind the last request: it lingers for its client to close, listed.
        let entered = ctx.waiting.entered();
        tokio::pin!(entered);
        entered.as_mut().enable();
        let (server, client) =
            bare_with_request(b"GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nmore")
                .await;
        let task = {
            let (ctx, rx) = (ctx.clone(), rx.clone());
            tokio::spawn(async move {
                super::serve_parking(&ctx, server, rx, start(), Duration::from_secs(60)).await
            })
        };
        tokio::time::timeout(Duration::from_secs(10), entered)
            .await
            .expect("the lingering connection was never listed");
        assert_eq!(ctx.waiting.len(), 1, "the lingering connection is listed");
        drop(client);
        assert!(matches!(task.await.unwrap(), super::Served::Closed(_)));
        assert!(ctx.waiting.is_empty());

        let entered = ctx.waiting.entered();
        tokio::pin!(entered);
        entered.as_mut().enable();
        let (server, mut client) =
            bare_with_request(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        let task = {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                super::serve_parking(&ctx, server, rx, start(), Duration::from_secs(60)).await
            })
        };
        tokio::time::timeout(Duration::from_secs(10), entered)
            .await
            .expect("the waiting answer was never listed");
        assert_eq!(ctx.waiting.len(), 1, "the waiting answer is listed");
        let mut all = Vec::new();
        client.read_to_end(&mut all).await.unwrap();
        assert!(all.ends_with(&big[big.len() - 64..]) && all.len() > big.len());
        assert!(matches!(task.await.unwrap(), super::Served::Closed(_)));
        assert!(ctx.waiting.is_empty());
    }

    /// Serves every request here; `steered` as given.
    struct Here {
        steered: bool,
    }

    impl super::Router for Here {
        fn asks(&self) -> bool {
            false
        }

        async fn route(&mut self, _: &super::RequestHead) -> super::Step {
            super::Step::Local { dispatched: false }
        }

        fn answered(&mut self, _: u16, _: u64) {}

        fn flushed(&mut self) {}

        fn steered(&self) -> bool {
            self.steered
        }
    }

    /// One HTTP/1.0 request on a routed connection, read to the end by the client (the
    /// response and the server's FIN); the task serving it, and the client's socket.
    async fn answered_once(
        steered: bool,
    ) -> (
        tokio::task::JoinHandle<super::Outcome>,
        tokio::net::TcpStream,
        Vec<u8>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), b"alpha").unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = l.accept().await.unwrap();
        let ctx = ctx(dir.path());
        let task = tokio::spawn(async move {
            let _dir = dir;
            let (_tx, rx) = tokio::sync::watch::channel(false);
            let mut router = Here { steered };
            let pre = bytes::BytesMut::new();
            super::serve_routed(&ctx, server, rx, pre, &mut router).await
        });
        client
            .write_all(b"GET /a.txt HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let mut all = Vec::new();
        client.read_to_end(&mut all).await.unwrap();
        assert!(all.ends_with(b"alpha"), "{all:?}");
        (task, client, all)
    }

    /// A connection restored with `TCP_REPAIR` (its client's packets come through another
    /// host's steering entry, which goes once the loop ends and the end is reported) ends only
    /// when its client has closed too, after it has the whole response; an ordinary one ends
    /// at once. On tokio's paused clock: a client that never closes is cut off at the send
    /// timeout.
    #[tokio::test(start_paused = true)]
    async fn a_steered_connection_ends_after_its_client_closes() {
        // Ordinary: ended without the client closing.
        let (task, _client, _) = answered_once(false).await;
        let out = tokio::time::timeout(Duration::from_secs(1), task).await;
        assert!(matches!(out, Ok(Ok(super::Outcome::Closed(_)))));

        // Steered: still open a (virtual) second after the client had everything...
        let (mut task, client, all) = answered_once(true).await;
        let started = tokio::time::Instant::now();
        let early = tokio::time::timeout(Duration::from_secs(1), &mut task).await;
        assert!(early.is_err(), "the loop ended before its client closed");
        // ... and ended once the client closes, well before the send timeout.
        drop(client);
        let Ok(super::Outcome::Closed(stats)) = task.await else {
            panic!("the connection closed after its one request");
        };
        assert_eq!((stats.requests, stats.bytes), (1, all.len() as u64));
        assert!(started.elapsed() < Duration::from_secs(5));

        // A client that never closes: cut off at the send timeout (5 s here).
        let (task, _client, _) = answered_once(true).await;
        let started = tokio::time::Instant::now();
        let out = task.await;
        assert!(matches!(out, Ok(super::Outcome::Closed(_))));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(5) && waited < Duration::from_secs(6),
            "{waited:?}"
        );
    }

    /// A connection waiting in its task (for the parking delay, or busy)
    /// costs its task's future; it must stay small, as every open
    /// connection of a busy node has one. (Parked, a connection holds no
    /// task: `switchyard_node`'s `parked_connection_state_is_small`.) The
    /// future holds the state of answering a request (about 1.4 KB: the
    /// request head, and the largest of the writes and the close), so that
    /// a request costs no allocation; the rare paths with more state (an
    /// application server's exchange, a body to discard, a rescue, a routed
    /// request, a failure's lingering close) are boxed when taken.
    #[test]
    fn idle_connection_state_is_small() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let s = tokio::net::TcpStream::connect(l.local_addr().unwrap())
                .await
                .unwrap();
            let dir = tempfile::tempdir().unwrap();
            let cfg = crate::config::NodeConfig {
                root: dir.path().into(),
                ..Default::default()
            };
            let ctx = Arc::new(super::Ctx {
                limits: Default::default(),
                store: Arc::new(crate::store::Store::new(&cfg).unwrap()),
                metrics: Default::default(),
                header_timeout: Duration::from_secs(1),
                idle_timeout: Duration::from_secs(1),
                send_timeout: Duration::from_secs(1),
                waiting: Default::default(),
                replication: None,
                rescue: None,
                traffic: None,
                dynamic: None,
            });
            let (_tx, rx) = tokio::sync::watch::channel(false);
            let start = super::Start::New {
                preread: bytes::BytesMut::new(),
            };
            let fut = super::serve_parking(&ctx, s.into(), rx, start, Duration::from_secs(1));
            let size = std::mem::size_of_val(&fut);
            eprintln!("connection future: {size} bytes");
            assert!(size <= 2048, "connection future grew to {size} bytes");
        });
    }
}
