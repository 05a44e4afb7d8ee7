//! The byte-bounded object cache.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use serde::Serialize;

use crate::{Map, PolicyKind, ReplacementPolicy};

struct Entry<V> {
    value: V,
    size: u64,
}

/// Counters and gauges of a [`Cache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// `get` calls that found the key.
    pub hits: u64,
    /// `get` calls that did not.
    pub misses: u64,
    /// Successful `insert` calls (new keys and replacements).
    pub insertions: u64,
    /// Objects evicted to make room (by `insert` or `set_capacity`).
    pub evictions: u64,
    /// `insert` calls refused because the object was too large.
    pub rejections: u64,
    /// Objects currently stored.
    pub objects: u64,
    /// Bytes currently stored (sum of object sizes).
    pub bytes: u64,
    /// The byte budget.
    pub capacity_bytes: u64,
}

impl CacheStats {
    /// `hits / (hits + misses)`, or 0 before the first lookup.
    pub fn hit_ratio(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Why an object was not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The object is larger than the whole cache.
    LargerThanCapacity,
    /// The object is larger than the configured per-object limit.
    LargerThanMaxObject,
}

/// The result of [`Cache::insert`].
///
/// Evicted and replaced values are handed back rather than dropped so that a
/// caller holding a lock can release it before freeing (possibly large)
/// objects.
#[derive(Debug)]
pub enum InsertOutcome<K, V> {
    /// The object is stored.
    Inserted {
        /// The previous value of the key, if it was present.
        replaced: Option<V>,
        /// Objects evicted to make room, in eviction order.
        evicted: Vec<(K, V)>,
    },
    /// The object was refused; the cache is unchanged.
    Rejected {
        /// The key, handed back.
        key: K,
        /// The value, handed back.
        value: V,
        /// Why it was refused.
        reason: RejectReason,
    },
}

impl<K, V> InsertOutcome<K, V> {
    /// Whether the object was stored.
    pub fn is_inserted(&self) -> bool {
        matches!(self, InsertOutcome::Inserted { .. })
    }

    /// Whether the object was refused.
    pub fn is_rejected(&self) -> bool {
        matches!(self, InsertOutcome::Rejected { .. })
    }

    /// The evicted objects (empty when rejected).
    pub fn evicted(&self) -> &[(K, V)] {
        match self {
            InsertOutcome::Inserted { evicted, .. } => evicted,
            InsertOutcome::Rejected { .. } => &[],
        }
    }

    /// Consumes the outcome, returning the evicted objects.
    pub fn into_evicted(self) -> Vec<(K, V)> {
        match self {
            InsertOutcome::Inserted { evicted, .. } => evicted,
            InsertOutcome::Rejected { .. } => Vec::new(),
        }
    }
}

/// An in-memory object cache bounded in bytes, with a pluggable
/// [`ReplacementPolicy`].
///
/// Sizes are given by the caller (typically the body length plus any fixed
/// per-object overhead the caller wants to charge). After every public call
/// `used_bytes() <= capacity_bytes()`.
///
/// The cache does no I/O, reads no clock and does not lock: time comes in as
/// `now` (monotonic, caller-chosen origin) and a server wraps it in a mutex.
/// Lookups and inserts cost O(1) hash-map work plus the policy's O(1) or
/// O(log n) bookkeeping.
///
/// ```
/// use std::time::Duration;
/// use switchyard_cache::{Cache, PolicyKind};
///
/// let mut cache: Cache<String, Vec<u8>> = Cache::with_kind(10, PolicyKind::Lru);
/// let t = Duration::ZERO;
/// let _ = cache.insert("/a".into(), vec![0; 6], 6, t);
/// let _ = cache.insert("/b".into(), vec![0; 4], 4, t);
/// assert!(cache.get("/a", t).is_some()); // "/b" is now least recently used
/// let evicted = cache.insert("/c".into(), vec![0; 3], 3, t).into_evicted();
/// assert_eq!(evicted[0].0, "/b");
/// assert_eq!(cache.used_bytes(), 9);
/// ```
pub struct Cache<K, V> {
    map: Map<K, Entry<V>>,
    policy: Box<dyn ReplacementPolicy<K>>,
    capacity: u64,
    used: u64,
    max_object: Option<u64>,
    hits: u64,
    misses: u64,
    insertions: u64,
    evictions: u64,
    rejections: u64,
}

impl<K: Hash + Eq + Clone, V> Cache<K, V> {
    /// An empty cache of `capacity_bytes` using `policy`.
    ///
    /// The policy should be fresh (tracking no keys).
    pub fn new(capacity_bytes: u64, policy: Box<dyn ReplacementPolicy<K>>) -> Self {
        Cache {
            map: Map::default(),
            policy,
            capacity: capacity_bytes,
            used: 0,
            max_object: None,
            hits: 0,
            misses: 0,
            insertions: 0,
            evictions: 0,
            rejections: 0,
        }
    }

