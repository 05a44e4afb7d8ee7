//! The HTTP/1.1 client switchyard processes use to reach each other: the switch relaying a
//! client's request to a node, and a node fetching a response from another node (back-end
//! forwarding).
//!
//! Three parts, used in this order for one request:
//!
//! * [`pool`]: persistent connections to peers, kept idle per worker thread and per peer (a
//!   tokio socket belongs to the runtime that opened it), checked for a close by the peer before
//!   reuse; new ones are opened with a time limit and with `TCP_NODELAY`.
//! * [`exchange()`]: send a request and read the final response head with the strict parser of
//!   [`switchyard_http::upstream`], skipping (or passing on) interim 1xx responses. A failure
//!   says whether the request may be sent again on a new connection: it went out on a reused
//!   connection and not a byte came back. Whether it *should* be is the caller's decision: a
//!   request that is not idempotent is never sent twice. [`read_response()`] reads the head
//!   of a request the caller wrote itself (a body streamed from a client as it arrives).
//! * [`relay`]: move the response body to the client by `Content-Length`, chunked coding
//!   (checked with [`switchyard_http::chunked`]) or until the peer closes, by splice(2) for
//!   large remainders ([`splice`]), and tell whether the connection can go back to the pool.
//!
//! A caching proxy reads the body into memory instead, bounded ([`collect`]).
//!
//! The crate counts nothing itself: it returns the facts (connection reused, bytes relayed,
//! bytes spliced, which side failed) and the caller keeps its own metrics.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::BytesMut;
use thiserror::Error;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{timeout, Instant};

use switchyard_runtime::WaitTimer;

pub mod collect;
pub mod exchange;
pub mod pool;
pub mod relay;
pub mod splice;

pub use collect::{read_body, Collected};
pub use exchange::{exchange, read_response, Failed, Request, Response};
pub use pool::Pool;
pub use relay::{relay_body, Client, Direct, RelayFailed, RelayOptions, Relayed};

/// Bytes asked for per read from a peer.
const READ_SIZE: usize = 16 * 1024;

/// What went wrong talking to a peer or relaying its response.
#[derive(Debug, Error)]
pub enum Error {
    /// The peer could not be reached (a timeout has kind `TimedOut`).
    #[error("connect to {addr}: {source}")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// What failed.
        source: io::Error,
    },
    /// The source address to connect from could not be taken (not an address of this host).
    #[error("connect from {ip}: {source}")]
    Source {
        /// The source address.
        ip: IpAddr,
        /// What failed.
        source: io::Error,
    },
    /// The request could not be written (a timeout has kind `TimedOut`).
    #[error("sending the request: {0}")]
    Send(io::Error),
    /// The peer closed the connection before a complete response head.
    #[error("peer closed the connection before a complete response head")]
    Closed,
    /// Reading from the peer failed.
    #[error("reading from the peer: {0}")]
    Read(io::Error),
    /// The peer did not send in time.
    #[error("peer timed out")]
    TimedOut,
    /// The peer's response head was refused.
    #[error("peer response: {0}")]
    Response(#[from] switchyard_http::upstream::ResponseError),
    /// The peer's chunked body was malformed.
    #[error("peer chunked body: {0}")]
    Chunked(#[from] switchyard_http::chunked::ChunkedError),
    /// The peer closed the connection within the body.
    #[error("peer closed the connection within the body")]
    Truncated,
    /// Writing to the client failed (a timeout has kind `TimedOut`).
    #[error("writing to the client: {0}")]
    Client(io::Error),
}

impl Error {
    /// Whether the client's side failed rather than the peer's.
    pub fn is_client(&self) -> bool {
        matches!(self, Error::Client(_))
    }

    /// Whether talking to the peer failed for lack of a local resource (descriptors, buffers,
    /// memory: `EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`): the peer is not to blame.
    pub fn is_local_resource(&self) -> bool {
        let e = match self {
            Error::Connect { source, .. } => source,
            Error::Send(e) | Error::Read(e) => e,
            _ => return false,
        };
        matches!(
            e.raw_os_error(),
            Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOBUFS | nix::libc::ENOMEM)
        )
    }
}

