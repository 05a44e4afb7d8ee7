//! Reading into a connection's buffer with a deadline, and the lingering
//! close: shut down the sending side, then read and drop what the client
//! still sends for a bounded time, so that the last response is not
//! destroyed by a reset caused by unread data.

use std::io;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

/// How long a lingering close reads from the client at most.
pub const LINGER_TIME: Duration = Duration::from_secs(2);
/// How many bytes a lingering close reads and drops at most.
pub const LINGER_BYTES: usize = 256 * 1024;

/// Read whatever is available into `buf`, waiting until `until`; a timeout is
/// `ErrorKind::TimedOut`. Makes room for at least 1 KiB first.
pub async fn fill<S>(stream: &mut S, buf: &mut BytesMut, until: Instant) -> io::Result<usize>
where
    S: AsyncRead + Unpin,
{
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(4096);
    }
    match timeout_at(until, stream.read_buf(buf)).await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// Lingering close for up to [`LINGER_TIME`] and [`LINGER_BYTES`].
pub async fn linger(stream: &mut TcpStream) {
    linger_until(stream, Instant::now() + LINGER_TIME).await;
}

/// Shut down the sending side of `stream`, then read and drop what the client
/// sends until it closes, `until` passes or [`LINGER_BYTES`] were dropped.
pub async fn linger_until(stream: &mut TcpStream, until: Instant) {
    let _ = stream.shutdown().await;
    // On the heap, and only while lingering: in the future itself, 4 KiB would be held by
    // every connection's task that may linger, whether it ever does or not.
    let mut scratch = vec![0u8; 4096];
    let mut budget = LINGER_BYTES;
    while budget > 0 {
        match timeout_at(until, stream.read(&mut scratch)).await {
            Ok(Ok(n)) if n > 0 => budget = budget.saturating_sub(n),
            _ => break,
        }
    }
}
