//! A flash-crowd rescue scenario (seed 001 §6): an origin and rescue servers with outbound link
//! rates, clients following a request-rate profile, and the real rescue core
//! (`switchyard-rescue`) deciding when to ask for help, whom to redirect to and when to let go.
//!
//! # The model
//!
//! * **Servers.** Each server is a [`switchyard_rescue::mesh::Node`] of one
//!   [`switchyard_rescue::mesh::Mesh`]: its `Core`, `Meter` and `Redirector`. Node 0 is the
//!   origin, the others are its candidates, listed with their current d_free as a registry
//!   would list them. Every I_ctrl each node ticks; protocol messages are delivered at once.
//! * **Links.** Each server's outbound link carries HTTP at D_out bytes per second, first come
//!   first served (D_out = B × U, so response bytes are charged as counted and a redirect of n
//!   bytes as its accounting size (n + 358) × U, which is what it costs on the wire).
//! * **Clients.** Requests arrive evenly spread at the profile's rate, for the scenario's files
//!   in turn. A client gives up after `timeout` (7 s, §6.2): a response that cannot start
//!   within it is not sent, one that ends after it is sent but counts as timed out. A redirected
//!   client goes to the rescue server as soon as the redirect has arrived.
//! * **Rescue servers** are reverse caching proxies: the first request for a file fetches it from
//!   the origin (on the origin's link, never redirected), later ones wait for that fetch or hit
//!   the cache.
//!
//! Requests are taken in the order they reach the origin and their whole path is placed on the
//! links at once, so a rescue server sees them in that order: a fluid approximation that is
//! exact while links are not backed up, which is the regime the rescue core aims to keep.
//!
//! A step of the profile is *overloaded* when more than 10% of its requests time out; R_max is
//! the rate of the step before the first overloaded one and D_max the highest rate of bytes
//! delivered to clients in the steps up to it (§6.2).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;
use switchyard_rescue::mesh::Mesh;
use switchyard_rescue::{
    redirect_accounting, Action, Candidate, EndReason, RescueConfig, Route, RouteQuery, State,
};

use crate::error::SimError;

/// One server of the scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerSpec {
    /// Its name (FQDN).
    pub name: String,
    /// D_out, kB/s.
    pub d_out_kbps: f64,
}

/// A rescue scenario. See the module documentation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RescueScenario {
    /// The origin.
    pub origin: ServerSpec,
    /// The rescue servers it may ask.
    pub rescuers: Vec<ServerSpec>,
    /// Whether rescue is enabled at all (without it the origin serves everything).
    pub enabled: bool,
    /// The requested files' sizes, bytes, asked for in turn.
    pub files: Vec<u64>,
    /// Response header bytes.
    pub header_bytes: u64,
    /// Size of a redirect response, bytes.
    pub redirect_bytes: u64,
    /// The rate profile: (requests per second, how long).
    pub profile: Vec<(f64, Duration)>,
    /// Idle time simulated after the profile (for the releases).
    pub tail: Duration,
    /// Client timeout.
    pub timeout: Duration,
    /// Time step of the arrivals.
    pub slice: Duration,
    /// Settings of every server's core (name, address and D_out are set per server).
    pub rescue: RescueConfig,
}

impl RescueScenario {
    /// A scenario with the paper's defaults (7 s timeout, 250-byte headers, 227-byte
    /// redirects, Table 1 settings) and the given servers, files and profile.
    pub fn new(
        origin: ServerSpec,
        rescuers: Vec<ServerSpec>,
        files: Vec<u64>,
        profile: Vec<(f64, Duration)>,
    ) -> Self {
        RescueScenario {
            rescue: RescueConfig::new(
                &origin.name,
                [10, 0, 0, 1].into(),
                80,
                origin.d_out_kbps / 0.8,
            ),
            origin,
            rescuers,
            enabled: true,
            files,
            header_bytes: 250,
            redirect_bytes: 227,
            profile,
            tail: Duration::ZERO,
            timeout: Duration::from_secs(7),
            slice: Duration::from_millis(10),
        }
    }

    /// A profile of steps `from, from + step, ..., to` requests per second, `each` long.
    pub fn steps(from: f64, to: f64, step: f64, each: Duration) -> Vec<(f64, Duration)> {
        let mut v = Vec::new();
        let mut r = from;
        while r <= to + 1e-9 {
            v.push((r, each));
            r += step;
        }
        v
    }

