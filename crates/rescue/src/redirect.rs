//! Which requests an origin redirects, and to which rescue server (seed 001 §4.2, §4.4.4,
//! §5.4.2). Pure and deterministic: the request path calls [`Redirector::route`] for each
//! request; the core hands it a new [`RedirectPlan`] every control interval and whenever its
//! rescue servers or their D_redi change.
//!
//! * **Whether.** The origin redirects a request when serving it would take its outbound bytes
//!   in the current interval past T_redi × D_out × I_ctrl, T_redi being the dynamic threshold
//!   of §4.4.4 (in the plan): it serves its own share of each interval first and redirects the
//!   rest, so its data rate stays at T_redi × D_out plus the redirects' own cost, and redirects
//!   begin at the first load whose d_out would pass T_redi × D_out. Never redirected: the status page and
//!   requests from a rescue server's address (its proxy fetches, §5.4.2).
//! * **At most D_out / A_redi.** An interval holds at most ⌊D_out × I_ctrl / A_redi⌋ redirects
//!   (§4.4.4's bound); beyond it the origin has no capacity left even for redirects, and
//!   [`Route::Refuse`] lets the request path answer 503.
//! * **Within D_redi.** Each rescue server S_r has a budget of D_redi(S_o, S_r) × I_ctrl bytes of
//!   redirected files per interval (the origin keeps d_redi(S_r) below D_redi); a server whose
//!   budget cannot take the file is passed over. When none can, the origin serves the request
//!   itself ([`Route::Serve`]; counted in [`RedirectStats::no_budget`]).
//! * **Small files: weighted round robin** on D_redi (§4.2), the smooth variant: in any run of
//!   picks each server gets its share of the weights, interleaved. (§5.4.2 says "least loaded"
//!   instead; the weighted round robin is what gives Fig. 11 its rescue rates in proportion to
//!   capacity, and the budgets already keep any server from being overloaded.)
//! * **Large files** (at least `large_file_bytes`): consistent hashing of the path (§4.2), so a
//!   large file keeps going to the server that has cached it; "constrained by load": the walk
//!   clockwise from the path's point takes the first server whose budget can take the file.
//!   Every server has the same number of ring points, so a change of D_redi moves nothing, and
//!   a server leaving moves only its own files.

use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;

use crate::config::RescueConfig;
use crate::PeerId;

/// One rescue server as the request path sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedirectTarget {
    /// The rescue server.
    pub peer: PeerId,
    /// The virtual host name it gave this origin.
    pub alias: String,
    /// Its address (requests from it are never redirected).
    pub ip: IpAddr,
    /// Its web port.
    pub port: u16,
    /// D_redi(S_o, S_r), bytes per second.
    pub d_redi: f64,
}

impl RedirectTarget {
    /// The redirect's `Location` for `path`: `http://<alias>:<port><path>` (§5.4.2), the port
    /// left out when it is 80.
    pub fn location(&self, path: &str) -> String {
        if self.port == 80 {
            format!("http://{}{}", self.alias, path)
        } else {
            format!("http://{}:{}{}", self.alias, self.port, path)
        }
    }
}

/// What the origin's redirector works with during one control interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedirectPlan {
    /// The interval's number; budgets restart when it changes.
    pub interval: u64,
    /// I_ctrl.
    pub interval_len: Duration,
    /// D_out, bytes per second.
    pub d_out: f64,
    /// T_redi.
    pub t_redi: f64,
    /// A_redi, bytes.
    pub a_redi: f64,
    /// The active rescue servers, by peer id.
    pub targets: Vec<RedirectTarget>,
}

impl RedirectPlan {
    /// Whether any rescue server is active.
    pub fn is_active(&self) -> bool {
        !self.targets.is_empty()
    }

    /// Outbound bytes per interval above which requests are redirected.
    pub fn threshold_bytes(&self) -> f64 {
        self.t_redi * self.d_out * self.interval_len.as_secs_f64()
    }

    /// Most redirects in one interval: ⌊D_out × I_ctrl / A_redi⌋.
    pub fn max_redirects(&self) -> u64 {
        (self.d_out * self.interval_len.as_secs_f64() / self.a_redi).floor() as u64
    }
}

/// One request, as far as redirection cares.
#[derive(Debug, Clone, Copy)]
pub struct RouteQuery<'a> {
    /// The client's address.
    pub client: IpAddr,
    /// The request's path (the consistent-hashing key).
    pub path: &'a str,
    /// The size of the file it asks for, bytes.
    pub size: u64,
}

/// The redirector's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Route<'a> {
    /// Serve it here.
    Serve,
    /// Redirect it to this rescue server; count it with [`crate::Meter::redirected`].
    Redirect(&'a RedirectTarget),
    /// The origin has reached its redirect bound for this interval: answer 503.
    Refuse,
}

