//! Least-recently-used replacement.

use std::hash::Hash;
use std::time::Duration;

use crate::{Map, ReplacementPolicy};

const NIL: usize = usize::MAX;

struct Node<K> {
    /// `None` while the slot is on the free list.
    key: Option<K>,
    prev: usize,
    next: usize,
}

/// Least recently used: evicts the key whose last reference (insert or hit)
/// is oldest. Every operation is O(1).
///
/// The recency order is a doubly linked list stored in a `Vec` slab (indices
/// instead of pointers, freed slots reused through a free list) plus a
/// `HashMap` from key to slot. It is written by hand because the available
/// LRU crates are complete caches that own the values and manage their own
/// capacity, whereas a policy here only orders keys; the slab keeps the list
/// free of `unsafe` and allocation-free in steady state.
pub struct Lru<K> {
    index: Map<K, usize>,
    nodes: Vec<Node<K>>,
    /// Least recently used end.
    head: usize,
    /// Most recently used end.
    tail: usize,
    /// First free slot, chained through `next`.
    free: usize,
}

impl<K: Hash + Eq + Clone> Lru<K> {
    /// An empty LRU order.
    pub fn new() -> Self {
        Lru {
            index: Map::default(),
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            free: NIL,
        }
    }

    /// Number of tracked keys.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Tracked keys from least to most recently used (the first one is the
    /// next victim).
    pub fn iter(&self) -> impl Iterator<Item = &K> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let node = &self.nodes[at];
            at = node.next;
            node.key.as_ref()
        })
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next].prev = prev;
        }
    }

    fn push_back(&mut self, i: usize) {
        self.nodes[i].prev = self.tail;
        self.nodes[i].next = NIL;
        if self.tail == NIL {
            self.head = i;
        } else {
            self.nodes[self.tail].next = i;
        }
        self.tail = i;
    }

    fn alloc(&mut self, key: K) -> usize {
        if self.free == NIL {
            self.nodes.push(Node {
                key: Some(key),
                prev: NIL,
                next: NIL,
            });
            self.nodes.len() - 1
        } else {
            let i = self.free;
            self.free = self.nodes[i].next;
            self.nodes[i].key = Some(key);
            i
        }
    }

    fn release(&mut self, i: usize) -> Option<K> {
        let key = self.nodes[i].key.take();
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.free;
        self.free = i;
        key
    }

    fn touch(&mut self, key: &K) {
        if let Some(&i) = self.index.get(key) {
            if i != self.tail {
                self.unlink(i);
                self.push_back(i);
            }
        }
    }
}

impl<K: Hash + Eq + Clone> Default for Lru<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone + Send> ReplacementPolicy<K> for Lru<K> {
    fn on_insert(&mut self, key: &K, _size: u64, _now: Duration) {
        if self.index.contains_key(key) {
            self.touch(key);
            return;
        }
        let i = self.alloc(key.clone());
        self.push_back(i);
        self.index.insert(key.clone(), i);
    }

    fn on_update(&mut self, key: &K, _old_size: u64, new_size: u64, now: Duration) {
        self.on_insert(key, new_size, now);
    }

    fn on_hit(&mut self, key: &K, _size: u64, _now: Duration) {
        self.touch(key);
    }

    fn on_remove(&mut self, key: &K) {
        if let Some(i) = self.index.remove(key) {
            self.unlink(i);
            self.release(i);
        }
    }

    fn victim(&mut self) -> Option<K> {
        let i = self.head;
        if i == NIL {
            return None;
        }
        self.unlink(i);
        let key = self.release(i)?;
        self.index.remove(&key);
        Some(key)
    }

    fn name(&self) -> &'static str {
        "lru"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::ZERO;

    fn order(l: &Lru<u32>) -> Vec<u32> {
        l.iter().copied().collect()
    }

    #[test]
    fn evicts_least_recent_first() {
        let mut l = Lru::new();
        for k in 1..=4 {
            l.on_insert(&k, 1, T);
        }
        l.on_hit(&2, 1, T);
        l.on_hit(&1, 1, T);
        assert_eq!(order(&l), vec![3, 4, 2, 1]);
        assert_eq!(l.victim(), Some(3));
        assert_eq!(l.victim(), Some(4));
        l.on_remove(&2);
        assert_eq!(l.victim(), Some(1));
        assert_eq!(l.victim(), None);
        assert!(l.is_empty());
    }

    #[test]
    fn reuses_slots_and_ignores_unknown_keys() {
        let mut l = Lru::new();
        for round in 0..10u32 {
            for k in 0..8 {
                l.on_insert(&(round * 100 + k), 1, T);
            }
            while l.victim().is_some() {}
        }
        assert!(l.nodes.len() <= 8, "slab grew to {}", l.nodes.len());
        l.on_hit(&999, 1, T);
        l.on_remove(&999);
        assert_eq!(l.len(), 0);
        l.on_insert(&5, 1, T);
        l.on_insert(&6, 1, T);
        l.on_update(&5, 1, 2, T);
        assert_eq!(order(&l), vec![6, 5]);
        l.add_references(&6, 1, 3, T);
        assert_eq!(order(&l), vec![5, 6]);
    }
}
