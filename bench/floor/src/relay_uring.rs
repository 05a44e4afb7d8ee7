//! The floor of a layer-7 relay on io_uring: [`crate::relay`]'s work per request, with every
//! read and write a ring entry, so that what a relay could gain from io_uring is measured
//! before any server is rewritten on it.
//!
//! One ring per thread (`IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN`), a multishot
//! accept. Each client has one chain of entries in flight at a time:
//! - waiting for a request: `recv` on the client;
//! - a request head read: `send` of the head (its `Connection` line dropped) on an upstream
//!   connection from this thread's pool, linked to the `recv` of the response;
//! - response bytes read: `send` of them to the client, linked to the next `recv` (on the
//!   upstream while the response goes on, on the client once it is whole; the upstream
//!   connection then goes back to the pool).
//!
//! Sends carry `MSG_WAITALL` (the kernel finishes a partial send itself) and
//! `IOSQE_CQE_SKIP_SUCCESS`, so a request normally costs two completions: the request's and the
//! response's. A failed entry ends its chain (the linked ones never run) and the client and its
//! upstream connection are closed.
//!
//! A pooled upstream connection that fails before a byte of the response came (the upstream
//! closed it while it was idle) is replaced and the request sent again, as relays do.
//!
//! Waits may hold (`--hold N,U`): `io_uring_enter` returns once `N` completions are in, or `U`
//! microseconds after the first (`min_wait_usec`, Linux 6.12), as `switchyard load`'s loop
//! does; `--hold 1,0` waits for one.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types, IoUring};

use crate::relay::{connect_upstream, response_head, without_connection};
use crate::{request, wait_and_reap, HEAD_MAX};

const BUF: usize = 64 * 1024;

const ACCEPT: u64 = 0;
/// A `recv` on the client: its next request.
const CRECV: u64 = 1;
/// A `send` to the client that does not skip its completion (the last of a closing client).
const CSEND: u64 = 2;
/// A `recv` on the upstream connection: response bytes.
const URECV: u64 = 3;
/// A `send` to the client that posts a completion only when it fails.
const QUIET: u64 = 4;
/// The request's `send` upstream, which posts a completion only when it fails.
const USEND: u64 = 5;

/// Where a client is.
enum Stage {
    /// Reading its next request head.
    Request,
    /// Reading the response: `head` until its head is whole, then `left` body bytes to come.
    Response { head: bool, left: usize },
}

/// One client; boxed, so that the kernel may hold pointers into its buffers.
struct Client {
    fd: RawFd,
    req: [u8; HEAD_MAX],
    req_len: usize,
    /// The request head as it goes upstream.
    fwd: Vec<u8>,
    resp: Box<[u8; BUF]>,
    resp_len: usize,
    /// For a client that asked to close: its response head with `Connection: close`, and the
    /// body bytes read with it.
    out: Vec<u8>,
    up: RawFd,
    /// `up` came from the pool: if it fails before a byte of the response came, the node
    /// closed it while it was idle, and the request goes again on a new connection.
    reused: bool,
    stage: Stage,
    close_after: bool,
}

/// Clients by slot, each slot with a generation so that a completion of an ended chain is
/// known for what it is.
struct Slots {
    clients: Vec<Option<Box<Client>>>,
    gens: Vec<u16>,
    free: Vec<u32>,
}

impl Slots {
    fn add(&mut self, fd: RawFd) -> u32 {
        let c = Box::new(Client {
            fd,
            req: [0; HEAD_MAX],
            req_len: 0,
            fwd: Vec::with_capacity(HEAD_MAX),
            resp: Box::new([0; BUF]),
            resp_len: 0,
            out: Vec::new(),
            up: -1,
            reused: false,
            stage: Stage::Request,
            close_after: false,
        });
        match self.free.pop() {
            Some(i) => {
                self.clients[i as usize] = Some(c);
                i
            }
            None => {
                self.clients.push(Some(c));
                self.gens.push(0);
                (self.clients.len() - 1) as u32
            }
        }
    }

