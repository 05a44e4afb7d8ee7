//! Hot-object replication in a cooperative cluster (seed 000 §3.2): the node's side of the
//! decisions in `switchyard_cache::replication`.
//!
//! As an owner, the node counts every request it serves for a target it owns, for its own
//! clients and for peers that move requests to it. When a peer moves it a request for a hot
//! target, the node sends the peer a copy of the object ([`Message::Replica`]) on the control
//! connection the request came in on, right after serving it and before the connection goes
//! back, so the copy is in place before the peer reads its next request.
//!
//! As a holder, the node keeps copies in a replica cache of its own and serves requests for
//! them itself while they are fresh: a copy is served for the rest of its owner's revalidation
//! interval (the owner says how long ago it last checked the file), after which the next
//! request goes to the owner again, preceded by the copy's entity tag
//! ([`Message::ReplicaCheck`]). The owner checks its disk as it serves that request; if the
//! file is unchanged and the target still hot it renews the copy ([`Message::ReplicaValid`],
//! a few bytes), if the file changed it sends the new one. A copy answers exactly as the owner
//! does: same bytes, entity tag, `Last-Modified`.
//!
//! With cache forwarding (`mechanism = "fetch"`, seed 000's CF-REP) no connection moves: the
//! holder fetches the response from the owner's HTTP listener and asks for it as its copy
//! (`X-Switchyard-Copy` on the request, with its name); an owner that would ship a copy to it
//! says so on the response with the copy's terms, and the fetched body becomes the copy, so
//! a copy costs nothing beyond the fetch. A stale copy is fetched anew the same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use switchyard_cache::replication::{HotTargets, Lookup, ReplicaStats, Replicas};
use switchyard_handoff::proto::{Message, ReplicaObject};

use crate::arena::Arena;
use crate::config::ReplicationConfig;
use crate::error::NodeError;
use crate::fs::FileInfo;
use crate::store::{CachedObject, Store};

/// Counters beyond the replica cache's own.
#[derive(Debug, Default)]
pub(crate) struct ReplicationStats {
    /// Copies sent to peers.
    pub shipped: AtomicU64,
    /// Bytes of the copies sent.
    pub shipped_bytes: AtomicU64,
    /// Copies received from owners.
    pub received: AtomicU64,
    /// Copies received that could not be kept (no memory for them).
    pub unusable: AtomicU64,
    /// Peers' stale copies found unchanged and renewed without sending them again.
    pub renewals_sent: AtomicU64,
}

