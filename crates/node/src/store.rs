//! Where response bodies come from: the object cache, or the disk.
//!
//! A request's clean path is looked up in the in-memory object cache
//! (bounded in bytes, replacement policy from config). A cached object is
//! trusted for `cache_revalidate_ms`; after that the file is looked up
//! again and the object is dropped if its inode, size or mtime changed.
//! On a miss the file is opened beneath the root; files up to
//! `cache_max_object_bytes` are read whole and cached, larger ones are
//! returned open so the connection can send them with sendfile. Either way
//! a miss first waits on the emulated disk, when one is configured.
//!
//! With `disk.o_direct` a miss is read with `O_DIRECT` on tokio's blocking
//! pool ([`crate::disk::Direct`]): a cacheable file whole, before it is
//! cached; a larger one piece by piece as it is sent ([`Store::read_direct`]),
//! instead of with sendfile, which would read through the page cache.
//!
//! Cached objects up to [`INLINE_MAX`] bytes are kept as plain byte
//! buffers and leave with their response head in one write (copied behind
//! it when small, gathered with it from 4 KiB on). Larger ones
//! are kept in the store's [`Arena`], one memfd for them all: still memory
//! (shmem pages, counted in whole pages against the same byte budget), but
//! sendfile(2) can hand its pages to the socket without a copy, which on
//! loopback halves the cost of a 100 KiB response. A large object the arena
//! has no room for is kept as a byte buffer too.
//!
//! Reads of small files happen on the worker thread: for files in the page
//! cache an `openat2` + `fstat` + `pread` costs a few microseconds, while a
//! hop to a blocking thread pool costs more than the read itself.

use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use switchyard_cache::{Cache, CacheStats, PolicyKind};
use switchyard_http::path::CleanPath;

use crate::arena::{Arena, Slice};
use crate::config::NodeConfig;
use crate::disk::{Direct, DiskModel};
use crate::error::NodeError;
use crate::fs::{read_all, FileInfo, Lookup, Root};

/// Cached bodies up to this size are kept inline and written from memory.
pub const INLINE_MAX: u64 = 16 * 1024;

/// The bytes of a cached object.
#[derive(Debug)]
pub enum Content {
    /// Small (or no room in the arena): written with the response head.
    Inline(Bytes),
    /// Larger: pages of the store's memfd arena, sent with sendfile.
    Arena(Slice),
}

/// A file held in memory.
#[derive(Debug)]
pub struct CachedObject {
    pub content: Content,
    pub info: FileInfo,
    /// When the object was last checked against the disk (ns since the store's origin).
    validated_at: AtomicU64,
}

/// Where a request's body comes from.
#[derive(Debug)]
pub enum Resolved {
    /// In memory; `hit` says whether it was already cached.
    Memory {
        object: Arc<CachedObject>,
        hit: bool,
    },
    /// Too large for the cache (or no cache): an open file for sendfile.
    File(File, FileInfo),
    /// Too large for the cache (or no cache), with `disk.o_direct`: a file opened with
    /// `O_DIRECT`, sent in pieces read by [`Store::read_direct`].
    Direct(Arc<File>, FileInfo),
    /// A directory asked for without its trailing slash.
    Redirect(String),
    NotFound,
    Forbidden,
    Failed(io::Error),
}

/// The node's view of its document root and object cache.
#[derive(Debug)]
pub struct Store {
    root: Root,
    cache: Option<Mutex<Cache<String, Arc<CachedObject>>>>,
    /// Where objects over [`INLINE_MAX`] are kept, for the cache and the replica cache.
    arena: Option<Arc<Arena>>,
    max_object: u64,
    revalidate: Duration,
    disk: Option<Mutex<DiskModel>>,
    direct: Option<Direct>,
    direct_reads: AtomicU64,
    direct_bytes: AtomicU64,
    origin: Instant,
    index: String,
}

