//! Idle persistent connections to peers, kept per thread and per peer.
//!
//! A tokio socket is registered with the reactor of the runtime that opened it, so a pooled
//! connection is handed out only on the thread that returned it: each thread has its own list
//! per pool and peer, found through a thread-local map. Each list has its own lock, which only
//! [`Pool::clear`] takes from another thread: the pool keeps a registry of the lists, so that it
//! closes every idle connection from any thread (a peer went down or left the configuration),
//! and [`Pool::idle`] counts them all. A thread's lists close with the thread.
//!
//! An idle connection the peer has meanwhile closed (or that carries stray bytes) has its read
//! readiness set; such connections are checked with a non-blocking read when they are taken
//! and dropped. This costs no system call for a connection with nothing pending. A close that
//! the runtime has not yet seen is caught by [`crate::exchange()`]: the failure of a reused
//! connection before any response byte is marked retryable.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::TcpStream;

use crate::{Connection, Error};

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// The map of a thread's lists: looked up twice per relayed request (taken, put back), by keys
/// from the configuration, never from a client, so a fast fixed hasher (foldhash) serves
/// rather than SipHash, which cost about 350 instructions per lookup of an address.
type ListMap = HashMap<(u64, SocketAddr), Arc<List>, foldhash::fast::FixedState>;

thread_local! {
    /// This thread's idle lists, by pool and peer.
    static LISTS: RefCell<ListMap> = RefCell::new(ListMap::default());
}

/// What the lists of one pool share.
#[derive(Debug)]
struct Shared {
    /// Idle connections over all threads and peers.
    idle: AtomicUsize,
    /// Most idle connections kept over all threads and peers.
    max_idle: AtomicUsize,
    /// Most idle connections kept per thread and peer.
    max_per_list: usize,
    /// The pool was dropped: its lists are removed from the threads' maps as they are seen.
    closed: AtomicBool,
    /// Every thread's lists, to clear them from anywhere.
    lists: Mutex<Vec<Weak<List>>>,
}

/// One thread's idle connections to one peer, most recently used last.
#[derive(Debug)]
struct List {
    conns: Mutex<Vec<Connection>>,
    shared: Arc<Shared>,
}

impl Drop for List {
    fn drop(&mut self) {
        let n = self.conns.get_mut().len();
        self.shared.idle.fetch_sub(n, Relaxed);
    }
}

/// Idle connections to peers, per thread and per peer. See the module docs.
#[derive(Debug)]
pub struct Pool {
    id: u64,
    shared: Arc<Shared>,
    /// The address new connections leave from, while this host has it.
    source: Option<IpAddr>,
    /// `source` was found not to be this host's: new connections leave from the default one.
    source_gone: AtomicBool,
}

impl Pool {
    /// A pool keeping at most `max_idle` idle connections over all threads and peers, and at
    /// most `max_per_thread` per thread and peer.
    pub fn new(max_idle: usize, max_per_thread: usize) -> Self {
        Pool {
            id: NEXT_POOL.fetch_add(1, Relaxed),
            shared: Arc::new(Shared {
                idle: AtomicUsize::new(0),
                max_idle: AtomicUsize::new(max_idle),
                max_per_list: max_per_thread,
                closed: AtomicBool::new(false),
                lists: Mutex::new(Vec::new()),
            }),
            source: None,
            source_gone: AtomicBool::new(false),
        }
    }

    /// New connections leave from `ip` (any port), so that peers see the address this host is
    /// known by. If this host does not have `ip` (a public address in front of a NAT, say), a
    /// warning is logged once and connections leave from the address the routing table picks.
    pub fn with_source(mut self, ip: IpAddr) -> Self {
        self.source = Some(ip);
        self
    }

    /// A new connection to `peer` (never an idle one), from the pool's source address.
    pub async fn connect(&self, peer: SocketAddr, limit: Duration) -> Result<Connection, Error> {
        let source = self.source.filter(|_| !self.source_gone.load(Relaxed));
        match crate::connect_from(peer, source, limit).await {
            Err(Error::Source { ip, source: e }) => {
                if !self.source_gone.swap(true, Relaxed) {
                    tracing::warn!(%ip, error = %e, "not an address of this host: connections to peers leave from the default address");
                }
                crate::connect(peer, limit).await
            }
            r => r,
        }
    }

    /// Change the limit over all threads and peers; connections over it are dropped as they
    /// come back.
    pub fn set_max_idle(&self, max_idle: usize) {
        self.shared.max_idle.store(max_idle, Relaxed);
    }

    /// Idle connections over all threads and peers.
    pub fn idle(&self) -> usize {
        self.shared.idle.load(Relaxed)
    }

