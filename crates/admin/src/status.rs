//! The switch's `/status.json`: the nodes, the policy and one-way delivery,
//! for people and scripts. These types are what the switch serializes and
//! what a reader of the page deserializes.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use switchyard_policy::Mechanism;

/// The whole page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SwitchStatus {
    /// The configuration generation in force (1 at start, one more per reload).
    pub generation: u64,
    /// The dispatching policy's name.
    pub policy: String,
    /// Client connections open.
    pub connections_active: u64,
    /// Requests waiting for a node below its in-flight cap.
    pub queue_length: u64,
    /// Requests retried on another node since start.
    pub retries: u64,
    /// The policy's counters.
    pub policy_stats: PolicyCounters,
    /// The nodes of the generation in force, by node id.
    pub nodes: Vec<NodeStatus>,
    /// How responses reach clients.
    pub mechanism: Mechanism,
    /// One-way delivery.
    pub handoff: HandoffStatus,
    /// The site's flash-crowd rescue, with `[rescue.peering]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescue: Option<RescueStatus>,
}

/// The policy's counters since start.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyCounters {
    /// Requests given a node.
    pub decisions: u64,
    /// Requests refused (no node up, or all saturated).
    pub rejections: u64,
    /// Targets mapped to at least one node (LARD family).
    pub targets_mapped: u64,
    /// Extra (target, node) mappings beyond the first per target.
    pub replicas: u64,
    /// Times a target's mapping moved to another node.
    pub reassignments: u64,
    /// Requests `chash` placed past their home node because of the load bound.
    pub spills: u64,
}

/// One node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node id: its index in the configured node list.
    pub id: u32,
    /// The node's HTTP address.
    pub addr: SocketAddr,
    /// Whether the node is taken into account.
    pub up: bool,
    /// Requests the switch has in flight on the node.
    pub active: u64,
    /// Requests sent to the node since start.
    pub requests: u64,
    /// Response bytes relayed from the node since start.
    pub bytes: u64,
    /// Failed requests or connections to the node since start.
    pub failures: u64,
    /// Idle pooled connections to the node.
    pub pool_idle: u64,
    /// Targets the policy maps to the node (LARD family).
    pub targets: u64,
    /// The load the policy uses for the node.
    pub load: f64,
}

/// One-way delivery counters since start, and the steering backend.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffStatus {
    /// Connections handed off as descriptors (same host).
    pub fd: u64,
    /// Connections handed off as `TCP_REPAIR` state (another host).
    pub repair: u64,
    /// Connections nodes gave back to the switch.
    pub hand_backs: u64,
    /// Requests a node served by fetching from another node.
    pub backend_forwards: u64,
    /// Handed-off connections open now.
    pub connections_active: u64,
    /// The steering backend in use (`ebpf`, `nftables`), if any.
    pub steering: Option<String>,
    /// Steering entries installed now.
    pub steering_entries: u64,
    /// Why steering is not available, if it is not.
    pub steering_error: Option<String>,
    /// Handoffs the node accepted after the switch's `Cancel` (served by the node).
    pub late_accepts: u64,
    /// Handoffs whose answer stayed unknown, closed unanswered, by reason.
    pub abandoned: BTreeMap<String, u64>,
    /// Handoffs that could not happen, by reason: relayed instead, except `abandoned`.
    pub fallbacks: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_auto_counters_read_back() {
        let s = RescueStatus {
            server_name: "www.origin.test".into(),
            state: "sos".into(),
            ticks: 9,
            d_out_max: 100_000.0,
            d_out: 80_000.0,
            d_self: 80_000.0,
            d_resc: 0.0,
            r_redi: 12.5,
            t_redi: 0.69,
            a_redi: 468.0,
            d_free: 0.0,
            pending_sos: None,
            rescuers: vec![RescuerEntry {
                peer: "www.rescue.test".into(),
                alias: "www-vh1.rescue.test".into(),
                web: "192.0.2.7:8080".into(),
                d_redi_kbps: 90,
                d_redi: 40_000.0,
                redirects: 7,
            }],
            origins: vec![],
            totals: RescueTotals {
                bytes_served: 123_456,
                requests_served: 100,
                requests_redirected: 7,
                requests_rescued: 0,
                ..RescueTotals::default()
            },
            peers: vec![],
        };
        let auto = s.auto();
        assert_eq!(
            RescueStatus::auto_value(&auto, "TotalBytesServed"),
            Some(123_456.0)
        );
        assert_eq!(
            RescueStatus::auto_value(&auto, "RequestsServed"),
            Some(100.0)
        );
        assert_eq!(
            RescueStatus::auto_value(&auto, "RequestsRedirected"),
            Some(7.0)
        );
        assert_eq!(
            RescueStatus::auto_value(&auto, "RequestsRescued"),
            Some(0.0)
        );
        assert_eq!(RescueStatus::auto_value(&auto, "RRedi"), Some(12.5));
        assert_eq!(RescueStatus::auto_value(&auto, "Rescuers"), Some(1.0));
        assert_eq!(RescueStatus::auto_value(&auto, "Nope"), None);
        assert!(auto.contains("State: sos\n"), "{auto}");
        let page = s.page();
        assert!(
            page.contains("rescued by www.rescue.test as www-vh1.rescue.test"),
            "{page}"
        );
        assert!(page.contains("d_out 80.0 kB/s (80%)"), "{page}");
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<RescueStatus>(&json).unwrap(), s);
    }

    #[test]
    fn round_trips_through_json_with_the_page_s_field_names() {
        let s = SwitchStatus {
            generation: 2,
            policy: "ext-lard".into(),
            connections_active: 3,
            queue_length: 0,
            retries: 1,
            policy_stats: PolicyCounters {
                decisions: 10,
                ..PolicyCounters::default()
            },
            nodes: vec![NodeStatus {
                id: 0,
                addr: "127.0.0.1:8081".parse().unwrap(),
                up: true,
                active: 1,
                requests: 10,
                bytes: 4096,
                failures: 0,
                pool_idle: 2,
                targets: 5,
                load: 1.5,
            }],
            mechanism: Mechanism::Handoff,
            handoff: HandoffStatus {
                steering_error: Some("no \"bpf\"".into()),
                fallbacks: [("timeout".to_owned(), 4)].into_iter().collect(),
                ..HandoffStatus::default()
            },
            rescue: None,
        };
        let text = serde_json::to_string(&s).unwrap();
        for field in [
            "\"policy\":\"ext-lard\"",
            "\"addr\":\"127.0.0.1:8081\"",
            "\"up\":true",
            "\"mechanism\":\"handoff\"",
            "\"steering\":null",
            "\"steering_error\":\"no \\\"bpf\\\"\"",
            "\"fallbacks\":{\"timeout\":4}",
        ] {
            assert!(text.contains(field), "{field} missing in {text}");
        }
        let back: SwitchStatus = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
    }
}

