//! The floor of a layer-7 relay: the least an HTTP/1.1 proxy must do per request, on epoll.
//!
//! Each request head read from a client goes to an upstream connection taken from this
//! thread's pool of keep-alive connections (round robin over the upstreams; a new one is
//! connected when the pool is empty), without its `Connection` header, so the upstream
//! connection stays open whatever the client asked. The response is passed on as it arrives,
//! framed by its `Content-Length` (the only response header read), and the upstream connection
//! goes back to the pool. A client that asked to close is told so in the response head
//! (`Connection: close` added) and closed after its response. Bodies
//! are copied through a 64 KiB buffer: no splice, no parsing beyond that, no routing policy,
//! no logging, no metrics, no timeouts.
//!
//! Client sockets are registered (level-triggered) only when they must wait, as in the
//! server floor; upstream sockets are registered once, edge-triggered, and read until they
//! would block unless the client cannot take more. A request head that does not fit in one
//! send to the upstream (a loopback socket with an empty buffer takes any head) ends the
//! connection: this is a yardstick, not a server.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::RawFd;

use crate::{check, epoll_loop, epoll_with, errno, request, Event, HEAD_MAX};

/// Set in the token of an upstream socket's events.
const UPSTREAM: u64 = 1 << 32;
const BUF: usize = 64 * 1024;

enum Stage {
    /// Reading the client's next request head.
    Request,
    /// Passing the response on: `head` until its head is whole, then `left` bytes of it
    /// still to come from upstream.
    Response { head: bool, left: usize },
}

struct Client {
    req: [u8; HEAD_MAX],
    req_len: usize,
    /// Response bytes read from upstream, `sent` of them passed on.
    resp: Box<[u8; BUF]>,
    resp_len: usize,
    sent: usize,
    /// For a client that asked to close: the response head with `Connection: close` added,
    /// sent in place of the upstream's, and how much of it went out.
    head_out: Vec<u8>,
    head_sent: usize,
    up: RawFd,
    stage: Stage,
    close_after: bool,
    interest: u32,
}

struct Relay {
    ep: RawFd,
    upstreams: Vec<SocketAddrV4>,
    next: usize,
    /// Idle upstream connections.
    pool: Vec<RawFd>,
    /// Clients by descriptor.
    clients: Vec<Option<Box<Client>>>,
    /// Which client an upstream descriptor serves (-1: idle or closed).
    owner: Vec<RawFd>,
}

pub fn run(l: RawFd, upstreams: Vec<SocketAddrV4>) -> io::Result<()> {
    let ep = epoll_with(l)?;
    let mut r = Relay {
        ep,
        upstreams,
        next: 0,
        pool: Vec::new(),
        clients: Vec::new(),
        owner: Vec::new(),
    };
    // SAFETY: the relay's calls get descriptors it owns.
    epoll_loop(ep, l, |e| unsafe {
        match e {
            Event::Accepted(fd) => {
                r.add_client(fd);
                r.drive(fd, true);
            }
            Event::Ready(tok) if tok & UPSTREAM != 0 => {
                let up = (tok & !UPSTREAM) as RawFd;
                match r.owner.get(up as usize).copied() {
                    Some(c) if c >= 0 => r.drive(c, false),
                    // An idle upstream connection that speaks has closed (or broken).
                    _ => r.drop_idle(up),
                }
            }
            Event::Ready(tok) => r.drive(tok as RawFd, true),
        }
    })
}

unsafe fn ctl(ep: RawFd, op: libc::c_int, fd: RawFd, events: u32, tok: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: tok };
    check(libc::epoll_ctl(ep, op, fd, &mut ev), "epoll_ctl").map(drop)
}

/// Where a client's loop stopped.
enum Next {
    Wait,
    Close,
}

impl Relay {
    fn add_client(&mut self, fd: RawFd) {
        let i = fd as usize;
        if self.clients.len() <= i {
            self.clients.resize_with(i + 1, || None);
        }
        self.clients[i] = Some(Box::new(Client {
            req: [0; HEAD_MAX],
            req_len: 0,
            resp: Box::new([0; BUF]),
            resp_len: 0,
            sent: 0,
            head_out: Vec::new(),
            head_sent: 0,
            up: -1,
            stage: Stage::Request,
            close_after: false,
            interest: 0,
        }));
    }

