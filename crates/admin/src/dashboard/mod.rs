//! The live cluster dashboard: one page served from the binary, fed by server-sent events.
//!
//! A process that sees the cluster (the switch, or any member in cooperative mode) takes a
//! [`ClusterSample`] of cumulative counters about once a second and gives it to a [`Sampler`],
//! which turns the difference from the previous sample into rates and response-time quantiles:
//! one small [`Update`] for the whole cluster, plus a [`Meta`] (node names, columns) whenever
//! the node list changes. The sampler is pure: the sample carries its own time. The
//! [`feed`] module encodes each update once and fans it out to the page's viewers.
//!
//! An update is kept small (under 4 KB with 64 nodes): node names travel only in the meta
//! event, each node is one JSON array whose columns the meta names ([`COLUMNS`]), and numbers
//! carry three significant digits ([`Num`]). A site in flash-crowd rescue adds one small
//! part, [`RescueBrief`]: its state and relationships (its name and peers travel in the meta,
//! [`RescueSite`]).

pub mod coop;
pub mod feed;
pub mod hot;
pub mod latency;
pub mod rescue;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Page;
pub use hot::{HotCount, HotTargets};
pub use latency::{LatencyCounts, LatencyHistogram, LatencyTotals};
pub use rescue::{RescueBrief, RescueSite};

/// The dashboard page: HTML, CSS and JavaScript in one file, no external resources.
pub const PAGE_HTML: &str = include_str!("../../assets/dashboard.html");

/// The dashboard page as an admin route's answer.
pub fn page() -> Page {
    Page {
        content_type: "text/html; charset=utf-8",
        body: PAGE_HTML.as_bytes().to_vec(),
    }
}

/// The kind of a cooperative member's feed ([`Meta::kind`]): its rows carry the
/// [`COOP_COLUMNS`].
pub const COOPERATIVE: &str = "cooperative";

/// Hot targets listed per update.
pub const HOT_LISTED: usize = 5;

/// The columns of a node's row in an [`Update`], in order.
pub const COLUMNS: [&str; 12] = [
    "up",
    "rps",
    "mbps",
    "conns",
    "load",
    "p50",
    "p99",
    "moves",
    "fallbacks",
    "failures",
    "targets",
    "hit",
];

/// How an operator holds a node out of service (the switch's actions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Drained: no new requests; those in flight finish.
    Drain,
    /// Marked down.
    Down,
}

/// A node's state as the page shows it: the `up` column of a row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum State {
    /// Out of service: failed, or not answering (`0`).
    #[default]
    Down,
    /// In service (`1`).
    Up,
    /// Drained by the operator, requests still in flight on it (`2`).
    Draining,
    /// Drained by the operator, nothing in flight any more (`3`).
    Drained,
    /// Marked down by the operator (`4`).
    Held,
}

impl State {
    fn code(self) -> u8 {
        match self {
            State::Down => 0,
            State::Up => 1,
            State::Draining => 2,
            State::Drained => 3,
            State::Held => 4,
        }
    }

    fn from_code(c: u8) -> State {
        match c {
            1 => State::Up,
            2 => State::Draining,
            3 => State::Drained,
            4 => State::Held,
            _ => State::Down,
        }
    }
}

/// What the process knows of one node at one instant: cumulative counters and gauges.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSample {
    /// The node's name: its address, or its member name in cooperative mode.
    pub name: String,
    /// Whether it is in service.
    pub up: bool,
    /// How the operator holds it out, if they do.
    pub held: Option<Hold>,
    /// Requests it served so far.
    pub requests: u64,
    /// Response bytes it sent so far.
    pub bytes: u64,
    /// Requests in flight on it now.
    pub in_flight: u64,
    /// Open connections it reported in its last load report, if it reports.
    pub connections: Option<u64>,
    /// The load the dispatching policy uses for it.
    pub load: f64,
    /// Connections moved to it so far (handoffs; clones in cooperative mode).
    pub moves: u64,
    /// Moves to it that fell back (served another way) so far.
    pub fallbacks: u64,
    /// Failed requests or connections so far.
    pub failures: u64,
    /// Targets the policy maps to it now.
    pub targets: u64,
    /// Requests whose answer it said came from its memory cache or not, so far.
    pub cache_reported: u64,
    /// Of those, the ones answered from its memory cache.
    pub hits: u64,
    /// Its response times so far.
    pub latency: LatencyCounts,
    /// Cooperative mode: what only a member has.
    pub coop: Option<CoopSample>,
}

