//! The accept loop of a worker thread, shared by the node and the switch.
//!
//! Open connections are bounded by connection slots (a semaphore of
//! `max_connections` permits shared by every worker). A slot is taken once
//! a connection is accepted, never held while the loop waits for one, so
//! the free slots stay free for connections that arrive another way (a
//! node's handed-in connections). When every slot is taken the loop either
//! stops accepting, the connection it took waiting for a slot and new
//! clients in the kernel's accept queue ([`WhenFull::Wait`], the node), or
//! goes on accepting and hands the connection over without a slot so that
//! the caller can refuse it ([`WhenFull::Refuse`], the switch answers
//! `503`). Before either, the loop sheds the connection that has waited
//! longest on its client ([`crate::shed`]) and waits up to [`SHED_WAIT`] for
//! the slot it frees; with none waiting yet, it waits as long for a slot to
//! free up or a connection to begin waiting (and be shed).
//!
//! When `accept(2)` fails for lack of resources (`EMFILE`, `ENFILE`,
//! `ENOBUFS`, `ENOMEM`) the pending connection stays queued and the listener
//! stays readable, so retrying at once would spin: the loop backs off,
//! doubling the pause from [`BACKOFF_MIN`] up to [`BACKOFF_MAX`], and logs
//! one warning per burst of failures (and how many there were once an accept
//! succeeds again). Errors that concern only the connection being accepted
//! (it was reset or aborted while queued) are skipped at once.
//!
//! Connections come bare ([`ClientSocket`]): the event loop learns of one only when it must
//! wait, so that a request that arrived with the handshake is answered without registering it.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::shed::WaitingClients;
use crate::socket::ClientSocket;

/// A listening socket on a worker's event loop whose connections are accepted bare.
///
/// tokio's `TcpListener` registers every stream it accepts; this one waits for the listener's
/// readiness the same way and takes connections with `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)`,
/// leaving their registration to [`ClientSocket`].
#[derive(Debug)]
pub struct Listener(AsyncFd<std::net::TcpListener>);

impl Listener {
    /// Register `listener` with the current thread's event loop.
    pub fn new(listener: std::net::TcpListener) -> io::Result<Listener> {
        listener.set_nonblocking(true)?;
        // SAFETY: the `AsyncFd` owns the listener, whose descriptor stays the same and open
        // until both are dropped together.
        unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }
            .map(Listener)
            .map_err(|e| e.into_parts().1)
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.get_ref().local_addr()
    }

    /// The next connection, bare, and its client's address.
    pub async fn accept(&self) -> io::Result<(ClientSocket, SocketAddr)> {
        loop {
            let mut ready = self.0.readable().await?;
            // `WouldBlock` clears the readiness and the loop waits again.
            if let Ok(r) = ready.try_io(|l| accept_bare(l.get_ref())) {
                return r;
            }
        }
    }
}

/// `accept4(2)` with `SOCK_NONBLOCK | SOCK_CLOEXEC`: socket2's and std's `accept` set only
/// `SOCK_CLOEXEC`, and making the socket non-blocking afterwards would cost an `fcntl` per
/// connection.
fn accept_bare(l: &std::net::TcpListener) -> io::Result<(ClientSocket, SocketAddr)> {
    // SAFETY: `try_init` hands a zeroed address buffer and its length to `accept4`, which
    // fills at most that length; the descriptor it returns is new and owned by nobody else.
    let (fd, addr) = unsafe {
        socket2::SockAddr::try_init(|storage, len| {
            let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
            match libc::accept4(l.as_raw_fd(), storage.cast(), len, flags) {
                -1 => Err(io::Error::last_os_error()),
                fd => Ok(fd),
            }
        })?
    };
    // SAFETY: see above.
    let stream = unsafe { std::net::TcpStream::from_raw_fd(fd) };
    let peer = addr
        .as_socket()
        .ok_or_else(|| io::Error::other("accepted a connection without an IP address"))?;
    Ok((ClientSocket::bare(stream), peer))
}

/// First pause after a failed accept.
pub const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between retries while accepts keep failing.
pub const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Longest wait for the slot of a shed connection. It closes as soon as its
/// task sees the end of its input, which on a busy host can take well over
/// 100 ms of scheduling (a shorter wait refused newcomers with 503 while the
/// slot was on its way); the bound is only for a connection that is shed
/// just as its request completes and so keeps its slot.
pub const SHED_WAIT: Duration = Duration::from_secs(1);

