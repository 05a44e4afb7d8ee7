//! Reading a whole response body into memory, bounded: what a caching proxy does with the
//! responses it keeps. The body is delimited as its head said ([`BodyLength`]); a chunked body
//! is decoded (checked with the strict decoder of [`switchyard_http::chunked`]), so what is
//! collected is the entity itself.
//!
//! A body that is larger than the limit is not read: a `Content-Length` above it is refused at
//! once, a chunked or close-delimited one as soon as it passes it. The connection is then in
//! the middle of a response and must be dropped.

use bytes::{Buf, Bytes, BytesMut};

use switchyard_http::chunked::{ChunkedDecoder, ChunkedError};
use switchyard_http::upstream::BodyLength;

use crate::{Connection, Deadline, Error};

/// A collected body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Collected {
    /// The whole body.
    Body {
        /// The entity (chunked coding removed).
        body: Bytes,
        /// The connection can go back to the pool.
        reusable: bool,
    },
    /// The body is larger than the limit; the connection must be dropped.
    TooLarge,
}

async fn read_more(conn: &mut Connection, deadline: Deadline) -> Result<usize, Error> {
    match conn.read_more(deadline.next()).await {
        Ok(n) => Ok(n),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(Error::TimedOut),
        Err(e) => Err(Error::Read(e)),
    }
}

/// Read the body of a response whose head was read by [`crate::exchange()`] (its framing
/// `body`, and `keep_alive` as the peer said) from `conn`, if it has at most `max` bytes.
pub async fn read_body(
    conn: &mut Connection,
    body: BodyLength,
    keep_alive: bool,
    max: u64,
    deadline: Deadline,
) -> Result<Collected, Error> {
    let mut out = BytesMut::new();
    match body {
        BodyLength::None => {}
        BodyLength::Length(n) => {
            if n > max {
                return Ok(Collected::TooLarge);
            }
            out.reserve(n as usize);
            loop {
                let take = (conn.buf.len() as u64).min(n - out.len() as u64) as usize;
                out.extend_from_slice(&conn.buf[..take]);
                conn.buf.advance(take);
                if out.len() as u64 == n {
                    break;
                }
                if read_more(conn, deadline).await? == 0 {
                    return Err(Error::Truncated);
                }
            }
        }
        BodyLength::Chunked => {
            let mut dec = ChunkedDecoder::with_limit(max);
            loop {
                match dec.decode(&conn.buf, |d| out.extend_from_slice(d)) {
                    Ok(used) => conn.buf.advance(used),
                    Err(ChunkedError::TooLarge) => return Ok(Collected::TooLarge),
                    Err(e) => return Err(e.into()),
                }
                if dec.is_done() {
                    break;
                }
                if read_more(conn, deadline).await? == 0 {
                    return Err(Error::Truncated);
                }
            }
        }
        BodyLength::UntilClose => loop {
            if (out.len() + conn.buf.len()) as u64 > max {
                return Ok(Collected::TooLarge);
            }
            out.extend_from_slice(&conn.buf);
            conn.buf.clear();
            if read_more(conn, deadline).await? == 0 {
                break;
            }
        },
    }
    let reusable = keep_alive && body != BodyLength::UntilClose && conn.buf.is_empty();
    Ok(Collected::Body {
        body: out.freeze(),
        reusable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    const WAIT: Deadline = Deadline::Each(Duration::from_secs(5));

    /// A connection whose peer sends `bytes` (then closes if `close`).
    async fn conn_with(
        bytes: &'static [u8],
        close: bool,
    ) -> (Connection, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let peer = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.write_all(bytes).await.unwrap();
            if !close {
                // Hold the connection open until the reader is done.
                let mut b = [0u8; 1];
                let _ = tokio::io::AsyncReadExt::read(&mut s, &mut b).await;
            }
        });
        (
            crate::connect(addr, Duration::from_secs(5)).await.unwrap(),
            peer,
        )
    }

    #[tokio::test]
    async fn collects_each_framing_within_the_limit() {
        let (mut c, _p) = conn_with(b"hello", false).await;
        let got = read_body(&mut c, BodyLength::Length(5), true, 5, WAIT)
            .await
            .unwrap();
        assert_eq!(
            got,
            Collected::Body {
                body: Bytes::from_static(b"hello"),
                reusable: true
            }
        );

        let (mut c, _p) = conn_with(b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n", false).await;
        let got = read_body(&mut c, BodyLength::Chunked, true, 5, WAIT)
            .await
            .unwrap();
        assert_eq!(
            got,
            Collected::Body {
                body: Bytes::from_static(b"abcde"),
                reusable: true
            }
        );

        let (mut c, p) = conn_with(b"until close", true).await;
        let got = read_body(&mut c, BodyLength::UntilClose, true, 100, WAIT)
            .await
            .unwrap();
        assert_eq!(
            got,
            Collected::Body {
                body: Bytes::from_static(b"until close"),
                reusable: false
            }
        );
        p.await.unwrap();
    }

    #[tokio::test]
    async fn refuses_bodies_over_the_limit() {
        let (mut c, _p) = conn_with(b"", false).await;
        assert_eq!(
            read_body(&mut c, BodyLength::Length(6), true, 5, WAIT)
                .await
                .unwrap(),
            Collected::TooLarge
        );
        let (mut c, _p) = conn_with(b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n", false).await;
        assert_eq!(
            read_body(&mut c, BodyLength::Chunked, true, 5, WAIT)
                .await
                .unwrap(),
            Collected::TooLarge
        );
        let (mut c, _p) = conn_with(b"123456", true).await;
        assert_eq!(
            read_body(&mut c, BodyLength::UntilClose, true, 5, WAIT)
                .await
                .unwrap(),
            Collected::TooLarge
        );
    }

    #[tokio::test]
    async fn a_short_body_is_truncated() {
        let (mut c, p) = conn_with(b"abc", true).await;
        let e = read_body(&mut c, BodyLength::Length(5), true, 5, WAIT)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Truncated), "{e:?}");
        p.await.unwrap();
        let (mut c, _p) = conn_with(b"", false).await;
        let e = read_body(
            &mut c,
            BodyLength::Length(5),
            true,
            5,
            Deadline::Each(Duration::from_millis(1)),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, Error::TimedOut), "{e:?}");
    }
}