/// A cooperative member's own figures, beside a [`NodeSample`]'s.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CoopSample {
    /// Clones it gave back so far.
    pub hand_backs: u64,
    /// Copies of peers' hot objects it holds now; `None` with replication off.
    pub replicas: Option<u64>,
}

impl NodeSample {
    /// A node with every counter at zero.
    pub fn new(name: impl Into<String>) -> Self {
        NodeSample {
            name: name.into(),
            up: true,
            held: None,
            requests: 0,
            bytes: 0,
            in_flight: 0,
            connections: None,
            load: 0.0,
            moves: 0,
            fallbacks: 0,
            failures: 0,
            targets: 0,
            cache_reported: 0,
            hits: 0,
            latency: [0; latency::BUCKETS],
            coop: None,
        }
    }
}

/// The whole cluster at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSample {
    /// When it was taken, since an origin the process picks (its start).
    pub at: Duration,
    /// The configuration generation: the node list may differ from one to the next.
    pub generation: u64,
    /// The dispatching policy's name.
    pub policy: String,
    /// How responses reach clients (`relay`, `handoff`, `clone`).
    pub mechanism: String,
    /// Client connections open at the process.
    pub connections: u64,
    /// Requests waiting for a node.
    pub queue: u64,
    /// Moves that fell back so far, by reason.
    pub fallbacks: BTreeMap<String, u64>,
    /// Targets mapped to at least one node.
    pub targets_mapped: u64,
    /// Extra (target, node) mappings beyond the first per target.
    pub replicas: u64,
    /// The most requested targets since the previous sample.
    pub hot: Vec<HotCount>,
    /// The nodes, in the order of the configuration.
    pub nodes: Vec<NodeSample>,
    /// The site's rescue state, with `[rescue.peering]`.
    pub rescue: Option<crate::status::RescueStatus>,
}

/// A number sent with three significant digits, as an integer when it is one (`5120`, `1.23`,
/// `0.0457`); non-finite values are sent as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Num(pub f64);

impl Num {
    /// `v` rounded to three significant digits.
    pub fn round(v: f64) -> Num {
        if !v.is_finite() || v == 0.0 {
            return Num(0.0);
        }
        let digits = v.abs().log10().floor() as i32;
        // Divide or multiply by an exact power of ten, whichever keeps the result exact.
        if digits >= 2 {
            let unit = 10f64.powi(digits - 2);
            Num((v / unit).round() * unit)
        } else {
            let scale = 10f64.powi(2 - digits);
            Num((v * scale).round() / scale)
        }
    }
}

impl Serialize for Num {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = Num::round(self.0).0;
        if v.fract() == 0.0 && v.abs() < 9.0e15 {
            s.serialize_i64(v as i64)
        } else {
            s.serialize_f64(v)
        }
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        f64::deserialize(d).map(Num)
    }
}

/// Everything that changes only with the node list; sent as the `meta` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Who sends it: `switch` or [`COOPERATIVE`].
    pub kind: String,
    /// The dispatching policy.
    pub policy: String,
    /// How responses reach clients.
    pub mechanism: String,
    /// The configuration generation of the node list.
    pub generation: u64,
    /// How often updates come, in milliseconds.
    pub interval_ms: u64,
    /// The columns of a node's row ([`COLUMNS`]).
    pub cols: Vec<String>,
    /// The node names, in row order.
    pub nodes: Vec<String>,
    /// The site's rescue, with `[rescue.peering]`: its name, D_out and peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<RescueSite>,
}

/// The whole cluster's totals in an update.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Requests per second.
    pub rps: Num,
    /// Response megabytes (10⁶ bytes) per second.
    pub mbps: Num,
    /// Client connections open.
    pub conns: u64,
    /// Requests waiting for a node.
    pub queue: u64,
    /// Connections moved to nodes per second.
    pub moves: Num,
    /// Fallbacks per second.
    pub fb: Num,
    /// Cooperative mode: connections given back per second (after the one request each clone
    /// serves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backs: Option<Num>,
}

/// One hot target: its name, the node its last request went to, requests per second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HotRow(pub String, pub u32, pub Num);

