//! Reference counts with periodic aging, shared by [`LfuAging`](crate::LfuAging)
//! and [`AgingCounter`].

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::hash::Hash;
use std::time::Duration;

use crate::ordered::OrdF64;
use crate::policy::{check_aging, PolicyError};
use crate::Map;

/// Increment weights above this trigger a renormalization (2^64).
const RENORMALIZE_ABOVE: f64 = 18_446_744_073_709_551_616.0;

#[derive(Clone, Copy, Debug)]
struct Slot {
    scaled: f64,
    seq: u64,
}

/// Keys ordered by (aged count, recency).
///
/// Aging multiplies every count by `factor` once per `interval`. Doing that
/// literally costs O(n) per period. Because scaling all counts by the same
/// factor never changes their order, the core instead stores *scaled* counts
/// and makes new references heavier: a reference adds `weight` to the
/// stored value, and each aging period divides `weight` by `factor`. The real
/// count is `scaled / weight`. When `weight` grows past 2^64 (or a factor of
/// zero makes it infinite) every stored value is rescaled once, in O(n), and
/// `weight` returns to 1, so aging costs O(1) per period amortized and at
/// most O(n) in the periods that renormalize.
///
/// The order is a `BTreeMap` keyed by `(count, sequence)` — no small crate
/// offers an indexed priority queue with decrease/increase-key by an
/// arbitrary key, and the ordered map gives O(log n) updates and victim
/// lookups. The sequence number (bumped on every reference) breaks ties so
/// that the least recently referenced of equally counted keys comes first.
#[derive(Debug)]
pub(crate) struct AgingCore<K> {
    interval: Duration,
    factor: f64,
    /// Start of the current aging period; `None` until time is first seen.
    epoch_start: Option<Duration>,
    weight: f64,
    entries: Map<K, Slot>,
    order: BTreeMap<(OrdF64, u64), K>,
    next_seq: u64,
}

impl<K: Hash + Eq> AgingCore<K> {
    /// The parameters must have passed [`check_aging`].
    pub(crate) fn new(interval: Duration, factor: f64) -> Self {
        debug_assert!(check_aging(interval, factor).is_ok());
        AgingCore {
            interval,
            factor,
            epoch_start: None,
            weight: 1.0,
            entries: Map::default(),
            order: BTreeMap::new(),
            next_seq: 0,
        }
    }

    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    pub(crate) fn factor(&self) -> f64 {
        self.factor
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries.contains_key(key)
    }

    /// Whole aging periods between the current period's start and `now`.
    fn pending_periods(&self, now: Duration) -> u64 {
        match self.epoch_start {
            Some(start) if now > start => {
                let periods = (now - start).as_nanos() / self.interval.as_nanos();
                u64::try_from(periods).unwrap_or(u64::MAX)
            }
            _ => 0,
        }
    }

    fn multiplier(&self, periods: u64) -> f64 {
        if periods == 0 || self.factor == 1.0 {
            1.0
        } else if periods > i32::MAX as u64 {
            // factor < 1 here, so the result underflows to zero anyway.
            0.0
        } else {
            self.factor.powi(periods as i32)
        }
    }

    /// Applies every aging period that ended at or before `now`. Time that
    /// goes backwards is ignored.
    pub(crate) fn advance(&mut self, now: Duration) {
        let Some(start) = self.epoch_start else {
            self.epoch_start = Some(now);
            return;
        };
        let periods = self.pending_periods(now);
        if periods == 0 {
            return;
        }
        // The remainder is below one interval, so it fits in u64 nanoseconds.
        let into_period = (now - start).as_nanos() % self.interval.as_nanos();
        self.epoch_start = Some(now - Duration::from_nanos(into_period as u64));
        let m = self.multiplier(periods);
        if m == 1.0 {
            return;
        }
        let weight = self.weight / m;
        if weight.is_finite() && weight <= RENORMALIZE_ABOVE {
            self.weight = weight;
        } else {
            self.renormalize(m);
        }
    }