    fn get(&mut self, slot: u32) -> (&mut Client, u16) {
        let gen = self.gens[slot as usize];
        let c = self.clients[slot as usize]
            .as_deref_mut()
            .expect("a live client");
        (c, gen)
    }

    /// A new generation for a live client whose chain ended: completions of the old chain are
    /// then known as such.
    fn renew(&mut self, slot: u32) {
        self.gens[slot as usize] = self.gens[slot as usize].wrapping_add(1);
    }

    fn remove(&mut self, i: u32) -> Option<Box<Client>> {
        let c = self.clients[i as usize].take()?;
        self.gens[i as usize] = self.gens[i as usize].wrapping_add(1);
        self.free.push(i);
        Some(c)
    }
}

fn tag(slot: u32, gen: u16, op: u64) -> u64 {
    (u64::from(slot) << 24) | (u64::from(gen) << 8) | op
}

struct Ring {
    ring: IoUring,
    slots: Slots,
    upstreams: Vec<SocketAddrV4>,
    next: usize,
    pool: Vec<RawFd>,
    /// Where a response's chain of entries is built.
    chain: Vec<squeue::Entry>,
}

impl Ring {
    /// Queue a chain whole, submitting what is queued first if it does not fit.
    fn push(&mut self, entries: &[squeue::Entry]) -> io::Result<()> {
        loop {
            let sq = self.ring.submission();
            if sq.capacity() - sq.len() >= entries.len() {
                break;
            }
            drop(sq);
            self.ring.submit()?;
        }
        // SAFETY: every buffer an entry points at is a boxed client's, and a client is freed
        // only when its chain has ended (a completion it posts, or an earlier entry's failure,
        // after which the kernel runs none of the rest).
        unsafe { self.ring.submission().push_multiple(entries) }
            .map_err(|_| io::Error::other("submission queue full"))
    }

    /// Read the client's next request, or start it if it is already whole.
    fn await_request(&mut self, slot: u32) -> io::Result<()> {
        let (c, gen) = self.slots.get(slot);
        if request(&c.req[..c.req_len]).is_some() {
            return self.start_request(slot);
        }
        if c.req_len == HEAD_MAX {
            self.end(slot);
            return Ok(());
        }
        let spare = &mut c.req[c.req_len..];
        let e = opcode::Recv::new(types::Fd(c.fd), spare.as_mut_ptr(), spare.len() as u32)
            .build()
            .user_data(tag(slot, gen, CRECV));
        self.push(&[e])
    }

    /// An upstream connection from the pool (and `true`), or a new one.
    fn upstream(&mut self) -> Option<(RawFd, bool)> {
        if let Some(up) = self.pool.pop() {
            return Some((up, true));
        }
        let to = self.upstreams[self.next % self.upstreams.len()];
        self.next += 1;
        connect_upstream(to).map(|fd| (fd, false))
    }

    /// Send the whole request head in the client's buffer upstream and read the response.
    fn start_request(&mut self, slot: u32) -> io::Result<()> {
        let Some((up, reused)) = self.upstream() else {
            self.end(slot);
            return Ok(());
        };
        let (c, _) = self.slots.get(slot);
        let (end, close) = request(&c.req[..c.req_len]).expect("a whole head");
        c.fwd.clear();
        without_connection(&c.req[..end], &mut c.fwd);
        c.req.copy_within(end..c.req_len, 0);
        c.req_len -= end;
        c.up = up;
        c.reused = reused;
        c.close_after = close;
        self.send_request(slot)
    }

