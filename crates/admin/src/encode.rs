//! Helpers for collectors that turn plain counters into metric families
//! at scrape time, shared by every process's metrics.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Responses counted by status code: one atomic per code, so counting a
/// response is one relaxed add and no label lookup.
#[derive(Debug)]
pub struct StatusCounters(Box<[AtomicU64]>);

impl Default for StatusCounters {
    fn default() -> Self {
        StatusCounters((0..600).map(|_| AtomicU64::new(0)).collect())
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

    /// `(code, count)` for every code seen at least once, as label values.
    pub fn nonzero(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        self.0.iter().enumerate().filter_map(|(code, n)| {
            let n = n.load(Relaxed);
            (n > 0).then(|| (code.to_string(), n))
        })
    }
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
        let v: Vec<_> = s.nonzero().collect();
        assert_eq!(v, vec![("200".to_owned(), 2), ("404".to_owned(), 1)]);
    }
}