/// A site's rescue state (seed 001, DotSlash): what `/dotslash-status` shows and the `rescue`
/// part of `/status.json` of a node or switch with `[rescue.peering]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RescueStatus {
    /// The server's configured name.
    pub server_name: String,
    /// `normal`, `sos` or `rescue`.
    pub state: String,
    /// Control intervals run since start.
    pub ticks: u64,
    /// D_out, bytes per second.
    pub d_out_max: f64,
    /// The last interval's d_out, bytes per second.
    pub d_out: f64,
    /// The last interval's d_self, bytes per second.
    pub d_self: f64,
    /// The last interval's d_resc, bytes per second.
    pub d_resc: f64,
    /// The last interval's R_redi, redirects per second.
    pub r_redi: f64,
    /// T_redi.
    pub t_redi: f64,
    /// A_redi, bytes.
    pub a_redi: f64,
    /// d_free, bytes per second.
    pub d_free: f64,
    /// The peer an SOS is pending with.
    pub pending_sos: Option<String>,
    /// Our rescue servers.
    pub rescuers: Vec<RescuerEntry>,
    /// The origins we rescue.
    pub origins: Vec<OriginEntry>,
    /// Lifetime counters (the `?auto` counters).
    pub totals: RescueTotals,
    /// The configured peers and their connections.
    pub peers: Vec<PeerEntry>,
}

/// A rescue server as its origin sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RescuerEntry {
    /// The peer's configured name.
    pub peer: String,
    /// The virtual host name it gave us.
    pub alias: String,
    /// Its web address.
    pub web: String,
    /// D_redi, kB/s.
    pub d_redi_kbps: u64,
    /// d_redi(S_r) of the last interval, bytes per second.
    pub d_redi: f64,
    /// Redirects sent to it since start.
    pub redirects: u64,
}

/// An origin as its rescue server sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OriginEntry {
    /// The peer's configured name.
    pub peer: String,
    /// The origin's name.
    pub fqdn: String,
    /// Its virtual host name here.
    pub alias: String,
    /// D_alloc, bytes per second.
    pub d_alloc: f64,
    /// D_redi, bytes per second.
    pub d_redi: f64,
    /// d_resc(S_o) of the last interval, bytes per second.
    pub d_resc: f64,
}