    /// An idle connection to `peer` opened on this thread that still looks open, if any.
    pub fn take(&self, peer: SocketAddr) -> Option<Connection> {
        LISTS.with(|m| {
            let m = m.borrow();
            let list = m.get(&(self.id, peer))?;
            let mut conns = list.conns.lock();
            while let Some(c) = conns.pop() {
                self.shared.idle.fetch_sub(1, Relaxed);
                if still_open(&c.stream) {
                    return Some(c.reuse());
                }
            }
            None
        })
    }

    /// An idle connection to `peer` if there is one, else a new one (see [`crate::connect`]).
    pub async fn checkout(&self, peer: SocketAddr, limit: Duration) -> Result<Connection, Error> {
        match self.take(peer) {
            Some(c) => Ok(c),
            None => self.connect(peer, limit).await,
        }
    }

    /// Keep `conn` for reuse on this thread. Call only when its last response was read
    /// completely; a connection holding unread bytes is dropped. Returns whether it was kept
    /// (the limits may be reached).
    pub fn put(&self, conn: Connection) -> bool {
        if !conn.buf.is_empty() {
            return false;
        }
        let key = (self.id, conn.peer);
        LISTS.with(|m| {
            let mut m = m.borrow_mut();
            let list = match m.get(&key) {
                Some(l) => l,
                None => {
                    // Forget the lists of pools that are gone.
                    m.retain(|_, l| !l.shared.closed.load(Relaxed));
                    let list = Arc::new(List {
                        conns: Mutex::new(Vec::new()),
                        shared: self.shared.clone(),
                    });
                    let mut all = self.shared.lists.lock();
                    all.retain(|w| w.strong_count() > 0);
                    all.push(Arc::downgrade(&list));
                    drop(all);
                    m.entry(key).or_insert(list)
                }
            };
            let mut conns = list.conns.lock();
            let sh = &self.shared;
            if conns.len() >= sh.max_per_list || sh.idle.load(Relaxed) >= sh.max_idle.load(Relaxed)
            {
                return false;
            }
            conns.push(conn.into_idle());
            sh.idle.fetch_add(1, Relaxed);
            true
        })
    }

    /// Close every idle connection of every thread. Dropping a socket from another thread is
    /// allowed; it only deregisters it from its runtime.
    pub fn clear(&self) {
        let lists: Vec<Arc<List>> = self
            .shared
            .lists
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for l in lists {
            let drained = std::mem::take(&mut *l.conns.lock());
            self.shared.idle.fetch_sub(drained.len(), Relaxed);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.closed.store(true, Relaxed);
        self.clear();
    }
}

/// Whether an idle connection is still usable: nothing to read and not closed.
///
/// Asked through `try_io`, which answers from the readiness the runtime has cached, without a
/// system call and without registering a waker, for a connection that saw no event while idle
/// (the usual case); `poll_read_ready` took the registration's lock to store a waker each
/// time. Only a connection the runtime saw become readable is read: one byte, peeked.
fn still_open(s: &TcpStream) -> bool {
    let peeked = s.try_io(tokio::io::Interest::READABLE, || {
        let mut b = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        socket2::SockRef::from(s).peek(&mut b)
    });
    // WouldBlock (nothing cached, or a stale readiness the failed read cleared): open.
    // Anything read (stray bytes), the peer's close (0) or an error: not usable.
    matches!(peeked, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    const LIMIT: Duration = Duration::from_secs(5);

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Connections the peer closed, or wrote stray bytes on, are skipped; an open one is
    /// handed out again, marked reused.
    #[tokio::test]
    async fn closed_idle_connections_are_skipped() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let pool = Pool::new(8, 8);
        let c1 = crate::connect(addr, LIMIT).await.unwrap();
        let (mut s1, _) = l.accept().await.unwrap();
        let c2 = crate::connect(addr, LIMIT).await.unwrap();
        let (s2, _) = l.accept().await.unwrap();
        assert!(!c1.reused());
        // The peer writes garbage on the first and closes the second; the sockets see it.
        s1.write_all(b"x").await.unwrap();
        drop(s2);
        c1.stream().readable().await.unwrap();
        c2.stream().readable().await.unwrap();
        assert!(pool.put(c1));
        assert!(pool.put(c2));
        assert_eq!(pool.idle(), 2);
        assert!(pool.take(addr).is_none());
        assert_eq!(pool.idle(), 0);
        let c3 = pool.checkout(addr, LIMIT).await.unwrap();
        let (_s3, _) = l.accept().await.unwrap();
        assert!(!c3.reused());
        assert!(pool.put(c3));
        let again = pool.take(addr).expect("an open connection is reused");
        assert!(again.reused());
        assert_eq!(pool.idle(), 0);
    }

    /// A connection whose last read drained its socket (it came back short) is checked at its
    /// checkout from the cached readiness alone, with no system call; a close that comes
    /// later sets the readiness again and is seen.
    #[tokio::test]
    async fn a_drained_connection_is_checked_without_a_system_call() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let pool = Pool::new(8, 8);
        let mut c = crate::connect(addr, LIMIT).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        s.write_all(b"HTTP/1.1").await.unwrap();
        let until = tokio::time::Instant::now() + LIMIT;
        assert_eq!(c.read_more(until).await.unwrap(), 8);
        c.buf.clear();
        let mut tried = false;
        let r = c.stream().try_io(tokio::io::Interest::READABLE, || {
            tried = true;
            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
        });
        assert!(r.is_err());
        assert!(
            !tried,
            "a short read leaves the readiness set: the check would peek"
        );
        assert!(pool.put(c));
        let c = pool.take(addr).expect("an open connection is reused");
        drop(s);
        c.stream().readable().await.unwrap();
        assert!(pool.put(c));
        assert!(pool.take(addr).is_none(), "the peer's close is seen");
    }

