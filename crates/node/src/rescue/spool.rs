//! One origin fetch for an object above `max_object_bytes`, shared by every client that asks
//! for it while it is under way.
//!
//! Such an object is not stored, so without sharing a crowd on a large file would make one
//! origin fetch per client. The fetch instead writes the body, as it arrives, to an anonymous
//! temporary file (unlinked from the start: it goes away with the last handle), and publishes
//! how many bytes are there on a `watch` channel; each client's connection reads the file from
//! its own offset (positional reads, no shared cursor) as it grows and writes to its client at
//! that client's pace.
//!
//! Why a file rather than a broadcast of chunks: a broadcast channel keeps a bounded window of
//! chunks, so a slow client falls behind it and loses data (it would need a fetch of its own),
//! and a client arriving after the first chunk has gone by cannot start at all; keeping every
//! chunk in memory instead is unbounded. The file gives every reader the whole body from byte
//! 0 whatever its pace and when it joined, holds the fetch back for no one, and keeps memory
//! bounded: one read buffer for the fetch and one per client. The body is in the page cache
//! while it is hot, on disk beyond it. Only bodies framed by `Content-Length` are spooled (a
//! client is promised a length before the body has arrived); chunked and until-close ones
//! above the cap are still relayed per client.
//!
//! File writes and reads are plain positional calls on the runtime thread: they go to the
//! page cache in pieces of at most [`CHUNK`] bytes, like the node's own file reads.
//!
//! The spool files in use at once are bounded in bytes ([`SpoolBudget`], `[rescue.proxy]
//! spool_bytes`): a spool reserves its whole length before its file is made and gives it back
//! when the last client is done with it (the file goes with it). An object that does not fit
//! is relayed to each client, as one without a length is.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use switchyard_upstream::{Connection, Pool};
use tokio::sync::watch;
use tokio::time::Instant;

use super::fetch::Kept;

/// Most bytes taken from the origin or read for a client at once.
pub(crate) const CHUNK: usize = 64 * 1024;

/// How far the fetch has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// This many body bytes are in the file.
    Writing(u64),
    /// The whole body is in the file.
    Done,
    /// The fetch broke off after this many bytes; no more will come.
    Failed(u64),
}

/// The disk bytes the spool files may take at once.
#[derive(Debug)]
pub(crate) struct SpoolBudget {
    cap: u64,
    used: AtomicU64,
}

impl SpoolBudget {
    pub(crate) fn new(cap: u64) -> Arc<SpoolBudget> {
        Arc::new(SpoolBudget {
            cap,
            used: AtomicU64::new(0),
        })
    }

    /// Take `len` bytes of the budget, if they are free.
    pub(crate) fn reserve(self: &Arc<Self>, len: u64) -> Option<Reserved> {
        self.used
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(len).filter(|&total| total <= self.cap)
            })
            .ok()?;
        Some(Reserved {
            budget: self.clone(),
            len,
        })
    }

    /// Bytes reserved now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }
}

/// Bytes of the [`SpoolBudget`] held by one spool; given back when dropped.
#[derive(Debug)]
pub(crate) struct Reserved {
    budget: Arc<SpoolBudget>,
    len: u64,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.len, Relaxed);
    }
}

/// A large response being fetched once for every client that waits for it.
#[derive(Debug)]
pub(crate) struct Spool {
    /// The origin's status.
    pub(crate) status: u16,
    /// The origin's headers the proxy keeps.
    pub(crate) kept: Kept,
    /// The body's length (`Content-Length`).
    pub(crate) len: u64,
    file: File,
    progress: watch::Sender<Progress>,
    /// The spool's share of the budget, held while anyone holds the spool.
    _reserved: Reserved,
}

impl Spool {
    /// A spool for a body of `len` bytes (reserved in `reserved`), in an anonymous file in
    /// `dir` (the temporary directory when `None`).
    pub(crate) fn new(
        status: u16,
        kept: Kept,
        reserved: Reserved,
        dir: Option<&Path>,
    ) -> std::io::Result<Spool> {
        let file = match dir {
            Some(d) => tempfile::tempfile_in(d)?,
            None => tempfile::tempfile()?,
        };
        Ok(Spool {
            status,
            kept,
            len: reserved.len,
            file,
            progress: watch::Sender::new(Progress::Writing(0)),
            _reserved: reserved,
        })
    }

    /// Follow the fetch's progress.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Fill the file from `conn` (whose response head said `len` body bytes) by `until`;
    /// `true` when the whole body arrived. The connection goes back to `pool` when the origin
    /// keeps it open and nothing beyond the body came.
    pub(crate) async fn fill(
        &self,
        mut conn: Connection,
        keep_alive: bool,
        pool: &Pool,
        until: Instant,
    ) -> bool {
        let mut have = 0u64;
        while have < self.len {
            let want = (self.len - have).min(CHUNK as u64) as usize;
            let chunk = match conn.take_some(want, until).await {
                Ok(c) if !c.is_empty() => c,
                Ok(_) => {
                    tracing::debug!(origin = %conn.peer(), have, len = self.len, "origin closed a spooled body early");
                    self.progress.send_replace(Progress::Failed(have));
                    return false;
                }
                Err(e) => {
                    tracing::debug!(origin = %conn.peer(), have, error = %e, "spooled fetch broke off");
                    self.progress.send_replace(Progress::Failed(have));
                    return false;
                }
            };
            if let Err(e) = self.file.write_all_at(&chunk, have) {
                tracing::warn!(error = %e, "cannot write the spool file");
                self.progress.send_replace(Progress::Failed(have));
                return false;
            }
            have += chunk.len() as u64;
            self.progress.send_replace(Progress::Writing(have));
        }
        if keep_alive && conn.buffered().is_empty() {
            pool.put(conn);
        }
        self.progress.send_replace(Progress::Done);
        true
    }

