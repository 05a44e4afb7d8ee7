//! The rescue state in Prometheus form, for the admin listener's `/metrics` of a node or a
//! switch: the state, the last interval's rates and the lifetime counters.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use switchyard_admin::encode::{counter, gauge, labelled};

use crate::StatusSource;

/// Registers the driver's metrics (`switchyard_rescue_*`), and with `[rescue.registry]` or
/// `[rescue.dns]` the registry's and the DNS updater's counters (`rescue_registry_*`,
/// `rescue_dns_*`).
pub fn register(registry: &mut Registry, source: StatusSource) {
    if let Some(shared) = source.0.upgrade() {
        if let Some(d) = &shared.discovery {
            if d.has_registry() {
                shared.discovery_metrics.registry.register(registry);
            }
            if d.dns_snapshot().is_some() {
                shared.discovery_metrics.dns.register(registry);
            }
        }
    }
    registry.register_collector(Box::new(RescueMetrics(source)));
}

#[derive(Debug)]
struct RescueMetrics(StatusSource);

impl Collector for RescueMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = self.0.status() else {
            return Ok(());
        };
        labelled(
            &mut enc,
            "switchyard_rescue_state",
            "The rescue state (1 for the current one of normal, sos, rescue)",
            "state",
            false,
            ["normal", "sos", "rescue"]
                .into_iter()
                .map(|st| (st.to_string(), (s.state == st) as u64)),
        )?;
        let gauges: [(&str, &str, f64); 8] = [
            (
                "switchyard_rescue_d_out_max_bytes_per_second",
                "D_out",
                s.d_out_max,
            ),
            (
                "switchyard_rescue_d_out_bytes_per_second",
                "d_out of the last control interval",
                s.d_out,
            ),
            (
                "switchyard_rescue_d_self_bytes_per_second",
                "d_self of the last control interval",
                s.d_self,
            ),
            (
                "switchyard_rescue_d_resc_bytes_per_second",
                "d_resc of the last control interval",
                s.d_resc,
            ),
            (
                "switchyard_rescue_d_free_bytes_per_second",
                "d_free, the free rescue capacity",
                s.d_free,
            ),
            (
                "switchyard_rescue_redirects_per_second",
                "R_redi of the last control interval",
                s.r_redi,
            ),
            (
                "switchyard_rescue_t_redi_ratio",
                "T_redi, the redirect threshold (fraction of D_out)",
                s.t_redi,
            ),
            (
                "switchyard_rescue_a_redi_bytes",
                "A_redi, the accounted size of a redirect",
                s.a_redi,
            ),
        ];
        for (name, help, v) in gauges {
            gauge(&mut enc, name, help, v.round() as i64)?;
        }
        gauge(
            &mut enc,
            "switchyard_rescue_rescuers",
            "Rescue servers of this site",
            s.rescuers.len() as i64,
        )?;
        gauge(
            &mut enc,
            "switchyard_rescue_origins",
            "Origins this site rescues",
            s.origins.len() as i64,
        )?;
        let t = &s.totals;
        let counters: [(&str, &str, u64); 10] = [
            (
                "switchyard_rescue_bytes_served",
                "Bytes sent (responses and redirects)",
                t.bytes_served,
            ),
            (
                "switchyard_rescue_requests_served",
                "Requests served for this site's own content",
                t.requests_served,
            ),
            (
                "switchyard_rescue_requests_redirected",
                "Requests redirected to rescue servers",
                t.requests_redirected,
            ),
            (
                "switchyard_rescue_requests_rescued",
                "Requests served on behalf of origins",
                t.requests_rescued,
            ),
            (
                "switchyard_rescue_requests_refused",
                "Requests refused at the redirect bound (503)",
                t.requests_refused,
            ),
            (
                "switchyard_rescue_sos_sent",
                "SOS requests sent",
                t.sos_sent,
            ),
            (
                "switchyard_rescue_rate_messages",
                "RATE requests sent or received",
                t.rate_messages,
            ),
            (
                "switchyard_rescue_relationships_ended",
                "Rescue relationships ended",
                t.relationships_ended,
            ),
            (
                "switchyard_rescue_connections_refused",
                "Peer connections refused (authentication)",
                t.connections_refused,
            ),
            (
                "switchyard_rescue_connections_lost",
                "Peer connections lost with a relationship on them",
                t.connections_lost,
            ),
        ];
        for (name, help, v) in counters {
            counter(&mut enc, name, help, v)?;
        }
        Ok(())
    }
}
