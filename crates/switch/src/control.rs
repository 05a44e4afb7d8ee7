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

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::Mutex;
use switchyard_handoff::fdpass::{ControlSink, SinkReady};
use switchyard_handoff::mover::Event;
use switchyard_handoff::proto::Message;
use switchyard_handoff::steer::Target;
use tokio::sync::{oneshot, Notify};

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

/// A `Create` waiting for its node's answer.
#[derive(Debug)]
pub(crate) struct Pending {
    /// The node it went to.
    pub node: usize,
    /// When the first handoff of the connection started (`None`: a handed-back connection
    /// passed on).
    pub first: Option<Instant>,
    /// The one answer for the connection's mover.
    pub tx: oneshot::Sender<Event>,
    /// Which offer of the connection this is: a connection handed back and passed on (even
    /// back to this node) gets a new entry under the same id while the mover of an earlier
    /// offer may still be finishing, and that one must not take the new entry away.
    pub offer: u64,
}

/// One worker's control connection to one node.
#[derive(Debug, Default)]
pub(crate) struct Link {
    /// The node answered the switch's `Hello` on the connection open now.
    up: AtomicBool,
    /// The sending half of the connection open now.
    sink: Mutex<Option<ControlSink>>,
    /// A write failed (the connection is to end; what it is is said once).
    failed: Mutex<Option<String>>,
    /// Wakes the flusher: the sink keeps a backlog, or a write failed.
    backlog: Notify,
    /// Frames sent are queued, not written, until [`Link::release`] (replies to frames read
    /// together go out together).
    held: AtomicBool,
    /// The `Create`s sent on this link that wait for their answer, by connection id.
    pending: Mutex<HashMap<u64, Pending>>,
}

impl Link {
    /// Whether the link is up: a handoff may be offered on it.
    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    /// A connection was opened: its frames go to `sink` from now on (the link is up once
    /// [`Link::set_up`] says so). Returns the handle the flusher waits on.
    pub fn open(&self, sink: ControlSink) -> SinkReady {
        let ready = sink.ready();
        *self.failed.lock() = None;
        self.held.store(false, Relaxed);
        *self.sink.lock() = Some(sink);
        ready
    }

    /// The node answered `Hello`.
    pub fn set_up(&self) {
        self.up.store(true, Relaxed);
    }

    /// The connection ended: the link is down, its sink closed, and the handoffs waiting on it
    /// are returned (to be told how it ended).
    pub fn close(&self) -> Vec<(u64, Pending)> {
        self.up.store(false, Relaxed);
        self.sink.lock().take();
        self.pending.lock().drain().collect()
    }

    /// Sends a frame on the link while it is up; `false` when the frame never left (the link
    /// is down, or the frame cannot be encoded). A write that fails ends the connection, and
    /// the handoffs waiting on it learn of it from there.
    pub fn send(&self, msg: &Message, fd: Option<OwnedFd>) -> bool {
        self.is_up() && self.write(msg, fd)
    }

    /// Like [`Link::send`], but a frame without a descriptor is written by the link's flusher,
    /// once the tasks already woken on this thread have run: the frames they send meanwhile
    /// (the `Create`s of this thread's other connections) go out with the same write, in one
    /// packet. A frame with a descriptor travels alone anyway and is written at once.
    pub fn send_soon(&self, msg: &Message, fd: Option<OwnedFd>) -> bool {
        if fd.is_some() {
            return self.send(msg, fd);
        }
        if !self.is_up() {
            return false;
        }
        let mut sink = self.sink.lock();
        let Some(s) = sink.as_mut() else {
            return false;
        };
        match s.queue(msg, None) {
            Ok(()) => {
                self.backlog.notify_one();
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, id = ?msg.id(), "control frame not encodable");
                false
            }
        }
    }

    /// Sends a frame on the open connection, up or not (the `Hello`).
    pub fn write(&self, msg: &Message, fd: Option<OwnedFd>) -> bool {
        let mut sink = self.sink.lock();
        let Some(s) = sink.as_mut() else {
            return false;
        };
        let r = if self.held.load(Relaxed) {
            s.queue(msg, fd).map(|()| true)
        } else {
            s.send(msg, fd)
        };
        match r {
            Ok(true) => true,
            Ok(false) => {
                self.backlog.notify_one();
                true
            }
            Err(switchyard_handoff::HandoffError::Proto(e)) => {
                tracing::warn!(error = %e, id = ?msg.id(), "control frame not encodable");
                false
            }
            Err(e) => {
                // Any part of it may have left.
                self.failed.lock().get_or_insert_with(|| e.to_string());
                self.backlog.notify_one();
                true
            }
        }
    }

    /// Queue frames sent from now on until [`Link::release`]. Only for a stretch without a
    /// suspension point: frames of other tasks must not wait behind it.
    pub fn hold(&self) {
        self.held.store(true, Relaxed);
    }

    /// Write what was queued since [`Link::hold`] (what the socket does not take goes to the
    /// flusher).
    pub fn release(&self) {
        if !self.held.swap(false, Relaxed) {
            return;
        }
        let r = match self.sink.lock().as_mut() {
            Some(s) if !s.is_flushed() => s.try_flush(),
            _ => return,
        };
        match r {
            Ok(true) => {}
            Ok(false) => self.backlog.notify_one(),
            Err(e) => {
                self.failed.lock().get_or_insert_with(|| e.to_string());
                self.backlog.notify_one();
            }
        }
    }

    /// Writes the backlog whenever there is one, until the connection is closed or a write
    /// fails (`Err`: the connection must end).
    pub async fn run_flusher(&self, ready: SinkReady) -> Result<(), String> {
        loop {
            self.backlog.notified().await;
            loop {
                if let Some(e) = self.failed.lock().take() {
                    return Err(e);
                }
                let r = match self.sink.lock().as_mut() {
                    Some(s) => s.try_flush(),
                    None => return Ok(()),
                };
                match r {
                    Ok(true) => break,
                    Ok(false) => ready.writable().await.map_err(|e| e.to_string())?,
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
    }

    /// Connection `id`'s `Create` is about to go on this link: its answer goes to `p`.
    pub fn wait(&self, id: u64, p: Pending) {
        self.pending.lock().insert(id, p);
    }

    /// The waiting handoff of connection `id`, taken out to be answered.
    pub fn answer(&self, id: u64) -> Option<Pending> {
        self.pending.lock().remove(&id)
    }

    /// Withdraws offer `offer` of connection `id`: `true` if its entry was still there (no
    /// answer can reach its handoff any more), `false` if an answer took it first.
    pub fn withdraw(&self, id: u64, offer: u64) -> bool {
        let mut pending = self.pending.lock();
        match pending.get(&id) {
            Some(p) if p.offer == offer => pending.remove(&id).is_some(),
            _ => false,
        }
    }
}
