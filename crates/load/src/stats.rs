//! Measurement: histograms, counters, per-step and per-second accumulation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hdrhistogram::Histogram;

/// Largest latency tracked, in microseconds (one hour); larger values are clamped.
pub const MAX_LATENCY_US: u64 = 3_600_000_000;

/// Kinds of failed requests (timeouts are counted separately).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The server refused the connection.
    ConnectRefused,
    /// Any other failure to connect (unreachable, address unavailable, …).
    Connect,
    /// The connection was reset (or the write side was broken).
    Reset,
    /// The server closed the connection before the response was complete.
    Closed,
    /// The response could not be parsed.
    BadResponse,
    /// More redirects than allowed.
    RedirectLimit,
    /// A redirect `Location` that cannot be followed (unsupported scheme, unresolvable host).
    BadRedirect,
    /// Open loop: too many requests already in flight, the request was not sent.
    ClientLimit,
    /// Any other I/O error.
    Io,
}

impl ErrorKind {
    /// All kinds, in report order.
    pub const ALL: [ErrorKind; 9] = [
        ErrorKind::ConnectRefused,
        ErrorKind::Connect,
        ErrorKind::Reset,
        ErrorKind::Closed,
        ErrorKind::BadResponse,
        ErrorKind::RedirectLimit,
        ErrorKind::BadRedirect,
        ErrorKind::ClientLimit,
        ErrorKind::Io,
    ];

    /// Stable snake_case name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::ConnectRefused => "connect_refused",
            ErrorKind::Connect => "connect",
            ErrorKind::Reset => "reset",
            ErrorKind::Closed => "closed",
            ErrorKind::BadResponse => "bad_response",
            ErrorKind::RedirectLimit => "redirect_limit",
            ErrorKind::BadRedirect => "bad_redirect",
            ErrorKind::ClientLimit => "client_limit",
            ErrorKind::Io => "io",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Maps an I/O error on an established connection to an [`ErrorKind`].
pub(crate) fn io_error_kind(e: &std::io::Error) -> ErrorKind {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => ErrorKind::Reset,
        K::UnexpectedEof => ErrorKind::Closed,
        _ => ErrorKind::Io,
    }
}

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

fn new_second_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 2).expect("valid histogram bounds")
}

pub(crate) fn micros(d: std::time::Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, MAX_LATENCY_US)
}

/// Counters of one open-loop rate step.
#[derive(Debug, Clone)]
pub(crate) struct StepTotals {
    pub issued: u64,
    pub completed: u64,
    pub timeouts: u64,
    pub client_limited: u64,
    pub errors: u64,
    pub bytes: u64,
    pub latency: Histogram<u64>,
}

impl StepTotals {
    fn new() -> Self {
        StepTotals {
            issued: 0,
            completed: 0,
            timeouts: 0,
            client_limited: 0,
            errors: 0,
            bytes: 0,
            latency: new_histogram(),
        }
    }

    fn merge(&mut self, o: &StepTotals) {
        self.issued += o.issued;
        self.completed += o.completed;
        self.timeouts += o.timeouts;
        self.client_limited += o.client_limited;
        self.errors += o.errors;
        self.bytes += o.bytes;
        self.latency.add(&o.latency).expect("same bounds");
    }
}

/// Everything one worker measured; merged across workers at the end.
#[derive(Debug, Clone)]
pub(crate) struct Totals {
    pub complete: Histogram<u64>,
    pub first_byte: Histogram<u64>,
    pub status: Vec<u64>,
    pub errors: [u64; ErrorKind::ALL.len()],
    pub timeouts: u64,
    pub redirects: u64,
    pub requests: u64,
    pub issued: u64,
    pub bytes: u64,
    pub body_bytes: u64,
    pub connections: u64,
    pub steps: Vec<StepTotals>,
}

impl Totals {
    pub fn new(steps: usize) -> Self {
        Totals {
            complete: new_histogram(),
            first_byte: new_histogram(),
            status: vec![0; 600],
            errors: [0; ErrorKind::ALL.len()],
            timeouts: 0,
            redirects: 0,
            requests: 0,
            issued: 0,
            bytes: 0,
            body_bytes: 0,
            connections: 0,
            steps: (0..steps).map(|_| StepTotals::new()).collect(),
        }
    }

    pub fn merge(&mut self, o: &Totals) {
        self.complete.add(&o.complete).expect("same bounds");
        self.first_byte.add(&o.first_byte).expect("same bounds");
        for (a, b) in self.status.iter_mut().zip(&o.status) {
            *a += b;
        }
        for (a, b) in self.errors.iter_mut().zip(&o.errors) {
            *a += b;
        }
        self.timeouts += o.timeouts;
        self.redirects += o.redirects;
        self.requests += o.requests;
        self.issued += o.issued;
        self.bytes += o.bytes;
        self.body_bytes += o.body_bytes;
        self.connections += o.connections;
        for (a, b) in self.steps.iter_mut().zip(&o.steps) {
            a.merge(b);
        }
    }

    pub fn error_count(&self, kind: ErrorKind) -> u64 {
        self.errors[kind.index()]
    }

