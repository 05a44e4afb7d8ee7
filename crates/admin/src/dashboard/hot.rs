//! The hottest request targets of a period, in bounded memory: the space-saving algorithm
//! (Metwally, Agrawal, El Abbadi, 2005) over a fixed number of counters. Any target requested
//! more than `total / capacity` times in the period is among them, and each count
//! overestimates by at most the recorded error.
//!
//! Written here because the counter must also remember the node each target last went to,
//! which the general-purpose sketches on crates.io do not carry.

use std::collections::HashMap;

/// The index's hasher: fast, and safe from crafted collisions here since the index holds at
/// most `capacity` targets (64 in the switch), so no probe sequence grows with an attacker's
/// input.
type Index = HashMap<Box<str>, usize, foldhash::fast::RandomState>;

/// Targets are cut to this many bytes (at a character boundary) before they are counted.
pub const MAX_TARGET_BYTES: usize = 48;

/// One target's count in a period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotCount {
    /// The request target (cut to [`MAX_TARGET_BYTES`]).
    pub target: String,
    /// The node its last request went to (its index in the sample's node list).
    pub node: u32,
    /// Requests counted (an overestimate by at most `error`).
    pub count: u64,
    /// Requests that may belong to targets it replaced.
    pub error: u64,
}

/// A space-saving counter of targets.
#[derive(Debug)]
pub struct HotTargets {
    capacity: usize,
    entries: Vec<HotCount>,
    index: Index,
    total: u64,
}

fn cut(target: &str) -> &str {
    if target.len() <= MAX_TARGET_BYTES {
        return target;
    }
    let mut end = MAX_TARGET_BYTES;
    while !target.is_char_boundary(end) {
        end -= 1;
    }
    &target[..end]
}

impl HotTargets {
    /// A counter of at most `capacity` targets (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        HotTargets {
            capacity,
            entries: Vec::with_capacity(capacity),
            index: Index::with_capacity_and_hasher(capacity, Default::default()),
            total: 0,
        }
    }

    /// Count one request for `target` sent to `node`.
    pub fn record(&mut self, target: &str, node: u32) {
        let target = cut(target);
        self.total += 1;
        if let Some(&i) = self.index.get(target) {
            let e = &mut self.entries[i];
            e.count += 1;
            e.node = node;
            return;
        }
        if self.entries.len() < self.capacity {
            self.index.insert(target.into(), self.entries.len());
            self.entries.push(HotCount {
                target: target.to_owned(),
                node,
                count: 1,
                error: 0,
            });
            return;
        }
        // Replace the least counted entry; the newcomer inherits its count as error.
        let (i, _) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.count)
            .expect("capacity is at least 1");
        let e = &mut self.entries[i];
        self.index.remove(e.target.as_str());
        e.target.clear();
        e.target.push_str(target);
        e.node = node;
        e.error = e.count;
        e.count += 1;
        self.index.insert(target.into(), i);
    }

    /// Requests counted since the last [`take`](Self::take).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The `n` most counted targets, most first, and start a new period.
    pub fn take(&mut self, n: usize) -> Vec<HotCount> {
        let mut all = self.take_all();
        sort_and_cut(&mut all, n);
        all
    }

    /// Every counted target, unordered, and start a new period.
    fn take_all(&mut self) -> Vec<HotCount> {
        self.index.clear();
        self.total = 0;
        std::mem::take(&mut self.entries)
    }

    /// The `n` most counted targets over several counters of disjoint streams (one per
    /// thread, so that no lock is shared by the threads counting), most first, and start a
    /// new period in each. Merged as mergeable summaries are (Agarwal et al., 2012): a full
    /// counter that does not hold a target adds its smallest count to the target's count and
    /// error alike (the target may have been replaced there, at most that many times), so a
    /// merged count still overestimates by at most its error.
    pub fn take_merged<'a>(
        counters: impl IntoIterator<Item = &'a mut HotTargets>,
        n: usize,
    ) -> Vec<HotCount> {
        /// A target's sums over the counters that hold it.
        struct Held {
            entry: HotCount,
            /// Its largest count in one counter (whose node is kept).
            best: u64,
            /// The floors of the counters that hold it.
            floors: u64,
        }
        let mut floors = 0;
        let mut merged: HashMap<String, Held> = HashMap::new();
        for c in counters {
            let full = c.entries.len() >= c.capacity;
            let entries = c.take_all();
            let floor = if full {
                entries.iter().map(|e| e.count).min().unwrap_or(0)
            } else {
                0
            };
            floors += floor;
            for e in entries {
                match merged.get_mut(&e.target) {
                    Some(h) => {
                        h.entry.count += e.count;
                        h.entry.error += e.error;
                        h.floors += floor;
                        if e.count > h.best {
                            (h.entry.node, h.best) = (e.node, e.count);
                        }
                    }
                    None => {
                        let held = Held {
                            best: e.count,
                            floors: floor,
                            entry: e,
                        };
                        merged.insert(held.entry.target.clone(), held);
                    }
                }
            }
        }
        // Each counter that does not hold a target adds its floor.
        let mut all: Vec<HotCount> = merged
            .into_values()
            .map(|h| {
                let absent = floors - h.floors;
                HotCount {
                    count: h.entry.count + absent,
                    error: h.entry.error + absent,
                    ..h.entry
                }
            })
            .collect();
        sort_and_cut(&mut all, n);
        all
    }
}