    /// An empty cache of `capacity_bytes` using the policy `kind`.
    ///
    /// # Panics
    ///
    /// If `kind` is invalid ([`PolicyKind::validate`]).
    pub fn with_kind(capacity_bytes: u64, kind: PolicyKind) -> Self
    where
        K: Send + 'static,
    {
        Self::new(capacity_bytes, kind.build())
    }

    /// Sets the per-object size limit (builder form of
    /// [`set_max_object_bytes`](Self::set_max_object_bytes)).
    pub fn with_max_object_bytes(mut self, max: u64) -> Self {
        self.max_object = Some(max);
        self
    }

    /// Sets or clears the per-object size limit: later inserts of larger
    /// objects are rejected. Objects already stored are kept.
    pub fn set_max_object_bytes(&mut self, max: Option<u64>) {
        self.max_object = max;
    }

    /// The per-object size limit, if any.
    pub fn max_object_bytes(&self) -> Option<u64> {
        self.max_object
    }

    /// Looks `key` up, counting a hit or a miss and informing the policy.
    pub fn get<Q>(&mut self, key: &Q, now: Duration) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.map.get_key_value(key) {
            Some((k, entry)) => {
                self.hits += 1;
                self.policy.on_hit(k, entry.size, now);
                Some(&entry.value)
            }
            None => {
                self.misses += 1;
                self.policy.tick(now);
                None
            }
        }
    }