    pub fn errors_total(&self) -> u64 {
        self.errors.iter().sum()
    }
}

/// Counters of one second of the run.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SecondCounts {
    pub requests: u64,
    pub issued: u64,
    pub bytes: u64,
    pub errors: u64,
    pub timeouts: u64,
}

impl SecondCounts {
    fn add(&mut self, o: &SecondCounts) {
        self.requests += o.requests;
        self.issued += o.issued;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.timeouts += o.timeouts;
    }
}

/// One point of the per-second time series.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SeriesPoint {
    /// Second since the start of the run (the point covers `[second, second + 1)`).
    pub second: u64,
    /// Responses completed in this second.
    pub requests: u64,
    /// Requests issued in this second.
    pub issued: u64,
    /// Bytes received in this second.
    pub bytes: u64,
    /// Failed requests in this second.
    pub errors: u64,
    /// Timed-out requests in this second.
    pub timeouts: u64,
    /// Median latency of the responses completed in this second, in µs.
    pub p50_us: u64,
    /// 90th percentile, in µs.
    pub p90_us: u64,
    /// 99th percentile, in µs.
    pub p99_us: u64,
    /// Largest latency, in µs.
    pub max_us: u64,
}

struct OpenSecond {
    counts: SecondCounts,
    hist: Histogram<u64>,
}

/// Per-second aggregation shared by the workers; each flushes a second when it moves past it.
#[derive(Default)]
pub(crate) struct SeriesAgg {
    open: BTreeMap<u64, OpenSecond>,
    done: BTreeMap<u64, SeriesPoint>,
}

impl SeriesAgg {
    fn add(&mut self, second: u64, counts: &SecondCounts, hist: &Histogram<u64>) {
        if let Some(p) = self.done.get_mut(&second) {
            // Late flush of a finished second: keep the counts, the percentiles stay.
            p.requests += counts.requests;
            p.issued += counts.issued;
            p.bytes += counts.bytes;
            p.errors += counts.errors;
            p.timeouts += counts.timeouts;
            return;
        }
        let slot = self.open.entry(second).or_insert_with(|| OpenSecond {
            counts: SecondCounts::default(),
            hist: new_second_histogram(),
        });
        slot.counts.add(counts);
        slot.hist.add(hist).expect("same bounds");
    }

    /// Computes the points of every second before `second` and frees their histograms.
    pub fn finish_before(&mut self, second: u64) {
        while let Some(entry) = self.open.first_entry() {
            if *entry.key() >= second {
                break;
            }
            let (s, o) = entry.remove_entry();
            self.done.insert(s, point(s, &o));
        }
    }

    /// All points from second 0 to `seconds - 1`, missing seconds as zeros.
    pub fn into_points(mut self, seconds: u64) -> Vec<SeriesPoint> {
        self.finish_before(u64::MAX);
        let last = self.done.keys().next_back().map_or(0, |&s| s + 1);
        let n = seconds.max(last);
        (0..n)
            .map(|s| {
                self.done.get(&s).copied().unwrap_or(SeriesPoint {
                    second: s,
                    ..SeriesPoint::default()
                })
            })
            .collect()
    }
}

fn point(second: u64, o: &OpenSecond) -> SeriesPoint {
    let h = &o.hist;
    let q = |x: f64| {
        if h.is_empty() {
            0
        } else {
            h.value_at_quantile(x)
        }
    };
    SeriesPoint {
        second,
        requests: o.counts.requests,
        issued: o.counts.issued,
        bytes: o.counts.bytes,
        errors: o.counts.errors,
        timeouts: o.counts.timeouts,
        p50_us: q(0.5),
        p90_us: q(0.9),
        p99_us: q(0.99),
        max_us: if h.is_empty() { 0 } else { h.max() },
    }
}

/// Live counters read by the progress line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Progress {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    pub timeouts: AtomicU64,
}

impl Progress {
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
            self.timeouts.load(Ordering::Relaxed),
        )
    }
}

/// A worker's recorder: totals, the current second and the live counters.
pub(crate) struct Recorder {
    pub totals: Totals,
    start: Instant,
    second: u64,
    counts: SecondCounts,
    hist: Histogram<u64>,
    series: Arc<Mutex<SeriesAgg>>,
    progress: Arc<Progress>,
}

impl Recorder {
    pub fn new(
        steps: usize,
        start: Instant,
        series: Arc<Mutex<SeriesAgg>>,
        progress: Arc<Progress>,
    ) -> Self {
        Recorder {
            totals: Totals::new(steps),
            start,
            second: 0,
            counts: SecondCounts::default(),
            hist: new_second_histogram(),
            series,
            progress,
        }
    }

    /// Switches to the second containing `now`, flushing the previous one.
    #[inline]
    fn at(&mut self, now: Instant) {
        let s = now.saturating_duration_since(self.start).as_secs();
        if s > self.second {
            self.flush();
            self.second = s;
        }
    }

    /// Hands the current second to the shared series.
    pub fn flush(&mut self) {
        let empty = self.counts.requests
            + self.counts.issued
            + self.counts.errors
            + self.counts.timeouts
            + self.counts.bytes
            == 0;
        if !empty {
            if let Ok(mut s) = self.series.lock() {
                s.add(self.second, &self.counts, &self.hist);
            }
        }
        self.counts = SecondCounts::default();
        self.hist.reset();
    }

