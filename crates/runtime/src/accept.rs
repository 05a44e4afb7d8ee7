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
//! longest on its client ([`crate::shed`]) and, if there was one, waits up
//! to [`SHED_WAIT`] for the slot it frees.
//!
//! When `accept(2)` fails for lack of resources (`EMFILE`, `ENFILE`,
//! `ENOBUFS`, `ENOMEM`) the pending connection stays queued and the listener
//! stays readable, so retrying at once would spin: the loop backs off,
//! doubling the pause from [`BACKOFF_MIN`] up to [`BACKOFF_MAX`], and logs
//! one warning per burst of failures (and how many there were once an accept
//! succeeds again). Errors that concern only the connection being accepted
//! (it was reset or aborted while queued) are skipped at once.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::shed::WaitingClients;

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
        stream: TcpStream,
        peer: SocketAddr,
        slot: OwnedSemaphorePermit,
    },
    /// A connection that arrived with every slot taken ([`WhenFull::Refuse`]).
    Over { stream: TcpStream, peer: SocketAddr },
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
    listener: &TcpListener,
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
        let mut slot = match slots.clone().try_acquire_owned() {
            Ok(s) => Some(s),
            Err(tokio::sync::TryAcquireError::NoPermits) => None,
            Err(tokio::sync::TryAcquireError::Closed) => return,
        };
        if slot.is_none() && waiting.shed_oldest() {
            stats.shed.fetch_add(1, Relaxed);
            match tokio::time::timeout(SHED_WAIT, slots.clone().acquire_owned()).await {
                Ok(Ok(s)) => slot = Some(s),
                Ok(Err(_)) => return,
                Err(_) => {}
            }
        }
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
