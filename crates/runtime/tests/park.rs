//! Parked connections over real sockets: resumed when their clients send, closed at their idle
//! deadline (tokio's paused clock), shed longest-waiting first, all closed on shutdown.

use std::os::fd::AsRawFd;
use std::time::Duration;

use switchyard_runtime::park::{Parking, Unparked};
use switchyard_runtime::shed::{Waiting, WaitingClients};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the parking task handed back, with the connection's name.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    Ready(&'static str),
    Expired(&'static str),
    Shutdown(&'static str),
}

/// A parked connection's state in these tests: its name and, when listed, its ticket.
struct State {
    name: &'static str,
    _ticket: Option<Waiting>,
}

/// A server-side socket and its client.
async fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
    let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    (server, client)
}

/// Runs the parking task; what it hands back goes to the channel with its socket (closed when
/// the receiver drops it).
fn start(
    parking: &Parking<State>,
) -> (
    watch::Sender<bool>,
    mpsc::UnboundedReceiver<(Got, TcpStream)>,
) {
    let (stop, stop_rx) = watch::channel(false);
    let (tx, rx) = mpsc::unbounded_channel();
    let p = parking.clone();
    tokio::spawn(async move {
        p.run(stop_rx, |u| {
            let (got, stream) = match u {
                Unparked::Ready(s, st) => (Got::Ready(st.name), s),
                Unparked::Expired(s, st) => (Got::Expired(st.name), s),
                Unparked::Shutdown(s, st) => (Got::Shutdown(st.name), s),
            };
            let _ = tx.send((got, stream));
        })
        .await;
    });
    (stop, rx)
}

fn state(name: &'static str) -> State {
    State {
        name,
        _ticket: None,
    }
}

const IDLE: Duration = Duration::from_secs(30);

#[tokio::test(start_paused = true)]
async fn a_parked_connection_is_handed_back_when_its_client_sends() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let parking = Parking::new();
    let (_stop, mut rx) = start(&parking);
    let (a, mut ca) = pair(&l).await;
    let (b, _cb) = pair(&l).await;
    parking
        .park(a, state("a"), Instant::now() + IDLE)
        .ok()
        .unwrap();
    parking
        .park(b, state("b"), Instant::now() + IDLE)
        .ok()
        .unwrap();
    assert_eq!(parking.len(), 2);
    ca.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let (got, a) = rx.recv().await.unwrap();
    assert_eq!(got, Got::Ready("a"));
    assert_eq!(parking.len(), 1);
    // The request is there to read, whole.
    let mut buf = [0u8; 64];
    a.readable().await.unwrap();
    let n = a.try_read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n\r\n");
    // Parked again after its answer, it is handed back for the next request too.
    parking
        .park(a, state("a"), Instant::now() + IDLE)
        .ok()
        .unwrap();
    ca.write_all(b"next").await.unwrap();
    let (got, _a) = rx.recv().await.unwrap();
    assert_eq!(got, Got::Ready("a"));
    // `b` never sent: still parked, nothing else came back.
    assert_eq!(parking.len(), 1);
    assert!(rx.try_recv().is_err());
}

#[tokio::test(start_paused = true)]
async fn bytes_that_arrived_before_parking_hand_it_back_at_once() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let parking = Parking::new();
    let (_stop, mut rx) = start(&parking);
    let (a, mut ca) = pair(&l).await;
    ca.write_all(b"early").await.unwrap();
    a.readable().await.unwrap();
    parking
        .park(a, state("a"), Instant::now() + IDLE)
        .ok()
        .unwrap();
    let (got, _a) = rx.recv().await.unwrap();
    assert_eq!(got, Got::Ready("a"));
    assert!(parking.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_parked_connection_is_closed_at_its_idle_deadline() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let parking = Parking::new();
    let (_stop, mut rx) = start(&parking);
    let (a, mut ca) = pair(&l).await;
    let (b, _cb) = pair(&l).await;
    let t0 = Instant::now();
    parking.park(b, state("b"), t0 + IDLE * 2).ok().unwrap();
    // A later connection with an earlier deadline moves the timer up.
    parking.park(a, state("a"), t0 + IDLE).ok().unwrap();
    // Nothing before the deadline.
    assert!(
        tokio::time::timeout_at(t0 + IDLE - Duration::from_millis(1), rx.recv())
            .await
            .is_err()
    );
    let (got, a) = rx.recv().await.unwrap();
    assert_eq!(got, Got::Expired("a"));
    assert_eq!(Instant::now(), t0 + IDLE);
    drop(a);
    // Its client sees the close.
    let mut buf = [0u8; 8];
    assert_eq!(ca.read(&mut buf).await.unwrap(), 0);
    let (got, _b) = rx.recv().await.unwrap();
    assert_eq!(got, Got::Expired("b"));
    assert_eq!(Instant::now(), t0 + IDLE * 2);
    assert!(parking.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_longest_waiting_parked_connection_is_shed_first() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let list = WaitingClients::new();
    let parking = Parking::new();
    let (_stop, mut rx) = start(&parking);
    let mut conns = Vec::new();
    let mut clients = Vec::new();
    for name in ["a", "b", "c"] {
        let (s, c) = pair(&l).await;
        // Each began to wait in this order (at its last answer), and keeps its place parked.
        let ticket = list.enter(s.as_raw_fd(), true);
        conns.push(Some((name, s, ticket)));
        clients.push(c);
    }
    // Parked in another order: the list's order is what counts.
    for i in [2, 0, 1] {
        let (name, s, ticket) = conns[i].take().unwrap();
        let st = State {
            name,
            _ticket: Some(ticket),
        };
        parking.park(s, st, Instant::now() + IDLE).ok().unwrap();
    }
    assert_eq!(list.len(), 3);
    assert!(list.shed_oldest());
    let (got, a) = rx.recv().await.unwrap();
    assert_eq!(got, Got::Ready("a"));
    // Handed back to read the end of its input, and close.
    let mut buf = [0u8; 8];
    a.readable().await.unwrap();
    assert_eq!(a.try_read(&mut buf).unwrap(), 0);
    assert!(list.shed_oldest());
    let (got, _b) = rx.recv().await.unwrap();
    assert_eq!(got, Got::Ready("b"));
    assert_eq!(parking.len(), 1);
    assert_eq!(list.shed_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn shutdown_closes_every_parked_connection_and_parks_no_more() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let parking = Parking::new();
    let (stop, mut rx) = start(&parking);
    let (a, _ca) = pair(&l).await;
    let (b, _cb) = pair(&l).await;
    parking
        .park(a, state("a"), Instant::now() + IDLE)
        .ok()
        .unwrap();
    parking
        .park(b, state("b"), Instant::now() + IDLE / 2)
        .ok()
        .unwrap();
    stop.send(true).unwrap();
    let mut got = vec![rx.recv().await.unwrap().0, rx.recv().await.unwrap().0];
    got.sort_by_key(|g| format!("{g:?}"));
    assert_eq!(got, [Got::Shutdown("a"), Got::Shutdown("b")]);
    // The task has ended: the channel closes.
    assert!(rx.recv().await.is_none());
    let (c, _cc) = pair(&l).await;
    let back = parking.park(c, state("c"), Instant::now() + IDLE);
    assert!(matches!(back, Err((_, State { name: "c", .. }))));
    assert!(parking.is_empty());
}
