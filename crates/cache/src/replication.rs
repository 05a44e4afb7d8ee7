//! Hot-object replication (seed 000 §3.2.1), as decisions without I/O.
//!
//! Each node counts references to the targets it owns ([`HotTargets`], aged like LFU counts).
//! When a peer moves a request for one of them to this owner and the target's count has passed
//! the threshold, the owner sends the peer a copy of the object with the connection's return;
//! the peer keeps it in a separate cache bounded in bytes ([`Replicas`], LFU with aging) and
//! serves later requests for it itself. A replicated target's count grows by the number of
//! copies per reference, on the owner and on every holder alike: each of them sees only its
//! share of the requests, so the product estimates the cluster's count and no count messages
//! are needed. An evicted (or expired) replica sends requests to the owner again, which sends a
//! new copy while the target stays hot.
//!
//! Replicas are never stale beyond the owner's revalidation interval: a copy carries how long
//! ago the owner last checked the object against its disk, and the holder stops serving it once
//! the rest of that interval has passed. The next request goes to the owner, which checks its
//! disk; the holder sends the copy's validator along ([`Lookup::Stale`]), and an owner whose
//! object is unchanged and still hot renews the copy ([`Replicas::renew`]) instead of sending
//! its bytes again. So a hot object crosses the network once while it stays unchanged, however
//! short the revalidation interval, and a changed one is copied anew.
//!
//! Time is an argument (`now`, monotonic since an origin the caller chooses), so the node, the
//! simulator and the tests run the same code.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::time::Duration;

use crate::{AgingCounter, Cache, InsertOutcome, LfuAging, Map, PolicyError};

/// The default hot threshold: with counts halved every 10 s, a target's count settles near 20 x
/// its request rate, so 200 makes a target hot from about 10 requests a second (counted with
/// its copies). Chosen in the simulator on the trace shaped like seed 000's (74,820 files,
/// 650 MB, 1M requests) at 8 nodes and 160 clients, with copies trusted for the node's 1 s
/// revalidation interval and renewed by their owners when stale: 20 gave 0.808 of the links,
/// 50 0.782, 200 0.833, 500 0.781 (a lower threshold fills the replica cache with copies that
/// are renewed, each renewal costing a request moved to the owner; a higher one leaves hot
/// objects with their owners). With copies trusted for 60 s, 20 is better (0.897); see
/// bench/cyclone.
pub const DEFAULT_HOT_THRESHOLD: f64 = 200.0;

/// How targets become hot and how much memory replicas may take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplicationSettings {
    /// Aged reference count from which an owned target is hot.
    pub threshold: f64,
    /// Every `aging_interval` all counts (owned and replica) are multiplied by `aging_factor`.
    pub aging_interval: Duration,
    /// See `aging_interval`; in `[0, 1]`.
    pub aging_factor: f64,
    /// Owned targets whose counts are kept (the coldest are forgotten beyond it).
    pub max_tracked: usize,
    /// Bytes of the replica cache.
    pub replica_bytes: u64,
    /// Largest object replicated.
    pub max_object_bytes: u64,
}