/// The policy's target map in an update.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MapSummary {
    /// Targets mapped to at least one node.
    pub mapped: u64,
    /// Extra mappings beyond the first per target.
    pub replicas: u64,
    /// The hottest targets of the last period, hottest first.
    pub hot: Vec<HotRow>,
}

/// One node in an update, sent as an array in [`COLUMNS`] order, followed by the
/// [`COOP_COLUMNS`] when the row has them (cooperative mode).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeRow {
    /// In service: [`State::Up`].
    pub up: bool,
    /// The state in full, sent as the `up` column's number ([`State`]).
    pub state: State,
    /// Requests per second.
    pub rps: Num,
    /// Response megabytes (10⁶ bytes) per second.
    pub mbps: Num,
    /// Open connections: from the node's load report when it reports, else the requests in
    /// flight on it.
    pub conns: u64,
    /// The policy's load figure.
    pub load: Num,
    /// Median response time over the latency window, in ms.
    pub p50: Option<Num>,
    /// 99th percentile response time over the latency window, in ms.
    pub p99: Option<Num>,
    /// Connections moved to it per second.
    pub moves: Num,
    /// Moves to it that fell back, per second.
    pub fallbacks: Num,
    /// Failed requests or connections per second.
    pub failures: Num,
    /// Targets mapped to it.
    pub targets: u64,
    /// The share of the period's requests it answered from its memory cache, in percent (of
    /// those whose source it reported); `None` in a period without such requests.
    pub hit: Option<Num>,
    /// Cooperative mode: the copies of peers' hot objects it holds (`None` inside: replication
    /// is off). `None` for a switch's node, or a member whose figures are unknown.
    pub coop: Option<CoopRow>,
}

/// The cooperative column of a row.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CoopRow {
    /// Replicas held now; `None` with replication off.
    pub replicas: Option<u64>,
}

/// The extra column of a cooperative member's row, after [`COLUMNS`]. (Hand-backs, nearly as
/// many as the clones a member takes, travel as the cluster's total, [`Totals::backs`]: a
/// column more for each of 64 members would not fit the update in 4 KB.)
pub const COOP_COLUMNS: [&str; 1] = ["replicas"];

impl Serialize for NodeRow {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let len = COLUMNS.len() + self.coop.map_or(0, |_| COOP_COLUMNS.len());
        let mut t = s.serialize_tuple(len)?;
        t.serialize_element(&self.state.code())?;
        t.serialize_element(&self.rps)?;
        t.serialize_element(&self.mbps)?;
        t.serialize_element(&self.conns)?;
        t.serialize_element(&self.load)?;
        t.serialize_element(&self.p50)?;
        t.serialize_element(&self.p99)?;
        t.serialize_element(&self.moves)?;
        t.serialize_element(&self.fallbacks)?;
        t.serialize_element(&self.failures)?;
        t.serialize_element(&self.targets)?;
        t.serialize_element(&self.hit)?;
        if let Some(c) = &self.coop {
            t.serialize_element(&c.replicas)?;
        }
        t.end()
    }
}

impl<'de> Deserialize<'de> for NodeRow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Row;
        impl<'de> serde::de::Visitor<'de> for Row {
            type Value = NodeRow;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(
                    f,
                    "an array of {} or {} columns",
                    COLUMNS.len(),
                    COLUMNS.len() + COOP_COLUMNS.len()
                )
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<NodeRow, A::Error> {
                use serde::de::Error;
                let mut k = 0;
                macro_rules! col {
                    () => {{
                        k += 1;
                        a.next_element()?
                            .ok_or_else(|| A::Error::invalid_length(k - 1, &self))?
                    }};
                }
                let state = State::from_code(col!());
                let mut row = NodeRow {
                    up: state == State::Up,
                    state,
                    rps: col!(),
                    mbps: col!(),
                    conns: col!(),
                    load: col!(),
                    p50: col!(),
                    p99: col!(),
                    moves: col!(),
                    fallbacks: col!(),
                    failures: col!(),
                    targets: col!(),
                    hit: col!(),
                    coop: None,
                };
                if let Some(replicas) = a.next_element()? {
                    row.coop = Some(CoopRow { replicas });
                }
                if a.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(A::Error::invalid_length(COLUMNS.len() + 2, &self));
                }
                Ok(row)
            }
        }
        d.deserialize_seq(Row)
    }
}