/// Counters of the redirector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RedirectStats {
    /// Requests redirected.
    pub redirected: u64,
    /// Of those, large files placed by consistent hashing.
    pub by_hash: u64,
    /// Of those, large files that went past their home server for lack of budget.
    pub spilled: u64,
    /// Requests above the threshold that no rescue server had budget for.
    pub no_budget: u64,
    /// Requests refused at the redirect bound.
    pub refused: u64,
}

/// Redirect selection for an origin. See the module documentation.
#[derive(Debug, Clone)]
pub struct Redirector {
    status_path: String,
    large_file_bytes: u64,
    points: u32,
    plan: Option<RedirectPlan>,
    /// Per target (same order as `plan.targets`): bytes redirected this interval.
    sent: Vec<u64>,
    /// Per target: the smooth-WRR current weight.
    current: Vec<f64>,
    redirects: u64,
    /// (ring position, target index), sorted.
    ring: Vec<(u64, usize)>,
    stats: RedirectStats,
}

impl Redirector {
    /// A redirector with nothing to redirect to.
    pub fn new(cfg: &RescueConfig) -> Self {
        Redirector {
            status_path: cfg.status_path.clone(),
            large_file_bytes: cfg.large_file_bytes,
            points: cfg.chash_points,
            plan: None,
            sent: Vec::new(),
            current: Vec::new(),
            redirects: 0,
            ring: Vec::new(),
            stats: RedirectStats::default(),
        }
    }

    /// The plan in force.
    pub fn plan(&self) -> Option<&RedirectPlan> {
        self.plan.as_ref()
    }

    /// The counters.
    pub fn stats(&self) -> RedirectStats {
        self.stats
    }

    /// Bytes redirected to `peer` in the current interval.
    pub fn sent(&self, peer: PeerId) -> u64 {
        self.index(peer).map_or(0, |i| self.sent[i])
    }

    /// Redirects in the current interval.
    pub fn redirects(&self) -> u64 {
        self.redirects
    }

    fn index(&self, peer: PeerId) -> Option<usize> {
        self.plan
            .as_ref()?
            .targets
            .binary_search_by_key(&peer, |t| t.peer)
            .ok()
    }

    /// Puts a plan in force. A plan for a new interval restarts the budgets; one for the same
    /// interval (a rescue server joined, left or sent RATE) keeps what was already redirected.
    pub fn apply(&mut self, mut plan: RedirectPlan) {
        plan.targets.sort_by_key(|t| t.peer);
        plan.targets.dedup_by_key(|t| t.peer);
        let same_interval = self.plan.as_ref().map(|p| p.interval) == Some(plan.interval);
        let mut sent = vec![0; plan.targets.len()];
        let mut current = vec![0.0; plan.targets.len()];
        for (i, t) in plan.targets.iter().enumerate() {
            if let Some(j) = self.index(t.peer) {
                if same_interval {
                    sent[i] = self.sent[j];
                }
                current[i] = self.current[j];
            }
        }
        let same_members = self.plan.as_ref().is_some_and(|p| {
            p.targets.len() == plan.targets.len()
                && p.targets
                    .iter()
                    .zip(&plan.targets)
                    .all(|(a, b)| a.peer == b.peer)
        });
        if !same_interval {
            self.redirects = 0;
        }
        self.sent = sent;
        self.current = current;
        if !same_members {
            self.ring.clear();
            for (i, t) in plan.targets.iter().enumerate() {
                for k in 0..self.points {
                    self.ring.push((point_hash(t.peer.0, k), i));
                }
            }
            let targets = &plan.targets;
            self.ring
                .sort_unstable_by_key(|&(h, i)| (h, targets[i].peer));
        }
        self.plan = Some(plan);
    }

