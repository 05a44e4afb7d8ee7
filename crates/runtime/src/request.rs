//! Reading requests from a client connection: waiting for the next request
//! head, with the header and idle timeouts and shutdown, and reading a
//! request body (`Content-Length` or the strict chunked decoder, after a
//! `100 Continue` when the client expects one).
//!
//! Shared by the node's and the switch's connection loops. A loop lends its
//! socket and buffer through [`ClientConn`]; what an ending means (the
//! status sent, the counters, the log) stays the loop's own decision.

use std::future::Future;
use std::io;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use switchyard_http::chunked::{ChunkedDecoder, ChunkedError};
use switchyard_http::request::{
    self, BodyFraming, Limits, ParseOutcome, RequestError, RequestHead,
};
use tokio::io::Interest;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::close::fill;
use crate::idle::{recv_into, wait_for_bytes, Wait, READ_ROOM};
use crate::shed::{Waiting, WaitingClients};
use crate::socket::ClientSocket;
use crate::timer::WaitTimer;
use std::sync::Arc;

/// The interim response sent to a client that expects `100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// What a connection lends to [`next_head`] and [`read_body`].
pub struct ClientParts<'a> {
    /// The client's socket, registered with the event loop by the first wait.
    pub stream: &'a mut ClientSocket,
    /// Bytes read from the client and not yet consumed; a complete head is
    /// left at its start.
    pub buf: &'a mut BytesMut,
    /// Becomes `true` when the process shuts down.
    pub shutdown: &'a mut watch::Receiver<bool>,
    /// The connection's timer for its waits on the client, kept from one wait to the next.
    pub timer: &'a mut WaitTimer,
}

/// A client connection that requests are read from.
pub trait ClientConn: Send {
    /// The socket, the input buffer and the shutdown signal.
    fn parts(&mut self) -> ClientParts<'_>;

    /// Called before waiting for the client: write what is pending (a loop
    /// that buffers pipelined responses sends them here). An error ends the
    /// wait as [`HeadEnd::Broken`].
    fn before_wait(&mut self) -> impl Future<Output = io::Result<()>> + Send {
        async { Ok(()) }
    }

    /// The connection is idle: release output buffers. The input buffer is
    /// released by [`next_head`] itself.
    fn idle(&mut self) {}

    /// Send [`CONTINUE`] to the client, after anything already produced.
    fn send_continue(&mut self) -> impl Future<Output = io::Result<()>> + Send;

    /// The list this connection joins while it waits on its client, so that it can be shed
    /// for a new connection when every slot is taken (its wait then ends as if the client had
    /// closed); none: never shed.
    fn waiting_list(&self) -> Option<&Arc<WaitingClients>> {
        None
    }

    /// Whether the process, when it stops, ends the waits of [`Self::waiting_list`] itself
    /// ([`WaitingClients::close_all`], after setting the shutdown signal): a listed
    /// connection's wait then does not watch the signal (registering with it and leaving it
    /// again cost every wait two locks of a process-wide list). Not for a connection that may
    /// still be moved to another host as it drains: closing its reading side would go with it.
    fn list_closed_at_shutdown(&self) -> bool {
        false
    }

    /// The connection's listing in [`Self::waiting_list`] made when it last wrote an answer
    /// ([`WaitingClients::enter`]), taken out for the wait that follows. None: it is listed
    /// when it begins to wait.
    fn take_ticket(&mut self) -> Option<Waiting> {
        None
    }
}

/// How [`next_head`] waits.
#[derive(Clone, Copy, Debug)]
pub struct HeadWait<'a> {
    /// Limits of a request head.
    pub limits: &'a Limits,
    /// Time allowed for a head to arrive once it has begun, and for the
    /// first request of a connection to begin.
    pub header: Duration,
    /// Time allowed between requests of a keep-alive connection.
    pub idle: Duration,
    /// The connection has answered no request yet.
    pub first: bool,
    /// On a new connection, try one read before waiting: a new client's
    /// request usually arrives right behind the handshake, so it is read
    /// at once rather than after a trip through the event loop.
    pub read_early: bool,
}