/// One update for the whole cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Update {
    /// Seconds since the sender started.
    pub t: Num,
    /// The generation of the node list the rows follow.
    pub g: u64,
    /// Totals.
    pub c: Totals,
    /// Fallbacks so far by reason (reasons seen only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fb: BTreeMap<String, u64>,
    /// The target map.
    pub map: MapSummary,
    /// The nodes, in the order of the meta's `nodes`.
    pub n: Vec<NodeRow>,
    /// The site's rescue state and relationships, with `[rescue.peering]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r: Option<RescueBrief>,
}

/// What [`Sampler::step`] produces.
#[derive(Clone, Debug)]
pub struct Step {
    /// The node list and columns; a new one when `meta_changed`.
    pub meta: Arc<Meta>,
    /// Whether `meta` differs from the previous step's.
    pub meta_changed: bool,
    /// The update.
    pub update: Update,
}

/// The previous sample's counters of one node.
#[derive(Clone, Copy, Debug)]
struct Prev {
    requests: u64,
    bytes: u64,
    moves: u64,
    fallbacks: u64,
    failures: u64,
    hits: u64,
    cache_reported: u64,
    hand_backs: u64,
}

/// Turns successive samples into updates. Pure: time comes with each sample.
#[derive(Debug)]
pub struct Sampler {
    kind: String,
    interval: Duration,
    latency_window: Duration,
    last: Option<(Duration, HashMap<String, Prev>, u64)>,
    /// Latency snapshots of the window, oldest first.
    latencies: VecDeque<(Duration, HashMap<String, LatencyCounts>)>,
    meta: Option<Arc<Meta>>,
}

/// Counter increase from `before` to `now`; a counter that went down was reset, and counts
/// from zero.
fn increase(now: u64, before: u64) -> u64 {
    now.checked_sub(before).unwrap_or(now)
}

fn ms(d: Duration) -> Num {
    Num::round(d.as_secs_f64() * 1000.0)
}

impl Sampler {
    /// A sampler for a process of `kind` sampling every `interval`; response-time quantiles
    /// cover the last `latency_window`.
    pub fn new(kind: &str, interval: Duration, latency_window: Duration) -> Self {
        Sampler {
            kind: kind.to_owned(),
            interval,
            latency_window,
            last: None,
            latencies: VecDeque::new(),
            meta: None,
        }
    }