    pub fn connection_opened(&mut self) {
        self.totals.connections += 1;
    }

    pub fn issued(&mut self, step: Option<usize>, now: Instant) {
        self.at(now);
        self.totals.issued += 1;
        self.counts.issued += 1;
        if let Some(s) = step.and_then(|s| self.totals.steps.get_mut(s)) {
            s.issued += 1;
        }
    }

    /// `n` closed-loop requests about to be sent.
    pub fn started(&mut self, n: usize, now: Instant) {
        self.at(now);
        self.totals.issued += n as u64;
        self.counts.issued += n as u64;
    }

    /// Bytes of a response that is not the final one of its request (a redirect).
    pub fn redirect_response(&mut self, step: Option<usize>, done: Instant, wire: u64, body: u64) {
        self.at(done);
        self.add_bytes(step, wire, body);
    }

    /// A redirect about to be followed.
    pub fn redirect_followed(&mut self) {
        self.totals.redirects += 1;
    }

    fn add_bytes(&mut self, step: Option<usize>, wire: u64, body: u64) {
        self.totals.bytes += wire;
        self.totals.body_bytes += body;
        self.counts.bytes += wire;
        self.progress.bytes.fetch_add(wire, Ordering::Relaxed);
        if let Some(s) = step.and_then(|s| self.totals.steps.get_mut(s)) {
            s.bytes += wire;
        }
    }

    /// A final response.
    #[allow(clippy::too_many_arguments)]
    pub fn response(
        &mut self,
        step: Option<usize>,
        t0: Instant,
        first: Instant,
        done: Instant,
        status: u16,
        wire: u64,
        body: u64,
    ) {
        self.at(done);
        let lat = micros(done.saturating_duration_since(t0));
        let fb = micros(first.saturating_duration_since(t0)).min(lat);
        self.totals.complete.saturating_record(lat);
        self.totals.first_byte.saturating_record(fb);
        self.hist.saturating_record(lat);
        let idx = usize::from(status);
        let idx = if idx < self.totals.status.len() {
            idx
        } else {
            0
        };
        self.totals.status[idx] += 1;
        self.totals.requests += 1;
        self.counts.requests += 1;
        self.progress.requests.fetch_add(1, Ordering::Relaxed);
        self.add_bytes(step, wire, body);
        if let Some(s) = step.and_then(|s| self.totals.steps.get_mut(s)) {
            s.completed += 1;
            s.latency.saturating_record(lat);
        }
    }

    pub fn error(&mut self, step: Option<usize>, kind: ErrorKind, now: Instant) {
        self.at(now);
        self.totals.errors[kind.index()] += 1;
        self.counts.errors += 1;
        self.progress.errors.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = step.and_then(|s| self.totals.steps.get_mut(s)) {
            if kind == ErrorKind::ClientLimit {
                s.client_limited += 1;
            } else {
                s.errors += 1;
            }
        }
    }

    pub fn timeout(&mut self, step: Option<usize>, now: Instant) {
        self.at(now);
        self.totals.timeouts += 1;
        self.counts.timeouts += 1;
        self.progress.timeouts.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = step.and_then(|s| self.totals.steps.get_mut(s)) {
            s.timeouts += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn recorder_series_and_merge() {
        let start = Instant::now();
        let series = Arc::new(Mutex::new(SeriesAgg::default()));
        let progress = Arc::new(Progress::default());
        let mut r = Recorder::new(1, start, series.clone(), progress.clone());
        let t = |ms| start + Duration::from_millis(ms);
        r.issued(Some(0), t(0));
        r.response(Some(0), t(0), t(1), t(2), 200, 100, 80);
        r.response(None, t(1000), t(1001), t(1010), 404, 50, 0);
        r.error(Some(0), ErrorKind::Reset, t(2500));
        r.timeout(Some(0), t(2600));
        r.flush();
        let mut total = Totals::new(1);
        total.merge(&r.totals);
        assert_eq!(total.requests, 2);
        assert_eq!(total.status[200], 1);
        assert_eq!(total.status[404], 1);
        assert_eq!(total.bytes, 150);
        assert_eq!(total.error_count(ErrorKind::Reset), 1);
        assert_eq!(total.steps[0].completed, 1);
        assert_eq!(total.steps[0].timeouts, 1);
        assert_eq!(progress.snapshot(), (2, 150, 1, 1));
        drop(r);
        let points = std::mem::take(&mut *series.lock().unwrap()).into_points(4);
        assert_eq!(points.len(), 4);
        assert_eq!(points[0].requests, 1);
        assert_eq!(points[0].issued, 1);
        assert_eq!(points[1].requests, 1);
        assert!(points[1].p99_us >= 9_000 && points[1].p99_us <= 10_100);
        assert_eq!(points[2].errors, 1);
        assert_eq!(points[2].timeouts, 1);
        assert_eq!(
            points[3],
            SeriesPoint {
                second: 3,
                ..Default::default()
            }
        );
    }
}
