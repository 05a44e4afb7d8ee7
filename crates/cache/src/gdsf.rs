//! GreedyDual-Size-Frequency replacement.

use std::collections::BTreeMap;
use std::hash::Hash;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ordered::OrdF64;
use crate::{Map, ReplacementPolicy};

/// The cost of fetching an object on a miss, used by [`Gdsf`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GdsfCost {
    /// Every miss costs 1: maximizes the object hit rate.
    #[default]
    Uniform,
    /// Cost in TCP segments, `2 + size / 536`: approximates network cost and
    /// favours the byte hit rate more than `Uniform`.
    Packets,
}

impl GdsfCost {
    /// The cost of an object of `size` bytes.
    pub fn cost(self, size: u64) -> f64 {
        match self {
            GdsfCost::Uniform => 1.0,
            GdsfCost::Packets => 2.0 + size as f64 / 536.0,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    priority: f64,
    seq: u64,
    freq: u64,
}

/// GreedyDual-Size-Frequency (Cherkasova, "Improving WWW Proxies Performance
/// with Greedy-Dual-Size-Frequency Caching Policy", HP Labs 1998).
///
/// Each object has priority `H = L + freq × cost / size`, where `freq`
/// counts its references since it entered the cache and `L` is an inflation
/// value that starts at 0 and is raised to the `H` of every evicted object.
/// The victim is the object with the lowest `H` (ties: least recently
/// referenced). Small, frequently used objects therefore stay, large cold
/// ones go, and the rising `L` ages out objects that were popular long ago.
/// Sizes of 0 are treated as 1.
///
/// Operations are O(log n) (a `BTreeMap` ordered by `(H, sequence)`, for the
/// same reasons as the LFU order).
#[derive(Debug)]
pub struct Gdsf<K> {
    cost: GdsfCost,
    inflation: f64,
    entries: Map<K, Slot>,
    order: BTreeMap<(OrdF64, u64), K>,
    next_seq: u64,
}

impl<K: Hash + Eq + Clone> Gdsf<K> {
    /// GDSF with uniform cost.
    pub fn new() -> Self {
        Self::with_cost(GdsfCost::Uniform)
    }

    /// GDSF with the given cost model.
    pub fn with_cost(cost: GdsfCost) -> Self {
        Gdsf {
            cost,
            inflation: 0.0,
            entries: Map::default(),
            order: BTreeMap::new(),
            next_seq: 0,
        }
    }

    /// The cost model.
    pub fn cost_model(&self) -> GdsfCost {
        self.cost
    }

    /// The current inflation value `L`.
    pub fn inflation(&self) -> f64 {
        self.inflation
    }

    /// The priority `H` of `key`, if tracked.
    pub fn priority(&self, key: &K) -> Option<f64> {
        self.entries.get(key).map(|s| s.priority)
    }

    /// Number of tracked keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tracked keys in eviction order (next victim first).
    pub fn iter(&self) -> impl Iterator<Item = &K> + '_ {
        self.order.values()
    }

    /// Adds `refs` references (inserting with `refs` if absent and
    /// `insert`), sets the size, and recomputes `H` from the current `L`.
    fn reference(&mut self, key: &K, size: u64, refs: u64, insert: bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let (inflation, cost) = (self.inflation, self.cost);
        let priority = |freq: u64| inflation + freq as f64 * cost.cost(size) / size.max(1) as f64;
        match self.entries.get_mut(key) {
            Some(slot) => {
                let owned = self
                    .order
                    .remove(&(OrdF64(slot.priority), slot.seq))
                    .expect("GDSF order out of sync with entries");
                slot.freq = slot.freq.saturating_add(refs);
                slot.priority = priority(slot.freq);
                slot.seq = seq;
                self.order.insert((OrdF64(slot.priority), seq), owned);
            }
            None if insert => {
                let slot = Slot {
                    priority: priority(refs),
                    seq,
                    freq: refs,
                };
                self.entries.insert(key.clone(), slot);
                self.order.insert((OrdF64(slot.priority), seq), key.clone());
            }
            None => {}
        }
    }
}

impl<K: Hash + Eq + Clone> Default for Gdsf<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone + Send> ReplacementPolicy<K> for Gdsf<K> {
    fn on_insert(&mut self, key: &K, size: u64, _now: Duration) {
        self.reference(key, size, 1, true);
    }