/// What the accept loop does when every connection slot is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// Stop accepting until a slot frees up: the connection just accepted
    /// waits for it, new connections wait in the kernel's accept queue.
    Wait,
    /// Accept anyway and hand the connection over as [`Incoming::Over`].
    Refuse,
}

/// A connection the accept loop took.
#[derive(Debug)]
pub enum Incoming {
    /// A connection with its slot; the slot is free again when `slot` drops.
    Admitted {
        stream: ClientSocket,
        peer: SocketAddr,
        slot: OwnedSemaphorePermit,
    },
    /// A connection that arrived with every slot taken ([`WhenFull::Refuse`]).
    Over {
        stream: ClientSocket,
        peer: SocketAddr,
    },
}

/// Counters of one or more accept loops.
#[derive(Debug, Default)]
pub struct AcceptStats {
    /// Accepts that failed (all reasons).
    pub failures: AtomicU64,
    /// Pauses taken because accepts failed for lack of resources.
    pub backoffs: AtomicU64,
    /// Connections shed to make room for new ones.
    pub shed: AtomicU64,
}

/// Accept connections from `listener` until the slots' semaphore is closed,
/// giving each to `handle`. Run it on a worker thread; it ends only when
/// dropped (the worker's stop signal) or when `slots` is closed. With every
/// slot taken, the longest waiter of `waiting` is shed first.
pub async fn accept_loop<H>(
    listener: &Listener,
    slots: &Arc<Semaphore>,
    waiting: &WaitingClients,
    when_full: WhenFull,
    stats: &AcceptStats,
    mut handle: H,
) where
    H: FnMut(Incoming),
{
    let mut backoff = Backoff::default();
    loop {
        // No slot is held while the loop waits for a connection: the free
        // slots stay free for connections that arrive another way (a node's
        // handed-in connections).
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                stats.failures.fetch_add(1, Relaxed);
                if let Some(pause) = backoff.failed(&e) {
                    stats.backoffs.fetch_add(1, Relaxed);
                    tokio::time::sleep(pause).await;
                }
                continue;
            }
        };
        backoff.succeeded();
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => Some(s),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                match make_room(slots, waiting, stats).await {
                    Ok(s) => s,
                    Err(Closed) => return,
                }
            }
            Err(tokio::sync::TryAcquireError::Closed) => return,
        };
        let slot = match slot {
            Some(s) => Some(s),
            None => match when_full {
                WhenFull::Wait => match slots.clone().acquire_owned().await {
                    Ok(s) => Some(s),
                    Err(_) => return,
                },
                WhenFull::Refuse => None,
            },
        };
        handle(match slot {
            Some(slot) => Incoming::Admitted { stream, peer, slot },
            None => Incoming::Over { stream, peer },
        });
    }
}

/// The slots' semaphore was closed.
struct Closed;

/// Every slot is taken: find one for the connection just accepted within [`SHED_WAIT`], or
/// `None`. The longest waiter is shed and its slot awaited. With no connection waiting on its
/// client yet (those just admitted may not have begun to read: on a busy host the loop can
/// accept a whole queue of slow clients before any of their tasks runs), the loop waits for
/// whichever comes first: a slot freed by a connection that ends, or a connection beginning to
/// wait, which is then shed.
async fn make_room(
    slots: &Arc<Semaphore>,
    waiting: &WaitingClients,
    stats: &AcceptStats,
) -> Result<Option<OwnedSemaphorePermit>, Closed> {
    let deadline = tokio::time::Instant::now() + SHED_WAIT;
    loop {
        let entered = waiting.entered();
        tokio::pin!(entered);
        entered.as_mut().enable();
        if waiting.shed_oldest() {
            stats.shed.fetch_add(1, Relaxed);
            return match tokio::time::timeout_at(deadline, slots.clone().acquire_owned()).await {
                Ok(Ok(s)) => Ok(Some(s)),
                Ok(Err(_)) => Err(Closed),
                Err(_) => Ok(None),
            };
        }
        tokio::select! {
            s = slots.clone().acquire_owned() => return s.map(Some).map_err(|_| Closed),
            () = &mut entered => {}
            () = tokio::time::sleep_until(deadline) => return Ok(None),
        }
    }
}

/// Whether a failed accept means the process or system is out of a
/// resource (retrying at once would fail again).
pub fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Whether a failed accept concerns only the connection being accepted.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || matches!(e.raw_os_error(), Some(libc::EPROTO | libc::EPERM))
}

