//! floor: the least work an HTTP/1.1 server can do per request, as a yardstick.
//!
//! It answers every request on its port with the same in-memory response of `--body` bytes,
//! reading nothing from disk, parsing nothing beyond the end of the head and a
//! `Connection: close`, logging nothing and keeping no metrics. Whatever it costs per request
//! is what the kernel's TCP stack and the event interface cost, the part that any server pays
//! that sleeps as it does (as soon as it is idle), so `floor / nginx` bounds what a server (the
//! node included) can reach against nginx on this machine by doing less per request: a target
//! above it cannot be met by less user-space work alone. (The node's workers yield their CPU
//! before they sleep, which changes the kernel's share: they lead the floor in
//! `Connection: close`.)
//!
//! Two engines, one thread per core on `SO_REUSEPORT` listeners, as the node runs:
//! - `epoll`: accept4, then a read tried at once; a connection is registered (level-triggered)
//!   only when it must wait, as the node does; close-mode connections answered at accept never
//!   are. No read is tried after an answer on a registered connection: the event says when.
//! - `uring`: one ring per thread, a multishot accept, and recv, send and close submitted as
//!   ring entries, so that a batch of connections costs one `io_uring_enter`
//!   (`IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN`, the setup liburing recommends
//!   for a thread-per-ring server).
//!
//! With `--sendfile` (epoll only) the body is kept in a memfd and sent with `sendfile(2)` behind
//! a head sent with `MSG_MORE`, as nginx and the node send bodies larger than a few pages: the
//! floor for them, since a copy from user memory costs more than the page references sendfile
//! hands to the socket.
//!
//! With `--relay ADDR[,ADDR...]` it is instead the floor of a layer-7 relay in front of those
//! servers, on epoll ([`relay`]) or on io_uring ([`relay_uring`]).
//!
//! On io_uring, `--hold N,MICROSECONDS` makes each wait hold until `N` completions are in (at
//! most one per connection), or that long after the first (`min_wait_usec`, Linux 6.12), as
//! `switchyard load`'s loop does; the default `1,0` waits for one.
//!
//! Usage: `floor --port 18090 --threads 2 --engine epoll|uring --body 1024 [--sendfile]`
//!        `floor --port 18090 --threads 2 --relay 127.0.0.1:18101,127.0.0.1:18102`
//!        `floor --port 18090 --engine uring --hold 16,100 [--relay 127.0.0.1:18101]`

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types, IoUring};

mod relay;
mod relay_uring;

/// The request head this server accepts at most; a longer one closes the connection.
const HEAD_MAX: usize = 4096;

struct Args {
    port: u16,
    threads: usize,
    engine: String,
    body: usize,
    sendfile: bool,
    relay: Vec<std::net::SocketAddrV4>,
    /// io_uring: completions to wait for, and the most microseconds to wait for them after the
    /// first.
    hold: (usize, u32),
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        port: 18090,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        engine: "epoll".into(),
        body: 1024,
        sendfile: false,
        relay: Vec::new(),
        hold: (1, 0),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--sendfile" {
            a.sendfile = true;
            continue;
        }
        let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("{k} {v}: {e}");
        match k.as_str() {
            "--port" => a.port = v.parse().map_err(bad)?,
            "--threads" => a.threads = v.parse().map_err(bad)?,
            "--body" => a.body = v.parse().map_err(bad)?,
            "--engine" if v == "epoll" || v == "uring" => a.engine = v,
            "--hold" => {
                let (n, us) = v
                    .split_once(',')
                    .ok_or_else(|| format!("--hold {v}: expected N,MICROSECONDS"))?;
                a.hold = (n.parse().map_err(bad)?, us.parse().map_err(bad)?);
            }
            "--relay" => {
                a.relay = v
                    .split(',')
                    .map(|s| s.parse().map_err(|e| format!("--relay {s}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown argument {k} {v}")),
        }
    }
    Ok(a)
}

/// The two answers, built once: keep-alive and close; with `file`, heads only, the body in a
/// memfd of that many bytes.
struct Responses {
    keep: Vec<u8>,
    close: Vec<u8>,
    file: Option<(RawFd, usize)>,
}