/// What [`next_head_or_park`] came to.
// The head is moved once per request and the idle case is rare: boxing it would cost an
// allocation on every request to save a copy of a few hundred bytes when a connection parks.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Next {
    /// A complete request head, left at the start of the buffer.
    Head(RequestHead),
    /// The connection waited idle for the parking delay: it holds no buffer and can be
    /// parked ([`crate::park`]) until its client sends again.
    Park(Idle),
}

/// A keep-alive connection gone idle, to be parked.
#[derive(Debug)]
pub struct Idle {
    /// When its idle timeout ends.
    pub until: Instant,
    /// Its place in the connection's waiting list, kept while it is parked (so that it is
    /// still shed in the order in which connections began to wait).
    pub ticket: Option<Waiting>,
}

/// Why no request head was read.
#[derive(Debug)]
pub enum HeadEnd {
    /// The client closed between requests, or the process shuts down while
    /// the connection is idle.
    Closed,
    /// No request began within the header (first request) or idle timeout.
    IdleTimeout,
    /// A request began but its head did not complete in time (a 408).
    TimedOut,
    /// The head is malformed or too large; its status says which.
    Bad(RequestError),
    /// The client closed in the middle of a head, or the socket failed (or the connection
    /// was shed for a new one, [`crate::shed`]).
    Broken,
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The chunked coding is malformed (a 400).
    #[error("malformed chunked body: {0}")]
    Malformed(ChunkedError),
    /// The body is larger than allowed (a 413).
    #[error("request body too large")]
    TooLarge,
    /// The body did not arrive in time (a 408).
    #[error("request body timed out")]
    TimedOut,
    /// The client closed in the middle of the body, or the socket failed.
    #[error("connection broke while reading a request body")]
    Broken,
}

/// Parse the next request head, reading as needed. The head stays at the
/// start of the buffer; the caller consumes `head_len` bytes when it
/// answers.
///
/// An empty buffer is an idle connection: it is released (no buffers are
/// held while waiting) and the wait ends on bytes, a close, shutdown or the
/// header or idle timeout. Once a head has begun, it must complete within
/// the header timeout.
pub async fn next_head<C: ClientConn>(c: &mut C, w: HeadWait<'_>) -> Result<RequestHead, HeadEnd> {
    match next_head_or_park(c, w, None).await? {
        Next::Head(h) => Ok(h),
        // Without a parking delay a wait ends only at its idle timeout.
        Next::Park(_) => Err(HeadEnd::IdleTimeout),
    }
}

