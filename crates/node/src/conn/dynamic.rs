//! Dynamic content (`[dynamic]`): requests for configured paths are forwarded to an
//! application server on the node's host, and its responses go back on the client's
//! connection, which the node keeps owning (also when a switch handed it in or a peer cloned
//! it: those connections run the same loop).
//!
//! The client of [`switchyard_upstream`] does the talking, as for the switch and for back-end
//! forwarding: pooled keep-alive connections per worker thread, the request head rewritten for
//! the hop (hop-by-hop fields dropped, `X-Forwarded-For` added), the response head read with
//! the strict parser the switch uses, the body relayed by length, chunks or close. A request
//! body is streamed to the application as it arrives from the client (checked as it passes:
//! `Content-Length`, or the strict chunked decoder), never held whole.
//!
//! Failures are answered by the node: a connection that cannot be opened, a refused response
//! head or a connection that breaks before the response head is 502, a wait that times out is
//! 504, each logged once with the upstream, method, target and kind. A request is sent again on
//! a new connection only when it is idempotent, has no body, and its pooled connection closed
//! before a byte of response came back; a request that is not idempotent is never sent twice.
//! When the response breaks off after some of it reached the client, the client's connection
//! closes: nothing else can tell it the response is incomplete.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Buf;
use switchyard_http::path;
use switchyard_http::request::{BodyFraming, Method, RequestHead, Version};
use switchyard_http::upstream::{client_response_head, forward_request_head, BodyLength};
use switchyard_policy::UrlPattern;
use switchyard_runtime::request::{stream_body, BodyError, BodySink, StreamError};
use switchyard_upstream::{self as upstream, Connection, Deadline, Pool};

use super::{Conn, End, Router, FLUSH_AT};
use crate::config::DynamicConfig;
use crate::metrics::UpstreamError;
use crate::NodeError;

/// Largest response head accepted from the application server.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// The application server and the paths it serves.
#[derive(Debug)]
pub(crate) struct Dynamic {
    upstream: SocketAddr,
    patterns: Vec<UrlPattern>,
    connect_timeout: Duration,
    timeout: Duration,
    forwarded_for: bool,
    pool: Pool,
}

impl Dynamic {
    pub(crate) fn new(cfg: &DynamicConfig) -> Result<Dynamic, NodeError> {
        cfg.validate().map_err(NodeError::Config)?;
        Ok(Dynamic {
            upstream: cfg.upstream,
            patterns: cfg.patterns().map_err(NodeError::Config)?,
            connect_timeout: Duration::from_millis(cfg.connect_timeout_ms),
            timeout: Duration::from_millis(cfg.timeout_ms),
            forwarded_for: cfg.forwarded_for,
            pool: Pool::new(usize::MAX, cfg.max_idle),
        })
    }

    /// Whether the request goes to the application server: its normalized path matches (a
    /// target that does not normalize is the static side's 400), and it is not `CONNECT`
    /// (a tunnel, which this server does not make).
    pub(crate) fn serves(&self, head: &RequestHead) -> bool {
        head.method != Method::Connect && self.matches(&head.target)
    }

    fn matches(&self, target: &str) -> bool {
        let Ok(clean) = path::normalize(target) else {
            return false;
        };
        let mut p = clean.path;
        if clean.trailing_slash && p != "/" {
            p.push('/');
        }
        self.patterns.iter().any(|pat| pat.matches(&p))
    }

    /// A connection to the application server: a pooled one unless `fresh`.
    async fn connection(&self, fresh: bool) -> Result<Connection, upstream::Error> {
        if fresh {
            upstream::connect(self.upstream, self.connect_timeout).await
        } else {
            self.pool
                .checkout(self.upstream, self.connect_timeout)
                .await
        }
    }
}

