//! One control connection, seen from the side that moves connections over it: the frames it
//! sends and the offers that wait for their answer.
//!
//! Whoever moves connections — the switch handing a client's connection to a node, a node
//! cloning one to its peer in cooperative mode — keeps a [`Link`] per control connection. The
//! task that owns a connection writes its `Create` itself (straight to the socket, the frame
//! and its descriptor with one `sendmsg`) and waits in [`offer`]; the reader of the control
//! connection, whoever runs it, hands the answer over with [`Link::answer`]. Frames the
//! socket does not take at once wait in the link's [`ControlSink`]; frames sent meanwhile join
//! them, and the link's flusher ([`Link::run_flusher`]) writes the backlog with one system call
//! once the socket has room. A `Create` without a descriptor (across hosts) is left to the
//! flusher from the start ([`Link::send_soon`]), so that the `Create`s of connections moved in
//! the same turn of the event loop share one write and one packet.
//!
//! Each waiting offer carries the sender's own bookkeeping (`T`: for the switch, which node
//! and when the handoff began), handed back with the answer.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use parking_lot::Mutex;
use serde::de::{self, Deserializer};
use serde::Deserialize;
use tokio::sync::{oneshot, Notify};

use crate::fdpass::{self, ControlReader, ControlSink, ControlWriter, SinkReady};
use crate::mover::{self, Event, Mover, MoverConfig, Outcome};
use crate::proto::Message;

/// Where a node takes connections moved to it (its handoff control listener).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ControlAddr {
    /// Same host: a Unix stream socket; connections travel as descriptors (`SCM_RIGHTS`).
    Unix(std::path::PathBuf),
    /// Another host: a TCP address; connections travel as `TCP_REPAIR` state.
    Tcp(SocketAddr),
}

impl fmt::Display for ControlAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ControlAddr::Tcp(a) => write!(f, "{a}"),
        }
    }
}

impl std::str::FromStr for ControlAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("empty Unix socket path in `unix:PATH`".into());
            }
            return Ok(ControlAddr::Unix(p.into()));
        }
        s.parse()
            .map(ControlAddr::Tcp)
            .map_err(|_| format!("invalid control address `{s}` (want unix:PATH or IP:PORT)"))
    }
}

impl<'de> Deserialize<'de> for ControlAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

impl ControlAddr {
    /// Whether connections moved over this address travel as descriptors (same host).
    pub fn same_host(&self) -> bool {
        matches!(self, ControlAddr::Unix(_))
    }

    /// Opens a control connection to this address.
    pub async fn connect(&self) -> std::io::Result<(ControlReader, ControlWriter)> {
        Ok(match self {
            ControlAddr::Unix(p) => fdpass::control_unix(tokio::net::UnixStream::connect(p).await?),
            ControlAddr::Tcp(a) => fdpass::control_tcp(tokio::net::TcpStream::connect(a).await?),
        })
    }
}

/// A `Create` waiting for its answer.
#[derive(Debug)]
pub struct Pending<T> {
    /// The sender's bookkeeping for this offer.
    pub data: T,
    /// The one answer for the connection's mover.
    pub tx: oneshot::Sender<Event>,
    /// Which offer of the connection this is: a connection handed back and passed on (even
    /// back to this node) gets a new entry under the same id while the mover of an earlier
    /// offer may still be finishing, and that one must not take the new entry away.
    pub offer: u64,
}

/// One control connection, from the side that offers connections over it.
#[derive(Debug)]
pub struct Link<T> {
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
    pending: Mutex<HashMap<u64, Pending<T>>>,
}

impl<T> Default for Link<T> {
    fn default() -> Self {
        Link {
            up: AtomicBool::new(false),
            sink: Mutex::new(None),
            failed: Mutex::new(None),
            backlog: Notify::new(),
            held: AtomicBool::new(false),
            pending: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Link<T> {
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
    pub fn close(&self) -> Vec<(u64, Pending<T>)> {
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
            Err(crate::HandoffError::Proto(e)) => {
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
    pub fn wait(&self, id: u64, p: Pending<T>) {
        self.pending.lock().insert(id, p);
    }

    /// The waiting handoff of connection `id`, taken out to be answered.
    pub fn answer(&self, id: u64) -> Option<Pending<T>> {
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

/// Offer connection `id` over `link` (`create` and the descriptor that travels with it) and run
/// the mover until the answer is definitive (see [`crate::mover`] for why the sender never
/// serves a connection the taker may serve). `offer` tells this offer apart from other offers
/// of the same connection (see [`Pending::offer`]); `data` is the sender's bookkeeping, given
/// to whoever reads the answer. The `Create` is written here, by the task that owns the
/// connection; the answer comes from the link's reader through [`Link::answer`], or from
/// [`Link::close`] when the connection ends.
pub async fn offer<T>(
    link: &Link<T>,
    id: u64,
    offer: u64,
    data: T,
    create: Message,
    fd: Option<OwnedFd>,
    cfg: MoverConfig,
) -> Outcome {
    let (tx, rx) = oneshot::channel();
    link.wait(id, Pending { data, tx, offer });
    let now = tokio::time::Instant::now().into_std();
    let mut m = Mover::new(id, cfg, now);
    if !link.send_soon(&create, fd) {
        m.handle(Event::NotSent);
    }
    drop(create);
    let outcome = mover::drive(
        &mut m,
        async { rx.await.ok() },
        |frame| {
            // If the link is down, its end reaches the mover through the waiting entry.
            link.send(&frame, None);
        },
        // Taking the entry out fences the expiry against an answer read meanwhile.
        || link.withdraw(id, offer),
    )
    .await;
    link.withdraw(id, offer);
    outcome
}