/// Like [`next_head`], but a keep-alive connection (not its first request) that has waited
/// `park_after` with nothing from its client ends its wait as [`Next::Park`], with its buffers
/// released, so that it can wait without a task of its own ([`crate::park`]); with `None`, or
/// when the idle timeout comes first, it waits in place as [`next_head`] does.
pub async fn next_head_or_park<C: ClientConn>(
    c: &mut C,
    w: HeadWait<'_>,
    park_after: Option<Duration>,
) -> Result<Next, HeadEnd> {
    let mut deadline: Option<Instant> = None;
    let mut tried_early = false;
    // Listed as waiting on the client from the first wait (or from the last write of the
    // answer before it) until the head is complete: a pipelined head already read is served
    // unlisted.
    let mut ticket: Option<Waiting> = c.take_ticket();
    loop {
        {
            let p = c.parts();
            if !p.buf.is_empty() {
                match request::parse(p.buf, w.limits) {
                    Ok(ParseOutcome::Complete(h)) => return Ok(Next::Head(h)),
                    Ok(ParseOutcome::Partial) => {}
                    Err(e) => return Err(HeadEnd::Bad(e)),
                }
            }
        }
        // A new connection's first request, there with the handshake (always so with
        // deferred accepts), is read before anything else: it has answered nothing, so it has
        // nothing pending, and it does not wait.
        let p = c.parts();
        if p.buf.is_empty() && w.first && w.read_early && !tried_early {
            tried_early = true;
            if read_now(p.stream, p.buf) {
                continue;
            }
        }
        // About to wait for the client. Listed first, then what is pending is sent: a client
        // that has its answer finds the connection already waiting for it (so the order of
        // waiting is the order in which answers were sent, and a client sending its next
        // request at once cannot see its connection shed as a newer one). A connection whose
        // client reads slowly waits on that client just as well.
        if ticket.is_none() {
            let fd = c.parts().stream.raw_fd();
            let at_shutdown = c.list_closed_at_shutdown();
            ticket = c.waiting_list().map(|l| l.enter(fd, at_shutdown));
        }
        c.before_wait().await.map_err(|_| HeadEnd::Broken)?;
        // Listed again by what that wrote: the wait counts from there.
        if let Some(t) = c.take_ticket() {
            ticket = Some(t);
        }
        let by_list = c.list_closed_at_shutdown();
        let p = c.parts();
        if p.buf.is_empty() {
            if *p.shutdown.borrow() {
                return Err(HeadEnd::Closed);
            }
            c.idle();
            let wait = if w.first { w.header } else { w.idle };
            let now = Instant::now();
            let until = now + wait;
            // A keep-alive connection waits here only for the parking delay, unless its idle
            // timeout ends first.
            let park_at = park_after
                .filter(|_| !w.first)
                .map(|d| now + d)
                .filter(|&at| at < until);
            // Only the wait's own future is kept while idle.
            let waited = {
                let ClientParts {
                    stream,
                    buf,
                    shutdown,
                    timer,
                } = c.parts();
                crate::spare::give_bytes(std::mem::take(buf));
                let Ok(stream) = stream.registered() else {
                    return Err(HeadEnd::Broken);
                };
                // A listed connection's wait may be ended at shutdown by its list.
                let shutdown = if ticket.is_some() && by_list {
                    None
                } else {
                    Some(shutdown)
                };
                wait_for_bytes(stream, buf, park_at.unwrap_or(until), shutdown, timer)
            };
            match waited.await {
                Wait::Data => {}
                Wait::Closed | Wait::Shutdown => return Err(HeadEnd::Closed),
                Wait::TimedOut if park_at.is_some() => {
                    return Ok(Next::Park(Idle { until, ticket }));
                }
                Wait::TimedOut => return Err(HeadEnd::IdleTimeout),
                Wait::Failed => return Err(HeadEnd::Broken),
            }
            continue;
        }
        // Part of a head is here: the client may finish it even if the process stops now.
        if let Some(t) = ticket.as_mut() {
            t.keep_at_shutdown();
        }
        let until = *deadline.get_or_insert_with(|| Instant::now() + w.header);
        let filled = {
            let ClientParts { stream, buf, .. } = p;
            let Ok(stream) = stream.registered() else {
                return Err(HeadEnd::Broken);
            };
            fill(stream, buf, until)
        };
        match filled.await {
            Ok(0) => return Err(HeadEnd::Broken),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(HeadEnd::TimedOut),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(HeadEnd::Broken),
        }
    }
}

/// Read what the socket already holds, without waiting; true if any bytes
/// arrived. (A read tried at once, [`ClientSocket::now`]: a bare socket stays
/// bare, and on a registered one a read that finds nothing clears the
/// readiness.)
fn read_now(stream: &ClientSocket, buf: &mut BytesMut) -> bool {
    matches!(
        stream.now(Interest::READABLE, |fd| recv_into(fd, buf, READ_ROOM)),
        Ok(n) if n > 0
    )
}

/// Read the body of the request whose head (`head`, already consumed from
/// the buffer) announced one, within `timeout`. A client that expects
/// `100-continue` is sent [`CONTINUE`] first. The body's bytes as sent
/// (chunked coding included) are appended to `keep`, or dropped without
/// it. A chunked body may carry at most `max_body` bytes of data; a
/// `Content-Length` is checked against the limits when the head is parsed.
pub async fn read_body<C: ClientConn>(
    c: &mut C,
    head: &RequestHead,
    max_body: u64,
    timeout: Duration,
    mut keep: Option<&mut Vec<u8>>,
) -> Result<(), BodyError> {
    if let Some(k) = keep.as_deref_mut() {
        if let BodyFraming::Length(n) = head.framing {
            k.reserve(n as usize);
        }
    }
    let until = Instant::now() + timeout;
    let sink = Keep(keep);
    body_loop(c, head, max_body, || until, sink)
        .await
        .map_err(|e| match e {
            StreamError::Body(e) => e,
            StreamError::Sink(never) => match never {},
        })
}