    /// The update for `s`: rates over the time since the previous sample (zero for the first
    /// one, or when no time passed), quantiles over the latency window.
    pub fn step(&mut self, s: &ClusterSample) -> Step {
        let meta = Meta {
            kind: self.kind.clone(),
            policy: s.policy.clone(),
            mechanism: s.mechanism.clone(),
            generation: s.generation,
            interval_ms: self.interval.as_millis() as u64,
            cols: COLUMNS
                .iter()
                .chain(if self.kind == COOPERATIVE {
                    &COOP_COLUMNS[..]
                } else {
                    &[]
                })
                .map(|c| (*c).to_owned())
                .collect(),
            nodes: s.nodes.iter().map(|n| n.name.clone()).collect(),
            site: s.rescue.as_ref().map(RescueSite::of),
        };
        let meta_changed = self.meta.as_deref() != Some(&meta);
        if meta_changed {
            self.meta = Some(Arc::new(meta));
        }
        let meta = self.meta.clone().expect("set above");

        let (dt, prev, prev_fb) = match &self.last {
            Some((at, prev, fb)) if s.at > *at => ((s.at - *at).as_secs_f64(), Some(prev), *fb),
            _ => (0.0, None, 0),
        };
        let per_s = |n: u64| if dt > 0.0 { n as f64 / dt } else { 0.0 };

        // The latency window: drop snapshots while the next one is old enough to be the base.
        let start = s.at.saturating_sub(self.latency_window);
        while self.latencies.len() > 1 && self.latencies[1].0 <= start {
            self.latencies.pop_front();
        }
        let base = self.latencies.front().map(|(_, m)| m);

        let mut totals = Totals {
            conns: s.connections,
            queue: s.queue,
            ..Totals::default()
        };
        let (mut rps, mut bps, mut moves, mut backs) = (0.0, 0.0, 0.0, 0.0);
        let rows = s
            .nodes
            .iter()
            .map(|n| {
                let p = prev.and_then(|p| p.get(&n.name));
                let d = match p {
                    Some(p) => [
                        increase(n.requests, p.requests),
                        increase(n.bytes, p.bytes),
                        increase(n.moves, p.moves),
                        increase(n.fallbacks, p.fallbacks),
                        increase(n.failures, p.failures),
                        increase(n.hits, p.hits),
                        increase(n.cache_reported, p.cache_reported),
                    ],
                    None => [0; 7],
                };
                let (r, b, m) = (per_s(d[0]), per_s(d[1]), per_s(d[2]));
                rps += r;
                bps += b;
                moves += m;
                let window = base
                    .and_then(|m| m.get(&n.name))
                    .and_then(|old| latency::delta(&n.latency, old));
                let state = match (n.held, n.in_flight) {
                    (Some(Hold::Drain), 0) => State::Drained,
                    (Some(Hold::Drain), _) => State::Draining,
                    (Some(Hold::Down), _) => State::Held,
                    (None, _) if n.up => State::Up,
                    (None, _) => State::Down,
                };
                NodeRow {
                    up: state == State::Up,
                    state,
                    rps: Num::round(r),
                    mbps: Num::round(b / 1e6),
                    conns: n.connections.unwrap_or(n.in_flight),
                    load: Num::round(n.load),
                    p50: window
                        .as_ref()
                        .and_then(|w| latency::quantile(w, 0.5))
                        .map(ms),
                    p99: window
                        .as_ref()
                        .and_then(|w| latency::quantile(w, 0.99))
                        .map(ms),
                    moves: Num::round(m),
                    fallbacks: Num::round(per_s(d[3])),
                    failures: Num::round(per_s(d[4])),
                    targets: n.targets,
                    hit: (d[6] > 0).then(|| Num::round(100.0 * d[5] as f64 / d[6] as f64)),
                    coop: n.coop.map(|c| {
                        backs += per_s(p.map_or(0, |p| increase(c.hand_backs, p.hand_backs)));
                        CoopRow {
                            replicas: c.replicas,
                        }
                    }),
                }
            })
            .collect();
        let fb_total: u64 = s.fallbacks.values().sum();
        totals.rps = Num::round(rps);
        totals.mbps = Num::round(bps / 1e6);
        totals.moves = Num::round(moves);
        totals.backs = (self.kind == COOPERATIVE).then(|| Num::round(backs));
        totals.fb = Num::round(if prev.is_some() {
            per_s(increase(fb_total, prev_fb))
        } else {
            0.0
        });
        let hot = s
            .hot
            .iter()
            .take(HOT_LISTED)
            .map(|h| HotRow(h.target.clone(), h.node, Num::round(per_s(h.count))))
            .collect();

        self.latencies.push_back((
            s.at,
            s.nodes
                .iter()
                .map(|n| (n.name.clone(), n.latency))
                .collect(),
        ));
        self.last = Some((
            s.at,
            s.nodes
                .iter()
                .map(|n| {
                    (
                        n.name.clone(),
                        Prev {
                            requests: n.requests,
                            bytes: n.bytes,
                            moves: n.moves,
                            fallbacks: n.fallbacks,
                            failures: n.failures,
                            hits: n.hits,
                            cache_reported: n.cache_reported,
                            hand_backs: n.coop.map_or(0, |c| c.hand_backs),
                        },
                    )
                })
                .collect(),
            fb_total,
        ));
        Step {
            meta,
            meta_changed,
            update: Update {
                t: Num::round((s.at.as_secs_f64() * 10.0).round() / 10.0),
                g: s.generation,
                c: totals,
                fb: s
                    .fallbacks
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, n)| (k.clone(), *n))
                    .collect(),
                map: MapSummary {
                    mapped: s.targets_mapped,
                    replicas: s.replicas,
                    hot,
                },
                n: rows,
                r: s.rescue.as_ref().map(RescueBrief::of),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(v: f64) -> Duration {
        Duration::from_secs_f64(v)
    }

    fn sample(at: f64, nodes: Vec<NodeSample>) -> ClusterSample {
        ClusterSample {
            at: secs(at),
            generation: 1,
            policy: "lard".into(),
            mechanism: "handoff".into(),
            connections: 3,
            queue: 0,
            fallbacks: BTreeMap::new(),
            targets_mapped: 10,
            replicas: 1,
            hot: Vec::new(),
            nodes,
            rescue: None,
        }
    }

    fn node(name: &str, requests: u64, bytes: u64) -> NodeSample {
        NodeSample {
            requests,
            bytes,
            ..NodeSample::new(name)
        }
    }

    #[test]
    fn numbers_carry_three_significant_digits() {
        let enc = |v: f64| serde_json::to_string(&Num(v)).unwrap();
        assert_eq!(enc(5123.4), "5120");
        assert_eq!(enc(1.2345), "1.23");
        assert_eq!(enc(0.045678), "0.0457");
        assert_eq!(enc(0.0), "0");
        assert_eq!(enc(f64::NAN), "0");
        assert_eq!(enc(1.25e9), "1250000000");
        assert_eq!(enc(-12.34), "-12.3");
        let back: Num = serde_json::from_str("1.23").unwrap();
        assert_eq!(back, Num(1.23));
    }

    #[test]
    fn the_hit_share_is_of_the_responses_whose_source_was_reported() {
        let mut s = Sampler::new("switch", secs(1.0), secs(5.0));
        let with = |requests, reported, hits| NodeSample {
            cache_reported: reported,
            hits,
            ..node("a", requests, 0)
        };
        let first = s.step(&sample(1.0, vec![with(100, 50, 10)]));
        assert_eq!(
            first.update.n[0].hit, None,
            "no share without a previous sample"
        );
        // 100 more requests, 80 of them reported, 60 of those from the cache.
        let second = s.step(&sample(2.0, vec![with(200, 130, 70)]));
        assert_eq!(second.update.n[0].hit, Some(Num(75.0)));
        // Requests, none reported: no share rather than 0%.
        let third = s.step(&sample(3.0, vec![with(300, 130, 70)]));
        assert_eq!(third.update.n[0].hit, None);
        let text = serde_json::to_string(&second.update).unwrap();
        let back: Update = serde_json::from_str(&text).unwrap();
        assert_eq!(back.n[0].hit, Some(Num(75.0)));
        assert_eq!(COLUMNS.last(), Some(&"hit"));
    }

    #[test]
    fn an_operator_s_hold_shows_in_the_up_column() {
        let mut s = Sampler::new("switch", secs(1.0), secs(5.0));
        let held = |held, in_flight, up| NodeSample {
            held,
            in_flight,
            up,
            ..node("a", 0, 0)
        };
        let rows = s
            .step(&sample(
                1.0,
                vec![
                    held(None, 0, true),
                    held(None, 0, false),
                    held(Some(Hold::Drain), 2, false),
                    held(Some(Hold::Drain), 0, false),
                    held(Some(Hold::Down), 1, false),
                ],
            ))
            .update
            .n;
        let states: Vec<State> = rows.iter().map(|r| r.state).collect();
        assert_eq!(
            states,
            [
                State::Up,
                State::Down,
                State::Draining,
                State::Drained,
                State::Held
            ]
        );
        let text = serde_json::to_string(&rows).unwrap();
        assert!(text.starts_with("[[1,") && text.contains("],[4,"), "{text}");
        let back: Vec<NodeRow> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, rows);
        assert!(back[0].up && !back[2].up);
        // A row of the wrong length is refused.
        assert!(serde_json::from_str::<NodeRow>("[1,2,3]").is_err());
    }

