//! Moving response bodies from a peer's connection straight to a client's connection.
//!
//! Two ways: a copy loop through a user-space buffer, and splice(2) through a pipe, which moves
//! page references instead of bytes (peer socket → pipe → client socket) and so never copies the
//! body into the process. Pipes are kept in a small pool, since creating one costs three system
//! calls; a pipe is only returned to the pool empty.
//!
//! Which one pays was measured with `bench/switch-vs-haproxy` (its last table): 100 KiB
//! responses over keep-alive connections, two nodes, LARD, 2 cores shared with the load
//! generator and the nodes. Splice won every time: 6,374 against 5,318 req/s (p99 27 against
//! 30 ms, medians of 3 rounds), and 9,061 against 4,891 req/s in a shorter run. Splice is
//! therefore used by the switch for every body with at least `splice_min_bytes` (default 64 KiB)
//! still to come after the first read from the node (see [`crate::Direct`]); smaller remainders
//! are one `read` and one `write` either way and stay with the copy loop.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::fcntl::{splice, OFlag, SpliceFFlags};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use switchyard_runtime::socket::write_now;
use switchyard_runtime::ClientSocket;

use crate::{Deadline, Error};

/// Size asked for each pipe (the kernel's default is 64 KiB).
const PIPE_SIZE: usize = 256 * 1024;
/// Pipes kept for reuse.
const POOL_MAX: usize = 256;

static PIPES: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());

/// A pipe for splicing; empty when it is in the pool.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    cap: usize,
}

impl Pipe {
    fn get() -> io::Result<Pipe> {
        if let Some(p) = PIPES.lock().pop() {
            return Ok(p);
        }
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let cap = nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32))
            .map_or(64 * 1024, |n| n as usize);
        Ok(Pipe { r, w, cap })
    }

    fn put(self) {
        let mut pool = PIPES.lock();
        if pool.len() < POOL_MAX {
            pool.push(self);
        }
    }
}

fn timed_out() -> io::Error {
    io::ErrorKind::TimedOut.into()
}

/// Move exactly `len` bytes from `from` to `to` with splice(2). Returns when all moved, with
/// the number of bytes spliced: all of them, or none when no pipe could be had (out of
/// descriptors: the bytes are then copied instead, so a local shortage never fails a
/// response). Each wait for the peer ends at `peer.next()`, each wait for the client after
/// `client`.
pub async fn splice_exact(
    from: &mut TcpStream,
    to: &TcpStream,
    len: u64,
    peer: Deadline,
    client: Duration,
) -> Result<u64, Error> {
    let pipe = match Pipe::get() {
        Ok(p) => p,
        Err(_) => {
            copy(from, to, Some(len), &mut Vec::new(), peer, client).await?;
            return Ok(0);
        }
    };
    splice_through(pipe, from, to, len, peer, client).await?;
    Ok(len)
}

async fn splice_through(
    pipe: Pipe,
    from: &TcpStream,
    to: &TcpStream,
    mut len: u64,
    peer: Deadline,
    client: Duration,
) -> Result<(), Error> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    while len > 0 {
        // Fill the (empty) pipe from the node.
        let want = len.min(pipe.cap as u64) as usize;
        let until = peer.next();
        let n = loop {
            match from.try_io(Interest::READABLE, || {
                splice(from.as_fd(), None, pipe.w.as_fd(), None, want, flags)
                    .map_err(io::Error::from)
            }) {
                Ok(0) => {
                    return Err(Error::Truncated);
                }
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match timeout_at(until, from.readable()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Err(Error::Read(e)),
                        Err(_) => return Err(Error::TimedOut),
                    }
                }
                Err(e) => return Err(Error::Read(e)),
            }
        };
        // Drain it to the client.
        let mut left = n;
        let until = Instant::now() + client;
        while left > 0 {
            match to.try_io(Interest::WRITABLE, || {
                splice(pipe.r.as_fd(), None, to.as_fd(), None, left, flags).map_err(io::Error::from)
            }) {
                Ok(0) => return Err(Error::Client(io::ErrorKind::WriteZero.into())),
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match timeout_at(until, to.writable()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Err(Error::Client(e)),
                        Err(_) => return Err(Error::Client(timed_out())),
                    }
                }
                Err(e) => return Err(Error::Client(e)),
            }
        }
        len -= n as u64;
    }
    pipe.put();
    Ok(())
}

