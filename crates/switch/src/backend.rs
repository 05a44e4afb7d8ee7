//! A back-end node as the switch sees it: its pool of persistent connections, its health and
//! its counters. A `Backend` outlives configuration reloads that keep its address, so its pool,
//! health and counters carry over.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_policy::LoadReport;
use tokio::net::TcpStream;

/// One back-end node.
#[derive(Debug)]
pub(crate) struct Backend {
    pub addr: SocketAddr,
    /// Label used in metrics and logs.
    pub label: String,
    /// Idle persistent connections, most recently used last.
    idle: Mutex<Vec<TcpStream>>,
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
}

impl Backend {
    pub fn new(addr: SocketAddr, max_idle: usize) -> Self {
        Backend {
            addr,
            label: addr.to_string(),
            idle: Mutex::new(Vec::new()),
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
        loop {
            let s = self.idle.lock().pop()?;
            if still_open(&s) {
                return Some(s);
            }
        }
    }

    /// Return a connection whose last response was read completely.
    pub fn put_idle(&self, s: TcpStream) {
        if !self.is_up() {
            return;
        }
        let mut idle = self.idle.lock();
        if (idle.len() as u64) < self.max_idle.load(Relaxed) {
            idle.push(s);
        }
    }

    /// Close every idle connection (node went down or left the configuration).
    pub fn clear_idle(&self) {
        let drained: Vec<TcpStream> = std::mem::take(&mut *self.idle.lock());
        drop(drained);
    }

    pub fn idle_count(&self) -> usize {
        self.idle.lock().len()
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
        let b = Backend::new(l.local_addr().unwrap(), 2);
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
}
