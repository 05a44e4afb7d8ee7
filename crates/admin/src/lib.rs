//! The admin listener every switchyard process runs beside its data path.
//!
//! It answers a handful of small GET endpoints over HTTP/1.1 with
//! keep-alive: `/metrics` (Prometheus text exposition from a
//! `prometheus_client` registry), `/healthz`, and any extra routes the
//! process registers (a status page, JSON state), streams of
//! server-sent events (the live dashboard, [`dashboard`]) and, when the process offers them,
//! operator actions by POST ([`actions`]: off unless configured). It is deliberately
//! tiny and shares the request parser of the data path, so it has the same
//! limits and the same answers to bad input.

pub mod actions;
pub mod cluster;
pub mod dashboard;
pub mod encode;
pub mod status;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use switchyard_http::request::{self, Limits, Method, ParseOutcome};
use switchyard_http::response::ResponseHead;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Errors of the admin listener.
#[derive(Debug, Error)]
pub enum AdminError {
    #[error("cannot bind admin listener on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot draw the admin actions' token from /dev/urandom: {0}")]
    Token(std::io::Error),
}

/// A body produced on demand for an extra route.
pub type RouteFn = Arc<dyn Fn() -> Page + Send + Sync>;

/// A body produced on demand for an extra route that reads the query (the part of the target
/// after `?`, if any).
pub type QueryRouteFn = Arc<dyn Fn(Option<&str>) -> Page + Send + Sync>;

/// A response body and its content type.
#[derive(Clone, Debug)]
pub struct Page {
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

/// What the admin listener serves.
#[derive(Clone)]
pub struct Admin {
    // A std mutex: the registry is only locked to encode a scrape.
    registry: Arc<std::sync::Mutex<Registry>>,
    routes: HashMap<String, RouteFn>,
    query_routes: HashMap<String, QueryRouteFn>,
    streams: HashMap<String, dashboard::feed::Feed>,
    actions: Option<actions::Actions>,
}

impl Admin {
    /// Serve `/metrics` from `registry`.
    pub fn new(registry: Registry) -> Self {
        Admin {
            registry: Arc::new(std::sync::Mutex::new(registry)),
            routes: HashMap::new(),
            query_routes: HashMap::new(),
            streams: HashMap::new(),
            actions: None,
        }
    }

    /// Add a route answering GET `path` with whatever `f` renders.
    pub fn route(mut self, path: &str, f: RouteFn) -> Self {
        self.routes.insert(path.to_owned(), f);
        self
    }

    /// Add a route answering GET `path` with whatever `f` renders for the request's query
    /// (`/dotslash-status?auto`).
    pub fn route_query(mut self, path: &str, f: QueryRouteFn) -> Self {
        self.query_routes.insert(path.to_owned(), f);
        self
    }

    /// Serve GET `path` as a stream of server-sent events from `feed` (one connection per
    /// viewer, held until the viewer leaves or the listener stops).
    pub fn events(mut self, path: &str, feed: dashboard::feed::Feed) -> Self {
        self.streams.insert(path.to_owned(), feed);
        self
    }

    /// Offer operator actions: `GET /actions.json` and `POST /actions/…` ([`actions`]).
    pub fn actions(mut self, a: actions::Actions) -> Self {
        self.actions = Some(a);
        self
    }

    /// The metrics in Prometheus text format.
    pub fn render_metrics(&self) -> String {
        let mut out = String::new();
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Encoding into a String cannot fail except on a formatting bug.
        let _ = encode(&mut out, &reg);
        out
    }

    /// Bind the admin listener.
    pub async fn bind(addr: SocketAddr) -> Result<TcpListener, AdminError> {
        TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::Bind { addr, source })
    }