    unsafe fn drop_idle(&mut self, up: RawFd) {
        if let Some(i) = self.pool.iter().position(|&p| p == up) {
            self.pool.swap_remove(i);
            libc::close(up);
        }
    }

    /// An upstream connection: one from the pool, or a new one.
    unsafe fn upstream(&mut self) -> Option<RawFd> {
        if let Some(up) = self.pool.pop() {
            return Some(up);
        }
        let to = self.upstreams[self.next % self.upstreams.len()];
        self.next += 1;
        let fd = connect_upstream(to)?;
        if ctl(
            self.ep,
            libc::EPOLL_CTL_ADD,
            fd,
            (libc::EPOLLIN | libc::EPOLLET) as u32,
            fd as u64 | UPSTREAM,
        )
        .is_err()
        {
            libc::close(fd);
            return None;
        }
        if self.owner.len() <= fd as usize {
            self.owner.resize(fd as usize + 1, -1);
        }
        Some(fd)
    }

    unsafe fn drive(&mut self, cfd: RawFd, read: bool) {
        let Some(mut c) = self.clients.get_mut(cfd as usize).and_then(Option::take) else {
            return;
        };
        match self.step(cfd, &mut c, read) {
            Next::Wait => self.clients[cfd as usize] = Some(c),
            Next::Close => {
                if c.up >= 0 {
                    self.owner[c.up as usize] = -1;
                    libc::close(c.up);
                }
                libc::close(cfd);
            }
        }
    }

    unsafe fn step(&mut self, cfd: RawFd, c: &mut Client, mut read: bool) -> Next {
        loop {
            match c.stage {
                Stage::Request => {
                    if let Some((end, close)) = request(&c.req[..c.req_len]) {
                        let Some(up) = self.upstream() else {
                            return Next::Close;
                        };
                        self.owner[up as usize] = cfd;
                        c.up = up;
                        c.close_after = close;
                        let mut head = Vec::with_capacity(end);
                        without_connection(&c.req[..end], &mut head);
                        let n =
                            libc::send(up, head.as_ptr().cast(), head.len(), libc::MSG_NOSIGNAL);
                        if n != head.len() as isize {
                            return Next::Close;
                        }
                        c.req.copy_within(end..c.req_len, 0);
                        c.req_len -= end;
                        c.stage = Stage::Response {
                            head: true,
                            left: 0,
                        };
                        c.resp_len = 0;
                        c.sent = 0;
                        continue;
                    }
                    if c.req_len == HEAD_MAX {
                        return Next::Close;
                    }
                    if !read {
                        return self.want(cfd, c, libc::EPOLLIN as u32);
                    }
                    let n = libc::recv(
                        cfd,
                        c.req[c.req_len..].as_mut_ptr().cast(),
                        HEAD_MAX - c.req_len,
                        0,
                    );
                    if n < 0 && errno() == libc::EAGAIN {
                        return self.want(cfd, c, libc::EPOLLIN as u32);
                    }
                    if n <= 0 {
                        return Next::Close;
                    }
                    c.req_len += n as usize;
                }
                Stage::Response { head, left } => {
                    // Pass on what is read and may go (all of it once the head is whole).
                    let pending = if c.head_sent < c.head_out.len() {
                        let more = if c.sent < c.resp_len || left > 0 {
                            libc::MSG_MORE
                        } else {
                            0
                        };
                        Some((&c.head_out[c.head_sent..], more, true))
                    } else if !head && c.sent < c.resp_len {
                        Some((&c.resp[c.sent..c.resp_len], 0, false))
                    } else {
                        None
                    };
                    if let Some((bytes, more, of_head)) = pending {
                        let n = libc::send(
                            cfd,
                            bytes.as_ptr().cast(),
                            bytes.len(),
                            libc::MSG_NOSIGNAL | more,
                        );
                        if n < 0 && errno() == libc::EAGAIN {
                            return self.want(cfd, c, libc::EPOLLOUT as u32);
                        }
                        if n <= 0 {
                            return Next::Close;
                        }
                        if of_head {
                            c.head_sent += n as usize;
                        } else {
                            c.sent += n as usize;
                        }
                        continue;
                    }
                    if !head && left == 0 {
                        // Answered: the upstream connection goes back to the pool.
                        self.owner[c.up as usize] = -1;
                        self.pool.push(c.up);
                        c.up = -1;
                        c.stage = Stage::Request;
                        if c.close_after {
                            return Next::Close;
                        }
                        read = c.req_len > 0;
                        continue;
                    }
                    if c.sent == c.resp_len && !head {
                        c.resp_len = 0;
                        c.sent = 0;
                    }
                    let room = if head {
                        BUF
                    } else {
                        BUF.min(c.resp_len + left)
                    };
                    let n = libc::recv(
                        c.up,
                        c.resp[c.resp_len..room].as_mut_ptr().cast(),
                        room - c.resp_len,
                        0,
                    );
                    if n < 0 && errno() == libc::EAGAIN {
                        // The upstream's next edge resumes this client.
                        return Next::Wait;
                    }
                    if n <= 0 {
                        return Next::Close;
                    }
                    c.resp_len += n as usize;
                    if head {
                        let Some((end, len)) = response_head(&c.resp[..c.resp_len]) else {
                            if c.resp_len == BUF {
                                return Next::Close;
                            }
                            continue;
                        };
                        let have = c.resp_len - end;
                        if have > len {
                            return Next::Close; // more than the response: not HTTP/1.1 as spoken here
                        }
                        c.stage = Stage::Response {
                            head: false,
                            left: len - have,
                        };
                        c.head_out.clear();
                        c.head_sent = 0;
                        if c.close_after {
                            c.head_out.extend_from_slice(&c.resp[..end - 2]);
                            c.head_out.extend_from_slice(b"Connection: close\r\n\r\n");
                            c.sent = end;
                        }
                    } else {
                        c.stage = Stage::Response {
                            head: false,
                            left: left - n as usize,
                        };
                    }
                }
            }
        }
    }

