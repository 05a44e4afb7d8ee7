//! Relaying a response body from a peer to a client.
//!
//! The body is delimited as the response head said ([`BodyLength`]): by `Content-Length`, by
//! chunked coding (checked with the strict decoder of [`switchyard_http::chunked`] and passed on
//! as received), or by the peer's close. Bytes go through the client's pending buffer, written
//! whenever it reaches [`RelayOptions::flush_at`] (a `Content-Length` body is read straight
//! onto it, never past its end but for the one byte more that the read ending it asks for,
//! which stays with the connection; one that leaves whole with the head at the relay's end keeps
//! the bytes read with the head in the connection's buffer and sends them between the head and
//! the rest, [`Client::write_pending_around`]); with [`Direct`] set, what remains of a
//! `Content-Length` body after the first read moves straight to the client's socket instead
//! when it is at least [`Direct::splice_min`] bytes, by splice(2) ([`crate::splice`]), and so
//! does what follows the first read of an until-close body, copied.
//!
//! The connection can go back to the pool when the peer keeps it open, the body was read to its
//! end and nothing beyond it arrived.

use std::future::Future;
use std::io;
use std::time::Duration;

use bytes::Buf;
use tokio::net::TcpStream;

use switchyard_http::chunked::ChunkedDecoder;
use switchyard_http::upstream::BodyLength;

use crate::splice::{self, GATHER_MIN};
use crate::{Connection, Deadline, Error, READ_SIZE};

/// The client side of a relay: a buffer of bytes waiting for the client, and its socket.
pub trait Client {
    /// Bytes waiting to be written to the client; relayed bytes are appended here.
    fn pending(&mut self) -> &mut Vec<u8>;
    /// Write everything pending to the client.
    fn write_pending(&mut self) -> impl Future<Output = io::Result<()>>;
    /// The client's socket, for moving bytes straight to it ([`Direct`]); registered with the
    /// event loop, since the moves wait on it.
    fn socket(&mut self) -> io::Result<&TcpStream>;
    /// Write the pending bytes with `middle` between their first `at` bytes and the rest, as
    /// [`Client::write_pending`] does: for body bytes left where they were read. A client that
    /// gathers parts into one write sends them without copying; this default copies `middle`
    /// in.
    fn write_pending_around(
        &mut self,
        at: usize,
        middle: &[u8],
    ) -> impl Future<Output = io::Result<()>> {
        self.pending().splice(at..at, middle.iter().copied());
        self.write_pending()
    }
}

/// Moving large remainders straight to the client's socket.
#[derive(Clone, Copy, Debug)]
pub struct Direct {
    /// Longest wait for the client to take more.
    pub client_wait: Duration,
    /// `Content-Length` remainders of at least this many bytes are spliced; 0 never splices.
    pub splice_min: u64,
}

/// How to relay a body.
#[derive(Clone, Copy, Debug)]
pub struct RelayOptions {
    /// Waits for the peer.
    pub deadline: Deadline,
    /// Write the pending bytes when they reach this many.
    pub flush_at: usize,
    /// Write the pending bytes at the end (else the caller writes them later).
    pub flush_end: bool,
    /// Move large remainders straight to the client's socket.
    pub direct: Option<Direct>,
}

impl RelayOptions {
    /// Body bytes that [`relay_body`] puts in the client's pending bytes before their first
    /// write, for a response framed by `body` of which `buffered` bytes were read with its
    /// head: of a `Content-Length` body read whole (in direct mode, not spliced, its remainder
    /// at most `WHOLE_MAX`) the remainder when what was read with the head stays where it is
    /// (the relay writes at its end and at least `GATHER_MIN` came with the head,
    /// [`Client::write_pending_around`]) and all of it when it does not, else what was read
    /// with the head (at most `flush_at` of it counted, for bodies that go out in pieces).
    ///
    /// The caller gives the pending bytes room for the head and this much before it writes the
    /// head: grown as they came, they were reallocated once or twice per response with the
    /// allocation's whole old size copied (callgrind, 16 KiB bodies: 1.8 reallocations of
    /// about 10 KB each per response), and grew past what a thread keeps for the next request
    /// ([`switchyard_runtime::spare`]).
    pub fn pending_room(&self, body: BodyLength, buffered: usize) -> usize {
        match body {
            BodyLength::Length(n) => {
                let take = (buffered as u64).min(n);
                let left = n - take;
                if self.gathers(take as usize, left) {
                    left as usize
                } else if self.whole(left) {
                    n as usize
                } else {
                    take as usize
                }
            }
            BodyLength::None => 0,
            BodyLength::Chunked | BodyLength::UntilClose => buffered.min(self.flush_at),
        }
    }

