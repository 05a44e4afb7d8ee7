//! The switch's handoff metrics: handoffs, hand-backs, back-end forwards,
//! fallbacks to relaying, live steering entries and handoff latency.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Counters and the latency histogram; clone-free, share it behind an `Arc`.
#[derive(Debug)]
pub struct HandoffMetrics {
    /// Connections handed to a node by descriptor passing (same host).
    pub handoffs_fd: Counter,
    /// Connections handed to a node with `TCP_REPAIR` (across hosts).
    pub handoffs_repair: Counter,
    /// Connections a node gave back (multiple handoff).
    pub hand_backs: Counter,
    /// Requests a node fetched from another node (back-end forwarding).
    pub backend_forwards: Counter,
    /// Handoffs that could not happen, by reason; the switch relayed instead,
    /// except for `abandoned` ones (closed without a word, see [`crate::mover`]).
    pub fallbacks: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Abandoned handoffs by why the answer is unknown (`cancel_timeout`,
    /// `control_failed`).
    pub abandoned: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Handoffs accepted after their `Cancel` was sent (the node serves them).
    pub late_accepts: Counter,
    /// Connections living on nodes now.
    pub handed_active: Gauge,
    /// Requests answered on handed-off connections (counted when they close).
    pub requests: Counter,
    /// Response bytes nodes sent on handed-off connections (counted when they close).
    pub bytes: Counter,
    /// Steering entries live now.
    pub steering_entries: Gauge,
    /// Switch side: from the decision to hand off until the node's
    /// `Accepted`.
    pub latency: Histogram,
}

impl Default for HandoffMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl HandoffMetrics {
    /// Fresh metrics.
    pub fn new() -> Self {
        HandoffMetrics {
            handoffs_fd: Counter::default(),
            handoffs_repair: Counter::default(),
            hand_backs: Counter::default(),
            backend_forwards: Counter::default(),
            fallbacks: Family::default(),
            abandoned: Family::default(),
            late_accepts: Counter::default(),
            handed_active: Gauge::default(),
            requests: Counter::default(),
            bytes: Counter::default(),
            steering_entries: Gauge::default(),
            // 5 µs … ~80 ms
            latency: Histogram::new(exponential_buckets(5e-6, 2.0, 15)),
        }
    }

    /// Counts a fallback to relaying for `reason`.
    pub fn fallback(&self, reason: &'static str) {
        self.fallbacks
            .get_or_create(&vec![("reason", reason)])
            .inc();
    }

    /// Counts an abandoned handoff for `reason`.
    pub fn abandon(&self, reason: &'static str) {
        self.abandoned
            .get_or_create(&vec![("reason", reason)])
            .inc();
    }

    /// Abandoned handoffs for `reason` so far.
    pub fn abandoned_for(&self, reason: &'static str) -> u64 {
        self.abandoned
            .get_or_create(&vec![("reason", reason)])
            .get()
    }

    /// Fallbacks for `reason` so far.
    pub fn fallbacks_for(&self, reason: &'static str) -> u64 {
        self.fallbacks
            .get_or_create(&vec![("reason", reason)])
            .get()
    }

    /// Records one handoff's latency.
    pub fn observe_latency(&self, d: Duration) {
        self.latency.observe(d.as_secs_f64());
    }

    /// Registers every metric under `switchyard_handoff_*`.
    pub fn register(&self, reg: &mut Registry) {
        let sub = reg.sub_registry_with_prefix("switchyard_handoff");
        sub.register(
            "fd",
            "Connections handed off by descriptor passing (same host)",
            self.handoffs_fd.clone(),
        );
        sub.register(
            "repair",
            "Connections handed off with TCP_REPAIR (across hosts)",
            self.handoffs_repair.clone(),
        );
        sub.register(
            "hand_backs",
            "Connections handed back by a node (multiple handoff)",
            self.hand_backs.clone(),
        );
        sub.register(
            "backend_forwards",
            "Requests forwarded between nodes (back-end forwarding)",
            self.backend_forwards.clone(),
        );
        sub.register(
            "fallbacks",
            "Handoffs that could not happen, by reason; the switch relayed instead (abandoned ones are closed unanswered)",
            self.fallbacks.clone(),
        );
        sub.register(
            "abandoned",
            "Handoffs whose answer stayed unknown, by reason; closed without writing, never relayed",
            self.abandoned.clone(),
        );
        sub.register(
            "late_accepts",
            "Handoffs a node accepted after the switch had sent Cancel",
            self.late_accepts.clone(),
        );
        sub.register(
            "requests",
            "Requests answered on handed-off connections, counted when they close",
            self.requests.clone(),
        );
        sub.register(
            "bytes",
            "Response bytes sent by nodes on handed-off connections, counted when they close",
            self.bytes.clone(),
        );
        sub.register(
            "connections_active",
            "Connections living on nodes now",
            self.handed_active.clone(),
        );
        sub.register(
            "steering_entries",
            "Steering entries live",
            self.steering_entries.clone(),
        );
        sub.register(
            "latency_seconds",
            "Switch-side handoff latency, decision to Accepted",
            self.latency.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_and_encodes() {
        let m = HandoffMetrics::new();
        m.handoffs_repair.inc();
        m.fallback("refused");
        m.observe_latency(Duration::from_micros(30));
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &reg).unwrap();
        assert!(s.contains("switchyard_handoff_repair_total 1"), "{s}");
        assert!(
            s.contains("switchyard_handoff_fallbacks_total{reason=\"refused\"} 1"),
            "{s}"
        );
        assert_eq!(m.fallbacks_for("refused"), 1);
        assert!(s.contains("switchyard_handoff_latency_seconds_count 1"));
    }
}
