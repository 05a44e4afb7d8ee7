//! switchyard-cache: an in-memory object cache bounded in bytes, with
//! pluggable replacement policies, and aging reference counters for
//! hot-object detection.
//!
//! The crate is pure logic: no I/O, no clocks, no locks. Time is an argument
//! (`now: Duration`, monotonic since an origin the caller chooses), so the
//! same code serves a web server node (behind a mutex), a discrete-event
//! simulator and tests. Every operation is O(1) or O(log n) in the number of
//! stored objects; periodic aging is O(1) amortized.
//!
//! The node uses [`Cache`] for its object cache. The pieces that seed 000
//! §3.2's hot-object replication needs are here as well, tested on their
//! own: LFU with aging for a separately bounded replica cache,
//! [`Cache::add_references`] for counts that grow by the number of replicas,
//! and [`AgingCounter`] for spotting hot owned objects. No server replicates
//! objects yet.
//!
//! # Policies
//!
//! * [`Lru`] — least recently used. O(1) per operation.
//! * [`LfuAging`] — least frequently used with periodic aging, as used for
//!   the hot-object cache in seed 000 §3.2.1: "all the reference counts of
//!   the documents are scaled down by an aging factor periodically", so
//!   objects that built up high counts but are rarely requested later are
//!   replaced quickly. Every `interval` (default 10 s) each count is
//!   multiplied by `factor` (default 0.5); ties go to the least recently
//!   referenced object. Replicated objects can gain several references at
//!   once ([`Cache::add_references`]): their counts grow by the number of
//!   replicas. Aging is applied lazily: since scaling all counts by the same
//!   factor keeps their order, the implementation scales *new* references up
//!   instead of old counts down and renormalizes only when the scale gets
//!   large, once every ~64 periods at the default factor.
//! * [`Gdsf`] — GreedyDual-Size-Frequency (L. Cherkasova, "Improving WWW
//!   Proxies Performance with Greedy-Dual-Size-Frequency Caching Policy",
//!   HP Labs HPL-98-69, 1998): priority `H = L + freq × cost / size`, with
//!   `L` raised to the `H` of each evicted object. With uniform cost
//!   ([`GdsfCost::Uniform`]) it maximizes the object hit rate by keeping
//!   small popular objects; [`GdsfCost::Packets`] (`2 + size/536`) weighs
//!   network cost.
//!
//! [`PolicyKind`] names a policy in configuration (`kind = "lfu"` in TOML, or
//! `"lfu".parse()`), and [`ReplacementPolicy`] is the trait for adding more.
//!
//! [`AgingCounter`] keeps the same aged counts for keys that are not
//! necessarily cached, bounded in the number of keys, so a node can decide
//! which of its objects are hot enough to replicate.

mod aging;
mod cache;
mod gdsf;
mod lfu;
mod lru;
mod ordered;
mod policy;
pub mod replication;

#[cfg(test)]
mod proptests;

pub use aging::AgingCounter;
pub use cache::{Cache, CacheStats, InsertOutcome, RejectReason};
pub use gdsf::{Gdsf, GdsfCost};
pub use lfu::LfuAging;
pub use lru::Lru;
pub use policy::{PolicyError, PolicyKind, ReplacementPolicy};

/// The hash maps of the cache and its policies, keyed by object (for a node, its path).
///
/// foldhash rather than the standard library's SipHash: a hit hashes its key once in the
/// cache's map and once in its policy's, and SipHash was 4 % of a node's user-space
/// instructions per request (callgrind, 16 KiB keep-alive). Each map is seeded at random, so
/// keys cannot be chosen ahead to collide; foldhash is not a keyed cryptographic hash, but the
/// stored keys are the site's own objects, which a client does not pick.
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