    /// The direct mode when a `Content-Length` remainder of `left` bytes (after the first
    /// read) moves straight to the client's socket by splice(2).
    fn splices(&self, left: u64) -> Option<Direct> {
        self.direct
            .filter(|d| d.splice_min > 0 && left >= d.splice_min)
    }

    /// Whether a `Content-Length` remainder of `left` bytes (after the first read) is read
    /// whole, to leave with the head in one write: in direct mode, when it is not spliced and
    /// at most `WHOLE_MAX`.
    fn whole(&self, left: u64) -> bool {
        self.direct.is_some() && self.splices(left).is_none() && left <= WHOLE_MAX
    }

    /// Whether a `Content-Length` body of which `take` bytes came with the head and `left` are
    /// still to come leaves with the head at the relay's end with those `take` bytes where
    /// they were read ([`Client::write_pending_around`]): read whole, written at the end, and
    /// at least `GATHER_MIN` of them.
    fn gathers(&self, take: usize, left: u64) -> bool {
        self.flush_end && self.whole(left) && take >= GATHER_MIN
    }
}

/// What a completed relay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Relayed {
    /// Body bytes relayed, as on the wire (chunked coding included).
    pub body: u64,
    /// Of these, bytes moved with splice(2).
    pub spliced: u64,
    /// The connection can go back to the pool.
    pub reusable: bool,
}

/// A relay that broke off.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct RelayFailed {
    /// What failed ([`Error::Client`] for the client's side).
    #[source]
    pub error: Error,
    /// Bytes handed to splice(2) before the failure.
    pub spliced: u64,
}

impl From<Error> for RelayFailed {
    fn from(error: Error) -> Self {
        RelayFailed { error, spliced: 0 }
    }
}

/// Largest remainder of a `Content-Length` body read whole onto the pending bytes in direct
/// mode (every one under the default splice threshold, 64 KiB, is): with the first read, it
/// bounds what a relayed response holds in memory when its body is not spliced.
const WHOLE_MAX: u64 = 128 * 1024;

async fn write<C: Client>(client: &mut C) -> Result<(), Error> {
    client.write_pending().await.map_err(Error::Client)
}

/// Read at most `max` bytes of a body, of which `left` are still to come, from the peer onto
/// the end of `dst`; the peer's close is [`Error::Truncated`]. The read that may end the body
/// asks for a byte more ([`Connection::read_into`]): a byte past the body stays in the
/// connection's buffer.
async fn read_into(
    conn: &mut Connection,
    dst: &mut Vec<u8>,
    max: usize,
    left: u64,
    deadline: Deadline,
) -> Result<usize, Error> {
    let last = max as u64 == left;
    peer_read(conn.read_into(dst, max, last, deadline.next()).await)
}

/// Read more from the peer; the peer's close is [`Error::Truncated`].
async fn read_more(conn: &mut Connection, deadline: Deadline) -> Result<(), Error> {
    peer_read(conn.read_more(deadline.next()).await).map(|_| ())
}

/// A read from the peer within a body, as the relay's error: its close (0 bytes) cuts the body
/// short.
fn peer_read(r: io::Result<usize>) -> Result<usize, Error> {
    match r {
        Ok(0) => Err(Error::Truncated),
        Ok(n) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(Error::TimedOut),
        Err(e) => Err(Error::Read(e)),
    }
}