impl ReplicationSettings {
    /// Whether the settings make sense.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(self.threshold.is_finite() && self.threshold >= 1.0) {
            return Err(PolicyError::Replication(format!(
                "hot_threshold {} must be a number of references >= 1",
                self.threshold
            )));
        }
        AgingCounter::<u8>::try_new(self.aging_interval, self.aging_factor, 1)?;
        if self.max_tracked == 0 {
            return Err(PolicyError::Replication(
                "max_tracked must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// The owner's side: aged reference counts of the targets it owns, and the peers it has sent
/// copies of each hot one.
///
/// `P` names a peer (a member index or name).
#[derive(Debug)]
pub struct HotTargets<K, P> {
    counts: AgingCounter<K>,
    /// Peers holding a copy, as far as this owner knows, by target. Only for tracked targets.
    holders: Map<K, HashSet<P>>,
    threshold: f64,
    max_object_bytes: u64,
    shipped: u64,
}

impl<K: Hash + Eq + Clone, P: Hash + Eq> HotTargets<K, P> {
    /// Counts with `settings`' threshold, aging and bound.
    pub fn new(settings: &ReplicationSettings) -> Result<Self, PolicyError> {
        settings.validate()?;
        Ok(HotTargets {
            counts: AgingCounter::try_new(
                settings.aging_interval,
                settings.aging_factor,
                settings.max_tracked,
            )?,
            holders: Map::default(),
            threshold: settings.threshold,
            max_object_bytes: settings.max_object_bytes,
            shipped: 0,
        })
    }

    /// Copies of `key` in the cluster as this owner knows them: its own and its peers'.
    pub fn copies<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        1 + self.holders.get(key).map_or(0, |h| h.len() as u32)
    }

    /// This owner served a request for `key` (for its own client, or for a peer that moved the
    /// request here). The count grows by the number of copies. Returns the new count.
    pub fn reference<Q>(&mut self, key: &Q, now: Duration) -> f64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let n = u64::from(self.copies(key));
        let count = self.counts.record(key, n, now);
        self.forget_untracked();
        count
    }

    /// `peer` moved a request for `key` (an object of `size` bytes, just served here) to this
    /// owner, so it holds no usable copy. If `key` is hot and small enough, the peer is to be
    /// sent one: returns the number of copies in the cluster with it, which the holder's
    /// counts grow by. The peer is then counted among the holders.
    pub fn ship<Q>(&mut self, key: &Q, size: u64, peer: P, now: Duration) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if size > self.max_object_bytes || !self.counts.is_hot(key, self.threshold, now) {
            return None;
        }
        match self.holders.get_mut(key) {
            Some(h) => {
                h.insert(peer);
            }
            None => {
                self.holders.insert(key.to_owned(), HashSet::from([peer]));
            }
        }
        self.shipped += 1;
        Some(self.copies(key))
    }

    /// `peer` is gone (left the cluster, or its connection to this owner ended): it holds
    /// nothing any more as far as the counts go.
    pub fn peer_gone(&mut self, peer: &P) {
        self.holders.retain(|_, h| {
            h.remove(peer);
            !h.is_empty()
        });
    }

    /// Whether `key` is hot at `now`.
    pub fn is_hot<Q>(&self, key: &Q, now: Duration) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.counts.is_hot(key, self.threshold, now)
    }

    /// The aged count of `key` at `now`.
    pub fn count<Q>(&self, key: &Q, now: Duration) -> f64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.counts.count(key, now)
    }

    /// Copies sent so far.
    pub fn shipped(&self) -> u64 {
        self.shipped
    }

    /// Hot targets at `now` with their counts, in no order.
    fn hot_at(&self, now: Duration) -> impl Iterator<Item = (&K, f64)> + '_ {
        self.counts
            .keys()
            .map(move |k| (k, self.counts.count(k, now)))
            .filter(|(_, c)| *c >= self.threshold)
    }

    /// How many targets are hot at `now`.
    pub fn hot_count(&self, now: Duration) -> usize {
        self.hot_at(now).count()
    }

    /// Hot targets at `now`, hottest first, at most `n`.
    pub fn hottest(&self, n: usize, now: Duration) -> Vec<(K, f64)> {
        let mut hot: Vec<(K, f64)> = self.hot_at(now).map(|(k, c)| (k.clone(), c)).collect();
        hot.sort_by(|a, b| b.1.total_cmp(&a.1));
        hot.truncate(n);
        hot
    }

    /// A target whose count was forgotten (the counter is full) has no holders to remember.
    fn forget_untracked(&mut self) {
        if self.holders.len() > self.counts.len() {
            let counts = &self.counts;
            self.holders.retain(|k, _| counts.contains(k));
        }
    }
}

/// A copy received from an owner.
#[derive(Debug)]
struct Copy<V> {
    value: V,
    /// Copies in the cluster when it was sent: each hit counts as that many references.
    copies: u32,
    /// Until when it may be served.
    fresh_until: Duration,
    /// The freshness an owner's check grants (the revalidation interval it arrived with).
    fresh_for: Duration,
    /// When a request went to the owner with this copy's validator, once it is stale.
    checked_at: Option<Duration>,
}