/// Most counted first (then by name), at most `n`.
fn sort_and_cut(all: &mut Vec<HotCount>, n: usize) {
    all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.target.cmp(&b.target)));
    all.truncate(n);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn counts_and_orders_the_hottest() {
        let mut h = HotTargets::new(4);
        for _ in 0..10 {
            h.record("/a", 0);
        }
        for _ in 0..5 {
            h.record("/b", 1);
        }
        h.record("/c", 2);
        h.record("/a", 3);
        let top = h.take(2);
        assert_eq!(top.len(), 2);
        assert_eq!(
            (top[0].target.as_str(), top[0].node, top[0].count),
            ("/a", 3, 11)
        );
        assert_eq!((top[1].target.as_str(), top[1].count), ("/b", 5));
        assert_eq!(h.total(), 0);
        assert!(h.take(5).is_empty());
    }

    #[test]
    fn long_targets_are_cut_at_a_character_boundary() {
        let mut h = HotTargets::new(2);
        let long = format!("/{}", "é".repeat(40));
        h.record(&long, 0);
        h.record(&long, 0);
        let top = h.take(1);
        assert!(top[0].target.len() <= MAX_TARGET_BYTES);
        assert!(long.starts_with(&top[0].target));
        assert_eq!(top[0].count, 2);
    }

    /// Per-thread counters merge into the counts one counter would have kept; the node is
    /// the one of the counter that saw the target most; each counter starts a new period.
    #[test]
    fn counters_merge_into_one_list() {
        let (mut a, mut b) = (HotTargets::new(4), HotTargets::new(4));
        for _ in 0..3 {
            a.record("/x", 0);
        }
        for _ in 0..5 {
            b.record("/x", 1);
        }
        a.record("/y", 0);
        let top = HotTargets::take_merged([&mut a, &mut b], 5);
        assert_eq!(
            top.iter()
                .map(|e| (e.target.as_str(), e.node, e.count, e.error))
                .collect::<Vec<_>>(),
            [("/x", 1, 8, 0), ("/y", 0, 1, 0)]
        );
        assert_eq!((a.total(), b.total()), (0, 0));
        assert!(HotTargets::take_merged([&mut a, &mut b], 5).is_empty());
    }

    proptest! {
        /// Merged counts keep space-saving's bounds: each is at least the target's true
        /// count over all the streams, and at most its error above it; one counter merged
        /// alone is what `take` gives.
        #[test]
        fn merged_counts_keep_their_bounds(
            stream in proptest::collection::vec((0u8..30, 0usize..3), 1..600),
            capacity in 1usize..10,
        ) {
            let mut counters: Vec<HotTargets> = (0..3).map(|_| HotTargets::new(capacity)).collect();
            let mut alone = HotTargets::new(capacity);
            let mut truth: HashMap<String, u64> = HashMap::new();
            for (t, thread) in &stream {
                let name = format!("/t{t}");
                counters[*thread].record(&name, u32::from(*t));
                if *thread == 0 {
                    alone.record(&name, u32::from(*t));
                }
                *truth.entry(name).or_default() += 1;
            }
            let merged = HotTargets::take_merged(counters.iter_mut(), usize::MAX);
            for e in &merged {
                let real = truth[&e.target];
                prop_assert!(e.count >= real, "{} counted {} < {}", e.target, e.count, real);
                prop_assert!(e.count - e.error <= real, "{} error too small", e.target);
            }
            let mut again = HotTargets::new(capacity);
            for (t, thread) in &stream {
                if *thread == 0 {
                    again.record(&format!("/t{t}"), u32::from(*t));
                }
            }
            prop_assert_eq!(HotTargets::take_merged([&mut again], 4), alone.take(4));
        }

        /// Space-saving's guarantees: every target counted more than total / capacity times
        /// is kept, and each kept count is within its error of the true count.
        #[test]
        fn frequent_targets_are_never_lost(
            stream in proptest::collection::vec(0u8..40, 1..600),
            capacity in 1usize..12,
        ) {
            let mut h = HotTargets::new(capacity);
            let mut truth: HashMap<String, u64> = HashMap::new();
            for t in &stream {
                let name = format!("/t{t}");
                h.record(&name, u32::from(*t));
                *truth.entry(name).or_default() += 1;
            }
            let total = stream.len() as u64;
            prop_assert_eq!(h.total(), total);
            let kept = h.take(capacity);
            for e in &kept {
                let real = truth[&e.target];
                prop_assert!(e.count >= real && e.count - e.error <= real);
            }
            for (name, n) in &truth {
                if *n > total / capacity as u64 {
                    prop_assert!(kept.iter().any(|e| &e.target == name), "{} ({}) lost", name, n);
                }
            }
        }
    }
}
