//! Policy configuration, policy names and the factory [`build`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::error::PolicyError;
use crate::Policy;

/// The dispatching policies this crate implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// `rr`: round robin.
    Rr,
    /// `wrr`: weighted round robin.
    Wrr,
    /// `lc`: least connections.
    Lc,
    /// `chash`: consistent hashing with bounded loads.
    Chash,
    /// `lard`: locality-aware request distribution.
    Lard,
    /// `lard-r`: LARD with replication.
    LardR,
    /// `ext-lard`: extended LARD for persistent connections.
    ExtLard,
    /// `cap`: client-aware policy (service classes).
    Cap,
}

impl PolicyKind {
    /// Every policy, in the order of [`PolicyKind::NAMES`].
    pub const ALL: [PolicyKind; 8] = [
        PolicyKind::Rr,
        PolicyKind::Wrr,
        PolicyKind::Lc,
        PolicyKind::Chash,
        PolicyKind::Lard,
        PolicyKind::LardR,
        PolicyKind::ExtLard,
        PolicyKind::Cap,
    ];

    /// The config names of the policies.
    pub const NAMES: [&'static str; 8] = [
        "rr", "wrr", "lc", "chash", "lard", "lard-r", "ext-lard", "cap",
    ];

    const KNOWN: &'static str = "rr, wrr, lc, chash, lard, lard-r, ext-lard, cap";

    /// The config name of the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Rr => "rr",
            PolicyKind::Wrr => "wrr",
            PolicyKind::Lc => "lc",
            PolicyKind::Chash => "chash",
            PolicyKind::Lard => "lard",
            PolicyKind::LardR => "lard-r",
            PolicyKind::ExtLard => "ext-lard",
            PolicyKind::Cap => "cap",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = PolicyError;

    /// Parses a policy name; `_` may stand for `-` (`lard_r`, `ext_lard`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        let found = PolicyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == name || k.as_str().replace('-', "_") == name);
        found.ok_or_else(|| PolicyError::UnknownPolicy {
            name: s.to_string(),
            known: PolicyKind::KNOWN,
        })
    }
}

impl<'de> Deserialize<'de> for PolicyKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How `ext-lard` routes a request on a persistent connection that should come from a node other
/// than the one handling the connection (seed 003 §3.2, §3.3, §5; config key `mechanism`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PersistentRouting {
    /// Back-end forwarding: the handling node fetches from the caching node.
    #[default]
    Forward,
    /// Multiple handoff: the connection moves to the caching node.
    Handoff,
    /// Handoff when the request's size hint is at least `handoff_min_bytes`, else forwarding
    /// (seed 003 §5: forwarding wins for small responses, handoff for large ones).
    Auto,
}

/// Which load figure the load-aware policies use (seed 004 §2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadSource {
    /// The switch's own count from `select`/`post_request`/connection events (centralized monitor).
    #[default]
    Centralized,
    /// The node's last report of active connections, corrected by what the switch has dispatched
    /// and seen finish since that report (distributed monitor).
    Reported,
    /// The larger of the two.
    Max,
}

/// One service class of `cap`: requests whose path matches `pattern` belong to class `name`.
///
/// Patterns: `*.cgi` (suffix), `/cgi-bin/` or `/img/*` (prefix), `*search*` (substring),
/// `=/exact/path` (exact), `*` (everything). The query string is not part of the match.
/// Classes are tried in config order; the first match wins. Several entries may share a name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSpec {
    /// Class name (for metrics).
    pub name: String,
    /// URL pattern.
    pub pattern: String,
}

/// A weight for one node that overrides the weight in its [`crate::NodeSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightSpec {
    /// The node id.
    pub node: u32,
    /// Its weight.
    pub weight: u32,
}

