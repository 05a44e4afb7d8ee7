//! What a simulation run is made of: the cost model of a node (CPU and disk), the front end's
//! costs, the request distribution mechanism and the cluster's size and caches.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use switchyard_policy::{PolicyConfig, PolicyKind};

use crate::SimError;

/// Nanoseconds of simulated time.
pub type Nanos = u64;

/// Converts microseconds given in a configuration to whole nanoseconds.
pub(crate) fn us_to_ns(us: f64) -> Nanos {
    (us * 1000.0).round() as Nanos
}

/// CPU costs of a back-end node (seed 003 §6), in microseconds.
///
/// The web-server figures are the paper's measurements on a 300 MHz Pentium II: connection
/// establishment and teardown 278 µs each (Apache) or 129 µs (Flash), 527 / 159 µs per request,
/// and 24 µs per 512 bytes transmitted for both. With them an 8 KB cached document is served at
/// about 682 (Apache) or 1248 (Flash) requests per second over HTTP/1.0.
///
/// The paper does not print its handoff and forwarding costs; it reports where its §5 analysis
/// puts the crossover between multiple handoff and back-end forwarding: at a mean response of
/// 12 KB for Apache and 6 KB for Flash (Figs. 5 and 6). The defaults here reproduce exactly those
/// crossovers: forwarding costs the connection-handling node 12 µs per 512 bytes relayed (half
/// the cost of transmitting them), and a handoff costs the receiving node as much as forwarding
/// 12 KB (Apache, 288 µs: its connection setup plus 10 µs) or 6 KB (Flash, 144 µs: its
/// connection setup plus 15 µs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuCosts {
    /// Connection establishment, charged to the node that first handles a connection.
    pub connect_us: f64,
    /// Connection teardown, charged to the node that handles the connection when it closes.
    pub teardown_us: f64,
    /// Per-request overhead on the node that serves the request.
    pub request_us: f64,
    /// Transmit processing per 512 bytes (or part of them) of response on the serving node.
    pub transmit_per_512_us: f64,
    /// Multiple handoff: cost to the node that receives a handed-off connection.
    pub handoff_us: f64,
    /// Back-end forwarding: per-request cost to the connection-handling node of fetching a
    /// response from another node.
    pub forward_request_us: f64,
    /// Back-end forwarding: cost to the connection-handling node per 512 bytes it relays.
    pub forward_per_512_us: f64,
}

impl CpuCosts {
    /// Apache 1.3.3 on FreeBSD 2.2.6 (seed 003 §6).
    pub const APACHE: CpuCosts = CpuCosts {
        connect_us: 278.0,
        teardown_us: 278.0,
        request_us: 527.0,
        transmit_per_512_us: 24.0,
        handoff_us: 288.0,
        forward_request_us: 0.0,
        forward_per_512_us: 12.0,
    };

    /// Flash (seed 003 §6).
    pub const FLASH: CpuCosts = CpuCosts {
        connect_us: 129.0,
        teardown_us: 129.0,
        request_us: 159.0,
        transmit_per_512_us: 24.0,
        handoff_us: 144.0,
        forward_request_us: 0.0,
        forward_per_512_us: 12.0,
    };

    fn check(&self) -> Result<(), SimError> {
        let all = [
            ("connect_us", self.connect_us),
            ("teardown_us", self.teardown_us),
            ("request_us", self.request_us),
            ("transmit_per_512_us", self.transmit_per_512_us),
            ("handoff_us", self.handoff_us),
            ("forward_request_us", self.forward_request_us),
            ("forward_per_512_us", self.forward_per_512_us),
        ];
        check_costs(&all)
    }
}

