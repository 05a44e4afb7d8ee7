//! Back-end forwarding (seed 003 §3.3): a node fetches a response from
//! another node's HTTP listener and sends it on its own client connection.
//!
//! The switch chooses it for a later request on a handed-in connection
//! (`RouteAction::Forward`) when another node has the object cached and
//! moving the connection would cost more than fetching. Node-to-node
//! connections are persistent HTTP/1.1; idle ones wait in a small pool per
//! peer on each worker thread (a socket stays on the runtime that opened
//! it), and are checked for a close by the peer before reuse. Response heads
//! are parsed strictly (`switchyard_http::upstream::parse`); bodies are
//! delimited by `Content-Length`, chunked coding or the peer's close.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use nix::sys::socket::{recv, MsgFlags};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, timeout_at, Instant};

use switchyard_http::upstream::{self, ResponseError, ResponseMeta};

/// Idle connections kept per peer on each worker thread.
pub const MAX_IDLE_PER_PEER: usize = 8;
/// Time allowed to connect to a peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest response head accepted from a peer.
pub const MAX_RESPONSE_HEAD: usize = 32 * 1024;

thread_local! {
    /// Idle peer connections of this worker thread.
    static POOL: RefCell<HashMap<SocketAddr, Vec<TcpStream>>> = RefCell::new(HashMap::new());
}

/// Why a fetch from a peer failed.
#[derive(Debug, Error)]
pub enum ForwardError {
    /// The peer could not be reached.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// What failed.
        source: io::Error,
    },
    /// Reading from or writing to the peer failed.
    #[error("peer connection: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection before a complete response head.
    #[error("peer closed the connection before responding")]
    Closed,
    /// The peer's response head was refused.
    #[error("peer response: {0}")]
    Response(#[from] ResponseError),
    /// The peer took too long.
    #[error("peer timed out")]
    TimedOut,
}

/// A failed exchange; `retry` is set when the request went out on a pooled
/// connection and no byte of response came back, so a fresh connection may
/// still succeed.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) retry: bool,
    pub(crate) source: ForwardError,
}

/// A connection to a peer node, with bytes read and not yet used.
pub(crate) struct PeerConn {
    addr: SocketAddr,
    stream: TcpStream,
    pub(crate) buf: BytesMut,
}

impl PeerConn {
    /// Read more of the response into `buf`; 0 at the peer's close.
    pub(crate) async fn read_more(&mut self, until: Instant) -> io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        match timeout_at(until, self.stream.read_buf(&mut self.buf)).await {
            Ok(r) => r,
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    }
}

/// An idle pooled connection to `addr` that the peer has not closed.
fn check_out(addr: SocketAddr) -> Option<TcpStream> {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.get_mut(&addr)?;
        while let Some(s) = idle.pop() {
            if still_open(&s) {
                return Some(s);
            }
        }
        None
    })
}

/// Whether an idle connection is still usable: nothing to read (a close or
/// stray bytes both disqualify it).
fn still_open(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        recv(
            s.as_raw_fd(),
            &mut b,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
        ),
        Err(nix::errno::Errno::EAGAIN)
    )
}

/// Return a connection whose last response was read completely.
pub(crate) fn check_in(pc: PeerConn) {
    if !pc.buf.is_empty() {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.entry(pc.addr).or_default();
        if idle.len() < MAX_IDLE_PER_PEER {
            idle.push(pc.stream);
        }
    });
}

/// Idle connections to `addr` pooled on this thread.
#[cfg(test)]
fn idle_connections(addr: SocketAddr) -> usize {
    POOL.with(|p| p.borrow().get(&addr).map_or(0, Vec::len))
}