    /// Send the request in `fwd` on the client's upstream connection, and read the response.
    fn send_request(&mut self, slot: u32) -> io::Result<()> {
        let (c, gen) = self.slots.get(slot);
        c.stage = Stage::Response {
            head: true,
            left: 0,
        };
        c.resp_len = 0;
        let send = opcode::Send::new(types::Fd(c.up), c.fwd.as_ptr(), c.fwd.len() as u32)
            .flags(libc::MSG_NOSIGNAL | libc::MSG_WAITALL)
            .build()
            .flags(squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS)
            .user_data(tag(slot, gen, USEND));
        let recv = opcode::Recv::new(types::Fd(c.up), c.resp.as_mut_ptr(), BUF as u32)
            .build()
            .user_data(tag(slot, gen, URECV));
        self.push(&[send, recv])
    }

    /// The upstream connection failed (`USEND`, or `URECV` with nothing): a pooled one that did
    /// before any of the response came is replaced and the request sent again; else the client
    /// ends.
    fn upstream_failed(&mut self, slot: u32) -> io::Result<()> {
        let (c, _) = self.slots.get(slot);
        let fresh = matches!(c.stage, Stage::Response { head: true, .. }) && c.resp_len == 0;
        if !(c.reused && fresh) {
            self.end(slot);
            return Ok(());
        }
        // SAFETY: this thread's descriptor; its chain ended with this completion.
        unsafe { libc::close(c.up) };
        c.up = -1;
        self.slots.renew(slot);
        let Some((up, reused)) = self.upstream() else {
            self.end(slot);
            return Ok(());
        };
        let (c, _) = self.slots.get(slot);
        c.up = up;
        c.reused = reused;
        self.send_request(slot)
    }

    /// `n` response bytes arrived: pass them on, and read on.
    fn response_bytes(&mut self, slot: u32, n: usize) -> io::Result<()> {
        let (c, gen) = self.slots.get(slot);
        c.resp_len += n;
        let (from, left) = match c.stage {
            Stage::Response { head: true, .. } => {
                let Some((end, len)) = response_head(&c.resp[..c.resp_len]) else {
                    if c.resp_len == BUF {
                        self.end(slot);
                        return Ok(());
                    }
                    let spare = &mut c.resp[c.resp_len..];
                    let e =
                        opcode::Recv::new(types::Fd(c.up), spare.as_mut_ptr(), spare.len() as u32)
                            .build()
                            .user_data(tag(slot, gen, URECV));
                    return self.push(&[e]);
                };
                let have = c.resp_len - end;
                if have > len {
                    // More than the response: not HTTP/1.1 as spoken here.
                    self.end(slot);
                    return Ok(());
                }
                let mut from = 0;
                c.out.clear();
                if c.close_after {
                    c.out.extend_from_slice(&c.resp[..end - 2]);
                    c.out.extend_from_slice(b"Connection: close\r\n\r\n");
                    c.out.extend_from_slice(&c.resp[end..c.resp_len]);
                    from = c.resp_len;
                }
                (from, len - have)
            }
            Stage::Response { head: false, left } => {
                // The previous chain's sends completed before this read ran.
                c.out.clear();
                (0, left - n)
            }
            Stage::Request => unreachable!("response bytes while reading a request"),
        };
        c.stage = Stage::Response { head: false, left };
        // What goes to the client: the rewritten head of a closing client, then the rest.
        let parts = [
            (c.out.as_ptr(), c.out.len()),
            (c.resp[from..].as_ptr(), c.resp_len - from),
        ]
        .into_iter()
        .filter(|p| p.1 > 0);
        let count = parts.clone().count();
        let send = |(ptr, len): (*const u8, usize), quiet: bool| {
            let e = opcode::Send::new(types::Fd(c.fd), ptr, len as u32)
                .flags(libc::MSG_NOSIGNAL | libc::MSG_WAITALL)
                .build();
            if quiet {
                e.flags(squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS)
                    .user_data(tag(slot, gen, QUIET))
            } else {
                // The last entry of its chain, reporting its completion.
                e.user_data(tag(slot, gen, CSEND))
            }
        };
        c.resp_len = 0;
        // The chain is built in a buffer kept for it: no allocation per response.
        let mut chain = std::mem::take(&mut self.chain);
        chain.clear();
        if left > 0 {
            chain.extend(parts.map(|p| send(p, true)));
            let room = BUF.min(left);
            chain.push(
                opcode::Recv::new(types::Fd(c.up), c.resp.as_mut_ptr(), room as u32)
                    .build()
                    .user_data(tag(slot, gen, URECV)),
            );
        } else {
            // Answered: the upstream connection goes back to the pool.
            self.pool.push(std::mem::replace(&mut c.up, -1));
            c.stage = Stage::Request;
            let report = c.close_after || request(&c.req[..c.req_len]).is_some();
            chain.extend(
                parts
                    .enumerate()
                    .map(|(i, p)| send(p, !(report && i == count - 1))),
            );
            if !report {
                let spare = &mut c.req[c.req_len..];
                chain.push(
                    opcode::Recv::new(types::Fd(c.fd), spare.as_mut_ptr(), spare.len() as u32)
                        .build()
                        .user_data(tag(slot, gen, CRECV)),
                );
            }
        }
        let pushed = self.push(&chain);
        self.chain = chain;
        pushed
    }