impl Responses {
    fn new(body: usize, sendfile: bool) -> io::Result<Responses> {
        let make = |extra: &str| {
            let mut r = format!(
                "HTTP/1.1 200 OK\r\nServer: floor\r\nContent-Type: application/octet-stream\r\n\
                 Content-Length: {body}\r\n{extra}\r\n"
            )
            .into_bytes();
            if !sendfile {
                r.resize(r.len() + body, b'x');
            }
            r
        };
        let file = if sendfile {
            Some((memfd(body)?, body))
        } else {
            None
        };
        Ok(Responses {
            keep: make(""),
            close: make("Connection: close\r\n"),
            file,
        })
    }

    fn pick(&self, close: bool) -> &[u8] {
        if close {
            &self.close
        } else {
            &self.keep
        }
    }
}

/// A memfd holding `len` bytes of body.
fn memfd(len: usize) -> io::Result<RawFd> {
    // SAFETY: a new descriptor this function owns, written from a buffer it owns.
    unsafe {
        let fd = check(
            libc::memfd_create(c"floor-body".as_ptr(), libc::MFD_CLOEXEC),
            "memfd_create",
        )?;
        let body = vec![b'x'; len];
        let mut done = 0;
        while done < len {
            let n = check(
                libc::write(fd, body[done..].as_ptr().cast(), len - done) as libc::c_int,
                "write",
            )?;
            done += n as usize;
        }
        Ok(fd)
    }
}

/// The end of the first request head in `buf` and whether it asks to close.
fn request(buf: &[u8]) -> Option<(usize, bool)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let pat = b"connection: close";
    let close = buf[..end]
        .windows(pat.len())
        .any(|w| w.eq_ignore_ascii_case(pat));
    Some((end, close))
}

/// One connection's state; boxed, so that the kernel may hold pointers into `buf`.
struct Conn {
    buf: [u8; HEAD_MAX],
    len: usize,
    /// The response being sent and how much of it went out.
    out: Option<(&'static [u8], usize)>,
    /// With `--sendfile`: body bytes still to send behind the head.
    file_left: usize,
    close_after: bool,
    /// The epoll interest it is registered with (epoll engine), 0 if none.
    interest: u32,
}

impl Conn {
    fn new() -> Box<Conn> {
        Box::new(Conn {
            buf: [0; HEAD_MAX],
            len: 0,
            out: None,
            file_left: 0,
            close_after: false,
            interest: 0,
        })
    }

    /// Take the next whole request from the buffer, setting the response to send.
    fn next_request(&mut self, resp: &'static Responses) -> bool {
        let Some((end, close)) = request(&self.buf[..self.len]) else {
            return false;
        };
        self.buf.copy_within(end..self.len, 0);
        self.len -= end;
        self.out = Some((resp.pick(close), 0));
        self.file_left = resp.file.map_or(0, |(_, len)| len);
        self.close_after = close;
        true
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(rc: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(rc)
    }
}

/// A non-blocking `SO_REUSEPORT` listener on 127.0.0.1:`port`.
fn listener(port: u16) -> io::Result<RawFd> {
    // SAFETY: plain system calls on a descriptor this function owns, with valid pointers and
    // lengths.
    unsafe {
        let fd = check(
            libc::socket(
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            ),
            "socket",
        )?;
        let one: libc::c_int = 1;
        for opt in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
            check(
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                ),
                "setsockopt",
            )?;
        }
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = port.to_be();
        sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        check(
            libc::bind(
                fd,
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            "bind",
        )?;
        check(libc::listen(fd, 4096), "listen")?;
        Ok(fd)
    }
}

/// Connections by descriptor number, and how many there are.
#[derive(Default)]
struct Table {
    conns: Vec<Option<Box<Conn>>>,
    live: usize,
}

impl Table {
    fn put(&mut self, fd: RawFd) -> &mut Conn {
        let i = fd as usize;
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, || None);
        }
        if self.conns[i].is_none() {
            self.live += 1;
        }
        self.conns[i].insert(Conn::new())
    }

    fn get(&mut self, fd: RawFd) -> Option<&mut Conn> {
        self.conns
            .get_mut(fd as usize)
            .and_then(|c| c.as_deref_mut())
    }

    fn remove(&mut self, fd: RawFd) {
        if let Some(c) = self.conns.get_mut(fd as usize) {
            if c.take().is_some() {
                self.live -= 1;
            }
        }
    }
}

