//! Shedding: which connection gives up its slot when a new client arrives and every slot is
//! taken.
//!
//! A connection waiting on its client (idle between requests, or with a request head not yet
//! complete) is listed in [`WaitingClients`] for as long as it waits; a connection being
//! served is not. When the accept loop finds no free slot it asks the list to shed the
//! connection that has waited longest: that connection is told to close, and its slot goes to
//! the newcomer. Slow clients that hold connections open without completing requests
//! (slowloris) are thus the first to go, and a flood of them cannot lock out new clients;
//! a connection busy with a request is never interrupted.
//!
//! The order is the order in which connections began waiting (no clock): for a connection
//! that has answered, from its last write of that answer.

use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use dlv_list::{Index, VecList};
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// Connections waiting on their clients, oldest wait first.
///
/// A connection is shed by shutting down the reading side of its socket: its wait then ends
/// as if the client had closed (what it had already received is still read first), and the
/// connection closes by its ordinary path. This keeps the waiting connection's own state to
/// one ticket (no extra future beside its read). The shutdown is made while the list is locked,
/// and a ticket leaves the list (under the same lock) before its connection can close the
/// socket, so the descriptor shut down is always the listed connection's own.
///
/// Every request of every connection enters the list and leaves it, so the list is a linked
/// list in a vector (dlv-list): entering appends, leaving unlinks by the ticket's index and
/// shedding takes the front, each in a few steps and without hashing or rebalancing (an
/// ordered map's insert and remove were 330 of a node's 9,100 user-space instructions per
/// request, callgrind). A ticket's index carries a generation, so a ticket whose connection
/// was shed (taken off the list) cannot unlink a later tenant of its entry.
#[derive(Debug, Default)]
pub struct WaitingClients {
    waiting: Mutex<VecList<Listed>>,
    shed: AtomicU64,
    /// Woken whenever a connection begins to wait, while anyone watches ([`Self::entered`]).
    entered: Notify,
    /// [`Entered`] futures alive. A connection that begins to wait wakes them only when there
    /// are any: `Notify::notify_waiters` takes a lock that every thread would otherwise share
    /// at every wait of every connection, and someone watches only while shedding.
    watchers: AtomicUsize,
}

impl WaitingClients {
    /// An empty list.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// List the connection whose socket is `fd` as it begins to wait on its client; it leaves
    /// the list when the ticket drops, which must happen before the socket is closed. With
    /// `closed_at_shutdown`, [`Self::close_all`] ends its wait (see there).
    ///
    /// A connection that answers a request enters as it writes the answer and keeps the
    /// ticket for its next wait ([`crate::request::ClientConn::take_ticket`]): its client may
    /// send the next request (and others open new connections) as soon as the answer
    /// arrives, while the connection's task may run again only much later on a busy host.
    /// Entering again at each write keeps a connection whose client reads a long answer at
    /// the back of the order.
    pub fn enter(self: &Arc<Self>, fd: RawFd, closed_at_shutdown: bool) -> Waiting {
        let place = self.lock().push_back(Listed {
            fd,
            closed_at_shutdown,
        });
        // A watcher counted after this load locks the list after the insert (it counts itself
        // before it looks), so it sees this entry; one counted before is woken here.
        if self.watchers.load(SeqCst) != 0 {
            self.entered.notify_waiters();
        }
        Waiting {
            list: self.clone(),
            place,
            closed_at_shutdown,
        }
    }

    /// Shed the connection that has waited longest; false if none is waiting.
    pub fn shed_oldest(&self) -> bool {
        let mut waiting = self.lock();
        let Some(Listed { fd, .. }) = waiting.pop_front() else {
            return false;
        };
        // SAFETY: the listed connection has not dropped its ticket (it would have left the
        // list under this lock), so its socket is still open and `fd` is that socket.
        unsafe { libc::shutdown(fd, libc::SHUT_RD) };
        drop(waiting);
        self.shed.fetch_add(1, Relaxed);
        true
    }

