//! One request sent to a peer and the final response head read back.

use std::time::Duration;

use bytes::{Buf, BytesMut};

use switchyard_http::upstream::{self, ResponseMeta};
use switchyard_runtime::ClientSocket;

use crate::splice::SendLimit;
use crate::{Connection, Deadline, Error};

/// A request to send.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The request as it goes on the wire: head and body.
    pub bytes: &'a [u8],
    /// The request is `HEAD`: no body follows the response head whatever it says.
    pub head_request: bool,
    /// Largest response head accepted.
    pub max_head: usize,
}

/// The final response head; the body bytes read with it stay in the connection.
#[derive(Debug)]
pub struct Response {
    /// The parsed head.
    pub meta: ResponseMeta,
    /// The head as received (`meta.head_len` bytes).
    pub head: BytesMut,
}

/// A failed exchange.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Failed {
    /// What failed.
    #[source]
    pub error: Error,
    /// The request went out on a reused connection and not a byte came back (the peer closed
    /// the idle connection just as it was taken): it may be sent again on a new connection.
    pub retryable: bool,
}

/// Send `req` on `conn` and read the final response head.
///
/// Interim (1xx) responses are skipped; with `interim` set to a client's socket and a time
/// limit, each is also passed on to it, rewritten for the client (a failed write ends the
/// exchange with [`Error::Client`]).
pub async fn exchange(
    conn: &mut Connection,
    req: Request<'_>,
    deadline: Deadline,
    interim: Option<(&mut ClientSocket, Duration)>,
) -> Result<Response, Failed> {
    let reused = conn.reused;
    // Tried at once; the clock is read only if the send must wait for room.
    let limit = match deadline {
        Deadline::At(t) => SendLimit::By(t),
        Deadline::Each(d) => SendLimit::Within(d),
    };
    let (_, sent) = crate::splice::send_all(&conn.stream, req.bytes, false, limit).await;
    if let Err(e) = sent {
        return Err(failed(Error::Send(e), reused, false));
    }
    final_head(
        conn,
        req.head_request,
        req.max_head,
        deadline,
        interim,
        reused,
    )
    .await
}

/// Read the final response head to a request the caller has sent on `conn` itself (a head and
/// a body streamed from the client as it arrived, say). Like [`exchange()`], without the
/// sending; a failure is never retryable, since the request cannot be produced again.
pub async fn read_response(
    conn: &mut Connection,
    head_request: bool,
    max_head: usize,
    deadline: Deadline,
    interim: Option<(&mut ClientSocket, Duration)>,
) -> Result<Response, Failed> {
    final_head(conn, head_request, max_head, deadline, interim, false).await
}

/// A failure; retryable when the request went out on a reused connection (`may_retry`) and
/// nothing came back.
fn failed(error: Error, may_retry: bool, received: bool) -> Failed {
    Failed {
        retryable: may_retry
            && !received
            && matches!(error, Error::Send(_) | Error::Read(_) | Error::Closed),
        error,
    }
}

