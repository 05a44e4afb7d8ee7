//! One client connection: read requests, answer them in order.
//!
//! The loop parses every complete request already buffered before it
//! writes, so pipelined requests are answered in order with as few
//! writes as possible; it flushes before it would block on a read. An idle
//! keep-alive connection holds no buffers: it waits for readability first
//! and allocates only when bytes arrive, which keeps ten thousand idle
//! connections within a few kilobytes each.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::timeout_at;

use switchyard_http::chunked::ChunkedDecoder;
use switchyard_http::conditional::{if_range_allows, none_match, not_modified_since};
use switchyard_http::path;
use switchyard_http::range::{evaluate, RangeDecision};
use switchyard_http::request::{self, BodyFraming, Method, ParseOutcome, RequestHead, Version};
use switchyard_http::response::{DateCache, ResponseHead};

use crate::fs::FileInfo;
use crate::store::Resolved;
use crate::Ctx;

/// Bodies up to this size are copied behind their head in one write.
const COPY_BODY_MAX: usize = 16 * 1024;
/// Buffered responses are flushed once this much is pending.
const FLUSH_AT: usize = 64 * 1024;

/// A response body.
enum Body {
    Empty,
    Bytes(Bytes),
    File {
        file: std::fs::File,
        offset: u64,
        len: u64,
    },
}

struct Conn<'a> {
    ctx: &'a Ctx,
    stream: TcpStream,
    buf: BytesMut,
    out: Vec<u8>,
    /// Start times of responses buffered in `out`, observed at flush.
    pending: Vec<Instant>,
    date: DateCache,
    shutdown: watch::Receiver<bool>,
}

/// Why the connection loop ended early.
enum End {
    /// Peer closed, idle timeout, or shutdown while idle: just close.
    Quiet,
    /// Send this status and close.
    Error(u16),
    /// I/O failed; nothing more can be sent.
    Broken,
}

impl From<io::Error> for End {
    fn from(_: io::Error) -> End {
        End::Broken
    }
}

/// Serve one accepted connection until it closes.
pub(crate) async fn serve(ctx: Arc<Ctx>, stream: TcpStream, shutdown: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let mut conn = Conn {
        ctx: &ctx,
        stream,
        buf: BytesMut::new(),
        out: Vec::new(),
        pending: Vec::new(),
        date: DateCache::default(),
        shutdown,
    };
    let end = conn.run().await;
    match end {
        End::Quiet => {}
        End::Broken => return,
        End::Error(status) => {
            conn.error_response(status, false, Method::Get, false);
            if conn.flush().await.is_err() {
                return;
            }
            conn.linger().await;
        }
    }
}

