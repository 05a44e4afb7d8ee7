//! Outbound data-rate monitoring (seed 001 §4.3, §5.2): the counters the request path adds to,
//! taken once per control interval as a [`Measurement`] for [`crate::Core::on_tick`].
//!
//! Only outbound HTTP is counted: each response by its header plus content bytes. A redirect of
//! n bytes counts A_redi = (n + 358) × U, because its five packets carry 358 bytes of TCP/IP and
//! Ethernet overhead and U of the link is usable for HTTP (§4.3). Counters keep a window that is
//! emptied every control interval and lifetime totals (for the status page's counters).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::config::{RescueConfig, REDIRECT_OVERHEAD_BYTES};
use crate::PeerId;

/// The bytes a redirect response of `response_bytes` counts for, with U = `usable`:
/// (n + 358) × U, rounded (A_redi of §4.3; 468 for n = 227 and U = 0.8).
pub fn redirect_accounting(response_bytes: u64, usable: f64) -> u64 {
    ((response_bytes.saturating_add(REDIRECT_OVERHEAD_BYTES)) as f64 * usable).round() as u64
}

/// What one control interval's traffic was.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Measurement {
    /// The time the counters cover (normally I_ctrl).
    pub elapsed: Duration,
    /// Bytes for this server's own sites, redirects counted by their accounting size (d_self).
    pub self_bytes: u64,
    /// Bytes served on behalf of each origin (d_resc(S_o)).
    pub rescue_bytes: BTreeMap<PeerId, u64>,
    /// Redirects sent (R_redi).
    pub redirects: u64,
    /// The accounting bytes of those redirects (part of `self_bytes`).
    pub redirect_bytes: u64,
    /// Bytes of the files redirected to each rescue server (d_redi(S_r), §5.4.2).
    pub redirected: BTreeMap<PeerId, u64>,
}

impl Measurement {
    /// An interval of `elapsed` with no traffic.
    pub fn idle(elapsed: Duration) -> Self {
        Measurement {
            elapsed,
            ..Measurement::default()
        }
    }

    /// Adds another meter's counters for the same interval (per-thread meters).
    pub fn merge(&mut self, other: &Measurement) {
        self.elapsed = self.elapsed.max(other.elapsed);
        self.self_bytes = self.self_bytes.saturating_add(other.self_bytes);
        for (p, b) in &other.rescue_bytes {
            let e = self.rescue_bytes.entry(*p).or_default();
            *e = e.saturating_add(*b);
        }
        self.redirects = self.redirects.saturating_add(other.redirects);
        self.redirect_bytes = self.redirect_bytes.saturating_add(other.redirect_bytes);
        for (p, b) in &other.redirected {
            let e = self.redirected.entry(*p).or_default();
            *e = e.saturating_add(*b);
        }
    }

    /// Bytes served for all origins (d_resc).
    pub fn rescue_total(&self) -> u64 {
        self.rescue_bytes
            .values()
            .fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// All outbound bytes (d_out = d_self + d_resc).
    pub fn out_bytes(&self) -> u64 {
        self.self_bytes.saturating_add(self.rescue_total())
    }
}

/// Lifetime counters (the `?auto` status counters of §6.3.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Bytes sent (responses and redirects, their real sizes).
    pub bytes_served: u64,
    /// Requests answered for this server's own sites, redirects excluded.
    pub requests_served: u64,
    /// Requests redirected to rescue servers.
    pub requests_redirected: u64,
    /// Requests served on behalf of origins.
    pub requests_rescued: u64,
}

/// The traffic counters. The request path calls [`Meter::served`], [`Meter::rescued`] and
/// [`Meter::redirected`] for every response; the control loop calls [`Meter::take`] once per
/// interval.
#[derive(Debug, Clone)]
pub struct Meter {
    usable: f64,
    since: Duration,
    cur: Measurement,
    totals: Totals,
}

