//! The rescue control loop of one server (seed 001 §3.1, §4.3–§4.5, §5.3.1): states, allocation,
//! redirect control, D_redi adjustment, release and shutdown. No I/O, no clock.
//!
//! # States
//!
//! A server is in exactly one of three states (§3.1), derived from its relationships:
//!
//! * **SOS** — it has rescue servers, or an SOS of its own waits for an answer;
//! * **rescue** — it rescues at least one origin (and has no rescue servers);
//! * **normal** — neither.
//!
//! Fig. 6 of the paper (the transitions) is missing from the text; the transitions here are:
//! normal → SOS when an allocation round sends an SOS; SOS → normal when the last rescue server
//! is gone and no SOS is pending; normal → rescue on accepting an SOS; rescue → normal when the
//! last origin is gone. A server in SOS answers every SOS `403 Reject`, and a rescue server whose
//! own load needs help (d_self/D_out > T_alert) first shuts down every rescue it gives (overload
//! shutdown, §4.4.5) and only then, in the same interval, starts an initial allocation. A
//! relationship ends on the side that sends SHUTDOWN when it sends it (the answer only
//! acknowledges), on the side that receives it when it arrives, and on both sides when their
//! connection is lost.
//!
//! # One control interval ([`Core::on_tick`])
//!
//! In the order of §5.3.1: releases and shutdowns, then RATE, then (the caller's meter has
//! already restarted its counters) allocation and the new redirect plan.
//!
//! 1. Rates from the interval's [`Measurement`]: d_self, d_resc(S_o), d_resc, d_out = d_self +
//!    d_resc, d_redi(S_r), R_redi, and A_redi as the mean accounting size of the interval's
//!    redirects (the configured 468 bytes until one is seen).
//! 2. Origin: a rescue server's redirect level is d_redi(S_r)/D_redi(S_r). *Complete release*
//!    when d_out/D_out has been below T_low for N_low consecutive intervals; otherwise *partial
//!    release* of the server with the smallest D_redi when there are several and all their
//!    levels have been below T_low for N_low intervals (the others' counts then restart).
//! 3. Rescue server: *overload shutdown* of every origin when d_self/D_out > T_alert, of the
//!    origin with the largest d_resc(S_o) when d_resc/D_out > T_high or d_out/D_out > T_coff;
//!    *idle shutdown* of an origin that had no rescue traffic for more than its MaxIdle.
//! 4. Rescue server, per origin (§4.4.4): if d_resc(S_o) > D_alloc then D_redi ←
//!    D_redi / (d_resc(S_o)/D_alloc), else if d_resc(S_o) < D_init and D_redi < D_init then
//!    D_redi ← D_init; a change of the value on the wire (whole kB/s) is sent as RATE.
//! 5. Allocation, at most one round per I_ctrl, and one SOS at a time: *initial* in the normal
//!    state when d_out/D_out > T_alert (d_out being d_self there: the rescue traffic of
//!    relationships that ended in this interval does not count); *additional* when every rescue server's level has
//!    reached T_coff. The round asks the best candidate: first those with at least D_out of free
//!    capacity (an origin wants rescue servers no smaller than itself, §4.5), among them first
//!    those in a domain none of its rescue servers is in, then the largest d_free. Candidates
//!    that refused, could not be reached, shut the origin down or lost its connection are
//!    skipped for `retry_refused_intervals`.
//! 6. T_redi = T_high − R_redi × A_redi / D_out, floored at 0, and a [`RedirectPlan`] for the
//!    request path.
//! 7. d_free (D_resc normal, 0 in SOS, D_resc minus the allocations in rescue) is advertised
//!    when it changes.
//!
//! # Granting an SOS
//!
//! A server accepts an SOS unless it gives no rescue at all (`gives_rescue = false`), is in SOS, already rescues `max_origins` origins, its last
//! interval had d_self/D_out > T_alert or d_out/D_out > T_high, or it has less than
//! `min_grant_kbps` free. D_alloc is its free capacity d_free, capped by the SOS's wanted rate
//! and `max_grant_kbps`; D_init = D_alloc × T_coff is the first D_redi, sent in the grant with
//! a fresh virtual host name. A repeated SOS from an origin it already rescues gets the same
//! grant again.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::config::RescueConfig;
use crate::error::ConfigError;
use crate::meter::Measurement;
use crate::proto::{code, Grant, Request, Response, Seq, Sos};
use crate::redirect::{RedirectPlan, RedirectTarget};
use crate::session::{Inbound, Session};
use crate::PeerId;

/// The three mutually exclusive states of §3.1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Neither getting nor giving rescue (where every server starts).
    #[default]
    Normal,
    /// Getting rescue (or asking for it).
    Sos,
    /// Giving rescue.
    Rescue,
}

/// A possible rescue server, from the registry: its free capacity and (optionally) its
/// administrative domain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The peer.
    pub peer: PeerId,
    /// Its advertised d_free, kB/s.
    pub d_free_kbps: f64,
    /// Its domain, for diversity (§4.5).
    pub domain: Option<String>,
}

/// Why a relationship ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndReason {
    /// Origin: partial release of the rescue server with the smallest D_redi.
    PartialRelease,
    /// Origin: complete release, load consistently low.
    CompleteRelease,
    /// Origin: a grant came after the origin no longer needed it.
    Unneeded,
    /// Rescue server: no rescue traffic for MaxIdle.
    IdleShutdown,
    /// Rescue server: overload shutdown.
    OverloadShutdown,
    /// The peer sent SHUTDOWN.
    PeerShutdown,
    /// The origin answered a RATE with an error: it does not count on this server.
    PeerRefused,
    /// The connection was lost.
    ConnectionLost,
}

/// What the driver must do. Actions are listed in the order they arose.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Action {
    /// Send this request to `peer` (connecting first if needed); the session numbers it. An
    /// SOS goes to a candidate; if it cannot be reached, call [`Core::on_peer_lost`].
    Send {
        /// The peer.
        peer: PeerId,
        /// The request.
        request: Request,
    },
    /// Answer `peer`'s request `seq`.
    Reply {
        /// The peer.
        peer: PeerId,
        /// The number of its request.
        seq: Seq,
        /// The answer.
        response: Response,
    },
    /// The origin's redirect plan changed: hand it to the [`crate::Redirector`].
    Redirect(RedirectPlan),
    /// Origin: `peer` rescues us under `grant` (add its address to the DNS round robin).
    RescuerAdded {
        /// The rescue server.
        peer: PeerId,
        /// What it granted.
        grant: Grant,
    },
    /// Origin: `peer` no longer rescues us (remove it from the DNS round robin).
    RescuerEnded {
        /// The rescue server.
        peer: PeerId,
        /// Why.
        reason: EndReason,
    },
    /// Rescue server: serve `origin`'s content under `alias` (and the origin's own name) as its
    /// reverse caching proxy.
    OriginAdded {
        /// The origin.
        peer: PeerId,
        /// Its SOS: name, address, port, MaxIdle.
        origin: Sos,
        /// The virtual host name assigned to it.
        alias: String,
        /// D_alloc, kB/s.
        d_alloc_kbps: f64,
    },
    /// Rescue server: stop proxying for `peer`; keep its names as an expired origin whose
    /// requests are redirected back to it (§4.1).
    OriginEnded {
        /// The origin.
        peer: PeerId,
        /// Its name.
        fqdn: String,
        /// The virtual host name it had.
        alias: String,
        /// Why.
        reason: EndReason,
    },
    /// The free rescue capacity to advertise changed (re-register at once, §4.5).
    Advertise {
        /// d_free, kB/s.
        d_free_kbps: f64,
    },
    /// The server's state changed.
    StateChanged {
        /// Before.
        from: State,
        /// After.
        to: State,
    },
}