/// Send `req` to the peer at `addr` (on a pooled connection unless `fresh`)
/// and read the final response head. On success the connection's `buf`
/// starts with the head (`meta.head_len` bytes), followed by whatever of
/// the body has arrived.
pub(crate) async fn exchange(
    addr: SocketAddr,
    fresh: bool,
    req: &[u8],
    head_request: bool,
    until: Instant,
) -> Result<(PeerConn, ResponseMeta), Failure> {
    let pooled = if fresh { None } else { check_out(addr) };
    let reused = pooled.is_some();
    let stream = match pooled {
        Some(s) => s,
        None => connect(addr).await.map_err(|source| Failure {
            retry: false,
            source,
        })?,
    };
    let mut pc = PeerConn {
        addr,
        stream,
        buf: BytesMut::new(),
    };
    let fail = |source: ForwardError, got_bytes: bool| Failure {
        retry: reused && !got_bytes,
        source,
    };
    match timeout_at(until, pc.stream.write_all(req)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(fail(e.into(), false)),
        Err(_) => return Err(fail(ForwardError::TimedOut, false)),
    }
    let mut got_bytes = false;
    loop {
        if !pc.buf.is_empty() {
            match upstream::parse(&pc.buf, head_request, MAX_RESPONSE_HEAD) {
                Ok(Some(meta)) if meta.is_interim() => {
                    pc.buf.advance(meta.head_len);
                    continue;
                }
                Ok(Some(meta)) => return Ok((pc, meta)),
                Ok(None) => {}
                Err(e) => {
                    return Err(Failure {
                        retry: false,
                        source: e.into(),
                    })
                }
            }
        }
        match pc.read_more(until).await {
            Ok(0) => return Err(fail(ForwardError::Closed, got_bytes)),
            Ok(_) => got_bytes = true,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(Failure {
                    retry: false,
                    source: ForwardError::TimedOut,
                })
            }
            Err(e) => return Err(fail(e.into(), got_bytes)),
        }
    }
}

async fn connect(addr: SocketAddr) -> Result<TcpStream, ForwardError> {
    let s = match timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(source)) => return Err(ForwardError::Connect { addr, source }),
        Err(_) => {
            return Err(ForwardError::Connect {
                addr,
                source: io::ErrorKind::TimedOut.into(),
            })
        }
    };
    // Requests go out in one write; do not let Nagle hold the next one.
    let _ = s.set_nodelay(true);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A pooled connection the peer closed is not handed out again.
    #[test]
    fn closed_idle_connections_are_skipped() {
        rt().block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let s = TcpStream::connect(addr).await.unwrap();
            let (peer_side, _) = l.accept().await.unwrap();
            check_in(PeerConn {
                addr,
                stream: s,
                buf: BytesMut::new(),
            });
            assert_eq!(idle_connections(addr), 1);
            drop(peer_side);
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(check_out(addr).is_none());
            assert_eq!(idle_connections(addr), 0);
        });
    }

    /// Interim responses are skipped, and a pooled connection that fails
    /// before any response byte may be retried.
    #[test]
    fn exchange_skips_interim_and_marks_retry() {
        rt().block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let server = tokio::spawn(async move {
                let (mut s, _) = l.accept().await.unwrap();
                let mut b = [0u8; 1024];
                let _ = s.read(&mut b).await.unwrap();
                s.write_all(
                    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                )
                .await
                .unwrap();
                s
            });
            let until = Instant::now() + Duration::from_secs(5);
            let (pc, meta) = exchange(
                addr,
                true,
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                false,
                until,
            )
            .await
            .map_err(|f| f.source)
            .unwrap();
            assert_eq!(meta.status, 200);
            assert_eq!(&pc.buf[meta.head_len..], b"ok");
            drop(server.await.unwrap());
            // A closed pooled connection: retry allowed.
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let s = TcpStream::connect(addr).await.unwrap();
            let (peer, _) = l.accept().await.unwrap();
            POOL.with(|p| p.borrow_mut().entry(addr).or_default().push(s));
            // Closes after the request arrives: the pool check passes.
            let closer = tokio::spawn(async move {
                let mut peer = peer;
                let mut b = [0u8; 64];
                let _ = peer.read(&mut b).await;
            });
            let f = match exchange(addr, false, b"GET / HTTP/1.1\r\n\r\n", false, until).await {
                Err(f) => f,
                Ok(_) => panic!("a closed connection cannot answer"),
            };
            assert!(f.retry, "{:?}", f.source);
            closer.await.unwrap();
        });
    }
}
