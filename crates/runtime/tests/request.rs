//! Reading request heads and bodies over real sockets, timeouts on tokio's
//! paused clock.

use std::io;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use switchyard_http::request::{Limits, RequestHead};
use switchyard_runtime::request::{
    next_head, next_head_or_park, read_body, stream_body, BodyError, BodySink, ClientConn,
    ClientParts, HeadEnd, HeadWait, Next, StreamError, CONTINUE,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use std::sync::Arc;
use switchyard_runtime::shed::{Waiting, WaitingClients};
use switchyard_runtime::{ClientSocket, WaitTimer};

const HEADER: Duration = Duration::from_secs(5);
const IDLE: Duration = Duration::from_secs(30);

/// The server's side of a connection, counting the loop's hooks.
struct Server {
    stream: ClientSocket,
    buf: BytesMut,
    shutdown: watch::Receiver<bool>,
    timer: WaitTimer,
    before_waits: usize,
    idles: usize,
    /// The shedding list, when the connection is on one.
    list: Option<Arc<WaitingClients>>,
    /// Listed at its last answer.
    listed: Option<Waiting>,
    /// Its waits on its client, idle, are ended by the list at shutdown.
    ends_at_shutdown: bool,
}

impl ClientConn for Server {
    fn parts(&mut self) -> ClientParts<'_> {
        ClientParts {
            stream: &mut self.stream,
            buf: &mut self.buf,
            shutdown: &mut self.shutdown,
            timer: &mut self.timer,
        }
    }

    async fn before_wait(&mut self) -> io::Result<()> {
        self.before_waits += 1;
        Ok(())
    }

    fn idle(&mut self) {
        self.idles += 1;
    }

    async fn send_continue(&mut self) -> io::Result<()> {
        self.stream.registered()?.write_all(CONTINUE).await
    }

    fn waiting_list(&self) -> Option<&Arc<WaitingClients>> {
        self.list.as_ref()
    }

    fn take_ticket(&mut self) -> Option<Waiting> {
        self.listed.take()
    }

    /// As the node's and the switch's: not with part of a next request read.
    fn list_closed_at_shutdown(&self) -> bool {
        self.ends_at_shutdown && self.buf.is_empty()
    }
}

impl Server {
    /// Write an answer the way the node and the switch do: listed as waiting on the client
    /// from just before the write.
    async fn answer(&mut self, bytes: &[u8]) {
        let list = self.list.as_ref().unwrap();
        self.listed = Some(list.enter(self.stream.raw_fd(), false));
        let stream = self.stream.registered().unwrap();
        stream.write_all(bytes).await.unwrap();
    }
}

/// Block until the server's socket has bytes to read (poll(2) on it, up to 5 s), without
/// registering it.
fn arrived(s: &ClientSocket) {
    let mut p = libc::pollfd {
        fd: s.raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, 5000) };
    assert_eq!(n, 1, "the request did not arrive");
}

/// A connected pair: the client's socket, the server's side (bare, as the accept loop gives
/// it) and its shutdown switch.
async fn pair(preread: &[u8]) -> (TcpStream, Server, watch::Sender<bool>) {
    let l = switchyard_runtime::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (stream, _) = l.accept().await.unwrap();
    let (tx, shutdown) = watch::channel(false);
    let server = Server {
        stream,
        buf: BytesMut::from(preread),
        shutdown,
        timer: WaitTimer::new(),
        before_waits: 0,
        idles: 0,
        list: None,
        listed: None,
        ends_at_shutdown: false,
    };
    (client, server, tx)
}

/// `got` is `want`, give or take the timer's millisecond.
fn assert_about(got: Duration, want: Duration) {
    assert!(
        got >= want && got <= want + Duration::from_millis(2),
        "{got:?} is not {want:?}"
    );
}

fn wait(limits: &Limits, first: bool) -> HeadWait<'_> {
    HeadWait {
        limits,
        header: HEADER,
        idle: IDLE,
        first,
        read_early: false,
    }
}

async fn head(s: &mut Server, first: bool) -> Result<RequestHead, HeadEnd> {
    let limits = Limits::default();
    next_head(s, wait(&limits, first)).await
}