/// The rates of the last control interval, bytes per second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Rates {
    /// d_out.
    pub d_out: f64,
    /// d_self.
    pub d_self: f64,
    /// d_resc.
    pub d_resc: f64,
    /// Accounted rate of redirect responses (d_redi of Table 1).
    pub d_redi: f64,
    /// R_redi, redirects per second.
    pub r_redi: f64,
}

#[derive(Debug, Clone)]
struct Rescuer {
    grant: Grant,
    domain: Option<String>,
    /// d_redi(S_r) of the last interval, bytes per second.
    d_redi: f64,
    low: u32,
}

impl Rescuer {
    fn d_redi_allowed(&self) -> f64 {
        self.grant.d_redi_kbps as f64 * 1000.0
    }

    fn level(&self) -> f64 {
        let allowed = self.d_redi_allowed();
        if allowed > 0.0 {
            self.d_redi / allowed
        } else {
            0.0
        }
    }

    /// At T_coff or above; a server that allows nothing counts as full.
    fn full(&self, t_coff: f64) -> bool {
        self.d_redi_allowed() <= 0.0 || self.level() >= t_coff
    }
}

#[derive(Debug, Clone)]
struct Origin {
    sos: Sos,
    alias: String,
    d_alloc: f64,
    d_init: f64,
    d_redi: f64,
    announced_kbps: u64,
    d_resc: f64,
    idle_intervals: u64,
}

#[derive(Debug, Clone)]
struct Pending {
    peer: PeerId,
    domain: Option<String>,
    /// Released while waiting: a grant is answered with SHUTDOWN.
    unneeded: bool,
}

/// A rescue server as seen by its origin, for status pages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RescuerStatus {
    /// The peer.
    pub peer: PeerId,
    /// Its grant, with the current D_redi.
    pub grant: Grant,
    /// d_redi(S_r) of the last interval, bytes per second.
    pub d_redi: f64,
    /// Intervals its redirect level has been below T_low.
    pub low_intervals: u32,
}

/// An origin as seen by its rescue server, for status pages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OriginStatus {
    /// The peer.
    pub peer: PeerId,
    /// Its name.
    pub fqdn: String,
    /// Its virtual host name here.
    pub alias: String,
    /// D_alloc, bytes per second.
    pub d_alloc: f64,
    /// D_redi, bytes per second.
    pub d_redi: f64,
    /// d_resc(S_o) of the last interval, bytes per second.
    pub d_resc: f64,
    /// Intervals without rescue traffic.
    pub idle_intervals: u64,
}

/// A snapshot of the core, for the status page and metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// The state.
    pub state: State,
    /// D_out, bytes per second.
    pub d_out_max: f64,
    /// The last interval's rates.
    pub rates: Rates,
    /// T_redi.
    pub t_redi: f64,
    /// A_redi, bytes.
    pub a_redi: f64,
    /// d_free, bytes per second.
    pub d_free: f64,
    /// The rescue server an SOS is pending with.
    pub pending_sos: Option<PeerId>,
    /// Our rescue servers.
    pub rescuers: Vec<RescuerStatus>,
    /// The origins we rescue.
    pub origins: Vec<OriginStatus>,
}

/// The rescue core of one server. See the module documentation; the crate documentation shows
/// the driving loop.
#[derive(Debug, Clone)]
pub struct Core {
    cfg: RescueConfig,
    d_out: f64,
    interval: Duration,
    ticks: u64,
    state: State,
    rates: Rates,
    a_redi: f64,
    t_redi: f64,
    // Origin side.
    rescuers: BTreeMap<PeerId, Rescuer>,
    pending: Option<Pending>,
    last_round: Option<Duration>,
    retry_after: BTreeMap<PeerId, u64>,
    low_out: u32,
    plan_active: bool,
    // Rescue side.
    origins: BTreeMap<PeerId, Origin>,
    next_vhost: u64,
    advertised: Option<f64>,
}

fn kbps(bytes_per_sec: f64) -> f64 {
    bytes_per_sec / 1000.0
}