    /// End the wait of every connection listed `closed_at_shutdown` as [`Self::shed_oldest`]
    /// ends one (not counted as shed): at shutdown, once the stop signal is set. A connection
    /// that enters the list after this call sees the stop signal when it checks it before its
    /// wait, so the waits themselves need not watch the signal
    /// ([`ClientConn::list_closed_at_shutdown`](crate::request::ClientConn::list_closed_at_shutdown)).
    /// The others (connections that may yet move to another host, where their closed reading
    /// side would go with them) are left to watch the signal.
    ///
    /// A listed connection whose client's bytes have already arrived, not yet read, is left
    /// alone too: a request is on its way, and its connection reads it as it would have a
    /// moment earlier and, as one part-way through a head, may finish it. Ended, it read what
    /// had come and then its end, and a client that had sent a head in two parts lost the
    /// request to a stop that came between the parts' arrival and their read.
    pub fn close_all(&self) {
        let waiting = self.lock();
        for Listed { fd, .. } in waiting.iter().filter(|l| l.closed_at_shutdown) {
            if has_unread(*fd) {
                continue;
            }
            // SAFETY: as in `shed_oldest`, a listed connection's socket is still open.
            unsafe { libc::shutdown(*fd, libc::SHUT_RD) };
        }
    }

    /// Resolves once a connection begins to wait after this future is enabled
    /// ([`Notified::enable`]) or first polled: enable it, then try [`Self::shed_oldest`], and
    /// no entry can slip in between unnoticed.
    pub fn entered(&self) -> Entered<'_> {
        self.watchers.fetch_add(1, SeqCst);
        Entered {
            // Boxed to keep `Entered` movable: made only while shedding, and in tests.
            notified: Box::pin(self.entered.notified()),
            list: self,
        }
    }

    /// Connections waiting now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no connection is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections shed so far.
    pub fn shed_count(&self) -> u64 {
        self.shed.load(Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecList<Listed>> {
        // The list stays consistent whatever panicked while holding it.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection in [`WaitingClients`].
#[derive(Debug)]
struct Listed {
    fd: RawFd,
    closed_at_shutdown: bool,
}

/// Resolves once a connection begins to wait: [`WaitingClients::entered`].
#[derive(Debug)]
pub struct Entered<'a> {
    notified: Pin<Box<Notified<'a>>>,
    list: &'a WaitingClients,
}

impl Entered<'_> {
    /// Count as waiting from now on, before the first poll ([`Notified::enable`]).
    pub fn enable(mut self: Pin<&mut Self>) {
        self.notified.as_mut().enable();
    }
}

impl Future for Entered<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.notified.as_mut().poll(cx)
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.list.watchers.fetch_sub(1, SeqCst);
    }
}

/// One connection's place in [`WaitingClients`] while it waits.
#[derive(Debug)]
pub struct Waiting {
    list: Arc<WaitingClients>,
    place: Index<Listed>,
    closed_at_shutdown: bool,
}

impl Waiting {
    /// Leave the connection to the stop signal from now on: part of its client's next
    /// request has arrived, and the client may finish it ([`WaitingClients::close_all`]
    /// passes it by). A shutdown that came before this call has ended the wait already, as
    /// it ends any wait that was idle when it began.
    pub fn keep_at_shutdown(&mut self) {
        if std::mem::take(&mut self.closed_at_shutdown) {
            if let Some(l) = self.list.lock().get_mut(self.place) {
                l.closed_at_shutdown = false;
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        // Nothing if the connection was shed: its entry has left, or has a new generation.
        self.list.lock().remove(self.place);
    }
}

/// Whether bytes from the peer wait unread on the socket `fd` (`FIONREAD`).
fn has_unread(fd: RawFd) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: `fd` is an open socket (see `close_all`) and `n` outlives the call.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    r == 0 && n > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (l.accept().unwrap().0, c)
    }