    fn on_update(&mut self, key: &K, _old_size: u64, new_size: u64, _now: Duration) {
        self.reference(key, new_size, 1, true);
    }

    fn on_hit(&mut self, key: &K, size: u64, _now: Duration) {
        self.reference(key, size, 1, false);
    }

    fn add_references(&mut self, key: &K, size: u64, n: u64, _now: Duration) {
        if n > 0 {
            self.reference(key, size, n, false);
        }
    }

    fn on_remove(&mut self, key: &K) {
        if let Some(slot) = self.entries.remove(key) {
            self.order.remove(&(OrdF64(slot.priority), slot.seq));
        }
    }

    fn victim(&mut self) -> Option<K> {
        let ((priority, _), key) = self.order.pop_first()?;
        self.entries.remove(&key);
        // L never decreases: every tracked H was computed as L + (positive).
        self.inflation = self.inflation.max(priority.0);
        Some(key)
    }

    fn name(&self) -> &'static str {
        "gdsf"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::ZERO;

    #[test]
    fn prefers_evicting_large_objects() {
        let mut g = Gdsf::new();
        g.on_insert(&"big", 100, T);
        g.on_insert(&"small", 1, T);
        g.on_insert(&"mid", 10, T);
        assert_eq!(
            g.iter().copied().collect::<Vec<_>>(),
            vec!["big", "mid", "small"]
        );
        assert_eq!(g.victim(), Some("big"));
        assert_eq!(g.inflation(), 0.01);
        // A new object starts at L + 1/size.
        g.on_insert(&"new", 100, T);
        assert_eq!(g.priority(&"new"), Some(0.02));
    }

    #[test]
    fn frequency_protects_large_objects() {
        let mut g = Gdsf::new();
        g.on_insert(&"big", 100, T);
        g.add_references(&"big", 100, 19, T); // freq 20 → H = 0.2
        g.on_insert(&"mid", 10, T); // H = 0.1
        assert_eq!(g.victim(), Some("mid"));
        assert_eq!(g.inflation(), 0.1);
        g.on_hit(&"big", 100, T); // H = 0.1 + 21/100
        assert!((g.priority(&"big").unwrap() - 0.31).abs() < 1e-12);
    }

    #[test]
    fn inflation_ages_out_old_favourites() {
        let mut g = Gdsf::new();
        g.on_insert(&0u32, 1, T);
        g.add_references(&0, 1, 9, T); // H = 10
                                       // A stream of one-hit objects: each eviction raises L, and once L
                                       // passes 10 the old favourite is the cheapest to drop.
        let mut evicted_old_at = None;
        for k in 1..100u32 {
            g.on_insert(&k, 1, T);
            g.on_hit(&k, 1, T);
            g.on_hit(&k, 1, T);
            if g.victim() == Some(0) {
                evicted_old_at = Some(k);
                break;
            }
        }
        assert!(evicted_old_at.is_some());
    }

    #[test]
    fn packet_cost() {
        assert_eq!(GdsfCost::Uniform.cost(1 << 20), 1.0);
        assert_eq!(GdsfCost::Packets.cost(536 * 4), 6.0);
        let mut g = Gdsf::with_cost(GdsfCost::Packets);
        g.on_insert(&1u8, 536, T);
        assert_eq!(g.priority(&1), Some(3.0 / 536.0));
        assert_eq!(g.cost_model(), GdsfCost::Packets);
        // Sizes of zero do not divide by zero.
        g.on_insert(&2u8, 0, T);
        assert_eq!(g.priority(&2), Some(2.0));
    }
}