    /// Accept and serve connections until `shutdown` turns true.
    pub async fn serve(self, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
        let admin = Arc::new(self);
        loop {
            tokio::select! {
                r = listener.accept() => match r {
                    Ok((stream, _)) => {
                        let admin = admin.clone();
                        let stop = shutdown.clone();
                        tokio::spawn(async move {
                            if let Err(e) = admin.connection(stream, stop).await {
                                tracing::debug!(error = %e, "admin connection ended");
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = shutdown.changed() => {
                    if *shutdown.borrow() { return; }
                }
            }
        }
    }

    async fn connection(
        &self,
        mut stream: TcpStream,
        shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<()> {
        let limits = Limits::default();
        let mut buf = Vec::with_capacity(1024);
        let mut out = Vec::new();
        loop {
            let head = loop {
                match request::parse(&buf, &limits) {
                    Ok(ParseOutcome::Complete(h)) => break h,
                    Ok(ParseOutcome::Partial) => {}
                    Err(e) => {
                        out.clear();
                        ResponseHead::new(&mut out, e.status())
                            .content_length(0)
                            .connection(false, false)
                            .finish();
                        stream.write_all(&out).await?;
                        return Ok(());
                    }
                }
                let mut chunk = [0u8; 4096];
                let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk))
                    .await
                    .map_err(|_| std::io::ErrorKind::TimedOut)??;
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
            };
            // The raw head of a POST: the action guard reads headers the parser does not keep.
            let raw = (head.method == Method::Post).then(|| buf[..head.head_len].to_vec());
            buf.drain(..head.head_len);
            if head.framing != request::BodyFraming::None {
                // Admin endpoints take no bodies; refuse and close rather
                // than parse one.
                out.clear();
                ResponseHead::new(&mut out, 413)
                    .content_length(0)
                    .connection(false, false)
                    .finish();
                stream.write_all(&out).await?;
                return Ok(());
            }
            let path = head.target.split('?').next().unwrap_or("/");
            if let (Method::Get | Method::Head, Some(feed)) = (head.method, self.streams.get(path))
            {
                // The connection becomes the viewer's stream.
                return feed
                    .serve(stream, head.method == Method::Head, shutdown)
                    .await;
            }
            let action = path.strip_prefix("/actions/").zip(self.actions.as_ref());
            let (status, page) = match (head.method, path) {
                (Method::Get | Method::Head, "/actions.json") if self.actions.is_some() => {
                    (200, self.actions.as_ref().expect("checked").info())
                }
                (Method::Post, _) if action.is_some() => {
                    let (_, a) = action.expect("checked");
                    let rest = &head.target["/actions/".len()..];
                    match a.judge(raw.as_deref().unwrap_or_default(), head.host.as_deref()) {
                        actions::Verdict::Run => {
                            tracing::info!(action = rest, "admin action");
                            a.run(rest)
                        }
                        actions::Verdict::Forbidden(why) => {
                            tracing::warn!(action = rest, reason = why, "admin action refused");
                            (403, text_page(&format!("{why}\n")))
                        }
                    }
                }
                (Method::Get | Method::Head, _) if action.is_some() => {
                    (405, text_page("actions take POST\n"))
                }
                (Method::Get | Method::Head, "/metrics") => (
                    200,
                    Page {
                        content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        body: self.render_metrics().into_bytes(),
                    },
                ),
                (Method::Get | Method::Head, "/healthz") => (
                    200,
                    Page {
                        content_type: "text/plain; charset=utf-8",
                        body: b"ok\n".to_vec(),
                    },
                ),
                (Method::Get | Method::Head, p) => {
                    match (self.routes.get(p), self.query_routes.get(p)) {
                        (Some(f), _) => (200, f()),
                        (None, Some(f)) => (200, f(head.target.split_once('?').map(|(_, q)| q))),
                        (None, None) => (404, text_page("not found\n")),
                    }
                }
                _ => (405, text_page("method not allowed\n")),
            };
            out.clear();
            let mut h = ResponseHead::new(&mut out, status)
                .header("Content-Type", page.content_type)
                .header("Cache-Control", "no-store")
                .content_length(page.body.len() as u64)
                .connection(head.keep_alive, head.version == request::Version::Http10);
            if status == 405 {
                h = h.header(
                    "Allow",
                    if action.is_some() {
                        "POST"
                    } else {
                        "GET, HEAD"
                    },
                );
            }
            h.finish();
            if head.method != Method::Head {
                out.extend_from_slice(&page.body);
            }
            stream.write_all(&out).await?;
            if !head.keep_alive {
                return Ok(());
            }
        }
    }
}

fn text_page(s: &str) -> Page {
    Page {
        content_type: "text/plain; charset=utf-8",
        body: s.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[tokio::test]
    async fn serves_metrics_health_routes_and_errors() {
        let mut reg = Registry::default();
        let c: Counter = Counter::default();
        reg.register("demo_things", "Things seen", c.clone());
        c.inc_by(3);
        let admin = Admin::new(reg).route(
            "/status.json",
            Arc::new(|| Page {
                content_type: "application/json",
                body: b"{\"ok\":true}".to_vec(),
            }),
        );
        let listener = Admin::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(admin.serve(listener, rx));

        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\nGET /status.json HTTP/1.1\r\nHost: a\r\n\r\nGET /nope HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).await.unwrap();
        assert!(all.starts_with("HTTP/1.1 200 OK"), "{all}");
        assert!(all.contains("demo_things_total 3"), "{all}");
        assert!(all.contains("{\"ok\":true}"));
        assert!(all.contains("HTTP/1.1 404 Not Found"));

        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"DELETE /metrics HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).await.unwrap();
        assert!(all.starts_with("HTTP/1.1 405"), "{all}");

        tx.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn query_routes_see_the_query() {
        let admin = Admin::new(Registry::default()).route_query(
            "/dotslash-status",
            Arc::new(|q| Page {
                content_type: "text/plain",
                body: format!("query={q:?}").into_bytes(),
            }),
        );
        let listener = Admin::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(admin.serve(listener, rx));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /dotslash-status?auto HTTP/1.1\r\nHost: a\r\n\r\nGET /dotslash-status HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).await.unwrap();
        assert!(all.contains("query=Some(\"auto\")"), "{all}");
        assert!(all.contains("query=None"), "{all}");
        tx.send(true).unwrap();
        task.await.unwrap();
    }
}