/// Configuration of a dispatching policy, as found in the `[policy]` table of the config file.
/// Every key except `name` has a default; keys a policy does not use are ignored by it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Policy: one of `rr wrr lc chash lard lard-r ext-lard cap`.
    pub name: PolicyKind,
    /// `chash`: load bound factor; no node gets more than `ceil((1 + eps) * average)` in-flight
    /// requests. Default 0.25.
    #[serde(default = "d_eps")]
    pub eps: f64,
    /// `chash`: ring points per unit of weight. Default 100.
    #[serde(default = "d_points")]
    pub chash_points: u32,
    /// LARD family: `L_idle`, the load below which a node is underused (seed 003 Fig. 4). Default 30.
    #[serde(default = "d_l_idle")]
    pub l_idle: u32,
    /// LARD family: `L_overload`, above which a node's cost is infinite. Default 130.
    #[serde(default = "d_l_overload")]
    pub l_overload: u32,
    /// LARD family: `MissCost`. Default 50.
    #[serde(default = "d_miss_cost")]
    pub miss_cost: u32,
    /// `ext-lard`: a handling node with fewer queued disk reads than this reads a target it does
    /// not cache from its own disk (seed 003 §4.2). Default 5.
    #[serde(default = "d_disk_queue")]
    pub disk_queue_threshold: u32,
    /// `lard-r`: seconds a server set must go unchanged before its most loaded member is dropped
    /// (`K` of LARD/R). Default 20.
    #[serde(default = "d_k")]
    pub lard_r_shrink_secs: f64,
    /// `ext-lard`: requests on one connection less than this many milliseconds apart belong to the
    /// same pipelined batch (the `N` of the 1/N rule). Default 500.
    #[serde(default = "d_batch_gap")]
    pub batch_gap_ms: u64,
    /// `ext-lard`: how a request is served from a node other than the handling node. Default
    /// `forward`.
    #[serde(default)]
    pub mechanism: PersistentRouting,
    /// `ext-lard` with `mechanism = "auto"`: smallest size hint for which the connection is handed
    /// off rather than the response forwarded. Default 12288 (seed 003 §5, Apache crossover).
    #[serde(default = "d_handoff_min")]
    pub handoff_min_bytes: u64,
    /// `cap`: service classes.
    #[serde(default)]
    pub classes: Vec<ClassSpec>,
    /// `cap`: name of the class of requests that match no pattern. Default `default`.
    #[serde(default = "d_default_class")]
    pub default_class: String,
    /// Weights that override the node specs' weights.
    #[serde(default)]
    pub weights: Vec<WeightSpec>,
    /// Load figure used by `lc` and the LARD family. Default `centralized`.
    #[serde(default)]
    pub load_source: LoadSource,
    /// LARD family: most targets kept in the mapping table; beyond it the least recently used
    /// (second-chance) entries are dropped. Default 1048576.
    #[serde(default = "d_max_targets")]
    pub max_targets: usize,
    /// LARD family and `chash`: whether the Host header is part of the target key (for sites that
    /// serve several virtual hosts from one cluster). Default false.
    #[serde(default)]
    pub host_in_key: bool,
    /// LARD family: learn from the nodes which responses came from their caches, and treat a
    /// node that served a target from its cache and later without it as having lost it (its
    /// Fig. 4 cost is the unmapped one; `ext-lard` fetches from it no more) until it serves a
    /// hit again. Default false: the policies of the papers assume that a target's node holds
    /// it, and the simulator's reproductions of seed 003 keep that assumption.
    #[serde(default)]
    pub cache_feedback: bool,
}

impl PolicyConfig {
    /// The owner map of a cooperative cluster by default: consistent hashing with the load bound
    /// lifted (`eps` at its largest), 1000 ring points per member. Each member sees only its own
    /// requests in flight, so a bound would send requests away from their owners whenever a few
    /// overlap (the simulator: 8 nodes served 988 req/s with eps 0.25 against 10,079 without,
    /// `switchyard sim cyclone --nodes 8 --systems SC --requests 12000 --clients 80`); hot
    /// targets are spread by replication instead, and seed 000 mapped by a plain hash.
    pub fn owner_map() -> Self {
        PolicyConfig {
            eps: MAX_EPS,
            chash_points: 1000,
            ..PolicyConfig::new(PolicyKind::Chash)
        }
    }
}

/// The largest `eps`: no bound in practice (a node may take 1001 times the average).
pub const MAX_EPS: f64 = 1000.0;