/// What the replica cache has for a request ([`Replicas::lookup`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a, V> {
    /// A fresh copy: serve it (counted as a hit).
    Fresh(&'a V),
    /// A copy whose freshness ran out: the request goes to the owner, with this copy's
    /// validator, so that the owner can renew it ([`Replicas::renew`]) instead of copying the
    /// object again. Every request meanwhile does the same (so that none draws a whole copy
    /// while the first check is on its way); a copy not renewed within one freshness interval
    /// of its first check is dropped.
    Stale(&'a V),
    /// Nothing to serve and nothing to check.
    Miss,
}

/// Counters of a replica cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Requests served from a replica.
    pub hits: u64,
    /// Copies received and stored.
    pub stored: u64,
    /// Copies received and not stored (larger than the cache or the per-object bound).
    pub rejected: u64,
    /// Replicas evicted to make room.
    pub evicted: u64,
    /// Replicas whose freshness ran out (each time it does): checked with the owner, then
    /// renewed, replaced or dropped.
    pub expired: u64,
    /// Stale replicas the owner found unchanged and renewed without sending them again.
    pub renewed: u64,
    /// Stale replicas dropped because the owner did not renew them within a freshness interval
    /// (the target cooled, or the check was lost).
    pub dropped: u64,
}

/// The holder's side: replicas received from owners, in a cache of their own (so replication
/// never takes more than its budget from the node's object cache), LFU with aging.
#[derive(Debug)]
pub struct Replicas<K, V> {
    cache: Cache<K, Copy<V>>,
    stats: ReplicaStats,
    /// References a copy starts with: the hot threshold (see [`Replicas::insert`]).
    initial_count: u64,
}

