//! Response times as a fixed set of counting buckets: recording one is a relaxed add on an
//! atomic, and the p50/p99 of any period are computed from the difference of two snapshots
//! (pure, no clock).
//!
//! The buckets grow by 1.5× from 50 µs; the last one is open-ended (about 246 s and more).
//! `prometheus_client`'s histogram is not used here because it cannot be snapshotted without a
//! scrape encoder and holds a lock per observation.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::LazyLock;
use std::time::Duration;

/// Number of buckets.
pub const BUCKETS: usize = 40;
/// Upper bound of the first bucket, in seconds.
const FIRST: f64 = 50e-6;
/// Growth from one bucket bound to the next.
const GROWTH: f64 = 1.5;

/// Counts per bucket (each bucket's own, not cumulative).
pub type LatencyCounts = [u64; BUCKETS];

/// The upper bound of every bucket but the open-ended last, in seconds, computed once.
static BOUNDS: LazyLock<[f64; BUCKETS - 1]> =
    LazyLock::new(|| std::array::from_fn(|i| FIRST * GROWTH.powi(i as i32)));

/// Upper bound of bucket `i` in seconds (infinite for the last one).
pub fn upper_bound(i: usize) -> f64 {
    BOUNDS.get(i).copied().unwrap_or(f64::INFINITY)
}

/// The bucket a duration falls in: the first whose upper bound is not below it. A binary
/// search over the bounds (every response is counted; a logarithm per response cost about a
/// hundred instructions).
pub fn bucket_of(d: Duration) -> usize {
    let s = d.as_secs_f64();
    BOUNDS.partition_point(|&bound| bound < s)
}

/// A histogram of response times and their sum. The tasks of one worker observe into one
/// (a server keeps one per worker, `switchyard_runtime::per_worker`); readers add them up
/// with [`LatencyTotals`].
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; BUCKETS],
    /// Sum of the times observed, in nanoseconds (wraps after 584 years of response time).
    sum_ns: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    /// Count one response time.
    pub fn observe(&self, d: Duration) {
        self.buckets[bucket_of(d)].fetch_add(1, Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> LatencyCounts {
        std::array::from_fn(|i| self.buckets[i].load(Relaxed))
    }
}

/// The counts and the summed time of several histograms (one per worker) together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyTotals {
    /// Responses per bucket.
    pub counts: LatencyCounts,
    /// All their times added up.
    pub sum: Duration,
}

impl LatencyTotals {
    /// The totals of `parts`.
    pub fn of<'a>(parts: impl IntoIterator<Item = &'a LatencyHistogram>) -> Self {
        let mut counts = [0; BUCKETS];
        let mut sum_ns = 0u64;
        for h in parts {
            for (c, b) in counts.iter_mut().zip(&h.buckets) {
                *c += b.load(Relaxed);
            }
            sum_ns = sum_ns.wrapping_add(h.sum_ns.load(Relaxed));
        }
        LatencyTotals {
            counts,
            sum: Duration::from_nanos(sum_ns),
        }
    }

    /// How many responses were counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// `now - before` per bucket; `None` if any bucket went down (the histogram was replaced).
pub fn delta(now: &LatencyCounts, before: &LatencyCounts) -> Option<LatencyCounts> {
    let mut out = [0u64; BUCKETS];
    for i in 0..BUCKETS {
        out[i] = now[i].checked_sub(before[i])?;
    }
    Some(out)
}

