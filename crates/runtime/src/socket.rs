//! A client's socket, registered with the event loop only once it must wait.
//!
//! Registering a socket with tokio costs an `epoll_ctl(ADD)` and, when the socket is dropped,
//! an `epoll_ctl(DEL)`: two system calls and the reactor's bookkeeping. For a node answering
//! one request per connection that was 6 % of its CPU in `epoll_ctl` alone (profiled,
//! `bench/RESULTS.md`). A client whose request arrived with its handshake (always so with
//! deferred accepts, often so under load) can be read, answered and closed without ever
//! waiting, as nginx does when it finds a request ready at accept. So the accept loop hands
//! over a [`ClientSocket`] that is *bare*: a non-blocking descriptor that reads and writes are
//! tried on directly ([`ClientSocket::now`]). The first wait, for bytes or for room, registers
//! it ([`ClientSocket::registered`]); from then on it is an ordinary tokio [`TcpStream`].
//!
//! Written here because tokio registers every stream it creates (there is no lazily registered
//! stream in tokio or mio).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// A client's TCP socket, bare until its first wait ([module docs](self)).
#[derive(Debug)]
pub struct ClientSocket(State);

#[derive(Debug)]
enum State {
    /// Not known to the event loop; non-blocking.
    Bare(std::net::TcpStream),
    /// Registered with the event loop of the thread that registered it.
    Registered(TcpStream),
    /// Registration failed, which closed the socket.
    Closed,
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the socket could not be registered",
    )
}

impl ClientSocket {
    /// A bare socket; `stream` must be non-blocking (as `accept4` with `SOCK_NONBLOCK` makes it).
    pub fn bare(stream: std::net::TcpStream) -> ClientSocket {
        ClientSocket(State::Bare(stream))
    }

    /// Whether the event loop knows the socket.
    pub fn is_registered(&self) -> bool {
        matches!(self.0, State::Registered(_))
    }

    /// The socket registered with the current thread's event loop, registering it now if it is
    /// bare. An error (the event loop refused it) leaves it closed: every later use fails.
    pub fn registered(&mut self) -> io::Result<&mut TcpStream> {
        if let State::Bare(_) = self.0 {
            let taken = std::mem::replace(&mut self.0, State::Closed);
            self.0 = State::Registered(Self::register(taken)?);
        }
        match &mut self.0 {
            State::Registered(s) => Ok(s),
            _ => Err(closed()),
        }
    }

    /// The socket as a registered tokio stream ([`ClientSocket::registered`]).
    pub fn into_registered(self) -> io::Result<TcpStream> {
        Self::register(self.0)
    }

    /// The stream of `state`, registered now if it is bare. (On failure tokio drops, and so
    /// closes, the socket.)
    fn register(state: State) -> io::Result<TcpStream> {
        match state {
            State::Bare(s) => TcpStream::from_std(s),
            State::Registered(s) => Ok(s),
            State::Closed => Err(closed()),
        }
    }

    /// The socket's descriptor, for system calls made directly on it.
    pub fn fd(&self) -> io::Result<BorrowedFd<'_>> {
        match &self.0 {
            State::Bare(s) => Ok(s.as_fd()),
            State::Registered(s) => Ok(s.as_fd()),
            State::Closed => Err(closed()),
        }
    }

    /// The descriptor's number, or -1 once closed (a number that no call can mistake for
    /// another socket's).
    pub fn raw_fd(&self) -> RawFd {
        self.fd().map_or(-1, |fd| fd.as_raw_fd())
    }

    /// Run the I/O call `f` on the socket at once, without asking the event loop first.
    ///
    /// tokio's `try_read`, `try_write` and `try_io` skip the system call until the event loop
    /// has reported the socket ready, and a socket registered moments ago has had no report
    /// yet. On a registered socket a `WouldBlock` from `f` clears the readiness tokio holds for
    /// `interest`, so that a following wait waits for a real event rather than returning at
    /// once; a bare socket has none to clear.
    pub fn now<R>(
        &self,
        interest: Interest,
        f: impl FnOnce(BorrowedFd<'_>) -> io::Result<R>,
    ) -> io::Result<R> {
        match &self.0 {
            State::Bare(s) => f(s.as_fd()),
            State::Registered(s) => io_now(s, interest, || f(s.as_fd())),
            State::Closed => Err(closed()),
        }
    }

    /// The client's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.socket(|s| s.peer_addr()).and_then(ip_addr)
    }

    /// This host's address of the connection.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket(|s| s.local_addr()).and_then(ip_addr)
    }

    /// Set `TCP_NODELAY`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.socket(|s| s.set_tcp_nodelay(on))
    }

    /// Run `f` on the socket's options, bare or registered.
    fn socket<R>(&self, f: impl FnOnce(&socket2::SockRef<'_>) -> io::Result<R>) -> io::Result<R> {
        let fd = self.fd()?;
        f(&socket2::SockRef::from(&fd))
    }
}