impl Conn<'_> {
    async fn run(&mut self) -> End {
        let mut first = true;
        loop {
            let head = match self.next_head(first).await {
                Ok(h) => h,
                Err(e) => return e,
            };
            first = false;
            let started = Instant::now();
            self.buf.advance(head.head_len);

            let static_method = matches!(head.method, Method::Get | Method::Head);
            if !static_method {
                // Bodies of refused methods are not read: answer and close.
                let status = if head.method == Method::Other {
                    501
                } else {
                    405
                };
                let keep = head.keep_alive && head.framing == BodyFraming::None && !self.stopping();
                self.error_response(status, keep, head.method, head.version == Version::Http10);
                self.pending.push(started);
                if !keep {
                    return self.close_after_flush().await;
                }
                continue;
            }
            if head.framing != BodyFraming::None {
                if let Err(e) = self.discard_body(&head).await {
                    return e;
                }
            }
            let keep = head.keep_alive && !self.stopping();
            let body = self.respond(&head, keep).await;
            match body {
                Body::Empty => {}
                Body::Bytes(b) if b.len() <= COPY_BODY_MAX => self.out.extend_from_slice(&b),
                Body::Bytes(b) => {
                    if let Err(e) = self.write_with_body(&b).await {
                        return e.into();
                    }
                }
                Body::File { file, offset, len } => {
                    if let Err(e) = self.flush().await {
                        return e.into();
                    }
                    if let Err(e) = self.sendfile(&file, offset, len).await {
                        return e.into();
                    }
                }
            }
            self.pending.push(started);
            if !keep {
                return self.close_after_flush().await;
            }
            if self.out.len() >= FLUSH_AT {
                if let Err(e) = self.flush().await {
                    return e.into();
                }
            }
        }
    }

    fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    async fn close_after_flush(&mut self) -> End {
        if self.flush().await.is_err() {
            return End::Broken;
        }
        self.linger().await;
        End::Quiet
    }

    /// Parse the next request head, reading (and flushing) as needed.
    async fn next_head(&mut self, first: bool) -> Result<RequestHead, End> {
        let limits = self.ctx.limits;
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            if !self.buf.is_empty() {
                match request::parse(&self.buf, &limits) {
                    Ok(ParseOutcome::Complete(h)) => return Ok(h),
                    Ok(ParseOutcome::Partial) => {}
                    Err(e) => {
                        self.flush().await?;
                        tracing::debug!(error = %e, "bad request");
                        return Err(End::Error(e.status()));
                    }
                }
            }
            // About to wait for the client: send what is pending first.
            self.flush().await?;
            if self.buf.is_empty() {
                // Idle: release buffers, wait for the next request.
                self.buf = BytesMut::new();
                self.out = Vec::new();
                let wait = if first {
                    self.ctx.header_timeout
                } else {
                    self.ctx.idle_timeout
                };
                let until = tokio::time::Instant::now() + wait;
                tokio::select! {
                    r = timeout_at(until, self.stream.readable()) => match r {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return Err(End::Broken),
                        Err(_) => {
                            self.count_timeout();
                            return Err(End::Quiet);
                        }
                    },
                    _ = self.shutdown.changed() => return Err(End::Quiet),
                }
            }
            let until = *deadline
                .get_or_insert_with(|| tokio::time::Instant::now() + self.ctx.header_timeout);
            match self.fill(until).await {
                Ok(0) => {
                    return Err(if self.buf.is_empty() {
                        End::Quiet
                    } else {
                        End::Broken
                    })
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    self.count_timeout();
                    return Err(if self.buf.is_empty() {
                        End::Quiet
                    } else {
                        End::Error(408)
                    });
                }
                Err(_) => return Err(End::Broken),
            }
        }
    }

    fn count_timeout(&self) {
        self.ctx
            .metrics
            .timeouts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Read whatever is available into `buf`, waiting until `until`.
    async fn fill(&mut self, until: tokio::time::Instant) -> io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(4096);
        }
        match timeout_at(until, self.stream.read_buf(&mut self.buf)).await {
            Ok(r) => r,
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    }

    /// Read and drop a request body (GET and HEAD bodies carry no meaning).
    async fn discard_body(&mut self, head: &RequestHead) -> Result<(), End> {
        if head.expect_continue {
            self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            self.flush().await?;
        }
        let until = tokio::time::Instant::now() + self.ctx.header_timeout;
        match head.framing {
            BodyFraming::None => Ok(()),
            BodyFraming::Length(mut left) => loop {
                let take = (self.buf.len() as u64).min(left) as usize;
                self.buf.advance(take);
                left -= take as u64;
                if left == 0 {
                    return Ok(());
                }
                self.read_more(until).await?;
            },
            BodyFraming::Chunked => {
                let mut dec = ChunkedDecoder::new();
                loop {
                    let used = dec.decode(&self.buf, |_| {}).map_err(|_| End::Error(400))?;
                    self.buf.advance(used);
                    if dec.body_len() > self.ctx.limits.max_body_bytes {
                        return Err(End::Error(413));
                    }
                    if dec.is_done() {
                        return Ok(());
                    }
                    self.read_more(until).await?;
                }
            }
        }
    }

    async fn read_more(&mut self, until: tokio::time::Instant) -> Result<(), End> {
        match self.fill(until).await {
            Ok(0) => Err(End::Broken),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                self.count_timeout();
                Err(End::Error(408))
            }
            Err(_) => Err(End::Broken),
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
        match self.ctx.store.resolve(&clean).await {
            Resolved::Memory { object, .. } => {
                let body = object.body.clone();
                self.entity(head, keep, &object.info, Source::Memory(body))
            }
            Resolved::File(file, info) => self.entity(head, keep, &info, Source::File(file)),
            Resolved::Redirect(location) => {
                let query = head.target.find('?').map_or("", |i| &head.target[i..]);
                let location = format!("{location}{query}");
                let date = self.date.get(SystemTime::now()).to_owned();
                ResponseHead::new(&mut self.out, 301)
                    .header("Date", &date)
                    .header("Server", "switchyard")
                    .header("Location", &location)
                    .content_length(0)
                    .connection(keep, head.version == Version::Http10)
                    .finish();
                self.ctx.metrics.count_status(301);
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

    /// A 200, 206, 304 or 416 for an existing file.
    fn entity(&mut self, head: &RequestHead, keep: bool, info: &FileInfo, src: Source) -> Body {
        let http10 = head.version == Version::Http10;
        let not_modified = match (&head.if_none_match, &head.if_modified_since) {
            (Some(inm), _) => none_match(inm, &info.etag),
            (None, Some(ims)) => not_modified_since(ims, info.mtime),
            (None, None) => false,
        };
        let date = self.date.get(SystemTime::now()).to_owned();
        if not_modified {
            ResponseHead::new(&mut self.out, 304)
                .header("Date", &date)
                .header("Server", "switchyard")
                .header("ETag", &info.etag)
                .header("Last-Modified", &info.last_modified)
                .connection(keep, http10)
                .finish();
            self.ctx.metrics.count_status(304);
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
        let mut h = ResponseHead::new(&mut self.out, status)
            .header("Date", &date)
            .header("Server", "switchyard")
            .header("Content-Type", info.content_type)
            .header("ETag", &info.etag)
            .header("Last-Modified", &info.last_modified)
            .header("Accept-Ranges", "bytes");
        match decision {
            RangeDecision::Full => {}
            RangeDecision::Partial { start, end } => {
                h = h.header(
                    "Content-Range",
                    &format!("bytes {start}-{end}/{}", info.len),
                );
            }
            RangeDecision::Unsatisfiable => {
                h = h.header("Content-Range", &format!("bytes */{}", info.len));
            }
        }
        h.content_length(len).connection(keep, http10).finish();
        self.ctx.metrics.count_status(status);
        if head.method == Method::Head || len == 0 {
            return Body::Empty;
        }
        match src {
            Source::Memory(b) => Body::Bytes(b.slice(start as usize..(start + len) as usize)),
            Source::File(file) => Body::File {
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
        let date = self.date.get(SystemTime::now()).to_owned();
        let mut h = ResponseHead::new(&mut self.out, status)
            .header("Date", &date)
            .header("Server", "switchyard")
            .header("Content-Type", "text/plain; charset=utf-8")
            .content_length(body.len() as u64)
            .connection(keep, http10);
        if status == 405 {
            h = h.header("Allow", "GET, HEAD");
        }
        h.finish();
        if method != Method::Head {
            self.out.extend_from_slice(body.as_bytes());
        }
        self.ctx.metrics.count_status(status);
    }

    /// Write everything in `out`.
    async fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            let until = tokio::time::Instant::now() + self.ctx.send_timeout;
            match timeout_at(until, self.stream.write_all(&self.out)).await {
                Ok(r) => r?,
                Err(_) => {
                    self.count_timeout();
                    return Err(io::ErrorKind::TimedOut.into());
                }
            }
            self.ctx
                .metrics
                .bytes_out
                .fetch_add(self.out.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.out.clear();
        }
        self.observe_pending();
        Ok(())
    }

    fn observe_pending(&mut self) {
        for t in self.pending.drain(..) {
            self.ctx
                .metrics
                .response_seconds
                .observe(t.elapsed().as_secs_f64());
        }
    }

    /// Write `out` and then `body` with vectored writes.
    async fn write_with_body(&mut self, body: &[u8]) -> io::Result<()> {
        let total = self.out.len() + body.len();
        let until = tokio::time::Instant::now() + self.ctx.send_timeout;
        let mut done = 0usize;
        while done < total {
            let slices = if done < self.out.len() {
                [IoSlice::new(&self.out[done..]), IoSlice::new(body)]
            } else {
                [
                    IoSlice::new(&body[done - self.out.len()..]),
                    IoSlice::new(&[]),
                ]
            };
            let n = match timeout_at(until, self.stream.write_vectored(&slices)).await {
                Ok(r) => r?,
                Err(_) => {
                    self.count_timeout();
                    return Err(io::ErrorKind::TimedOut.into());
                }
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            done += n;
        }
        self.ctx
            .metrics
            .bytes_out
            .fetch_add(total as u64, std::sync::atomic::Ordering::Relaxed);
        self.out.clear();
        Ok(())
    }

    /// Send `len` bytes of `file` from `offset` with sendfile(2).
    async fn sendfile(&mut self, file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsFd;
        let mut off = offset as i64;
        let mut left = len;
        let until = tokio::time::Instant::now() + self.ctx.send_timeout;
        while left > 0 {
            let sent = self.stream.try_io(tokio::io::Interest::WRITABLE, || {
                let chunk = left.min(1 << 30) as usize;
                nix::sys::sendfile::sendfile64(
                    self.stream.as_fd(),
                    file.as_fd(),
                    Some(&mut off),
                    chunk,
                )
                .map_err(io::Error::from)
            });
            match sent {
                Ok(0) => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank"));
                }
                Ok(n) => {
                    left -= n as u64;
                    self.ctx
                        .metrics
                        .bytes_out
                        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    self.ctx
                        .metrics
                        .sendfile_bytes
                        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if timeout_at(until, self.stream.writable()).await.is_err() {
                        self.count_timeout();
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Close the sending side, then read and drop what the client still
    /// sends for a moment, so that our last response is not destroyed by a
    /// reset caused by unread data (a "lingering close").
    async fn linger(&mut self) {
        let _ = self.stream.shutdown().await;
        let until = tokio::time::Instant::now() + Duration::from_secs(2);
        let mut scratch = [0u8; 4096];
        let mut budget = 256 * 1024usize;
        while budget > 0 {
            match timeout_at(until, self.stream.read(&mut scratch)).await {
                Ok(Ok(n)) if n > 0 => budget = budget.saturating_sub(n),
                _ => break,
            }
        }
    }
}

enum Source {
    Memory(Bytes),
    File(std::fs::File),
}
