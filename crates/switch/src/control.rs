//! The switch's control connections to one node, one per worker thread.
//!
//! Every worker thread keeps a control connection of its own ([`Link`]) to each node with a
//! `control` address, opened on the worker's runtime. The worker that owns a client connection
//! writes that connection's `Create` itself — straight to the socket, the frame and its
//! descriptor with one `sendmsg` — and its link's reader, a task on the same thread, reads the
//! answer and wakes the waiting handoff: no hop to another thread and no lock that another
//! thread takes on the way (a link's locks are only ever taken on its own thread, except for a
//! glance from [`Control::is_up`]). A `Cancel` goes on the link its `Create` went on, and the
//! node answers every `Create` on the connection it came on, so the waiting handoffs of a link
//! ([`Link::wait`]) are answered on that link alone.
//!
//! Frames are written at once by whoever sends them; what the socket does not take waits in the
//! link's [`ControlSink`], frames sent meanwhile join it, and the link's flusher
//! ([`Link::run_flusher`]) writes the backlog with one system call once the socket has room.
//! A `Create` without a descriptor (across hosts) is left to the flusher from the start
//! ([`Link::send_soon`]), so that the `Create`s of connections handed off in the same turn of
//! the worker's event loop share one write and one packet.
//!
//! A worker hands a connection to a node only while its own link to the node is up;
//! [`Control::is_up`] — the node is *control up* — holds when every worker's link is.

use std::time::Instant;

use parking_lot::Mutex;
use switchyard_handoff::steer::Target;

use crate::config::ControlAddr;

/// The switch's control connections to one node.
#[derive(Debug)]
pub(crate) struct Control {
    pub addr: ControlAddr,
    /// One per worker thread, by worker index.
    links: Box<[Link]>,
    /// Where steered packets go (nodes on another host), found once connected.
    target: Mutex<Option<Target>>,
}

impl Control {
    /// Control connections to the node at `addr`, one for each of `workers` threads.
    pub fn new(addr: ControlAddr, workers: usize) -> Self {
        Control {
            addr,
            links: (0..workers.max(1)).map(|_| Link::default()).collect(),
            target: Mutex::new(None),
        }
    }

    /// The link of worker `worker`.
    pub fn link(&self, worker: usize) -> &Link {
        &self.links[worker % self.links.len()]
    }

    /// Whether every worker's link is up.
    pub fn is_up(&self) -> bool {
        self.links.iter().all(Link::is_up)
    }

    /// Whether the node is on this host (connections travel as descriptors).
    pub fn same_host(&self) -> bool {
        matches!(self.addr, ControlAddr::Unix(_))
    }

    /// Where steered packets go, once known.
    pub fn target(&self) -> Option<Target> {
        *self.target.lock()
    }

    pub fn set_target(&self, t: Target) {
        *self.target.lock() = Some(t);
    }
}

/// What the switch keeps with a `Create` waiting for its node's answer.
#[derive(Debug)]
pub(crate) struct Sent {
    /// The node it went to.
    pub node: usize,
    /// When the first handoff of the connection started (`None`: a handed-back connection
    /// passed on).
    pub first: Option<Instant>,
}

/// One worker's control connection to one node.
pub(crate) type Link = switchyard_handoff::link::Link<Sent>;
/// A `Create` waiting for its node's answer.
pub(crate) type Pending = switchyard_handoff::link::Pending<Sent>;