/// Read the final response head, passing interim ones on as [`exchange()`] says.
async fn final_head(
    conn: &mut Connection,
    head_request: bool,
    max_head: usize,
    deadline: Deadline,
    mut interim: Option<(&mut ClientSocket, Duration)>,
    may_retry: bool,
) -> Result<Response, Failed> {
    let fail = |error: Error, received: bool| failed(error, may_retry, received);
    let mut received = false;
    let until = deadline.next();
    let mut out = Vec::new();
    loop {
        if !conn.buf.is_empty() {
            match upstream::parse(&conn.buf, head_request, max_head) {
                Ok(Some(meta)) if meta.is_interim() => {
                    if let Some((client, wait)) = interim.as_mut() {
                        out.clear();
                        upstream::client_response_head(
                            &conn.buf[..meta.head_len],
                            &meta,
                            true,
                            false,
                            &mut out,
                        );
                        let (_, sent) =
                            crate::splice::send_to_client(client, &out, false, *wait).await;
                        if let Err(e) = sent {
                            return Err(fail(Error::Client(e), true));
                        }
                    }
                    conn.buf.advance(meta.head_len);
                    continue;
                }
                Ok(Some(meta)) => {
                    let head = conn.buf.split_to(meta.head_len);
                    return Ok(Response { meta, head });
                }
                Ok(None) => {}
                Err(e) => return Err(fail(e.into(), true)),
            }
        }
        match conn.read_more(until).await {
            Ok(0) => return Err(fail(Error::Closed, received)),
            Ok(_) => received = true,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                return Err(fail(Error::TimedOut, received))
            }
            Err(e) => return Err(fail(Error::Read(e), received)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pair;
    use crate::Pool;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    const REQ: Request<'static> = Request {
        bytes: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        head_request: false,
        max_head: 32 * 1024,
    };
    const WAIT: Deadline = Deadline::Each(Duration::from_secs(5));

    /// Read a request head (up to its blank line) from `s`.
    async fn read_request(s: &mut TcpStream) {
        let mut got = Vec::new();
        while !got.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 256];
            let n = s.read(&mut b).await.unwrap();
            assert!(n > 0, "request cut short");
            got.extend_from_slice(&b[..n]);
        }
    }

    /// Interim responses are skipped, or passed on to the client when asked; the body read
    /// with the head stays in the connection.
    #[tokio::test]
    async fn interim_responses_are_skipped() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            for _ in 0..2 {
                read_request(&mut s).await;
                s.write_all(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await
                    .unwrap();
            }
        });
        let mut c = crate::connect(addr, Duration::from_secs(5)).await.unwrap();
        let r = exchange(&mut c, REQ, WAIT, None).await.unwrap();
        assert_eq!(r.meta.status, 200);
        assert!(r.head.starts_with(b"HTTP/1.1 200 OK\r\n"));
        assert_eq!(r.head.len(), r.meta.head_len);
        assert_eq!(c.buffered(), b"ok");
        c.buf.clear();
        let (client_w, mut client_r) = pair().await;
        let mut client_w = ClientSocket::from(client_w);
        let interim = Some((&mut client_w, Duration::from_secs(5)));
        let r = exchange(&mut c, REQ, WAIT, interim).await.unwrap();
        assert_eq!(r.meta.status, 200);
        drop(client_w);
        let mut relayed = String::new();
        client_r.read_to_string(&mut relayed).await.unwrap();
        assert!(
            relayed.starts_with("HTTP/1.1 100 Continue\r\n"),
            "{relayed}"
        );
        assert!(
            relayed.contains("HTTP/1.1 103 Early Hints\r\n"),
            "{relayed}"
        );
        assert!(relayed.contains("Link: </a>\r\n"), "{relayed}");
        assert!(!relayed.contains("200"), "{relayed}");
        server.await.unwrap();
    }

    /// A reused connection that closes before any response byte may be retried; a new one, or
    /// one that sent part of a head, may not.
    #[tokio::test]
    async fn retry_is_marked_only_for_reused_silent_connections() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let pool = Pool::new(8, 8);
        // The peer answers nothing: it closes once the request arrived (so the pool's check
        // of the idle connection passes).
        for (reuse, partial) in [(true, false), (false, false), (true, true)] {
            let mut c = crate::connect(addr, Duration::from_secs(5)).await.unwrap();
            let (mut peer, _) = l.accept().await.unwrap();
            if reuse {
                assert!(pool.put(c));
                c = pool.take(addr).unwrap();
            }
            let closer = tokio::spawn(async move {
                read_request(&mut peer).await;
                if partial {
                    peer.write_all(b"HTTP/1.1 200").await.unwrap();
                }
            });
            let f = exchange(&mut c, REQ, WAIT, None).await.unwrap_err();
            assert!(matches!(f.error, Error::Closed), "{f:?}");
            assert_eq!(
                f.retryable,
                reuse && !partial,
                "reuse {reuse} partial {partial}"
            );
            closer.await.unwrap();
        }
    }

    /// The time limit of a pooled connection's reads follows each exchange's own deadline,
    /// on a virtual clock: an answer that comes after the previous exchange's deadline but
    /// within its own is read, and a shorter deadline than the last one still ends the wait.
    #[tokio::test(start_paused = true)]
    async fn each_exchange_on_a_pooled_connection_waits_by_its_own_deadline() {
        use tokio::time::{sleep, Instant};
        const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let pool = Pool::new(8, 8);
        let c = crate::connect(addr, Duration::from_secs(5)).await.unwrap();
        let (mut peer, _) = l.accept().await.unwrap();
        // The peer answers the first request after 4 s, the second after 3 s, the third never.
        let server = tokio::spawn(async move {
            for wait in [4, 3] {
                read_request(&mut peer).await;
                sleep(Duration::from_secs(wait)).await;
                peer.write_all(OK).await.unwrap();
            }
            read_request(&mut peer).await;
            peer
        });
        let start = Instant::now();
        assert!(pool.put(c));
        let mut c = pool.take(addr).unwrap();
        let each5 = Deadline::Each(Duration::from_secs(5));
        exchange(&mut c, REQ, each5, None).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        assert!(pool.put(c));
        let mut c = pool.take(addr).unwrap();
        // Due at 9 s; the first exchange's timer was due at 5 s.
        exchange(&mut c, REQ, each5, None).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(7));
        assert!(pool.put(c));
        let mut c = pool.take(addr).unwrap();
        // Due at 8 s, before the 9 s the timer was last set to.
        let f = exchange(&mut c, REQ, Deadline::Each(Duration::from_secs(1)), None)
            .await
            .unwrap_err();
        assert!(matches!(f.error, Error::TimedOut), "{f:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(8));
        drop(server.await.unwrap());
    }

    /// A refused head and a timeout are never retryable.
    #[tokio::test]
    async fn bad_heads_and_timeouts_are_not_retryable() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let pool = Pool::new(8, 8);
        let c = crate::connect(addr, Duration::from_secs(5)).await.unwrap();
        let (_silent, _) = l.accept().await.unwrap();
        assert!(pool.put(c));
        let mut c = pool.take(addr).unwrap();
        // A deadline that has passed: the request still goes out (the write completes at
        // once), the silent peer's head cannot come.
        let f = exchange(&mut c, REQ, Deadline::At(tokio::time::Instant::now()), None)
            .await
            .unwrap_err();
        assert!(matches!(f.error, Error::TimedOut), "{f:?}");
        assert!(!f.retryable);
        let c = crate::connect(addr, Duration::from_secs(5)).await.unwrap();
        let (mut peer, _) = l.accept().await.unwrap();
        assert!(pool.put(c));
        let mut c = pool.take(addr).unwrap();
        let t = tokio::spawn(async move {
            read_request(&mut peer).await;
            peer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
                .await
                .unwrap();
            peer
        });
        let f = exchange(&mut c, REQ, WAIT, None).await.unwrap_err();
        assert!(matches!(f.error, Error::Response(_)), "{f:?}");
        assert!(!f.retryable);
        drop(t.await.unwrap());
    }

    /// A response to a request the caller sent itself is read like any other, and a silent
    /// close is never retryable, even on a reused connection.
    #[tokio::test]
    async fn responses_to_requests_sent_in_parts_are_read_and_never_retried() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let pool = Pool::new(8, 8);
        let c = crate::connect(addr, Duration::from_secs(5)).await.unwrap();
        let (mut peer, _) = l.accept().await.unwrap();
        assert!(pool.put(c));
        let mut c = pool.take(addr).unwrap();
        let server = tokio::spawn(async move {
            let mut got = Vec::new();
            while !got.ends_with(b"hello") {
                let mut b = [0u8; 256];
                let n = peer.read(&mut b).await.unwrap();
                assert!(n > 0, "request cut short");
                got.extend_from_slice(&b[..n]);
            }
            peer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await
                .unwrap();
            // The second request is met with a close.
            read_request(&mut peer).await;
        });
        crate::splice::write_all(
            c.stream(),
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        crate::splice::write_all(c.stream(), b"hello", Duration::from_secs(5))
            .await
            .unwrap();
        let r = read_response(&mut c, false, 1024, WAIT, None)
            .await
            .unwrap();
        assert_eq!(r.meta.status, 200);
        assert_eq!(c.buffered(), b"ok");
        c.buf.clear();
        assert!(c.reused());
        crate::splice::write_all(c.stream(), REQ.bytes, Duration::from_secs(5))
            .await
            .unwrap();
        let f = read_response(&mut c, false, 1024, WAIT, None)
            .await
            .unwrap_err();
        assert!(matches!(f.error, Error::Closed), "{f:?}");
        assert!(!f.retryable);
        server.await.unwrap();
    }
}