/// The status a failure of the application server is answered with, and its kind.
fn classify(e: &upstream::Error) -> (u16, UpstreamError) {
    use std::io::ErrorKind::TimedOut;
    if e.is_local_resource() {
        return (503, UpstreamError::Local);
    }
    match e {
        upstream::Error::Connect { source, .. } if source.kind() == TimedOut => {
            (504, UpstreamError::Timeout)
        }
        upstream::Error::Connect { .. } | upstream::Error::Source { .. } => {
            (502, UpstreamError::Connect)
        }
        upstream::Error::Send(s) if s.kind() == TimedOut => (504, UpstreamError::Timeout),
        upstream::Error::TimedOut => (504, UpstreamError::Timeout),
        upstream::Error::Response(_) | upstream::Error::Chunked(_) => {
            (502, UpstreamError::Response)
        }
        upstream::Error::Send(_)
        | upstream::Error::Closed
        | upstream::Error::Read(_)
        | upstream::Error::Truncated
        | upstream::Error::Client(_) => (502, UpstreamError::Broken),
    }
}

/// How a request to the application server failed before its response head.
enum Failed {
    /// The application server failed: answer `status`; `close` when the request body was not
    /// read to its end (the connection cannot carry another request).
    Upstream { error: upstream::Error, close: bool },
    /// The client's side failed or sent a bad body: end the connection this way.
    Client(End),
}

/// A failed exchange of a request read whole: the client's failure (passing on an interim
/// response) ends the connection, anything else is the application server's.
fn call_failed(error: upstream::Error) -> Failed {
    match error {
        upstream::Error::Client(_) => Failed::Client(End::Broken),
        error => Failed::Upstream {
            error,
            close: false,
        },
    }
}

/// The request body's way to the application server.
struct ToApp<'a> {
    conn: &'a Connection,
    timeout: Duration,
}

impl BodySink for ToApp<'_> {
    type Error = std::io::Error;

    async fn put(&mut self, bytes: &[u8]) -> Result<(), std::io::Error> {
        upstream::splice::write_all(self.conn.stream(), bytes, self.timeout).await
    }
}

