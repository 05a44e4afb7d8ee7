//! One client connection: parse each request, choose a node, relay request and response, loop.
//!
//! Like the node's connection loop, an idle client connection holds no buffers (it waits for
//! readability first and allocates only when bytes arrive) and the work of one request is a
//! separately boxed future, so thousands of idle keep-alive connections stay cheap.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BytesMut};
use switchyard_http::request::{BodyFraming, RequestHead, Version};
use switchyard_http::response::ResponseHead;
use switchyard_policy::{ConnId, NodeId, Outcome, Reject, Request as PolicyRequest};
use switchyard_runtime::request::{self as reading, BodyError, ClientConn, ClientParts};
use switchyard_runtime::request::{HeadEnd, HeadWait, CONTINUE};
use switchyard_runtime::shed::{Waiting, WaitingClients};
use switchyard_runtime::{spare, ClientSocket, WaitTimer};
use switchyard_upstream::splice::{send_to_client, send_to_client_or_wait};
use switchyard_upstream::{self as upstream, Deadline};
use tokio::net::TcpStream;
use tokio::time::timeout_at;

use crate::backend::Backend;
use crate::config::Mechanism;
use crate::counters::Rejection;
use crate::generation::{Generation, Timeouts};
use crate::handoff;
use crate::state::Shared;
use switchyard_http::upstream::{self as resp, BodyLength};

/// Response bytes buffered before they are written to the client.
const FLUSH_AT: usize = 64 * 1024;

/// Why the connection loop ended.
pub(crate) enum End {
    /// Peer closed, idle timeout, shutdown while idle, or our close done.
    Quiet,
    /// Send this status and close.
    Error(u16),
    /// I/O failed; nothing more can be sent.
    Broken,
    /// The connection now lives on a node (one-way delivery).
    HandedOff,
}

/// How a request's exchange with a node failed.
enum Fail {
    /// Nothing reached the client. `retry`: the request may go to another node (the node failed
    /// before sending anything usable); `status`: the answer otherwise (502 or 504).
    Node { status: u16, retry: bool },
    /// The client failed or sent a bad body; end the connection this way.
    Client(End),
    /// Part of the response reached the client; the connection must close.
    Midway,
}

/// The chosen node for one attempt.
struct Choice {
    idx: usize,
    /// The node the policy chose, to be given back with `post_request`.
    policy_node: Option<NodeId>,
}

/// What a completed exchange produced.
struct Exchanged {
    status: u16,
    bytes: u64,
    /// What the node said of its body's source: from its memory cache (`Some(true)`), not
    /// (`Some(false)`), or nothing.
    from_cache: Option<bool>,
    /// The client connection may carry another request.
    keep: bool,
}

struct Client {
    /// Listed as waiting on the client since the last write of an answer
    /// ([`ClientConn::take_ticket`]). Declared before `stream`: it must leave the list
    /// before the socket closes.
    listed: Option<Waiting>,
    shared: Arc<Shared>,
    /// Bare until the connection must wait ([`ClientSocket`]): a request handed off as it
    /// arrived never makes the event loop know the socket.
    stream: ClientSocket,
    peer: SocketAddr,
    id: ConnId,
    buf: BytesMut,
    out: Vec<u8>,
    /// The request as forwarded to the node; kept between pipelined requests, dropped when idle.
    fwd: Vec<u8>,
    /// The client's address as text for `X-Forwarded-For`, formatted once.
    peer_ip: String,
    /// The generation whose policy knows this connection.
    gen: Option<Arc<Generation>>,
    stop: tokio::sync::watch::Receiver<bool>,
    /// A handoff of this connection failed once: relay it from now on.
    relay_only: bool,
    /// `TCP_NODELAY` is set: done before the switch writes its first response, not at accept,
    /// so that a connection handed off at its first request costs no call for it.
    no_delay: bool,
    /// The worker thread serving the connection.
    worker: usize,
    /// The switch's address of the connection, once known.
    local: Option<SocketAddr>,
    /// The timer of its waits on the client, kept from one to the next.
    timer: WaitTimer,
}

/// Serve one client connection on worker thread `worker` until it closes (or moves to a
/// node). `local`: the switch's address of the connection if known (the listener's, unless it
/// listens on a wildcard address; then it is asked for at the first handoff).
pub(crate) async fn serve(
    shared: Arc<Shared>,
    worker: usize,
    stream: ClientSocket,
    peer: SocketAddr,
    local: Option<SocketAddr>,
) {
    serve_with(shared, worker, stream, peer, local, BytesMut::new()).await
}

