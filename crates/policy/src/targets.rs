//! The target → nodes mapping of the LARD family, bounded in size.
//!
//! Keys are the request target (optionally prefixed by the Host); the key string is allocated
//! once, when a target is first seen. When the table is full the second-chance (CLOCK) hand drops
//! an entry that has not been used since the hand last passed it, so a flood of unique URLs cannot
//! grow the table without bound.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::types::Request;

/// Mapping of one target.
#[derive(Debug, Clone, Default)]
pub(crate) struct Entry {
    /// Slots of the nodes the target is mapped to (at most one for `lard`).
    pub members: Vec<u32>,
    /// Last time the member set changed (`lard-r`'s `lastMod`).
    pub last_mod: Duration,
    referenced: bool,
}

/// Aggregate counts kept in step with the entries.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counts {
    /// Entries with at least one member.
    pub mapped: u64,
    /// Members beyond the first, summed over entries.
    pub replicas: u64,
    /// Entries each slot is a member of.
    pub per_node: Vec<u64>,
}

impl Counts {
    /// Adds `slot` to the entry's members (no-op if present).
    pub fn add(&mut self, e: &mut Entry, slot: usize) {
        if e.members.contains(&(slot as u32)) {
            return;
        }
        if e.members.is_empty() {
            self.mapped += 1;
        } else {
            self.replicas += 1;
        }
        e.members.push(slot as u32);
        if self.per_node.len() <= slot {
            self.per_node.resize(slot + 1, 0);
        }
        self.per_node[slot] += 1;
    }

    /// Removes `slot` from the entry's members (no-op if absent).
    pub fn remove(&mut self, e: &mut Entry, slot: usize) {
        if let Some(pos) = e.members.iter().position(|&s| s as usize == slot) {
            e.members.swap_remove(pos);
            self.per_node[slot] -= 1;
            if e.members.is_empty() {
                self.mapped -= 1;
            } else {
                self.replicas -= 1;
            }
        }
    }

    fn forget(&mut self, e: &mut Entry) {
        while let Some(&s) = e.members.last() {
            self.remove(e, s as usize);
        }
    }
}

/// Bounded target table.
#[derive(Debug)]
pub(crate) struct TargetTable {
    map: HashMap<Arc<str>, Entry>,
    clock: VecDeque<Arc<str>>,
    max: usize,
    host_in_key: bool,
    scratch: String,
    pub counts: Counts,
}

fn build_key<'a>(scratch: &'a mut String, host_in_key: bool, req: &Request<'a>) -> &'a str {
    match (host_in_key, req.host) {
        (true, Some(host)) => {
            scratch.clear();
            scratch.extend(host.chars().map(|c| c.to_ascii_lowercase()));
            scratch.push(' ');
            scratch.push_str(req.target);
            scratch
        }
        _ => req.target,
    }
}

impl TargetTable {
    pub fn new(max: usize, host_in_key: bool) -> Self {
        TargetTable {
            map: HashMap::new(),
            clock: VecDeque::new(),
            max: max.max(1),
            host_in_key,
            scratch: String::new(),
            counts: Counts::default(),
        }
    }

    pub fn clear(&mut self) {
        self.map = HashMap::new();
        self.clock = VecDeque::new();
        self.counts = Counts::default();
    }

    /// Number of entries (mapped or not).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The entry of the request's target, created if missing; marks it used.
    pub fn entry(&mut self, req: &Request<'_>, evictions: &mut u64) -> (&mut Entry, &mut Counts) {
        let key = build_key(&mut self.scratch, self.host_in_key, req);
        if !self.map.contains_key(key) {
            if self.map.len() >= self.max {
                Self::evict_one(&mut self.map, &mut self.clock, &mut self.counts);
                *evictions += 1;
            }
            let k: Arc<str> = Arc::from(key);
            self.clock.push_back(k.clone());
            self.map.insert(k, Entry::default());
        }
        let e = self.map.get_mut(key).expect("present");
        e.referenced = true;
        (e, &mut self.counts)
    }

    /// The entry of the request's target, if any (does not mark it used).
    pub fn get(&self, req: &Request<'_>) -> Option<&Entry> {
        let mut scratch = String::new();
        let key = build_key(&mut scratch, self.host_in_key, req);
        self.map.get(key)
    }

    fn evict_one(
        map: &mut HashMap<Arc<str>, Entry>,
        clock: &mut VecDeque<Arc<str>>,
        counts: &mut Counts,
    ) {
        // Every key is in `clock` exactly once, so this ends within two turns of the hand.
        while let Some(k) = clock.pop_front() {
            let e = map.get_mut(&*k).expect("clock and map hold the same keys");
            if e.referenced {
                e.referenced = false;
                clock.push_back(k);
            } else {
                let mut e = map.remove(&*k).expect("present");
                counts.forget(&mut e);
                return;
            }
        }
    }

    /// Removes `slot` from every entry (the node went down). Returns the number of targets left
    /// without any node, which will be placed afresh on their next request.
    pub fn prune_slot(&mut self, slot: usize) -> u64 {
        if self.counts.per_node.get(slot).copied().unwrap_or(0) == 0 {
            return 0;
        }
        let mut orphaned = 0;
        for e in self.map.values_mut() {
            if e.members.contains(&(slot as u32)) {
                self.counts.remove(e, slot);
                if e.members.is_empty() {
                    orphaned += 1;
                }
            }
        }
        orphaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ConnId;

    fn req(t: &str) -> Request<'_> {
        Request::get(ConnId(0), t)
    }

    #[test]
    fn counts_follow_members() {
        let mut t = TargetTable::new(10, false);
        let mut ev = 0;
        let (e, c) = t.entry(&req("/a"), &mut ev);
        c.add(e, 0);
        c.add(e, 2);
        c.add(e, 2);
        assert_eq!(
            (c.mapped, c.replicas, c.per_node.clone()),
            (1, 1, vec![1, 0, 1])
        );
        assert_eq!(t.prune_slot(0), 0);
        assert_eq!(t.prune_slot(2), 1);
        assert_eq!((t.counts.mapped, t.counts.replicas), (0, 0));
    }

    #[test]
    fn full_table_evicts_unreferenced_first() {
        let mut t = TargetTable::new(3, false);
        let mut ev = 0;
        for k in ["/a", "/b", "/c"] {
            let (e, c) = t.entry(&req(k), &mut ev);
            c.add(e, 0);
        }
        // Inserting /d: all referenced, hand clears all, then evicts /a (oldest).
        t.entry(&req("/d"), &mut ev);
        assert_eq!(ev, 1);
        assert_eq!(t.len(), 3);
        assert!(t.get(&req("/a")).is_none());
        // /b is touched again, so /c goes next.
        t.entry(&req("/b"), &mut ev);
        t.entry(&req("/e"), &mut ev);
        assert!(t.get(&req("/b")).is_some());
        assert!(t.get(&req("/c")).is_none());
        assert_eq!(t.counts.mapped, 1);
        assert_eq!(t.counts.per_node[0], 1);
    }

    #[test]
    fn host_can_be_part_of_the_key() {
        let mut t = TargetTable::new(10, true);
        let mut ev = 0;
        let mut r = req("/x");
        r.host = Some("A.example");
        t.entry(&r, &mut ev);
        r.host = Some("a.example");
        assert!(t.get(&r).is_some());
        r.host = Some("b.example");
        assert!(t.get(&r).is_none());
    }
}
