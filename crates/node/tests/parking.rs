//! Idle keep-alive connections parked without a task of their own: served again when their
//! next request arrives, closed at their idle timeout, shed longest-idle first.
//! (The parking table on tokio's paused clock is tested in `switchyard-runtime`.)

mod common;

use common::*;
use std::time::Duration;

fn parked(n: &TestNode) -> usize {
    n.node.as_ref().unwrap().parked_connections()
}

#[test]
fn a_parked_connection_is_served_when_its_next_request_arrives() {
    let n = TestNode::start(|r| write(r, "a.txt", b"alpha"), |_| {});
    let mut c = n.client();
    let mut other = n.client();
    assert_eq!(c.get("/a.txt").body, b"alpha");
    assert_eq!(other.get("/a.txt").body, b"alpha");
    assert!(eventually(Duration::from_secs(10), || parked(&n) == 2));
    for _ in 0..3 {
        let r = c.get("/a.txt");
        assert_eq!((r.status, &r.body[..]), (200, &b"alpha"[..]));
        // Idle again, parked again; the other one stayed parked throughout.
        assert!(eventually(Duration::from_secs(10), || parked(&n) == 2));
    }
    // Pipelined requests on a parked connection are answered in order.
    c.send(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\nGET /missing HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(c.response(false).status, 200);
    assert_eq!(c.response(false).status, 404);
    assert_eq!(other.get("/a.txt").status, 200);
    assert_eq!(n.metric("switchyard_node_connections_active"), 2.0);
}

#[test]
fn a_parked_connection_is_closed_at_its_idle_timeout() {
    let n = TestNode::start(|r| write(r, "a.txt", b"a"), |c| c.idle_timeout_ms = 1500);
    let mut c = n.client();
    assert_eq!(c.get("/a.txt").status, 200);
    assert!(eventually(Duration::from_secs(10), || parked(&n) == 1));
    // The client's read ends with the close (it waits up to 10 s).
    assert!(c.is_closed());
    assert_eq!(parked(&n), 0);
    assert_eq!(n.metric("switchyard_node_timeouts_total"), 1.0);
    assert!(eventually(Duration::from_secs(10), || n
        .metric("switchyard_node_connections_active")
        == 0.0));
}

#[test]
fn parked_connections_are_shed_longest_idle_first() {
    let n = TestNode::start(
        |r| write(r, "a.txt", b"a"),
        |c| {
            c.workers = 1;
            c.max_connections = Some(2);
        },
    );
    let mut oldest = n.client();
    assert_eq!(oldest.get("/a.txt").status, 200);
    let mut newer = n.client();
    assert_eq!(newer.get("/a.txt").status, 200);
    assert!(eventually(Duration::from_secs(10), || parked(&n) == 2));
    // Every slot is taken: a newcomer gets the slot of the connection idle longest.
    let mut new = n.client();
    assert_eq!(new.get("/a.txt").status, 200);
    assert!(oldest.is_closed());
    assert_eq!(n.metric("switchyard_node_connections_shed_total"), 1.0);
    assert_eq!(newer.get("/a.txt").status, 200);
}

#[test]
fn shutdown_closes_parked_connections() {
    let mut n = TestNode::start(|r| write(r, "a.txt", b"a"), |_| {});
    let mut c = n.client();
    assert_eq!(c.get("/a.txt").status, 200);
    assert!(eventually(Duration::from_secs(10), || parked(&n) == 1));
    let node = n.node.take().unwrap();
    // Far shorter than the idle timeout: the parked connection is closed by the shutdown.
    n.rt.block_on(node.shutdown(Duration::from_secs(30)));
    assert!(c.is_closed());
}