    /// Looks `key` up without counting it or informing the policy.
    pub fn peek<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key).map(|e| &e.value)
    }

    /// The value of `key`, to change in place, without counting it or informing the policy
    /// (its size stays what it was stored with).
    pub fn peek_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get_mut(key).map(|e| &mut e.value)
    }

    /// Whether `key` is stored (no stats, no policy update).
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.contains_key(key)
    }

    /// The size `key` was stored with (no stats, no policy update).
    pub fn object_size<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key).map(|e| e.size)
    }

    fn rejection(&self, size: u64) -> Option<RejectReason> {
        if self.max_object.is_some_and(|max| size > max) {
            Some(RejectReason::LargerThanMaxObject)
        } else if size > self.capacity {
            Some(RejectReason::LargerThanCapacity)
        } else {
            None
        }
    }

    /// Stores `value` of `size` bytes under `key`, evicting as the policy
    /// chooses until it fits. An existing value for `key` is replaced (and
    /// returned); its reference history is kept unless the policy picks it
    /// as a victim while making room. Counts as one reference to `key`.
    ///
    /// Objects larger than the capacity or the per-object limit are rejected
    /// and handed back; the cache, including any older value of `key`, is
    /// left as it was.
    pub fn insert(&mut self, key: K, value: V, size: u64, now: Duration) -> InsertOutcome<K, V> {
        if let Some(reason) = self.rejection(size) {
            self.rejections += 1;
            self.policy.tick(now);
            return InsertOutcome::Rejected { key, value, reason };
        }
        self.policy.tick(now);
        let old_size = self.map.get(&key).map(|e| e.size);
        // The old value of `key` (if any) is about to go; make room for the
        // new one among the other objects.
        let mut others = self.used - old_size.unwrap_or(0);
        let mut tracked = old_size.is_some();
        let mut evicted = Vec::new();
        while others + size > self.capacity {
            match self.next_victim(Some(&key)) {
                Victim::Protected => tracked = false,
                Victim::Entry(k, entry) => {
                    others -= entry.size;
                    self.evictions += 1;
                    evicted.push((k, entry.value));
                }
                // Unreachable: `others` > 0 means another object exists.
                Victim::None => break,
            }
        }
        match old_size {
            Some(old) if tracked => self.policy.on_update(&key, old, size, now),
            _ => self.policy.on_insert(&key, size, now),
        }
        let replaced = self.map.insert(key, Entry { value, size }).map(|e| e.value);
        self.used = others + size;
        self.insertions += 1;
        debug_assert!(self.used <= self.capacity);
        InsertOutcome::Inserted { replaced, evicted }
    }

    /// Takes the policy's next victim out of the map. If the victim is
    /// `protect`, it stays in the map (the caller is replacing it) and
    /// `Victim::Protected` is returned.
    ///
    /// A policy that returns nothing, or keys that are not stored, while
    /// objects remain is out of sync with the cache; rather than break the
    /// byte budget, an arbitrary stored object is evicted then.
    fn next_victim(&mut self, protect: Option<&K>) -> Victim<K, V> {
        // Bounded so a policy that keeps naming unknown keys cannot spin.
        for _ in 0..=self.map.len() {
            let Some(k) = self.policy.victim() else { break };
            if protect == Some(&k) {
                return Victim::Protected;
            }
            if let Some(entry) = self.map.remove(&k) {
                return Victim::Entry(k, entry);
            }
        }
        let fallback = self.map.keys().find(|k| protect != Some(*k)).cloned();
        match fallback.and_then(|k| self.map.remove_entry(&k)) {
            Some((k, entry)) => {
                self.policy.on_remove(&k);
                Victim::Entry(k, entry)
            }
            None => Victim::None,
        }
    }

    /// Removes `key`, returning its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (k, entry) = self.map.remove_entry(key)?;
        self.policy.on_remove(&k);
        self.used -= entry.size;
        Some(entry.value)
    }

    /// Adds `n` references to a stored `key` at once (hot-object replication:
    /// the count of a replicated object grows by the number of replicas,
    /// seed 000 §3.2.1). Not counted as hits. Returns whether `key` is stored.
    pub fn add_references<Q>(&mut self, key: &Q, n: u64, now: Duration) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.map.get_key_value(key) {
            Some((k, entry)) => {
                self.policy.add_references(k, entry.size, n, now);
                true
            }
            None => {
                self.policy.tick(now);
                false
            }
        }
    }

    /// Lets time pass (applies due aging); call it periodically when idle.
    pub fn tick(&mut self, now: Duration) {
        self.policy.tick(now);
    }

    /// Changes the byte budget, evicting until the cache fits, and returns
    /// the evicted objects.
    pub fn set_capacity(&mut self, capacity_bytes: u64, now: Duration) -> Vec<(K, V)> {
        self.capacity = capacity_bytes;
        self.policy.tick(now);
        let mut evicted = Vec::new();
        while self.used > self.capacity {
            match self.next_victim(None) {
                Victim::Entry(k, entry) => {
                    self.used -= entry.size;
                    self.evictions += 1;
                    evicted.push((k, entry.value));
                }
                Victim::Protected | Victim::None => break,
            }
        }
        evicted
    }

    /// Removes every object (not counted as evictions) and returns them.
    pub fn clear(&mut self) -> Vec<(K, V)> {
        let drained: Vec<(K, V)> = self
            .map
            .drain()
            .map(|(k, e)| {
                self.policy.on_remove(&k);
                (k, e.value)
            })
            .collect();
        self.used = 0;
        drained
    }

    /// Number of stored objects.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Sum of the sizes of stored objects.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// The byte budget.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits,
            misses: self.misses,
            insertions: self.insertions,
            evictions: self.evictions,
            rejections: self.rejections,
            objects: self.map.len() as u64,
            bytes: self.used,
            capacity_bytes: self.capacity,
        }
    }

    /// The policy's name (`"lru"`, `"lfu"`, `"gdsf"`, …).
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Stored keys, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.map.keys()
    }

    /// Stored keys and values, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.map.iter().map(|(k, e)| (k, &e.value))
    }

    #[cfg(test)]
    pub(crate) fn policy_mut(&mut self) -> &mut dyn ReplacementPolicy<K> {
        &mut *self.policy
    }
}