fn check_costs(all: &[(&'static str, f64)]) -> Result<(), SimError> {
    for &(key, v) in all {
        if !(v.is_finite() && (0.0..=1e9).contains(&v)) {
            return Err(SimError::Config(format!(
                "{key} must be a number of microseconds in 0..=1e9, got {v}"
            )));
        }
    }
    Ok(())
}

/// The disk of a back-end node: one FIFO queue, each read costs a positioning delay plus a
/// transfer time, and large files pay further positioning delays.
///
/// The defaults are the disk model of the simulator seed 003 extends (Pai et al., ASPLOS 1998,
/// reference 23 of seed 003): 28 ms for the first positioning, 410 µs per 4 KB transferred,
/// and another 14 ms of positioning for every 44 KB beyond the first 44 KB.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskCosts {
    /// Positioning (seek and rotation) before a read.
    pub seek_us: f64,
    /// Transfer time per 4096 bytes (or part of them).
    pub per_4k_us: f64,
    /// Size of a contiguous extent; each further extent costs `extent_seek_us`.
    pub extent_bytes: u64,
    /// Positioning per extent after the first.
    pub extent_seek_us: f64,
}

impl Default for DiskCosts {
    fn default() -> Self {
        DiskCosts {
            seek_us: 28_000.0,
            per_4k_us: 410.0,
            extent_bytes: 44 * 1024,
            extent_seek_us: 14_000.0,
        }
    }
}

impl DiskCosts {
    pub(crate) fn check(&self) -> Result<(), SimError> {
        check_costs(&[
            ("seek_us", self.seek_us),
            ("per_4k_us", self.per_4k_us),
            ("extent_seek_us", self.extent_seek_us),
        ])?;
        if self.extent_bytes == 0 {
            return Err(SimError::Config("extent_bytes must be at least 1".into()));
        }
        Ok(())
    }
}

/// Costs of the front end (the switch). The simulator of seed 003 treats the front end as never
/// the bottleneck, which is what the zero defaults give; non-zero values put a FIFO CPU in front
/// of the cluster through which every dispatch (and, for a relaying front end, every response
/// byte) passes.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontEndCosts {
    /// Per client connection (accept and close).
    pub connection_us: f64,
    /// Per request dispatched (parse and policy decision).
    pub request_us: f64,
    /// Per handoff of a connection to or between nodes.
    pub handoff_us: f64,
    /// Relaying front end: per 512 bytes of response relayed.
    pub relay_per_512_us: f64,
}

impl FrontEndCosts {
    fn check(&self) -> Result<(), SimError> {
        check_costs(&[
            ("frontend connection_us", self.connection_us),
            ("frontend request_us", self.request_us),
            ("frontend handoff_us", self.handoff_us),
            ("frontend relay_per_512_us", self.relay_per_512_us),
        ])
    }

    /// Whether every cost is zero (then the front end is not simulated at all).
    pub fn is_free(&self) -> bool {
        self.connection_us == 0.0
            && self.request_us == 0.0
            && self.handoff_us == 0.0
            && self.relay_per_512_us == 0.0
    }
}

/// Named cost presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// Apache 1.3.3 (seed 003 §6).
    Apache,
    /// Flash (seed 003 §6).
    Flash,
}

impl Preset {
    /// The preset's CPU costs.
    pub fn cpu(self) -> CpuCosts {
        match self {
            Preset::Apache => CpuCosts::APACHE,
            Preset::Flash => CpuCosts::FLASH,
        }
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Apache => "apache",
            Preset::Flash => "flash",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How requests reach the node the policy chose (seed 003 §3, §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RequestDistribution {
    /// TCP single handoff: the policy places each connection once, on its first request; every
    /// request on it is served by that node (HTTP/1.0, or "simple" persistent connections).
    Single,
    /// Multiple TCP handoff: the policy decides per request; a request for another node moves
    /// the connection there at `handoff_us` on the receiving node.
    Handoff,
    /// Back-end forwarding: the connection stays on the node it was first handed to; a request
    /// for another node is served there and relayed by the handling node at the forwarding cost.
    Forward,
    /// Relaying front end: the front end keeps persistent connections to every node and relays
    /// each request and response; nodes pay no per-client connection costs.
    Relay,
    /// Zero-cost ideal: like multiple handoff with a handoff that costs nothing.
    Ideal,
}

impl RequestDistribution {
    /// Every mechanism.
    pub const ALL: [RequestDistribution; 5] = [
        RequestDistribution::Single,
        RequestDistribution::Handoff,
        RequestDistribution::Forward,
        RequestDistribution::Relay,
        RequestDistribution::Ideal,
    ];

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestDistribution::Single => "single",
            RequestDistribution::Handoff => "handoff",
            RequestDistribution::Forward => "forward",
            RequestDistribution::Relay => "relay",
            RequestDistribution::Ideal => "ideal",
        }
    }

    /// Whether the policy is consulted for every request (all but single handoff).
    pub fn per_request(self) -> bool {
        self != RequestDistribution::Single
    }
}

impl fmt::Display for RequestDistribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RequestDistribution {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        RequestDistribution::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                SimError::Config(format!(
                    "unknown mechanism `{s}` (known: single, handoff, forward, relay, ideal)"
                ))
            })
    }
}

