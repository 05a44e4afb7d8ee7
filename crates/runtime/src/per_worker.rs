//! State kept once per worker thread: what every request updates (counters, histograms) is
//! updated by its own worker alone and summed only where it is read.
//!
//! An atomic counter that the workers share costs little in instructions, but each add from
//! another core has to fetch the cache line first: a node answering 1 KiB over keep-alive on
//! two cores spent about 0.5 µs of CPU per response on its shared counters and response-time
//! histograms (bench/RESULTS.md, 2026-11-29 afternoon), some 8 % of its work. One slot per
//! worker, each on its own cache line, keeps those lines where they are written.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

use crate::listen::worker_count;
use crate::workers::this_worker;

/// One `T` for each worker thread and one more for every other thread, each on a cache line
/// of its own. Workers with an index beyond the count share the last slot with the other
/// threads, so any thread may use [`local`](Self::local): `T` is shared state (atomics),
/// and the slots only keep cores from writing the same lines.
#[derive(Debug)]
pub struct PerWorker<T> {
    slots: Box<[CachePadded<T>]>,
}

impl<T: Default> PerWorker<T> {
    /// Slots for `workers` worker threads (0: one per core, as
    /// [`worker_count`] counts them) and one for every other thread.
    pub fn new(workers: usize) -> Self {
        PerWorker::with(workers, T::default)
    }
}

impl<T: Default> Default for PerWorker<T> {
    /// Slots for one worker per core.
    fn default() -> Self {
        PerWorker::new(0)
    }
}

impl<T> PerWorker<T> {
    /// [`new`](Self::new), each slot made by `make`.
    pub fn with(workers: usize, mut make: impl FnMut() -> T) -> Self {
        PerWorker {
            slots: (0..=worker_count(workers))
                .map(|_| CachePadded::new(make()))
                .collect(),
        }
    }

    /// This thread's slot.
    pub fn local(&self) -> &T {
        let last = self.slots.len() - 1;
        &self.slots[this_worker().map_or(last, |w| w.min(last))]
    }

    /// Every slot, to be summed by the reader.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|s| &**s)
    }

    /// The counter `field` picks from each slot, added up over the slots.
    pub fn sum(&self, field: impl Fn(&T) -> &AtomicU64) -> u64 {
        self.iter().map(|s| field(s).load(Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::workers::INDEX;

    /// Count one in this thread's slot as worker `index` (or as another thread).
    fn count_as(slots: &Arc<PerWorker<AtomicU64>>, index: Option<usize>) {
        let slots = slots.clone();
        std::thread::spawn(move || {
            INDEX.with(|i| i.set(index));
            slots.local().fetch_add(1, Relaxed);
        })
        .join()
        .unwrap();
    }

    fn counts(slots: &PerWorker<AtomicU64>) -> Vec<u64> {
        slots.iter().map(|c| c.load(Relaxed)).collect()
    }

    #[test]
    fn each_worker_counts_in_its_own_slot() {
        let slots = Arc::new(PerWorker::<AtomicU64>::new(3));
        assert_eq!(counts(&slots), [0, 0, 0, 0]);
        count_as(&slots, Some(1));
        count_as(&slots, Some(1));
        count_as(&slots, Some(0));
        count_as(&slots, Some(2));
        assert_eq!(counts(&slots), [1, 2, 1, 0]);
        // Other threads, and workers beyond the count, share the last slot.
        count_as(&slots, None);
        count_as(&slots, Some(7));
        slots.local().fetch_add(1, Relaxed);
        assert_eq!(counts(&slots), [1, 2, 1, 3]);
        assert_eq!(slots.sum(|c| c), 7);
    }

    #[test]
    fn slots_do_not_share_cache_lines() {
        let slots = PerWorker::<AtomicU64>::new(2);
        let at: Vec<usize> = slots.iter().map(|c| c as *const _ as usize).collect();
        for pair in at.windows(2) {
            assert!(pair[1] - pair[0] >= 64, "{at:x?}");
        }
        assert_eq!(
            PerWorker::<AtomicU64>::default().iter().count(),
            worker_count(0) + 1
        );
    }
}
