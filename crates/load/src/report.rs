//! The run summary and its renderings: text, JSON, per-second CSV/JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::config::RateProfile;
use crate::request::HttpVersion;
use crate::stats::{ErrorKind, SeriesPoint, Totals};

/// Share of timed-out requests above which a rate step counts as overloading the server
/// (seed 001 §6.2: more than 10% of the issued requests).
pub const OVERLOAD_TIMEOUT_FRACTION: f64 = 0.10;

/// Latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencyStats {
    /// Samples.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

impl LatencyStats {
    pub(crate) fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return LatencyStats::default();
        }
        LatencyStats {
            count: h.len(),
            min: h.min(),
            mean: round2(h.mean()),
            stdev: round2(h.stdev()),
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// Results of one open-loop rate step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepSummary {
    /// Requested rate, requests per second.
    pub rate: f64,
    /// Step length, seconds.
    pub duration_s: f64,
    /// Requests issued during the step.
    pub issued: u64,
    /// Of those, answered with a final response.
    pub completed: u64,
    /// Of those, timed out.
    pub timeouts: u64,
    /// Of those, not sent because too many were in flight (counted as timed out for the
    /// overload rule: they would have waited).
    pub client_limited: u64,
    /// Of those, failed otherwise.
    pub errors: u64,
    /// `(timeouts + client_limited) / issued`.
    pub timeout_fraction: f64,
    /// Issued per second.
    pub offered_rps: f64,
    /// Completed per second.
    pub achieved_rps: f64,
    /// Response data rate of the step, kilobytes (1000 bytes) per second.
    pub kb_per_sec: f64,
    /// Median latency of the step's responses, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Whether more than 10% of the step's requests timed out.
    pub overloaded: bool,
}

/// Capacity found by an open-loop rate profile (seed 001 §6.2).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capacity {
    /// Highest tested rate before the first overloaded step (`None` if the first step
    /// already overloaded the server). If no step overloaded it, this is the highest rate
    /// tested and only a lower bound.
    pub r_max: Option<f64>,
    /// Largest data rate of the steps up to `r_max`, kilobytes per second.
    pub d_max_kb_per_sec: Option<f64>,
    /// The first rate that overloaded the server, if any.
    pub overload_rate: Option<f64>,
    /// Whether any step overloaded the server.
    pub overloaded: bool,
}

/// CPU time used by the generator process during the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuUsage {
    /// User-mode seconds.
    pub user_s: f64,
    /// Kernel-mode seconds.
    pub sys_s: f64,
    /// (user + sys) per completed request, microseconds.
    pub us_per_request: f64,
    /// (user + sys) / (elapsed × threads): near 1 means the generator may be the bottleneck.
    pub utilization: f64,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `closed`, `open`, `trace` or `sessions`.
    pub mode: String,
    /// Target URL (the origin for trace and session runs).
    pub url: String,
    /// Protocol spoken.
    pub protocol: HttpVersion,
    /// Concurrent connections (closed loop) or session slots.
    pub connections: usize,
    /// Worker threads.
    pub threads: usize,
    /// Event loop that drove the connections: `io_uring` or `epoll`.
    pub io: String,
    /// Measured length of the run, seconds.
    pub duration_s: f64,
    /// Requests answered with a final response.
    pub requests: u64,
    /// Requests issued (open loop; otherwise requests started).
    pub issued: u64,
    /// `requests / duration_s`.
    pub requests_per_sec: f64,
    /// Bytes received (heads, bodies and framing).
    pub bytes: u64,
    /// Decoded body bytes received.
    pub body_bytes: u64,
    /// `bytes / duration_s`.
    pub bytes_per_sec: f64,
    /// `bytes_per_sec / 10^6`.
    pub mb_per_sec: f64,
    /// Latency from sending a request to its last response byte, µs.
    pub latency_us: LatencyStats,
    /// Latency from sending a request to the first response byte, µs.
    pub first_byte_us: LatencyStats,
    /// Final responses by status code.
    pub status: BTreeMap<String, u64>,
    /// Failed requests by kind (every kind listed).
    pub errors: BTreeMap<String, u64>,
    /// Sum of `errors`.
    pub errors_total: u64,
    /// Requests that got no complete response within the timeout.
    pub timeouts: u64,
    /// Per-request timeout, seconds.
    pub timeout_s: f64,
    /// Redirects followed.
    pub redirects: u64,
    /// TCP connections opened.
    pub connections_opened: u64,
    /// Open loop: one entry per rate step.
    pub rate_steps: Vec<StepSummary>,
    /// Open loop: R_max and D_max.
    pub capacity: Option<Capacity>,
    /// Generator CPU time.
    pub cpu: CpuUsage,
    /// Per-second time series (written separately as CSV or JSON).
    #[serde(skip)]
    pub series: Vec<SeriesPoint>,
}