/// How a node works through the requests of one pipelined batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Pipelining {
    /// All requests of a batch are under way at once: each queues for CPU and disk on its own,
    /// as the independent requests of a multi-process or event-driven server would. A multiple
    /// handoff still waits until the responses under way are sent (seed 003 §7.2).
    Concurrent,
    /// One request of a connection at a time, the next when the previous response is sent (a
    /// server process per connection, as Apache 1.3).
    Serial,
}

impl Pipelining {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Pipelining::Concurrent => "concurrent",
            Pipelining::Serial => "serial",
        }
    }
}

/// Default cache budget per node: 85 MB, the file cache seed 003 §6 leaves a 128 MB back end.
pub const DEFAULT_CACHE_BYTES: u64 = 85 * 1024 * 1024;

/// One simulated cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Number of back-end nodes.
    pub nodes: u32,
    /// The dispatching policy and its parameters. For `ext-lard` the simulator sets the policy's
    /// `mechanism` from [`SimConfig::mechanism`]: handoff for multiple handoff, the ideal and the
    /// relaying front end (which can serve any request anywhere), forwarding otherwise.
    /// `batch_gap_ms` is 0 by default: the requests of a batch reach the front end at one
    /// simulated instant and the next batch only after the previous one is answered.
    pub policy: PolicyConfig,
    /// How requests reach the chosen node.
    pub mechanism: RequestDistribution,
    /// How the requests of a pipelined batch are worked through.
    pub pipelining: Pipelining,
    /// Name of the CPU cost preset, for reports (`custom` when costs were changed).
    pub preset: String,
    /// CPU costs of a node.
    pub cpu: CpuCosts,
    /// Disk of a node.
    pub disk: DiskCosts,
    /// Front-end costs.
    pub frontend: FrontEndCosts,
    /// Main-memory cache budget of each node in bytes.
    pub cache_bytes: u64,
    /// Replacement policy of the node caches.
    pub cache_policy: switchyard_cache::PolicyKind,
    /// Objects larger than this are never cached (None: only the budget limits them).
    pub cache_max_object_bytes: Option<u64>,
    /// Client connections open at once: the population of the closed loop that matches the
    /// request arrival rate to the cluster's throughput (seed 003 §6). `None`: `L_idle`
    /// connections per node (30 with the default policy settings), the load at which seed 003
    /// Fig. 3 has a node fully utilized, so that every node can be kept busy without the cluster
    /// being driven far past saturation.
    pub clients: Option<u32>,
    /// Requests completed before measurement starts (their time, hits and busy time are not
    /// counted); 0 measures the whole trace, as seed 003 does.
    pub warmup_requests: u64,
}