    /// Wait until body bytes beyond `offset` are in the file, then append up to `max` of them
    /// to `out`; `Ok(0)` at the end of the body, `Err` when the fetch broke off before it.
    pub(crate) async fn read(
        &self,
        rx: &mut watch::Receiver<Progress>,
        offset: u64,
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<usize, SpoolBroken> {
        if offset >= self.len {
            return Ok(0);
        }
        let available = loop {
            let p = *rx.borrow_and_update();
            match p {
                Progress::Done => break self.len,
                Progress::Writing(n) if n > offset => break n,
                Progress::Failed(n) if n > offset => break n,
                Progress::Failed(_) => return Err(SpoolBroken),
                Progress::Writing(_) => {}
            }
            // The sender lives in the spool, which the caller holds: `changed` cannot fail.
            if rx.changed().await.is_err() {
                return Err(SpoolBroken);
            }
        };
        let n = (available - offset).min(max as u64) as usize;
        let start = out.len();
        out.resize(start + n, 0);
        match self.file.read_exact_at(&mut out[start..], offset) {
            Ok(()) => Ok(n),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the spool file");
                out.truncate(start);
                Err(SpoolBroken)
            }
        }
    }
}

/// The spooled fetch broke off before the body was complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpoolBroken;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readers_get_the_whole_body_whenever_they_start() {
        let (origin, client) = listener().await;
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let budget = SpoolBudget::new(1 << 20);
        let reserved = budget.reserve(body.len() as u64).unwrap();
        let spool = Arc::new(Spool::new(200, Kept::default(), reserved, None).unwrap());
        let pool = Pool::new(4, 4);
        let conn = switchyard_upstream::connect(client, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        let filling = {
            let spool = spool.clone();
            tokio::spawn(async move {
                let until = Instant::now() + std::time::Duration::from_secs(10);
                spool.fill(conn, false, &pool, until).await
            })
        };
        let (mut socket, _) = origin.accept().await.unwrap();
        // An early reader and, after the first half is in, a late one.
        let early = {
            let spool = spool.clone();
            tokio::spawn(async move { read_all(&spool).await })
        };
        use tokio::io::AsyncWriteExt;
        socket.write_all(&body[..100_000]).await.unwrap();
        let mut rx = spool.subscribe();
        rx.wait_for(|p| *p == Progress::Writing(100_000))
            .await
            .unwrap();
        let late = {
            let spool = spool.clone();
            tokio::spawn(async move { read_all(&spool).await })
        };
        socket.write_all(&body[100_000..]).await.unwrap();
        assert!(filling.await.unwrap());
        assert_eq!(early.await.unwrap().unwrap(), body);
        assert_eq!(late.await.unwrap().unwrap(), body);
    }

    #[tokio::test]
    async fn readers_see_a_fetch_that_broke_off() {
        let (origin, client) = listener().await;
        let budget = SpoolBudget::new(1000);
        let dir = tempfile::tempdir().unwrap();
        let reserved = budget.reserve(1000).unwrap();
        let spool = Arc::new(Spool::new(200, Kept::default(), reserved, Some(dir.path())).unwrap());
        let pool = Pool::new(4, 4);
        let conn = switchyard_upstream::connect(client, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        let (mut socket, _) = origin.accept().await.unwrap();
        use tokio::io::AsyncWriteExt;
        socket.write_all(&[7u8; 300]).await.unwrap();
        drop(socket);
        let until = Instant::now() + std::time::Duration::from_secs(10);
        assert!(!spool.fill(conn, false, &pool, until).await);
        // The 300 bytes that came are readable; then the reader learns it ends there.
        let mut rx = spool.subscribe();
        let mut out = Vec::new();
        assert_eq!(spool.read(&mut rx, 0, CHUNK, &mut out).await, Ok(300));
        assert_eq!(out, vec![7u8; 300]);
        assert_eq!(
            spool.read(&mut rx, 300, CHUNK, &mut out).await,
            Err(SpoolBroken)
        );
    }

    #[test]
    fn the_budget_bounds_the_spools_open_at_once() {
        let budget = SpoolBudget::new(1000);
        let a = budget.reserve(600).unwrap();
        assert!(budget.reserve(401).is_none());
        let b = budget.reserve(400).unwrap();
        assert_eq!(budget.used(), 1000);
        assert!(budget.reserve(1).is_none());
        assert!(budget.reserve(u64::MAX).is_none());
        drop(a);
        assert_eq!(budget.used(), 400);
        let spool = Spool::new(200, Kept::default(), budget.reserve(600).unwrap(), None).unwrap();
        assert_eq!(spool.len, 600);
        drop(b);
        // Given back when the last holder of the spool lets go.
        let shared = Arc::new(spool);
        let reader = shared.clone();
        drop(shared);
        assert_eq!(budget.used(), 600);
        drop(reader);
        assert_eq!(budget.used(), 0);
    }

    async fn read_all(spool: &Spool) -> Result<Vec<u8>, SpoolBroken> {
        let mut rx = spool.subscribe();
        let mut out = Vec::new();
        loop {
            let n = spool
                .read(&mut rx, out.len() as u64, 4096, &mut out)
                .await?;
            if n == 0 {
                return Ok(out);
            }
        }
    }

    /// A listening origin and its address.
    async fn listener() -> (tokio::net::TcpListener, std::net::SocketAddr) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }
}