/// [`serve`] a connection whose first bytes were already read (`preread`): one a node handed
/// back that no other node took.
pub(crate) async fn serve_with(
    shared: Arc<Shared>,
    worker: usize,
    stream: ClientSocket,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    preread: BytesMut,
) {
    let id = ConnId(shared.next_conn.fetch_add(1, Relaxed));
    let stop = shared.stop.clone();
    let mut c = Client {
        listed: None,
        shared,
        stream,
        peer,
        id,
        buf: preread,
        out: Vec::new(),
        fwd: Vec::new(),
        peer_ip: peer.ip().to_string(),
        gen: None,
        stop,
        relay_only: false,
        no_delay: false,
        worker,
        local,
        timer: WaitTimer::new(),
    };
    match c.run().await {
        End::Error(status) => Box::pin(c.fail(status)).await,
        // The policy's record of the connection ends when the node reports it closed.
        End::HandedOff => return,
        End::Quiet | End::Broken => {}
    }
    if let Some(g) = c.gen.take() {
        g.policy.lock().connection_end(c.id, c.shared.now());
    }
}

impl Client {
    async fn run(&mut self) -> End {
        let mut first = true;
        loop {
            let head = match self.next_head(first).await {
                Ok(h) => h,
                Err(e) => return e,
            };
            first = false;
            if let Some(end) = Box::pin(self.handle(head)).await {
                return end;
            }
        }
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// The switch answers on this connection itself: from now on a small write must not wait
    /// behind an unacknowledged one (Nagle). Set once per connection.
    fn answering(&mut self) {
        if !self.no_delay {
            self.no_delay = true;
            let _ = self.stream.set_nodelay(true);
        }
    }

    /// Parse the next request head, reading as needed.
    async fn next_head(&mut self, first: bool) -> Result<RequestHead, End> {
        let g = self.shared.current();
        let limits = g.limits;
        let t = g.t;
        drop(g);
        let wait = HeadWait {
            limits: &limits,
            header: t.header,
            idle: t.idle,
            first,
            // A new client's request usually arrives right behind the handshake: read at
            // once, a connection handed off at its first request never waits for the event
            // loop to report it readable.
            read_early: true,
        };
        reading::next_head(self, wait).await.map_err(|e| match e {
            HeadEnd::Bad(e) => {
                tracing::debug!(peer = %self.peer, error = %e, "bad request");
                self.shared.metrics.count_rejection(Rejection::BadRequest);
                End::Error(e.status())
            }
            HeadEnd::Closed => End::Quiet,
            HeadEnd::IdleTimeout => {
                self.shared.metrics.timeouts.fetch_add(1, Relaxed);
                End::Quiet
            }
            HeadEnd::TimedOut => {
                self.shared.metrics.timeouts.fetch_add(1, Relaxed);
                End::Error(408)
            }
            HeadEnd::Broken => End::Broken,
        })
    }

    /// Make `gen` the generation whose policy tracks this connection.
    fn use_gen(&mut self, gen: &Arc<Generation>) {
        match &self.gen {
            Some(g) if g.id == gen.id => {}
            _ => {
                if let Some(old) = self.gen.replace(gen.clone()) {
                    old.policy.lock().connection_end(self.id, self.shared.now());
                }
            }
        }
    }

    /// Answer one request; `Some` ends the connection.
    async fn handle(&mut self, head: RequestHead) -> Option<End> {
        let mut fwd = std::mem::take(&mut self.fwd);
        if fwd.capacity() == 0 {
            fwd = spare::take_vec();
        }
        fwd.clear();
        let end = self.forward(head, &mut fwd).await;
        if fwd.capacity() <= 64 * 1024 {
            self.fwd = fwd;
        }
        end
    }

    /// Forward one request (written into `fwd`) and relay its response.
    async fn forward(&mut self, head: RequestHead, fwd: &mut Vec<u8>) -> Option<End> {
        let started = Instant::now();
        // The policies' clock at the start, without reading the clock again.
        let at = started.saturating_duration_since(self.shared.origin);
        let gen = self.shared.current();
        self.use_gen(&gen);
        let http10 = head.version == Version::Http10;
        let keep = head.keep_alive && !self.stopping();
        let has_body = head.framing != BodyFraming::None;

        // During a rescue, part of the crowd goes to the rescue servers (seed 001 §4.4.4).
        if let Some(r) = self.shared.rescue.as_ref().filter(|_| {
            !has_body
                && matches!(
                    head.method,
                    switchyard_http::Method::Get | switchyard_http::Method::Head
                )
                && head.target.starts_with('/')
        }) {
            let size = r.size_of(&head.target);
            match r.traffic.route(self.peer.ip(), &head.target, size) {
                switchyard_rescue_driver::Verdict::Serve => {}
                switchyard_rescue_driver::Verdict::Refuse => {
                    self.buf.advance(head.head_len);
                    return self.local_error(&gen, 503, keep, &head).await;
                }
                switchyard_rescue_driver::Verdict::Redirect { peer, location } => {
                    self.buf.advance(head.head_len);
                    let traffic = r.traffic.clone();
                    let (end, bytes) = self.redirect(&gen, 302, &location, keep, &head).await;
                    traffic.redirected(peer, bytes, size);
                    return end;
                }
            }
        }

        // One-way delivery: a request without a body may take its connection to the node
        // (requests with a body are relayed: their body is checked here first). Until the node
        // is chosen, the head stays in `buf`: it travels with the connection.
        let mut preread = gen.cfg.mechanism == Mechanism::Handoff
            && !has_body
            && !self.relay_only
            && !self.stopping();
        let ip = gen.cfg.forwarded_for.then_some(self.peer_ip.as_str());
        resp::forward_request_head(&self.buf[..head.head_len], head.plain, http10, ip, fwd);
        // The node is asked whether its response comes from its memory cache; the policy
        // learns it with the outcome.
        resp::ask_cache_report(fwd);
        // What the switch adds may take a head over the limits a node applies (the switch's
        // own): such a head is refused here with the 431 the node would give, never forwarded.
        // Handed off, the head travels as the client sent it, so only relaying is refused.
        let fits = resp::forwarded_head_fits(fwd, &gen.limits);
        if !fits && !preread {
            return Some(self.too_large_to_forward());
        }
        let mut head_consumed = !preread;
        if head_consumed {
            self.buf.advance(head.head_len);
        }
        // The body is read whole (it is at most `max_body_bytes`) before a node is chosen: a
        // malformed body never reaches a node, and the request can be sent again elsewhere.
        if has_body {
            if let Err(end) = self.read_body_into(&head, &gen, fwd).await {
                return Some(end);
            }
        }

        let preq = PolicyRequest {
            conn: self.id,
            method: &head.method_token,
            host: head.host.as_deref(),
            target: &head.target,
            size_hint: None,
        };
        let retriable = head.method.is_idempotent();
        let mut retries_left = gen.cfg.retries;
        let mut excluded: Option<usize> = None;
        loop {
            let now = if excluded.is_none() {
                at
            } else {
                self.shared.now()
            };
            let choice = match self.choose(&gen, &preq, excluded, now).await {
                Ok(c) => c,
                Err(reason) => {
                    if !head_consumed {
                        self.buf.advance(head.head_len);
                    }
                    self.shared.metrics.count_rejection(reason);
                    return self.local_error(&gen, 503, keep, &head).await;
                }
            };
            self.shared.dispatched(&head.target, choice.idx);
            if gen.cfg.mechanism == Mechanism::Redirect && head.target.starts_with('/') {
                // Delivery by redirect: the client fetches it from the node itself.
                if !head_consumed {
                    self.buf.advance(head.head_len);
                }
                let backend = gen.nodes[choice.idx].clone();
                // The node's public name when it has one, else the address the switch uses.
                let location = match gen
                    .cfg
                    .nodes
                    .get(choice.idx)
                    .and_then(|e| e.public.as_deref())
                {
                    Some(public) => format!("http://{public}{}", head.target),
                    None => format!("http://{}{}", backend.addr, head.target),
                };
                // 307 keeps the method and body of anything but GET and HEAD.
                let status = if matches!(
                    head.method,
                    switchyard_http::Method::Get | switchyard_http::Method::Head
                ) {
                    302
                } else {
                    307
                };
                let (end, bytes) = self.redirect(&gen, status, &location, keep, &head).await;
                if let Some(n) = choice.policy_node {
                    gen.policy.lock().post_request(
                        self.id,
                        n,
                        &Outcome::ok(status, bytes, false),
                        self.shared.now(),
                    );
                }
                self.shared.request_done();
                backend.count_served(1, 0);
                if let Some(r) = &self.shared.rescue {
                    r.answered(bytes);
                }
                return end;
            }
            // The raw bytes read so far travel with the connection: copied only for a node that
            // takes connections, then the head is consumed here as for any request.
            let pre = (std::mem::take(&mut preread) && gen.nodes[choice.idx].control.is_some())
                .then(|| self.buf.to_vec());
            if !head_consumed {
                self.buf.advance(head.head_len);
                head_consumed = true;
            }
            if let Some(pre) = pre {
                if self.local.is_none() {
                    // A wildcard listener: the address the client reached, once per connection.
                    self.local = self.stream.local_addr().ok();
                }
                if let Some(local) = self.local {
                    let Ok(stream) = self.stream.fd() else {
                        return Some(End::Broken);
                    };
                    let offer = handoff::Offer {
                        gen: &gen,
                        idx: choice.idx,
                        policy_node: choice.policy_node,
                        conn: self.id,
                        stream,
                        peer: self.peer,
                        local,
                        worker: self.worker,
                        preread: pre,
                        // Every write of the switch's goes through `answering` first.
                        wrote: self.no_delay,
                    };
                    match handoff::hand_off(&self.shared, offer).await {
                        handoff::Offered::Moved => return Some(End::HandedOff),
                        handoff::Offered::Relay => self.relay_only = true,
                        handoff::Offered::Abandoned => {
                            // The node may be serving it: close without a word.
                            self.unchoose(&gen, choice.policy_node);
                            return Some(End::Broken);
                        }
                    }
                }
            }
            if !fits {
                // A handoff that was not taken: the rewritten head cannot be relayed.
                self.unchoose(&gen, choice.policy_node);
                return Some(self.too_large_to_forward());
            }
            let backend = gen.nodes[choice.idx].clone();
            backend.active.fetch_add(1, Relaxed);
            let r = self
                .exchange(&gen, &backend, fwd, &head, keep, http10)
                .await;
            backend.active.fetch_sub(1, Relaxed);
            let took = started.elapsed();
            let outcome = match &r {
                Ok(x) => Outcome::ok(x.status, x.bytes, x.from_cache == Some(true)),
                Err(_) => Outcome::failed(),
            };
            if let Some(n) = choice.policy_node {
                gen.policy
                    .lock()
                    .post_request(self.id, n, &outcome, at + took);
            }
            self.shared.request_done();
            match r {
                Ok(x) => {
                    if let Some(r) = &self.shared.rescue {
                        r.relayed(&head.target, x.status, x.bytes);
                    }
                    self.shared.node_ok(&backend);
                    backend.count_response(x.bytes, x.from_cache, took);
                    self.shared.metrics.count_relayed(x.status, took);
                    return if x.keep { None } else { Some(End::Quiet) };
                }
                Err(Fail::Node { status, retry }) => {
                    if retry && retriable && retries_left > 0 && gen.nodes.len() > 1 {
                        retries_left -= 1;
                        excluded = Some(choice.idx);
                        self.shared.metrics.retries.fetch_add(1, Relaxed);
                        tracing::debug!(node = %backend.addr, target = %head.target, "retrying on another node");
                        continue;
                    }
                    return self.local_error(&gen, status, keep, &head).await;
                }
                Err(Fail::Client(end)) => return Some(end),
                Err(Fail::Midway) => return Some(End::Broken),
            }
        }
    }

    /// A chosen node will not serve the request after all: the policy hears it failed, and a
    /// request waiting for a free node may go.
    fn unchoose(&self, gen: &Generation, policy_node: Option<NodeId>) {
        if let Some(n) = policy_node {
            let now = self.shared.now();
            gen.policy
                .lock()
                .post_request(self.id, n, &Outcome::failed(), now);
        }
        self.shared.request_done();
    }

    /// A request whose forwarded head would be over the limits: 431, and the connection ends.
    fn too_large_to_forward(&self) -> End {
        tracing::debug!(peer = %self.peer, "request head too large once forwarded");
        self.shared.metrics.count_rejection(Rejection::BadRequest);
        End::Error(431)
    }

    /// Ask the policy for a node (at `now` on its clock, [`crate::state::Shared::now`]), waiting in the
    /// queue while every node is saturated.
    async fn choose(
        &self,
        gen: &Generation,
        preq: &PolicyRequest<'_>,
        excluded: Option<usize>,
        now: std::time::Duration,
    ) -> Result<Choice, Rejection> {
        let sh = &self.shared;
        // The policy's answer; `None` while every node is saturated.
        let pick = |now| -> Option<Result<Choice, Rejection>> {
            let r = gen.policy.lock().select(preq, now);
            match r {
                Ok(d) => {
                    let i = d.node().0 as usize;
                    if Some(i) == excluded {
                        if let Some(j) = alternative(gen, i) {
                            gen.policy.lock().post_request(
                                preq.conn,
                                d.node(),
                                &Outcome::failed(),
                                now,
                            );
                            return Some(Ok(Choice {
                                idx: j,
                                policy_node: None,
                            }));
                        }
                    }
                    Some(Ok(Choice {
                        idx: i,
                        policy_node: Some(d.node()),
                    }))
                }
                Err(Reject::Overloaded) => None,
                Err(Reject::NoNode | Reject::ShuttingDown) => Some(Err(Rejection::NoNode)),
            }
        };
        if let Some(r) = pick(now) {
            return r;
        }
        // Every node is saturated: wait in the queue until one frees up. Counted in the queue
        // before listening and asking again, so that a request finishing meanwhile wakes this
        // one (`Shared::request_done`) or its node is seen free.
        if sh.queue_len.fetch_add(1, SeqCst) >= gen.cfg.queue_max {
            sh.queue_len.fetch_sub(1, Relaxed);
            return Err(Rejection::QueueFull);
        }
        let deadline = tokio::time::Instant::now() + gen.t.queue;
        let result = loop {
            let notified = sh.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(r) = pick(sh.now()) {
                break r;
            }
            if timeout_at(deadline, notified).await.is_err() {
                break Err(Rejection::QueueTimeout);
            }
        };
        sh.queue_len.fetch_sub(1, Relaxed);
        result
    }

    /// Relay one request to `b` and its response back.
    async fn exchange(
        &mut self,
        gen: &Generation,
        b: &Backend,
        fwd: &[u8],
        head: &RequestHead,
        keep: bool,
        http10: bool,
    ) -> Result<Exchanged, Fail> {
        self.answering();
        let t = gen.t;
        let req = upstream::Request {
            bytes: fwd,
            head_request: head.method == switchyard_http::Method::Head,
            max_head: gen.cfg.max_response_head_bytes,
        };
        // A pooled connection may have been closed by the node just as it is reused: an
        // idempotent request then goes again on a new connection. Any other request may have
        // been acted on by the node before it closed, so it is never sent twice: it is
        // answered 502.
        let idempotent = head.method.is_idempotent();
        after_other_ready_requests().await;
        let mut pooled = b.take_idle();
        loop {
            let mut node = match pooled.take() {
                Some(c) => c,
                None => match b.connect(t.connect).await {
                    Ok(c) => c,
                    Err(e) if e.is_local_resource() => {
                        // Out of descriptors or memory here: the node is not to blame and
                        // another node would fare no better.
                        tracing::warn!(node = %b.addr, error = %e, "no local resources for a node connection");
                        self.shared.metrics.local_errors.fetch_add(1, Relaxed);
                        return Err(Fail::Node {
                            status: 503,
                            retry: false,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(node = %b.addr, error = %e, "cannot connect to node");
                        self.shared.node_failed(b, true, &gen.cfg);
                        let timed_out = matches!(&e, upstream::Error::Connect { source, .. }
                            if source.kind() == io::ErrorKind::TimedOut);
                        return Err(Fail::Node {
                            status: if timed_out { 504 } else { 502 },
                            retry: true,
                        });
                    }
                },
            };
            // Interim responses are passed on to HTTP/1.1 clients.
            let interim = (!http10).then_some((&mut self.stream, t.send));
            match upstream::exchange(&mut node, req, Deadline::Each(t.node), interim).await {
                Ok(r) => return self.relay_response(gen, b, node, r, keep, http10).await,
                Err(f) if f.retryable && idempotent => continue,
                Err(f) => return Err(self.exchange_failed(gen, b, head, f.error)),
            }
        }
    }

    /// What a failed exchange means for the client, the node's health and a retry.
    fn exchange_failed(
        &self,
        gen: &Generation,
        b: &Backend,
        head: &RequestHead,
        e: upstream::Error,
    ) -> Fail {
        if e.is_local_resource() {
            self.shared.metrics.local_errors.fetch_add(1, Relaxed);
            return Fail::Node {
                status: 503,
                retry: false,
            };
        }
        let (status, retry) = match e {
            // An interim response could not be passed on.
            upstream::Error::Client(_) => return Fail::Client(End::Broken),
            upstream::Error::Response(e) => {
                tracing::warn!(node = %b.addr, error = %e, "bad response from node");
                (502, false)
            }
            upstream::Error::TimedOut => {
                tracing::warn!(node = %b.addr, target = %head.target, "node response timed out");
                (504, false)
            }
            upstream::Error::Closed => {
                tracing::warn!(node = %b.addr, "node closed the connection without answering");
                (502, true)
            }
            _ => (502, true),
        };
        self.shared.node_failed(b, false, &gen.cfg);
        Fail::Node { status, retry }
    }

    /// Read the request body from the client and append it, as sent, to `fwd`. The switch
    /// answers an expectation of `100-continue` itself and forwards the body it then gets.
    async fn read_body_into(
        &mut self,
        head: &RequestHead,
        gen: &Generation,
        fwd: &mut Vec<u8>,
    ) -> Result<(), End> {
        let max = gen.limits.max_body_bytes;
        let read = reading::read_body(self, head, max, gen.t.header, Some(fwd)).await;
        read.map_err(|e| match e {
            BodyError::Malformed(e) => {
                tracing::debug!(peer = %self.peer, error = %e, "bad chunked body");
                self.shared.metrics.count_rejection(Rejection::BadRequest);
                End::Error(400)
            }
            BodyError::TooLarge => {
                self.shared.metrics.count_rejection(Rejection::BadRequest);
                End::Error(413)
            }
            BodyError::TimedOut => {
                self.shared.metrics.timeouts.fetch_add(1, Relaxed);
                End::Error(408)
            }
            BodyError::Broken => End::Broken,
        })
    }

    /// Relay the node's response whose head `r` was read; a node connection whose response
    /// was read completely goes back to the pool.
    async fn relay_response(
        &mut self,
        gen: &Generation,
        b: &Backend,
        mut node: upstream::Connection,
        r: upstream::Response,
        keep: bool,
        http10: bool,
    ) -> Result<Exchanged, Fail> {
        let t = gen.t;
        let meta = r.meta;
        if http10 && meta.body == BodyLength::Chunked {
            self.shared.node_failed(b, false, &gen.cfg);
            return Err(Fail::Node {
                status: 502,
                retry: false,
            });
        }
        // A drain that started while the node worked closes the connection after this response.
        let client_keep = keep && meta.body != BodyLength::UntilClose && !self.stopping();
        let from_cache = meta.cache;
        let opts = upstream::RelayOptions {
            deadline: Deadline::Each(t.node),
            flush_at: FLUSH_AT,
            flush_end: true,
            direct: Some(upstream::Direct {
                client_wait: t.send,
                splice_min: gen.cfg.splice_min_bytes,
            }),
        };
        // The head and the body bytes that join it before the first write: room for all of
        // them at once. A buffer too small is given back and a new one taken, not grown:
        // growing would copy the whole old allocation, bytes that belong to no one.
        let room = r.head.len() + 32 + opts.pending_room(meta.body, node.buffered().len());
        if self.out.capacity() == 0 {
            self.out = spare::take_vec();
        }
        self.out.clear();
        if self.out.capacity() < room {
            spare::give_vec(std::mem::replace(&mut self.out, Vec::with_capacity(room)));
        }
        resp::client_response_head(&r.head, &meta, client_keep, http10, &mut self.out);
        let head_bytes = self.out.len() as u64;
        let mut to = self.writer(t.send);
        let relayed =
            upstream::relay_body(&mut node, meta.body, meta.keep_alive, &mut to, opts).await;
        let metrics = &self.shared.metrics;
        match relayed {
            Ok(done) => {
                metrics.count_spliced(done.spliced);
                if done.reusable {
                    b.put_idle(node);
                }
                Ok(Exchanged {
                    status: meta.status,
                    bytes: head_bytes + done.body,
                    from_cache,
                    keep: client_keep,
                })
            }
            Err(f) => {
                metrics.count_spliced(f.spliced);
                match f.error {
                    upstream::Error::Client(e) => {
                        if e.kind() == io::ErrorKind::TimedOut {
                            metrics.timeouts.fetch_add(1, Relaxed);
                        }
                        Err(Fail::Client(End::Broken))
                    }
                    e => {
                        tracing::warn!(node = %b.addr, error = %e, "node failed during a response body");
                        self.shared.node_failed(b, false, &gen.cfg);
                        Err(Fail::Midway)
                    }
                }
            }
        }
    }

    /// Write what is pending to the client.
    async fn flush(&mut self, t: Timeouts) -> Result<(), Fail> {
        let r = upstream::Client::write_pending(&mut self.writer(t.send)).await;
        r.map_err(|e| {
            if e.kind() == io::ErrorKind::TimedOut {
                self.shared.metrics.timeouts.fetch_add(1, Relaxed);
            }
            Fail::Client(End::Broken)
        })
    }

    /// The pending bytes and the socket they go to, sends waiting at most `send` for room.
    fn writer(&mut self, send: std::time::Duration) -> ToClient<'_> {
        ToClient {
            stream: &mut self.stream,
            out: &mut self.out,
            send,
            waiting: &self.shared.waiting,
            listed: &mut self.listed,
            // (The client's buffer does not change while its pending bytes are written.)
            at_shutdown: self.buf.is_empty(),
        }
    }

    /// Answer a request with an error status produced by the switch itself.
    /// Answer with a redirect (`status` 302 or 307) to `location`; the bytes written and
    /// whether the connection ends.
    async fn redirect(
        &mut self,
        gen: &Generation,
        status: u16,
        location: &str,
        keep: bool,
        head: &RequestHead,
    ) -> (Option<End>, u64) {
        self.answering();
        self.out.clear();
        ResponseHead::new(&mut self.out, status)
            .header("Server", switchyard_http::response::SERVER)
            .header("Location", location)
            .content_length(0)
            .connection(keep, head.version == Version::Http10)
            .finish();
        let bytes = self.out.len() as u64;
        self.shared.metrics.count_status(status);
        if self.flush(gen.t).await.is_err() {
            return (Some(End::Broken), bytes);
        }
        if keep {
            (None, bytes)
        } else {
            self.linger().await;
            (Some(End::Quiet), bytes)
        }
    }

    async fn local_error(
        &mut self,
        gen: &Generation,
        status: u16,
        keep: bool,
        head: &RequestHead,
    ) -> Option<End> {
        self.answering();
        self.out.clear();
        error_response(
            &mut self.out,
            status,
            keep,
            head.version == Version::Http10,
            head.method != switchyard_http::Method::Head,
            gen.cfg.retry_after_secs,
        );
        self.shared.metrics.count_status(status);
        if self.flush(gen.t).await.is_err() {
            return Some(End::Broken);
        }
        if keep {
            None
        } else {
            self.linger().await;
            Some(End::Quiet)
        }
    }

    /// Send an error status and close, lingering so that the answer survives unread input.
    async fn fail(&mut self, status: u16) {
        let gen = self.shared.current();
        self.answering();
        self.out.clear();
        error_response(
            &mut self.out,
            status,
            false,
            false,
            true,
            gen.cfg.retry_after_secs,
        );
        self.shared.metrics.count_status(status);
        if self.flush(gen.t).await.is_ok() {
            self.linger().await;
        }
    }

    /// Close the sending side, then read and drop what the client still sends for a moment.
    async fn linger(&mut self) {
        if let Ok(stream) = self.stream.registered() {
            switchyard_runtime::close::linger(stream).await;
        }
    }
}

/// Requests are read with the runtime's helpers.
impl ClientConn for Client {
    fn parts(&mut self) -> ClientParts<'_> {
        ClientParts {
            stream: &mut self.stream,
            buf: &mut self.buf,
            shutdown: &mut self.stop,
            timer: &mut self.timer,
        }
    }

    fn idle(&mut self) {
        spare::give_vec(std::mem::take(&mut self.out));
        spare::give_vec(std::mem::take(&mut self.fwd));
    }

    fn waiting_list(&self) -> Option<&Arc<WaitingClients>> {
        Some(&self.shared.waiting)
    }

    fn take_ticket(&mut self) -> Option<Waiting> {
        self.listed.take()
    }

    /// `Switch::shutdown` closes the waiting list after the stop signal; a client part-way
    /// through its next request (some of it read) may finish it.
    fn list_closed_at_shutdown(&self) -> bool {
        self.buf.is_empty()
    }

    /// Written at once, with the send timeout of the generation serving the request.
    async fn send_continue(&mut self) -> io::Result<()> {
        self.answering();
        let send = match &self.gen {
            Some(g) => g.t.send,
            None => self.shared.current().t.send,
        };
        send_to_client(&mut self.stream, CONTINUE, false, send)
            .await
            .1
    }
}

/// The client's side of a relayed response: its pending bytes and its socket.
struct ToClient<'a> {
    stream: &'a mut ClientSocket,
    out: &'a mut Vec<u8>,
    send: std::time::Duration,
    waiting: &'a Arc<WaitingClients>,
    /// Listed again before each write: the last one is where the connection begins to wait.
    listed: &'a mut Option<Waiting>,
    /// Listed to be ended at shutdown ([`ClientConn::list_closed_at_shutdown`]).
    at_shutdown: bool,
}

