//! The proxy's object store: one byte-bounded [`Cache`] per origin (its budget,
//! `[rescue.proxy] origin_bytes`) under one budget over all origins (`cache_bytes`). When the
//! total would pass its budget, the origin holding the most bytes gives up objects (its own
//! replacement policy picks them), so a crowd on one origin cannot push the others out and the
//! origins share what is left fairly. Objects whose body is above `max_object_bytes` are never
//! stored; an object is charged its body, its kept header values and a fixed overhead.
//!
//! No I/O and no clock: `now` is passed in. The proxy holds it behind a mutex.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use switchyard_cache::{Cache, PolicyKind};
use switchyard_rescue::{OriginId, ProxyConfig};

use super::fetch::Object;

/// A stored object and when the origin last confirmed it.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) object: Arc<Object>,
    /// When it was fetched or last revalidated.
    pub(crate) checked: Duration,
}

/// See the module docs.
pub(crate) struct ProxyStore {
    origins: HashMap<OriginId, Cache<String, Entry>>,
    total: u64,
    per_origin: u64,
    max_object: u64,
    used: u64,
}

impl ProxyStore {
    pub(crate) fn new(cfg: &ProxyConfig) -> Self {
        ProxyStore {
            origins: HashMap::new(),
            total: cfg.cache_bytes,
            per_origin: cfg.origin_bytes.min(cfg.cache_bytes),
            max_object: cfg.max_object_bytes,
            used: 0,
        }
    }

    /// Largest object stored.
    pub(crate) fn max_object(&self) -> u64 {
        self.max_object
    }

    /// The entry for `key` of `origin` (counted as a reference).
    pub(crate) fn get(&mut self, origin: OriginId, key: &str, now: Duration) -> Option<Entry> {
        self.origins.get_mut(&origin)?.get(key, now).cloned()
    }

    /// Store `object` for `key` of `origin`, checked at `now`. Returns whether it was stored
    /// (its body may be larger than the per-object cap, or the object with its headers larger
    /// than the origin's budget). What is evicted
    /// is dropped after the call, outside the caller's lock.
    pub(crate) fn insert(
        &mut self,
        origin: OriginId,
        key: String,
        object: Arc<Object>,
        now: Duration,
    ) -> (bool, Vec<Entry>) {
        let size = object.size();
        let mut dropped = Vec::new();
        if object.body.len() as u64 > self.max_object || size > self.per_origin {
            return (false, dropped);
        }
        let per_origin = self.per_origin;
        let cache = self.origins.entry(origin).or_insert_with(|| {
            Cache::with_kind(per_origin, PolicyKind::Lru).with_max_object_bytes(per_origin)
        });
        let before = cache.used_bytes();
        let entry = Entry {
            object,
            checked: now,
        };
        let out = cache.insert(key, entry, size, now);
        let inserted = out.is_inserted();
        dropped.extend(out.into_evicted().into_iter().map(|(_, e)| e));
        self.used = self.used - before + cache.used_bytes();
        // Over the total: the origin with the most bytes gives up objects until it fits.
        while self.used > self.total {
            let Some((&id, _)) = self.origins.iter().max_by_key(|(_, c)| c.used_bytes()) else {
                break;
            };
            let c = self.origins.get_mut(&id).expect("just found");
            let excess = self.used - self.total;
            let had = c.used_bytes();
            let target = had.saturating_sub(excess);
            dropped.extend(c.set_capacity(target, now).into_iter().map(|(_, e)| e));
            c.set_capacity(per_origin, now);
            self.used = self.used - had + c.used_bytes();
            if c.used_bytes() == had {
                break;
            }
        }
        (inserted, dropped)
    }

    /// Forget every object of `origin` (its relationship ended).
    pub(crate) fn drop_origin(&mut self, origin: OriginId) -> Vec<Entry> {
        match self.origins.remove(&origin) {
            Some(mut c) => {
                self.used -= c.used_bytes();
                c.clear().into_iter().map(|(_, e)| e).collect()
            }
            None => Vec::new(),
        }
    }

    /// Bytes stored for `origin`.
    pub(crate) fn used(&self, origin: OriginId) -> u64 {
        self.origins.get(&origin).map_or(0, |c| c.used_bytes())
    }