    fn validate(&self) -> Result<(), SimError> {
        let bad = |m: &str| Err(SimError::Config(format!("rescue scenario: {m}")));
        if self.files.is_empty() {
            return bad("no files");
        }
        if self.slice.is_zero() || self.slice > self.rescue.control_interval() {
            return bad("slice must be positive and at most I_ctrl");
        }
        if self.rescuers.len() > 250 {
            return bad("at most 250 rescue servers");
        }
        for s in std::iter::once(&self.origin).chain(&self.rescuers) {
            if !(s.d_out_kbps.is_finite() && s.d_out_kbps > 0.0) {
                return bad(&format!("{}: D_out must be positive", s.name));
            }
        }
        if self
            .profile
            .iter()
            .any(|(r, _)| !(r.is_finite() && *r >= 0.0))
        {
            return bad("request rates must be finite and not negative");
        }
        Ok(())
    }
}

/// One second of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the start.
    pub t: u64,
    /// Requests that arrived.
    pub requests: u64,
    /// Of those, redirected.
    pub redirected: u64,
    /// Of those, refused at the redirect bound.
    pub refused: u64,
    /// Of those, timed out (or not served at all).
    pub timeouts: u64,
    /// Bytes delivered to clients in time, per second.
    pub delivered_bps: f64,
    /// The origin's outbound HTTP rate as its core measured it, bytes per second.
    pub origin_bps: f64,
    /// Each rescue server's outbound rate, bytes per second.
    pub rescuer_bps: Vec<f64>,
    /// The origin's state.
    pub origin_state: State,
    /// Its number of rescue servers.
    pub rescuers: usize,
}

/// One step of the profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepResult {
    /// Requests per second.
    pub rate: f64,
    /// Requests.
    pub requests: u64,
    /// Timed out.
    pub timeouts: u64,
    /// Redirected.
    pub redirected: u64,
    /// Bytes delivered to clients in time, per second.
    pub delivered_bps: f64,
    /// More than 10% timed out.
    pub overloaded: bool,
}

/// The outcome of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RescueResult {
    /// Per second.
    pub samples: Vec<Sample>,
    /// Per profile step.
    pub steps: Vec<StepResult>,
    /// R_max, requests per second (0 if the first step is overloaded).
    pub r_max: f64,
    /// D_max, bytes per second.
    pub d_max: f64,
    /// Rescue servers (by index in the scenario's list) in the order they were added.
    pub allocations: Vec<usize>,
    /// Relationships ended, by reason, as the origin saw them.
    pub releases: BTreeMap<String, u64>,
    /// Whether every server was back in the normal state at the end.
    pub all_normal_at_end: bool,
    /// SOS requests sent by the origin.
    pub sos_sent: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Link {
    free_at: f64,
}

impl Link {
    /// Places `bytes` at `t` on a link of `rate` bytes/s; None if it could not start before
    /// `deadline`.
    fn send(&mut self, t: f64, bytes: f64, rate: f64, deadline: f64) -> Option<f64> {
        let start = self.free_at.max(t);
        if start > deadline {
            return None;
        }
        self.free_at = start + bytes / rate;
        Some(self.free_at)
    }
}