impl Core {
    /// A core in the normal state. Fails if the configuration is invalid.
    pub fn new(cfg: RescueConfig) -> Result<Core, ConfigError> {
        cfg.validate()?;
        Ok(Core {
            d_out: cfg.d_out(),
            interval: cfg.control_interval(),
            ticks: 0,
            state: State::Normal,
            rates: Rates::default(),
            a_redi: cfg.a_redi_bytes,
            t_redi: cfg.t_high,
            rescuers: BTreeMap::new(),
            pending: None,
            last_round: None,
            retry_after: BTreeMap::new(),
            low_out: 0,
            plan_active: false,
            origins: BTreeMap::new(),
            next_vhost: cfg.first_vhost_seq,
            advertised: None,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RescueConfig {
        &self.cfg
    }

    /// A protocol session for a new connection, with the configured request timeout.
    pub fn new_session(&self) -> Session {
        Session::new(self.cfg.request_timeout())
    }

    /// The state.
    pub fn state(&self) -> State {
        self.state
    }

    /// The next virtual host sequence number (persist it to never reuse a name).
    pub fn next_vhost_seq(&self) -> u64 {
        self.next_vhost
    }

    /// Whether a relationship (either way) or a pending SOS ties us to `peer`.
    pub fn has_relationship(&self, peer: PeerId) -> bool {
        self.rescuers.contains_key(&peer)
            || self.origins.contains_key(&peer)
            || self.pending.as_ref().is_some_and(|p| p.peer == peer)
    }

    /// The origins we rescue.
    pub fn origins(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.origins.keys().copied()
    }

    /// Our rescue servers.
    pub fn rescuers(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.rescuers.keys().copied()
    }

    /// d_free, bytes per second: D_resc when normal, 0 in SOS, D_resc minus the allocations in
    /// rescue.
    pub fn d_free(&self) -> f64 {
        if !self.cfg.gives_rescue {
            return 0.0;
        }
        let d_resc = self.cfg.d_resc();
        match self.state {
            State::Normal => d_resc,
            State::Sos => 0.0,
            State::Rescue => {
                let used: f64 = self.origins.values().map(|o| o.d_alloc).sum();
                (d_resc - used).max(0.0)
            }
        }
    }

    /// The redirect plan as it stands.
    pub fn redirect_plan(&self) -> RedirectPlan {
        RedirectPlan {
            interval: self.ticks,
            interval_len: self.interval,
            d_out: self.d_out,
            t_redi: self.t_redi,
            a_redi: self.a_redi,
            targets: self
                .rescuers
                .iter()
                .map(|(p, r)| RedirectTarget {
                    peer: *p,
                    alias: r.grant.alias.clone(),
                    ip: r.grant.ip,
                    port: r.grant.port,
                    d_redi: r.d_redi_allowed(),
                })
                .collect(),
        }
    }

    /// A snapshot for status pages.
    pub fn status(&self) -> Status {
        Status {
            state: self.state,
            d_out_max: self.d_out,
            rates: self.rates,
            t_redi: self.t_redi,
            a_redi: self.a_redi,
            d_free: self.d_free(),
            pending_sos: self.pending.as_ref().map(|p| p.peer),
            rescuers: self
                .rescuers
                .iter()
                .map(|(p, r)| RescuerStatus {
                    peer: *p,
                    grant: r.grant.clone(),
                    d_redi: r.d_redi,
                    low_intervals: r.low,
                })
                .collect(),
            origins: self
                .origins
                .iter()
                .map(|(p, o)| OriginStatus {
                    peer: *p,
                    fqdn: o.sos.fqdn.clone(),
                    alias: o.alias.clone(),
                    d_alloc: o.d_alloc,
                    d_redi: o.d_redi,
                    d_resc: o.d_resc,
                    idle_intervals: o.idle_intervals,
                })
                .collect(),
        }
    }

    /// One control interval: `m` is what the meter measured since the last tick, `candidates`
    /// the rescue server candidates known now. See the module documentation for the steps.
    pub fn on_tick(
        &mut self,
        now: Duration,
        m: &Measurement,
        candidates: &[Candidate],
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        self.ticks += 1;
        let secs = if m.elapsed.is_zero() {
            self.interval.as_secs_f64()
        } else {
            m.elapsed.as_secs_f64()
        };
        let d_self = m.self_bytes as f64 / secs;
        let d_resc = m.rescue_total() as f64 / secs;
        self.rates = Rates {
            d_out: d_self + d_resc,
            d_self,
            d_resc,
            d_redi: m.redirect_bytes as f64 / secs,
            r_redi: m.redirects as f64 / secs,
        };
        if m.redirects > 0 {
            self.a_redi = (m.redirect_bytes as f64 / m.redirects as f64).max(1.0);
        }
        let load = self.rates.d_out / self.d_out;

        // 1. Origin: releases.
        if self.rescuers.is_empty() {
            self.low_out = 0;
        } else {
            let t_low = self.cfg.t_low;
            for (p, r) in self.rescuers.iter_mut() {
                r.d_redi = m.redirected.get(p).copied().unwrap_or(0) as f64 / secs;
                r.low = if r.level() < t_low {
                    r.low.saturating_add(1)
                } else {
                    0
                };
            }
            self.low_out = if load < t_low {
                self.low_out.saturating_add(1)
            } else {
                0
            };
            let n_low = self.cfg.n_low;
            if self.low_out >= n_low {
                self.low_out = 0;
                let all: Vec<PeerId> = self.rescuers.keys().copied().collect();
                for p in all {
                    self.release(p, EndReason::CompleteRelease, &mut acts);
                }
                if let Some(p) = self.pending.as_mut() {
                    p.unneeded = true;
                }
            } else if self.rescuers.len() > 1 && self.rescuers.values().all(|r| r.low >= n_low) {
                let victim = self
                    .rescuers
                    .iter()
                    .min_by_key(|(p, r)| (r.grant.d_redi_kbps, **p))
                    .map(|(p, _)| *p)
                    .expect("several rescue servers");
                self.release(victim, EndReason::PartialRelease, &mut acts);
                for r in self.rescuers.values_mut() {
                    r.low = 0;
                }
            }
        }

        // 2. Rescue server: shutdowns, then RATE.
        if !self.origins.is_empty() {
            for (p, o) in self.origins.iter_mut() {
                let b = m.rescue_bytes.get(p).copied().unwrap_or(0);
                o.d_resc = b as f64 / secs;
                o.idle_intervals = if b == 0 { o.idle_intervals + 1 } else { 0 };
            }
            let d_out_max = self.d_out;
            if self.rates.d_self / d_out_max > self.cfg.t_alert {
                let all: Vec<PeerId> = self.origins.keys().copied().collect();
                for p in all {
                    self.shut_down(p, EndReason::OverloadShutdown, &mut acts);
                }
            } else if self.rates.d_resc / d_out_max > self.cfg.t_high || load > self.cfg.t_coff {
                let victim = self
                    .origins
                    .iter()
                    .max_by(|a, b| a.1.d_resc.total_cmp(&b.1.d_resc).then(b.0.cmp(a.0)))
                    .map(|(p, _)| *p)
                    .expect("an origin");
                self.shut_down(victim, EndReason::OverloadShutdown, &mut acts);
            }
            let interval_ms = self.cfg.control_interval_ms as u128;
            let idle: Vec<PeerId> = self
                .origins
                .iter()
                .filter(|(_, o)| {
                    o.idle_intervals as u128 * interval_ms > o.sos.max_idle_secs as u128 * 1000
                })
                .map(|(p, _)| *p)
                .collect();
            for p in idle {
                self.shut_down(p, EndReason::IdleShutdown, &mut acts);
            }
            for (p, o) in self.origins.iter_mut() {
                if o.d_resc > o.d_alloc {
                    o.d_redi /= o.d_resc / o.d_alloc;
                } else if o.d_resc < o.d_init && o.d_redi < o.d_init {
                    o.d_redi = o.d_init;
                }
                let k = wire_kbps(o.d_redi);
                if k != o.announced_kbps {
                    o.announced_kbps = k;
                    acts.push(Action::Send {
                        peer: *p,
                        request: Request::Rate { kbps: k },
                    });
                }
            }
        }
        self.sync_state(&mut acts);

        // 5. Allocation.
        let round_due = self
            .last_round
            .is_none_or(|t| now.saturating_sub(t) >= self.interval);
        let wanted = match self.state {
            // In the normal state d_out is d_self: rescue traffic measured now belongs to
            // relationships that have just ended and is going away.
            State::Normal => self.rates.d_self / self.d_out > self.cfg.t_alert,
            State::Sos => {
                self.pending.is_none()
                    && !self.rescuers.is_empty()
                    && self.rescuers.values().all(|r| r.full(self.cfg.t_coff))
            }
            State::Rescue => false,
        };
        if round_due && wanted {
            if let Some(c) = self.best_candidate(candidates) {
                self.last_round = Some(now);
                self.pending = Some(Pending {
                    peer: c.peer,
                    domain: c.domain.clone(),
                    unneeded: false,
                });
                acts.push(Action::Send {
                    peer: c.peer,
                    request: Request::Sos(Sos {
                        fqdn: self.cfg.server_name.clone(),
                        ip: self.cfg.web_ip,
                        port: self.cfg.web_port,
                        max_idle_secs: self.cfg.max_idle(),
                        want_kbps: self.cfg.sos_want_kbps,
                    }),
                });
                self.sync_state(&mut acts);
            }
        }

        // 6. Redirect control.
        self.t_redi = (self.cfg.t_high - self.rates.r_redi * self.a_redi / self.d_out).max(0.0);
        self.push_plan(&mut acts);
        acts
    }

    fn best_candidate<'c>(&self, candidates: &'c [Candidate]) -> Option<&'c Candidate> {
        let min = self.cfg.min_grant_kbps;
        let used: Vec<&str> = self
            .rescuers
            .values()
            .filter_map(|r| r.domain.as_deref())
            .collect();
        candidates
            .iter()
            .filter(|c| {
                c.d_free_kbps.is_finite()
                    && c.d_free_kbps >= min
                    && !self.rescuers.contains_key(&c.peer)
                    && !self.origins.contains_key(&c.peer)
                    && self
                        .retry_after
                        .get(&c.peer)
                        .is_none_or(|&t| self.ticks >= t)
            })
            .max_by(|a, b| {
                let key = |c: &Candidate| {
                    (
                        c.d_free_kbps * 1000.0 >= self.d_out,
                        c.domain.as_deref().is_none_or(|d| !used.contains(&d)),
                    )
                };
                key(a)
                    .cmp(&key(b))
                    .then(a.d_free_kbps.total_cmp(&b.d_free_kbps))
                    .then(b.peer.cmp(&a.peer))
            })
    }

    /// A message from `peer`, as the session delivered it. (`now` is taken for symmetry with
    /// [`Core::on_tick`]; the core's timers count control intervals.)
    pub fn on_message(&mut self, now: Duration, peer: PeerId, msg: Inbound) -> Vec<Action> {
        let _ = now;
        let mut acts = Vec::new();
        match msg {
            Inbound::Request { seq, request } => {
                let response = match request {
                    Request::Sos(sos) => self.on_sos(peer, sos, &mut acts),
                    Request::Rate { kbps } => match self.rescuers.get_mut(&peer) {
                        Some(r) => {
                            r.grant.d_redi_kbps = kbps;
                            self.push_plan(&mut acts);
                            Response::Ok
                        }
                        None => Response::refused(code::NO_RELATIONSHIP),
                    },
                    Request::Shutdown => {
                        self.end_all_with(peer, EndReason::PeerShutdown, &mut acts);
                        Response::Ok
                    }
                };
                // The answer goes before the consequences so the peer hears it first.
                acts.insert(
                    0,
                    Action::Reply {
                        peer,
                        seq,
                        response,
                    },
                );
            }
            Inbound::Response {
                request, response, ..
            } => match (request, response) {
                (Request::Sos(_), Response::Granted(grant)) => {
                    let pending = self.pending.take_if(|p| p.peer == peer);
                    match pending {
                        Some(p) if !p.unneeded && !self.origins.contains_key(&peer) => {
                            self.low_out = 0;
                            self.rescuers.insert(
                                peer,
                                Rescuer {
                                    grant: grant.clone(),
                                    domain: p.domain,
                                    d_redi: 0.0,
                                    low: 0,
                                },
                            );
                            acts.push(Action::RescuerAdded { peer, grant });
                            self.push_plan(&mut acts);
                        }
                        _ => {
                            acts.push(Action::Send {
                                peer,
                                request: Request::Shutdown,
                            });
                            acts.push(Action::RescuerEnded {
                                peer,
                                reason: EndReason::Unneeded,
                            });
                        }
                    }
                }
                (Request::Sos(_), _) if self.pending.as_ref().is_some_and(|p| p.peer == peer) => {
                    self.pending = None;
                    self.back_off(peer);
                }
                (Request::Rate { .. }, Response::Refused { .. }) => {
                    if let Some(o) = self.origins.remove(&peer) {
                        acts.push(Action::OriginEnded {
                            peer,
                            fqdn: o.sos.fqdn,
                            alias: o.alias,
                            reason: EndReason::PeerRefused,
                        });
                    }
                }
                _ => {}
            },
        }
        self.sync_state(&mut acts);
        acts
    }

    /// The connection to `peer` is gone (or could not be made, or a `Send` found no session):
    /// every relationship with it ends on this side, and a pending SOS to it counts as refused.
    pub fn on_peer_lost(&mut self, _now: Duration, peer: PeerId) -> Vec<Action> {
        let mut acts = Vec::new();
        if self.pending.take_if(|p| p.peer == peer).is_some() {
            self.back_off(peer);
        }
        self.end_all_with(peer, EndReason::ConnectionLost, &mut acts);
        self.sync_state(&mut acts);
        acts
    }

    /// Ends every relationship with `peer` on this side, in either role, for `reason`: a
    /// rescue server of ours is backed off and the redirect plan follows; an origin we rescue
    /// is dropped.
    fn end_all_with(&mut self, peer: PeerId, reason: EndReason, acts: &mut Vec<Action>) {
        if self.rescuers.remove(&peer).is_some() {
            self.back_off(peer);
            acts.push(Action::RescuerEnded { peer, reason });
            self.push_plan(acts);
        }
        if let Some(o) = self.origins.remove(&peer) {
            acts.push(Action::OriginEnded {
                peer,
                fqdn: o.sos.fqdn,
                alias: o.alias,
                reason,
            });
        }
    }

    fn on_sos(&mut self, peer: PeerId, sos: Sos, acts: &mut Vec<Action>) -> Response {
        if let Some(o) = self.origins.get(&peer) {
            return Response::Granted(Grant {
                alias: o.alias.clone(),
                ip: self.cfg.web_ip,
                port: self.cfg.web_port,
                d_redi_kbps: o.announced_kbps,
            });
        }
        let busy = self.rates.d_self / self.d_out > self.cfg.t_alert
            || self.rates.d_out / self.d_out > self.cfg.t_high;
        if !self.cfg.gives_rescue
            || self.state == State::Sos
            || self.origins.len() >= self.cfg.max_origins
            || busy
        {
            return Response::reject();
        }
        let mut d_alloc = self.d_free();
        if let Some(w) = sos.want_kbps {
            d_alloc = d_alloc.min(w as f64 * 1000.0);
        }
        if let Some(m) = self.cfg.max_grant_kbps {
            d_alloc = d_alloc.min(m * 1000.0);
        }
        let d_init = d_alloc * self.cfg.t_coff;
        let announced = wire_kbps(d_init);
        if d_alloc < self.cfg.min_grant_kbps * 1000.0 || announced == 0 {
            return Response::reject();
        }
        let alias = self.cfg.vhost_name(self.next_vhost);
        self.next_vhost += 1;
        acts.push(Action::OriginAdded {
            peer,
            origin: sos.clone(),
            alias: alias.clone(),
            d_alloc_kbps: kbps(d_alloc),
        });
        self.origins.insert(
            peer,
            Origin {
                sos,
                alias: alias.clone(),
                d_alloc,
                d_init,
                d_redi: d_init,
                announced_kbps: announced,
                d_resc: 0.0,
                idle_intervals: 0,
            },
        );
        Response::Granted(Grant {
            alias,
            ip: self.cfg.web_ip,
            port: self.cfg.web_port,
            d_redi_kbps: announced,
        })
    }

    fn back_off(&mut self, peer: PeerId) {
        self.retry_after
            .insert(peer, self.ticks + self.cfg.retry_refused_intervals as u64);
        let now = self.ticks;
        self.retry_after.retain(|_, t| *t > now);
    }

    /// Origin ends its relationship with rescue server `peer`.
    fn release(&mut self, peer: PeerId, reason: EndReason, acts: &mut Vec<Action>) {
        if self.rescuers.remove(&peer).is_some() {
            acts.push(Action::Send {
                peer,
                request: Request::Shutdown,
            });
            acts.push(Action::RescuerEnded { peer, reason });
        }
    }

    /// Rescue server ends its relationship with origin `peer`.
    fn shut_down(&mut self, peer: PeerId, reason: EndReason, acts: &mut Vec<Action>) {
        if let Some(o) = self.origins.remove(&peer) {
            acts.push(Action::Send {
                peer,
                request: Request::Shutdown,
            });
            acts.push(Action::OriginEnded {
                peer,
                fqdn: o.sos.fqdn,
                alias: o.alias,
                reason,
            });
        }
    }

    /// Emits the redirect plan when there is one to follow or one to stop (only the latest plan
    /// of a batch of actions).
    fn push_plan(&mut self, acts: &mut Vec<Action>) {
        let active = !self.rescuers.is_empty();
        if active || self.plan_active {
            acts.retain(|a| !matches!(a, Action::Redirect(_)));
            acts.push(Action::Redirect(self.redirect_plan()));
        }
        self.plan_active = active;
    }

    fn sync_state(&mut self, acts: &mut Vec<Action>) {
        debug_assert!(
            self.origins.is_empty() || (self.rescuers.is_empty() && self.pending.is_none()),
            "SOS and rescue at once"
        );
        let to = if !self.rescuers.is_empty() || self.pending.is_some() {
            State::Sos
        } else if !self.origins.is_empty() {
            State::Rescue
        } else {
            State::Normal
        };
        if to != self.state {
            acts.push(Action::StateChanged {
                from: self.state,
                to,
            });
            self.state = to;
        }
        let free = self.d_free();
        if self.advertised != Some(free) {
            self.advertised = Some(free);
            acts.push(Action::Advertise {
                d_free_kbps: kbps(free),
            });
        }
    }
}

/// A rate in bytes per second as whole kB/s for the wire.
fn wire_kbps(bytes_per_sec: f64) -> u64 {
    (bytes_per_sec / 1000.0)
        .round()
        .clamp(0.0, crate::proto::MAX_RATE_KBPS as f64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// D_out = 1000 kB/s.
    fn origin_cfg() -> RescueConfig {
        RescueConfig::new("www.origin.com", [1, 2, 3, 4].into(), 8080, 1250.0)
    }

    /// D_out = 10000 kB/s, D_resc = 5000 kB/s.
    fn rescue_cfg() -> RescueConfig {
        RescueConfig::new("www.rescue.com", [5, 6, 7, 8].into(), 8080, 12500.0)
    }

    /// One second of own traffic at `kbps`.
    fn own(kbps: f64) -> Measurement {
        Measurement {
            elapsed: s(1),
            self_bytes: (kbps * 1000.0) as u64,
            ..Measurement::default()
        }
    }

    fn rescue_traffic(own_kbps: f64, per_origin: &[(u32, f64)]) -> Measurement {
        let mut m = own(own_kbps);
        for &(p, k) in per_origin {
            m.rescue_bytes.insert(PeerId(p), (k * 1000.0) as u64);
        }
        m
    }

    fn cand(peer: u32, kbps: f64) -> Candidate {
        Candidate {
            peer: PeerId(peer),
            d_free_kbps: kbps,
            domain: None,
        }
    }

    fn sends(acts: &[Action]) -> Vec<(PeerId, Request)> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Send { peer, request } => Some((*peer, request.clone())),
                _ => None,
            })
            .collect()
    }

    fn reply(acts: &[Action]) -> Response {
        match &acts[0] {
            Action::Reply { response, .. } => response.clone(),
            other => panic!("first action is not a reply: {other:?}"),
        }
    }

    fn sos() -> Sos {
        Sos {
            fqdn: "www.origin.com".into(),
            ip: [1, 2, 3, 4].into(),
            port: 8080,
            max_idle_secs: 600,
            want_kbps: None,
        }
    }

    fn request(seq: Seq, request: Request) -> Inbound {
        Inbound::Request { seq, request }
    }

    fn grant(kbps: u64) -> Grant {
        Grant {
            alias: "www-vh1.rescue.com".into(),
            ip: [5, 6, 7, 8].into(),
            port: 8080,
            d_redi_kbps: kbps,
        }
    }

    fn granted(core: &mut Core, peer: u32, kbps: u64) -> Vec<Action> {
        let req = Request::Sos(sos());
        core.on_message(
            s(0),
            PeerId(peer),
            Inbound::Response {
                seq: 1,
                request: req,
                response: Response::Granted(grant(kbps)),
            },
        )
    }

    /// An origin in SOS with rescue servers `peers` (each granted 100 kB/s).
    fn origin_with(peers: &[u32]) -> Core {
        let mut c = Core::new(origin_cfg()).unwrap();
        for (k, &p) in peers.iter().enumerate() {
            // Every current rescue server full: the next round is due.
            let mut m = own(600.0);
            for &q in &peers[..k] {
                m.redirected.insert(PeerId(q), 95_000);
            }
            let acts = c.on_tick(s(k as u64 + 1), &m, &[cand(p, 5000.0)]);
            assert_eq!(sends(&acts).len(), 1, "{acts:?}");
            granted(&mut c, p, 100);
        }
        assert_eq!(c.rescuers().count(), peers.len());
        c
    }

    #[test]
    fn a_server_that_gives_no_rescue_refuses_sos_but_asks_for_rescue() {
        let mut cfg = rescue_cfg();
        cfg.gives_rescue = false;
        let mut c = Core::new(cfg).unwrap();
        assert_eq!(c.d_free(), 0.0);
        let acts = c.on_message(s(0), PeerId(1), request(1, Request::Sos(sos())));
        assert_eq!(reply(&acts), Response::reject());
        assert_eq!(c.state(), State::Normal);
        assert!(!acts.iter().any(|a| matches!(a, Action::OriginAdded { .. })));
        // Its own crowd still makes it ask.
        let acts = c.on_tick(s(1), &own(6000.0), &[cand(2, 20_000.0)]);
        assert_eq!(sends(&acts).len(), 1, "{acts:?}");
        assert_eq!(c.state(), State::Sos);
    }

    #[test]
    fn initial_allocation_above_t_alert_asks_the_largest_candidate() {
        let mut c = Core::new(origin_cfg()).unwrap();
        let cands = [cand(1, 2000.0), cand(2, 5000.0), cand(3, 4000.0)];
        let acts = c.on_tick(s(1), &own(500.0), &cands);
        assert!(sends(&acts).is_empty(), "50% is not above T_alert");
        assert_eq!(c.state(), State::Normal);
        let acts = c.on_tick(s(2), &own(501.0), &cands);
        assert_eq!(
            sends(&acts),
            vec![(
                PeerId(2),
                Request::Sos(Sos {
                    max_idle_secs: 300,
                    ..sos()
                })
            )]
        );
        assert_eq!(c.state(), State::Sos);
        assert!(acts.contains(&Action::StateChanged {
            from: State::Normal,
            to: State::Sos
        }));
        assert!(acts.contains(&Action::Advertise { d_free_kbps: 0.0 }));
    }

    #[test]
    fn one_round_per_interval_and_refusals_back_off() {
        let mut c = Core::new(origin_cfg()).unwrap();
        let cands = [cand(1, 2000.0), cand(2, 5000.0)];
        let ms = |m: u64| s(1) + Duration::from_millis(m);
        assert_eq!(sends(&c.on_tick(s(1), &own(900.0), &cands)).len(), 1);
        // Pending: no second SOS.
        assert!(sends(&c.on_tick(ms(100), &own(900.0), &cands)).is_empty());
        let acts = c.on_message(
            ms(200),
            PeerId(2),
            Inbound::Response {
                seq: 1,
                request: Request::Sos(sos()),
                response: Response::reject(),
            },
        );
        assert!(acts.contains(&Action::StateChanged {
            from: State::Sos,
            to: State::Normal
        }));
        // Same interval as the last round: nothing yet.
        assert!(sends(&c.on_tick(ms(500), &own(900.0), &cands)).is_empty());
        // Next interval: the next candidate; the one that refused waits.
        let acts = c.on_tick(s(2), &own(900.0), &cands);
        assert_eq!(sends(&acts)[0].0, PeerId(1));
        c.on_peer_lost(s(3), PeerId(1));
        // Peer 2 refused in the second interval: it is asked again in the 32nd.
        for t in 4..31 {
            assert!(
                sends(&c.on_tick(s(t), &own(900.0), &cands)).is_empty(),
                "t={t}"
            );
        }
        let acts = c.on_tick(s(40), &own(900.0), &cands);
        assert_eq!(
            sends(&acts)[0].0,
            PeerId(2),
            "asked again after the back-off"
        );
    }

    #[test]
    fn candidates_no_smaller_than_the_origin_and_in_new_domains_first() {
        let mut c = origin_with(&[7]);
        c.rescuers.get_mut(&PeerId(7)).unwrap().domain = Some("a.org".into());
        let with = |p, k: f64, d: &str| Candidate {
            peer: PeerId(p),
            d_free_kbps: k,
            domain: Some(d.into()),
        };
        let cands = [
            with(1, 900.0, "b.org"),
            with(2, 5000.0, "a.org"),
            with(3, 1500.0, "c.org"),
            with(4, 1200.0, "d.org"),
        ];
        assert_eq!(c.best_candidate(&cands).unwrap().peer, PeerId(3));
        let small = [with(1, 900.0, "b.org"), with(5, 999.0, "a.org")];
        assert_eq!(c.best_candidate(&small).unwrap().peer, PeerId(1));
        // Rescue servers, origins, tiny and unusable candidates are never asked.
        let none = [cand(7, 9000.0), cand(8, 5.0), cand(9, f64::NAN)];
        assert!(c.best_candidate(&none).is_none());
    }

    #[test]
    fn accepting_an_sos_grants_d_free_times_t_coff() {
        let mut r = Core::new(rescue_cfg()).unwrap();
        r.on_tick(s(1), &own(100.0), &[]);
        let acts = r.on_message(s(1), PeerId(1), request(1, Request::Sos(sos())));
        assert_eq!(
            reply(&acts),
            Response::Granted(Grant {
                alias: "www-vh1.rescue.com".into(),
                ip: [5, 6, 7, 8].into(),
                port: 8080,
                d_redi_kbps: 4500,
            })
        );
        assert!(matches!(
            &acts[1],
            Action::OriginAdded { peer: PeerId(1), alias, d_alloc_kbps, .. }
                if alias == "www-vh1.rescue.com" && *d_alloc_kbps == 5000.0
        ));
        assert_eq!(r.state(), State::Rescue);
        assert_eq!(r.d_free(), 0.0);
        // A repeated SOS gets the same grant, no new name.
        let again = r.on_message(s(1), PeerId(1), request(2, Request::Sos(sos())));
        assert!(matches!(reply(&again), Response::Granted(g) if g.alias == "www-vh1.rescue.com"));
        assert_eq!(r.next_vhost_seq(), 2);
        // Nothing left for a second origin.
        let other = r.on_message(s(1), PeerId(2), request(1, Request::Sos(sos())));
        assert_eq!(reply(&other), Response::reject());
    }

    #[test]
    fn grants_are_capped_and_names_never_reused() {
        let mut cfg = rescue_cfg();
        cfg.max_grant_kbps = Some(1000.0);
        let mut r = Core::new(cfg).unwrap();
        let want = Sos {
            want_kbps: Some(200),
            ..sos()
        };
        let a = r.on_message(s(0), PeerId(1), request(1, Request::Sos(want)));
        assert!(matches!(reply(&a), Response::Granted(g) if g.d_redi_kbps == 180));
        let b = r.on_message(s(0), PeerId(2), request(1, Request::Sos(sos())));
        assert!(
            matches!(reply(&b), Response::Granted(g) if g.d_redi_kbps == 900 && g.alias == "www-vh2.rescue.com")
        );
        assert_eq!(r.d_free(), 5_000_000.0 - 200_000.0 - 1_000_000.0);
        r.on_message(s(0), PeerId(1), request(2, Request::Shutdown));
        let c = r.on_message(s(0), PeerId(1), request(3, Request::Sos(sos())));
        assert!(matches!(reply(&c), Response::Granted(g) if g.alias == "www-vh3.rescue.com"));
    }

    #[test]
    fn sos_refused_in_sos_state_and_when_busy() {
        let mut c = origin_with(&[7]);
        assert_eq!(c.state(), State::Sos);
        let acts = c.on_message(s(5), PeerId(3), request(1, Request::Sos(sos())));
        assert_eq!(acts.len(), 1);
        assert_eq!(
            acts[0],
            Action::Reply {
                peer: PeerId(3),
                seq: 1,
                response: Response::reject()
            }
        );
        assert_eq!(c.origins().count(), 0);

        // A pending SOS is SOS too.
        let mut p = Core::new(origin_cfg()).unwrap();
        p.on_tick(s(1), &own(800.0), &[cand(1, 5000.0)]);
        let acts = p.on_message(s(1), PeerId(2), request(1, Request::Sos(sos())));
        assert_eq!(reply(&acts), Response::reject());

        // Own load above T_alert.
        let mut r = Core::new(rescue_cfg()).unwrap();
        r.on_tick(s(1), &own(5001.0), &[]);
        let acts = r.on_message(s(1), PeerId(2), request(1, Request::Sos(sos())));
        assert_eq!(reply(&acts), Response::reject());
    }

    #[test]
    fn d_redi_follows_the_rescue_load_with_rate_messages() {
        let mut cfg = rescue_cfg();
        cfg.max_grant_kbps = Some(1000.0);
        let mut r = Core::new(cfg).unwrap();
        r.on_message(s(0), PeerId(1), request(1, Request::Sos(sos())));
        // D_alloc 1000, D_init 900. Over D_alloc by 25%: D_redi 900 / 1.25 = 720.
        let acts = r.on_tick(s(1), &rescue_traffic(0.0, &[(1, 1250.0)]), &[]);
        assert_eq!(sends(&acts), vec![(PeerId(1), Request::Rate { kbps: 720 })]);
        // Between D_init and D_alloc: unchanged, nothing sent.
        let acts = r.on_tick(s(2), &rescue_traffic(0.0, &[(1, 950.0)]), &[]);
        assert!(sends(&acts).is_empty());
        // Below D_init with D_redi below D_init: back to D_init.
        let acts = r.on_tick(s(3), &rescue_traffic(0.0, &[(1, 500.0)]), &[]);
        assert_eq!(sends(&acts), vec![(PeerId(1), Request::Rate { kbps: 900 })]);
        let acts = r.on_tick(s(4), &rescue_traffic(0.0, &[(1, 500.0)]), &[]);
        assert!(sends(&acts).is_empty());
    }

    #[test]
    fn idle_shutdown_after_max_idle() {
        let mut r = Core::new(rescue_cfg()).unwrap();
        let short = Sos {
            max_idle_secs: 5,
            ..sos()
        };
        r.on_message(s(0), PeerId(1), request(1, Request::Sos(short)));
        for t in 1..=5 {
            let acts = r.on_tick(s(t), &own(0.0), &[]);
            assert!(sends(&acts).is_empty(), "t={t}");
        }
        // Traffic restarts the count.
        r.on_tick(s(6), &rescue_traffic(0.0, &[(1, 1.0)]), &[]);
        for t in 7..=11 {
            assert!(sends(&r.on_tick(s(t), &own(0.0), &[])).is_empty());
        }
        let acts = r.on_tick(s(12), &own(0.0), &[]);
        assert_eq!(sends(&acts), vec![(PeerId(1), Request::Shutdown)]);
        assert!(acts.iter().any(|a| matches!(
            a,
            Action::OriginEnded { reason: EndReason::IdleShutdown, alias, .. } if alias == "www-vh1.rescue.com"
        )));
        assert_eq!(r.state(), State::Normal);
    }

    #[test]
    fn overload_shutdown_complete_then_own_allocation() {
        let mut r = Core::new(rescue_cfg()).unwrap();
        r.on_message(s(0), PeerId(1), request(1, Request::Sos(sos())));
        let acts = r.on_tick(
            s(1),
            &rescue_traffic(5100.0, &[(1, 100.0)]),
            &[cand(9, 20000.0)],
        );
        let sent = sends(&acts);
        assert_eq!(sent[0], (PeerId(1), Request::Shutdown));
        assert!(matches!(&sent[1], (PeerId(9), Request::Sos(_))), "{sent:?}");
        assert_eq!(r.state(), State::Sos);
        let order: Vec<_> = acts
            .iter()
            .filter_map(|a| match a {
                Action::StateChanged { from, to } => Some((*from, *to)),
                _ => None,
            })
            .collect();
        assert_eq!(
            order,
            vec![(State::Rescue, State::Normal), (State::Normal, State::Sos)]
        );
    }

    #[test]
    fn overload_shutdown_partial_drops_the_heaviest_origin() {
        let mut cfg = rescue_cfg();
        cfg.max_grant_kbps = Some(1000.0);
        let mut r = Core::new(cfg).unwrap();
        for p in 1..=3 {
            r.on_message(s(0), PeerId(p), request(1, Request::Sos(sos())));
        }
        // d_resc 7600 of D_out 10000 > T_high.
        let m = rescue_traffic(0.0, &[(1, 2000.0), (2, 3600.0), (3, 2000.0)]);
        let acts = r.on_tick(s(1), &m, &[]);
        assert_eq!(sends(&acts)[0], (PeerId(2), Request::Shutdown));
        assert_eq!(r.origins().collect::<Vec<_>>(), [PeerId(1), PeerId(3)]);
        assert_eq!(r.state(), State::Rescue);
    }

    #[test]
    fn shedding_the_last_origin_is_no_reason_for_an_sos() {
        let mut r = Core::new(rescue_cfg()).unwrap();
        r.on_message(s(0), PeerId(1), request(1, Request::Sos(sos())));
        // d_resc 8000 of 10000 kB/s: overload shutdown; d_self 500 is far from T_alert.
        let m = rescue_traffic(500.0, &[(1, 8000.0)]);
        let acts = r.on_tick(s(1), &m, &[cand(9, 20000.0)]);
        assert_eq!(sends(&acts), vec![(PeerId(1), Request::Shutdown)]);
        assert_eq!(r.state(), State::Normal);
    }

    #[test]
    fn complete_release_after_n_low_low_intervals() {
        let mut c = origin_with(&[7, 8]);
        // Both rescue servers busy (20% of D_redi): no partial release on the way.
        let low = |kbps: f64| {
            let mut m = own(kbps);
            m.redirected.insert(PeerId(7), 20_000);
            m.redirected.insert(PeerId(8), 20_000);
            m
        };
        for t in 0..29 {
            let acts = c.on_tick(s(100 + t), &low(99.0), &[]);
            assert!(sends(&acts).is_empty(), "t={t}");
        }
        // One interval at T_low restarts the count.
        c.on_tick(s(129), &low(100.0), &[]);
        for t in 0..29 {
            assert!(sends(&c.on_tick(s(130 + t), &low(0.0), &[])).is_empty());
        }
        let acts = c.on_tick(s(159), &low(0.0), &[]);
        assert_eq!(
            sends(&acts),
            vec![
                (PeerId(7), Request::Shutdown),
                (PeerId(8), Request::Shutdown)
            ]
        );
        assert!(acts.contains(&Action::RescuerEnded {
            peer: PeerId(8),
            reason: EndReason::CompleteRelease
        }));
        assert_eq!(c.state(), State::Normal);
        let plan = acts.iter().find_map(|a| match a {
            Action::Redirect(p) => Some(p),
            _ => None,
        });
        assert!(!plan.expect("a plan that stops redirecting").is_active());
    }

    #[test]
    fn partial_release_of_the_smallest_d_redi() {
        let mut c = origin_with(&[7, 8, 9]);
        c.rescuers.get_mut(&PeerId(8)).unwrap().grant.d_redi_kbps = 50;
        // d_out at 50%: not low; redirect levels 0: low.
        for t in 0..29 {
            assert!(sends(&c.on_tick(s(100 + t), &own(500.0), &[])).is_empty());
        }
        let acts = c.on_tick(s(129), &own(500.0), &[]);
        assert_eq!(sends(&acts), vec![(PeerId(8), Request::Shutdown)]);
        assert!(acts.contains(&Action::RescuerEnded {
            peer: PeerId(8),
            reason: EndReason::PartialRelease
        }));
        // The others' counts restarted: the next partial release is N_low intervals away.
        for t in 0..29 {
            assert!(sends(&c.on_tick(s(130 + t), &own(500.0), &[])).is_empty());
        }
        assert_eq!(
            sends(&c.on_tick(s(159), &own(500.0), &[])),
            vec![(PeerId(7), Request::Shutdown)]
        );
        // The last one goes only by complete release.
        for t in 0..100 {
            assert!(sends(&c.on_tick(s(160 + t), &own(500.0), &[])).is_empty());
        }
    }

    #[test]
    fn additional_allocation_when_every_rescue_server_reaches_t_coff() {
        let mut c = origin_with(&[7]);
        let mut m = own(700.0);
        m.redirected.insert(PeerId(7), 89_000);
        let cands = [cand(7, 5000.0), cand(8, 3000.0)];
        assert!(
            sends(&c.on_tick(s(10), &m, &cands)).is_empty(),
            "89% < T_coff"
        );
        m.redirected.insert(PeerId(7), 90_000);
        let acts = c.on_tick(s(11), &m, &cands);
        assert!(matches!(&sends(&acts)[..], [(PeerId(8), Request::Sos(_))]));
    }

    #[test]
    fn t_redi_falls_with_the_redirect_rate() {
        let mut c = origin_with(&[7]);
        let mut m = own(700.0);
        // 500 redirects of 468 accounted bytes: T_redi = 0.75 − 500 × 468 / 1e6.
        m.redirects = 500;
        m.redirect_bytes = 500 * 468;
        let acts = c.on_tick(s(10), &m, &[]);
        let Some(Action::Redirect(plan)) = acts.iter().find(|a| matches!(a, Action::Redirect(_)))
        else {
            panic!("no plan")
        };
        assert!((plan.t_redi - (0.75 - 0.234)).abs() < 1e-12);
        assert_eq!(plan.a_redi, 468.0);
        assert_eq!(plan.targets[0].d_redi, 100_000.0);
        // Past D_out × T_high / A_redi (1603/s): T_redi = 0.
        m.redirects = 1700;
        m.redirect_bytes = 1700 * 468;
        c.on_tick(s(11), &m, &[]);
        assert_eq!(c.status().t_redi, 0.0);
        // A_redi follows the measured size.
        m.redirects = 10;
        m.redirect_bytes = 5000;
        c.on_tick(s(12), &m, &[]);
        assert_eq!(c.status().a_redi, 500.0);
    }

    #[test]
    fn rate_and_shutdown_from_peers() {
        let mut c = origin_with(&[7]);
        let acts = c.on_message(s(5), PeerId(7), request(4, Request::Rate { kbps: 60 }));
        assert_eq!(reply(&acts), Response::Ok);
        assert!(matches!(&acts[1], Action::Redirect(p) if p.targets[0].d_redi == 60_000.0));
        let acts = c.on_message(s(5), PeerId(8), request(1, Request::Rate { kbps: 60 }));
        assert_eq!(reply(&acts), Response::refused(code::NO_RELATIONSHIP));
        let acts = c.on_message(s(5), PeerId(7), request(5, Request::Shutdown));
        assert_eq!(reply(&acts), Response::Ok);
        assert!(acts.contains(&Action::RescuerEnded {
            peer: PeerId(7),
            reason: EndReason::PeerShutdown
        }));
        assert_eq!(c.state(), State::Normal);
        // A SHUTDOWN for nothing is answered OK (both sides may shut down at once).
        let acts = c.on_message(s(5), PeerId(7), request(6, Request::Shutdown));
        assert_eq!(acts.len(), 1);
        assert_eq!(reply(&acts), Response::Ok);
    }

    #[test]
    fn rate_refused_ends_the_rescue() {
        let mut r = Core::new(rescue_cfg()).unwrap();
        r.on_message(s(0), PeerId(1), request(1, Request::Sos(sos())));
        let acts = r.on_message(
            s(1),
            PeerId(1),
            Inbound::Response {
                seq: 1,
                request: Request::Rate { kbps: 3 },
                response: Response::refused(code::NO_RELATIONSHIP),
            },
        );
        assert!(acts.iter().any(|a| matches!(
            a,
            Action::OriginEnded {
                reason: EndReason::PeerRefused,
                ..
            }
        )));
        assert_eq!(r.state(), State::Normal);
    }

    #[test]
    fn lost_connection_ends_the_relationship_on_this_side() {
        let mut c = origin_with(&[7, 8]);
        let acts = c.on_peer_lost(s(9), PeerId(7));
        assert_eq!(
            acts[0],
            Action::RescuerEnded {
                peer: PeerId(7),
                reason: EndReason::ConnectionLost
            }
        );
        assert!(matches!(&acts[1], Action::Redirect(p) if p.targets.len() == 1));
        let mut r = Core::new(rescue_cfg()).unwrap();
        r.on_message(s(0), PeerId(1), request(1, Request::Sos(sos())));
        let acts = r.on_peer_lost(s(1), PeerId(1));
        assert!(matches!(
            &acts[0],
            Action::OriginEnded {
                reason: EndReason::ConnectionLost,
                ..
            }
        ));
        assert_eq!(r.state(), State::Normal);
        assert!(acts.contains(&Action::Advertise {
            d_free_kbps: 5000.0
        }));
    }

    #[test]
    fn a_grant_that_is_no_longer_needed_is_shut_down() {
        let mut c = Core::new(origin_cfg()).unwrap();
        c.on_tick(s(1), &own(800.0), &[cand(1, 5000.0)]);
        let acts = granted(&mut c, 2, 100);
        assert_eq!(
            sends(&acts),
            vec![(PeerId(2), Request::Shutdown)],
            "not the pending peer"
        );
        assert_eq!(c.state(), State::Sos, "still waiting for peer 1");
        c.pending.as_mut().unwrap().unneeded = true;
        let acts = granted(&mut c, 1, 100);
        assert_eq!(sends(&acts), vec![(PeerId(1), Request::Shutdown)]);
        assert_eq!(c.state(), State::Normal);
        assert_eq!(c.rescuers().count(), 0);
    }

    #[test]
    fn d_free_per_state() {
        let mut r = Core::new(rescue_cfg()).unwrap();
        assert_eq!(r.d_free(), 5_000_000.0);
        let acts = r.on_tick(s(1), &own(0.0), &[]);
        assert!(acts.contains(&Action::Advertise {
            d_free_kbps: 5000.0
        }));
        let acts = r.on_tick(s(2), &own(0.0), &[]);
        assert!(
            !acts.iter().any(|a| matches!(a, Action::Advertise { .. })),
            "only on change"
        );
        let c = origin_with(&[7]);
        assert_eq!(c.d_free(), 0.0);
    }
}