    #[test]
    fn rates_come_from_the_difference_of_two_samples() {
        let mut s = Sampler::new("switch", secs(1.0), secs(5.0));
        let first = s.step(&sample(10.0, vec![node("a", 100, 1000), node("b", 0, 0)]));
        assert!(first.meta_changed);
        assert_eq!(first.meta.nodes, vec!["a", "b"]);
        assert_eq!(
            first.update.n[0].rps,
            Num(0.0),
            "no rate without a previous sample"
        );
        let second = s.step(&sample(10.5, vec![node("a", 150, 6000), node("b", 10, 10)]));
        assert!(!second.meta_changed);
        assert_eq!(second.update.n[0].rps, Num(100.0));
        assert_eq!(second.update.n[0].mbps, Num(0.01));
        assert_eq!(second.update.n[1].rps, Num(20.0));
        assert_eq!(second.update.c.rps, Num(120.0));
        assert_eq!(second.update.c.mbps, Num(0.01));
        assert_eq!(second.update.c.conns, 3);
        assert_eq!(second.update.t, Num(10.5));
        // The same instant again: no time passed, no rate.
        let same = s.step(&sample(10.5, vec![node("a", 160, 6000), node("b", 10, 10)]));
        assert_eq!(same.update.c.rps, Num(0.0));
    }

