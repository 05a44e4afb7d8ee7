//! Waiting, cheaply, for an idle connection's next request.
//!
//! Shared by the node and the switch: both keep idle keep-alive
//! connections without buffers and must notice a shutdown while they wait.

use bytes::BytesMut;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{timeout_at, Instant};

/// How waiting for a client's next bytes ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Bytes arrived and are in the buffer.
    Data,
    /// The client closed the connection.
    Closed,
    /// Nothing arrived before the deadline.
    TimedOut,
    /// The process is shutting down.
    Shutdown,
    /// The socket failed.
    Failed,
}

/// Wait until `stream` has bytes and read them into `buf`, which is
/// allocated only when they arrive (an idle connection holds no buffer).
///
/// Readiness can be stale (the last read did not drain the socket to
/// EAGAIN), so only real bytes or EOF end the wait; a spurious wakeup goes
/// back to watching both the socket and `shutdown`, never into a read
/// that no longer watches for shutdown.
pub async fn wait_for_bytes(
    stream: &TcpStream,
    buf: &mut BytesMut,
    until: Instant,
    shutdown: &mut watch::Receiver<bool>,
) -> Wait {
    loop {
        tokio::select! {
            r = timeout_at(until, stream.readable()) => match r {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Wait::Failed,
                Err(_) => return Wait::TimedOut,
            },
            _ = shutdown.changed() => return Wait::Shutdown,
        }
        buf.reserve(4096);
        match stream.try_read_buf(buf) {
            Ok(0) => return Wait::Closed,
            Ok(_) => return Wait::Data,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => *buf = BytesMut::new(),
            Err(_) => return Wait::Failed,
        }
    }
}
