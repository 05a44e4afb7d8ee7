//! Listening sockets: a deep accept queue, optionally `SO_REUSEPORT` so that
//! every worker thread has a listener of its own on the same address.

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// Length of the accept queue asked of the kernel.
pub const BACKLOG: i32 = 4096;

/// A listening socket with a deep accept queue, on the current runtime.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::from_std(listen_std(addr, false)?)
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
/// thread. The first one fixes the port when `addr`'s is 0.
pub fn listen_reuseport(
    addr: SocketAddr,
    n: usize,
) -> std::io::Result<(SocketAddr, Vec<std::net::TcpListener>)> {
    let first = listen_std(addr, true)?;
    let bound = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..n.max(1) {
        listeners.push(listen_std(bound, true)?);
    }
    Ok((bound, listeners))
}

/// The number of worker threads for a configured `workers` value: 0 means
/// one per core.
pub fn worker_count(configured: usize) -> usize {
    match configured {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}