impl<K: Hash + Eq + Clone + Send + 'static, V> Replicas<K, V> {
    /// An empty replica cache with `settings`' byte budget and aging.
    pub fn new(settings: &ReplicationSettings) -> Result<Self, PolicyError> {
        settings.validate()?;
        let lfu = LfuAging::try_new(settings.aging_interval, settings.aging_factor)?;
        let cache = Cache::new(settings.replica_bytes, Box::new(lfu))
            .with_max_object_bytes(settings.max_object_bytes);
        Ok(Replicas {
            cache,
            stats: ReplicaStats::default(),
            initial_count: settings.threshold.ceil() as u64,
        })
    }

    /// The replica of `key` if there is a fresh one: a hit, counted as as many references as
    /// there were copies when it arrived. A stale one is for the owner to check: see
    /// [`Lookup::Stale`].
    pub fn lookup<Q>(&mut self, key: &Q, now: Duration) -> Lookup<'_, V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(c) = self.cache.peek_mut(key) else {
            self.cache.tick(now);
            return Lookup::Miss;
        };
        if now < c.fresh_until {
            let copies = c.copies;
            self.stats.hits += 1;
            // `get` counts one reference; the other copies' share comes on top.
            if copies > 1 {
                self.cache.add_references(key, u64::from(copies - 1), now);
            }
            return match self.cache.get(key, now) {
                Some(c) => Lookup::Fresh(&c.value),
                None => Lookup::Miss,
            };
        }
        match c.checked_at {
            None => {
                c.checked_at = Some(now);
                self.stats.expired += 1;
            }
            Some(at) if now < at + c.fresh_for => {}
            Some(_) => {
                self.cache.remove(key);
                self.stats.dropped += 1;
                return Lookup::Miss;
            }
        }
        match self.cache.peek(key) {
            Some(c) => Lookup::Stale(&c.value),
            None => Lookup::Miss,
        }
    }

    /// The replica of `key` if there is a fresh one (see [`Replicas::lookup`]).
    pub fn get<Q>(&mut self, key: &Q, now: Duration) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.lookup(key, now) {
            Lookup::Fresh(v) => Some(v),
            Lookup::Stale(_) | Lookup::Miss => None,
        }
    }

    /// The owner checked the copy of `key` that `same` accepts (the validator sent with
    /// [`Lookup::Stale`]) `age` ago, found it unchanged, and counts `copies` copies: it may be
    /// served for `fresh_for - age` from `now`. Returns whether a copy was renewed (it may have
    /// been evicted, or replaced by a newer one, meanwhile).
    pub fn renew<Q>(
        &mut self,
        key: &Q,
        same: impl FnOnce(&V) -> bool,
        copies: u32,
        age: Duration,
        fresh_for: Duration,
        now: Duration,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(c) = self.cache.peek_mut(key) else {
            return false;
        };
        if !same(&c.value) {
            return false;
        }
        c.fresh_until = c.fresh_until.max(now + fresh_for.saturating_sub(age));
        c.fresh_for = fresh_for;
        c.copies = copies.max(1);
        c.checked_at = None;
        self.stats.renewed += 1;
        true
    }

    /// Store a copy of `key` (`size` bytes) that was checked against the owner's disk `age`
    /// ago, with `copies` copies in the cluster; it may be served until `fresh_for - age` from
    /// now. Returns whether it was stored; values evicted to make room are returned for the
    /// caller to drop outside any lock.
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &mut self,
        key: K,
        value: V,
        size: u64,
        copies: u32,
        age: Duration,
        fresh_for: Duration,
        now: Duration,
    ) -> (bool, Vec<V>) {
        let fresh_until = now + fresh_for.saturating_sub(age);
        let copy = Copy {
            value,
            copies: copies.max(1),
            fresh_until,
            fresh_for,
            checked_at: None,
        };
        let k = key.clone();
        match self.cache.insert(key, copy, size, now) {
            InsertOutcome::Inserted { replaced, evicted } => {
                self.stats.stored += 1;
                self.stats.evicted += evicted.len() as u64;
                // An owner sends a copy only of a target whose count (the cluster's, estimated
                // as every holder estimates its replicas') has passed the threshold, so the copy
                // starts at the threshold. Starting at `copies` instead put every new copy below
                // all the replicas already held: the next copy to arrive evicted it before its
                // first hit, and the cache kept whatever came first while the hottest targets
                // were copied over and over.
                let start = self.initial_count.max(u64::from(copies.max(1)));
                self.cache.add_references(&k, start - 1, now);
                let mut gone: Vec<V> = evicted.into_iter().map(|(_, c)| c.value).collect();
                gone.extend(replaced.map(|c| c.value));
                (true, gone)
            }
            InsertOutcome::Rejected { value, .. } => {
                self.stats.rejected += 1;
                (false, vec![value.value])
            }
        }
    }

    /// Replicas held.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.cache.used_bytes()
    }

    /// The byte budget.
    pub fn capacity_bytes(&self) -> u64 {
        self.cache.capacity_bytes()
    }

    /// Counters so far.
    pub fn stats(&self) -> ReplicaStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ReplicationSettings {
        ReplicationSettings {
            threshold: 4.0,
            aging_interval: Duration::from_secs(10),
            aging_factor: 0.5,
            max_tracked: 100,
            replica_bytes: 1000,
            max_object_bytes: 400,
        }
    }

    const T0: Duration = Duration::ZERO;

    #[test]
    fn a_target_is_shipped_once_hot_and_its_count_then_grows_by_the_copies() {
        let mut hot: HotTargets<String, u8> = HotTargets::new(&settings()).unwrap();
        for i in 1..=3 {
            assert_eq!(hot.reference("/a", T0), i as f64);
            assert_eq!(hot.ship("/a", 10, 1, T0), None, "not hot at {i}");
        }
        assert_eq!(hot.reference("/a", T0), 4.0);
        assert_eq!(hot.ship("/a", 10, 1, T0), Some(2));
        // The same peer again (it lost its copy): still two copies.
        assert_eq!(hot.reference("/a", T0), 6.0);
        assert_eq!(hot.ship("/a", 10, 1, T0), Some(2));
        assert_eq!(hot.ship("/a", 10, 2, T0), Some(3));
        assert_eq!(hot.reference("/a", T0), 9.0);
        assert_eq!(hot.shipped(), 3);
        // Too large: never shipped.
        assert_eq!(hot.ship("/a", 401, 3, T0), None);
        hot.peer_gone(&1);
        assert_eq!(hot.copies("/a"), 2);
    }

    #[test]
    fn counts_age_and_a_cooled_target_is_not_shipped() {
        let mut hot: HotTargets<String, u8> = HotTargets::new(&settings()).unwrap();
        for _ in 0..4 {
            hot.reference("/a", T0);
        }
        assert!(hot.is_hot("/a", T0));
        let later = Duration::from_secs(10);
        assert_eq!(hot.count("/a", later), 2.0);
        assert_eq!(hot.ship("/a", 10, 1, later), None);
        assert_eq!(hot.hottest(5, T0), vec![("/a".to_owned(), 4.0)]);
        assert!(hot.hottest(5, later).is_empty());
    }

    #[test]
    fn replicas_are_served_while_fresh_and_counted_by_the_copies() {
        let mut r: Replicas<String, &str> = Replicas::new(&settings()).unwrap();
        let fresh = Duration::from_secs(2);
        let (stored, gone) = r.insert(
            "/a".into(),
            "A",
            100,
            3,
            Duration::from_millis(500),
            fresh,
            T0,
        );
        assert!(stored && gone.is_empty());
        assert_eq!(r.get("/a", Duration::from_millis(1499)), Some(&"A"));
        assert_eq!(r.stats().hits, 1);
        // Checked 0.5 s before it arrived, kept 2 s from that check.
        assert_eq!(r.get("/a", Duration::from_millis(1500)), None);
        assert_eq!(r.stats().expired, 1);
        assert_eq!(r.get("/b", T0), None);
        assert_eq!(r.stats().hits, 1);
    }

    #[test]
    fn a_stale_copy_is_checked_once_then_renewed_or_dropped() {
        let mut r: Replicas<String, &str> = Replicas::new(&settings()).unwrap();
        let fresh = Duration::from_secs(1);
        let ms = Duration::from_millis;
        assert!(r.insert("/a".into(), "A1", 100, 2, T0, fresh, T0).0);
        assert_eq!(r.lookup("/a", ms(999)), Lookup::Fresh(&"A1"));
        // Stale: every lookup hands out the validator until the owner answers.
        assert_eq!(r.lookup("/a", ms(1000)), Lookup::Stale(&"A1"));
        assert_eq!(r.lookup("/a", ms(1001)), Lookup::Stale(&"A1"));
        assert_eq!(r.stats().expired, 1);
        assert_eq!(r.stats().hits, 1);
        // The owner checked 100 ms ago and found another version: nothing renewed.
        assert!(!r.renew("/a", |v| *v == "A0", 3, ms(100), fresh, ms(1010)));
        assert_eq!(r.lookup("/a", ms(1020)), Lookup::Stale(&"A1"));
        // Unchanged: served again until one interval after the owner's check.
        assert!(r.renew("/a", |v| *v == "A1", 3, ms(100), fresh, ms(1010)));
        assert_eq!(r.stats().renewed, 1);
        assert_eq!(r.lookup("/a", ms(1909)), Lookup::Fresh(&"A1"));
        assert_eq!(r.stats().hits, 2);
        // Stale again, and this time the owner never answers (the target cooled): the copy
        // is checked for one interval and then dropped.
        assert_eq!(r.lookup("/a", ms(1910)), Lookup::Stale(&"A1"));
        assert_eq!(r.lookup("/a", ms(2909)), Lookup::Stale(&"A1"));
        assert_eq!(r.lookup("/a", ms(2910)), Lookup::Miss);
        assert!(r.is_empty());
        assert_eq!((r.stats().expired, r.stats().dropped), (2, 1));
        // A renewal for a copy no longer held changes nothing.
        assert!(!r.renew("/a", |_| true, 2, T0, fresh, ms(3000)));
        assert_eq!(r.stats().renewed, 1);
    }

    #[test]
    fn the_byte_budget_holds_and_the_least_used_replica_goes() {
        let mut r: Replicas<String, u32> = Replicas::new(&settings()).unwrap();
        let fresh = Duration::from_secs(60);
        assert!(r.insert("/a".into(), 1, 400, 2, T0, fresh, T0).0);
        assert!(r.insert("/b".into(), 2, 400, 2, T0, fresh, T0).0);
        for _ in 0..3 {
            assert!(r.get("/a", T0).is_some());
        }
        let (stored, gone) = r.insert("/c".into(), 3, 400, 2, T0, fresh, T0);
        assert!(stored);
        assert_eq!(gone, vec![2], "the less used replica is evicted");
        assert!(r.bytes() <= r.capacity_bytes());
        // Larger than the per-object bound: handed back.
        let (stored, gone) = r.insert("/d".into(), 4, 401, 2, T0, fresh, T0);
        assert!(!stored);
        assert_eq!(gone, vec![4]);
        assert_eq!(r.stats().rejected, 1);
        assert_eq!(r.stats().evicted, 1);
    }

    #[test]
    fn a_new_copy_starts_at_the_hot_threshold_and_outlives_a_replica_that_cooled() {
        // Threshold 4, room for two 400-byte copies, counts halved every 10 s.
        let fresh = Duration::from_secs(600);
        let mut r: Replicas<String, u8> = Replicas::new(&settings()).unwrap();
        assert!(r.insert("/a".into(), 1, 400, 1, T0, fresh, T0).0);
        // Three hits: 4 + 3 = 7; halved at 10 s: 3.5, below the threshold.
        for _ in 0..3 {
            assert!(r.get("/a", T0).is_some());
        }
        let t = Duration::from_secs(10);
        assert!(r.insert("/b".into(), 2, 400, 1, T0, fresh, t).0);
        // A third copy needs room: the cooled /a goes, not the new /b, which came in at the
        // threshold (4). Had /b started at its one copy, it would have gone instead and every
        // new copy after it in turn, while /a stayed.
        let (stored, gone) = r.insert("/c".into(), 3, 400, 1, T0, fresh, t);
        assert!(stored);
        assert_eq!(gone, vec![1]);
        assert!(r.get("/b", t).is_some());
        assert!(r.get("/c", t).is_some());
        assert!(r.get("/a", t).is_none());
    }

    #[test]
    fn bad_settings_are_refused() {
        let mut s = settings();
        s.threshold = 0.0;
        assert!(HotTargets::<String, u8>::new(&s).is_err());
        let mut s = settings();
        s.aging_factor = 2.0;
        assert!(Replicas::<String, u8>::new(&s).is_err());
        let mut s = settings();
        s.max_tracked = 0;
        assert!(s.validate().is_err());
    }
}