    /// Rewrites every stored value as its real count after multiplying by
    /// `m`, and resets the weight to 1. O(n).
    fn renormalize(&mut self, m: f64) {
        let scale = m / self.weight;
        self.weight = 1.0;
        let old = std::mem::take(&mut self.order);
        let entries = &mut self.entries;
        // Scaling keeps the order, except that values may underflow to equal
        // zeros whose tie-break differs; collecting re-sorts (cheaply, as the
        // input is nearly sorted).
        self.order = old
            .into_iter()
            .map(|((score, seq), key)| {
                let scaled = score.0 * scale;
                if let Some(slot) = entries.get_mut(&key) {
                    slot.scaled = scaled;
                }
                ((OrdF64(scaled), seq), key)
            })
            .collect();
    }

    /// Adds `n` references to `key` (inserting it with count `n` if absent)
    /// and makes it the most recently referenced. Returns the new count.
    /// Call [`advance`](Self::advance) first.
    pub(crate) fn touch<Q>(&mut self, key: &Q, n: f64) -> f64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(count) = self.touch_existing(key, n) {
            return count;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let scaled = n * self.weight;
        self.entries.insert(key.to_owned(), Slot { scaled, seq });
        self.order.insert((OrdF64(scaled), seq), key.to_owned());
        n
    }

    /// Like [`touch`](Self::touch) for a tracked key; returns `None` (and
    /// changes nothing) if `key` is not tracked.
    pub(crate) fn touch_existing<Q>(&mut self, key: &Q, n: f64) -> Option<f64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.entries.get_mut(key)?;
        let seq = self.next_seq;
        self.next_seq += 1;
        let owned = self
            .order
            .remove(&(OrdF64(slot.scaled), slot.seq))
            .expect("aging order out of sync with entries");
        slot.scaled += n * self.weight;
        slot.seq = seq;
        self.order.insert((OrdF64(slot.scaled), seq), owned);
        Some(slot.scaled / self.weight)
    }

    /// Forgets `key`, returning its count.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<f64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.entries.remove(key)?;
        self.order.remove(&(OrdF64(slot.scaled), slot.seq));
        Some(slot.scaled / self.weight)
    }

    /// Removes and returns the key with the lowest count (the least recently
    /// referenced among equals).
    pub(crate) fn pop_min(&mut self) -> Option<(K, f64)> {
        let ((score, _), key) = self.order.pop_first()?;
        self.entries.remove(&key);
        Some((key, score.0 / self.weight))
    }

    /// The count of `key` as of the last [`advance`](Self::advance).
    pub(crate) fn count_now<Q>(&self, key: &Q) -> Option<f64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries.get(key).map(|s| s.scaled / self.weight)
    }

    /// The count of `key` at time `now`, including aging periods that have
    /// ended but not yet been applied.
    pub(crate) fn count_at<Q>(&self, key: &Q, now: Duration) -> Option<f64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let m = self.multiplier(self.pending_periods(now));
        self.count_now(key).map(|c| c * m)
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.weight = 1.0;
    }

    /// Keys from coldest to hottest.
    pub(crate) fn iter_coldest_first(&self) -> impl Iterator<Item = &K> + '_ {
        self.order.values()
    }
}

/// Per-key reference counts with periodic aging and a bound on the number of
/// tracked keys.
///
/// Every `interval`, all counts are multiplied by `factor`, as in the hot
/// object replication of seed 000 §3.2.1, so that keys which were popular
/// once but are no longer referenced cool down: the count by which a node
/// can decide which of the objects it owns are hot enough to replicate to
/// its peers.
///
/// At most `max_keys` keys are tracked; recording a new key when full first
/// forgets the coldest one (lowest count, least recently referenced among
/// equals). All operations are O(log n) apart from the periodic
/// renormalization described on the aging core.
///
/// ```
/// use std::time::Duration;
/// use switchyard_cache::AgingCounter;
///
/// let mut c: AgingCounter<String> = AgingCounter::new(Duration::from_secs(10), 0.5, 1000);
/// let t0 = Duration::ZERO;
/// c.record("/index.html", 8, t0);
/// assert!(c.is_hot("/index.html", 8.0, t0));
/// // One aging period later the count has halved.
/// assert_eq!(c.count("/index.html", Duration::from_secs(10)), 4.0);
/// ```
#[derive(Debug)]
pub struct AgingCounter<K> {
    core: AgingCore<K>,
    max_keys: usize,
}