/// How long waits for a peer may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// Everything is done by this instant.
    At(Instant),
    /// Each step may take this long: sending the request, receiving the whole response head,
    /// each read of the body.
    Each(Duration),
}

impl Deadline {
    /// The deadline of a step starting now.
    pub fn next(&self) -> Instant {
        match *self {
            Deadline::At(t) => t,
            Deadline::Each(d) => Instant::now() + d,
        }
    }
}

/// A connection to a peer, with bytes read from it and not yet used.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    reused: bool,
    buf: BytesMut,
    /// The time limit of a read that waits, set when one has to and kept across waits,
    /// requests and the pool ([`WaitTimer`]).
    timer: WaitTimer,
}

impl Connection {
    fn new(stream: TcpStream, peer: SocketAddr, reused: bool) -> Self {
        Connection {
            stream,
            peer,
            reused,
            buf: BytesMut::new(),
            timer: WaitTimer::new(),
        }
    }

    /// The connection as the pool keeps it: its socket and its timer; its buffer goes to the
    /// thread's spares ([`switchyard_runtime::spare`]).
    fn into_idle(mut self) -> Connection {
        switchyard_runtime::spare::give_bytes(std::mem::take(&mut self.buf));
        self
    }

    /// The connection handed out again by the pool.
    fn reuse(mut self) -> Connection {
        self.reused = true;
        self
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Whether the connection came from the pool (it carried an earlier exchange).
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// The socket.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Bytes read from the peer and not yet used.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Take up to `max` of the bytes read from the peer and not yet used, reading more first
    /// (waiting until `until`) when none are buffered: for a caller that consumes a body
    /// itself, like a `Content-Length` body spooled to a file. Empty at the peer's close.
    pub async fn take_some(&mut self, max: usize, until: Instant) -> io::Result<BytesMut> {
        if self.buf.is_empty() && self.read_more(until).await? == 0 {
            return Ok(BytesMut::new());
        }
        let n = self.buf.len().min(max);
        Ok(self.buf.split_to(n))
    }

    /// Read more into the buffer, waiting until `until`; 0 at the peer's close.
    async fn read_more(&mut self, until: Instant) -> io::Result<usize> {
        if self.buf.capacity() == 0 {
            self.buf = switchyard_runtime::spare::take_bytes();
        }
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(READ_SIZE);
        }
        let Connection {
            stream, buf, timer, ..
        } = self;
        let n = read_waiting(stream, timer, buf.spare_capacity_mut(), until).await?;
        // SAFETY: the read initialised the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }

    /// Read at most `max` more bytes straight onto the end of `dst` (none of them through the
    /// connection's own buffer, which must be empty), waiting until `until`; 0 at the peer's
    /// close. For a relay that knows how many bytes are still to come.
    ///
    /// When `last`, the `max` bytes are the last the peer is to send before it is asked again,
    /// and the read asks for one more: a peer that sent no more then fills less than was asked,
    /// which tells the runtime that the socket is drained. A read that filled exactly what it
    /// asked for left the readiness set, and the pool's check of the connection at its next
    /// checkout paid a system call (an `EAGAIN` peek, one per relayed response of a few KiB or
    /// more) to learn that nothing was there. A byte that does come past `max` is not the
    /// caller's: it stays in the connection's buffer, as bytes read past a body with its head
    /// do, and the connection is not reused.
    pub(crate) async fn read_into(
        &mut self,
        dst: &mut Vec<u8>,
        max: usize,
        last: bool,
        until: Instant,
    ) -> io::Result<usize> {
        debug_assert!(self.buf.is_empty());
        let ask = max + usize::from(last && max > 0);
        dst.reserve(ask);
        let Connection {
            stream, timer, buf, ..
        } = self;
        let n = read_waiting(stream, timer, &mut dst.spare_capacity_mut()[..ask], until).await?;
        // SAFETY: the read initialised the first `n` bytes of the spare capacity.
        unsafe { dst.set_len(dst.len() + n) };
        if n > max {
            buf.extend_from_slice(&dst[dst.len() - 1..]);
            dst.truncate(dst.len() - 1);
            return Ok(max);
        }
        Ok(n)
    }
}

/// One read from `stream` into `space` (not zeroed first), waiting until `until` on `timer`,
/// which is set only when the read has to wait; the bytes read.
async fn read_waiting(
    stream: &mut TcpStream,
    timer: &mut WaitTimer,
    space: &mut [std::mem::MaybeUninit<u8>],
    until: Instant,
) -> io::Result<usize> {
    let mut armed = false;
    std::future::poll_fn(|cx| {
        // Through `AsyncRead`, whose read clears the cached readiness when it comes back
        // short (the socket is drained). `try_read_buf` would leave it set, and the pool's
        // check of this connection at its next checkout would pay a system call to learn
        // that nothing is there.
        let mut space = ReadBuf::uninit(&mut *space);
        match Pin::new(&mut *stream).poll_read(cx, &mut space) {
            Poll::Ready(Ok(())) => return Poll::Ready(Ok(space.filled().len())),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {}
        }
        if !armed {
            timer.set(until);
            armed = true;
        }
        match timer.poll_due(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Open a new connection to `addr`, waiting at most `limit`, with `TCP_NODELAY` set (requests go
/// out in one write; Nagle must not hold the next one back).
pub async fn connect(addr: SocketAddr, limit: Duration) -> Result<Connection, Error> {
    connect_from(addr, None, limit).await
}

/// [`connect`], leaving from `source` (any port) when it is given and of `addr`'s family. An
/// address this host does not have (`EADDRNOTAVAIL`, say a public address in front of a NAT)
/// is an error of its own, [`Error::Source`], so that a caller can fall back.
pub async fn connect_from(
    addr: SocketAddr,
    source: Option<IpAddr>,
    limit: Duration,
) -> Result<Connection, Error> {
    let connecting = async {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .map_err(|source| Error::Connect { addr, source })?;
        if let Some(ip) = source.filter(|ip| ip.is_ipv4() == addr.is_ipv4()) {
            socket
                .bind(SocketAddr::new(ip, 0))
                .map_err(|e| Error::Source { ip, source: e })?;
        }
        socket
            .connect(addr)
            .await
            .map_err(|source| Error::Connect { addr, source })
    };
    let stream = match timeout(limit, connecting).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(Error::Connect {
                addr,
                source: io::ErrorKind::TimedOut.into(),
            })
        }
    };
    let _ = stream.set_nodelay(true);
    Ok(Connection::new(stream, addr, false))
}

/// Send `req` to `addr` over a connection from `pool` and read the final response head, all by
/// `until`, each connect taking at most `connect_limit`. A pooled connection the peer closed
/// meanwhile fails before any byte of response: the request then goes once more, on a new
/// connection (only a reused connection is retryable, so there is no second retry).
pub async fn exchange_pooled(
    pool: &Pool,
    addr: SocketAddr,
    req: Request<'_>,
    connect_limit: Duration,
    until: Instant,
) -> Result<(Connection, Response), Error> {
    let mut fresh = false;
    loop {
        let limit = connect_limit.min(until.saturating_duration_since(Instant::now()));
        let mut conn = if fresh {
            pool.connect(addr, limit).await?
        } else {
            pool.checkout(addr, limit).await?
        };
        match exchange(&mut conn, req, Deadline::At(until), None).await {
            Ok(r) => return Ok((conn, r)),
            Err(f) if f.retryable && !fresh => fresh = true,
            Err(f) => return Err(f.error),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use tokio::net::{TcpListener, TcpStream};

    /// A connected pair over loopback: (connecting side, accepted side).
    pub async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }
}