    #[test]
    fn nodes_follow_their_names_across_a_new_node_list() {
        let mut s = Sampler::new("switch", secs(1.0), secs(5.0));
        s.step(&sample(1.0, vec![node("a", 10, 0), node("b", 10, 0)]));
        let mut next = sample(2.0, vec![node("b", 30, 0), node("c", 5, 0)]);
        next.generation = 2;
        let st = s.step(&next);
        assert!(st.meta_changed);
        assert_eq!(st.meta.nodes, vec!["b", "c"]);
        assert_eq!(st.meta.generation, 2);
        assert_eq!(st.update.n[0].rps, Num(20.0), "b keeps its history");
        assert_eq!(st.update.n[1].rps, Num(0.0), "c is new");
        // A counter that went down (a node replaced under the same name) counts from zero.
        let st = s.step(&sample(3.0, vec![node("b", 4, 0), node("c", 5, 0)]));
        assert_eq!(st.update.n[0].rps, Num(4.0));
    }

    #[test]
    fn quantiles_cover_the_latency_window_only() {
        let mut s = Sampler::new("switch", secs(1.0), secs(2.0));
        let h = LatencyHistogram::default();
        let at = |t: f64, h: &LatencyHistogram| {
            let mut n = node("a", 0, 0);
            n.latency = h.snapshot();
            sample(t, vec![n])
        };
        assert_eq!(s.step(&at(0.0, &h)).update.n[0].p99, None);
        for _ in 0..100 {
            h.observe(Duration::from_millis(200));
        }
        let st = s.step(&at(1.0, &h));
        let p99 = st.update.n[0].p99.unwrap().0;
        assert!((133.0..=300.0).contains(&p99), "{p99}");
        for _ in 0..100 {
            h.observe(Duration::from_millis(2));
        }
        // Window [1, 3]: only the fast responses.
        s.step(&at(2.0, &h));
        let st = s.step(&at(3.0, &h));
        let p50 = st.update.n[0].p50.unwrap().0;
        assert!((1.3..=3.0).contains(&p50), "{p50}");
        // Nothing observed during the window: no quantile.
        s.step(&at(4.0, &h));
        assert_eq!(s.step(&at(5.0, &h)).update.n[0].p50, None);
    }

    #[test]
    fn fallbacks_moves_and_hot_targets() {
        let mut s = Sampler::new("switch", secs(1.0), secs(5.0));
        let mut a = sample(0.0, vec![node("a", 0, 0)]);
        a.fallbacks.insert("timeout".into(), 2);
        a.fallbacks.insert("refused".into(), 0);
        s.step(&a);
        let mut b = sample(2.0, vec![node("a", 0, 0)]);
        b.nodes[0].moves = 40;
        b.nodes[0].fallbacks = 6;
        b.nodes[0].failures = 1;
        b.nodes[0].in_flight = 7;
        b.fallbacks.insert("timeout".into(), 6);
        b.fallbacks.insert("refused".into(), 0);
        b.hot = vec![HotCount {
            target: "/p1".into(),
            node: 0,
            count: 30,
            error: 0,
        }];
        let u = s.step(&b).update;
        assert_eq!(u.c.fb, Num(2.0));
        assert_eq!(u.n[0].moves, Num(20.0));
        assert_eq!(u.n[0].fallbacks, Num(3.0));
        assert_eq!(u.n[0].failures, Num(0.5));
        assert_eq!(u.n[0].conns, 7, "in flight when the node does not report");
        assert_eq!(u.fb.len(), 1, "only reasons seen: {:?}", u.fb);
        assert_eq!(u.map.hot, vec![HotRow("/p1".into(), 0, Num(15.0))]);
        assert_eq!((u.map.mapped, u.map.replicas), (10, 1));
    }

