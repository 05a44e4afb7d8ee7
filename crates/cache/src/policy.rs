//! The replacement-policy trait and the configuration enum that selects one.

use std::fmt;
use std::hash::Hash;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Gdsf, LfuAging, Lru};

/// A replacement policy: the bookkeeping that decides which object a
/// [`Cache`](crate::Cache) evicts next.
///
/// The cache owns the objects and their sizes; the policy only tracks keys.
/// The cache calls exactly one of [`on_insert`](Self::on_insert) or
/// [`on_update`](Self::on_update) when a key starts or continues to be
/// stored, [`on_hit`](Self::on_hit) / [`add_references`](Self::add_references)
/// for references, and either [`on_remove`](Self::on_remove) (explicit
/// removal) or [`victim`](Self::victim) (eviction) when a key leaves.
///
/// Time is passed in by the caller (`now`, monotonic, arbitrary origin);
/// implementations must not read a clock. Time-based work such as aging is
/// applied lazily whenever a call carries a later `now`, and
/// [`tick`](Self::tick) lets an idle owner move time forward.
///
/// Every method must run in O(1) or O(log n); periodic work (e.g. aging)
/// may cost O(n) once per period.
pub trait ReplacementPolicy<K>: Send {
    /// A key not currently tracked was stored. Counts as its first reference.
    fn on_insert(&mut self, key: &K, size: u64, now: Duration);

    /// A tracked key was stored again (its value replaced, possibly with a
    /// new size). Counts as one reference. The default forgets the key and
    /// inserts it afresh.
    fn on_update(&mut self, key: &K, old_size: u64, new_size: u64, now: Duration) {
        let _ = old_size;
        self.on_remove(key);
        self.on_insert(key, new_size, now);
    }

    /// A tracked key was referenced (a cache hit).
    fn on_hit(&mut self, key: &K, size: u64, now: Duration);

    /// A tracked key gained `n` references at once. Used for hot-object
    /// replication, where the counts of replicated objects grow by the number
    /// of replicas (seed 000 §3.2.1). Untracked keys are ignored.
    ///
    /// The default treats any positive `n` as a single hit, which is right
    /// for recency-based policies; counting policies override it.
    fn add_references(&mut self, key: &K, size: u64, n: u64, now: Duration) {
        if n > 0 {
            self.on_hit(key, size, now);
        }
    }

    /// A tracked key was removed by the owner (not evicted). Untracked keys
    /// are ignored.
    fn on_remove(&mut self, key: &K);

    /// Chooses the next key to evict, forgets it and returns it, or `None`
    /// when nothing is tracked. [`on_remove`](Self::on_remove) is not called
    /// for keys returned here.
    fn victim(&mut self) -> Option<K>;

    /// Lets time pass without any other event (e.g. to apply aging).
    fn tick(&mut self, now: Duration) {
        let _ = now;
    }

    /// A short lowercase name for logs and metrics (`"lru"`, `"lfu"`, …).
    fn name(&self) -> &'static str;
}

/// Errors in a policy configuration.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The policy name is not one of `lru`, `lfu`, `gdsf`.
    #[error("unknown replacement policy {0:?} (expected \"lru\", \"lfu\" or \"gdsf\")")]
    UnknownPolicy(String),
    /// The aging factor is not a number in `[0, 1]`.
    #[error("aging factor must be a number in [0, 1], got {0}")]
    InvalidAgingFactor(f64),
    /// The aging interval is zero.
    #[error("aging interval must be greater than zero")]
    ZeroAgingInterval,
    /// A replication setting is out of its range.
    #[error("invalid replication setting: {0}")]
    Replication(String),
}

pub(crate) fn check_aging(interval: Duration, factor: f64) -> Result<(), PolicyError> {
    if !(0.0..=1.0).contains(&factor) {
        // Also rejects NaN.
        return Err(PolicyError::InvalidAgingFactor(factor));
    }
    if interval.is_zero() {
        return Err(PolicyError::ZeroAgingInterval);
    }
    Ok(())
}

const fn default_aging_interval_ms() -> u64 {
    10_000
}

const fn default_aging_factor() -> f64 {
    0.5
}

/// Which replacement policy a cache uses, as written in configuration.
///
/// Serialized with an internal lowercase tag, which reads naturally in TOML:
///
/// ```toml
/// kind = "lfu"
/// aging_interval_ms = 10000   # optional, default 10 s
/// aging_factor = 0.5          # optional, default 0.5
/// ```
///
/// It also parses from the bare names `"lru"`, `"lfu"` and `"gdsf"` with
/// [`FromStr`] (LFU then gets the default aging parameters).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PolicyKind {
    /// Least recently used ([`Lru`]).
    Lru,
    /// Least frequently used with periodic aging ([`LfuAging`]).
    Lfu {
        /// Aging period in milliseconds (default 10 000).
        #[serde(default = "default_aging_interval_ms")]
        aging_interval_ms: u64,
        /// Factor every count is multiplied by once per period, in `[0, 1]`
        /// (default 0.5; 1 disables aging).
        #[serde(default = "default_aging_factor")]
        aging_factor: f64,
    },
    /// GreedyDual-Size-Frequency with uniform cost ([`Gdsf`]).
    Gdsf,
}

