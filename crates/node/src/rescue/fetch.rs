//! Fetching from an origin: the request a rescue server sends (`GET`, the origin's name as
//! `Host`, the validators of a stored copy when revalidating), and what is kept of the
//! response: its status, the entity headers that matter to clients (`Content-Type`, `ETag`,
//! `Last-Modified`, `Cache-Control`) and its body. Every other header of the origin (cookies,
//! hop-by-hop fields, anything else) stays behind.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use switchyard_upstream::{self as upstream, Collected, Connection, Deadline, Pool, Response};
use tokio::time::Instant;

/// Largest response head accepted from an origin.
pub(crate) const MAX_RESPONSE_HEAD: usize = 32 * 1024;
/// Bytes an object is charged beyond its body and kept header values (its entry and key).
const OVERHEAD: u64 = 128;

/// A response as the proxy keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Object {
    pub(crate) status: u16,
    pub(crate) content_type: Option<String>,
    pub(crate) etag: Option<String>,
    pub(crate) last_modified: Option<String>,
    pub(crate) cache_control: Option<String>,
    /// Where a redirect of the origin's points (passed on as it came).
    pub(crate) location: Option<String>,
    pub(crate) body: Bytes,
}

impl Object {
    /// Bytes it is charged in the store.
    pub(crate) fn size(&self) -> u64 {
        let h = [
            &self.content_type,
            &self.etag,
            &self.last_modified,
            &self.cache_control,
            &self.location,
        ]
        .iter()
        .map(|v| v.as_ref().map_or(0, |s| s.len() as u64))
        .sum::<u64>();
        self.body.len() as u64 + h + OVERHEAD
    }

    /// Whether it has a validator to revalidate it with.
    pub(crate) fn has_validator(&self) -> bool {
        self.etag.is_some() || self.last_modified.is_some()
    }
}

/// The headers kept of an origin's response, and how it may be cached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) content_type: Option<String>,
    pub(crate) etag: Option<String>,
    pub(crate) last_modified: Option<String>,
    pub(crate) cache_control: Option<String>,
    /// `Location`: a redirect of the origin's (to a rescue server, say) reaches the client
    /// as the origin sent it.
    pub(crate) location: Option<String>,
    /// The `Content-Length` the origin sent (for relaying a `HEAD` response).
    pub(crate) content_length: Option<u64>,
}

impl Object {
    /// Whether it may be served stale when the origin cannot be reached (RFC 9111 §4.2.4):
    /// not when the origin said `must-revalidate`, `proxy-revalidate` or `no-cache`.
    pub(crate) fn may_serve_stale(&self) -> bool {
        self.cache_control.as_deref().is_none_or(|c| {
            !switchyard_http::cache_control::directives(c)
                .iter()
                .any(|(n, _)| {
                    matches!(
                        n.as_str(),
                        "must-revalidate" | "proxy-revalidate" | "no-cache"
                    )
                })
        })
    }

    /// How long it may be served without asking the origin: the origin's `s-maxage` or
    /// `max-age` (RFC 9111 §4.2.1), else `default` (`fresh_ms`). The age it had when fetched
    /// is taken as zero: it comes straight from the origin.
    pub(crate) fn fresh_for(&self, default: std::time::Duration) -> std::time::Duration {
        self.cache_control
            .as_deref()
            .and_then(switchyard_http::cache_control::shared_max_age)
            .map_or(default, std::time::Duration::from_secs)
    }
}

/// How `Cache-Control` lets a shared cache use a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// Stored and served to everyone.
    Store,
    /// `no-cache`: may go to the clients waiting for this very fetch, but is not stored (a
    /// later request would have to revalidate it anyway).
    Waiters,
    /// `no-store` or `private`: for one client only, never stored nor shared.
    Private,
}

impl Kept {
    /// Read the kept headers from a response head (already parsed strictly by
    /// [`switchyard_http::upstream::parse`], so it is well formed).
    pub(crate) fn from_head(head: &[u8]) -> Kept {
        let mut headers = [httparse::EMPTY_HEADER; switchyard_http::upstream::MAX_HEADERS];
        let mut r = httparse::Response::new(&mut headers);
        let mut k = Kept::default();
        if r.parse(head).is_err() {
            return k;
        }
        for h in r.headers.iter() {
            let Ok(v) = std::str::from_utf8(h.value) else {
                continue;
            };
            let v = v.trim_matches([' ', '\t']).to_string();
            let name = h.name;
            if name.eq_ignore_ascii_case("content-type") {
                k.content_type = Some(v);
            } else if name.eq_ignore_ascii_case("etag") {
                k.etag = Some(v);
            } else if name.eq_ignore_ascii_case("last-modified") {
                k.last_modified = Some(v);
            } else if name.eq_ignore_ascii_case("cache-control") {
                // Several fields form one comma-separated list.
                k.cache_control = Some(match k.cache_control.take() {
                    Some(c) => format!("{c}, {v}"),
                    None => v,
                });
            } else if name.eq_ignore_ascii_case("content-length") {
                k.content_length = v.parse().ok();
            } else if name.eq_ignore_ascii_case("location") {
                k.location = Some(v);
            }
        }
        k
    }

