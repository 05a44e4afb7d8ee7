//! Helpers for collectors that turn plain counters into metric families
//! at scrape time, shared by every process's metrics.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::dashboard::latency::{upper_bound, BUCKETS};
use crate::dashboard::LatencyTotals;

/// Status codes counted: 0-599.
const CODES: usize = 600;

/// Responses counted by status code: one atomic per code, so counting a
/// response is one relaxed add and no label lookup.
#[derive(Debug)]
pub struct StatusCounters(Box<[AtomicU64]>);

impl Default for StatusCounters {
    fn default() -> Self {
        StatusCounters((0..CODES).map(|_| AtomicU64::new(0)).collect())
    }
}

impl StatusCounters {
    /// Count one response with this status code (codes of 600 and above are not counted).
    pub fn count(&self, code: u16) {
        if let Some(c) = self.0.get(code as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Responses counted with `code`.
    pub fn get(&self, code: u16) -> u64 {
        self.0.get(code as usize).map_or(0, |c| c.load(Relaxed))
    }

    /// Responses counted, whatever their code.
    pub fn total(&self) -> u64 {
        self.0.iter().map(|n| n.load(Relaxed)).sum()
    }

    /// `(code, count)` for every code seen at least once, as label values, over several sets
    /// of counters (one per worker) added up.
    pub fn nonzero_of<'a>(
        parts: impl IntoIterator<Item = &'a StatusCounters>,
    ) -> Vec<(String, u64)> {
        let mut totals = vec![0u64; CODES];
        for part in parts {
            for (t, n) in totals.iter_mut().zip(part.0.iter()) {
                *t += n.load(Relaxed);
            }
        }
        totals
            .into_iter()
            .enumerate()
            .filter(|&(_, n)| n > 0)
            .map(|(code, n)| (code.to_string(), n))
            .collect()
    }
}

/// Encode response times as a Prometheus histogram: the dashboard's buckets
/// ([`crate::dashboard::latency`]) taken two at a time, so the bounds grow by 2.25× from
/// 50 µs to about 243 s, then `+Inf`. The bounds are some of the dashboard's own, so each
/// exported count is exact.
pub fn response_times(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    t: &LatencyTotals,
) -> std::fmt::Result {
    const { assert!(BUCKETS % 2 == 0) };
    let c = &t.counts;
    let mut buckets = Vec::with_capacity(BUCKETS / 2 + 1);
    buckets.push((upper_bound(0), c[0]));
    for i in (2..BUCKETS).step_by(2) {
        buckets.push((upper_bound(i), c[i - 1] + c[i]));
    }
    buckets.push((f64::INFINITY, c[BUCKETS - 1]));
    enc.encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(t.sum.as_secs_f64(), t.count(), &buckets, None)
}

/// Encode one counter.
pub fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

/// Encode one gauge.
pub fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

/// Encode a family with one label: counters when `is_counter`, else gauges.
pub fn labelled<I: IntoIterator<Item = (String, u64)>>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    is_counter: bool,
    values: I,
) -> std::fmt::Result {
    if is_counter {
        let c = ConstCounter::new(0u64);
        let mut f = enc.encode_descriptor(name, help, None, c.metric_type())?;
        for (l, v) in values {
            ConstCounter::new(v).encode(f.encode_family(&[(label, l)])?)?;
        }
    } else {
        let g = ConstGauge::new(0i64);
        let mut f = enc.encode_descriptor(name, help, None, g.metric_type())?;
        for (l, v) in values {
            ConstGauge::new(v as i64).encode(f.encode_family(&[(label, l)])?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_counters() {
        let s = StatusCounters::default();
        s.count(200);
        s.count(200);
        s.count(404);
        s.count(999);
        assert_eq!(s.get(200), 2);
        assert_eq!(s.get(999), 0);
        assert_eq!(s.total(), 3);
        let v = StatusCounters::nonzero_of([&s]);
        assert_eq!(v, vec![("200".to_owned(), 2), ("404".to_owned(), 1)]);
        let t = StatusCounters::default();
        t.count(404);
        t.count(503);
        let v = StatusCounters::nonzero_of([&s, &t]);
        let want = [("200", 2), ("404", 2), ("503", 1)].map(|(c, n)| (c.to_owned(), n));
        assert_eq!(v, want);
    }

    #[derive(Debug)]
    struct Times(LatencyTotals);

    impl prometheus_client::collector::Collector for Times {
        fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
            response_times(&mut enc, "t_seconds", "times", &self.0)
        }
    }

    /// `(le, cumulative count)` of each bucket line, `_count` and `_sum` of `text`.
    fn histogram_lines(text: &str) -> (Vec<(f64, u64)>, u64, f64) {
        let (mut buckets, mut count, mut sum) = (Vec::new(), 0, 0.0);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (key, value) = line.rsplit_once(' ').unwrap();
            if let Some(le) = key.strip_prefix("t_seconds_bucket{le=\"") {
                let le = le.trim_end_matches("\"}");
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                buckets.push((le, value.parse().unwrap()));
            } else if key == "t_seconds_count" {
                count = value.parse().unwrap();
            } else if key == "t_seconds_sum" {
                sum = value.parse().unwrap();
            }
        }
        (buckets, count, sum)
    }

    /// Every exported bucket counts exactly the observations at or under its bound, across
    /// the histograms added up, and the sum is theirs.
    #[test]
    fn response_times_are_exact_at_every_bound() {
        use crate::dashboard::LatencyHistogram;
        use std::time::Duration;
        let (a, b) = (LatencyHistogram::default(), LatencyHistogram::default());
        let times: Vec<Duration> = [0, 50, 51, 80, 113, 999, 25_000, 3_000_000, 999_000_000_000]
            .into_iter()
            .map(Duration::from_micros)
            .collect();
        for (i, &d) in times.iter().enumerate() {
            if i % 2 == 0 { &a } else { &b }.observe(d);
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Times(LatencyTotals::of([&a, &b]))));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let (buckets, count, sum) = histogram_lines(&text);
        assert_eq!(buckets.len(), BUCKETS / 2 + 1, "{text}");
        assert_eq!(buckets[0].0, 50e-6);
        assert!((buckets[1].0 / buckets[0].0 - 2.25).abs() < 1e-9);
        assert!(buckets[BUCKETS / 2 - 1].0 > 200.0);
        for (le, n) in buckets {
            let under = times.iter().filter(|d| d.as_secs_f64() <= le).count() as u64;
            assert_eq!(n, under, "le {le}");
        }
        assert_eq!(count, times.len() as u64);
        let want: f64 = times.iter().map(Duration::as_secs_f64).sum();
        assert!((sum - want).abs() < 1e-6, "{sum} {want}");
    }
}