    /// Close the client and the upstream connection it holds.
    fn end(&mut self, slot: u32) {
        if let Some(c) = self.slots.remove(slot) {
            // SAFETY: descriptors this thread owns; nothing of the client's chain is left in
            // the kernel (the caller saw its last completion or its failure).
            unsafe {
                if c.up >= 0 {
                    libc::close(c.up);
                }
                libc::close(c.fd);
            }
        }
    }

    fn accept(&mut self, l: RawFd) -> io::Result<()> {
        let e = opcode::AcceptMulti::new(types::Fd(l))
            .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
            .build()
            .user_data(ACCEPT);
        self.push(&[e])
    }
}

/// Run the relay on listener `l` until an error: `hold` is (completions to wait for, the most
/// microseconds to wait for them after the first).
pub fn run(l: RawFd, upstreams: Vec<SocketAddrV4>, hold: (usize, u32)) -> io::Result<()> {
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(8192)
        .build(4096)?;
    let mut r = Ring {
        ring,
        slots: Slots {
            clients: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
        },
        upstreams,
        next: 0,
        pool: Vec::new(),
        chain: Vec::with_capacity(3),
    };
    let mut done: Vec<(u64, i32, u32)> = Vec::with_capacity(1024);
    r.accept(l)?;
    loop {
        let live = r.slots.clients.len() - r.slots.free.len();
        if !wait_and_reap(&mut r.ring, hold, live, &mut done)? {
            continue;
        }
        for &(ud, res, flags) in &done {
            let op = ud & 0xff;
            if op == ACCEPT {
                if res >= 0 {
                    let slot = r.slots.add(res);
                    r.await_request(slot)?;
                }
                if !io_uring::cqueue::more(flags) {
                    r.accept(l)?;
                }
                continue;
            }
            let slot = (ud >> 24) as u32;
            let gen = (ud >> 8) as u16;
            if r.slots.gens.get(slot as usize) != Some(&gen)
                || r.slots.clients[slot as usize].is_none()
            {
                continue; // a completion of a chain already ended
            }
            match op {
                CRECV if res > 0 => {
                    let (c, _) = r.slots.get(slot);
                    c.req_len += res as usize;
                    r.await_request(slot)?;
                }
                URECV if res > 0 => r.response_bytes(slot, res as usize)?,
                USEND | URECV => r.upstream_failed(slot)?,
                CSEND if res > 0 => {
                    let (c, _) = r.slots.get(slot);
                    if c.close_after {
                        r.end(slot);
                    } else {
                        r.start_request(slot)?;
                    }
                }
                // A failed or ended read, a failed send.
                _ => r.end(slot),
            }
        }
    }
}