fn mtime_ns(info: &FileInfo) -> u64 {
    info.mtime
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Checks announced by peers ([`Message::ReplicaCheck`]) and not yet answered, at most this
/// many: each is answered or forgotten with the request that follows it, so only a peer whose
/// requests keep failing could leave more; beyond the bound all are forgotten (the copies
/// concerned are then sent whole).
const MAX_CHECKS: usize = 4096;

/// What the replica cache has for a request.
#[derive(Debug)]
pub(crate) enum Held {
    /// A fresh copy: serve it.
    Fresh(Arc<CachedObject>),
    /// A stale copy with this entity tag: send the owner a [`Message::ReplicaCheck`] with the
    /// request.
    Stale(String),
    /// Nothing here.
    Miss,
}

/// One node's replication state.
#[derive(Debug)]
pub(crate) struct Replication {
    hot: Mutex<HotTargets<String, String>>,
    replicas: Mutex<Replicas<String, Arc<CachedObject>>>,
    /// How long a copy may be served after its owner last checked it.
    fresh_for: Duration,
    /// Entity tags of peers' stale copies, by (peer, target), with the number of requests
    /// announced with it and not yet answered.
    checks: Mutex<HashMap<(String, String), (String, u32)>>,
    origin: Instant,
    /// Where large copies are kept (the store's arena).
    arena: Option<Arc<Arena>>,
    pub stats: ReplicationStats,
}

impl Replication {
    /// Replication as `cfg` sets it, with copies trusted for `fresh_for` after their owner's
    /// last check (the cluster's `cache_revalidate_ms`) and large copies kept in `arena`.
    pub(crate) fn new(
        cfg: &ReplicationConfig,
        fresh_for: Duration,
        arena: Option<Arc<Arena>>,
    ) -> Result<Self, NodeError> {
        let settings = cfg.settings();
        let bad = |e| NodeError::Config(format!("[cluster.replication]: {e}"));
        Ok(Replication {
            hot: Mutex::new(HotTargets::new(&settings).map_err(bad)?),
            replicas: Mutex::new(Replicas::new(&settings).map_err(bad)?),
            fresh_for,
            checks: Mutex::new(HashMap::new()),
            origin: Instant::now(),
            arena,
            stats: ReplicationStats::default(),
        })
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// This node, as owner, serves a request for `key`.
    pub(crate) fn owned(&self, key: &str) {
        let now = self.now();
        self.hot.lock().reference(key, now);
    }

    /// The copy of `key` held here: a fresh one is counted as a hit.
    pub(crate) fn lookup(&self, key: &str) -> Held {
        let now = self.now();
        match self.replicas.lock().lookup(key, now) {
            Lookup::Fresh(o) => Held::Fresh(o.clone()),
            Lookup::Stale(o) => Held::Stale(o.info.etag.clone()),
            Lookup::Miss => Held::Miss,
        }
    }

    /// `peer` holds a stale copy of `key` with entity tag `etag` and moves the request for it
    /// here next.
    pub(crate) fn checking(&self, peer: &str, key: String, etag: String) {
        let mut checks = self.checks.lock();
        if checks.len() >= MAX_CHECKS {
            checks.clear();
        }
        let pending = checks
            .entry((peer.to_owned(), key))
            .or_insert_with(|| (etag.clone(), 0));
        if pending.0 != etag {
            *pending = (etag, 0);
        }
        pending.1 += 1;
    }

    /// What to send `peer`, which moved a request for `key` here (just answered from `store`):
    /// a copy of the object if the target is hot and its object is in memory, or only its
    /// renewal if the peer's stale copy (announced by [`Replication::checking`]) is still it.
    pub(crate) fn offer(&self, store: &Store, key: &str, peer: &str) -> Option<Message> {
        let checked = {
            let mut checks = self.checks.lock();
            let id = (peer.to_owned(), key.to_owned());
            match checks.get_mut(&id) {
                Some((etag, n)) if *n > 1 => {
                    *n -= 1;
                    Some(etag.clone())
                }
                Some(_) => checks.remove(&id).map(|(etag, _)| etag),
                None => None,
            }
        };
        let (object, copies, age_ms) = self.shipping(store, key, peer, u64::MAX)?;
        if checked.as_deref() == Some(object.info.etag.as_str()) {
            self.stats.renewals_sent.fetch_add(1, Relaxed);
            tracing::debug!(key, peer, copies, "a peer's copy of a hot object renewed");
            return Some(Message::ReplicaValid {
                target: key.to_owned(),
                etag: object.info.etag.clone(),
                copies,
                age_ms,
            });
        }
        let body = match object.to_bytes() {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(key, error = %e, "cannot read a hot object to copy it");
                return None;
            }
        };
        let info = &object.info;
        self.shipped(key, peer, copies, body.len() as u64);
        Some(Message::Replica(Box::new(ReplicaObject {
            target: key.to_owned(),
            etag: info.etag.clone(),
            last_modified: info.last_modified.clone(),
            mtime_ns: mtime_ns(info),
            inode: info.inode,
            copies,
            age_ms,
            body,
        })))
    }

    /// The terms on which `peer`, which fetches `key` from here (cache forwarding) and holds
    /// bodies of up to `max_bytes` whole, keeps the response it is about to get as its copy:
    /// `Some` if the target is hot and its object in memory. The response's body is the copy,
    /// so nothing more crosses the link for it.
    pub(crate) fn copy_offer(
        &self,
        store: &Store,
        key: &str,
        peer: &str,
        max_bytes: u64,
    ) -> Option<switchyard_http::upstream::CopyOffer> {
        let (object, copies, age_ms) = self.shipping(store, key, peer, max_bytes)?;
        let info = &object.info;
        self.shipped(key, peer, copies, info.len);
        Some(switchyard_http::upstream::CopyOffer {
            copies,
            age_ms,
            mtime_ns: mtime_ns(info),
            inode: info.inode,
            etag: info.etag.clone(),
            last_modified: info.last_modified.clone(),
        })
    }

    /// Whether `peer` gets a copy of `key`, whose object is in `store`'s memory and at most
    /// `max_bytes` long: the object, the copies in the cluster with the peer's, and how long
    /// ago the object was checked against the disk (milliseconds). The peer is counted among
    /// the holders from now on.
    fn shipping(
        &self,
        store: &Store,
        key: &str,
        peer: &str,
        max_bytes: u64,
    ) -> Option<(Arc<CachedObject>, u32, u64)> {
        let object = store.cached(key)?;
        if object.info.len > max_bytes {
            return None;
        }
        let now = self.now();
        let copies = self
            .hot
            .lock()
            .ship(key, object.info.len, peer.to_owned(), now)?;
        let age_ms = u64::try_from(store.validated_age(&object).as_millis()).unwrap_or(u64::MAX);
        Some((object, copies, age_ms))
    }

    fn shipped(&self, key: &str, peer: &str, copies: u32, bytes: u64) {
        self.stats.shipped.fetch_add(1, Relaxed);
        self.stats.shipped_bytes.fetch_add(bytes, Relaxed);
        tracing::debug!(key, peer, copies, bytes, "hot object copied to a peer");
    }

    /// A copy arrived from its owner.
    pub(crate) fn receive(&self, r: ReplicaObject) {
        self.stats.received.fetch_add(1, Relaxed);
        let len = r.body.len() as u64;
        let info = FileInfo::new(
            len,
            r.inode,
            SystemTime::UNIX_EPOCH + Duration::from_nanos(r.mtime_ns),
            r.etag,
            r.last_modified,
            switchyard_http::response::content_type(&r.target),
        );
        let object = match CachedObject::from_bytes(r.body, info, self.arena.as_ref()) {
            Ok(o) => Arc::new(o),
            Err(e) => {
                self.stats.unusable.fetch_add(1, Relaxed);
                tracing::warn!(key = %r.target, error = %e, "cannot keep a copy of a hot object");
                return;
            }
        };
        let now = self.now();
        let age = Duration::from_millis(r.age_ms);
        let charge = object.charge();
        let (stored, gone) = self.replicas.lock().insert(
            r.target,
            object,
            charge,
            r.copies,
            age,
            self.fresh_for,
            now,
        );
        // Dropped outside the lock (an arena's pages are freed here).
        drop(gone);
        if !stored {
            tracing::debug!(
                bytes = len,
                "copy of a hot object larger than the replica cache takes"
            );
        }
    }

    /// The response to a request for `key` fetched from its owner came with `offer`: keep
    /// `body` as this node's copy.
    pub(crate) fn receive_fetched(
        &self,
        key: &str,
        offer: switchyard_http::upstream::CopyOffer,
        body: Vec<u8>,
    ) {
        self.receive(ReplicaObject {
            target: key.to_owned(),
            etag: offer.etag,
            last_modified: offer.last_modified,
            mtime_ns: offer.mtime_ns,
            inode: offer.inode,
            copies: offer.copies,
            age_ms: offer.age_ms,
            body,
        });
    }

    /// The owner found this node's stale copy of `target` (entity tag `etag`) unchanged.
    pub(crate) fn renew(&self, target: &str, etag: &str, copies: u32, age_ms: u64) {
        let now = self.now();
        let age = Duration::from_millis(age_ms);
        let renewed = self.replicas.lock().renew(
            target,
            |o| o.info.etag == etag,
            copies,
            age,
            self.fresh_for,
            now,
        );
        if !renewed {
            tracing::debug!(key = target, "renewal of a copy no longer held ignored");
        }
    }

    /// A peer's control connection ended: it is no longer counted as holding copies.
    pub(crate) fn peer_gone(&self, peer: &str) {
        self.hot.lock().peer_gone(&peer.to_owned());
        self.checks.lock().retain(|(p, _), _| p != peer);
    }

    /// Replicas held, their bytes, and the replica cache's counters.
    pub(crate) fn held(&self) -> (usize, u64, ReplicaStats) {
        let r = self.replicas.lock();
        (r.len(), r.bytes(), r.stats())
    }

    /// Counters and the hottest owned targets, for `/status.json`.
    pub(crate) fn status(&self) -> switchyard_admin::cluster::ReplicationStatus {
        let (replicas, replica_bytes, capacity, hits) = {
            let r = self.replicas.lock();
            (
                r.len() as u64,
                r.bytes(),
                r.capacity_bytes(),
                r.stats().hits,
            )
        };
        let now = self.now();
        switchyard_admin::cluster::ReplicationStatus {
            replicas,
            replica_bytes,
            replica_capacity_bytes: capacity,
            replica_hits: hits,
            objects_shipped: self.stats.shipped.load(Relaxed),
            hottest: self.hot.lock().hottest(10, now),
        }
    }

    /// Targets this node owns that are hot now.
    pub(crate) fn hot_count(&self) -> usize {
        let now = self.now();
        self.hot.lock().hot_count(now)
    }
}