/// Move exactly `len` bytes (or, with `None`, everything until the peer closes) from `from` to
/// `to` through `buf`. Returns the bytes moved. Each read from the peer ends at `peer.next()`,
/// each write to the client waits at most `client`.
pub async fn copy(
    from: &mut TcpStream,
    to: &TcpStream,
    len: Option<u64>,
    buf: &mut Vec<u8>,
    peer: Deadline,
    client: Duration,
) -> Result<u64, Error> {
    const ROOM: usize = 64 * 1024;
    let mut moved = 0u64;
    loop {
        let want = match len {
            Some(l) if moved >= l => return Ok(moved),
            Some(l) => (l - moved).min(ROOM as u64) as usize,
            None => ROOM,
        };
        // Into the buffer's spare room, which is not zeroed first.
        buf.clear();
        buf.reserve(want);
        let mut room = bytes::BufMut::limit(&mut *buf, want);
        let n = match timeout_at(peer.next(), from.read_buf(&mut room)).await {
            Ok(Ok(0)) if len.is_none() => return Ok(moved),
            Ok(Ok(0)) => return Err(Error::Truncated),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(Error::Read(e)),
            Err(_) => return Err(Error::TimedOut),
        };
        write_all(to, &buf[..n], client)
            .await
            .map_err(Error::Client)?;
        moved += n as u64;
    }
}

/// Send `parts`, in order, on `to` with `MSG_NOSIGNAL` (a closed peer is an error, not a
/// signal), plus `MSG_MORE` with `more`: `send(2)` for one part, `sendmsg(2)` gathering them
/// for several, so a response head and a body kept elsewhere leave in one call with no copy
/// joining them.
fn send_flags(to: BorrowedFd<'_>, parts: &[IoSlice<'_>], more: bool) -> io::Result<usize> {
    use nix::sys::socket::{send, sendmsg, MsgFlags};
    let mut flags = MsgFlags::MSG_NOSIGNAL;
    if more {
        // nix names no MSG_MORE; the bit is libc's.
        flags |= MsgFlags::from_bits_retain(libc::MSG_MORE);
    }
    match parts {
        [one] => send(to.as_raw_fd(), one, flags),
        _ => sendmsg::<()>(to.as_raw_fd(), parts, &[], flags, None),
    }
    .map_err(io::Error::from)
}

/// Write all of `data` to `to`, waiting at most `limit` from the first time it finds no room. The
/// first write is tried at once ([`write_now`]).
pub async fn write_all(to: &TcpStream, data: &[u8], limit: Duration) -> io::Result<()> {
    send_all(to, data, false, limit).await.1
}

/// How long a send may wait for its peer to take the bytes: until an instant, or for a
/// duration counted from the send's first wait, so that a send that never waits (the common
/// one) never reads the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendLimit {
    /// Done by this instant.
    By(Instant),
    /// Done this long after the send first finds no room.
    Within(Duration),
}

impl SendLimit {
    fn deadline(self) -> Instant {
        match self {
            SendLimit::By(t) => t,
            SendLimit::Within(d) => Instant::now() + d,
        }
    }
}

impl From<Instant> for SendLimit {
    fn from(t: Instant) -> Self {
        SendLimit::By(t)
    }
}

impl From<Duration> for SendLimit {
    fn from(d: Duration) -> Self {
        SendLimit::Within(d)
    }
}

