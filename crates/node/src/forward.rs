//! Back-end forwarding (seed 003 §3.3): a node fetches a response from
//! another node's HTTP listener and sends it on its own client connection.
//!
//! The switch chooses it for a later request on a handed-in connection
//! (`RouteAction::Forward`) when another node has the object cached and
//! moving the connection would cost more than fetching. Node-to-node
//! connections are persistent HTTP/1.1 through [`switchyard_upstream`]: idle
//! ones wait in a small pool per peer on each worker thread (a socket stays
//! on the runtime that opened it) and are checked for a close by the peer
//! before reuse. Response heads are parsed strictly; bodies are delimited by
//! `Content-Length`, chunked coding or the peer's close.

use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Duration;

use switchyard_upstream::{self as upstream, Connection, Pool, Response};
use tokio::time::Instant;

/// Idle connections kept per peer on each worker thread.
pub const MAX_IDLE_PER_PEER: usize = 8;
/// Time allowed to connect to a peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest response head accepted from a peer.
pub const MAX_RESPONSE_HEAD: usize = 32 * 1024;

/// Idle connections to peer nodes.
static POOL: LazyLock<Pool> = LazyLock::new(|| Pool::new(usize::MAX, MAX_IDLE_PER_PEER));

/// Send `req` to the peer at `peer` and read the final response head, all by
/// `until`; a pooled connection the peer closed meanwhile is replaced by a new one once.
pub(crate) async fn exchange(
    peer: SocketAddr,
    req: &[u8],
    head_request: bool,
    until: Instant,
) -> Result<(Connection, Response), upstream::Error> {
    let req = upstream::Request {
        bytes: req,
        head_request,
        max_head: MAX_RESPONSE_HEAD,
    };
    upstream::exchange_pooled(&POOL, peer, req, CONNECT_TIMEOUT, until).await
}

/// Keep a connection whose last response was read completely.
pub(crate) fn check_in(conn: Connection) {
    POOL.put(conn);
}