/// The pause state of one accept loop.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    /// Failures in the current burst.
    burst: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: BACKOFF_MIN,
            burst: 0,
        }
    }
}

impl Backoff {
    /// An accept failed: how long to pause before the next one, if at all.
    fn failed(&mut self, e: &io::Error) -> Option<Duration> {
        if is_connection_error(e) {
            tracing::debug!(error = %e, "accepted connection failed before use");
            return None;
        }
        if self.burst == 0 {
            tracing::warn!(
                error = %e,
                exhausted = is_resource_exhaustion(e),
                "accept failed; backing off until it succeeds again"
            );
        }
        self.burst += 1;
        let pause = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        Some(pause)
    }

    /// An accept succeeded: the burst, if any, is over.
    fn succeeded(&mut self) {
        if self.burst > 0 {
            tracing::info!(failures = self.burst, "accepting again");
            *self = Backoff::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_limit_and_reset_on_success() {
        let mut b = Backoff::default();
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let mut pauses = Vec::new();
        for _ in 0..10 {
            pauses.push(b.failed(&emfile).unwrap());
        }
        assert_eq!(pauses[0], BACKOFF_MIN);
        assert_eq!(pauses[1], BACKOFF_MIN * 2);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*pauses.last().unwrap(), BACKOFF_MAX);
        assert_eq!(b.burst, 10);
        b.succeeded();
        assert_eq!(b.burst, 0);
        assert_eq!(b.failed(&emfile), Some(BACKOFF_MIN));
    }

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (l.accept().unwrap().0, c)
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_waiter_yet_the_first_to_begin_waiting_is_shed() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let slots = Arc::new(Semaphore::new(1));
        let held = slots.clone().try_acquire_owned().unwrap();
        let waiting = WaitingClients::new();
        let stats = AcceptStats::default();
        let (mut slow, _client) = pair();
        let room = make_room(&slots, &waiting, &stats);
        tokio::pin!(room);
        // Nobody waits on a client yet and no slot frees: the loop waits, without refusing.
        assert!(tokio::time::timeout(SHED_WAIT / 2, &mut room)
            .await
            .is_err());
        assert_eq!(waiting.shed_count(), 0);
        // The admitted connection begins to wait: it is shed (its input ends) and its slot
        // awaited.
        let ticket = waiting.enter(slow.as_raw_fd(), true);
        assert!(tokio::time::timeout(SHED_WAIT / 4, &mut room)
            .await
            .is_err());
        assert_eq!(waiting.shed_count(), 1);
        assert_eq!(stats.shed.load(Relaxed), 1);
        assert_eq!(slow.read(&mut [0; 8]).unwrap(), 0);
        // It closes by its ordinary path, and the newcomer has its slot.
        drop(ticket);
        drop(held);
        assert!(matches!(room.await, Ok(Some(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_freed_while_waiting_is_taken_and_none_after_the_bound() {
        let slots = Arc::new(Semaphore::new(1));
        let waiting = WaitingClients::new();
        let stats = AcceptStats::default();
        let held = slots.clone().try_acquire_owned().unwrap();
        let start = tokio::time::Instant::now();
        // Nothing frees and nobody waits: no slot, after exactly the bound.
        assert!(matches!(
            make_room(&slots, &waiting, &stats).await,
            Ok(None)
        ));
        assert_eq!(start.elapsed(), SHED_WAIT);
        // A connection that ends frees its slot: taken without shedding anyone.
        let room = make_room(&slots, &waiting, &stats);
        tokio::pin!(room);
        assert!(tokio::time::timeout(SHED_WAIT / 2, &mut room)
            .await
            .is_err());
        drop(held);
        assert!(matches!(room.await, Ok(Some(_))));
        assert_eq!(stats.shed.load(Relaxed), 0);
        // Closed slots end the loop.
        slots.close();
        assert!(matches!(
            make_room(&slots, &waiting, &stats).await,
            Err(Closed)
        ));
    }

    #[test]
    fn a_connection_error_is_skipped_without_a_pause() {
        let mut b = Backoff::default();
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(b.failed(&aborted), None);
        assert_eq!(b.burst, 0);
        assert!(is_resource_exhaustion(&io::Error::from_raw_os_error(
            libc::ENFILE
        )));
        assert!(!is_resource_exhaustion(&aborted));
    }
}