fn d_eps() -> f64 {
    0.25
}
fn d_points() -> u32 {
    100
}
fn d_l_idle() -> u32 {
    30
}
fn d_l_overload() -> u32 {
    130
}
fn d_miss_cost() -> u32 {
    50
}
fn d_disk_queue() -> u32 {
    5
}
fn d_k() -> f64 {
    20.0
}
fn d_batch_gap() -> u64 {
    500
}
fn d_handoff_min() -> u64 {
    12 * 1024
}
fn d_default_class() -> String {
    "default".to_string()
}
fn d_max_targets() -> usize {
    1 << 20
}

impl PolicyConfig {
    /// The defaults for the given policy.
    pub fn new(name: PolicyKind) -> Self {
        PolicyConfig {
            name,
            eps: d_eps(),
            chash_points: d_points(),
            l_idle: d_l_idle(),
            l_overload: d_l_overload(),
            miss_cost: d_miss_cost(),
            disk_queue_threshold: d_disk_queue(),
            lard_r_shrink_secs: d_k(),
            batch_gap_ms: d_batch_gap(),
            mechanism: PersistentRouting::default(),
            handoff_min_bytes: d_handoff_min(),
            classes: Vec::new(),
            default_class: d_default_class(),
            weights: Vec::new(),
            load_source: LoadSource::default(),
            max_targets: d_max_targets(),
            host_in_key: false,
            cache_feedback: false,
        }
    }

    /// `K` of LARD/R as a duration.
    pub fn lard_r_shrink(&self) -> Duration {
        Duration::from_secs_f64(self.lard_r_shrink_secs)
    }

    /// The batch gap of `ext-lard` as a duration.
    pub fn batch_gap(&self) -> Duration {
        Duration::from_millis(self.batch_gap_ms)
    }