impl SimConfig {
    /// A cluster of `nodes` nodes with the given policy and mechanism, Apache costs, the default
    /// disk, a free front end and 85 MB LRU caches.
    pub fn new(nodes: u32, policy: PolicyKind, mechanism: RequestDistribution) -> Self {
        let mut p = PolicyConfig::new(policy);
        // Requests of one pipelined batch reach the front end at the same simulated instant and
        // the next batch only after the previous one is answered, so any gap separates batches.
        p.batch_gap_ms = 0;
        SimConfig {
            nodes,
            policy: p,
            mechanism,
            pipelining: Pipelining::Concurrent,
            preset: Preset::Apache.as_str().to_owned(),
            cpu: CpuCosts::APACHE,
            disk: DiskCosts::default(),
            frontend: FrontEndCosts::default(),
            cache_bytes: DEFAULT_CACHE_BYTES,
            cache_policy: switchyard_cache::PolicyKind::Lru,
            cache_max_object_bytes: None,
            clients: None,
            warmup_requests: 0,
        }
    }

    /// Same configuration with a cost preset's CPU costs.
    pub fn with_preset(mut self, preset: Preset) -> Self {
        self.cpu = preset.cpu();
        self.preset = preset.as_str().to_owned();
        self
    }

    /// The closed loop's population: [`SimConfig::clients`], or `L_idle` per node.
    pub fn client_population(&self) -> u32 {
        self.clients
            .unwrap_or_else(|| self.nodes.saturating_mul(self.policy.l_idle.max(1)))
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.nodes == 0 || self.nodes > 4096 {
            return Err(SimError::Config(format!(
                "nodes must be 1..=4096, got {}",
                self.nodes
            )));
        }
        if self.clients == Some(0) {
            return Err(SimError::Config("clients must be at least 1".into()));
        }
        self.cpu.check()?;
        self.disk.check()?;
        self.frontend.check()?;
        self.cache_policy
            .validate()
            .map_err(|e| SimError::Config(format!("cache policy: {e}")))?;
        self.policy.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_reproduce_the_papers_cached_8k_rates() {
        // Seed 003 §6: an 8 KB cached document at about 682 (Apache) / 1248 (Flash) req/s.
        for (p, want) in [(Preset::Apache, 682.0), (Preset::Flash, 1248.0)] {
            let c = p.cpu();
            let us = c.connect_us + c.teardown_us + c.request_us + 16.0 * c.transmit_per_512_us;
            let rate = 1e6 / us;
            assert!((rate - want).abs() < 1.0, "{p}: {rate}");
        }
    }

    #[test]
    fn defaults_put_the_crossover_at_12k_and_6k() {
        // Multiple handoff costs `handoff_us` per remote request, forwarding costs
        // `forward_request_us + forward_per_512_us × blocks`: equal at 12 KB / 6 KB.
        for (p, kb) in [(Preset::Apache, 12.0), (Preset::Flash, 6.0)] {
            let c = p.cpu();
            let blocks = kb * 1024.0 / 512.0;
            let fwd = c.forward_request_us + c.forward_per_512_us * blocks;
            assert_eq!(fwd, c.handoff_us, "{p}");
        }
    }

    #[test]
    fn client_population_is_l_idle_per_node() {
        let c = SimConfig::new(1, PolicyKind::Lard, RequestDistribution::Single);
        assert_eq!(c.client_population(), 30);
        let c = SimConfig::new(8, PolicyKind::Wrr, RequestDistribution::Single);
        assert_eq!(c.client_population(), 240);
        let mut c = SimConfig::new(8, PolicyKind::Wrr, RequestDistribution::Single);
        c.clients = Some(5);
        assert_eq!(c.client_population(), 5);
    }

    #[test]
    fn validation() {
        let mut c = SimConfig::new(0, PolicyKind::Lard, RequestDistribution::Single);
        assert!(c.validate().is_err());
        c.nodes = 2;
        assert!(c.validate().is_ok());
        c.cpu.request_us = -1.0;
        assert!(c.validate().is_err());
        c.cpu.request_us = 1.0;
        c.disk.extent_bytes = 0;
        assert!(c.validate().is_err());
        assert_eq!(
            "Forward".parse::<RequestDistribution>().unwrap(),
            RequestDistribution::Forward
        );
        assert!("teleport".parse::<RequestDistribution>().is_err());
    }
}