// ---- epoll ----

const LISTENER: u64 = u64::MAX;

/// What [`epoll_loop`] hands on.
enum Event {
    /// A connection just accepted, non-blocking.
    Accepted(RawFd),
    /// An event on a registered descriptor, by its token.
    Ready(u64),
}

/// A new epoll descriptor with the listener `l` registered.
fn epoll_with(l: RawFd) -> io::Result<RawFd> {
    // SAFETY: system calls on descriptors this thread owns.
    unsafe {
        let ep = check(libc::epoll_create1(libc::EPOLL_CLOEXEC), "epoll_create1")?;
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: LISTENER,
        };
        check(
            libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, l, &mut ev),
            "epoll_ctl",
        )?;
        Ok(ep)
    }
}

/// One thread's loop on `ep` ([`epoll_with`]): every connection ready on `l` is accepted and
/// handed to `f`, as is every other event.
fn epoll_loop(ep: RawFd, l: RawFd, mut f: impl FnMut(Event)) -> io::Result<()> {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    loop {
        // SAFETY: a buffer of `events.len()` events.
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, -1) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(io::Error::last_os_error());
        }
        for ev in &events[..n as usize] {
            if ev.u64 != LISTENER {
                f(Event::Ready(ev.u64));
                continue;
            }
            loop {
                // SAFETY: no address wanted back.
                let fd = unsafe {
                    libc::accept4(
                        l,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    )
                };
                if fd < 0 {
                    break; // EAGAIN, or out of descriptors: the next event retries
                }
                f(Event::Accepted(fd));
            }
        }
    }
}

fn run_epoll(l: RawFd, resp: &'static Responses) -> io::Result<()> {
    let ep = epoll_with(l)?;
    let mut conns = Table::default();
    // SAFETY: `drive` gets this thread's epoll descriptor and connections in `conns`.
    epoll_loop(ep, l, |e| unsafe {
        match e {
            Event::Accepted(fd) => {
                conns.put(fd);
                drive(ep, fd, &mut conns, resp, true);
            }
            Event::Ready(tok) => drive(ep, tok as RawFd, &mut conns, resp, true),
        }
    })
}

/// Advance one connection as far as it goes without waiting.
///
/// # Safety
/// `fd` is a connection in `conns`, `ep` this thread's epoll descriptor.
unsafe fn drive(ep: RawFd, fd: RawFd, conns: &mut Table, resp: &'static Responses, read: bool) {
    let Some(c) = conns.get(fd) else { return };
    let mut read = read;
    loop {
        if let Some((out, off)) = c.out {
            let n = if off < out.len() {
                let more = if c.file_left > 0 { libc::MSG_MORE } else { 0 };
                let n = libc::send(
                    fd,
                    out[off..].as_ptr().cast(),
                    out.len() - off,
                    libc::MSG_NOSIGNAL | more,
                );
                if n > 0 {
                    c.out = Some((out, off + n as usize));
                }
                n
            } else if let (Some((file, len)), true) = (resp.file, c.file_left > 0) {
                let mut at = (len - c.file_left) as libc::off_t;
                let n = libc::sendfile(fd, file, &mut at, c.file_left);
                if n > 0 {
                    c.file_left -= n as usize;
                }
                n
            } else {
                c.out = None;
                if c.close_after {
                    break;
                }
                // Answered: the next read waits for the event that says there is something.
                read = c.len > 0;
                continue;
            };
            if n < 0 && errno() == libc::EAGAIN {
                want(ep, fd, c, libc::EPOLLOUT as u32);
                return;
            }
            if n <= 0 {
                break;
            }
            continue;
        }
        if c.next_request(resp) {
            continue;
        }
        if c.len == HEAD_MAX {
            break;
        }
        if !read {
            want(ep, fd, c, libc::EPOLLIN as u32);
            return;
        }
        let n = libc::recv(fd, c.buf[c.len..].as_mut_ptr().cast(), HEAD_MAX - c.len, 0);
        if n == 0 {
            break;
        }
        if n < 0 {
            if errno() == libc::EAGAIN {
                want(ep, fd, c, libc::EPOLLIN as u32);
                return;
            }
            break;
        }
        c.len += n as usize;
    }
    // Closing the last reference also removes it from the epoll set.
    libc::close(fd);
    conns.remove(fd);
}