impl Meter {
    /// Counters starting at `now`, accounting redirects with U of `cfg`.
    pub fn new(cfg: &RescueConfig, now: Duration) -> Self {
        Meter {
            usable: cfg.usable,
            since: now,
            cur: Measurement::default(),
            totals: Totals::default(),
        }
    }

    /// A response for this server's own site: `bytes` of header and content.
    pub fn served(&mut self, bytes: u64) {
        self.cur.self_bytes = self.cur.self_bytes.saturating_add(bytes);
        self.totals.bytes_served = self.totals.bytes_served.saturating_add(bytes);
        self.totals.requests_served += 1;
    }

    /// A response served on behalf of `origin` (a rescue proxy's hit or miss).
    pub fn rescued(&mut self, origin: PeerId, bytes: u64) {
        let e = self.cur.rescue_bytes.entry(origin).or_default();
        *e = e.saturating_add(bytes);
        self.totals.bytes_served = self.totals.bytes_served.saturating_add(bytes);
        self.totals.requests_rescued += 1;
    }

    /// A redirect of `response_bytes` sending a request for a file of `file_bytes` to rescue
    /// server `to`. Returns the bytes it is accounted for.
    pub fn redirected(&mut self, to: PeerId, response_bytes: u64, file_bytes: u64) -> u64 {
        let a = redirect_accounting(response_bytes, self.usable);
        self.cur.self_bytes = self.cur.self_bytes.saturating_add(a);
        self.cur.redirects += 1;
        self.cur.redirect_bytes = self.cur.redirect_bytes.saturating_add(a);
        let e = self.cur.redirected.entry(to).or_default();
        *e = e.saturating_add(file_bytes);
        self.totals.bytes_served = self.totals.bytes_served.saturating_add(response_bytes);
        self.totals.requests_redirected += 1;
        a
    }

    /// Outbound bytes counted so far in the current interval (d_out × time so far).
    pub fn out_bytes(&self) -> u64 {
        self.cur.out_bytes()
    }

    /// Ends the interval at `now`: returns its counters and starts a new one.
    pub fn take(&mut self, now: Duration) -> Measurement {
        let mut m = std::mem::take(&mut self.cur);
        m.elapsed = now.saturating_sub(self.since);
        self.since = now;
        m
    }

    /// The lifetime counters.
    pub fn totals(&self) -> Totals {
        self.totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_accounting_of_the_paper() {
        assert_eq!(redirect_accounting(227, 0.8), 468);
        // Fig. 10's estimate: 585 bytes × 95%.
        assert_eq!(redirect_accounting(585 - 358, 0.95), 556);
    }

    #[test]
    fn counts_an_interval_and_the_lifetime() {
        let cfg = RescueConfig::new("a.b", [1, 1, 1, 1].into(), 80, 1000.0);
        let mut m = Meter::new(&cfg, Duration::from_secs(10));
        m.served(1000);
        m.rescued(PeerId(3), 500);
        assert_eq!(m.redirected(PeerId(7), 227, 4096), 468);
        assert_eq!(m.out_bytes(), 1000 + 500 + 468);
        let got = m.take(Duration::from_millis(11_000));
        assert_eq!(got.elapsed, Duration::from_secs(1));
        assert_eq!(got.self_bytes, 1468);
        assert_eq!(got.rescue_total(), 500);
        assert_eq!(got.redirects, 1);
        assert_eq!(got.redirect_bytes, 468);
        assert_eq!(got.redirected[&PeerId(7)], 4096);
        assert_eq!(m.out_bytes(), 0);
        m.served(10);
        assert_eq!(
            m.totals(),
            Totals {
                bytes_served: 1000 + 500 + 227 + 10,
                requests_served: 2,
                requests_redirected: 1,
                requests_rescued: 1,
            }
        );
        let mut a = m.take(Duration::from_secs(12));
        a.merge(&got);
        assert_eq!(a.self_bytes, 1478);
        assert_eq!(a.redirected[&PeerId(7)], 4096);
        assert_eq!(a.out_bytes(), 1978);
    }
}
