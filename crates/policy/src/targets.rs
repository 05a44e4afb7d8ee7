//! The target → nodes mapping of the LARD family, bounded in size.
//!
//! Keys are the request target (optionally prefixed by the Host); the key string is allocated
//! once, when a target is first seen. When the table is full the second-chance (CLOCK) hand drops
//! an entry that has not been used since the hand last passed it, so a flood of unique URLs cannot
//! grow the table without bound.
//!
//! Entries also keep what the nodes said about their caches (`Outcome::from_cache`): a member
//! that served the target from its cache and later served it without has lost it (evicted), and
//! the cost metrics count it as a node the target is not mapped to until it serves a hit again.
//! [`Awaiting`] matches those outcomes to their targets: a policy hears of a finished request by
//! connection only, and a connection's requests finish in the order they were selected.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::types::{ConnId, Outcome, Request};

/// Mapping of one target.
#[derive(Debug, Clone, Default)]
pub(crate) struct Entry {
    /// Slots of the nodes the target is mapped to (at most one for `lard`).
    pub members: Vec<u32>,
    /// Last time the member set changed (`lard-r`'s `lastMod`).
    pub last_mod: Duration,
    referenced: bool,
    /// What the members said about their caches; only allocated once one said anything (the
    /// table holds up to a million entries, most of them never reported on without
    /// `cache_feedback`).
    marks: Option<Box<Marks>>,
}

/// What the members of one entry said about their caches.
#[derive(Debug, Clone, Default)]
struct Marks {
    /// Members that served the target from their cache since they became members.
    hit_by: Vec<u32>,
    /// Members that served it from their cache, then without: they lost it.
    lost_by: Vec<u32>,
}

impl Entry {
    /// Whether member `slot` is known to have lost the target from its cache.
    pub fn lost(&self, slot: usize) -> bool {
        self.marks
            .as_ref()
            .is_some_and(|m| m.lost_by.contains(&(slot as u32)))
    }

    /// Members that still hold the target as far as is known.
    pub fn holders(&self) -> impl Iterator<Item = usize> + '_ {
        self.members
            .iter()
            .map(|&m| m as usize)
            .filter(|&m| !self.lost(m))
    }
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
            if let Some(m) = &mut e.marks {
                m.hit_by.retain(|&s| s as usize != slot);
                m.lost_by.retain(|&s| s as usize != slot);
            }
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

    /// The entry of the request's target, created if missing, and its key; marks it used.
    pub fn entry(
        &mut self,
        req: &Request<'_>,
        evictions: &mut u64,
    ) -> (Arc<str>, &mut Entry, &mut Counts) {
        let key = build_key(&mut self.scratch, self.host_in_key, req);
        let k = match self.map.get_key_value(key) {
            Some((k, _)) => k.clone(),
            None => {
                if self.map.len() >= self.max {
                    Self::evict_one(&mut self.map, &mut self.clock, &mut self.counts);
                    *evictions += 1;
                }
                let k: Arc<str> = Arc::from(key);
                self.clock.push_back(k.clone());
                self.map.insert(k.clone(), Entry::default());
                k
            }
        };
        let e = self.map.get_mut(&*k).expect("present");
        e.referenced = true;
        (k, e, &mut self.counts)
    }

    /// What node `slot` said about its cache when it served target `key`: a hit marks it a
    /// holder, a miss after a hit marks it as having lost the target. Only successful
    /// responses (2xx, 304) of members count; a target evicted from the table meanwhile is
    /// ignored. Returns whether a loss was learnt.
    pub fn observe(&mut self, key: &str, slot: usize, outcome: &Outcome) -> bool {
        if !((200..300).contains(&outcome.status) || outcome.status == 304) {
            return false;
        }
        let Some(e) = self.map.get_mut(key) else {
            return false;
        };
        let s = slot as u32;
        if !e.members.contains(&s) {
            return false;
        }
        if outcome.from_cache {
            let marks = e.marks.get_or_insert_with(Box::default);
            if !marks.hit_by.contains(&s) {
                marks.hit_by.push(s);
            }
            marks.lost_by.retain(|&m| m != s);
            false
        } else if let Some(marks) = &mut e.marks {
            match marks.hit_by.iter().position(|&m| m == s) {
                Some(i) => {
                    marks.hit_by.swap_remove(i);
                    marks.lost_by.push(s);
                    true
                }
                None => false,
            }
        } else {
            false
        }
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

/// The targets of requests selected and not yet finished, per connection, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Awaiting {
    conns: HashMap<ConnId, VecDeque<Arc<str>>>,
}