    /// Bytes stored over all origins.
    pub(crate) fn total_used(&self) -> u64 {
        self.used
    }

    /// Objects stored over all origins.
    pub(crate) fn objects(&self) -> usize {
        self.origins.values().map(|c| c.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    fn object(len: usize) -> Arc<Object> {
        Arc::new(Object {
            status: 200,
            content_type: None,
            etag: None,
            last_modified: None,
            cache_control: None,
            location: None,
            body: Bytes::from(vec![b'x'; len]),
        })
    }

    fn cfg(total: u64, per_origin: u64, max_object: u64) -> ProxyConfig {
        ProxyConfig {
            cache_bytes: total,
            origin_bytes: per_origin,
            max_object_bytes: max_object,
            ..ProxyConfig::default()
        }
    }

    const T: Duration = Duration::ZERO;

    #[test]
    fn caps_objects_and_origins() {
        let mut s = ProxyStore::new(&cfg(10_000, 5_000, 2_000));
        assert!(!s.insert(OriginId(1), "/big".into(), object(2_001), T).0);
        assert_eq!(s.used(OriginId(1)), 0);
        assert!(s.insert(OriginId(1), "/cap".into(), object(2_000), T).0);
        s.drop_origin(OriginId(1));
        for i in 0..10 {
            assert!(s.insert(OriginId(1), format!("/{i}"), object(900), T).0);
            assert!(s.used(OriginId(1)) <= 5_000);
        }
        assert!(s.get(OriginId(1), "/9", T).is_some(), "the newest stays");
        assert!(s.get(OriginId(1), "/0", T).is_none(), "the oldest went");
        for i in 0..10 {
            s.insert(OriginId(2), format!("/{i}"), object(900), T);
        }
        assert!(s.used(OriginId(2)) <= 5_000);
        assert!(s.total_used() <= 10_000);
        let dropped = s.drop_origin(OriginId(1));
        assert!(!dropped.is_empty());
        assert_eq!(s.used(OriginId(1)), 0);
        assert_eq!(s.total_used(), s.used(OriginId(2)));
    }

    #[test]
    fn the_largest_origin_gives_way() {
        // Two origins may each take 6000 of 8000 bytes.
        let mut s = ProxyStore::new(&cfg(8_000, 6_000, 2_000));
        for i in 0..6 {
            s.insert(OriginId(1), format!("/{i}"), object(900), T);
        }
        let a = s.used(OriginId(1));
        assert!(a > 4_000);
        for i in 0..3 {
            s.insert(OriginId(2), format!("/{i}"), object(900), T);
        }
        assert!(s.total_used() <= 8_000);
        assert!(
            s.used(OriginId(1)) < a,
            "origin 1 had the most and gave way"
        );
        assert_eq!(s.objects(), 8_000 / object(900).size() as usize);
        for i in 0..3 {
            assert!(s.get(OriginId(2), &format!("/{i}"), T).is_some());
        }
    }

    proptest! {
        /// Whatever is inserted, no object above the cap is kept, no origin passes its budget,
        /// the total stays within its budget, and the accounting matches the caches.
        #[test]
        fn budgets_hold(ops in proptest::collection::vec((0u64..4, 0u8..20, 0usize..3000, any::<bool>()), 1..200)) {
            let mut s = ProxyStore::new(&cfg(9_000, 4_000, 2_000));
            for (i, (origin, key, len, drop)) in ops.into_iter().enumerate() {
                let now = Duration::from_millis(i as u64);
                if drop && key == 0 {
                    s.drop_origin(OriginId(origin));
                    continue;
                }
                let (stored, _) = s.insert(OriginId(origin), format!("/{key}"), object(len), now);
                prop_assert_eq!(stored, len <= 2_000);
                let mut sum = 0;
                for id in 0..4 {
                    prop_assert!(s.used(OriginId(id)) <= 4_000);
                    sum += s.used(OriginId(id));
                }
                prop_assert_eq!(sum, s.total_used());
                prop_assert!(s.total_used() <= 9_000);
            }
        }
    }
}