fn round2(x: f64) -> f64 {
    if x.is_finite() {
        (x * 100.0).round() / 100.0
    } else {
        0.0
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn per_sec(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        round2(n as f64 / secs)
    } else {
        0.0
    }
}

/// Inputs of [`Summary`] that do not come from the workers.
pub(crate) struct RunInfo<'a> {
    pub mode: &'a str,
    pub url: String,
    pub protocol: HttpVersion,
    pub connections: usize,
    pub threads: usize,
    pub io: &'a str,
    pub elapsed_s: f64,
    pub timeout_s: f64,
    pub profile: Option<&'a RateProfile>,
    pub cpu: (f64, f64),
}

pub(crate) fn build_summary(info: RunInfo<'_>, t: &Totals, series: Vec<SeriesPoint>) -> Summary {
    let secs = info.elapsed_s;
    let mut status = BTreeMap::new();
    for (code, &n) in t.status.iter().enumerate() {
        if n > 0 {
            let key = if code == 0 {
                "other".to_owned()
            } else {
                code.to_string()
            };
            status.insert(key, n);
        }
    }
    let errors = ErrorKind::ALL
        .iter()
        .map(|&k| (k.name().to_owned(), t.error_count(k)))
        .collect();
    let mut rate_steps = Vec::new();
    if let Some(p) = info.profile {
        for (s, st) in p.steps.iter().zip(&t.steps) {
            let d = s.duration.as_secs_f64();
            let timed_out = st.timeouts + st.client_limited;
            let fraction = if st.issued > 0 {
                timed_out as f64 / st.issued as f64
            } else {
                0.0
            };
            let lat = LatencyStats::from_histogram(&st.latency);
            rate_steps.push(StepSummary {
                rate: s.rate,
                duration_s: d,
                issued: st.issued,
                completed: st.completed,
                timeouts: st.timeouts,
                client_limited: st.client_limited,
                errors: st.errors,
                timeout_fraction: (fraction * 10_000.0).round() / 10_000.0,
                offered_rps: per_sec(st.issued, d),
                achieved_rps: per_sec(st.completed, d),
                kb_per_sec: if d > 0.0 {
                    round2(st.bytes as f64 / d / 1000.0)
                } else {
                    0.0
                },
                p50_us: lat.p50,
                p99_us: lat.p99,
                overloaded: fraction > OVERLOAD_TIMEOUT_FRACTION,
            });
        }
    }
    let capacity = info.profile.map(|_| capacity(&rate_steps));
    let cpu_total = info.cpu.0 + info.cpu.1;
    let cpu = CpuUsage {
        user_s: round3(info.cpu.0),
        sys_s: round3(info.cpu.1),
        us_per_request: if t.requests > 0 {
            round2(cpu_total * 1e6 / t.requests as f64)
        } else {
            0.0
        },
        utilization: if secs > 0.0 {
            round2(cpu_total / (secs * info.threads.max(1) as f64))
        } else {
            0.0
        },
    };
    let bytes_per_sec = per_sec(t.bytes, secs);
    Summary {
        mode: info.mode.to_owned(),
        url: info.url,
        protocol: info.protocol,
        connections: info.connections,
        threads: info.threads,
        io: info.io.to_owned(),
        duration_s: (secs * 1000.0).round() / 1000.0,
        requests: t.requests,
        issued: t.issued,
        requests_per_sec: per_sec(t.requests, secs),
        bytes: t.bytes,
        body_bytes: t.body_bytes,
        bytes_per_sec,
        mb_per_sec: round2(bytes_per_sec / 1e6),
        latency_us: LatencyStats::from_histogram(&t.complete),
        first_byte_us: LatencyStats::from_histogram(&t.first_byte),
        status,
        errors,
        errors_total: t.errors_total(),
        timeouts: t.timeouts,
        timeout_s: info.timeout_s,
        redirects: t.redirects,
        connections_opened: t.connections,
        rate_steps,
        capacity,
        cpu,
        series,
    }
}

/// Applies the overload rule to the steps in order.
pub fn capacity(steps: &[StepSummary]) -> Capacity {
    let first_over = steps.iter().position(|s| s.overloaded);
    let upto = first_over.unwrap_or(steps.len());
    let ok = &steps[..upto];
    Capacity {
        r_max: ok.last().map(|s| s.rate),
        d_max_kb_per_sec: ok.iter().map(|s| s.kb_per_sec).reduce(f64::max),
        overload_rate: first_over.map(|i| steps[i].rate),
        overloaded: first_over.is_some(),
    }
}