impl Awaiting {
    /// Most targets remembered per connection; older ones are forgotten (a caller that never
    /// reports some requests finished cannot grow the map).
    const MAX_PER_CONN: usize = 64;

    /// A request for `key` was selected on `conn`.
    pub fn push(&mut self, conn: ConnId, key: Arc<str>) {
        let q = self.conns.entry(conn).or_default();
        if q.len() >= Self::MAX_PER_CONN {
            q.pop_front();
        }
        q.push_back(key);
    }

    /// The target of the oldest unfinished request of `conn`, now finished.
    pub fn pop(&mut self, conn: ConnId) -> Option<Arc<str>> {
        let q = self.conns.get_mut(&conn)?;
        let k = q.pop_front();
        if q.is_empty() {
            self.conns.remove(&conn);
        }
        k
    }

    /// The connection ended.
    pub fn end(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
    }

    pub fn clear(&mut self) {
        self.conns = HashMap::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(t: &str) -> Request<'_> {
        Request::get(ConnId(0), t)
    }

    #[test]
    fn counts_follow_members() {
        let mut t = TargetTable::new(10, false);
        let mut ev = 0;
        let (_, e, c) = t.entry(&req("/a"), &mut ev);
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
            let (_, e, c) = t.entry(&req(k), &mut ev);
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

    /// A hit makes a member a holder, a miss after it a loser, a hit again a holder; misses
    /// without an earlier hit (the first fetch), failures and other nodes change nothing.
    #[test]
    fn cache_outcomes_mark_holders_and_losses() {
        let mut t = TargetTable::new(10, false);
        let mut ev = 0;
        let (k, e, c) = t.entry(&req("/a"), &mut ev);
        c.add(e, 1);
        let hit = Outcome::ok(200, 1, true);
        let miss = Outcome::ok(200, 1, false);
        let lost = |t: &TargetTable| t.get(&req("/a")).unwrap().lost(1);
        assert!(!t.observe(&k, 1, &miss));
        assert!(!lost(&t));
        assert!(!t.observe(&k, 1, &hit));
        assert!(!t.observe(&k, 0, &miss));
        assert!(!t.observe(&k, 1, &Outcome::failed()));
        assert!(!t.observe(&k, 1, &Outcome::ok(404, 1, false)));
        assert!(!lost(&t));
        assert!(t.observe(&k, 1, &miss));
        assert!(lost(&t));
        assert_eq!(t.get(&req("/a")).unwrap().holders().count(), 0);
        assert!(!t.observe(&k, 1, &miss));
        assert!(!t.observe(&k, 1, &Outcome::ok(304, 0, true)));
        assert!(!lost(&t));
        // Leaving the set forgets what the member said.
        assert!(t.observe(&k, 1, &miss));
        let e = t.map.get_mut(&*k).unwrap();
        t.counts.remove(e, 1);
        t.counts.add(e, 1);
        assert!(!e.lost(1));
        assert!(!t.observe("/gone", 1, &hit));
    }

    /// Outcomes are matched to targets in selection order per connection; the map keeps no
    /// empty queues and a bounded number of targets per connection.
    #[test]
    fn awaiting_targets_come_back_in_order() {
        let mut a = Awaiting::default();
        let (c1, c2) = (ConnId(1), ConnId(2));
        a.push(c1, "/x".into());
        a.push(c2, "/y".into());
        a.push(c1, "/z".into());
        assert_eq!(a.pop(c1).as_deref(), Some("/x"));
        assert_eq!(a.pop(c1).as_deref(), Some("/z"));
        assert_eq!(a.pop(c1), None);
        assert!(!a.conns.contains_key(&c1));
        for i in 0..100 {
            a.push(c1, format!("/{i}").into());
        }
        assert_eq!(a.conns[&c1].len(), Awaiting::MAX_PER_CONN);
        assert_eq!(a.pop(c1).as_deref(), Some("/36"));
        a.end(c1);
        assert_eq!(a.pop(c1), None);
        assert_eq!(a.pop(c2).as_deref(), Some("/y"));
    }

    /// An entry nobody reported on carries no marks.
    #[test]
    fn entries_stay_small() {
        assert!(
            std::mem::size_of::<Entry>() <= 56,
            "{}",
            std::mem::size_of::<Entry>()
        );
    }
}