impl upstream::Client for ToClient<'_> {
    fn pending(&mut self) -> &mut Vec<u8> {
        self.out
    }

    async fn write_pending(&mut self) -> io::Result<()> {
        let all = self.out.len();
        self.write_pending_around(all, &[]).await
    }

    async fn write_pending_around(&mut self, at: usize, middle: &[u8]) -> io::Result<()> {
        *self.listed = Some(self.waiting.enter(self.stream.raw_fd(), self.at_shutdown));
        let (head, rest) = self.out.split_at(at);
        let parts = [head, middle, rest];
        let (_, r) = send_to_client_or_wait(self.stream, &parts, false, self.send, || {}).await;
        self.out.clear();
        r
    }

    fn socket(&mut self) -> io::Result<&TcpStream> {
        self.stream.registered().map(|s| &*s)
    }
}

/// Another node to retry on: the next one that is up after `failed`.
fn alternative(gen: &Generation, failed: usize) -> Option<usize> {
    let n = gen.nodes.len();
    (1..n)
        .map(|k| (failed + k) % n)
        .find(|&j| gen.nodes[j].is_up())
}

/// A short text error response written by the switch.
fn error_response(
    out: &mut Vec<u8>,
    status: u16,
    keep: bool,
    http10: bool,
    with_body: bool,
    retry_after: u32,
) {
    let reason = switchyard_http::status::reason(status);
    let body = format!("{status} {reason}\n");
    let mut h = ResponseHead::new(out, status)
        .header("Server", switchyard_http::response::SERVER)
        .header("Content-Type", "text/plain; charset=utf-8")
        .content_length(body.len() as u64);
    if status == 503 {
        h = h.header_u64("Retry-After", u64::from(retry_after));
    }
    h.connection(keep, http10).finish();
    if with_body {
        out.extend_from_slice(body.as_bytes());
    }
}