/// Register `fd` for `interest` unless it is so already.
unsafe fn want(ep: RawFd, fd: RawFd, c: &mut Conn, interest: u32) {
    if c.interest == interest {
        return;
    }
    let op = if c.interest == 0 {
        libc::EPOLL_CTL_ADD
    } else {
        libc::EPOLL_CTL_MOD
    };
    let mut ev = libc::epoll_event {
        events: interest,
        u64: fd as u64,
    };
    if libc::epoll_ctl(ep, op, fd, &mut ev) == 0 {
        c.interest = interest;
    }
}

// ---- io_uring ----

const ACCEPT: u64 = 0;
const RECV: u64 = 1;
const SEND: u64 = 2;
const CLOSE: u64 = 3;

fn tag(fd: RawFd, op: u64) -> u64 {
    ((fd as u64) << 8) | op
}

struct Ring {
    ring: IoUring,
}

impl Ring {
    /// Queue `e`, submitting what is queued first if the queue is full.
    fn push(&mut self, e: squeue::Entry) -> io::Result<()> {
        // SAFETY: every buffer an entry points at is a boxed connection's or a response's,
        // both alive until its completion is reaped (a connection is dropped only when its
        // close is queued, after its last recv or send completed).
        unsafe {
            while self.ring.submission().push(&e).is_err() {
                self.ring.submit()?;
            }
        }
        Ok(())
    }

    fn recv(&mut self, fd: RawFd, c: &mut Conn) -> io::Result<()> {
        let spare = &mut c.buf[c.len..];
        let e = opcode::Recv::new(types::Fd(fd), spare.as_mut_ptr(), spare.len() as u32)
            .build()
            .user_data(tag(fd, RECV));
        self.push(e)
    }

    fn send(&mut self, fd: RawFd, c: &Conn) -> io::Result<()> {
        let (out, off) = c.out.expect("a response to send");
        let rest = &out[off..];
        let e = opcode::Send::new(types::Fd(fd), rest.as_ptr(), rest.len() as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(tag(fd, SEND));
        self.push(e)
    }

    fn close(&mut self, fd: RawFd, conns: &mut Table) -> io::Result<()> {
        conns.remove(fd);
        self.push(
            opcode::Close::new(types::Fd(fd))
                .build()
                .user_data(tag(fd, CLOSE)),
        )
    }

    fn accept(&mut self, l: RawFd) -> io::Result<()> {
        self.push(
            opcode::AcceptMulti::new(types::Fd(l))
                .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
                .build()
                .user_data(ACCEPT),
        )
    }

    /// After a completed read or send: answer, read on, or close.
    fn advance(
        &mut self,
        fd: RawFd,
        conns: &mut Table,
        resp: &'static Responses,
    ) -> io::Result<()> {
        let Some(c) = conns.get(fd) else {
            return Ok(());
        };
        if c.out.is_none() && c.next_request(resp) {
            return self.send(fd, c);
        }
        if c.len == HEAD_MAX {
            return self.close(fd, conns);
        }
        self.recv(fd, c)
    }
}

/// Submit what is queued and wait as `hold` says (completions to wait for, at most one per
/// connection of the `live` ones, and the most microseconds to wait for them after the first),
/// then move the completions into `done`. `false`: interrupted, nothing reaped.
fn wait_and_reap(
    ring: &mut IoUring,
    hold: (usize, u32),
    live: usize,
    done: &mut Vec<(u64, i32, u32)>,
) -> io::Result<bool> {
    let (want, min_wait) = hold;
    let want = want.clamp(1, live.max(1));
    let mut args = types::SubmitArgs::new();
    if want > 1 && min_wait > 0 {
        args = args.min_wait_usec(min_wait);
    }
    match ring.submitter().submit_with_args(want, &args) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => return Ok(false),
        // Busy (completions to reap first) or the wait's timer: reap what is there.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ETIME)) => {}
        Err(e) => return Err(e),
    }
    done.clear();
    done.extend(
        ring.completion()
            .map(|c| (c.user_data(), c.result(), c.flags())),
    );
    Ok(true)
}