    /// Register the client for `interest` unless it is so already; it waits.
    unsafe fn want(&mut self, cfd: RawFd, c: &mut Client, interest: u32) -> Next {
        if c.interest != interest {
            let op = if c.interest == 0 {
                libc::EPOLL_CTL_ADD
            } else {
                libc::EPOLL_CTL_MOD
            };
            if ctl(self.ep, op, cfd, interest, cfd as u64).is_err() {
                return Next::Close;
            }
            c.interest = interest;
        }
        Next::Wait
    }
}

/// A new upstream connection to `to`: connected, `TCP_NODELAY`, non-blocking.
pub(crate) fn connect_upstream(to: SocketAddrV4) -> Option<RawFd> {
    // SAFETY: system calls on a descriptor this function owns, with valid pointers and lengths.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = to.port().to_be();
        sa.sin_addr.s_addr = u32::from(*to.ip()).to_be();
        // A blocking connect: on loopback the handshake is done within the call.
        let one: libc::c_int = 1;
        if libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) < 0
            || libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ) < 0
            || libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) < 0
        {
            libc::close(fd);
            return None;
        }
        Some(fd)
    }
}

/// The request head without its `Connection` header line, appended to `out`.
pub(crate) fn without_connection(head: &[u8], out: &mut Vec<u8>) {
    for line in head.split_inclusive(|&b| b == b'\n') {
        let name = b"connection:";
        if line.len() >= name.len() && line[..name.len()].eq_ignore_ascii_case(name) {
            continue;
        }
        out.extend_from_slice(line);
    }
}

/// The end of a response head in `buf` and its `Content-Length`.
pub(crate) fn response_head(buf: &[u8]) -> Option<(usize, usize)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let name = b"content-length:";
    let len = buf[..end]
        .split(|&b| b == b'\n')
        .find(|l| l.len() > name.len() && l[..name.len()].eq_ignore_ascii_case(name))
        .and_then(|l| std::str::from_utf8(&l[name.len()..]).ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some((end, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_only_the_connection_header() {
        let mut out = Vec::new();
        without_connection(
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            &mut out,
        );
        assert_eq!(out, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    }

    #[test]
    fn reads_the_content_length() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\nX: y\r\n\r\nbody";
        assert_eq!(response_head(r), Some((r.len() - 4, 1024)));
        assert_eq!(response_head(b"HTTP/1.1 200 OK\r\n"), None);
    }
}