/// Let the worker's other connections that are ready read and route their requests before this
/// one goes to its node: the task steps back once (`yield_now`) and runs again after them and
/// after the runtime's next look for events, so the requests of one pass leave together.
///
/// Sent each as soon as it was routed, the requests of a pass left a few microseconds apart,
/// one per connection's parse and choice; a node woken by the first read it and went back to
/// wait before the next arrived, and woke again for each. Sent together, they find a node woken
/// once: with two nodes on the switch's two cores, the nodes' `epoll_wait` calls per relayed
/// 1 KiB request went from 0.145 to 0.070 and their context switches from 0.17 to 0.11, and the
/// whole machine's CPU per request from 29.0 to 28.1 µs. Cost: one more poll of the task per
/// request and, per pass, one look for events that does not wait; with one request in flight
/// no change in latency (`wrk -c1`). Relay / HAProxy at 1 KiB keep-alive, against the build
/// before in the same runs: 1.20 against 1.12, 1.05 against 1.07, 1.21 against 1.13 (in the
/// lab 1.29 against 1.22); level within noise in close mode and at 16-100 KiB
/// (bench/RESULTS.md, 2026-12-06, fourth session).
async fn after_other_ready_requests() {
    tokio::task::yield_now().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an idle client connection keeps besides its task header and its socket's
    /// registration: the future of `serve`. A request's handler (2.8 KB of nested futures
    /// down to the send timers) is boxed apart while it runs, so the idle state stays small;
    /// awaiting it inline would add its size to every open connection.
    #[test]
    fn the_connection_future_stays_small() {
        fn size<A, B, C, D, E, F: std::future::Future>(_: fn(A, B, C, D, E) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let n = size(serve);
        eprintln!("client connection future: {n} bytes");
        assert!(n <= 1536, "a client connection's future grew to {n} bytes");
    }
}