    /// The update of a busy 64-node cluster encodes under 4 KB and reads back: each node
    /// near 10,000 requests/s and 100 MB/s (about 630,000 requests/s and 6 GB/s in all),
    /// thousands of connections and targets, a slow tail, moves, fallbacks and failures every
    /// second, three fallback reasons, and the hot targets at the longest kept length.
    #[test]
    fn an_update_for_64_busy_nodes_is_under_4_kb() {
        let mut s = Sampler::new("switch", secs(1.0), secs(5.0));
        let busy = |k: u64| {
            let nodes = (0..64)
                .map(|i| {
                    let h = LatencyHistogram::default();
                    for j in 0..(200 * k) {
                        h.observe(Duration::from_micros(700 + 13 * (j % 97) + i));
                    }
                    h.observe(Duration::from_millis(4321));
                    NodeSample {
                        up: i % 7 != 3,
                        requests: k * 9_876 + i,
                        bytes: k * 98_765_432,
                        in_flight: 987,
                        connections: Some(9_876),
                        load: 987.6,
                        moves: k * 9_876,
                        fallbacks: k * 3,
                        failures: k,
                        targets: 9_876,
                        cache_reported: k * 9_876 + i,
                        hits: k * 9_000 + i,
                        latency: h.snapshot(),
                        ..NodeSample::new(format!("10.0.{}.{}:8080", i / 250, i % 250))
                    }
                })
                .collect();
            let mut c = sample(86_400.0 + k as f64 * 1.0003, nodes);
            c.connections = 987_654;
            c.queue = 9_876;
            c.targets_mapped = 987_654;
            c.replicas = 98_765;
            for r in ["timeout", "refused", "control_down"] {
                c.fallbacks.insert(r.into(), 9_876_543 * k);
            }
            c.hot = (0..8)
                .map(|i| HotCount {
                    target: format!("/objects/{}{i}.bin", "x".repeat(hot::MAX_TARGET_BYTES - 14)),
                    node: 63,
                    count: 12_345 * k,
                    error: 0,
                })
                .collect();
            // A site rescued by as many servers as are listed, every name at the longest kept.
            let mut r = rescue::tests::status(rescue::LISTED + 2, 0);
            let long = |s: &str| format!("{s}{}", "y".repeat(rescue::MAX_NAME_BYTES));
            r.server_name = long(&r.server_name);
            for e in &mut r.rescuers {
                e.alias = long(&e.alias);
                e.d_redi_kbps = 98_765;
                e.d_redi = 98_765_432.1;
            }
            r.d_out = 987_654_321.0;
            r.d_out_max = 987_654_321.0;
            r.r_redi = 98_765.4;
            c.rescue = Some(r);
            c
        };
        s.step(&busy(1));
        let u = s.step(&busy(2)).update;
        let text = serde_json::to_string(&u).unwrap();
        assert!(text.len() < 4096, "{} bytes: {text}", text.len());
        assert_eq!(u.n.len(), 64);
        assert!(u.n[0].p99.is_some() && u.n[0].rps.0 > 9_000.0 && u.n[0].mbps.0 > 90.0);
        assert_eq!(u.map.hot[0].0.len(), hot::MAX_TARGET_BYTES);
        let back: Update = serde_json::from_str(&text).unwrap();
        assert_eq!(back.n.len(), 64);
        assert_eq!(back.map.hot.len(), HOT_LISTED);
        assert!(!back.n[3].up && back.n[4].up);
        assert_eq!(back.n[0].conns, 9_876);
        let r = back.r.expect("the rescue part");
        assert_eq!(
            (r.st.as_str(), r.rs.len(), r.more),
            ("sos", rescue::LISTED, 2)
        );
        assert_eq!(r.rs[0].1.len(), rescue::MAX_NAME_BYTES);
        assert_eq!(r.rr, Num(98_800.0));
    }

    #[test]
    fn the_rescue_part_comes_only_with_a_rescue_driver() {
        let mut s = Sampler::new("switch", secs(1.0), secs(5.0));
        let plain = s.step(&sample(1.0, vec![node("a", 0, 0)])).update;
        assert_eq!(plain.r, None);
        let text = serde_json::to_string(&plain).unwrap();
        assert!(!text.contains("\"r\""), "{text}");
        let mut with = sample(2.0, vec![node("a", 0, 0)]);
        with.rescue = Some(rescue::tests::status(1, 0));
        let st = s.step(&with);
        assert!(
            st.meta_changed,
            "the site's name and peers come in a new meta"
        );
        let site = st.meta.site.as_ref().expect("the site in the meta");
        assert_eq!(
            (site.name.as_str(), site.max),
            ("www.origin.test", Num(200.0))
        );
        let u = st.update;
        let r = u.r.as_ref().expect("a rescue part");
        assert_eq!((r.st.as_str(), r.rs[0].2), ("sos", Num(90.0)));
        let text = serde_json::to_string(&u).unwrap();
        assert_eq!(serde_json::from_str::<Update>(&text).unwrap(), u);
    }
}