impl PolicyKind {
    /// LFU with the default aging (×0.5 every 10 s).
    pub const LFU_DEFAULT: PolicyKind = PolicyKind::Lfu {
        aging_interval_ms: default_aging_interval_ms(),
        aging_factor: default_aging_factor(),
    };

    /// The policy's short name, as accepted by [`FromStr`].
    pub fn name(&self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Lfu { .. } => "lfu",
            PolicyKind::Gdsf => "gdsf",
        }
    }

    /// Checks the parameters (aging factor in `[0, 1]`, non-zero interval).
    /// Call this when loading configuration; [`build`](Self::build) panics on
    /// what it rejects.
    pub fn validate(&self) -> Result<(), PolicyError> {
        match *self {
            PolicyKind::Lru | PolicyKind::Gdsf => Ok(()),
            PolicyKind::Lfu {
                aging_interval_ms,
                aging_factor,
            } => check_aging(Duration::from_millis(aging_interval_ms), aging_factor),
        }
    }

    /// Creates the policy.
    ///
    /// # Panics
    ///
    /// If [`validate`](Self::validate) would return an error.
    pub fn build<K>(&self) -> Box<dyn ReplacementPolicy<K>>
    where
        K: Hash + Eq + Clone + Send + 'static,
    {
        match *self {
            PolicyKind::Lru => Box::new(Lru::new()),
            PolicyKind::Lfu {
                aging_interval_ms,
                aging_factor,
            } => Box::new(LfuAging::new(
                Duration::from_millis(aging_interval_ms),
                aging_factor,
            )),
            PolicyKind::Gdsf => Box::new(Gdsf::new()),
        }
    }
}

impl FromStr for PolicyKind {
    type Err = PolicyError;

    /// Parses `"lru"`, `"lfu"` or `"gdsf"` (ASCII case-insensitive,
    /// surrounding whitespace ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("lru") {
            Ok(PolicyKind::Lru)
        } else if t.eq_ignore_ascii_case("lfu") {
            Ok(PolicyKind::LFU_DEFAULT)
        } else if t.eq_ignore_ascii_case("gdsf") {
            Ok(PolicyKind::Gdsf)
        } else {
            Err(PolicyError::UnknownPolicy(s.to_owned()))
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Section {
        policy: PolicyKind,
    }

    #[test]
    fn from_str_accepts_names_with_defaults() {
        assert_eq!("lru".parse::<PolicyKind>(), Ok(PolicyKind::Lru));
        assert_eq!(" GDSF ".parse::<PolicyKind>(), Ok(PolicyKind::Gdsf));
        assert_eq!(
            "Lfu".parse::<PolicyKind>(),
            Ok(PolicyKind::Lfu {
                aging_interval_ms: 10_000,
                aging_factor: 0.5
            })
        );
        assert_eq!(
            "arc".parse::<PolicyKind>(),
            Err(PolicyError::UnknownPolicy("arc".into()))
        );
    }

    #[test]
    fn toml_tagged_form() {
        let s: Section = toml::from_str("[policy]\nkind = \"lfu\"\n").unwrap();
        assert_eq!(s.policy, PolicyKind::LFU_DEFAULT);
        let s: Section = toml::from_str(
            "policy = { kind = \"lfu\", aging_factor = 0.25, aging_interval_ms = 500 }",
        )
        .unwrap();
        assert_eq!(
            s.policy,
            PolicyKind::Lfu {
                aging_interval_ms: 500,
                aging_factor: 0.25
            }
        );
        let s: Section = toml::from_str("policy = { kind = \"gdsf\" }").unwrap();
        assert_eq!(s.policy, PolicyKind::Gdsf);
        assert!(toml::from_str::<Section>("policy = { kind = \"mru\" }").is_err());
    }

    #[test]
    fn serde_round_trip() {
        for kind in [PolicyKind::Lru, PolicyKind::Gdsf, PolicyKind::LFU_DEFAULT] {
            let json = serde_json::to_string(&kind).unwrap();
            assert!(
                json.contains(&format!("\"kind\":\"{}\"", kind.name())),
                "{json}"
            );
            assert_eq!(serde_json::from_str::<PolicyKind>(&json).unwrap(), kind);
        }
    }

    #[test]
    fn validate_rejects_bad_aging() {
        assert!(PolicyKind::LFU_DEFAULT.validate().is_ok());
        let bad = |ms, f| PolicyKind::Lfu {
            aging_interval_ms: ms,
            aging_factor: f,
        };
        assert_eq!(
            bad(1000, 1.5).validate(),
            Err(PolicyError::InvalidAgingFactor(1.5))
        );
        assert!(matches!(
            bad(1000, f64::NAN).validate(),
            Err(PolicyError::InvalidAgingFactor(_))
        ));
        assert_eq!(bad(0, 0.5).validate(), Err(PolicyError::ZeroAgingInterval));
        assert!(bad(1, 0.0).validate().is_ok());
        assert!(bad(1, 1.0).validate().is_ok());
    }

    #[test]
    fn build_names_match() {
        for kind in [PolicyKind::Lru, PolicyKind::Gdsf, PolicyKind::LFU_DEFAULT] {
            let p = kind.build::<u32>();
            assert_eq!(p.name(), kind.name());
            assert_eq!(kind.to_string(), kind.name());
        }
    }
}