    #[test]
    fn the_longest_wait_is_shed_first_and_only_waiters_are_shed() {
        let list = WaitingClients::new();
        let (mut a, _ca) = pair();
        let (mut b, _cb) = pair();
        let (mut c, _cc) = pair();
        let ta = list.enter(a.as_raw_fd(), true);
        let tb = list.enter(b.as_raw_fd(), true);
        let tc = list.enter(c.as_raw_fd(), true);
        assert_eq!(list.len(), 3);
        // `a` was served in between: it waits again, now as the newest.
        drop(ta);
        let ta = list.enter(a.as_raw_fd(), true);
        assert!(list.shed_oldest());
        // A shed socket reads as closed by its client.
        assert_eq!(b.read(&mut [0u8; 8]).unwrap(), 0);
        assert!(list.shed_oldest());
        assert_eq!(c.read(&mut [0u8; 8]).unwrap(), 0);
        assert_eq!(list.len(), 1);
        drop(ta);
        assert!(list.is_empty());
        assert!(!list.shed_oldest());
        assert_eq!(list.shed_count(), 2);
        drop((tb, tc));
        assert!(list.is_empty());
        // `a` was never shed: it still waits for its client.
        a.set_nonblocking(true).unwrap();
        assert_eq!(
            a.read(&mut [0u8; 8]).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    }

    /// The ticket of a shed connection leaves alone the connection that took its place in
    /// the list after it.
    #[test]
    fn a_shed_ticket_does_not_unlist_the_next_tenant_of_its_place() {
        let list = WaitingClients::new();
        let (a, _ca) = pair();
        let (mut b, _cb) = pair();
        let ta = list.enter(a.as_raw_fd(), true);
        assert!(list.shed_oldest());
        // `b` enters where `a` was.
        let tb = list.enter(b.as_raw_fd(), true);
        drop(ta);
        assert_eq!(list.len(), 1, "b is still listed");
        assert!(list.shed_oldest());
        assert_eq!(
            b.read(&mut [0u8; 8]).unwrap(),
            0,
            "and it is b that is shed"
        );
        drop(tb);
        assert!(list.is_empty());
        assert_eq!(list.shed_count(), 2);
    }

    /// Every watcher enabled before an entry is woken by it, and counts only while it lives
    /// (an entry with nobody watching does not touch the notification's lock).
    #[tokio::test]
    async fn watchers_are_woken_by_the_next_entry_and_counted_while_they_live() {
        let list = WaitingClients::new();
        let (a, _ca) = pair();
        let ta = list.enter(a.as_raw_fd(), true);
        assert_eq!(list.watchers.load(SeqCst), 0);
        let first = list.entered();
        let second = list.entered();
        tokio::pin!(first, second);
        first.as_mut().enable();
        second.as_mut().enable();
        assert_eq!(list.watchers.load(SeqCst), 2);
        let ready = |f: Pin<&mut Entered<'_>>| {
            let waker = std::task::Waker::noop();
            f.poll(&mut Context::from_waker(waker)).is_ready()
        };
        // An entry made before the watchers does not wake them.
        assert!(!ready(first.as_mut()));
        let (b, _cb) = pair();
        let tb = list.enter(b.as_raw_fd(), true);
        assert!(ready(first.as_mut()));
        assert!(ready(second.as_mut()));
        drop((ta, tb));
    }

    #[test]
    fn dropped_watchers_are_uncounted() {
        let list = WaitingClients::new();
        let e = list.entered();
        assert_eq!(list.watchers.load(SeqCst), 1);
        drop(e);
        assert_eq!(list.watchers.load(SeqCst), 0);
    }

    /// At shutdown every connection listed to be closed then reads its end, none is counted
    /// as shed, and one not listed, listed to be left to the stop signal, kept since, or with
    /// its client's bytes already arrived, is left alone (and can still be shed).
    #[test]
    fn close_all_ends_every_wait_listed_to_end_at_shutdown() {
        let list = WaitingClients::new();
        let (mut a, mut ca) = pair();
        let (mut b, _cb) = pair();
        let (mut c, _cc) = pair();
        let (mut d, _cd) = pair();
        let (mut e, _ce) = pair();
        ca.write_all(b"GET").unwrap();
        let mut got = [0u8; 8];
        // The bytes have arrived (a blocking peek returns once they have), unread.
        assert_eq!(a.peek(&mut got).unwrap(), 3);
        let ta = list.enter(a.as_raw_fd(), true);
        let td = list.enter(d.as_raw_fd(), false);
        let tb = list.enter(b.as_raw_fd(), true);
        let mut te = list.enter(e.as_raw_fd(), true);
        te.keep_at_shutdown();
        list.close_all();
        assert_eq!(list.shed_count(), 0);
        assert_eq!(b.read(&mut got).unwrap(), 0);
        drop(tb);
        // `a` reads its request's first bytes (its wait over, it leaves the list) and may wait
        // for the rest.
        assert_eq!(a.read(&mut got).unwrap(), 3);
        drop(ta);
        for open in [&mut a, &mut c, &mut d, &mut e] {
            open.set_nonblocking(true).unwrap();
            assert_eq!(
                open.read(&mut got).unwrap_err().kind(),
                std::io::ErrorKind::WouldBlock
            );
        }
        ca.write_all(b" / HTTP/1.1").unwrap();
        a.set_nonblocking(false).unwrap();
        assert_eq!(a.read(&mut got).unwrap(), 8);
        assert!(list.shed_oldest());
        assert_eq!(d.read(&mut got).unwrap(), 0);
        drop((td, te));
    }
}