    /// What `Cache-Control` allows.
    pub(crate) fn sharing(&self) -> Sharing {
        let mut s = Sharing::Store;
        for d in self.cache_control.iter().flat_map(|c| c.split(',')) {
            let name = d.split('=').next().unwrap_or("").trim();
            if name.eq_ignore_ascii_case("no-store") || name.eq_ignore_ascii_case("private") {
                return Sharing::Private;
            }
            if name.eq_ignore_ascii_case("no-cache") {
                s = Sharing::Waiters;
            }
        }
        s
    }

    fn into_object(self, status: u16, body: Bytes) -> Object {
        Object {
            status,
            content_type: self.content_type,
            etag: self.etag,
            last_modified: self.last_modified,
            cache_control: self.cache_control,
            location: self.location,
            body,
        }
    }
}

/// The outcome of one fetch.
#[derive(Debug)]
pub(crate) enum Fetched {
    /// A complete response and how it may be shared.
    Complete(Object, Sharing),
    /// The origin answered a conditional fetch 304: the stored copy is still good.
    NotModified,
    /// The body is larger than the per-object cap and not framed by `Content-Length`: each
    /// client's request is relayed.
    TooLarge,
    /// The body is larger than the per-object cap and of a known length: the head is read,
    /// the body is still to come on `conn` (by `until`), to be spooled for every waiter.
    Large {
        conn: Connection,
        status: u16,
        kept: Kept,
        len: u64,
        keep_alive: bool,
        until: Instant,
    },
    /// The fetch failed: the status the clients get (502, or 504 on a timeout).
    Failed(u16),
}

/// Where to fetch from and as what.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    /// The origin's address (its IP and web port, bypassing DNS).
    pub(crate) addr: SocketAddr,
    /// The origin's name, the fetch's `Host`.
    pub(crate) fqdn: &'a str,
    /// The request target, origin-form.
    pub(crate) path: &'a str,
    /// This server's name, for `Via`.
    pub(crate) via: &'a str,
}

/// The request for `t`: `method` (`GET` or `HEAD`), the origin's name as `Host` (with its
/// port unless 80), `Via`, and the validators of a stored copy.
pub(crate) fn request(t: Target<'_>, method: &str, validators: Option<&Object>) -> Vec<u8> {
    let mut r = Vec::with_capacity(160 + t.path.len());
    r.extend_from_slice(method.as_bytes());
    r.push(b' ');
    r.extend_from_slice(t.path.as_bytes());
    r.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    r.extend_from_slice(t.fqdn.as_bytes());
    if t.addr.port() != 80 {
        r.extend_from_slice(format!(":{}", t.addr.port()).as_bytes());
    }
    r.extend_from_slice(b"\r\nVia: 1.1 ");
    r.extend_from_slice(t.via.as_bytes());
    r.extend_from_slice(b"\r\n");
    if let Some(o) = validators {
        if let Some(e) = &o.etag {
            r.extend_from_slice(b"If-None-Match: ");
            r.extend_from_slice(e.as_bytes());
            r.extend_from_slice(b"\r\n");
        }
        if let Some(lm) = &o.last_modified {
            r.extend_from_slice(b"If-Modified-Since: ");
            r.extend_from_slice(lm.as_bytes());
            r.extend_from_slice(b"\r\n");
        }
    }
    r.extend_from_slice(b"\r\n");
    r
}

/// The status clients get for a failed fetch: 504 when the origin did not answer in time,
/// 502 for everything else.
pub(crate) fn failure_status(e: &upstream::Error) -> u16 {
    let timed_out = match e {
        upstream::Error::TimedOut => true,
        upstream::Error::Connect { source, .. } | upstream::Error::Send(source) => {
            source.kind() == std::io::ErrorKind::TimedOut
        }
        _ => false,
    };
    if timed_out {
        504
    } else {
        502
    }
}

/// Send `req` to `addr` and read the final response head, all by `until`; a pooled
/// connection the origin closed meanwhile is replaced by a new one once.
pub(crate) async fn exchange(
    pool: &Pool,
    addr: SocketAddr,
    req: &[u8],
    head_request: bool,
    until: Instant,
) -> Result<(Connection, Response), upstream::Error> {
    let req = upstream::Request {
        bytes: req,
        head_request,
        max_head: MAX_RESPONSE_HEAD,
    };
    let connect = until.saturating_duration_since(Instant::now());
    upstream::exchange_pooled(pool, addr, req, connect, until).await
}