/// Where [`stream_body`] puts a request body, piece by piece, as it arrives.
pub trait BodySink: Send {
    /// Why the sink failed.
    type Error: Send;

    /// Take the next bytes of the body, as sent (chunked coding included).
    fn put(&mut self, bytes: &[u8]) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// Why [`stream_body`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum StreamError<E> {
    /// Reading the body from the client failed (as for [`read_body`]).
    #[error(transparent)]
    Body(BodyError),
    /// The sink failed; the rest of the body is unread.
    #[error("the body's receiver failed")]
    Sink(E),
}

/// Pass the body of the request whose head (`head`, already consumed from
/// the buffer) announced one to `sink` as it arrives, without holding it
/// whole: a request body streamed to an application server. Each wait for
/// the client may take `timeout` (a large body may take as long as it
/// needs, a stalled client may not). Otherwise as [`read_body`]:
/// `100-continue` answered first, chunked coding checked and passed on as
/// sent, at most `max_body` bytes of chunked data.
pub async fn stream_body<C: ClientConn, S: BodySink>(
    c: &mut C,
    head: &RequestHead,
    max_body: u64,
    timeout: Duration,
    sink: S,
) -> Result<(), StreamError<S::Error>> {
    body_loop(c, head, max_body, || Instant::now() + timeout, sink).await
}

/// The body bytes kept by [`read_body`].
struct Keep<'a>(Option<&'a mut Vec<u8>>);

impl BodySink for Keep<'_> {
    type Error = std::convert::Infallible;

    async fn put(&mut self, bytes: &[u8]) -> Result<(), Self::Error> {
        if let Some(k) = self.0.as_deref_mut() {
            k.extend_from_slice(bytes);
        }
        Ok(())
    }
}

/// Read a body, giving each piece to `sink`; `until` says how long the next
/// wait for the client may last.
async fn body_loop<C: ClientConn, S: BodySink>(
    c: &mut C,
    head: &RequestHead,
    max_body: u64,
    until: impl Fn() -> Instant,
    mut sink: S,
) -> Result<(), StreamError<S::Error>> {
    if head.framing == BodyFraming::None {
        return Ok(());
    }
    if head.expect_continue {
        c.send_continue()
            .await
            .map_err(|_| StreamError::Body(BodyError::Broken))?;
    }
    match head.framing {
        BodyFraming::None => Ok(()),
        BodyFraming::Length(n) => {
            let mut left = n;
            loop {
                let p = c.parts();
                let take = (p.buf.len() as u64).min(left) as usize;
                if take > 0 {
                    sink.put(&p.buf[..take]).await.map_err(StreamError::Sink)?;
                    p.buf.advance(take);
                }
                left -= take as u64;
                if left == 0 {
                    return Ok(());
                }
                more(c, until()).await.map_err(StreamError::Body)?;
            }
        }
        BodyFraming::Chunked => {
            // A declared chunk beyond the limit is refused on its size line, without waiting
            // for its data.
            let mut dec = ChunkedDecoder::with_limit(max_body);
            loop {
                let p = c.parts();
                let used = dec.decode(p.buf, |_| {}).map_err(|e| {
                    StreamError::Body(match e {
                        ChunkedError::TooLarge => BodyError::TooLarge,
                        e => BodyError::Malformed(e),
                    })
                })?;
                if dec.body_len() > max_body {
                    return Err(StreamError::Body(BodyError::TooLarge));
                }
                if used > 0 {
                    sink.put(&p.buf[..used]).await.map_err(StreamError::Sink)?;
                    p.buf.advance(used);
                }
                if dec.is_done() {
                    return Ok(());
                }
                more(c, until()).await.map_err(StreamError::Body)?;
            }
        }
    }
}

/// Read more of a body, waiting until `until`.
async fn more<C: ClientConn>(c: &mut C, until: Instant) -> Result<(), BodyError> {
    let p = c.parts();
    let Ok(stream) = p.stream.registered() else {
        return Err(BodyError::Broken);
    };
    match fill(stream, p.buf, until).await {
        Ok(0) => Err(BodyError::Broken),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(BodyError::TimedOut),
        Err(_) => Err(BodyError::Broken),
    }
}