fn ip_addr(a: socket2::SockAddr) -> io::Result<SocketAddr> {
    a.as_socket()
        .ok_or_else(|| io::Error::other("a TCP socket without an IP address"))
}

/// Run the write `f` on the registered socket `to` at once, without first asking tokio whether
/// `to` is writable ([`ClientSocket::now`]); a `WouldBlock` clears the readiness tokio holds.
pub fn write_now<R>(to: &TcpStream, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
    io_now(to, Interest::WRITABLE, f)
}

fn io_now<R>(
    to: &TcpStream,
    interest: Interest,
    f: impl FnOnce() -> io::Result<R>,
) -> io::Result<R> {
    match f() {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            // With readiness held, `try_io` runs the closure, sees `WouldBlock` and clears it;
            // with none held, it leaves it so.
            let _ = to.try_io(interest, || {
                Err::<(), _>(io::Error::from(io::ErrorKind::WouldBlock))
            });
            Err(e)
        }
        r => r,
    }
}

impl From<TcpStream> for ClientSocket {
    fn from(s: TcpStream) -> ClientSocket {
        ClientSocket(State::Registered(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        (s, c)
    }

    fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
        (&*socket2::SockRef::from(&fd)).read(buf)
    }

    /// A bare socket answers a request that is already there without the event loop, and is
    /// registered by its first wait, which then waits for a real event.
    #[tokio::test]
    async fn a_bare_socket_works_at_once_and_registers_when_it_must_wait() {
        let (server, mut client) = pair();
        client.write_all(b"ping").unwrap();
        // Wait (blocking) until the bytes are there, as a deferred accept would.
        server.set_nonblocking(false).unwrap();
        server.peek(&mut [0u8; 4]).unwrap();
        server.set_nonblocking(true).unwrap();
        let mut s = ClientSocket::bare(server);
        assert!(!s.is_registered());
        let mut buf = [0u8; 16];
        let n = s.now(Interest::READABLE, |fd| recv(fd, &mut buf)).unwrap();
        assert_eq!(&buf[..n], b"ping");
        let n = s
            .now(Interest::WRITABLE, |fd| {
                (&*socket2::SockRef::from(&fd)).write(b"pong")
            })
            .unwrap();
        assert_eq!(n, 4);
        assert!(!s.is_registered(), "no call so far needed the event loop");
        let mut got = [0u8; 4];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"pong");
        // Nothing more to read: the wait registers the socket and sleeps until bytes come.
        let e = s
            .now(Interest::READABLE, |fd| recv(fd, &mut buf))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        {
            let stream = s.registered().unwrap();
            let wait = stream.readable();
            tokio::pin!(wait);
            assert!(
                futures_poll_once(wait.as_mut()).await.is_none(),
                "a registered socket with nothing to read must not report readable"
            );
            client.write_all(b"more").unwrap();
            wait.await.unwrap();
        }
        assert!(s.is_registered());
        let n = s.now(Interest::READABLE, |fd| recv(fd, &mut buf)).unwrap();
        assert_eq!(&buf[..n], b"more");
        assert_eq!(s.peer_addr().unwrap(), client.local_addr().unwrap());
    }

    fn send(to: &TcpStream, data: &[u8]) -> io::Result<usize> {
        (&*socket2::SockRef::from(to)).write(data)
    }

    /// A connection just accepted and registered with the event loop, no readiness reported yet.
    fn fresh() -> (TcpStream, std::net::TcpStream) {
        let (accepted, client) = pair();
        (TcpStream::from_std(accepted).unwrap(), client)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_first_write_goes_out_before_the_event_loop_reports_the_socket() {
        let (s, mut client) = fresh();
        // tokio's own try_write waits for a readiness report that has not come yet...
        let refused = s.try_write(b"no");
        assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::WouldBlock);
        // ...while the write is tried at once.
        assert_eq!(write_now(&s, || send(&s, b"hello")).unwrap(), 5);
        let mut got = [0u8; 5];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_write_that_would_block_leaves_a_real_wait_behind() {
        let (s, client) = fresh();
        // The event loop reports the new socket writable: tokio now holds that readiness.
        s.writable().await.unwrap();
        // The client takes nothing: fill every buffer until the kernel refuses.
        let chunk = vec![7u8; 1 << 20];
        let refused = loop {
            match write_now(&s, || send(&s, &chunk)) {
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        assert_eq!(refused.kind(), io::ErrorKind::WouldBlock);
        // The refusal cleared the readiness held: the wait is for a real event (none comes),
        // where a stale readiness would end it at once and a write loop would spin.
        let waited = tokio::time::timeout(std::time::Duration::from_secs(1), s.writable()).await;
        assert!(
            waited.is_err(),
            "writable() returned at once after a WouldBlock"
        );
        drop(client);
    }

    /// Poll `f` once; `Some` if it was ready.
    async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        let mut f = f;
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