#[cfg(test)]
mod props {
    //! The replication decisions against a plain model: exact aged counts (halving, so the
    //! arithmetic is exact), a set of holders per target, a list of fresh copies.

    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const PERIOD: u64 = 1_000;

    #[derive(Clone, Debug)]
    enum Op {
        Reference(u8),
        Ship(u8, u64, u8),
        Gone(u8),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..6).prop_map(Op::Reference),
            3 => (0u8..6, 0u64..500, 0u8..4).prop_map(|(k, s, p)| Op::Ship(k, s, p)),
            1 => (0u8..4).prop_map(Op::Gone),
            2 => (0u64..1_500).prop_map(Op::Advance),
        ]
    }

    fn settings() -> ReplicationSettings {
        ReplicationSettings {
            threshold: 5.0,
            aging_interval: Duration::from_millis(PERIOD),
            aging_factor: 0.5,
            max_tracked: 1_000,
            replica_bytes: 1_000,
            max_object_bytes: 300,
        }
    }

    proptest! {
        #[test]
        fn owner_decisions_match_the_model(ops in proptest::collection::vec(op(), 1..200)) {
            let s = settings();
            let mut hot: HotTargets<u8, u8> = HotTargets::new(&s).unwrap();
            // (count as of `period`, period) and holders per key.
            let mut counts: HashMap<u8, (f64, u64)> = HashMap::new();
            let mut holders: HashMap<u8, HashSet<u8>> = HashMap::new();
            let mut now = 0u64;
            // Aging periods start when the counter first sees time (the first reference).
            let mut origin: Option<u64> = None;
            let period = |origin: Option<u64>, now: u64| (now - origin.unwrap_or(now)) / PERIOD;
            let aged = |c: &HashMap<u8, (f64, u64)>, k: u8, p_now: u64| -> f64 {
                c.get(&k).map_or(0.0, |(n, p)| n * 0.5f64.powi((p_now - p) as i32))
            };
            for op in ops {
                let t = Duration::from_millis(now);
                match op {
                    Op::Reference(k) => {
                        origin.get_or_insert(now);
                        let copies = 1.0 + holders.get(&k).map_or(0, |h| h.len()) as f64;
                        let c = aged(&counts, k, period(origin, now)) + copies;
                        counts.insert(k, (c, period(origin, now)));
                        prop_assert_eq!(hot.reference(&k, t), c);
                    }
                    Op::Ship(k, size, p) => {
                        let expect = (size <= s.max_object_bytes
                            && aged(&counts, k, period(origin, now)) >= s.threshold)
                            .then(|| {
                                let h = holders.entry(k).or_default();
                                h.insert(p);
                                1 + h.len() as u32
                            });
                        prop_assert_eq!(hot.ship(&k, size, p, t), expect);
                    }
                    Op::Gone(p) => {
                        hot.peer_gone(&p);
                        for h in holders.values_mut() {
                            h.remove(&p);
                        }
                    }
                    Op::Advance(ms) => now += ms,
                }
                for k in 0..6u8 {
                    prop_assert_eq!(
                        hot.count(&k, Duration::from_millis(now)),
                        aged(&counts, k, period(origin, now))
                    );
                    prop_assert_eq!(hot.copies(&k), 1 + holders.get(&k).map_or(0, |h| h.len()) as u32);
                }
            }
        }

        #[test]
        fn replicas_stay_in_budget_and_are_never_served_stale(
            ops in proptest::collection::vec((0u8..8, 0u64..400, 0u64..3_000, 0u64..800, 0u8..4), 1..200)
        ) {
            let s = settings();
            let fresh_for = Duration::from_millis(2_000);
            let mut r: Replicas<u8, (u8, u64)> = Replicas::new(&s).unwrap();
            // The last copy stored per key: (version, fresh until).
            let mut model: HashMap<u8, (u64, u64)> = HashMap::new();
            let mut now = 0u64;
            for (version, (k, size, age, step, kind)) in ops.into_iter().enumerate() {
                let version = version as u64;
                now += step;
                let t = Duration::from_millis(now);
                match kind {
                    0 => {
                        let (stored, _) = r.insert(k, (k, version), size, 2, Duration::from_millis(age), fresh_for, t);
                        prop_assert_eq!(stored, size <= s.max_object_bytes);
                        if stored {
                            model.insert(k, (version, now + 2_000u64.saturating_sub(age)));
                        }
                    }
                    1 | 2 => {
                        // The owner's check: of the latest version (1) or of an older one (2).
                        let Some(&(v, until)) = model.get(&k) else { continue };
                        let checked = if kind == 1 { v } else { v.wrapping_sub(1) };
                        let renewed = r.renew(&k, |c| c.1 == checked, 2, Duration::from_millis(age), fresh_for, t);
                        if kind == 2 {
                            prop_assert!(!renewed, "an older version renewed the copy");
                        }
                        if renewed {
                            model.insert(k, (v, until.max(now + 2_000u64.saturating_sub(age))));
                        }
                    }
                    _ => {
                        let got = r.get(&k, t).copied();
                        if let Some((gk, gv)) = got {
                            let (v, until) = model[&k];
                            prop_assert_eq!(gk, k);
                            prop_assert_eq!(gv, v, "only the latest copy is served");
                            prop_assert!(now < until, "served after its freshness ran out");
                        }
                    }
                }
                prop_assert!(r.bytes() <= r.capacity_bytes());
            }
        }
    }
}
