//! Least-frequently-used replacement with periodic aging.

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

use crate::aging::AgingCore;
use crate::policy::{check_aging, PolicyError};
use crate::ReplacementPolicy;

/// Least frequently used with periodic aging, the replacement policy of the
/// hot-object cache in seed 000 §3.2.1.
///
/// Each key has a reference count: 1 when inserted, +1 per hit or update,
/// +n for [`add_references`](ReplacementPolicy::add_references). Every
/// `interval`, all counts are multiplied by `factor`, so objects that built
/// up high counts but are rarely requested later can be replaced. The victim
/// is the key with the lowest aged count; ties go to the least recently
/// referenced. Aging is applied lazily when a call carries a later `now`.
///
/// Operations are O(log n); aging is O(1) per period amortized (see the
/// crate documentation).
#[derive(Debug)]
pub struct LfuAging<K> {
    core: AgingCore<K>,
}

impl<K: Hash + Eq + Clone> LfuAging<K> {
    /// Default aging period: 10 s.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
    /// Default aging factor: 0.5.
    pub const DEFAULT_FACTOR: f64 = 0.5;

    /// LFU that multiplies every count by `factor` each `interval`.
    /// A factor of 1 disables aging (plain LFU); 0 resets counts every period.
    ///
    /// # Panics
    ///
    /// If `factor` is not in `[0, 1]` or `interval` is zero; see
    /// [`try_new`](Self::try_new).
    pub fn new(interval: Duration, factor: f64) -> Self {
        match Self::try_new(interval, factor) {
            Ok(p) => p,
            Err(e) => panic!("invalid LFU aging parameters: {e}"),
        }
    }

    /// Like [`new`](Self::new), but returns an error for invalid parameters.
    pub fn try_new(interval: Duration, factor: f64) -> Result<Self, PolicyError> {
        check_aging(interval, factor)?;
        Ok(LfuAging {
            core: AgingCore::new(interval, factor),
        })
    }

    /// Plain LFU: counts never decay.
    pub fn without_aging() -> Self {
        Self::new(Self::DEFAULT_INTERVAL, 1.0)
    }

    /// The aging period.
    pub fn interval(&self) -> Duration {
        self.core.interval()
    }

    /// The aging factor.
    pub fn factor(&self) -> f64 {
        self.core.factor()
    }

    /// Number of tracked keys.
    pub fn len(&self) -> usize {
        self.core.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.core.len() == 0
    }

    /// The aged reference count of `key` at `now` (`None` if untracked).
    pub fn reference_count<Q>(&self, key: &Q, now: Duration) -> Option<f64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.core.count_at(key, now)
    }

    /// Tracked keys in eviction order (next victim first), as of the last
    /// aging applied.
    pub fn iter(&self) -> impl Iterator<Item = &K> + '_ {
        self.core.iter_coldest_first()
    }
}

impl<K: Hash + Eq + Clone> Default for LfuAging<K> {
    fn default() -> Self {
        Self::new(Self::DEFAULT_INTERVAL, Self::DEFAULT_FACTOR)
    }
}

impl<K: Hash + Eq + Clone + Send> ReplacementPolicy<K> for LfuAging<K> {
    fn on_insert(&mut self, key: &K, _size: u64, now: Duration) {
        self.core.advance(now);
        self.core.touch(key, 1.0);
    }

    fn on_update(&mut self, key: &K, _old_size: u64, _new_size: u64, now: Duration) {
        self.core.advance(now);
        self.core.touch(key, 1.0);
    }

    fn on_hit(&mut self, key: &K, _size: u64, now: Duration) {
        self.core.advance(now);
        self.core.touch_existing(key, 1.0);
    }

    fn add_references(&mut self, key: &K, _size: u64, n: u64, now: Duration) {
        self.core.advance(now);
        if n > 0 {
            self.core.touch_existing(key, n as f64);
        }
    }

    fn on_remove(&mut self, key: &K) {
        self.core.remove(key);
    }

    fn victim(&mut self) -> Option<K> {
        self.core.pop_min().map(|(key, _)| key)
    }

    fn tick(&mut self, now: Duration) {
        self.core.advance(now);
    }

    fn name(&self) -> &'static str {
        "lfu"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn evicts_least_frequent_ties_by_recency() {
        let mut p = LfuAging::without_aging();
        let t = secs(0);
        for k in 1..=4u32 {
            p.on_insert(&k, 1, t);
        }
        p.on_hit(&1, 1, t);
        p.on_hit(&1, 1, t);
        p.on_hit(&3, 1, t);
        p.add_references(&4, 1, 5, t);
        // counts: 1→3, 2→1, 3→2, 4→6
        assert_eq!(p.iter().copied().collect::<Vec<_>>(), vec![2, 3, 1, 4]);
        assert_eq!(p.victim(), Some(2));
        p.on_hit(&1, 1, t); // 1→4; 3 is now alone at the bottom
        assert_eq!(p.victim(), Some(3));
        p.on_remove(&4);
        assert_eq!(p.victim(), Some(1));
        assert_eq!(p.victim(), None);
    }

    #[test]
    fn aging_lets_new_references_overtake_old_ones() {
        let mut p = LfuAging::new(secs(10), 0.5);
        p.on_insert(&"old", 1, secs(0));
        for _ in 0..7 {
            p.on_hit(&"old", 1, secs(0)); // 8
        }
        p.on_insert(&"new", 1, secs(5));
        p.on_hit(&"new", 1, secs(5)); // 2
        assert_eq!(p.reference_count(&"old", secs(5)), Some(8.0));
        // Three periods later "old" is at 1, "new" at 0.25, plus 2 more hits.
        p.on_hit(&"new", 1, secs(30));
        p.on_hit(&"new", 1, secs(30));
        assert_eq!(p.reference_count(&"old", secs(30)), Some(1.0));
        assert_eq!(p.reference_count(&"new", secs(30)), Some(2.25));
        assert_eq!(p.victim(), Some("old"));
    }

    #[test]
    fn untracked_keys_are_ignored() {
        let mut p: LfuAging<u32> = LfuAging::default();
        p.on_hit(&1, 1, secs(0));
        p.add_references(&1, 1, 3, secs(0));
        p.on_remove(&1);
        assert!(p.is_empty());
        assert_eq!(p.victim(), None);
        assert_eq!(p.interval(), secs(10));
        assert_eq!(p.factor(), 0.5);
        assert!(LfuAging::<u32>::try_new(secs(1), 2.0).is_err());
    }
}