    /// Decides one request; `out_bytes` is the origin's outbound bytes so far in this interval
    /// ([`crate::Meter::out_bytes`]), before this request. A `Redirect` has already been charged to the server's
    /// budget.
    pub fn route(&mut self, q: &RouteQuery<'_>, out_bytes: u64) -> Route<'_> {
        let Some(plan) = self.plan.as_ref() else {
            return Route::Serve;
        };
        if plan.targets.is_empty()
            || q.path == self.status_path
            || plan.targets.iter().any(|t| t.ip == q.client)
            || (out_bytes.saturating_add(q.size) as f64) <= plan.threshold_bytes()
        {
            return Route::Serve;
        }
        if self.redirects >= plan.max_redirects() {
            self.stats.refused += 1;
            return Route::Refuse;
        }
        let secs = plan.interval_len.as_secs_f64();
        let fits = |i: usize, sent: &[u64]| {
            let t = &plan.targets[i];
            t.d_redi > 0.0 && (sent[i].saturating_add(q.size)) as f64 <= t.d_redi * secs
        };
        let pick = if q.size >= self.large_file_bytes {
            let len = self.ring.len();
            let start = self.ring.partition_point(|&(p, _)| p < key_hash(q.path)) % len.max(1);
            let home = self.ring.get(start).map(|&(_, i)| i);
            let found = (0..len)
                .map(|k| self.ring[(start + k) % len].1)
                .find(|&i| fits(i, &self.sent));
            if let Some(i) = found {
                self.stats.by_hash += 1;
                if Some(i) != home {
                    self.stats.spilled += 1;
                }
            }
            found
        } else {
            // Smooth weighted round robin over the servers whose budget can take the file.
            let mut total = 0.0;
            let mut best: Option<usize> = None;
            for i in 0..plan.targets.len() {
                if !fits(i, &self.sent) {
                    continue;
                }
                let w = plan.targets[i].d_redi;
                self.current[i] += w;
                total += w;
                if best.is_none_or(|b| self.current[i] > self.current[b]) {
                    best = Some(i);
                }
            }
            if let Some(b) = best {
                self.current[b] -= total;
            }
            best
        };
        match pick {
            Some(i) => {
                self.sent[i] = self.sent[i].saturating_add(q.size);
                self.redirects += 1;
                self.stats.redirected += 1;
                Route::Redirect(&plan.targets[i])
            }
            None => {
                self.stats.no_budget += 1;
                Route::Serve
            }
        }
    }
}

/// 64-bit FNV-1a followed by the SplitMix64 finalizer: stable across platforms and releases, so
/// that every process places a path on the same rescue server.
fn key_hash(path: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in path.as_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn point_hash(peer: u32, k: u32) -> u64 {
    mix(mix(peer as u64) ^ (k as u64).wrapping_mul(0x2545_f491_4f6c_dd1d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RescueConfig {
        let mut c = RescueConfig::new("www.origin.com", [1, 2, 3, 4].into(), 80, 1250.0);
        c.large_file_bytes = 100_000;
        c
    }

    fn target(peer: u32, d_redi_kbps: f64) -> RedirectTarget {
        RedirectTarget {
            peer: PeerId(peer),
            alias: format!("r{peer}-vh1.example"),
            ip: [10, 0, 0, peer as u8].into(),
            port: 8080,
            d_redi: d_redi_kbps * 1000.0,
        }
    }

    fn plan(interval: u64, t_redi: f64, targets: Vec<RedirectTarget>) -> RedirectPlan {
        RedirectPlan {
            interval,
            interval_len: Duration::from_secs(1),
            d_out: 1_000_000.0,
            t_redi,
            a_redi: 468.0,
            targets,
        }
    }

    fn q(path: &str, size: u64) -> RouteQuery<'_> {
        RouteQuery {
            client: [192, 0, 2, 1].into(),
            path,
            size,
        }
    }

    fn peer_of(r: Route<'_>) -> Option<u32> {
        match r {
            Route::Redirect(t) => Some(t.peer.0),
            _ => None,
        }
    }

    #[test]
    fn serves_below_the_threshold_and_redirects_above() {
        let mut r = Redirector::new(&cfg());
        assert_eq!(r.route(&q("/a", 10), u64::MAX), Route::Serve, "no plan");
        r.apply(plan(1, 0.75, vec![target(1, 1000.0)]));
        // Serving it must keep the interval within T_redi × D_out × I_ctrl = 750 000 bytes.
        assert_eq!(r.route(&q("/a", 10), 749_990), Route::Serve);
        assert_eq!(peer_of(r.route(&q("/a", 10), 749_991)), Some(1));
        // Status page and the rescue server's own fetches stay here.
        assert_eq!(
            r.route(&q("/dotslash-status", 10), 10_000_000),
            Route::Serve
        );
        let from_rescuer = RouteQuery {
            client: [10, 0, 0, 1].into(),
            ..q("/a", 10)
        };
        assert_eq!(r.route(&from_rescuer, 10_000_000), Route::Serve);
        // T_redi = 0: everything goes, the first request of an interval too.
        r.apply(plan(2, 0.0, vec![target(1, 1000.0)]));
        assert_eq!(peer_of(r.route(&q("/a", 10), 1)), Some(1));
        assert_eq!(peer_of(r.route(&q("/a", 10), 0)), Some(1));
    }

    #[test]
    fn weighted_round_robin_follows_d_redi() {
        let mut r = Redirector::new(&cfg());
        r.apply(plan(1, 0.0, vec![target(1, 300.0), target(2, 100.0)]));
        let picks: Vec<u32> = (0..8)
            .map(|_| peer_of(r.route(&q("/s", 1000), 1)).unwrap())
            .collect();
        assert_eq!(picks, [1, 1, 2, 1, 1, 1, 2, 1]);
    }

    #[test]
    fn budgets_hold_d_redi_per_interval() {
        let mut r = Redirector::new(&cfg());
        r.apply(plan(1, 0.0, vec![target(1, 10.0), target(2, 5.0)]));
        let mut n = [0u32; 3];
        for _ in 0..20 {
            match peer_of(r.route(&q("/s", 1000), 1)) {
                Some(p) => n[p as usize] += 1,
                None => n[0] += 1,
            }
        }
        assert_eq!(n, [5, 10, 5]);
        assert_eq!(r.sent(PeerId(1)), 10_000);
        assert_eq!(r.stats().no_budget, 5);
        // RATE within the interval keeps what was sent; a new interval restarts.
        let mut p = plan(1, 0.0, vec![target(1, 11.0), target(2, 5.0)]);
        r.apply(p.clone());
        assert_eq!(peer_of(r.route(&q("/s", 1000), 1)), Some(1));
        assert_eq!(r.route(&q("/s", 1000), 1), Route::Serve);
        p.interval = 2;
        r.apply(p);
        assert_eq!(r.sent(PeerId(1)), 0);
        assert!(peer_of(r.route(&q("/s", 1000), 1)).is_some());
    }

    #[test]
    fn redirect_bound_refuses() {
        let mut r = Redirector::new(&cfg());
        let mut p = plan(1, 0.0, vec![target(1, 1e9)]);
        p.d_out = 4680.0;
        r.apply(p);
        for _ in 0..10 {
            assert!(peer_of(r.route(&q("/s", 1), 1)).is_some());
        }
        assert_eq!(r.route(&q("/s", 1), 1), Route::Refuse);
        assert_eq!(r.stats().refused, 1);
    }

    #[test]
    fn large_files_stick_to_their_server_and_spill_when_full() {
        let mut r = Redirector::new(&cfg());
        let targets: Vec<_> = (1..=4).map(|p| target(p, 1000.0)).collect();
        r.apply(plan(1, 0.0, targets.clone()));
        let home: Vec<u32> = (0..20)
            .map(|i| {
                r.apply(plan(1000 + i, 0.0, targets.clone()));
                peer_of(r.route(&q(&format!("/big/{i}"), 200_000), 1)).unwrap()
            })
            .collect();
        // Same again in the next interval: same servers.
        r.apply(plan(2, 0.0, targets.clone()));
        for (i, h) in home.iter().enumerate() {
            let p = peer_of(r.route(&q(&format!("/big/{i}"), 200_000), 1)).unwrap();
            assert_eq!(p, *h);
            r.apply(plan(3 + i as u64, 0.0, targets.clone()));
        }
        assert!(home.iter().collect::<std::collections::BTreeSet<_>>().len() > 1);
        // One hot large file: 5 fit in its home's budget, then the walk moves on.
        r.apply(plan(100, 0.0, targets.clone()));
        let picks: Vec<u32> = (0..12)
            .map(|_| peer_of(r.route(&q("/big/0", 200_000), 1)).unwrap())
            .collect();
        assert!(picks[..5].iter().all(|&p| p == home[0]));
        assert!(picks[5..].iter().all(|&p| p != home[0]));
        assert_eq!(r.stats().spilled, 7);
        // A server leaving moves only its own files.
        let gone = home[0];
        let rest: Vec<_> = targets.into_iter().filter(|t| t.peer.0 != gone).collect();
        r.apply(plan(200, 0.0, rest.clone()));
        for (i, h) in home.iter().enumerate() {
            r.apply(plan(300 + i as u64, 0.0, rest.clone()));
            let p = peer_of(r.route(&q(&format!("/big/{i}"), 200_000), 1)).unwrap();
            if *h != gone {
                assert_eq!(p, *h, "/big/{i}");
            } else {
                assert_ne!(p, gone);
            }
        }
    }

    #[test]
    fn locations() {
        let t = target(1, 1.0);
        assert_eq!(
            t.location("/index.html"),
            "http://r1-vh1.example:8080/index.html"
        );
        let t = RedirectTarget { port: 80, ..t };
        assert_eq!(t.location("/a"), "http://r1-vh1.example/a");
    }

    #[test]
    fn stable_hashes() {
        // Fixed values: a change here moves every large file of every deployed origin.
        assert_eq!(key_hash("/x"), key_hash("/x"));
        assert_ne!(key_hash("/x"), key_hash("/y"));
        assert_ne!(point_hash(1, 0), point_hash(0, 1));
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
    }
}