enum Victim<K, V> {
    Entry(K, Entry<V>),
    Protected,
    None,
}

impl<K, V> fmt::Debug for Cache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("policy", &self.policy.name())
            .field("objects", &self.map.len())
            .field("used_bytes", &self.used)
            .field("capacity_bytes", &self.capacity)
            .field("max_object_bytes", &self.max_object)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Gdsf, LfuAging, Lru};

    const T0: Duration = Duration::ZERO;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn keys_sorted<V>(c: &Cache<u32, V>) -> Vec<u32> {
        let mut k: Vec<u32> = c.keys().copied().collect();
        k.sort_unstable();
        k
    }

    #[test]
    fn get_counts_hits_and_misses() {
        let mut c: Cache<String, u32> = Cache::with_kind(100, PolicyKind::Lru);
        assert!(c.insert("a".into(), 1, 10, T0).is_inserted());
        assert_eq!(c.get("a", T0), Some(&1));
        assert_eq!(c.get("b", T0), None);
        assert_eq!(c.peek("a"), Some(&1));
        assert!(c.contains("a") && !c.contains("b"));
        assert_eq!(c.object_size("a"), Some(10));
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.insertions), (1, 1, 1));
        assert_eq!((s.objects, s.bytes, s.capacity_bytes), (1, 10, 100));
        assert_eq!(s.hit_ratio(), 0.5);
        assert_eq!(c.policy_name(), "lru");
    }

    #[test]
    fn evicts_in_policy_order_and_returns_values() {
        let mut c: Cache<u32, &str> = Cache::new(10, Box::new(Lru::new()));
        let _ = c.insert(1, "one", 4, T0);
        let _ = c.insert(2, "two", 4, T0);
        c.get(&1, T0);
        let out = c.insert(3, "three", 4, T0);
        assert_eq!(out.evicted(), &[(2, "two")]);
        assert_eq!(keys_sorted(&c), vec![1, 3]);
        assert_eq!(c.used_bytes(), 8);
        assert_eq!(c.stats().evictions, 1);
    }

    #[test]
    fn replacing_updates_size_and_returns_old_value() {
        let mut c: Cache<u32, &str> = Cache::with_kind(10, PolicyKind::Lru);
        let _ = c.insert(1, "a", 3, T0);
        let _ = c.insert(2, "b", 3, T0);
        let _ = c.insert(3, "c", 3, T0);
        // Key 1 is least recent; growing it to 7 must evict others, not
        // double-count or evict the key being replaced.
        match c.insert(1, "A", 7, T0) {
            InsertOutcome::Inserted { replaced, evicted } => {
                assert_eq!(replaced, Some("a"));
                assert_eq!(evicted, vec![(2, "b")]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.used_bytes(), 10);
        assert_eq!(c.peek(&1), Some(&"A"));
        // Shrinking frees bytes without evicting.
        let out = c.insert(1, "x", 1, T0);
        assert!(out.evicted().is_empty());
        assert_eq!(c.used_bytes(), 4);
        assert_eq!(c.len(), 2);
        // Replacement makes key 1 most recent: 3 goes first.
        assert_eq!(c.set_capacity(1, T0), vec![(3, "c")]);
    }

    #[test]
    fn replacement_keeps_lfu_history() {
        let mut c: Cache<u32, u8> = Cache::new(2, Box::new(LfuAging::<u32>::without_aging()));
        let _ = c.insert(1, 0, 1, T0);
        for _ in 0..5 {
            c.get(&1, T0);
        }
        let _ = c.insert(2, 0, 1, T0);
        c.get(&2, T0);
        let _ = c.insert(1, 1, 1, T0); // update: count 7, not 1
        assert_eq!(c.insert(3, 0, 1, T0).into_evicted(), vec![(2, 0)]);
    }

    #[test]
    fn rejects_oversized_without_disturbing() {
        let mut c: Cache<u32, u8> = Cache::with_kind(10, PolicyKind::Gdsf).with_max_object_bytes(6);
        let _ = c.insert(1, 1, 5, T0);
        let _ = c.insert(2, 2, 5, T0);
        match c.insert(3, 3, 7, T0) {
            InsertOutcome::Rejected { key, value, reason } => {
                assert_eq!(
                    (key, value, reason),
                    (3, 3, RejectReason::LargerThanMaxObject)
                );
            }
            other => panic!("{other:?}"),
        }
        let out = c.insert(1, 9, 11, T0);
        assert!(out.is_rejected() && out.evicted().is_empty());
        assert!(matches!(
            out,
            InsertOutcome::Rejected {
                reason: RejectReason::LargerThanMaxObject,
                ..
            }
        ));
        c.set_max_object_bytes(None);
        assert!(matches!(
            c.insert(1, 9, 11, T0),
            InsertOutcome::Rejected {
                reason: RejectReason::LargerThanCapacity,
                ..
            }
        ));
        // The old value of key 1 is still there.
        assert_eq!(c.peek(&1), Some(&1));
        assert_eq!(keys_sorted(&c), vec![1, 2]);
        assert_eq!(c.used_bytes(), 10);
        let s = c.stats();
        assert_eq!((s.rejections, s.insertions, s.evictions), (3, 2, 0));
        // Exactly the capacity fits.
        let out = c.insert(4, 4, 10, T0);
        assert_eq!(out.evicted().len(), 2);
        assert_eq!(c.used_bytes(), 10);
    }

    #[test]
    fn zero_capacity_and_zero_size() {
        let mut c: Cache<u32, u8> = Cache::with_kind(0, PolicyKind::LFU_DEFAULT);
        assert!(c.insert(1, 1, 1, T0).is_rejected());
        assert!(c.insert(2, 2, 0, T0).is_inserted());
        assert_eq!((c.len(), c.used_bytes()), (1, 0));
    }

    #[test]
    fn remove_and_clear() {
        let mut c: Cache<u32, u8> = Cache::with_kind(10, PolicyKind::Lru);
        let _ = c.insert(1, 1, 4, T0);
        let _ = c.insert(2, 2, 4, T0);
        assert_eq!(c.remove(&1), Some(1));
        assert_eq!(c.remove(&1), None);
        assert_eq!(c.used_bytes(), 4);
        assert_eq!(c.clear(), vec![(2, 2)]);
        assert!(c.is_empty());
        assert_eq!(c.used_bytes(), 0);
        // The policy forgot everything too: nothing left to evict.
        assert_eq!(c.policy_mut().victim(), None);
    }

    #[test]
    fn set_capacity_evicts_down() {
        let mut c: Cache<u32, u8> = Cache::with_kind(100, PolicyKind::Lru);
        for k in 0..10 {
            let _ = c.insert(k, 0, 10, T0);
        }
        let ev = c.set_capacity(35, T0);
        assert_eq!(
            ev.iter().map(|e| e.0).collect::<Vec<_>>(),
            (0..7).collect::<Vec<_>>()
        );
        assert_eq!((c.used_bytes(), c.capacity_bytes()), (30, 35));
        assert_eq!(c.stats().evictions, 7);
        assert!(c.set_capacity(1000, T0).is_empty());
    }

    #[test]
    fn replicas_gain_references() {
        // A hot-object cache: a replica's count grows by the number of
        // replicas, so it outlives a locally popular object with fewer hits.
        let mut c: Cache<&str, ()> = Cache::with_kind(2, PolicyKind::LFU_DEFAULT);
        let _ = c.insert("replica", (), 1, T0);
        let _ = c.insert("local", (), 1, T0);
        for _ in 0..3 {
            c.get("local", T0);
        }
        assert!(c.add_references("replica", 8, T0));
        assert!(!c.add_references("absent", 8, T0));
        assert_eq!(c.stats().hits, 3);
        assert_eq!(
            c.insert("new", (), 1, secs(1)).into_evicted(),
            vec![("local", ())]
        );
    }

    #[test]
    fn lfu_cache_ages_on_tick() {
        let mut c: Cache<u32, ()> = Cache::new(2, Box::new(LfuAging::new(secs(10), 0.5)));
        let _ = c.insert(1, (), 1, T0);
        for _ in 0..3 {
            c.get(&1, T0); // 4
        }
        let _ = c.insert(2, (), 1, secs(1));
        c.get(&2, secs(1)); // 2
        c.tick(secs(100)); // 4/1024 vs 2/1024: order unchanged
        c.get(&2, secs(100)); // 1 + 2/1024 > 4/1024
        assert_eq!(c.insert(3, (), 1, secs(100)).into_evicted(), vec![(1, ())]);
    }

    /// A policy that forgets everything: the cache must still keep its
    /// byte budget.
    struct Forgetful;

    impl ReplacementPolicy<u32> for Forgetful {
        fn on_insert(&mut self, _: &u32, _: u64, _: Duration) {}
        fn on_hit(&mut self, _: &u32, _: u64, _: Duration) {}
        fn on_remove(&mut self, _: &u32) {}
        fn victim(&mut self) -> Option<u32> {
            Some(12345) // never stored
        }
        fn name(&self) -> &'static str {
            "forgetful"
        }
    }

    #[test]
    fn broken_policy_cannot_break_the_budget() {
        let mut c: Cache<u32, u8> = Cache::new(10, Box::new(Forgetful));
        for k in 0..50 {
            let out = c.insert(k, 0, 3, T0);
            assert!(out.is_inserted());
            assert!(c.used_bytes() <= 10);
            assert!(c.contains(&k));
        }
        let _ = c.insert(7, 1, 9, T0);
        assert_eq!((c.len(), c.used_bytes()), (1, 9));
        assert_eq!(c.set_capacity(0, T0).len(), 1);
    }

    #[test]
    fn gdsf_cache_prefers_small() {
        let mut c: Cache<u32, ()> = Cache::new(100, Box::new(Gdsf::new()));
        let _ = c.insert(1, (), 60, T0);
        for k in 2..6 {
            let _ = c.insert(k, (), 10, T0);
        }
        // The large object has the lowest H = 1/60 and goes first.
        let _ = c.insert(6, (), 10, T0);
        assert!(!c.contains(&1));
        let _ = c.insert(7, (), 50, T0);
        let _ = c.insert(8, (), 10, T0);
        // The newest object is large: GDSF drops it, where LRU would drop 2.
        assert!(!c.contains(&7), "large newest object should go first");
        assert!(c.contains(&2));
        assert_eq!(c.used_bytes(), 60);
    }

    #[test]
    fn debug_output_names_policy() {
        let c: Cache<u32, ()> = Cache::with_kind(1, PolicyKind::Gdsf);
        assert!(format!("{c:?}").contains("gdsf"));
    }
}
