//! Counters of registry and DNS traffic and failures, for the admin endpoint's Prometheus
//! registry. Clones share the counters.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry as PromRegistry;

/// The registry's counters.
#[derive(Debug, Clone, Default)]
pub struct RegistryMetrics {
    /// Registrations written.
    pub publishes: Counter,
    /// Leases granted (one at start; more only after a lease was lost).
    pub leases_granted: Counter,
    /// Lease renewals answered.
    pub keepalives: Counter,
    /// Registration or renewal attempts that failed.
    pub renew_failures: Counter,
    /// Searches answered.
    pub searches: Counter,
    /// Searches that failed (the last candidates are kept).
    pub search_failures: Counter,
    /// Registrations found in a search that were not valid, and skipped.
    pub invalid_entries: Counter,
    /// Candidates of the last successful search (kept while searches fail).
    pub candidates: Gauge,
}

impl RegistryMetrics {
    /// Registers the counters under `rescue_registry_*`.
    pub fn register(&self, reg: &mut PromRegistry) {
        let r = reg.sub_registry_with_prefix("rescue_registry");
        r.register("publishes", "Registrations written", self.publishes.clone());
        r.register(
            "leases_granted",
            "Leases granted",
            self.leases_granted.clone(),
        );
        r.register(
            "keepalives",
            "Lease renewals answered",
            self.keepalives.clone(),
        );
        r.register(
            "renew_failures",
            "Registration or renewal attempts that failed",
            self.renew_failures.clone(),
        );
        r.register("searches", "Searches answered", self.searches.clone());
        r.register(
            "search_failures",
            "Searches that failed",
            self.search_failures.clone(),
        );
        r.register(
            "invalid_entries",
            "Invalid registrations skipped",
            self.invalid_entries.clone(),
        );
        r.register(
            "candidates",
            "Candidates of the last successful search",
            self.candidates.clone(),
        );
    }
}

/// The DNS updater's counters.
#[derive(Debug, Clone, Default)]
pub struct DnsMetrics {
    /// Updates the server accepted.
    pub updates: Counter,
    /// Update attempts that failed (refused, not authorized, no answer, ...).
    pub failures: Counter,
    /// Updates given up because a later one for the same name and address replaced them.
    pub superseded: Counter,
}

impl DnsMetrics {
    /// Registers the counters under `rescue_dns_*`.
    pub fn register(&self, reg: &mut PromRegistry) {
        let r = reg.sub_registry_with_prefix("rescue_dns");
        r.register("updates", "DNS updates accepted", self.updates.clone());
        r.register(
            "failures",
            "DNS update attempts that failed",
            self.failures.clone(),
        );
        r.register(
            "superseded",
            "DNS updates replaced by a later one before they succeeded",
            self.superseded.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_appear_in_the_text_exposition() {
        let mut reg = PromRegistry::default();
        let m = RegistryMetrics::default();
        let d = DnsMetrics::default();
        m.register(&mut reg);
        d.register(&mut reg);
        m.search_failures.inc();
        d.failures.inc_by(3);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(
            text.contains("rescue_registry_search_failures_total 1"),
            "{text}"
        );
        assert!(text.contains("rescue_dns_failures_total 3"), "{text}");
    }
}