    /// Checks ranges and consistency of the settings.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !self.eps.is_finite() || self.eps < 0.0 || self.eps > MAX_EPS {
            return Err(PolicyError::config("eps", "must be a number in 0..=1000"));
        }
        if self.chash_points == 0 || self.chash_points > 10_000 {
            return Err(PolicyError::config("chash_points", "must be in 1..=10000"));
        }
        if self.l_idle > self.l_overload {
            return Err(PolicyError::config(
                "l_idle",
                format!(
                    "l_idle ({}) must not exceed l_overload ({})",
                    self.l_idle, self.l_overload
                ),
            ));
        }
        if self.miss_cost == 0 {
            return Err(PolicyError::config("miss_cost", "must be at least 1"));
        }
        if self.l_overload > 1_000_000 || self.miss_cost > 1_000_000 {
            return Err(PolicyError::config(
                "l_overload",
                "l_overload and miss_cost must be at most 1000000",
            ));
        }
        if !self.lard_r_shrink_secs.is_finite()
            || self.lard_r_shrink_secs < 0.0
            || self.lard_r_shrink_secs > 1e9
        {
            return Err(PolicyError::config(
                "lard_r_shrink_secs",
                "must be a number of seconds >= 0",
            ));
        }
        if self.max_targets == 0 {
            return Err(PolicyError::config("max_targets", "must be at least 1"));
        }
        if self.default_class.is_empty() {
            return Err(PolicyError::config("default_class", "must not be empty"));
        }
        for c in &self.classes {
            if c.name.is_empty() {
                return Err(PolicyError::config("classes", "a class has an empty name"));
            }
            crate::cap::Pattern::parse(&c.name, &c.pattern)?;
        }
        if self.classes.len() >= u16::MAX as usize {
            return Err(PolicyError::config("classes", "too many classes"));
        }
        for w in &self.weights {
            if w.weight > crate::core::MAX_WEIGHT {
                return Err(PolicyError::config(
                    "weights",
                    format!(
                        "weight of node {} exceeds {}",
                        w.node,
                        crate::core::MAX_WEIGHT
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig::new(PolicyKind::Rr)
    }
}

/// Builds the policy named in `cfg`. Call [`Policy::init`] with the nodes before the first
/// `select`.
pub fn build(cfg: &PolicyConfig) -> Result<Box<dyn Policy>, PolicyError> {
    use crate::core::Engine;
    cfg.validate()?;
    Ok(match cfg.name {
        PolicyKind::Rr => Box::new(Engine::new(cfg, crate::rr::RoundRobin::default())),
        PolicyKind::Wrr => Box::new(Engine::new(cfg, crate::wrr::WeightedRoundRobin::default())),
        PolicyKind::Lc => Box::new(Engine::new(cfg, crate::lc::LeastConnections)),
        PolicyKind::Chash => Box::new(Engine::new(cfg, crate::chash::BoundedChash::new(cfg))),
        PolicyKind::Lard => Box::new(Engine::new(cfg, crate::lard::Lard::new(cfg, false))),
        PolicyKind::LardR => Box::new(Engine::new(cfg, crate::lard::Lard::new(cfg, true))),
        PolicyKind::ExtLard => Box::new(Engine::new(cfg, crate::ext_lard::ExtLard::new(cfg))),
        PolicyKind::Cap => Box::new(Engine::new(cfg, crate::cap::Cap::new(cfg)?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for (k, n) in PolicyKind::ALL.iter().zip(PolicyKind::NAMES) {
            assert_eq!(k.as_str(), n);
            assert_eq!(n.parse::<PolicyKind>().unwrap(), *k);
        }
        assert_eq!(
            "ext_lard".parse::<PolicyKind>().unwrap(),
            PolicyKind::ExtLard
        );
    }

    #[test]
    fn unknown_name_lists_known_ones() {
        let e = "lardx".parse::<PolicyKind>().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("lardx") && msg.contains("ext-lard") && msg.contains("cap"));
    }

    #[test]
    fn toml_defaults_and_keys() {
        let cfg: PolicyConfig = toml::from_str(
            r#"
            name = "cap"
            eps = 0.5
            classes = [ { name = "cgi", pattern = "*.cgi" }, { name = "cgi", pattern = "/cgi-bin/" } ]
            weights = [ { node = 1, weight = 3 } ]
            mechanism = "auto"
            load_source = "max"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.name, PolicyKind::Cap);
        assert_eq!(cfg.eps, 0.5);
        assert_eq!(cfg.l_idle, 30);
        assert_eq!(cfg.l_overload, 130);
        assert_eq!(cfg.miss_cost, 50);
        assert_eq!(cfg.disk_queue_threshold, 5);
        assert_eq!(cfg.lard_r_shrink(), Duration::from_secs(20));
        assert_eq!(cfg.classes.len(), 2);
        assert_eq!(cfg.mechanism, PersistentRouting::Auto);
        assert_eq!(cfg.load_source, LoadSource::Max);
        assert!(build(&cfg).is_ok());
    }

    #[test]
    fn toml_unknown_policy_is_a_clear_error() {
        let e = toml::from_str::<PolicyConfig>("name = \"fastest\"").unwrap_err();
        assert!(e.to_string().contains("unknown policy `fastest`"), "{e}");
        let e = toml::from_str::<PolicyConfig>("name = \"rr\"\nbogus = 1").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }

    #[test]
    fn validation_rejects_bad_values() {
        let mut c = PolicyConfig::new(PolicyKind::Lard);
        c.l_idle = 200;
        assert!(matches!(
            build(&c),
            Err(PolicyError::InvalidConfig { key: "l_idle", .. })
        ));
        let mut c = PolicyConfig::new(PolicyKind::Chash);
        c.eps = -1.0;
        assert!(build(&c).is_err());
        let mut c = PolicyConfig::new(PolicyKind::Cap);
        c.classes.push(ClassSpec {
            name: "x".into(),
            pattern: String::new(),
        });
        assert!(matches!(build(&c), Err(PolicyError::InvalidPattern { .. })));
    }

    #[test]
    fn every_policy_builds_with_defaults() {
        for k in PolicyKind::ALL {
            let p = build(&PolicyConfig::new(k)).unwrap();
            assert_eq!(p.name(), k.as_str());
        }
    }
}