/// Relay the body of a response whose head was read by [`crate::exchange()`] (its framing
/// `body`, and `keep_alive` as the peer said) from `conn` to `client`.
pub async fn relay_body<C: Client>(
    conn: &mut Connection,
    body: BodyLength,
    keep_alive: bool,
    client: &mut C,
    opts: RelayOptions,
) -> Result<Relayed, RelayFailed> {
    let mut done = Relayed::default();
    match body {
        BodyLength::None => {}
        BodyLength::Length(n) => {
            let take = (conn.buf.len() as u64).min(n) as usize;
            // Room for what joins the head before the first write, at once (see `pending_room`).
            client.pending().reserve(opts.pending_room(body, take));
            if opts.gathers(take, n - take as u64) {
                return relay_whole(conn, n, take, keep_alive, client, opts).await;
            }
            client.pending().extend_from_slice(&conn.buf[..take]);
            conn.buf.advance(take);
            let mut left = n - take as u64;
            // A remainder this large after the first read moves straight to the client's
            // socket; a smaller one is read onto the pending bytes, which go out in writes of
            // `flush_at` or, in direct mode and up to `WHOLE_MAX`, in one write with the head.
            if let Some(d) = opts.splices(left) {
                write(client).await?;
                let spliced = left;
                // Boxed, as the copy below: a large body moves seldom and long enough that an
                // allocation is nothing beside it, and inline its state would weigh on the
                // future of every response relayed.
                done.spliced = Box::pin(splice::splice_exact(
                    &mut conn.stream,
                    client.socket().map_err(Error::Client)?,
                    left,
                    opts.deadline,
                    d.client_wait,
                ))
                .await
                .map_err(|error| RelayFailed { error, spliced })?;
                left = 0;
            }
            let whole = opts.whole(left);
            while left > 0 {
                if !whole && client.pending().len() >= opts.flush_at {
                    write(client).await?;
                }
                let pending = client.pending();
                // Never past the body (but for the byte more that `read_into` asks for at its
                // end, which stays with the connection): what follows it is not the client's.
                let want = if whole {
                    left as usize
                } else {
                    // Up to what fills the pending bytes to `flush_at`, at least a usual read.
                    let room = opts.flush_at.saturating_sub(pending.len()).max(READ_SIZE);
                    left.min(room as u64) as usize
                };
                left -= read_into(conn, pending, want, left, opts.deadline).await? as u64;
            }
            done.body = n;
        }
        BodyLength::Chunked => {
            let mut dec = ChunkedDecoder::new();
            loop {
                let used = dec.decode(&conn.buf, |_| {}).map_err(Error::from)?;
                client.pending().extend_from_slice(&conn.buf[..used]);
                conn.buf.advance(used);
                done.body += used as u64;
                if dec.is_done() {
                    break;
                }
                if client.pending().len() >= opts.flush_at {
                    write(client).await?;
                }
                read_more(conn, opts.deadline).await?;
            }
        }
        BodyLength::UntilClose => {
            let have = conn.buf.len();
            client.pending().extend_from_slice(&conn.buf);
            conn.buf.clear();
            done.body = have as u64;
            if let Some(d) = opts.direct {
                write(client).await?;
                let mut scratch = Vec::new();
                done.body += Box::pin(splice::copy(
                    &mut conn.stream,
                    client.socket().map_err(Error::Client)?,
                    None,
                    &mut scratch,
                    opts.deadline,
                    d.client_wait,
                ))
                .await?;
            } else {
                loop {
                    if client.pending().len() >= opts.flush_at {
                        write(client).await?;
                    }
                    match read_more(conn, opts.deadline).await {
                        Err(Error::Truncated) => break,
                        Err(e) => return Err(e.into()),
                        Ok(()) => {}
                    }
                    done.body += conn.buf.len() as u64;
                    client.pending().extend_from_slice(&conn.buf);
                    conn.buf.clear();
                }
            }
        }
    }
    if opts.flush_end {
        write(client).await?;
    }
    done.reusable = keep_alive && body != BodyLength::UntilClose && conn.buf.is_empty();
    Ok(done)
}