fn run_uring(l: RawFd, resp: &'static Responses, hold: (usize, u32)) -> io::Result<()> {
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(8192)
        .build(4096)?;
    let mut r = Ring { ring };
    let mut conns = Table::default();
    let mut done: Vec<(u64, i32, u32)> = Vec::with_capacity(1024);
    r.accept(l)?;
    loop {
        if !wait_and_reap(&mut r.ring, hold, conns.live, &mut done)? {
            continue;
        }
        for &(ud, res, flags) in &done {
            let fd = (ud >> 8) as RawFd;
            match ud & 0xff {
                ACCEPT => {
                    if res >= 0 {
                        let c = conns.put(res);
                        r.recv(res, c)?;
                    }
                    if !io_uring::cqueue::more(flags) {
                        r.accept(l)?;
                    }
                }
                RECV => {
                    if res <= 0 {
                        r.close(fd, &mut conns)?;
                        continue;
                    }
                    if let Some(c) = conns.get(fd) {
                        c.len += res as usize;
                    }
                    r.advance(fd, &mut conns, resp)?;
                }
                SEND => {
                    let Some(c) = conns.get(fd) else { continue };
                    if res < 0 {
                        r.close(fd, &mut conns)?;
                        continue;
                    }
                    let (out, off) = c.out.expect("a response in flight");
                    let off = off + res as usize;
                    if off < out.len() {
                        c.out = Some((out, off));
                        r.send(fd, c)?;
                    } else if c.close_after {
                        r.close(fd, &mut conns)?;
                    } else {
                        c.out = None;
                        r.advance(fd, &mut conns, resp)?;
                    }
                }
                _ => {} // CLOSE: nothing left to do
            }
        }
    }
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("floor: {e}");
            std::process::exit(2);
        }
    };
    if a.engine == "uring" && a.sendfile {
        eprintln!("floor: --sendfile is for the epoll engine");
        std::process::exit(2);
    }
    let resp = Responses::new(a.body, a.sendfile).unwrap_or_else(|e| {
        eprintln!("floor: {e}");
        std::process::exit(1);
    });
    let resp: &'static Responses = Box::leak(Box::new(resp));
    let threads: Vec<_> = (0..a.threads)
        .map(|_| {
            let l = listener(a.port).unwrap_or_else(|e| {
                eprintln!("floor: cannot listen on 127.0.0.1:{}: {e}", a.port);
                std::process::exit(1);
            });
            let uring = a.engine == "uring";
            let upstreams = a.relay.clone();
            let hold = a.hold;
            std::thread::spawn(move || {
                let r = if !upstreams.is_empty() && uring {
                    relay_uring::run(l, upstreams, hold)
                } else if !upstreams.is_empty() {
                    relay::run(l, upstreams)
                } else if uring {
                    run_uring(l, resp, hold)
                } else {
                    run_epoll(l, resp)
                };
                if let Err(e) = r {
                    eprintln!("floor: {e}");
                    std::process::exit(1);
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_head_and_close() {
        assert_eq!(request(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
        assert_eq!(
            request(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET"),
            Some((27, false))
        );
        assert_eq!(
            request(b"GET / HTTP/1.1\r\nconnection: Close\r\n\r\n"),
            Some((37, true))
        );
    }
}
