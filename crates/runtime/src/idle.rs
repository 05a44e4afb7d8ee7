//! Waiting, cheaply, for an idle connection's next request.
//!
//! Shared by the node and the switch: both keep idle keep-alive
//! connections without buffers and must notice a shutdown while they wait.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use bytes::BytesMut;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::timer::WaitTimer;

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
/// Readiness can be stale (bytes that were read before the wait without
/// draining the socket to EAGAIN), so only real bytes or EOF end the wait; a
/// spurious wakeup goes back to watching both the socket and `shutdown`,
/// never into a read that no longer watches for shutdown. The read that ends
/// the wait clears the readiness when it drained the socket
/// ([`read_draining`]), so the next wait of a keep-alive connection sleeps
/// until its client sends again rather than waking at once to a read that
/// finds nothing.
///
/// The deadline is kept in the connection's own `timer` ([`WaitTimer`]), set for this wait.
/// `shutdown` is watched when given; a connection listed in a
/// [`WaitingClients`](crate::shed::WaitingClients) passes none, since shutting down closes the
/// list's waits ([`close_all`](crate::shed::WaitingClients::close_all)), which spares each wait
/// registering with the process-wide signal and leaving it again.
pub async fn wait_for_bytes(
    stream: &TcpStream,
    buf: &mut BytesMut,
    until: Instant,
    mut shutdown: Option<&mut watch::Receiver<bool>>,
    timer: &mut WaitTimer,
) -> Wait {
    timer.set(until);
    loop {
        tokio::select! {
            // Bytes that are there end the wait even at its deadline.
            biased;
            r = stream.readable() => if r.is_err() {
                return Wait::Failed;
            },
            Some(_) = async {
                match shutdown.as_deref_mut() {
                    Some(s) => Some(s.changed().await),
                    None => std::future::pending().await,
                }
            } => return Wait::Shutdown,
            () = timer.due() => return Wait::TimedOut,
        }
        match read_draining(stream, buf, READ_ROOM) {
            Ok(0) => return Wait::Closed,
            Ok(_) => return Wait::Data,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                crate::spare::give_bytes(std::mem::take(buf))
            }
            Err(_) => return Wait::Failed,
        }
    }
}

/// Room given to the read that ends an idle wait: a request head usually fits.
pub const READ_ROOM: usize = 4096;

/// Read what `stream` holds, up to `room` bytes, onto the end of `buf`
/// without waiting (`WouldBlock` if the runtime saw no readiness or the
/// socket has nothing).
///
/// A read that leaves part of its room unused has drained the socket (a TCP
/// read returns less only when the receive queue is empty), so the runtime's
/// readiness is cleared with it: tokio clears it by itself only when a read
/// fails with `WouldBlock` (or on its `AsyncRead` path), and without this the
/// next wait would wake at once to a read that finds nothing, one system
/// call and one pass through the scheduler per request. Bytes that arrive
/// after the read raise a new readiness event, which the clearing leaves
/// alone (tokio compares the event's tick).
pub fn read_draining(stream: &TcpStream, buf: &mut BytesMut, room: usize) -> io::Result<usize> {
    let mut got = 0;
    let r = stream.try_io(Interest::READABLE, || {
        let n = recv_into(stream.as_fd(), buf, room)?;
        got = n;
        if 0 < n && n < room {
            // Drained: report it as `WouldBlock` so that the readiness is cleared.
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
        r => r,
    }
}

/// One `recv(2)` of up to `room` bytes from `fd` onto the end of `buf`, into its spare
/// capacity: the room is not zeroed first (4 KiB of `memset` per request otherwise).
pub(crate) fn recv_into(fd: BorrowedFd<'_>, buf: &mut BytesMut, room: usize) -> io::Result<usize> {
    if buf.capacity() == 0 {
        *buf = crate::spare::take_bytes();
    }
    buf.reserve(room);
    let spare = &mut buf.spare_capacity_mut()[..room];
    let n = socket2::SockRef::from(&fd).recv(spare)?;
    // SAFETY: `recv` initialised the first `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tokio::io::AsyncWriteExt;

    fn ready_now(stream: &TcpStream) -> bool {
        let fut = std::pin::pin!(stream.readable());
        matches!(
            fut.poll(&mut Context::from_waker(Waker::noop())),
            Poll::Ready(Ok(()))
        )
    }

    /// A read that drains the socket leaves the connection not readable, so the next wait
    /// sleeps; the client's next bytes make it readable again and are read whole.
    #[tokio::test]
    async fn a_draining_read_clears_readiness_and_new_bytes_raise_it() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        server.readable().await.unwrap();
        let mut buf = BytesMut::new();
        assert_eq!(read_draining(&server, &mut buf, READ_ROOM).unwrap(), 18);
        assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n\r\n");
        // Drained: the runtime no longer calls the socket readable.
        assert!(!ready_now(&server));
        let e = read_draining(&server, &mut buf, READ_ROOM).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(buf.len(), 18);
        client.write_all(b"next").await.unwrap();
        server.readable().await.unwrap();
        assert_eq!(read_draining(&server, &mut buf, READ_ROOM).unwrap(), 4);
        assert_eq!(&buf[18..], b"next");
    }

    /// A read that fills its room may have left bytes behind: the socket stays readable and
    /// the rest is read next. The end of the stream reads as 0.
    #[tokio::test]
    async fn a_full_read_keeps_readiness_and_eof_reads_zero() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        client.write_all(&[7u8; 100]).await.unwrap();
        client.shutdown().await.unwrap();
        let mut buf = BytesMut::new();
        let mut got = 0;
        while got < 100 {
            server.readable().await.unwrap();
            match read_draining(&server, &mut buf, 64) {
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(&buf[..], &[7u8; 100][..]);
        loop {
            server.readable().await.unwrap();
            match read_draining(&server, &mut buf, 64) {
                Ok(n) => {
                    assert_eq!(n, 0);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// A receive lands behind the bytes already buffered, and only what arrived counts.
    #[test]
    fn a_receive_appends_what_arrived() {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        client.write_all(b"def").unwrap();
        let mut buf = BytesMut::from(&b"abc"[..]);
        let n = recv_into(server.as_fd(), &mut buf, READ_ROOM).unwrap();
        assert_eq!(n, 3);
        assert_eq!(&buf[..], b"abcdef");
        drop(client);
        assert_eq!(recv_into(server.as_fd(), &mut buf, READ_ROOM).unwrap(), 0);
        assert_eq!(&buf[..], b"abcdef");
    }
}