/// Pipelined heads are returned one by one, in order, each left at the
/// start of the buffer; the connection waits (and is told it is idle) only
/// once the buffer is empty.
#[tokio::test]
async fn pipelined_heads_come_in_order() {
    let (mut client, mut s, _stop) = pair(b"").await;
    client
        .write_all(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let mut targets = Vec::new();
    while targets.len() < 2 {
        let h = head(&mut s, targets.is_empty()).await.unwrap();
        assert!(s.buf.starts_with(b"GET "));
        s.buf.advance(h.head_len);
        targets.push(h.target);
    }
    assert_eq!(targets, ["/a", "/b"]);
    assert!(s.buf.is_empty());
    drop(client);
    assert!(matches!(head(&mut s, false).await, Err(HeadEnd::Closed)));
    assert!(s.idles >= 1);
    assert!(s.before_waits >= 1);
}

/// A malformed head ends with its status; nothing is waited for.
#[tokio::test]
async fn a_malformed_head_ends_with_its_status() {
    let (_client, mut s, _stop) = pair(b"GET / HTTP/1.1\r\nHost x\r\n\r\n").await;
    match head(&mut s, true).await {
        Err(HeadEnd::Bad(e)) => assert_eq!(e.status(), 400),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.before_waits, 0);
}

/// No request within the first-request timeout: an idle timeout, not a 408.
#[tokio::test(start_paused = true)]
async fn no_request_is_an_idle_timeout() {
    let (_client, mut s, _stop) = pair(b"").await;
    let t = tokio::time::Instant::now();
    assert!(matches!(
        head(&mut s, true).await,
        Err(HeadEnd::IdleTimeout)
    ));
    assert_about(t.elapsed(), HEADER);
    // Between requests the idle timeout applies.
    let t = tokio::time::Instant::now();
    assert!(matches!(
        head(&mut s, false).await,
        Err(HeadEnd::IdleTimeout)
    ));
    assert_about(t.elapsed(), IDLE);
}

/// A head that has begun must complete within the header timeout: a 408.
#[tokio::test(start_paused = true)]
async fn a_slow_head_times_out() {
    let (_client, mut s, _stop) = pair(b"GET / HTTP/1.1\r\nHo").await;
    let t = tokio::time::Instant::now();
    assert!(matches!(head(&mut s, false).await, Err(HeadEnd::TimedOut)));
    assert_about(t.elapsed(), HEADER);
}

/// A client that closes in the middle of a head broke the connection.
#[tokio::test]
async fn a_close_inside_a_head_is_broken() {
    let (client, mut s, _stop) = pair(b"GET / HTTP/1.1\r\nHo").await;
    drop(client);
    assert!(matches!(head(&mut s, false).await, Err(HeadEnd::Broken)));
}

/// An idle connection ends on shutdown, whether it is already waiting or
/// the shutdown came first.
#[tokio::test]
async fn shutdown_ends_an_idle_wait() {
    let (_client, mut s, stop) = pair(b"").await;
    let (got, ()) = tokio::join!(head(&mut s, false), async {
        tokio::task::yield_now().await;
        stop.send(true).unwrap();
    });
    assert!(matches!(got, Err(HeadEnd::Closed)));
    assert!(matches!(head(&mut s, false).await, Err(HeadEnd::Closed)));
}

/// The early read takes a request that is already in the socket: the new
/// connection is never treated as idle. Without it, the connection goes
/// through the idle wait.
#[tokio::test]
async fn the_early_read_takes_what_is_there() {
    for read_early in [true, false] {
        let (mut client, mut s, _stop) = pair(b"").await;
        client
            .write_all(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
            .await
            .unwrap();
        arrived(&s.stream);
        let list = WaitingClients::new();
        s.list = Some(list.clone());
        let entered = list.entered();
        tokio::pin!(entered);
        entered.as_mut().enable();
        let limits = Limits::default();
        let w = HeadWait {
            read_early,
            ..wait(&limits, true)
        };
        let h = next_head(&mut s, w).await.unwrap();
        assert_eq!(h.target, "/x");
        assert_eq!(s.idles, usize::from(!read_early));
        // Read at once, the request never made the socket wait: the event loop does not know
        // it, and it was never listed as waiting on its client (nor flushed anything first).
        // Through the idle wait, it was both.
        assert_eq!(s.stream.is_registered(), !read_early);
        assert_eq!(s.before_waits, usize::from(!read_early));
        let listed = tokio::time::timeout(Duration::ZERO, entered).await.is_ok();
        assert_eq!(listed, !read_early, "listed as waiting");
        assert!(list.is_empty());
    }
}

async fn body(s: &mut Server, max: u64, keep: bool) -> (Result<(), BodyError>, Vec<u8>) {
    let h = head(s, true).await.unwrap();
    s.buf.advance(h.head_len);
    let mut kept = Vec::new();
    let r = read_body(s, &h, max, HEADER, keep.then_some(&mut kept)).await;
    (r, kept)
}

/// A chunked body is kept as sent, coding included, whatever the split of
/// its bytes; what follows it stays in the buffer.
#[tokio::test]
async fn a_chunked_body_is_kept_as_sent() {
    let (mut client, mut s, _stop) = pair(&with(b"5\r\nhel")).await;
    let writer = tokio::spawn(async move {
        client.write_all(b"lo\r\n0\r\n\r\nGET /next").await.unwrap();
        client
    });
    let (r, kept) = body(&mut s, 1024, true).await;
    r.unwrap();
    assert_eq!(kept, b"5\r\nhello\r\n0\r\n\r\n");
    let _client = writer.await.unwrap();
    // The rest may still be on its way; what has arrived is the next request.
    assert!(b"GET /next".starts_with(&s.buf));
}

/// A body by `Content-Length` is read to its end and can be dropped.
#[tokio::test]
async fn a_length_body_is_read_whole() {
    let pre = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123";
    for keep in [false, true] {
        let (mut client, mut s, _stop) = pair(pre).await;
        client.write_all(b"456789").await.unwrap();
        let (r, kept) = body(&mut s, 1024, keep).await;
        r.unwrap();
        let want: &[u8] = if keep { b"0123456789" } else { b"" };
        assert_eq!(kept, want);
        assert!(s.buf.is_empty());
    }
}

const CHUNKED: &[u8] = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";

fn with(rest: &[u8]) -> Vec<u8> {
    [CHUNKED, rest].concat()
}

/// Chunked data beyond the limit, a malformed chunk and a close each end
/// the body with their own error.
#[tokio::test]
async fn bad_bodies_end_with_their_error() {
    let (_c, mut s, _stop) = pair(&with(b"10\r\n0123456789abcdef\r\n0\r\n\r\n")).await;
    assert!(matches!(
        body(&mut s, 8, false).await.0,
        Err(BodyError::TooLarge)
    ));

    let (_c, mut s, _stop) = pair(&with(b"zz\r\n")).await;
    assert!(matches!(
        body(&mut s, 8, false).await.0,
        Err(BodyError::Malformed(_))
    ));

    let (c, mut s, _stop) = pair(&with(b"5\r\nhe")).await;
    drop(c);
    assert!(matches!(
        body(&mut s, 8, false).await.0,
        Err(BodyError::Broken)
    ));
}

/// A body that stalls times out after the header timeout.
#[tokio::test(start_paused = true)]
async fn a_stalled_body_times_out() {
    let (_c, mut s, _stop) = pair(&with(b"5\r\nhe")).await;
    let t = tokio::time::Instant::now();
    assert!(matches!(
        body(&mut s, 8, false).await.0,
        Err(BodyError::TimedOut)
    ));
    assert_about(t.elapsed(), HEADER);
}

/// A client that expects `100-continue` is told to go on before the body
/// is waited for, and only then sends it.
#[tokio::test]
async fn continue_comes_before_the_body() {
    let (mut client, mut s, _stop) =
        pair(b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
            .await;
    let c = tokio::spawn(async move {
        let mut got = vec![0u8; CONTINUE.len()];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, CONTINUE);
        client.write_all(b"data").await.unwrap();
        client
    });
    let (r, kept) = body(&mut s, 1024, true).await;
    r.unwrap();
    assert_eq!(kept, b"data");
    c.await.unwrap();
}

/// A sink that records the pieces it is given and fails once it holds `fail_at` bytes.
struct Pieces {
    got: Vec<Vec<u8>>,
    fail_at: usize,
}

impl BodySink for Pieces {
    type Error = &'static str;

    async fn put(&mut self, bytes: &[u8]) -> Result<(), Self::Error> {
        self.got.push(bytes.to_vec());
        if self.got.iter().map(Vec::len).sum::<usize>() >= self.fail_at {
            return Err("full");
        }
        Ok(())
    }
}

async fn stream(s: &mut Server, sink: &mut Pieces) -> Result<(), StreamError<&'static str>> {
    let h = head(s, true).await.unwrap();
    s.buf.advance(h.head_len);
    stream_body(s, &h, 1024, HEADER, sink).await
}

impl BodySink for &mut Pieces {
    type Error = &'static str;

    async fn put(&mut self, bytes: &[u8]) -> Result<(), Self::Error> {
        (**self).put(bytes).await
    }
}

/// A streamed body reaches the sink piece by piece as it arrives, coding included; what
/// follows it stays in the buffer.
#[tokio::test]
async fn a_streamed_body_arrives_in_pieces() {
    let (mut client, mut s, _stop) = pair(&with(b"5\r\nhel")).await;
    let (go, ready) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        // The second piece is sent once the first has been passed on.
        ready.await.unwrap();
        client.write_all(b"lo\r\n0\r\n\r\nGET /next").await.unwrap();
        client
    });
    let mut sink = Pieces {
        got: Vec::new(),
        fail_at: usize::MAX,
    };
    let mut go = Some(go);
    let h = head(&mut s, true).await.unwrap();
    s.buf.advance(h.head_len);
    struct Signal<'a>(
        &'a mut Pieces,
        &'a mut Option<tokio::sync::oneshot::Sender<()>>,
    );
    impl BodySink for Signal<'_> {
        type Error = &'static str;
        async fn put(&mut self, bytes: &[u8]) -> Result<(), Self::Error> {
            if let Some(g) = self.1.take() {
                g.send(()).unwrap();
            }
            self.0.put(bytes).await
        }
    }
    stream_body(&mut s, &h, 1024, HEADER, Signal(&mut sink, &mut go))
        .await
        .unwrap();
    assert_eq!(sink.got[0], b"5\r\nhel");
    assert_eq!(sink.got.concat(), b"5\r\nhello\r\n0\r\n\r\n");
    let _client = writer.await.unwrap();
    assert!(b"GET /next".starts_with(&s.buf));
}

