//! The discrete-event core: a clock and a priority queue of future events.
//!
//! Events are ordered by time and, among events at the same time, by the order in which they
//! were scheduled (a sequence number), so a run is a pure function of its inputs. The clock only
//! moves forward: scheduling an event in the past is a bug and panics.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::config::Nanos;

/// A queue of events of type `E` with a simulated clock.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<(Nanos, u64, Slot<E>)>>,
    seq: u64,
    now: Nanos,
}

/// Wrapper that keeps the payload out of the ordering (the key is time and sequence).
#[derive(Debug)]
struct Slot<E>(E);

impl<E> PartialEq for Slot<E> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<E> Eq for Slot<E> {}
impl<E> PartialOrd for Slot<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Slot<E> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    /// An empty queue at time 0.
    pub fn new() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
        }
    }

    /// The current simulated time: that of the last event taken.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Schedules `event` at absolute time `at`.
    ///
    /// # Panics
    /// If `at` is before [`EventQueue::now`].
    pub fn schedule(&mut self, at: Nanos, event: E) {
        assert!(
            at >= self.now,
            "event scheduled in the past ({at} < {})",
            self.now
        );
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, Slot(event))));
    }

    /// Schedules `event` `delay` after now.
    pub fn schedule_in(&mut self, delay: Nanos, event: E) {
        self.schedule(self.now.saturating_add(delay), event);
    }

    /// Takes the earliest event (the first scheduled among equal times) and advances the clock
    /// to its time.
    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        let Reverse((t, _, Slot(e))) = self.heap.pop()?;
        debug_assert!(t >= self.now);
        self.now = t;
        Some((t, e))
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_time_then_schedule_order() {
        let mut q = EventQueue::new();
        q.schedule(5, "c");
        q.schedule(1, "a");
        q.schedule(5, "d");
        q.schedule(1, "b");
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(got, [(1, "a"), (1, "b"), (5, "c"), (5, "d")]);
        assert_eq!(q.now(), 5);
        assert!(q.is_empty());
    }

    #[test]
    fn relative_scheduling_uses_the_clock() {
        let mut q = EventQueue::new();
        q.schedule(10, 1);
        q.pop();
        q.schedule_in(3, 2);
        assert_eq!(q.pop(), Some((13, 2)));
    }

    #[test]
    #[should_panic(expected = "in the past")]
    fn the_past_is_refused() {
        let mut q = EventQueue::new();
        q.schedule(10, ());
        q.pop();
        q.schedule(9, ());
    }
}