impl<R: Router> Conn<'_, R> {
    /// Answer a request for a dynamic path from the application server; `Some` ends the
    /// connection.
    pub(super) async fn dynamic(&mut self, head: RequestHead, app: &Dynamic) -> Option<End> {
        let started = Instant::now();
        let metrics = &self.ctx.metrics.upstream;
        metrics.requests.fetch_add(1, Relaxed);
        self.stats.requests += 1;
        let http10 = head.version == Version::Http10;
        let mut req = Vec::with_capacity(head.head_len + 64);
        let client_ip = app
            .forwarded_for
            .then(|| self.stream.peer_addr().ok().map(|a| a.ip().to_string()))
            .flatten();
        forward_request_head(
            &self.buf[..head.head_len],
            head.plain,
            http10,
            client_ip.as_deref(),
            &mut req,
        );
        self.buf.advance(head.head_len);
        // The application may take its time: the responses before this one go out first (so
        // that interim responses can be passed on in order).
        if self.flush().await.is_err() {
            return Some(End::Broken);
        }
        let (mut conn, r) = match self.call(&head, app, &req).await {
            Ok(ok) => ok,
            Err(Failed::Client(end)) => return Some(end),
            Err(Failed::Upstream { error, close }) => {
                return self.app_failed(&head, app, &error, close, started).await;
            }
        };
        let meta = r.meta;
        if http10 && meta.body == BodyLength::Chunked {
            // An HTTP/1.0 client cannot take a chunked body.
            let error =
                upstream::Error::Response(switchyard_http::upstream::ResponseError::Malformed(
                    "chunked response to an HTTP/1.0 request",
                ));
            return self.app_failed(&head, app, &error, false, started).await;
        }
        let keep = head.keep_alive && !self.stopping() && meta.body != BodyLength::UntilClose;
        let out_mark = self.out.len();
        let written_mark = self.stats.bytes;
        self.out.reserve(1024);
        client_response_head(&r.head, &meta, keep, http10, &mut self.out);
        let opts = upstream::RelayOptions {
            deadline: Deadline::Each(app.timeout),
            flush_at: FLUSH_AT,
            // Written with the responses that follow, or when the connection closes.
            flush_end: false,
            direct: None,
        };
        match upstream::relay_body(&mut conn, meta.body, meta.keep_alive, self, opts).await {
            Ok(done) => {
                if done.reusable {
                    app.pool.put(conn);
                }
            }
            Err(f) if f.error.is_client() => return Some(End::Broken),
            Err(f) => {
                if self.stats.bytes == written_mark {
                    // Nothing of it reached the client: it gets an error response instead.
                    self.out.truncate(out_mark);
                    return self.app_failed(&head, app, &f.error, false, started).await;
                }
                let (_, kind) = classify(&f.error);
                metrics.count_error(kind);
                tracing::warn!(
                    upstream = %app.upstream,
                    method = %head.method_token,
                    target = %head.target,
                    kind = kind.name(),
                    error = %f.error,
                    "application server response broke off; closing the client connection"
                );
                return Some(End::Broken);
            }
        }
        self.count_status(meta.status);
        self.pending.push(started);
        if !keep {
            return Some(self.close().await);
        }
        if self.out.len() >= FLUSH_AT && self.flush().await.is_err() {
            return Some(End::Broken);
        }
        None
    }

    /// Send the request (`req`, its rewritten head, then its body from the client) and read
    /// the final response head.
    async fn call(
        &mut self,
        head: &RequestHead,
        app: &Dynamic,
        req: &[u8],
    ) -> Result<(Connection, upstream::Response), Failed> {
        let head_request = head.method == Method::Head;
        let http10 = head.version == Version::Http10;
        let deadline = Deadline::Each(app.timeout);
        let metrics = &self.ctx.metrics.upstream;
        let has_body = head.framing != BodyFraming::None;
        let mut fresh = false;
        loop {
            let mut conn = app
                .connection(fresh)
                .await
                .map_err(|error| Failed::Upstream {
                    error,
                    close: has_body,
                })?;
            if !conn.reused() {
                metrics.connects.fetch_add(1, Relaxed);
            }
            // Interim responses are passed on to HTTP/1.1 clients (the output is empty).
            let interim = (!http10).then_some((&mut self.stream, self.ctx.send_timeout));
            if !has_body {
                let r = upstream::Request {
                    bytes: req,
                    head_request,
                    max_head: MAX_RESPONSE_HEAD,
                };
                match upstream::exchange(&mut conn, r, deadline, interim).await {
                    Ok(resp) => return Ok((conn, resp)),
                    Err(f) if f.retryable && head.method.is_idempotent() => {
                        metrics.retries.fetch_add(1, Relaxed);
                        tracing::debug!(upstream = %app.upstream, error = %f.error, "pooled connection closed; sending again on a new one");
                        fresh = true;
                        continue;
                    }
                    Err(f) => return Err(call_failed(f.error)),
                }
            }
            // A body: the head, then the body as it arrives; the request cannot be sent twice.
            if let Err(e) = upstream::splice::write_all(conn.stream(), req, app.timeout).await {
                return Err(Failed::Upstream {
                    error: upstream::Error::Send(e),
                    close: true,
                });
            }
            let max = self.ctx.limits.max_body_bytes;
            let wait = self.ctx.header_timeout;
            let sink = ToApp {
                conn: &conn,
                timeout: app.timeout,
            };
            match stream_body(self, head, max, wait, sink).await {
                Ok(()) => {}
                Err(StreamError::Sink(e)) => {
                    return Err(Failed::Upstream {
                        error: upstream::Error::Send(e),
                        close: true,
                    })
                }
                Err(StreamError::Body(e)) => return Err(Failed::Client(self.body_failed(e))),
            }
            let interim = (!http10).then_some((&mut self.stream, self.ctx.send_timeout));
            return match upstream::read_response(
                &mut conn,
                head_request,
                MAX_RESPONSE_HEAD,
                deadline,
                interim,
            )
            .await
            {
                Ok(resp) => Ok((conn, resp)),
                Err(f) => Err(call_failed(f.error)),
            };
        }
    }

    /// What a bad or missing request body means for the connection.
    fn body_failed(&mut self, e: BodyError) -> End {
        match e {
            BodyError::Malformed(e) => {
                tracing::debug!(error = %e, "bad chunked request body");
                End::Error(400)
            }
            BodyError::TooLarge => End::Error(413),
            BodyError::TimedOut => {
                self.count_timeout();
                End::Error(408)
            }
            BodyError::Broken => End::Broken,
        }
    }

    /// Answer a request the application server failed with 502, 504 (or 503 when this host
    /// lacks a descriptor), and log it; `close` ends the connection after the answer.
    async fn app_failed(
        &mut self,
        head: &RequestHead,
        app: &Dynamic,
        error: &upstream::Error,
        close: bool,
        started: Instant,
    ) -> Option<End> {
        let (status, kind) = classify(error);
        self.ctx.metrics.upstream.count_error(kind);
        tracing::warn!(
            upstream = %app.upstream,
            method = %head.method_token,
            target = %head.target,
            status,
            kind = kind.name(),
            error = %error,
            "application server failed"
        );
        if close {
            return Some(End::Error(status));
        }
        let keep = head.keep_alive && !self.stopping();
        self.error_response(status, keep, head.method, head.version == Version::Http10);
        self.pending.push(started);
        if !keep {
            return Some(self.close().await);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(paths: &[&str]) -> Dynamic {
        let cfg = DynamicConfig::new(
            "127.0.0.1:9".parse().unwrap(),
            paths.iter().map(|p| p.to_string()).collect(),
        );
        Dynamic::new(&cfg).unwrap()
    }

    fn head(req: &str) -> RequestHead {
        match switchyard_http::request::parse(req.as_bytes(), &Default::default()).unwrap() {
            switchyard_http::request::ParseOutcome::Complete(h) => h,
            _ => panic!("partial"),
        }
    }

    /// Paths match after normalization, whatever the query; CONNECT never goes.
    #[test]
    fn paths_match_on_the_normalized_path() {
        let a = app(&["/app/", "*.php", "=/status"]);
        let get = |t: &str| a.serves(&head(&format!("GET {t} HTTP/1.1\r\nHost: h\r\n\r\n")));
        assert!(get("/app/"));
        assert!(get("/app/x?y=1"));
        assert!(get("/static/../app/x"));
        assert!(get("/%61pp/x"));
        assert!(get("/a/b.php?x"));
        assert!(get("/status"));
        assert!(!get("/status/"));
        assert!(!get("/app"));
        assert!(!get("/application"));
        assert!(!get("/index.html?p=.php"));
        assert!(!get("/app/../index.html"));
        assert!(!get("/../app/x"));
        assert!(a.serves(&head(
            "POST /app/x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
        )));
        // A tunnel is never made, whatever the patterns.
        let all = app(&["*"]);
        assert!(all.serves(&head("OPTIONS /x HTTP/1.1\r\nHost: h\r\n\r\n")));
        assert!(!all.serves(&head("CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n")));
    }

    /// Timeouts are 504, refusals and broken connections 502, a shortage here 503.
    #[test]
    fn failures_map_to_statuses() {
        use std::io::{Error, ErrorKind};
        let addr = "127.0.0.1:9".parse().unwrap();
        let connect = |k: ErrorKind| upstream::Error::Connect {
            addr,
            source: Error::from(k),
        };
        assert_eq!(classify(&connect(ErrorKind::TimedOut)).0, 504);
        assert_eq!(
            classify(&connect(ErrorKind::ConnectionRefused)),
            (502, UpstreamError::Connect)
        );
        assert_eq!(
            classify(&upstream::Error::Connect {
                addr,
                source: Error::from_raw_os_error(libc::EMFILE)
            }),
            (503, UpstreamError::Local)
        );
        assert_eq!(
            classify(&upstream::Error::TimedOut),
            (504, UpstreamError::Timeout)
        );
        assert_eq!(
            classify(&upstream::Error::Send(ErrorKind::TimedOut.into())),
            (504, UpstreamError::Timeout)
        );
        assert_eq!(
            classify(&upstream::Error::Closed),
            (502, UpstreamError::Broken)
        );
        assert_eq!(
            classify(&upstream::Error::Response(
                switchyard_http::upstream::ResponseError::TooLarge
            )),
            (502, UpstreamError::Response)
        );
    }
}