/// A failing sink stops the body with its error; a bad body ends with the body's error.
#[tokio::test]
async fn sink_and_body_failures_are_told_apart() {
    let pre = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123";
    let (_c, mut s, _stop) = pair(pre).await;
    let mut sink = Pieces {
        got: Vec::new(),
        fail_at: 4,
    };
    assert!(matches!(
        stream(&mut s, &mut sink).await,
        Err(StreamError::Sink("full"))
    ));
    let (_c, mut s, _stop) = pair(&with(b"zz\r\n")).await;
    let mut sink = Pieces {
        got: Vec::new(),
        fail_at: usize::MAX,
    };
    assert!(matches!(
        stream(&mut s, &mut sink).await,
        Err(StreamError::Body(BodyError::Malformed(_)))
    ));
    assert!(sink.got.is_empty());
}

/// A streamed body may take longer than the timeout in all, as long as no single wait for the
/// client does; a stall of one timeout ends it.
#[tokio::test(start_paused = true)]
async fn a_streamed_body_times_out_per_wait() {
    let pre = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n";
    let (mut client, mut s, _stop) = pair(pre).await;
    let t = tokio::time::Instant::now();
    let writer = tokio::spawn(async move {
        for b in [b"a", b"b"] {
            tokio::time::sleep(HEADER - Duration::from_millis(10)).await;
            client.write_all(b).await.unwrap();
        }
        client
    });
    let mut sink = Pieces {
        got: Vec::new(),
        fail_at: usize::MAX,
    };
    let r = stream(&mut s, &mut sink).await;
    assert!(
        matches!(r, Err(StreamError::Body(BodyError::TimedOut))),
        "{r:?}"
    );
    assert_eq!(sink.got.concat(), b"ab");
    assert_about(t.elapsed(), 3 * HEADER - 2 * Duration::from_millis(10));
    let _client = writer.await.unwrap();
}