/// A `Content-Length` body of `n` bytes read whole, `take` of them (at least `GATHER_MIN`)
/// with its head, to leave with the pending head in one write. What was read with the head
/// stays in the connection's buffer and goes between the head and the rest, which is read onto
/// the head's bytes: a response passes through the relay without a copy of its body (at 16 KiB
/// the copy was half of the relay's instructions per response).
async fn relay_whole<C: Client>(
    conn: &mut Connection,
    n: u64,
    take: usize,
    keep_alive: bool,
    client: &mut C,
    opts: RelayOptions,
) -> Result<Relayed, RelayFailed> {
    // Held apart while the rest is read past it, onto the pending bytes.
    let mut first = std::mem::take(&mut conn.buf);
    let at = client.pending().len();
    let mut left = n - take as u64;
    while left > 0 {
        let want = left as usize;
        left -= read_into(conn, client.pending(), want, left, opts.deadline).await? as u64;
    }
    let written = client.write_pending_around(at, &first[..take]).await;
    first.advance(take);
    // A byte read past the body (above) joins what came past it with the head, if any.
    first.extend_from_slice(&conn.buf);
    conn.buf = first;
    written.map_err(Error::Client)?;
    Ok(Relayed {
        body: n,
        spliced: 0,
        reusable: keep_alive && conn.buf.is_empty(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pair;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client writing straight to its socket.
    struct Sink {
        out: Vec<u8>,
        stream: TcpStream,
        writes: usize,
        /// The middle of each write of the pending bytes around a part kept apart.
        around: Vec<usize>,
    }

    impl Sink {
        /// A client on `stream` with `out` pending.
        fn new(stream: TcpStream, out: &[u8]) -> Sink {
            Sink {
                out: out.to_vec(),
                stream,
                writes: 0,
                around: Vec::new(),
            }
        }
    }

    impl Client for Sink {
        fn pending(&mut self) -> &mut Vec<u8> {
            &mut self.out
        }
        async fn write_pending(&mut self) -> io::Result<()> {
            self.writes += 1;
            let r = splice::write_all(&self.stream, &self.out, Duration::from_secs(5)).await;
            self.out.clear();
            r
        }
        fn socket(&mut self) -> io::Result<&TcpStream> {
            Ok(&self.stream)
        }
        async fn write_pending_around(&mut self, at: usize, middle: &[u8]) -> io::Result<()> {
            self.writes += 1;
            self.around.push(middle.len());
            let limit = Duration::from_secs(5);
            for part in [&self.out[..at], middle, &self.out[at..]] {
                splice::write_all(&self.stream, part, limit).await?;
            }
            self.out.clear();
            Ok(())
        }
    }

    const WAIT: Deadline = Deadline::Each(Duration::from_secs(5));

    fn opts(direct: Option<Direct>) -> RelayOptions {
        RelayOptions {
            deadline: WAIT,
            flush_at: 64 * 1024,
            flush_end: true,
            direct,
        }
    }

    const DIRECT: Direct = Direct {
        client_wait: Duration::from_secs(5),
        splice_min: 64 * 1024,
    };

    /// Relay `wire` (sent by the peer, then `after` sent too and the peer's side closed when
    /// `close`) as `body`; returns the result, what the client got, and what is left in the
    /// connection's buffer.
    async fn run(
        wire: Vec<u8>,
        after: &'static [u8],
        close: bool,
        body: BodyLength,
        opts: RelayOptions,
    ) -> (Result<Relayed, RelayFailed>, Vec<u8>) {
        let (peer_side, mut peer) = pair().await;
        let (client_side, mut client_r) = pair().await;
        let mut conn = Connection::new(peer_side, "127.0.0.1:1".parse().unwrap(), false);
        // The first bytes arrive with the head, as after an exchange.
        let first = wire.len().min(100);
        conn.buf.extend_from_slice(&wire[..first]);
        let writer = tokio::spawn(async move {
            peer.write_all(&wire[first..]).await.unwrap();
            peer.write_all(after).await.unwrap();
            if !close {
                // Keep the peer's side open until the relay is over.
                let mut b = [0u8; 1];
                let _ = peer.read(&mut b).await;
            }
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client_r.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut sink = Sink::new(client_side, &[]);
        let r = relay_body(&mut conn, body, true, &mut sink, opts).await;
        drop(sink);
        if r.is_ok() && !after.is_empty() && !close {
            // What follows the body was not taken.
            let mut next = vec![0u8; after.len()];
            let have = conn.buf.len().min(after.len());
            next[..have].copy_from_slice(&conn.buf[..have]);
            conn.stream.read_exact(&mut next[have..]).await.unwrap();
            assert_eq!(next, after);
        }
        drop(conn);
        writer.await.unwrap();
        (r, reader.await.unwrap())
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n as u32).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// The room a response's body takes in the pending bytes before their first write: of a
    /// `Content-Length` body read whole what did not come with the head (all of it when the
    /// caller writes), what came with the head when the rest is spliced, read in pieces or not
    /// framed by length.
    #[test]
    fn pending_room_is_what_joins_the_head() {
        let direct = |splice_min| RelayOptions {
            deadline: WAIT,
            flush_at: 64 * 1024,
            flush_end: true,
            direct: Some(Direct {
                client_wait: Duration::from_secs(5),
                splice_min,
            }),
        };
        let spliced = direct(65536);
        // Read whole: the remainder is under the splice threshold and WHOLE_MAX. What came
        // with the head stays where it was read; the rest joins the head. Under GATHER_MIN it
        // is copied behind the head too.
        assert_eq!(spliced.pending_room(BodyLength::Length(16384), 16000), 384);
        assert_eq!(spliced.pending_room(BodyLength::Length(100), 300), 100);
        assert_eq!(spliced.pending_room(BodyLength::Length(9000), 5000), 4000);
        assert_eq!(spliced.pending_room(BodyLength::Length(9000), 3000), 9000);
        // Written later by the caller, all of it joins the head.
        let later = RelayOptions {
            flush_end: false,
            ..spliced
        };
        assert_eq!(later.pending_room(BodyLength::Length(16384), 16000), 16384);
        assert_eq!(later.pending_room(BodyLength::Length(100), 300), 100);
        // The remainder is spliced: only what came with the head.
        assert_eq!(
            spliced.pending_room(BodyLength::Length(200_000), 16000),
            16000
        );
        // Never splicing, a remainder over WHOLE_MAX goes in pieces.
        let copy = direct(0);
        assert_eq!(
            copy.pending_room(BodyLength::Length(100_000), 16000),
            84_000
        );
        assert_eq!(
            copy.pending_room(BodyLength::Length(WHOLE_MAX + 20_000), 16000),
            16000
        );
        // Not in direct mode: pieces.
        let pieces = RelayOptions {
            direct: None,
            ..copy
        };
        assert_eq!(
            pieces.pending_room(BodyLength::Length(30_000), 16000),
            16000
        );
        assert_eq!(pieces.pending_room(BodyLength::Chunked, 100_000), 64 * 1024);
        assert_eq!(pieces.pending_room(BodyLength::UntilClose, 500), 500);
        assert_eq!(pieces.pending_room(BodyLength::None, 500), 0);
    }

    #[tokio::test]
    async fn by_length() {
        for direct in [None, Some(DIRECT)] {
            for n in [0usize, 50, 1000, 300_000] {
                let body = data(n);
                let (r, got) = run(
                    body.clone(),
                    b"",
                    false,
                    BodyLength::Length(n as u64),
                    opts(direct),
                )
                .await;
                let r = r.unwrap();
                assert_eq!(got, body, "n {n}");
                assert_eq!(r.body, n as u64);
                assert!(r.reusable);
                // Only a remainder of 64 KiB or more in direct mode is spliced.
                let spliced = direct.is_some() && n > 64 * 1024;
                assert_eq!(r.spliced, if spliced { n as u64 - 100 } else { 0 });
            }
        }
    }

    /// A large body takes the splice path; the bytes after it stay on the connection, which
    /// can be reused.
    #[tokio::test]
    async fn large_body_is_spliced() {
        let body = data(3_000_000);
        let (r, got) = run(
            body.clone(),
            b"HTTP/1.1 200 OK\r\n",
            false,
            BodyLength::Length(body.len() as u64),
            opts(Some(DIRECT)),
        )
        .await;
        let r = r.unwrap();
        assert_eq!(r.spliced, body.len() as u64 - 100);
        assert!(got == body, "spliced bytes differ");
    }

    /// A body under the splice threshold is read onto the pending head and leaves with it in
    /// one write, with nothing read past its end.
    #[tokio::test]
    async fn a_smaller_body_leaves_with_its_head_in_one_write() {
        let (peer_side, mut peer) = pair().await;
        let (client_side, mut client_r) = pair().await;
        let mut conn = Connection::new(peer_side, "127.0.0.1:1".parse().unwrap(), false);
        let body = data(50_000);
        conn.buf.extend_from_slice(&body[..5000]);
        let mut wire = body[5000..].to_vec();
        wire.extend_from_slice(b"NEXT");
        // The peer has sent it all, and more, before the relay reads.
        peer.write_all(&wire).await.unwrap();
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 50000\r\n\r\n";
        let mut sink = Sink::new(client_side, head);
        let r = relay_body(
            &mut conn,
            BodyLength::Length(body.len() as u64),
            true,
            &mut sink,
            opts(Some(DIRECT)),
        )
        .await
        .unwrap();
        assert_eq!((r.body, r.spliced), (50_000, 0));
        assert_eq!(sink.writes, 1);
        // What came with the head went between it and the rest, not copied onto them.
        assert_eq!(sink.around, [5000]);
        drop(sink);
        let mut got = Vec::new();
        client_r.read_to_end(&mut got).await.unwrap();
        assert!(
            got == [&head[..], &body].concat(),
            "bytes differ or out of order"
        );
        // What follows the body is still the peer's: the one byte of it that the read ending
        // the body took (it asked for a byte more) stays in the connection's buffer, which is
        // then not reused, and the rest on the socket.
        assert!(!r.reusable);
        assert_eq!(&conn.buf[..], b"N");
        let mut next = [0u8; 3];
        conn.stream.read_exact(&mut next).await.unwrap();
        assert_eq!(&next, b"EXT");
    }

    /// A peer that sent nothing past the body leaves its connection known to be drained: the
    /// read that ended the body asked for a byte more and came back short, so the pool's check
    /// at the next checkout answers from the runtime's readiness, without a system call. Read
    /// whole with the head (gathered), and in the pieces of a relay without the direct mode.
    #[tokio::test]
    async fn a_body_that_ends_what_was_sent_leaves_its_connection_drained() {
        for (direct, around) in [(Some(DIRECT), &[5000][..]), (None, &[])] {
            let (peer_side, mut peer) = pair().await;
            let (client_side, mut client_r) = pair().await;
            let mut conn = Connection::new(peer_side, "127.0.0.1:1".parse().unwrap(), false);
            let body = data(50_000);
            conn.buf.extend_from_slice(&body[..5000]);
            // All of the rest has arrived before the relay reads: one read takes exactly it.
            peer.write_all(&body[5000..]).await.unwrap();
            let head = b"HTTP/1.1 200 OK\r\nContent-Length: 50000\r\n\r\n";
            let mut sink = Sink::new(client_side, head);
            let len = BodyLength::Length(body.len() as u64);
            let r = relay_body(&mut conn, len, true, &mut sink, opts(direct)).await;
            let r = r.unwrap();
            assert_eq!(sink.around, around);
            drop(sink);
            assert!(r.reusable && conn.buf.is_empty());
            let mut tried = false;
            let checked = conn.stream.try_io(tokio::io::Interest::READABLE, || {
                tried = true;
                Err::<(), _>(io::ErrorKind::WouldBlock.into())
            });
            assert!(checked.is_err());
            assert!(
                !tried,
                "the readiness is still set: the pool's check would peek"
            );
            let mut got = Vec::new();
            client_r.read_to_end(&mut got).await.unwrap();
            assert!(got == [&head[..], &body].concat(), "bytes differ");
        }
    }

    /// A body read whole with its head, and bytes after it, leaves from where it was read; the
    /// bytes after it stay in the connection's buffer, which is then not reusable. A client
    /// that does not gather gets the same bytes, copied, and so does one whose body is under
    /// `GATHER_MIN`.
    #[tokio::test]
    async fn a_body_read_with_its_head_is_not_copied() {
        /// A client with the default write around a part: it copies.
        struct Copying(Sink);
        impl Client for Copying {
            fn pending(&mut self) -> &mut Vec<u8> {
                self.0.pending()
            }
            fn write_pending(&mut self) -> impl Future<Output = io::Result<()>> {
                self.0.write_pending()
            }
            fn socket(&mut self) -> io::Result<&TcpStream> {
                self.0.socket()
            }
        }
        for (gathering, n) in [(true, 5000), (false, 5000), (true, GATHER_MIN - 1)] {
            let (peer_side, _peer) = pair().await;
            let (client_side, mut client_r) = pair().await;
            let mut conn = Connection::new(peer_side, "127.0.0.1:1".parse().unwrap(), false);
            let body = data(n);
            conn.buf.extend_from_slice(&body);
            conn.buf.extend_from_slice(b"NEXT");
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n");
            let sink = Sink::new(client_side, head.as_bytes());
            let len = BodyLength::Length(n as u64);
            let (r, sink) = if gathering {
                let mut sink = sink;
                let r = relay_body(&mut conn, len, true, &mut sink, opts(Some(DIRECT))).await;
                (r, sink)
            } else {
                let mut c = Copying(sink);
                let r = relay_body(&mut conn, len, true, &mut c, opts(Some(DIRECT))).await;
                (r, c.0)
            };
            let r = r.unwrap();
            let around: &[usize] = if gathering && n >= GATHER_MIN {
                &[n]
            } else {
                &[]
            };
            assert_eq!((sink.writes, &sink.around[..]), (1, around), "{n}");
            drop(sink);
            assert_eq!((r.body, r.spliced, r.reusable), (n as u64, 0, false));
            assert_eq!(&conn.buf[..], b"NEXT");
            drop(conn);
            let mut got = Vec::new();
            client_r.read_to_end(&mut got).await.unwrap();
            let want = [head.as_bytes(), &body].concat();
            assert!(got == want, "gathering {gathering}, {n} bytes");
        }
    }

    /// A peer closing within a `Content-Length` body is a peer error, not a client one.
    #[tokio::test]
    async fn short_body_is_truncated() {
        for direct in [
            None,
            Some(DIRECT),
            Some(Direct {
                splice_min: 0,
                ..DIRECT
            }),
        ] {
            let (r, _) = run(
                data(500),
                b"",
                true,
                BodyLength::Length(200_000),
                opts(direct),
            )
            .await;
            let e = r.unwrap_err();
            assert!(matches!(e.error, Error::Truncated), "{e:?}");
            assert!(!e.error.is_client());
        }
    }

    #[tokio::test]
    async fn chunked() {
        let mut wire = Vec::new();
        for part in [&data(10)[..], &data(70_000)[..], b"x"] {
            wire.extend_from_slice(format!("{:x};ext=1\r\n", part.len()).as_bytes());
            wire.extend_from_slice(part);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\nTrailer: t\r\n\r\n");
        for direct in [None, Some(DIRECT)] {
            let (r, got) = run(
                wire.clone(),
                b"NEXT",
                false,
                BodyLength::Chunked,
                opts(direct),
            )
            .await;
            let r = r.unwrap();
            // Passed on as received, and the bytes after it are not part of it.
            assert!(got == wire);
            assert_eq!(r.body, wire.len() as u64);
            assert!(!r.reusable, "bytes after the body");
        }
        let (r, got) = run(wire.clone(), b"", false, BodyLength::Chunked, opts(None)).await;
        assert!(r.unwrap().reusable);
        assert!(got == wire);
        // A malformed chunk size.
        let (r, _) = run(
            b"zz\r\n".to_vec(),
            b"",
            false,
            BodyLength::Chunked,
            opts(None),
        )
        .await;
        assert!(matches!(r.unwrap_err().error, Error::Chunked(_)));
    }

    #[tokio::test]
    async fn until_close() {
        for direct in [None, Some(DIRECT)] {
            let body = data(200_000);
            let (r, got) = run(
                body.clone(),
                b"",
                true,
                BodyLength::UntilClose,
                opts(direct),
            )
            .await;
            let r = r.unwrap();
            assert!(got == body);
            assert_eq!(r.body, body.len() as u64);
            assert!(!r.reusable);
        }
    }

    /// Without `flush_end`, what is left stays pending for the caller.
    #[tokio::test]
    async fn pending_stays_without_flush_end() {
        let (peer_side, _peer) = pair().await;
        let (client_side, _client_r) = pair().await;
        let mut conn = Connection::new(peer_side, "127.0.0.1:1".parse().unwrap(), false);
        conn.buf.extend_from_slice(b"hello");
        let mut sink = Sink::new(client_side, b"HEAD");
        let o = RelayOptions {
            flush_end: false,
            ..opts(None)
        };
        let r = relay_body(&mut conn, BodyLength::Length(5), true, &mut sink, o)
            .await
            .unwrap();
        assert!(r.reusable);
        assert_eq!(sink.out, b"HEADhello");
        assert_eq!(sink.writes, 0);
    }
}
