//! The hottest request targets of a period, in bounded memory: the space-saving algorithm
//! (Metwally, Agrawal, El Abbadi, 2005) over a fixed number of counters. Any target requested
//! more than `total / capacity` times in the period is among them, and each count
//! overestimates by at most the recorded error.
//!
//! Written here because the counter must also remember the node each target last went to,
//! which the general-purpose sketches on crates.io do not carry.

use std::collections::HashMap;

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
    index: HashMap<Box<str>, usize>,
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
            index: HashMap::with_capacity(capacity),
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
        let mut all = std::mem::take(&mut self.entries);
        self.index.clear();
        self.total = 0;
        all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.target.cmp(&b.target)));
        all.truncate(n);
        all
    }
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

    proptest! {
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