    /// The limits hold per thread and peer and over the whole pool.
    #[tokio::test]
    async fn limits_are_kept() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let l2 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr2 = l2.local_addr().unwrap();
        let pool = Pool::new(3, 2);
        let mut kept = Vec::new();
        for a in [addr, addr, addr, addr2, addr2] {
            kept.push(pool.put(crate::connect(a, LIMIT).await.unwrap()));
        }
        // Two to the first peer (per-thread limit), one to the second (pool limit).
        assert_eq!(kept, [true, true, false, true, false]);
        assert_eq!(pool.idle(), 3);
        pool.set_max_idle(0);
        assert!(pool.take(addr).is_some());
        assert!(!pool.put(crate::connect(addr, LIMIT).await.unwrap()));
        pool.clear();
        assert_eq!(pool.idle(), 0);
        assert!(pool.take(addr2).is_none());
    }

    /// A connection is handed out only on the thread that returned it, and `clear` empties
    /// every thread's lists.
    #[test]
    fn pools_are_per_thread() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let pool = Arc::new(Pool::new(8, 8));
        let on_thread = |f: fn(&Pool, SocketAddr) -> bool| {
            let pool = pool.clone();
            std::thread::spawn(move || rt().block_on(async move { f(&pool, addr) }))
                .join()
                .unwrap()
        };
        let put = |p: &Pool, a: SocketAddr| {
            let s = std::net::TcpStream::connect(a).unwrap();
            s.set_nonblocking(true).unwrap();
            p.put(Connection::new(TcpStream::from_std(s).unwrap(), a, false))
        };
        let take = |p: &Pool, a: SocketAddr| p.take(a).is_some();
        // A thread that pooled a connection and ended closed it with its lists.
        assert!(on_thread(put));
        assert_eq!(pool.idle(), 0);
        let rt = rt();
        let _guard = rt.enter();
        assert!(put(&pool, addr));
        assert_eq!(pool.idle(), 1);
        assert!(!on_thread(take));
        assert_eq!(pool.idle(), 1);
        // Cleared from another thread.
        let p = pool.clone();
        std::thread::spawn(move || p.clear()).join().unwrap();
        assert_eq!(pool.idle(), 0);
        assert!(!take(&pool, addr));
    }

    #[test]
    fn new_connections_leave_from_the_pools_source_address() {
        rt().block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let from = "127.0.0.2".parse().unwrap();
            let pool = Pool::new(4, 4).with_source(from);
            let (c, accepted) = tokio::join!(pool.checkout(addr, LIMIT), l.accept());
            assert_eq!(c.unwrap().stream().local_addr().unwrap().ip(), from);
            assert_eq!(accepted.unwrap().1.ip(), from);
            // An address this host does not have: the connection leaves from the default one.
            let pool = Pool::new(4, 4).with_source("192.0.2.7".parse().unwrap());
            for _ in 0..2 {
                let (c, accepted) = tokio::join!(pool.connect(addr, LIMIT), l.accept());
                assert!(c.is_ok());
                assert_eq!(accepted.unwrap().1.ip().to_string(), "127.0.0.1");
            }
            assert!(pool.source_gone.load(Relaxed));
            // Without a pool, the failure is its own error.
            let e = crate::connect_from(addr, Some("192.0.2.7".parse().unwrap()), LIMIT)
                .await
                .err()
                .unwrap();
            assert!(matches!(e, Error::Source { .. }), "{e}");
        });
    }
}