/// A connection that has answered waits from its answer, not from when its task gets round to
/// waiting: on a busy host its client (and others) may go on long before. It keeps that one
/// place in the list for the wait (no second entry), and a pipelined head already read is
/// served unlisted.
#[tokio::test]
async fn an_answered_connection_waits_from_its_answer() {
    let list = WaitingClients::new();
    let (mut ca, mut a, _sa) = pair(b"").await;
    let (mut cb, mut b, _sb) = pair(b"").await;
    a.list = Some(list.clone());
    b.list = Some(list.clone());
    a.answer(b"first").await;
    // `b` begins to wait before `a`'s task comes back to its wait.
    let entered = list.entered();
    tokio::pin!(entered);
    entered.as_mut().enable();
    let wb = tokio::spawn(async move { (head(&mut b, false).await, b) });
    entered.await;
    assert_eq!(list.len(), 2);
    let wa = tokio::spawn(async move { (head(&mut a, false).await, a) });
    tokio::task::yield_now().await;
    assert_eq!(list.len(), 2, "the answered connection was listed twice");
    // The longest waiting is `a`, listed at its answer.
    assert!(list.shed_oldest());
    let (ra, mut a) = wa.await.unwrap();
    assert!(matches!(ra, Err(HeadEnd::Closed)), "{ra:?}");
    let mut got = [0u8; 5];
    ca.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"first");
    cb.write_all(b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let (rb, _b) = wb.await.unwrap();
    assert_eq!(rb.unwrap().target, "/b");
    assert!(list.is_empty());

    // Answered with the next head already read: served unlisted.
    a.buf = BytesMut::from(&b"GET /c HTTP/1.1\r\nHost: h\r\n\r\n"[..]);
    a.answer(b"again").await;
    assert_eq!(list.len(), 1);
    assert_eq!(head(&mut a, false).await.unwrap().target, "/c");
    assert!(list.is_empty());
}