/// The `q` quantile (0 < q ≤ 1) of the observations counted in `c`, interpolated linearly
/// inside its bucket as Prometheus' `histogram_quantile` does; `None` without observations.
/// A quantile in the open last bucket is given as that bucket's lower bound.
pub fn quantile(c: &LatencyCounts, q: f64) -> Option<Duration> {
    let total: u64 = c.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut below = 0u64;
    for (i, &n) in c.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let lower = if i == 0 { 0.0 } else { upper_bound(i - 1) };
            let upper = upper_bound(i);
            if upper.is_infinite() {
                return Some(Duration::from_secs_f64(lower));
            }
            let within = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return Some(Duration::from_secs_f64(lower + (upper - lower) * within));
        }
        below += n;
    }
    // Only reached through rounding of `rank`: the highest observation's bucket.
    let last = c.iter().rposition(|&n| n > 0)?;
    Some(Duration::from_secs_f64(upper_bound(last).min(1e6)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    #[test]
    fn buckets_cover_microseconds_to_minutes() {
        assert_eq!(bucket_of(Duration::ZERO), 0);
        assert_eq!(bucket_of(Duration::from_micros(50)), 0);
        assert_eq!(bucket_of(Duration::from_micros(51)), 1);
        assert_eq!(bucket_of(Duration::from_micros(75)), 1);
        assert_eq!(bucket_of(Duration::from_secs(3600)), BUCKETS - 1);
        assert!(upper_bound(BUCKETS - 2) > 200.0);
    }

    #[test]
    fn totals_add_up_the_parts() {
        let (a, b) = (LatencyHistogram::default(), LatencyHistogram::default());
        a.observe(ms(1.0));
        a.observe(ms(2.0));
        b.observe(ms(1.0));
        let t = LatencyTotals::of([&a, &b]);
        assert_eq!(t.count(), 3);
        assert_eq!(t.sum, Duration::from_millis(4));
        assert_eq!(t.counts[bucket_of(ms(1.0))], 2);
        assert_eq!(t.counts[bucket_of(ms(2.0))], 1);
        assert_eq!(LatencyTotals::of([&a]).counts, a.snapshot());
    }

    #[test]
    fn quantiles_of_a_known_spread() {
        let h = LatencyHistogram::default();
        let before = h.snapshot();
        for _ in 0..98 {
            h.observe(ms(1.0));
        }
        h.observe(ms(100.0));
        h.observe(ms(100.0));
        let d = delta(&h.snapshot(), &before).unwrap();
        let p50 = quantile(&d, 0.5).unwrap();
        let p99 = quantile(&d, 0.99).unwrap();
        // Within the 1.5× bucket of the true values.
        assert!(p50 > ms(1.0 / 1.5) && p50 <= ms(1.0 * 1.5), "{p50:?}");
        assert!(p99 > ms(100.0 / 1.5) && p99 <= ms(100.0 * 1.5), "{p99:?}");
        assert_eq!(quantile(&[0; BUCKETS], 0.5), None);
        let mut far = [0; BUCKETS];
        far[BUCKETS - 1] = 3;
        assert_eq!(
            quantile(&far, 0.99),
            Some(Duration::from_secs_f64(upper_bound(BUCKETS - 2)))
        );
    }

    #[test]
    fn a_replaced_histogram_has_no_delta() {
        let mut a = [0; BUCKETS];
        let mut b = [0; BUCKETS];
        a[3] = 5;
        b[3] = 2;
        assert!(delta(&b, &a).is_none());
        assert_eq!(delta(&a, &b).unwrap()[3], 3);
    }

    proptest! {
        /// Every duration lands in the bucket whose bounds hold it, and a quantile of one
        /// observation is within that bucket.
        #[test]
        fn bucket_bounds_hold_the_value(us in 0u64..400_000_000) {
            let d = Duration::from_micros(us);
            let i = bucket_of(d);
            let s = d.as_secs_f64();
            prop_assert!(s <= upper_bound(i));
            if i > 0 {
                prop_assert!(s > upper_bound(i - 1));
            }
            let mut c = [0; BUCKETS];
            c[i] = 1;
            let q = quantile(&c, 0.5).unwrap().as_secs_f64();
            prop_assert!(q <= upper_bound(i) && (i == 0 || q >= upper_bound(i - 1) * (1.0 - 1e-9)));
        }

        /// Quantiles never decrease with q.
        #[test]
        fn quantiles_are_monotonic(counts in proptest::collection::vec(0u64..50, BUCKETS)) {
            let c: LatencyCounts = counts.try_into().unwrap();
            let mut last = Duration::ZERO;
            for q in [0.01, 0.1, 0.5, 0.9, 0.99, 1.0] {
                if let Some(v) = quantile(&c, q) {
                    prop_assert!(v >= last);
                    last = v;
                }
            }
        }
    }
}
