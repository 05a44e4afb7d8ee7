//! `[node]` configuration: the same keys as the command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// Configuration of one node. Every field has a default except `root`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Address the web server listens on.
    pub listen: SocketAddr,
    /// Document root; nothing outside it is ever served.
    pub root: PathBuf,
    /// Address of the admin listener (`/metrics`, `/healthz`); none if unset.
    pub admin: Option<SocketAddr>,
    /// Worker threads; 0 means one per core.
    pub workers: usize,
    /// Most client connections open at once; further ones wait to be
    /// served (one per worker accepted, the rest in the kernel's accept
    /// queue). Connections handed in by a switch count too (one at the cap
    /// is refused with `Drop{Busy}`); an accept loop waiting for a client
    /// holds no slot. With every slot taken, the connection that has waited longest on its
    /// client (idle, or sending a head) is closed to make room. Unset: derived from the
    /// descriptor limit (raised to its hard limit at start), keeping descriptors for the
    /// node's other needs.
    pub max_connections: Option<usize>,
    /// Budget of the in-memory object cache, in bytes (0 disables it).
    pub cache_bytes: u64,
    /// Replacement policy: `lru`, `lfu` (with periodic aging) or `gdsf`.
    pub cache_policy: String,
    /// Files larger than this bypass the cache and are sent with sendfile.
    pub cache_max_object_bytes: u64,
    /// How often a cached file is checked against the disk again.
    pub cache_revalidate_ms: u64,
    /// LFU aging period.
    pub lfu_aging_interval_ms: u64,
    /// LFU aging factor: every period each count is multiplied by it.
    pub lfu_aging_factor: f64,
    /// Time allowed to receive a whole request head (and body).
    pub header_timeout_ms: u64,
    /// Time an idle keep-alive connection is kept open.
    pub idle_timeout_ms: u64,
    /// Time allowed for a client to take a response's next bytes.
    pub send_timeout_ms: u64,
    /// Longest request line; longer ones are answered 414.
    pub max_request_line: usize,
    /// Largest request head; larger ones are answered 431.
    pub max_head_bytes: usize,
    /// Largest request body; larger ones are answered 413.
    pub max_body_bytes: u64,
    /// File served for a directory.
    pub index: String,
    /// Emulated disk for experiments.
    pub disk: DiskConfig,
    /// UDP address of a switch's `report_listen`: the node pushes its load there (open
    /// connections, disk queue, cache hits and misses) whenever a connection is handed in or
    /// closed. None (the default) sends nothing.
    pub report_to: Option<SocketAddr>,
    /// Path of a Unix-socket control listener on which a switch on the same host hands client
    /// connections over (`Create` with the socket's descriptor attached, `SCM_RIGHTS`). A stale
    /// socket file left at the path is removed at start, and the file is removed at shutdown.
    /// None (the default) takes no same-host handoffs.
    pub handoff_unix: Option<PathBuf>,
    /// Address of a TCP control listener on which a switch on another host hands client
    /// connections over as `TCP_REPAIR` state (the node needs CAP_NET_ADMIN and the switch's
    /// address on a local interface; without them it answers `Drop`). None (the default)
    /// takes no cross-host handoffs.
    pub handoff_listen: Option<SocketAddr>,
    /// The VIP and port this node takes cross-host handoffs for (the switch's listen address,
    /// held on this node's `lo`). When set, the node installs an nftables rule at start (and
    /// removes it at shutdown) that drops, instead of resetting, TCP packets for it that find no
    /// socket: packets arriving while a connection is being restored are then retransmitted by
    /// the client. Needs CAP_NET_ADMIN and nftables; IPv4. None (the default): no rule.
    pub handoff_vip: Option<SocketAddr>,
}

/// Emulated disk: every read that misses the object cache waits as if a
/// single disk served it (FIFO): `latency_us` plus size / bandwidth.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DiskConfig {
    /// Per-read positioning latency in microseconds (0: none).
    pub latency_us: u64,
    /// Transfer rate in bytes per second (0: unlimited).
    pub bandwidth_bytes_per_sec: u64,
}

impl DiskConfig {
    /// Whether any emulation is configured.
    pub fn enabled(&self) -> bool {
        self.latency_us > 0 || self.bandwidth_bytes_per_sec > 0
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            root: PathBuf::new(),
            admin: None,
            workers: 0,
            max_connections: None,
            cache_bytes: 256 * 1024 * 1024,
            cache_policy: "lru".to_owned(),
            cache_max_object_bytes: 1024 * 1024,
            cache_revalidate_ms: 1000,
            lfu_aging_interval_ms: 10_000,
            lfu_aging_factor: 0.5,
            header_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            send_timeout_ms: 60_000,
            max_request_line: 8 * 1024,
            max_head_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            index: "index.html".to_owned(),
            disk: DiskConfig::default(),
            report_to: None,
            handoff_unix: None,
            handoff_listen: None,
            handoff_vip: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `[node]` section of the example file, with its commented-out
    /// handoff keys switched on, is a valid node configuration.
    #[test]
    fn example_handoff_keys_parse() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../switchyard.example.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let text: String = text
            .lines()
            .map(|l| {
                l.strip_prefix("# ")
                    .filter(|r| r.starts_with("handoff_"))
                    .unwrap_or(l)
            })
            .collect::<Vec<_>>()
            .join("\n");
        let doc: toml::Table = toml::from_str(&text).unwrap();
        let node: NodeConfig = doc["node"].clone().try_into().unwrap();
        assert!(node.handoff_unix.is_some());
        assert!(node.handoff_listen.is_some());
        assert_eq!(NodeConfig::default().handoff_unix, None);
    }
}