impl Store {
    /// Open the root and build the cache described by `cfg`.
    pub fn new(cfg: &NodeConfig) -> Result<Store, NodeError> {
        let root = Root::open(&cfg.root).map_err(|source| NodeError::Root {
            path: cfg.root.clone(),
            source,
        })?;
        let kind = match PolicyKind::from_str(&cfg.cache_policy) {
            Ok(PolicyKind::Lfu { .. }) => PolicyKind::Lfu {
                aging_interval_ms: cfg.lfu_aging_interval_ms,
                aging_factor: cfg.lfu_aging_factor,
            },
            Ok(k) => k,
            Err(e) => return Err(NodeError::Config(format!("cache_policy: {e}"))),
        };
        kind.validate()
            .map_err(|e| NodeError::Config(format!("cache policy: {e}")))?;
        let direct = if cfg.disk.o_direct {
            let d = Direct::probe(root.fd(), &cfg.root).map_err(NodeError::Config)?;
            tracing::info!(root = %cfg.root.display(), align = d.align(), "misses read with O_DIRECT");
            Some(d)
        } else {
            None
        };
        let replica_bytes = match &cfg.cluster {
            Some(c) if c.replication.enabled => c.replication.replica_bytes,
            _ => 0,
        };
        let arena = match cfg.cache_bytes.saturating_add(replica_bytes) {
            0 => None,
            // Room for the budgets four times over, for the objects evicted while responses
            // still send them and for the allocator's rounding; only pages written take
            // memory.
            budget => Some(
                Arena::new(
                    budget.saturating_mul(4).saturating_add(ARENA_SLACK),
                    u32::try_from(budget / INLINE_MAX * 2 + 1024).unwrap_or(u32::MAX),
                )
                .map_err(|e| NodeError::Config(format!("cannot create the object arena: {e}")))?,
            ),
        };
        let cache = (cfg.cache_bytes > 0).then(|| {
            let mut c = Cache::with_kind(cfg.cache_bytes, kind);
            // Objects are charged in whole pages: the largest cacheable one must still fit.
            let max = cfg.cache_max_object_bytes;
            c.set_max_object_bytes(Some(arena.as_ref().map_or(max, |a| a.charge(max))));
            Mutex::new(c)
        });
        Ok(Store {
            root,
            cache,
            arena,
            max_object: cfg.cache_max_object_bytes,
            revalidate: Duration::from_millis(cfg.cache_revalidate_ms),
            disk: cfg
                .disk
                .enabled()
                .then(|| Mutex::new(DiskModel::new(&cfg.disk))),
            direct,
            direct_reads: AtomicU64::new(0),
            direct_bytes: AtomicU64::new(0),
            origin: Instant::now(),
            index: cfg.index.clone(),
        })
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Counters of the object cache (all zero when it is disabled).
    pub fn cache_stats(&self) -> CacheStats {
        match &self.cache {
            Some(c) => c.lock().stats(),
            None => CacheStats::default(),
        }
    }

    /// Emulated disk reads queued or in service.
    pub fn disk_queue(&self) -> u64 {
        self.disk.as_ref().map_or(0, |d| d.lock().queued())
    }

    /// `O_DIRECT` reads issued and the bytes they asked for (zero without `disk.o_direct`).
    pub fn direct_reads(&self) -> (u64, u64) {
        (
            self.direct_reads.load(Relaxed),
            self.direct_bytes.load(Relaxed),
        )
    }

    /// Read `len` bytes at `offset` of a file opened with `O_DIRECT` (from
    /// [`Resolved::Direct`]) on tokio's blocking pool, so that a slow disk stalls no worker.
    pub async fn read_direct(
        &self,
        file: Arc<File>,
        offset: u64,
        len: usize,
    ) -> io::Result<Vec<u8>> {
        let direct = self
            .direct
            .ok_or_else(|| io::Error::other("O_DIRECT reads are not configured"))?;
        self.direct_reads.fetch_add(1, Relaxed);
        self.direct_bytes.fetch_add(len as u64, Relaxed);
        tokio::task::spawn_blocking(move || direct.read(&file, offset, len))
            .await
            .map_err(io::Error::other)?
    }

    /// The key of the object a clean path names: the path itself, or the directory's index
    /// file.
    fn key_of<'p>(&self, path: &'p CleanPath) -> Cow<'p, str> {
        if path.trailing_slash || path.path == "/" {
            let base = path.path.trim_end_matches('/');
            Cow::Owned(format!("{base}/{}", self.index))
        } else {
            Cow::Borrowed(&path.path)
        }
    }

    /// The key of the object a request target names, as the cache and replicas know it;
    /// `None` for a target that is not a servable path.
    pub fn object_key(&self, target: &str) -> Option<String> {
        let clean = switchyard_http::path::normalize(target).ok()?;
        Some(self.key_of(&clean).into_owned())
    }

    /// The cached object under `key`, if any (not counted as a reference).
    pub fn cached(&self, key: &str) -> Option<Arc<CachedObject>> {
        self.cache.as_ref()?.lock().peek(key).cloned()
    }

    /// How long ago `object` was last checked against the disk.
    pub fn validated_age(&self, object: &CachedObject) -> Duration {
        let checked = Duration::from_nanos(object.validated_at.load(Relaxed));
        self.now().saturating_sub(checked)
    }

    /// Find the body for a clean request path.
    pub async fn resolve(&self, path: &CleanPath) -> Resolved {
        let dir_request = path.trailing_slash || path.path == "/";
        let key = self.key_of(path);
        let now = self.now();
        if let Some(cache) = &self.cache {
            let cached = cache.lock().get(&*key, now).cloned();
            if let Some(obj) = cached {
                let checked = Duration::from_nanos(obj.validated_at.load(Relaxed));
                if now.saturating_sub(checked) < self.revalidate {
                    return Resolved::Memory {
                        object: obj,
                        hit: true,
                    };
                }
                // Stale: look again; keep it if the file is unchanged.
                match self.root.lookup(&key[1..]) {
                    Lookup::File(_, info) if same_file(&info, &obj.info) => {
                        obj.validated_at.store(now.as_nanos() as u64, Relaxed);
                        return Resolved::Memory {
                            object: obj,
                            hit: true,
                        };
                    }
                    _ => {
                        cache.lock().remove(&*key);
                    }
                }
            }
        }
        let (file, info) = match self.root.lookup(&key[1..]) {
            Lookup::File(f, info) => (f, info),
            Lookup::Directory if !dir_request => {
                return Resolved::Redirect(format!("{}/", path.path));
            }
            Lookup::Directory | Lookup::NotFound => return Resolved::NotFound,
            Lookup::Forbidden => return Resolved::Forbidden,
        };
        self.disk_read(info.len).await;
        let cacheable = self.cache.is_some() && info.len <= self.max_object;
        if self.direct.is_some() {
            // The descriptor just looked up stays for the identity check; the bytes come
            // through a second one that bypasses the page cache.
            let direct = match self.open_direct(&key[1..], &info) {
                Ok(f) => Arc::new(f),
                Err(e) => return Resolved::Failed(e),
            };
            if !cacheable {
                return Resolved::Direct(direct, info);
            }
            let content = match self.read_direct(direct, 0, info.len as usize).await {
                Ok(bytes) => self.content_of(bytes),
                Err(e) => Err(e),
            };
            return match content {
                Ok(content) => self.admit(key.into_owned(), content, info),
                Err(e) => Resolved::Failed(e),
            };
        }
        if !cacheable {
            return Resolved::File(file, info);
        }
        match read_all(&file, info.len).and_then(|bytes| self.content_of(bytes)) {
            Ok(content) => self.admit(key.into_owned(), content, info),
            Err(e) => Resolved::Failed(e),
        }
    }

    /// Open `rel` with `O_DIRECT`; it must still be the file `info` describes (it may have
    /// been replaced since it was looked up).
    fn open_direct(&self, rel: &str, info: &FileInfo) -> io::Result<File> {
        use std::os::unix::fs::MetadataExt;
        let file = crate::disk::open_beneath(self.root.fd(), rel, true)?;
        let meta = file.metadata()?;
        if meta.ino() != info.inode || meta.len() != info.len {
            return Err(io::Error::other("file replaced while it was opened"));
        }
        Ok(file)
    }

    /// Cache freshly read `content` under `key` (when there is a cache) and return it.
    fn admit(&self, key: String, content: Content, info: FileInfo) -> Resolved {
        let object = Arc::new(CachedObject {
            content,
            info,
            validated_at: AtomicU64::new(self.now().as_nanos() as u64),
        });
        if let Some(cache) = &self.cache {
            let size = object.charge();
            let outcome = cache.lock().insert(key, object.clone(), size, self.now());
            // Evicted objects are dropped here, outside the lock.
            drop(outcome);
        }
        Resolved::Memory { object, hit: false }
    }

    /// Wait as long as the emulated disk says a read of `bytes` takes.
    async fn disk_read(&self, bytes: u64) {
        let Some(disk) = &self.disk else { return };
        let done = disk.lock().submit(self.now(), bytes);
        // Completes the read even if the connection goes away mid-wait.
        let _guard = DiskGuard(disk);
        crate::disk::sleep_until(self.origin + done).await;
    }
}