impl<K: Hash + Eq> AgingCounter<K> {
    /// A counter that multiplies all counts by `factor` every `interval` and
    /// tracks at most `max_keys` keys (at least one).
    ///
    /// # Panics
    ///
    /// If `factor` is not in `[0, 1]` or `interval` is zero; see
    /// [`try_new`](Self::try_new).
    pub fn new(interval: Duration, factor: f64, max_keys: usize) -> Self {
        match Self::try_new(interval, factor, max_keys) {
            Ok(c) => c,
            Err(e) => panic!("invalid AgingCounter parameters: {e}"),
        }
    }

    /// Like [`new`](Self::new), but returns an error for invalid parameters.
    pub fn try_new(interval: Duration, factor: f64, max_keys: usize) -> Result<Self, PolicyError> {
        check_aging(interval, factor)?;
        Ok(AgingCounter {
            core: AgingCore::new(interval, factor),
            max_keys: max_keys.max(1),
        })
    }

    /// Adds `n` references to `key` at time `now` and returns its new count.
    /// If `key` is new and the counter is full, the coldest key is forgotten
    /// first.
    pub fn record<Q>(&mut self, key: &Q, n: u64, now: Duration) -> f64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.core.advance(now);
        if let Some(count) = self.core.touch_existing(key, n as f64) {
            return count;
        }
        if self.core.len() >= self.max_keys {
            self.core.pop_min();
        }
        self.core.touch(key, n as f64)
    }

    /// The aged count of `key` at `now`, or 0 if it is not tracked.
    pub fn count<Q>(&self, key: &Q, now: Duration) -> f64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.core.count_at(key, now).unwrap_or(0.0)
    }

    /// Whether the aged count of `key` at `now` is at least `threshold`.
    pub fn is_hot<Q>(&self, key: &Q, threshold: f64, now: Duration) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.core.count_at(key, now).is_some_and(|c| c >= threshold)
    }

    /// Whether `key` is tracked.
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.core.contains(key)
    }

    /// Forgets `key`, returning its count as of the last aging applied.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<f64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.core.remove(key)
    }

    /// Applies any aging due by `now`.
    pub fn tick(&mut self, now: Duration) {
        self.core.advance(now);
    }

    /// Number of tracked keys.
    pub fn len(&self) -> usize {
        self.core.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.core.len() == 0
    }

    /// The bound on tracked keys.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Forgets every key.
    pub fn clear(&mut self) {
        self.core.clear();
    }

    /// Tracked keys, coldest first (as of the last aging applied).
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.core.iter_coldest_first()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn counts_halve_each_period() {
        let mut c: AgingCounter<u32> = AgingCounter::new(secs(10), 0.5, 10);
        assert_eq!(c.record(&1, 16, secs(0)), 16.0);
        assert_eq!(c.count(&1, secs(9)), 16.0);
        assert_eq!(c.count(&1, secs(10)), 8.0);
        assert_eq!(c.count(&1, secs(35)), 2.0);
        // Recording applies the pending aging before adding.
        assert_eq!(c.record(&1, 1, secs(35)), 3.0);
        assert_eq!(c.count(&1, secs(39)), 3.0);
        assert_eq!(c.count(&1, secs(40)), 1.5);
        assert!(c.is_hot(&1, 1.5, secs(40)));
        assert!(!c.is_hot(&1, 1.6, secs(40)));
        assert!(!c.is_hot(&2, 0.0, secs(40)));
        assert_eq!(c.count(&2, secs(40)), 0.0);
    }

    #[test]
    fn evicts_coldest_when_full() {
        let mut c: AgingCounter<u32> = AgingCounter::new(secs(10), 0.5, 3);
        c.record(&1, 5, secs(0));
        c.record(&2, 1, secs(0));
        c.record(&3, 1, secs(0));
        c.record(&4, 1, secs(1)); // forgets 2: lowest count, oldest
        assert_eq!(c.len(), 3);
        assert_eq!(c.count(&2, secs(1)), 0.0);
        assert_eq!(c.keys().copied().collect::<Vec<_>>(), vec![3, 4, 1]);
        assert!(c.contains(&1) && !c.contains(&2));
        assert_eq!(c.remove(&1), Some(5.0));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn borrowed_lookup_with_string_keys() {
        let mut c: AgingCounter<String> = AgingCounter::new(secs(1), 0.5, 4);
        c.record("/a", 2, secs(0));
        assert_eq!(c.count("/a", secs(0)), 2.0);
        assert_eq!(c.remove("/a"), Some(2.0));
        assert!(c.is_empty());
    }

    #[test]
    fn factor_zero_resets_and_one_disables() {
        let mut z: AgingCounter<u32> = AgingCounter::new(secs(1), 0.0, 4);
        z.record(&1, 7, secs(0));
        z.record(&2, 1, secs(0));
        assert_eq!(z.count(&1, secs(1)), 0.0);
        z.tick(secs(1));
        assert_eq!(z.record(&2, 1, secs(1)), 1.0);
        assert_eq!(z.keys().copied().collect::<Vec<_>>(), vec![1, 2]);

        let mut one: AgingCounter<u32> = AgingCounter::new(secs(1), 1.0, 4);
        one.record(&1, 7, secs(0));
        assert_eq!(one.count(&1, secs(1_000_000)), 7.0);
    }

    #[test]
    fn long_runs_renormalize_and_match_naive_aging() {
        let mut core: AgingCore<u32> = AgingCore::new(Duration::from_millis(1), 0.5);
        core.advance(Duration::ZERO);
        // Many periods, one at a time, with references in between: the
        // weight crosses 2^64 every 64 periods and must be renormalized.
        let mut naive = [0.0f64; 3];
        let mut t = Duration::ZERO;
        for i in 0..5_000u32 {
            t += Duration::from_millis(1);
            core.advance(t);
            naive.iter_mut().for_each(|c| *c *= 0.5);
            let k = i % 3;
            let n = 1.0 + f64::from(k);
            core.touch(&k, n);
            naive[k as usize] += n;
            assert!(core.weight <= RENORMALIZE_ABOVE);
        }
        for k in 0..3u32 {
            let c = core.count_now(&k).unwrap();
            let want = naive[k as usize];
            assert!((c - want).abs() <= 1e-9 * want, "{k}: {c} vs {want}");
        }
        let mut by_count: Vec<u32> = (0..3).collect();
        by_count.sort_by(|a, b| naive[*a as usize].total_cmp(&naive[*b as usize]));
        let order: Vec<u32> = core.iter_coldest_first().copied().collect();
        assert_eq!(order, by_count);
        // A huge idle gap ages everything to zero; ties then go by recency
        // (key 2 was referenced last at i = 4997, then 0, then 1).
        core.advance(t + Duration::from_secs(3600));
        assert_eq!(core.count_now(&1), Some(0.0));
        let order: Vec<u32> = core.iter_coldest_first().copied().collect();
        assert_eq!(order, vec![2, 0, 1]);
        assert_eq!(core.pop_min(), Some((2, 0.0)));
    }

    #[test]
    fn time_going_backwards_is_ignored() {
        let mut c: AgingCounter<u32> = AgingCounter::new(secs(10), 0.5, 4);
        c.record(&1, 8, secs(100));
        c.record(&1, 0, secs(50));
        assert_eq!(c.count(&1, secs(50)), 8.0);
        assert_eq!(c.count(&1, secs(110)), 4.0);
    }

    #[test]
    fn invalid_parameters() {
        assert!(AgingCounter::<u32>::try_new(secs(0), 0.5, 1).is_err());
        assert!(AgingCounter::<u32>::try_new(secs(1), -0.1, 1).is_err());
        assert_eq!(AgingCounter::<u32>::new(secs(1), 0.5, 0).max_keys(), 1);
    }
}