/// Lifetime counters of a rescue site (seed 001 §6.3.4's `?auto` counters and more).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RescueTotals {
    /// Bytes sent: responses and redirects, their real sizes.
    pub bytes_served: u64,
    /// Requests answered for this site's own content, redirects excluded.
    pub requests_served: u64,
    /// Requests redirected to rescue servers.
    pub requests_redirected: u64,
    /// Requests served on behalf of origins.
    pub requests_rescued: u64,
    /// Requests refused at the redirect bound (503).
    pub requests_refused: u64,
    /// SOS requests sent.
    pub sos_sent: u64,
    /// RATE requests sent or received.
    pub rate_messages: u64,
    /// Relationships ended, both roles.
    pub relationships_ended: u64,
    /// Peer connections refused (no certificate, an unknown issuer or an unlisted name).
    pub connections_refused: u64,
    /// Peer connections lost or closed while a relationship or request depended on them.
    pub connections_lost: u64,
}

/// A configured peer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerEntry {
    /// Its name (its certificate's).
    pub name: String,
    /// Its rescue protocol address.
    pub addr: SocketAddr,
    /// Whether a connection to it is open.
    pub connected: bool,
}

impl RescueStatus {
    /// The `?auto` form of `/dotslash-status`: one `Key: value` line each, like Apache's
    /// `server-status?auto`.
    pub fn auto(&self) -> String {
        let t = &self.totals;
        format!(
            "ServerName: {}\nState: {}\nTotalBytesServed: {}\nRequestsServed: {}\nRequestsRedirected: {}\nRequestsRescued: {}\nRequestsRefused: {}\nDOut: {:.0}\nDOutMax: {:.0}\nDSelf: {:.0}\nDResc: {:.0}\nRRedi: {:.2}\nTRedi: {:.4}\nARedi: {:.0}\nDFree: {:.0}\nRescuers: {}\nOrigins: {}\nSosSent: {}\nRateMessages: {}\nRelationshipsEnded: {}\nConnectionsRefused: {}\nConnectionsLost: {}\n",
            self.server_name,
            self.state,
            t.bytes_served,
            t.requests_served,
            t.requests_redirected,
            t.requests_rescued,
            t.requests_refused,
            self.d_out,
            self.d_out_max,
            self.d_self,
            self.d_resc,
            self.r_redi,
            self.t_redi,
            self.a_redi,
            self.d_free,
            self.rescuers.len(),
            self.origins.len(),
            t.sos_sent,
            t.rate_messages,
            t.relationships_ended,
            t.connections_refused,
            t.connections_lost,
        )
    }

    /// Reads one counter of the `?auto` form.
    pub fn auto_value(auto: &str, key: &str) -> Option<f64> {
        auto.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(": "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The human-readable `/dotslash-status` page (plain text).
    pub fn page(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "DotSlash status of {}", self.server_name);
        let _ = writeln!(
            s,
            "state: {}   control intervals: {}",
            self.state, self.ticks
        );
        let pct = |v: f64| {
            if self.d_out_max > 0.0 {
                100.0 * v / self.d_out_max
            } else {
                0.0
            }
        };
        let _ = writeln!(
            s,
            "D_out {:.1} kB/s   d_out {:.1} kB/s ({:.0}%)   d_self {:.1}   d_resc {:.1}   d_free {:.1}",
            self.d_out_max / 1000.0,
            self.d_out / 1000.0,
            pct(self.d_out),
            self.d_self / 1000.0,
            self.d_resc / 1000.0,
            self.d_free / 1000.0
        );
        let _ = writeln!(
            s,
            "R_redi {:.1}/s   T_redi {:.3}   A_redi {:.0} B",
            self.r_redi, self.t_redi, self.a_redi
        );
        if let Some(p) = &self.pending_sos {
            let _ = writeln!(s, "SOS pending with {p}");
        }
        for r in &self.rescuers {
            let _ = writeln!(
                s,
                "rescued by {} as {} ({})   D_redi {} kB/s   d_redi {:.1} kB/s   redirects {}",
                r.peer,
                r.alias,
                r.web,
                r.d_redi_kbps,
                r.d_redi / 1000.0,
                r.redirects
            );
        }
        for o in &self.origins {
            let _ = writeln!(
                s,
                "rescuing {} ({}) as {}   D_alloc {:.1} kB/s   D_redi {:.1}   d_resc {:.1}",
                o.fqdn,
                o.peer,
                o.alias,
                o.d_alloc / 1000.0,
                o.d_redi / 1000.0,
                o.d_resc / 1000.0
            );
        }
        for p in &self.peers {
            let _ = writeln!(
                s,
                "peer {} at {}: {}",
                p.name,
                p.addr,
                if p.connected {
                    "connected"
                } else {
                    "not connected"
                }
            );
        }
        s.push_str(&self.auto());
        s
    }
}