struct DiskGuard<'a>(&'a Mutex<DiskModel>);

impl Drop for DiskGuard<'_> {
    fn drop(&mut self) {
        self.0.lock().complete();
    }
}

/// Address space of the arena beyond four times the budgets (sparse, so free).
const ARENA_SLACK: u64 = 64 << 20;

impl Store {
    fn content_of(&self, bytes: Vec<u8>) -> io::Result<Content> {
        content_of(bytes, self.arena.as_ref())
    }

    /// The arena that holds the cache's large objects (none without a cache or replicas).
    pub fn arena(&self) -> Option<Arc<Arena>> {
        self.arena.clone()
    }
}

/// Bytes as cached content: inline when small (or when there is no room in `arena`), else in
/// `arena`.
fn content_of(bytes: Vec<u8>, arena: Option<&Arc<Arena>>) -> io::Result<Content> {
    if bytes.len() as u64 > INLINE_MAX {
        if let Some(arena) = arena {
            if let Some(slice) = arena.store(&bytes)? {
                return Ok(Content::Arena(slice));
            }
            tracing::debug!(
                len = bytes.len(),
                "no room in the object arena: kept inline"
            );
        }
    }
    Ok(Content::Inline(Bytes::from(bytes)))
}

impl CachedObject {
    /// An object held in memory that did not come from this node's disk (a replica): `bytes`
    /// with the identity `info` its owner gave it, in `arena` when large.
    pub fn from_bytes(
        bytes: Vec<u8>,
        info: FileInfo,
        arena: Option<&Arc<Arena>>,
    ) -> io::Result<CachedObject> {
        Ok(CachedObject {
            content: content_of(bytes, arena)?,
            info,
            validated_at: AtomicU64::new(0),
        })
    }

    /// A copy of the object's bytes.
    pub fn to_bytes(&self) -> io::Result<Vec<u8>> {
        match &self.content {
            Content::Inline(b) => Ok(b.to_vec()),
            Content::Arena(s) => s.to_vec(),
        }
    }

    /// The memory the object holds, as caches charge it: its length, in whole pages when it
    /// is in the arena.
    pub fn charge(&self) -> u64 {
        match &self.content {
            Content::Inline(b) => b.len() as u64,
            Content::Arena(s) => s.charge(),
        }
    }
}

fn same_file(a: &FileInfo, b: &FileInfo) -> bool {
    a.inode == b.inode && a.len == b.len && a.mtime == b.mtime
}