/// Send all of `data` to a client (with `MSG_MORE` when `more`), registering its socket with
/// the event loop only if it must wait for room ([`ClientSocket`]): a response that fits in the
/// send buffer leaves a bare socket bare. Returns what [`send_all`] returns.
pub async fn send_to_client(
    to: &mut ClientSocket,
    data: &[u8],
    more: bool,
    limit: impl Into<SendLimit>,
) -> (usize, io::Result<()>) {
    send_to_client_or_wait(to, &[data], more, limit, || {}).await
}

/// Body bytes below this many are copied behind their head rather than sent as a part of their
/// own in a gathered send ([`send_to_client_or_wait`]): at a few KiB the copy saves little, and
/// a small response then leaves in a `send` of one buffer, not a `sendmsg` of two. The node's
/// cached bodies and the relay's bodies read with their head draw the line here.
pub const GATHER_MIN: usize = 4 * 1024;

/// [`send_to_client`] of `parts` gathered in order (a head and a body kept apart leave in one
/// system call), calling `waits` once before the send may wait for its client: a send that
/// finishes at once never calls it. Returns the bytes sent, of all parts.
///
/// The first send is tried here; what must wait for the client goes on in a future of its own,
/// boxed (`send_rest`). Every response the switch relays and many a node answers pass through
/// here, inside their callers' futures: inline, the waiting state (timers, readiness, the
/// parts left) took 624 bytes of each, which the switch's per-request handler copied into its
/// allocation on every request. A send that waits costs an allocation, small beside the wait.
pub async fn send_to_client_or_wait(
    to: &mut ClientSocket,
    parts: &[&[u8]],
    more: bool,
    limit: impl Into<SendLimit>,
    waits: impl FnOnce(),
) -> (usize, io::Result<()>) {
    let mut slices = Slices::new(parts);
    if slices.is_empty() {
        // (No system call, and no registration, for nothing.)
        return (0, Ok(()));
    }
    match to.now(Interest::WRITABLE, |fd| send_flags(fd, slices.get(), more)) {
        Ok(n) => {
            slices.advance(n);
            if slices.is_empty() {
                return (slices.done, Ok(()));
            }
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return (0, Err(e)),
    }
    waits();
    Box::pin(send_rest(to, slices, more, limit.into())).await
}

/// What [`send_to_client_or_wait`] could not send at once: registers the socket if it is bare,
/// waits for room (the send buffer is full), then sends the rest.
async fn send_rest(
    to: &mut ClientSocket,
    mut slices: Slices<'_>,
    more: bool,
    limit: SendLimit,
) -> (usize, io::Result<()>) {
    let to = match to.registered() {
        Ok(s) => &*s,
        Err(e) => return (slices.done, Err(e)),
    };
    let until = limit.deadline();
    match timeout_at(until, to.writable()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return (slices.done, Err(e)),
        Err(_) => return (slices.done, Err(timed_out())),
    }
    let r = send_slices(to, &mut slices, more, SendLimit::By(until)).await;
    (slices.done, r)
}

/// Send all of `data` on `to` (with `MSG_MORE` when `more`), each write tried at once
/// ([`write_now`]), waiting for room within `limit`. Returns the bytes that went out and how
/// it ended: a wait past the limit is `ErrorKind::TimedOut`.
pub async fn send_all(
    to: &TcpStream,
    data: &[u8],
    more: bool,
    limit: impl Into<SendLimit>,
) -> (usize, io::Result<()>) {
    let mut slices = Slices::new(&[data]);
    let r = send_slices(to, &mut slices, more, limit.into()).await;
    (slices.done, r)
}

async fn send_slices(
    to: &TcpStream,
    slices: &mut Slices<'_>,
    more: bool,
    limit: SendLimit,
) -> io::Result<()> {
    // Read from the clock at the first wait only.
    let mut until = None;
    while !slices.is_empty() {
        match write_now(to, || send_flags(to.as_fd(), slices.get(), more)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => slices.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let until = *until.get_or_insert_with(|| limit.deadline());
                match timeout_at(until, to.writable()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(timed_out()),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What is left to send of a few byte slices, and how much has gone. Two parts (a head and a
/// body) are all the callers gather; more would be sent in turns of [`Slices::MAX`].
struct Slices<'a> {
    buf: [IoSlice<'a>; Slices::MAX],
    /// `buf[start..len]` is left to send.
    start: usize,
    len: usize,
    done: usize,
}

impl<'a> Slices<'a> {
    const MAX: usize = 4;

    fn new(parts: &[&'a [u8]]) -> Slices<'a> {
        assert!(parts.len() <= Self::MAX, "at most {} parts", Self::MAX);
        let mut buf = [IoSlice::new(&[]); Self::MAX];
        let mut len = 0;
        for p in parts.iter().filter(|p| !p.is_empty()) {
            buf[len] = IoSlice::new(p);
            len += 1;
        }
        Slices {
            buf,
            start: 0,
            len,
            done: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.start == self.len
    }

    fn get(&self) -> &[IoSlice<'a>] {
        &self.buf[self.start..self.len]
    }

    /// Drop the first `n` bytes left.
    fn advance(&mut self, n: usize) {
        self.done += n;
        let mut rest: &mut [IoSlice<'a>] = &mut self.buf[self.start..self.len];
        IoSlice::advance_slices(&mut rest, n);
        self.start = self.len - rest.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pair;
    use tokio::io::AsyncWriteExt;

    const PEER: Deadline = Deadline::Each(Duration::from_secs(5));
    const CLIENT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn splice_and_copy_move_exact_bytes() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        for use_splice in [true, false] {
            let (mut node_w, node_r) = pair().await;
            let (client_w, mut client_r) = pair().await;
            let mut node_r = node_r;
            let total = data.len() as u64;
            let sent = data.clone();
            let writer = tokio::spawn(async move {
                node_w.write_all(&sent).await.unwrap();
                node_w.write_all(b"NEXT").await.unwrap();
                node_w
            });
            let reader = tokio::spawn(async move {
                let mut got = vec![0u8; total as usize];
                client_r.read_exact(&mut got).await.unwrap();
                got
            });
            if use_splice {
                splice_exact(&mut node_r, &client_w, total, PEER, CLIENT)
                    .await
                    .unwrap();
            } else {
                let mut buf = Vec::new();
                let n = copy(&mut node_r, &client_w, Some(total), &mut buf, PEER, CLIENT)
                    .await
                    .unwrap();
                assert_eq!(n, total);
            }
            assert_eq!(reader.await.unwrap(), data);
            // Nothing beyond the body was taken from the node connection.
            let _w = writer.await.unwrap();
            let mut next = [0u8; 4];
            node_r.read_exact(&mut next).await.unwrap();
            assert_eq!(&next, b"NEXT");
        }
    }

    #[tokio::test]
    async fn early_close_is_a_peer_error() {
        let (mut node_w, mut node_r) = pair().await;
        let (client_w, _client_r) = pair().await;
        node_w.write_all(b"abc").await.unwrap();
        drop(node_w);
        let r = splice_exact(&mut node_r, &client_w, 10, PEER, CLIENT).await;
        assert!(matches!(r, Err(Error::Truncated)), "{r:?}");
    }

    /// A client socket as the accept loop gives it: bare.
    async fn bare_client() -> (ClientSocket, TcpStream) {
        let l = switchyard_runtime::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (s, client)
    }

    /// A response that fits in the send buffer leaves a bare socket bare; nothing to send is
    /// no call at all; one that does not fit registers the socket, waits for the client to
    /// read, and arrives whole.
    #[tokio::test]
    async fn a_client_socket_is_registered_only_when_a_send_must_wait() {
        let until = || Instant::now() + Duration::from_secs(5);
        let (mut s, mut client) = bare_client().await;
        assert_eq!(send_to_client(&mut s, b"", false, until()).await.0, 0);
        let (n, r) = send_to_client(&mut s, b"small answer", false, until()).await;
        assert_eq!((n, r.is_ok()), (12, true));
        assert!(
            !s.is_registered(),
            "a send that fit made the event loop know the socket"
        );
        let mut got = [0u8; 12];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"small answer");

        let big: Vec<u8> = (0..8_000_000u32).map(|i| (i % 251) as u8).collect();
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            client.read_to_end(&mut all).await.unwrap();
            all
        });
        let (n, r) = send_to_client(&mut s, &big, true, until()).await;
        r.unwrap();
        assert_eq!(n, big.len());
        assert!(s.is_registered(), "8 MB cannot leave without a wait");
        drop(s);
        assert!(reader.await.unwrap() == big, "the bytes arrived changed");
    }

    /// A send limited `Within` a duration gives up that long after it first finds no room,
    /// one limited `By` an instant gives up then (tokio's paused clock: the client never
    /// reads, and time moves only while the sends wait).
    #[tokio::test(start_paused = true)]
    async fn a_send_gives_up_at_its_limit() {
        let (mut s, _client) = bare_client().await;
        let big = vec![7u8; 64 << 20];
        let about = |got: Duration, want: Duration| {
            assert!(
                got >= want && got <= want + Duration::from_millis(2),
                "{got:?} is not {want:?}"
            );
        };
        let start = Instant::now();
        let (n, r) = send_to_client(&mut s, &big, false, Duration::from_secs(3)).await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(n > 0 && n < big.len(), "{n}");
        about(start.elapsed(), Duration::from_secs(3));
        let start = Instant::now();
        let (n, r) = send_to_client(&mut s, &big, false, start + Duration::from_secs(2)).await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(n, 0);
        about(start.elapsed(), Duration::from_secs(2));
    }

    /// What is left after any number of bytes is the rest of the parts joined, whatever
    /// their lengths (empty parts included), and the count of what went is exact.
    #[test]
    fn slices_advance_through_parts() {
        let parts: [&[u8]; 4] = [b"abc", b"", b"defgh", b"i"];
        let joined = parts.concat();
        for n in 0..=joined.len() {
            // One advance of n, and the same in single bytes.
            for steps in [vec![n], vec![1; n]] {
                let mut s = Slices::new(&parts);
                for k in steps {
                    s.advance(k);
                }
                let rest: Vec<u8> = s.get().iter().flat_map(|p| p.iter().copied()).collect();
                assert_eq!(rest, &joined[n..], "after {n} bytes");
                assert_eq!((s.done, s.is_empty()), (n, n == joined.len()));
            }
        }
    }

    /// A head and a body sent as two parts arrive joined and whole: in one call when they fit
    /// (the socket stays bare), and across waits for a client that reads slowly when they do
    /// not, with `waits` called once, before the first wait.
    #[tokio::test]
    async fn gathered_parts_arrive_joined_and_whole() {
        let until = || Instant::now() + Duration::from_secs(5);
        let (mut s, mut client) = bare_client().await;
        let mut waited = 0;
        let (n, r) =
            send_to_client_or_wait(&mut s, &[b"head:", b"", b"body"], false, until(), || {
                waited += 1
            })
            .await;
        assert_eq!((n, r.is_ok(), waited), (9, true, 0));
        assert!(!s.is_registered(), "a send that fit registered the socket");
        let mut got = [0u8; 9];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"head:body");

        let head: Vec<u8> = (0..3_000_000u32).map(|i| (i % 241) as u8).collect();
        let body: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                // Slowly: the sender must wait, and resume mid-part.
                match client.read(&mut buf).await.unwrap() {
                    0 => return all,
                    n => all.extend_from_slice(&buf[..n]),
                }
                tokio::task::yield_now().await;
            }
        });
        let (n, r) =
            send_to_client_or_wait(&mut s, &[&head, &body], false, until(), || waited += 1).await;
        r.unwrap();
        assert_eq!((n, waited), (head.len() + body.len(), 1));
        drop(s);
        let all = reader.await.unwrap();
        assert!(all == [head, body].concat(), "the bytes arrived changed");
    }
}