impl Summary {
    /// The summary as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("summary serializes")
    }

    /// A human-readable report.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "switchyard load: {} {} ({}), {} connections, {} threads, {}",
            self.mode,
            self.url,
            match self.protocol {
                HttpVersion::Http10 => "HTTP/1.0",
                HttpVersion::Http11 => "HTTP/1.1",
            },
            self.connections,
            self.threads,
            self.io
        );
        let _ = writeln!(
            s,
            "  {} requests in {:.2} s: {:.1} req/s, {:.2} MB/s",
            self.requests, self.duration_s, self.requests_per_sec, self.mb_per_sec
        );
        let _ = writeln!(
            s,
            "  latency (µs)   {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
            "p50", "p90", "p99", "p99.9", "max", "mean"
        );
        for (name, l) in [
            ("complete", &self.latency_us),
            ("first byte", &self.first_byte_us),
        ] {
            let _ = writeln!(
                s,
                "    {name:<12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11.1}",
                l.p50, l.p90, l.p99, l.p999, l.max, l.mean
            );
        }
        let statuses: Vec<String> = self
            .status
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            s,
            "  status: {}",
            if statuses.is_empty() {
                "none".to_owned()
            } else {
                statuses.join(" ")
            }
        );
        let errors: Vec<String> = self
            .errors
            .iter()
            .filter(|(_, &v)| v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            s,
            "  errors: {}",
            if errors.is_empty() {
                "none".to_owned()
            } else {
                errors.join(" ")
            }
        );
        let _ = writeln!(
            s,
            "  timeouts: {} (after {} s), redirects followed: {}, connections opened: {}",
            self.timeouts, self.timeout_s, self.redirects, self.connections_opened
        );
        let _ = writeln!(
            s,
            "  cpu: {:.2} s user, {:.2} s sys, {:.2} µs/request, {:.0}% of {} threads",
            self.cpu.user_s,
            self.cpu.sys_s,
            self.cpu.us_per_request,
            self.cpu.utilization * 100.0,
            self.threads
        );
        if self.cpu.utilization > 0.9 {
            let _ = writeln!(
                s,
                "  warning: the generator was nearly saturated; add threads or machines"
            );
        }
        if !self.rate_steps.is_empty() {
            let _ = writeln!(
                s,
                "  {:>10} {:>7} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10} {:>9} {:>9}",
                "rate",
                "secs",
                "issued",
                "done",
                "timeout",
                "frac",
                "req/s",
                "kB/s",
                "p50 µs",
                "p99 µs"
            );
            for st in &self.rate_steps {
                let _ = writeln!(
                    s,
                    "  {:>10.1} {:>7.1} {:>9} {:>9} {:>8} {:>7.1}% {:>10.1} {:>10.1} {:>9} {:>9}{}",
                    st.rate,
                    st.duration_s,
                    st.issued,
                    st.completed,
                    st.timeouts + st.client_limited,
                    st.timeout_fraction * 100.0,
                    st.achieved_rps,
                    st.kb_per_sec,
                    st.p50_us,
                    st.p99_us,
                    if st.overloaded { "  overloaded" } else { "" }
                );
            }
        }
        if let Some(c) = &self.capacity {
            let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
            let _ = writeln!(
                s,
                "  R_max = {} req/s{}, D_max = {} kB/s, overload rate = {}",
                fmt(c.r_max),
                if c.overloaded {
                    ""
                } else {
                    " (not overloaded: lower bound)"
                },
                fmt(c.d_max_kb_per_sec),
                fmt(c.overload_rate)
            );
        }
        s
    }

    /// The per-second series as CSV (with a header line).
    pub fn series_csv(&self) -> String {
        let mut s = String::from(
            "second,requests,issued,bytes,errors,timeouts,p50_us,p90_us,p99_us,max_us\n",
        );
        for p in &self.series {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{}",
                p.second,
                p.requests,
                p.issued,
                p.bytes,
                p.errors,
                p.timeouts,
                p.p50_us,
                p.p90_us,
                p.p99_us,
                p.max_us
            );
        }
        s
    }

    /// The per-second series as a JSON array.
    pub fn series_json(&self) -> String {
        serde_json::to_string(&self.series).expect("series serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(rate: f64, kb: f64, overloaded: bool) -> StepSummary {
        StepSummary {
            rate,
            duration_s: 1.0,
            issued: 0,
            completed: 0,
            timeouts: 0,
            client_limited: 0,
            errors: 0,
            timeout_fraction: 0.0,
            offered_rps: 0.0,
            achieved_rps: 0.0,
            kb_per_sec: kb,
            p50_us: 0,
            p99_us: 0,
            overloaded,
        }
    }

    #[test]
    fn capacity_rule() {
        let c = capacity(&[
            step(100.0, 10.0, false),
            step(200.0, 30.0, false),
            step(300.0, 25.0, true),
            step(400.0, 99.0, false),
        ]);
        assert_eq!(c.r_max, Some(200.0));
        assert_eq!(c.d_max_kb_per_sec, Some(30.0));
        assert_eq!(c.overload_rate, Some(300.0));
        assert!(c.overloaded);
        let c = capacity(&[step(100.0, 10.0, true)]);
        assert_eq!((c.r_max, c.d_max_kb_per_sec), (None, None));
        let c = capacity(&[step(100.0, 10.0, false)]);
        assert_eq!(c.r_max, Some(100.0));
        assert!(!c.overloaded);
    }
}