/// Fetch `t` with `GET` (conditionally when `stored` is given), reading at most `max` body
/// bytes, within `limit`.
pub(crate) async fn fetch(
    pool: &Pool,
    t: Target<'_>,
    stored: Option<&Object>,
    max: u64,
    limit: Duration,
) -> Fetched {
    let until = Instant::now() + limit;
    let req = request(t, "GET", stored);
    let (mut conn, r) = match exchange(pool, t.addr, &req, false, until).await {
        Ok(ok) => ok,
        Err(e) => {
            tracing::debug!(origin = %t.addr, error = %e, "rescue fetch failed");
            return Fetched::Failed(failure_status(&e));
        }
    };
    let meta = r.meta;
    if meta.status == 304 {
        if stored.is_none() {
            tracing::debug!(origin = %t.addr, "304 to an unconditional fetch");
            return Fetched::Failed(502);
        }
        if meta.keep_alive && conn.buffered().is_empty() {
            pool.put(conn);
        }
        return Fetched::NotModified;
    }
    let kept = Kept::from_head(&r.head);
    if let switchyard_http::upstream::BodyLength::Length(len) = meta.body {
        if len > max {
            return Fetched::Large {
                conn,
                status: meta.status,
                kept,
                len,
                keep_alive: meta.keep_alive,
                until,
            };
        }
    }
    match upstream::read_body(
        &mut conn,
        meta.body,
        meta.keep_alive,
        max,
        Deadline::At(until),
    )
    .await
    {
        Ok(Collected::Body { body, reusable }) => {
            if reusable {
                pool.put(conn);
            }
            let sharing = kept.sharing();
            Fetched::Complete(kept.into_object(meta.status, body), sharing)
        }
        Ok(Collected::TooLarge) => Fetched::TooLarge,
        Err(e) => {
            tracing::debug!(origin = %t.addr, error = %e, "rescue fetch broke off");
            Fetched::Failed(failure_status(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_entity_headers_and_reads_cache_control() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nSet-Cookie: a=b\r\nETag: \"x\"\r\nLast-Modified: Sun, 06 Nov 1994 08:49:37 GMT\r\nCache-Control: public\r\nCache-Control: max-age=5, Private=\"f\"\r\nContent-Length: 3\r\n\r\n";
        let k = Kept::from_head(head);
        assert_eq!(k.content_type.as_deref(), Some("text/html"));
        assert_eq!(k.etag.as_deref(), Some("\"x\""));
        assert_eq!(
            k.last_modified.as_deref(),
            Some("Sun, 06 Nov 1994 08:49:37 GMT")
        );
        assert_eq!(
            k.cache_control.as_deref(),
            Some("public, max-age=5, Private=\"f\"")
        );
        assert_eq!(k.content_length, Some(3));
        assert_eq!(k.sharing(), Sharing::Private);
        let sharing = |cc: &str| {
            Kept {
                cache_control: Some(cc.into()),
                ..Kept::default()
            }
            .sharing()
        };
        assert_eq!(sharing("max-age=60"), Sharing::Store);
        assert_eq!(sharing("no-cache"), Sharing::Waiters);
        assert_eq!(sharing("NO-STORE"), Sharing::Private);
        assert_eq!(Kept::default().sharing(), Sharing::Store);
    }

    #[test]
    fn the_fetch_names_the_origin_and_its_validators() {
        let t = Target {
            addr: "1.2.3.4:8080".parse().unwrap(),
            fqdn: "www.origin.com",
            path: "/a?b=c",
            via: "www.rescue.com",
        };
        let plain = request(t, "GET", None);
        assert_eq!(
            plain,
            b"GET /a?b=c HTTP/1.1\r\nHost: www.origin.com:8080\r\nVia: 1.1 www.rescue.com\r\n\r\n"
        );
        let o = Object {
            status: 200,
            content_type: None,
            etag: Some("\"v1\"".into()),
            last_modified: Some("Sun, 06 Nov 1994 08:49:37 GMT".into()),
            cache_control: None,
            location: None,
            body: Bytes::new(),
        };
        let cond = String::from_utf8(request(
            Target {
                addr: "1.2.3.4:80".parse().unwrap(),
                ..t
            },
            "GET",
            Some(&o),
        ))
        .unwrap();
        assert!(cond.contains("Host: www.origin.com\r\n"), "{cond}");
        assert!(cond.contains("If-None-Match: \"v1\"\r\n"), "{cond}");
        assert!(
            cond.contains("If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n"),
            "{cond}"
        );
    }
}
