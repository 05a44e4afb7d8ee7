//! A back-end node as the switch sees it: its pool of persistent connections, its health and
//! its counters. A `Backend` outlives configuration reloads that keep its address, so its pool,
//! health and counters carry over.
//!
//! The pool is split per worker thread: a tokio connection is registered with the reactor of
//! the runtime that opened it, so a pooled connection is handed out only on the thread that
//! returned it. Threads that are not switch workers share one extra slot.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_policy::LoadReport;
use tokio::net::TcpStream;

thread_local! {
    /// The index of the switch worker running on this thread, if it is one.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Mark the current thread as switch worker `i` (its own pool slot in every backend).
pub(crate) fn set_worker(i: usize) {
    WORKER.with(|w| w.set(Some(i)));
}

/// One back-end node.
#[derive(Debug)]
pub(crate) struct Backend {
    pub addr: SocketAddr,
    /// Label used in metrics and logs.
    pub label: String,
    /// Idle persistent connections per worker thread (the last slot for any other thread),
    /// most recently used last.
    idle: Box<[Mutex<Vec<TcpStream>>]>,
    /// Idle connections over all slots.
    idle_total: AtomicUsize,
    pub max_idle: AtomicU64,
    /// In the pool of nodes that may be chosen.
    pub up: AtomicBool,
    /// Consecutive failures (health checks and failed node connections).
    pub fails: AtomicU32,
    /// Consecutive successful health checks while down.
    pub rises: AtomicU32,
    /// No longer part of the configuration: its health checker stops.
    pub retired: AtomicBool,
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub active: AtomicU64,
    pub failures: AtomicU64,
    pub connects: AtomicU64,
    pub last_report: Mutex<Option<LoadReport>>,
    /// The node's handoff control connection, when it has a control address.
    pub control: Option<std::sync::Arc<crate::handoff::Control>>,
}

impl Backend {
    /// A backend for a switch with `workers` worker threads.
    pub fn new(
        addr: SocketAddr,
        max_idle: usize,
        workers: usize,
        control: Option<crate::config::ControlAddr>,
    ) -> Self {
        Backend {
            addr,
            label: addr.to_string(),
            idle: (0..=workers).map(|_| Mutex::new(Vec::new())).collect(),
            idle_total: AtomicUsize::new(0),
            max_idle: AtomicU64::new(max_idle as u64),
            up: AtomicBool::new(true),
            fails: AtomicU32::new(0),
            rises: AtomicU32::new(0),
            retired: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            active: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            last_report: Mutex::new(None),
            control: control.map(|c| std::sync::Arc::new(crate::handoff::Control::new(c))),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    /// An idle pooled connection that still looks open, if any.
    ///
    /// A connection the node has closed meanwhile has its read readiness set (FIN or RST
    /// arrived); such connections are checked with a non-blocking read and dropped. This costs
    /// no system call for a connection with nothing pending.
    pub fn take_idle(&self) -> Option<TcpStream> {
        let slot = self.slot();
        loop {
            let s = slot.lock().pop()?;
            self.idle_total.fetch_sub(1, Relaxed);
            if still_open(&s) {
                return Some(s);
            }
        }
    }

    /// Return a connection whose last response was read completely. At most `max_idle` are
    /// kept per node, over all threads.
    pub fn put_idle(&self, s: TcpStream) {
        if !self.is_up() || self.retired.load(Relaxed) {
            return;
        }
        if (self.idle_total.load(Relaxed) as u64) < self.max_idle.load(Relaxed) {
            self.slot().lock().push(s);
            self.idle_total.fetch_add(1, Relaxed);
        }
    }

    /// Close every idle connection of every thread (node went down or left the
    /// configuration). Dropping a connection from another thread is allowed; it only
    /// deregisters it from its runtime.
    pub fn clear_idle(&self) {
        for slot in self.idle.iter() {
            let drained: Vec<TcpStream> = std::mem::take(&mut *slot.lock());
            self.idle_total.fetch_sub(drained.len(), Relaxed);
            drop(drained);
        }
    }

    pub fn idle_count(&self) -> usize {
        self.idle_total.load(Relaxed)
    }

    /// The pool slot of the current thread.
    fn slot(&self) -> &Mutex<Vec<TcpStream>> {
        let last = self.idle.len() - 1;
        let i = WORKER.with(|w| w.get()).map_or(last, |i| i.min(last));
        &self.idle[i]
    }

    /// Open a new connection to the node.
    pub async fn connect(&self, limit: Duration) -> std::io::Result<TcpStream> {
        self.connects.fetch_add(1, Relaxed);
        let s = match tokio::time::timeout(limit, TcpStream::connect(self.addr)).await {
            Ok(r) => r?,
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        };
        let _ = s.set_nodelay(true);
        Ok(s)
    }
}

/// Whether a pooled connection is still usable: nothing to read and not closed.
fn still_open(s: &TcpStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    match s.poll_read_ready(&mut cx) {
        Poll::Pending => true,
        Poll::Ready(Err(_)) => false,
        Poll::Ready(Ok(())) => {
            let mut b = [0u8; 1];
            // WouldBlock clears the stale readiness; anything else means closed or garbage.
            matches!(s.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn pool_drops_connections_the_node_closed() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = Backend::new(l.local_addr().unwrap(), 2, 1, None);
        let c1 = b.connect(Duration::from_secs(1)).await.unwrap();
        let (mut s1, _) = l.accept().await.unwrap();
        let c2 = b.connect(Duration::from_secs(1)).await.unwrap();
        let (s2, _) = l.accept().await.unwrap();
        let c3 = b.connect(Duration::from_secs(1)).await.unwrap();
        b.put_idle(c1);
        b.put_idle(c2);
        b.put_idle(c3); // over max_idle: dropped
        assert_eq!(b.idle_count(), 2);
        // The node closes the second one and writes garbage on the first.
        drop(s2);
        s1.write_all(b"x").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(b.take_idle().is_none());
        assert_eq!(b.idle_count(), 0);
        let c4 = b.connect(Duration::from_secs(1)).await.unwrap();
        let (_s4, _) = l.accept().await.unwrap();
        b.put_idle(c4);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(b.take_idle().is_some());
    }

    #[test]
    fn pools_are_per_worker_thread() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let b = std::sync::Arc::new(Backend::new(l.local_addr().unwrap(), 8, 2, None));
        // Each worker thread opens a connection on its own runtime and pools it.
        let on_worker = |i: usize, f: fn(&Backend) -> Option<bool>| {
            let b = b.clone();
            std::thread::spawn(move || {
                set_worker(i);
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(async move { f(&b) })
            })
            .join()
            .unwrap()
        };
        let put = |b: &Backend| {
            let s = std::net::TcpStream::connect(b.addr).ok()?;
            s.set_nonblocking(true).ok()?;
            b.put_idle(TcpStream::from_std(s).ok()?);
            None
        };
        on_worker(0, put);
        assert_eq!(b.idle_count(), 1);
        // Another worker does not get worker 0's connection.
        let take = |b: &Backend| Some(b.take_idle().is_some());
        assert_eq!(on_worker(1, take), Some(false));
        assert_eq!(b.idle_count(), 1);
        on_worker(1, put);
        assert_eq!(b.idle_count(), 2);
        // A removed node's pooled connections are dropped on every thread, and none are kept.
        b.retired.store(true, Relaxed);
        b.clear_idle();
        assert_eq!(b.idle_count(), 0);
        on_worker(0, put);
        assert_eq!(b.idle_count(), 0);
        assert_eq!(on_worker(0, take), Some(false));
    }
}