/// With a parking delay, a keep-alive connection that hears nothing for that long ends its
/// wait to be parked: its buffers released, its place in the list (from its answer) and its
/// idle deadline (counted from the start of the wait) handed over. Bytes before the delay are
/// read in place; a first request, or an idle timeout shorter than the delay, never parks.
#[tokio::test(start_paused = true)]
async fn a_keep_alive_connection_idle_for_the_delay_is_handed_over_to_be_parked() {
    const PARK: Duration = Duration::from_millis(20);
    let list = WaitingClients::new();
    let (mut client, mut s, _stop) = pair(b"").await;
    s.list = Some(list.clone());
    let limits = Limits::default();
    s.answer(b"first").await;
    let t = tokio::time::Instant::now();
    let got = next_head_or_park(&mut s, wait(&limits, false), Some(PARK)).await;
    let Ok(Next::Park(idle)) = got else {
        panic!("not handed over: {got:?}");
    };
    assert_about(t.elapsed(), PARK);
    assert_eq!(idle.until, t + IDLE);
    assert!(idle.ticket.is_some());
    assert_eq!(list.len(), 1);
    assert_eq!(s.buf.capacity(), 0);
    assert_eq!(s.idles, 1);
    drop(idle);
    assert!(list.is_empty());
    // Resumed when the client sends: the head is read in place.
    client
        .write_all(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let got = next_head_or_park(&mut s, wait(&limits, false), Some(PARK)).await;
    assert!(
        matches!(got, Ok(Next::Head(ref h)) if h.target == "/a"),
        "{got:?}"
    );
    s.buf.clear();
    // The first request waits for the header timeout in place.
    let t = tokio::time::Instant::now();
    let got = next_head_or_park(&mut s, wait(&limits, true), Some(PARK)).await;
    assert!(matches!(got, Err(HeadEnd::IdleTimeout)), "{got:?}");
    assert_about(t.elapsed(), HEADER);
    // An idle timeout shorter than the delay ends the wait as a timeout.
    let short = HeadWait {
        idle: PARK / 2,
        ..wait(&limits, false)
    };
    let got = next_head_or_park(&mut s, short, Some(PARK)).await;
    assert!(matches!(got, Err(HeadEnd::IdleTimeout)), "{got:?}");
}

/// Bytes in the receive queue of socket `fd`, not yet read.
fn unread(fd: std::os::fd::RawFd) -> libc::c_int {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) }, 0);
    n
}

/// At shutdown the waiting list ends the wait of a connection that was idle, as if its client
/// had closed, but not of one that has read part of a head: its client may finish it. Neither
/// wait watches the stop signal (it is never set here).
#[tokio::test]
async fn the_list_ends_idle_waits_at_shutdown_and_lets_a_begun_head_finish() {
    let list = WaitingClients::new();
    let (_ci, mut idle, _si) = pair(b"").await;
    let (mut cp, mut partial, _sp) = pair(b"").await;
    for s in [&mut idle, &mut partial] {
        s.list = Some(list.clone());
        s.ends_at_shutdown = true;
    }
    let fd = partial.stream.raw_fd();
    let idle = tokio::spawn(async move { head(&mut idle, true).await });
    let partial = tokio::spawn(async move { head(&mut partial, true).await });
    cp.write_all(b"GET /x HTTP/1.1\r\n").await.unwrap();
    // The bytes reach the socket (the test's thread, blocked, runs no task meanwhile)...
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1, "nothing arrived");
    // ... and the waiting task takes them.
    for _ in 0..10_000 {
        if unread(fd) == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(unread(fd), 0, "the part of a head was never read");
    assert_eq!(list.len(), 2);
    list.close_all();
    assert!(matches!(idle.await.unwrap(), Err(HeadEnd::Closed)));
    cp.write_all(b"Host: h\r\n\r\n").await.unwrap();
    let h = partial.await.unwrap().expect("the begun head is finished");
    assert_eq!(h.target, "/x");
}
