//! Listening sockets: a deep accept queue, optionally `SO_REUSEPORT` so that
//! every worker thread has a listener of its own on the same address, and
//! optionally `TCP_DEFER_ACCEPT` so that a connection is accepted only once
//! its first bytes are there.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::accept::Listener;

/// Length of the accept queue asked of the kernel.
pub const BACKLOG: i32 = 4096;

/// A listening socket with a deep accept queue, on the current runtime, whose connections
/// are accepted bare ([`Listener`]).
pub fn listen(addr: SocketAddr) -> std::io::Result<Listener> {
    Listener::new(listen_std(addr, false)?)
}

/// A non-blocking listening socket with a deep accept queue; with
/// `reuse_port`, several sockets share the address and the kernel spreads
/// new connections over them.
pub fn listen_std(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// `n` listeners on `addr` sharing it with `SO_REUSEPORT`, one per worker
/// thread. The first one fixes the port when `addr`'s is 0. With `defer`, each
/// defers its accepts ([`defer_accept`]).
pub fn listen_reuseport(
    addr: SocketAddr,
    n: usize,
    defer: Option<Duration>,
) -> std::io::Result<(SocketAddr, Vec<std::net::TcpListener>)> {
    let first = listen_std(addr, true)?;
    let bound = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..n.max(1) {
        listeners.push(listen_std(bound, true)?);
    }
    if let Some(d) = defer {
        for l in &listeners {
            defer_accept(l, d)?;
        }
    }
    Ok((bound, listeners))
}

/// The deferral of a `defer_accept_ms` setting: none for 0.
pub fn deferral(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Have the kernel complete a connection on `listener` only once its client has sent bytes,
/// or once `wait` has passed without any (`TCP_DEFER_ACCEPT`). A request that comes with the
/// handshake is then read at once after `accept(2)`: no read that finds nothing, and no wait
/// for readiness. A client that connects and stays silent is accepted only after `wait` (the
/// kernel rounds it up to its next SYN-ACK retransmission, 1 s, 3 s, 7 s, ...), and its header
/// timeout counts from there; until then it holds no descriptor. (Set by hand: neither socket2
/// nor nix has this option for Linux.)
pub fn defer_accept(listener: &std::net::TcpListener, wait: Duration) -> std::io::Result<()> {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let secs = libc::c_int::try_from(secs).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid socket, an option of type int and its length.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&secs as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The number of worker threads for a configured `workers` value: 0 means
/// one per core.
pub fn worker_count(configured: usize) -> usize {
    match configured {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    #[test]
    fn a_deferring_listener_accepts_a_connection_once_its_bytes_are_there() {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let (addr, mut ls) = listen_reuseport(any, 1, Some(Duration::from_secs(5))).unwrap();
        let l = ls.pop().unwrap();
        let blocking = |l: &std::net::TcpListener| {
            l.set_nonblocking(false).unwrap();
            socket2::SockRef::from(l)
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
        };
        // A listener that does not defer has a silent client's connection once the handshake
        // is done...
        let (plain_addr, mut plain) = listen_reuseport(any, 1, None).unwrap();
        let plain = plain.pop().unwrap();
        blocking(&plain);
        let _silent = TcpStream::connect(plain_addr).unwrap();
        assert!(plain.accept().is_ok());
        // ...one that defers does not (it cannot: only bytes or the 5 s complete it).
        let mut c = TcpStream::connect(addr).unwrap();
        let e = l.accept().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        // The first bytes complete it, and they are there to read right after the accept.
        c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        blocking(&l);
        let (mut s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(s.read(&mut buf).unwrap(), 16);
    }
}