/// Runs a scenario.
pub fn simulate_rescue(scn: &RescueScenario) -> Result<RescueResult, SimError> {
    scn.validate()?;
    let n = 1 + scn.rescuers.len();
    let servers: Vec<&ServerSpec> = std::iter::once(&scn.origin).chain(&scn.rescuers).collect();
    let configs: Vec<RescueConfig> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut c = scn.rescue.clone();
            c.server_name = s.name.clone();
            c.web_ip = ip_of(i);
            c.d_out_kbps = Some(s.d_out_kbps);
            c.bandwidth_kbps = s.d_out_kbps / c.usable;
            c
        })
        .collect();
    let mut mesh =
        Mesh::new(configs, Duration::ZERO).map_err(|e| SimError::Config(e.to_string()))?;
    let rate: Vec<f64> = servers.iter().map(|s| s.d_out_kbps * 1000.0).collect();
    let usable = scn.rescue.usable;
    let redirect_cost = redirect_accounting(scn.redirect_bytes, usable) as f64;
    let timeout = scn.timeout.as_secs_f64();
    let mut links = vec![Link::default(); n];
    // Per rescue server: file index -> when its copy is complete.
    let mut cached: Vec<BTreeMap<usize, f64>> = vec![BTreeMap::new(); n];
    let paths: Vec<String> = (0..scn.files.len())
        .map(|i| format!("/file{i}.html"))
        .collect();

    let total: Duration = scn.profile.iter().map(|(_, d)| *d).sum::<Duration>() + scn.tail;
    let slice = scn.slice.as_secs_f64();
    let i_ctrl = scn.rescue.control_interval();
    let slices = (total.as_secs_f64() / slice).round() as u64;
    let per_tick = (i_ctrl.as_secs_f64() / slice).round().max(1.0) as u64;

    let mut samples: Vec<Sample> = Vec::new();
    let mut steps: Vec<StepResult> = scn
        .profile
        .iter()
        .map(|(r, _)| StepResult {
            rate: *r,
            requests: 0,
            timeouts: 0,
            redirected: 0,
            delivered_bps: 0.0,
            overloaded: false,
        })
        .collect();
    let step_ends: Vec<f64> = scn
        .profile
        .iter()
        .scan(0.0, |acc, (_, d)| {
            *acc += d.as_secs_f64();
            Some(*acc)
        })
        .collect();
    let mut delivered_per_step = vec![0.0f64; steps.len()];
    let mut arrivals = 0.0f64;
    let mut next_file = 0usize;
    // Each server's outbound bytes in the last control interval.
    let mut out_bytes = vec![0u64; n];

    for k in 0..slices {
        let t = k as f64 * slice;
        let now = Duration::from_secs_f64(t);
        let second = t.floor() as u64;
        if samples.len() as u64 <= second {
            samples.push(Sample {
                t: second,
                rescuer_bps: vec![0.0; n - 1],
                origin_state: mesh.nodes[0].core.state(),
                rescuers: mesh.nodes[0].core.rescuers().count(),
                ..Sample::default()
            });
        }
        // Control interval boundary: every node ticks, messages travel.
        if k > 0 && k % per_tick == 0 {
            let cands: Vec<Candidate> = if scn.enabled {
                (1..n)
                    .map(|j| Candidate {
                        peer: Mesh::peer(j),
                        d_free_kbps: mesh.nodes[j].core.d_free() / 1000.0,
                        domain: None,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            for (i, out) in out_bytes.iter_mut().enumerate() {
                let m = mesh.nodes[i].meter.take(now);
                *out = m.out_bytes();
                let c = if i == 0 { &cands[..] } else { &[][..] };
                mesh.tick_with(i, now, &m, c);
            }
            mesh.deliver_all(now);
            // The interval just measured belongs to the second before this one.
            let secs = i_ctrl.as_secs_f64();
            let last = samples.len().saturating_sub(2);
            if let Some(s) = samples.get_mut(last) {
                s.origin_bps = out_bytes[0] as f64 / secs;
                s.rescuer_bps = out_bytes[1..].iter().map(|b| *b as f64 / secs).collect();
                s.origin_state = mesh.nodes[0].core.state();
                s.rescuers = mesh.nodes[0].core.rescuers().count();
            }
        }
        // Arrivals in this slice.
        let step = step_ends.iter().position(|&e| t < e - 1e-12);
        let r = step.map_or(0.0, |s| scn.profile[s].0);
        arrivals += r * slice;
        while arrivals >= 1.0 {
            arrivals -= 1.0;
            let f = next_file;
            next_file = (next_file + 1) % scn.files.len();
            let size = scn.files[f];
            let full = (size + scn.header_bytes) as f64;
            let deadline = t + timeout;
            let client: IpAddr = [192, 0, 2, 1].into();
            let q = RouteQuery {
                client,
                path: &paths[f],
                size,
            };
            let node0 = &mut mesh.nodes[0];
            let route = node0.redirector.route(&q, node0.meter.out_bytes());
            let (done, redirected, refused) = match route {
                Route::Serve => {
                    let done = links[0].send(t, full, rate[0], deadline);
                    if done.is_some() {
                        node0.meter.served(full as u64);
                    }
                    (done, false, false)
                }
                Route::Refuse => (None, false, true),
                Route::Redirect(target) => {
                    let j = target.peer.0 as usize;
                    let peer = target.peer;
                    node0.meter.redirected(peer, scn.redirect_bytes, size);
                    let done = match links[0].send(t, redirect_cost, rate[0], deadline) {
                        None => None,
                        Some(at_client) => {
                            // The client asks the rescue server; a miss fetches from the origin.
                            let ready = match cached[j].get(&f) {
                                Some(&ready) => ready,
                                None => {
                                    let ready = links[0]
                                        .send(at_client, full, rate[0], f64::INFINITY)
                                        .expect("no deadline");
                                    mesh.nodes[0].meter.served(full as u64);
                                    cached[j].insert(f, ready);
                                    ready
                                }
                            };
                            let start = at_client.max(ready);
                            let done = links[j].send(start, full, rate[j], deadline);
                            if done.is_some() {
                                mesh.nodes[j].meter.rescued(Mesh::peer(0), full as u64);
                            }
                            done
                        }
                    };
                    (done, true, false)
                }
            };
            let ok = done.is_some_and(|d| d - t <= timeout);
            let s = samples.last_mut().expect("a sample per second");
            s.requests += 1;
            s.redirected += redirected as u64;
            s.refused += refused as u64;
            if ok {
                s.delivered_bps += size as f64;
            } else {
                s.timeouts += 1;
            }
            if let Some(st) = step {
                steps[st].requests += 1;
                steps[st].redirected += redirected as u64;
                if ok {
                    delivered_per_step[st] += size as f64;
                } else {
                    steps[st].timeouts += 1;
                }
            }
        }
        // Rescue servers drop copies of files once the rescue for the origin has ended.
        for (j, copies) in cached.iter_mut().enumerate().skip(1) {
            if !mesh.nodes[j].core.origins().any(|o| o == Mesh::peer(0)) {
                copies.clear();
            }
        }
    }

    for (i, st) in steps.iter_mut().enumerate() {
        st.overloaded = st.requests > 0 && st.timeouts * 10 > st.requests;
        st.delivered_bps = delivered_per_step[i] / scn.profile[i].1.as_secs_f64().max(1e-9);
    }
    let first_over = steps.iter().position(|s| s.overloaded);
    let upto = first_over.unwrap_or(steps.len());
    let r_max = if upto == 0 { 0.0 } else { steps[upto - 1].rate };
    let d_max = steps[..upto]
        .iter()
        .map(|s| s.delivered_bps)
        .fold(0.0, f64::max);

    let mut allocations = Vec::new();
    let mut releases: BTreeMap<String, u64> = BTreeMap::new();
    for a in &mesh.nodes[0].events {
        match a {
            Action::RescuerAdded { peer, .. } => allocations.push(peer.0 as usize - 1),
            Action::RescuerEnded { reason, .. } => {
                *releases
                    .entry(reason_name(*reason).to_string())
                    .or_default() += 1
            }
            _ => {}
        }
    }
    let sos_sent = mesh
        .wire
        .iter()
        .filter(|w| w.from == Mesh::peer(0) && w.line.windows(5).any(|x| x == b" SOS "))
        .count() as u64;
    let all_normal_at_end = mesh.nodes.iter().all(|n| n.core.state() == State::Normal);
    Ok(RescueResult {
        samples,
        steps,
        r_max,
        d_max,
        allocations,
        releases,
        all_normal_at_end,
        sos_sent,
    })
}

fn reason_name(r: EndReason) -> &'static str {
    match r {
        EndReason::PartialRelease => "partial-release",
        EndReason::CompleteRelease => "complete-release",
        EndReason::Unneeded => "unneeded",
        EndReason::IdleShutdown => "idle-shutdown",
        EndReason::OverloadShutdown => "overload-shutdown",
        EndReason::PeerShutdown => "peer-shutdown",
        EndReason::PeerRefused => "peer-refused",
        EndReason::ConnectionLost => "connection-lost",
    }
}

fn ip_of(i: usize) -> IpAddr {
    [10, 0, (i >> 8) as u8, (i & 0xff) as u8 + 1].into()
}
