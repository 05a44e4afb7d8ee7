//! `[switch]` configuration and the flags of `switchyard switch` (the same keys).

use std::fmt;
use std::net::SocketAddr;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use switchyard_policy::{PolicyConfig, PolicyKind};

use crate::error::SwitchError;

pub use switchyard_handoff::link::ControlAddr;

/// One back-end node: its address and, optionally, a weight, its own in-flight cap, its
/// handoff control address and the public name clients reach it by.
///
/// In the config file a node is either a string (`"127.0.0.1:8081"`, or with settings after
/// commas: `"127.0.0.1:8081,weight=2,control=unix:/run/n0.sock,public=www1.example.com"`, the
/// form `--node` takes) or a table (`{ addr = "127.0.0.1:8081", weight = 2, max_inflight = 64,
/// control = "...", public = "www1.example.com:8080" }`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEntry {
    /// Where the node serves HTTP.
    pub addr: SocketAddr,
    /// Relative weight for `wrr` and `chash` (default 1).
    pub weight: u32,
    /// Requests in flight on this node at most; overrides `node_max_inflight`.
    pub max_inflight: Option<u32>,
    /// The node's handoff control listener (its `handoff_unix` or `handoff_listen`). Without
    /// it the node's connections are always relayed.
    pub control: Option<ControlAddr>,
    /// With `mechanism = "redirect"`: the host and optional port (`www1.example.com`,
    /// `www1.example.com:8080`, `203.0.113.7:80`, `[2001:db8::7]:80`) the `Location` names
    /// instead of `addr`, for a node clients reach by another name or address (behind NAT, or
    /// by a name its certificate or virtual host expects).
    pub public: Option<String>,
}

/// Checks a node's public `host[:port]`: a DNS name, an IPv4 address or a bracketed IPv6
/// address, and a port from 1 to 65535; nothing else may go into a `Location`.
pub fn check_public(s: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("node public name `{s}`: {why}"));
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return bad("an IPv6 address needs its closing `]`");
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return bad("not an IPv6 address in brackets");
        }
        match after {
            "" => (None, None),
            p => match p.strip_prefix(':') {
                Some(p) => (None, Some(p)),
                None => return bad("only `:PORT` may follow the address"),
            },
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(s), None),
        }
    };
    if let Some(h) = host {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if h.is_empty() || h.len() > 253 || !h.split('.').all(label_ok) {
            return bad("not a host name or IPv4 address");
        }
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 && !p.starts_with('+') => {}
            _ => return bad("the port must be a number from 1 to 65535"),
        }
    }
    Ok(s.to_owned())
}

impl NodeEntry {
    /// A node of weight 1 with the switch-wide in-flight cap and no handoff control address.
    pub fn new(addr: SocketAddr) -> Self {
        NodeEntry {
            addr,
            weight: 1,
            max_inflight: None,
            control: None,
            public: None,
        }
    }
}

impl std::str::FromStr for NodeEntry {
    type Err = String;
    /// `ADDR[,weight=N][,max_inflight=N][,control=unix:PATH|IP:PORT][,public=HOST[:PORT]]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.trim().split(',');
        let addr = parts.next().unwrap_or("").trim();
        let addr = addr
            .parse()
            .map_err(|_| format!("invalid node address `{addr}` (want IP:PORT)"))?;
        let mut e = NodeEntry::new(addr);
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("node setting `{kv}` is not KEY=VALUE"))?;
            let (k, v) = (k.trim(), v.trim());
            let num = |v: &str| {
                v.parse::<u32>()
                    .map_err(|_| format!("node setting {k}: `{v}` is not a number"))
            };
            match k {
                "weight" => e.weight = num(v)?,
                "max_inflight" => e.max_inflight = Some(num(v)?),
                "control" => e.control = Some(v.parse()?),
                "public" => e.public = Some(check_public(v)?),
                _ => {
                    return Err(format!(
                        "unknown node setting `{k}` (weight, max_inflight, control, public)"
                    ))
                }
            }
        }
        Ok(e)
    }
}

impl<'de> Deserialize<'de> for NodeEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            addr: SocketAddr,
            #[serde(default = "one")]
            weight: u32,
            #[serde(default)]
            max_inflight: Option<u32>,
            #[serde(default)]
            control: Option<ControlAddr>,
            #[serde(default)]
            public: Option<String>,
        }
        fn one() -> u32 {
            1
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a node \"IP:PORT[,weight=N][,control=...][,public=...]\" or a table { addr, weight, max_inflight, control, public }",
                )
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<NodeEntry, E> {
                s.parse().map_err(E::custom)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NodeEntry, A::Error> {
                let t = Table::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let public = t
                    .public
                    .as_deref()
                    .map(check_public)
                    .transpose()
                    .map_err(de::Error::custom)?;
                Ok(NodeEntry {
                    addr: t.addr,
                    weight: t.weight,
                    max_inflight: t.max_inflight,
                    control: t.control,
                    public,
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// How responses reach clients (shared with the lab).
pub use switchyard_policy::Mechanism;

/// What happens to the second and later requests of a handed-off connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Persistent {
    /// `backend-forwarding`/`multiple-handoff` as `ext-lard` decides per request when the policy
    /// is `ext-lard`; `single` otherwise.
    #[default]
    Auto,
    /// The node the connection went to serves all of its requests (single handoff).
    Single,
    /// The node asks the switch per request; a request for another node's content moves the
    /// connection there once the responses sent are acknowledged (seed 003 §7.2).
    MultipleHandoff,
    /// The node asks the switch per request; another node's content is fetched from that node
    /// over persistent node-to-node connections (seed 003 §3.3).
    BackendForwarding,
}

/// Steering backend for handoffs across hosts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SteeringKind {
    /// tc/eBPF on `steering_iface` (needs clang and bpftool at start, see scripts/install-lab-deps);
    /// when it cannot be set up the switch falls back to nftables.
    #[default]
    Ebpf,
    /// An nftables netdev ingress map with `fwd`.
    Nftables,
}

/// The policy setting: a name (`policy = "lard"`) or a full `[switch.policy]` table with the
/// keys of [`PolicyConfig`] (`name`, `l_idle`, `eps`, `classes`, ...).
fn de_policy<'de, D: Deserializer<'de>>(d: D) -> Result<PolicyConfig, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = PolicyConfig;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a policy name or a policy table")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<PolicyConfig, E> {
            s.parse::<PolicyKind>()
                .map(PolicyConfig::new)
                .map_err(E::custom)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PolicyConfig, A::Error> {
            PolicyConfig::deserialize(de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_any(V)
}

/// Configuration of the switch (`[switch]` in the config file). Every key has a default; `nodes`
/// must not be empty when the switch starts.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SwitchConfig {
    /// Address clients connect to (`--listen`).
    pub listen: SocketAddr,
    /// The back-end nodes (`--node`, repeatable). Node ids are their positions in this list.
    pub nodes: Vec<NodeEntry>,
    /// Dispatching policy: a name (`rr wrr lc chash lard lard-r ext-lard cap`, `--policy`) or a
    /// table with the policy's settings. Default `lard`.
    #[serde(deserialize_with = "de_policy")]
    pub policy: PolicyConfig,
    /// Admin listener: `/metrics`, `/healthz`, `/status.json` (`--admin`); none if unset.
    pub admin: Option<SocketAddr>,
    /// UDP address on which nodes push their load reports (`--report-listen`); none if unset.
    /// Nodes send to it when their `report_to` names it.
    pub report_listen: Option<SocketAddr>,
    /// Worker threads serving client connections, each a single-threaded runtime with its own
    /// `SO_REUSEPORT` listener; 0 = one per core (`--workers`).
    pub workers: usize,
    /// Client connections open at once (`--max-connections`). With every slot taken, the
    /// connection that has waited longest on its client (idle, or sending a head) is closed to
    /// make room; with none waiting, a new connection is answered 503 and closed. Unset: derived
    /// from the descriptor limit (raised to its hard limit at start), keeping descriptors for
    /// node, control and admin connections and splice pipes ([`SwitchConfig::connection_cap`]).
    pub max_connections: Option<usize>,
    /// Requests in flight on one node at most, 0 = no cap (`--node-max-inflight`). A node at its
    /// cap is not chosen; when every node is at its cap requests wait in the queue.
    pub node_max_inflight: u32,
    /// Requests that may wait for a node at once; beyond it they are answered 503.
    pub queue_max: usize,
    /// Longest wait in the queue before a 503.
    pub queue_timeout_ms: u64,
    /// `Retry-After` seconds sent with a 503.
    pub retry_after_secs: u32,
    /// Time for a client to send a whole request head (and body); 408 after that.
    pub header_timeout_ms: u64,
    /// Accept a client's connection only once its first bytes have arrived, or after this long
    /// without any (`TCP_DEFER_ACCEPT`, rounded up by the kernel to 1, 3, 7, ... s); 0 = accept
    /// at the handshake (`--defer-accept-ms`). A request sent with the handshake is then read
    /// right after the accept, with no wait for readiness; in the lab it took 14-17 % off the
    /// switch's CPU per handed-off `Connection: close` request (bench/RESULTS.md). A silent
    /// client's header timeout counts from when it is accepted. Read at start: a reload cannot
    /// change it.
    pub defer_accept_ms: u64,
    /// Idle keep-alive client connections close after this long.
    pub idle_timeout_ms: u64,
    /// A client that takes no response bytes for this long is dropped.
    pub send_timeout_ms: u64,
    /// Time to open a connection to a node.
    pub connect_timeout_ms: u64,
    /// Time for a node to start its response (and between body reads); then 504.
    pub node_timeout_ms: u64,
    /// Longest request line; longer ones are answered 414.
    pub max_request_line: usize,
    /// Largest request head; larger ones are answered 431.
    pub max_head_bytes: usize,
    /// Largest request body; larger ones are answered 413.
    pub max_body_bytes: u64,
    /// Largest response head accepted from a node; larger ones are answered 502.
    pub max_response_head_bytes: usize,
    /// Idle persistent connections kept per node.
    pub pool_max_idle: usize,
    /// Path fetched by the active health check; any status below 500 is healthy.
    pub health_path: String,
    /// Time between health checks of a node, 0 = no active checks.
    pub health_interval_ms: u64,
    /// Time allowed for one health check.
    pub health_timeout_ms: u64,
    /// Consecutive failures (checks or failed node connections) that take a node out.
    pub health_fall: u32,
    /// Consecutive successful checks that bring a node back.
    pub health_rise: u32,
    /// Times an idempotent request without a body that failed on a node before any response
    /// byte reached the client is retried on another node.
    pub retries: u32,
    /// Response bodies with at least this many bytes still to come are moved node → client with
    /// splice(2) through a pipe; smaller ones with a copy loop. 0 = never splice.
    pub splice_min_bytes: u64,
    /// Add the client's address to `X-Forwarded-For` on forwarded requests.
    pub forwarded_for: bool,
    /// `relay` (two-way), `handoff` (one-way: the node answers the client directly) or
    /// `redirect` (a 302 to the chosen node; `--mechanism`).
    pub mechanism: Mechanism,
    /// Persistent connections under handoff: `auto`, `single`, `multiple-handoff` or
    /// `backend-forwarding` (`--persistent`).
    pub persistent: Persistent,
    /// Steering backend for handoffs across hosts: `ebpf` or `nftables`.
    pub steering: SteeringKind,
    /// Interface on which client packets arrive and leave for the nodes (handoffs across hosts).
    pub steering_iface: String,
    /// Time a node has to answer a handoff (`Accepted` or `Drop`); then the switch sends
    /// `Cancel` and waits as long again for the one answer: `Drop` and it relays, `Accepted` and
    /// the node serves, none and the connection is closed without a word (abandoned).
    pub handoff_timeout_ms: u64,
    /// How long a steering entry stays after the node reports the connection closed, so the
    /// last packets of the FIN exchange still reach the node.
    pub handoff_linger_ms: u64,
    /// Live dashboard viewers (`/events` on the admin listener) served at once; more are
    /// refused with 503. 0 = no live viewers.
    pub dashboard_viewers: usize,
    /// Operator actions on the dashboard and the admin listener: drain a node, mark it down or
    /// up (`POST /actions/nodes/ID/drain|down|up`). Off by default: the page is read-only and
    /// every action is refused with 403. Reloadable.
    pub admin_actions: bool,
    /// The site's flash-crowd rescue (seed 001): set from the top-level `[rescue]` table, not
    /// from `[switch]`. With `[rescue.peering]` the switch runs the rescue control loop for the
    /// whole cluster and redirects part of a crowd to rescue servers. Read at start; a reload
    /// keeps the one in force.
    #[serde(skip)]
    pub rescue: Option<switchyard_rescue::RescueConfig>,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
            nodes: Vec::new(),
            policy: PolicyConfig::new(PolicyKind::Lard),
            admin: None,
            report_listen: None,
            workers: 0,
            max_connections: None,
            node_max_inflight: 0,
            queue_max: 4096,
            queue_timeout_ms: 5_000,
            retry_after_secs: 1,
            header_timeout_ms: 10_000,
            defer_accept_ms: 0,
            idle_timeout_ms: 60_000,
            send_timeout_ms: 60_000,
            connect_timeout_ms: 2_000,
            node_timeout_ms: 30_000,
            max_request_line: 8 * 1024,
            max_head_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            max_response_head_bytes: 32 * 1024,
            pool_max_idle: 1024,
            health_path: "/".to_owned(),
            health_interval_ms: 1_000,
            health_timeout_ms: 1_000,
            health_fall: 3,
            health_rise: 2,
            retries: 1,
            splice_min_bytes: 64 * 1024,
            forwarded_for: true,
            mechanism: Mechanism::Relay,
            persistent: Persistent::Auto,
            steering: SteeringKind::Ebpf,
            steering_iface: "eth0".to_owned(),
            handoff_timeout_ms: 1_000,
            handoff_linger_ms: 1_000,
            dashboard_viewers: 64,
            admin_actions: false,
            rescue: None,
        }
    }
}

/// Descriptors the switch needs besides client and node connections: listeners, the admin and
/// report sockets, the runtime's own, health checks, log files.
const RESERVED_DESCRIPTORS: u64 = 256;
/// Descriptors of the splice pipes kept for reuse (two per pipe).
const PIPE_DESCRIPTORS: u64 = 2 * 256;
/// Descriptors one relayed client connection holds at once: its socket and its node connection.
const DESCRIPTORS_PER_CONNECTION: u64 = 2;

impl SwitchConfig {
    /// The cap on client connections with `soft` descriptors: `max_connections` when set, else
    /// what is left after the reserve (fixed needs, splice pipes, a control connection per
    /// worker thread and node, the idle pooled node connections), two descriptors per
    /// connection.
    pub fn connection_cap(&self, soft: u64, workers: usize) -> usize {
        if let Some(n) = self.max_connections {
            return n;
        }
        let nodes = self.nodes.len() as u64;
        let reserve = RESERVED_DESCRIPTORS
            + PIPE_DESCRIPTORS
            + workers as u64 * nodes
            + (self.pool_max_idle as u64).saturating_mul(nodes);
        let n = switchyard_runtime::nofile::derive_max_connections(
            soft,
            reserve,
            DESCRIPTORS_PER_CONNECTION,
        );
        n.min((u32::MAX >> 3) as usize)
    }

    /// A config for `nodes` with every other key at its default.
    pub fn with_nodes(nodes: &[SocketAddr]) -> Self {
        SwitchConfig {
            nodes: nodes.iter().copied().map(NodeEntry::new).collect(),
            ..SwitchConfig::default()
        }
    }

    /// Checks ranges and consistency; the policy settings too.
    pub fn validate(&self) -> Result<(), SwitchError> {
        let bad = |m: &str| Err(SwitchError::Config(m.to_owned()));
        if self.nodes.is_empty() {
            return bad("no nodes: pass --node ADDR (repeatable) or set [switch] nodes");
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if self.nodes[..i].iter().any(|m| m.addr == n.addr) {
                return Err(SwitchError::Config(format!("node {} listed twice", n.addr)));
            }
        }
        if let Some(n) = self.max_connections {
            if n == 0 || n > (u32::MAX >> 3) as usize {
                return bad("max_connections must be positive");
            }
        }
        if self.header_timeout_ms == 0
            || self.idle_timeout_ms == 0
            || self.send_timeout_ms == 0
            || self.connect_timeout_ms == 0
            || self.node_timeout_ms == 0
            || self.health_timeout_ms == 0
        {
            return bad("timeouts must be positive");
        }
        if self.health_fall == 0 || self.health_rise == 0 {
            return bad("health_fall and health_rise must be at least 1");
        }
        if !self.health_path.starts_with('/')
            || self.health_path.bytes().any(|b| b <= b' ' || b == 0x7f)
        {
            return bad("health_path must be an absolute path without spaces or controls");
        }
        if self.max_request_line < 16 || self.max_head_bytes < self.max_request_line {
            return bad("max_request_line must be >= 16 and max_head_bytes >= max_request_line");
        }
        if self.handoff_timeout_ms == 0 {
            return bad("handoff_timeout_ms must be positive");
        }
        if self.mechanism == Mechanism::Handoff && self.nodes.iter().all(|n| n.control.is_none()) {
            return bad(
                "mechanism = \"handoff\" needs nodes with a control address \
                 (--node ADDR,control=unix:PATH or control=IP:PORT)",
            );
        }
        if self.max_response_head_bytes < 256 {
            return bad("max_response_head_bytes must be at least 256");
        }
        switchyard_policy::build(&self.policy)
            .map(drop)
            .map_err(|e| SwitchError::Config(e.to_string()))
    }
}

/// Flags of `switchyard switch`; each overrides the `[switch]` key of the same name.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct SwitchArgs {
    /// Address clients connect to.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// A back-end node (repeatable): `ADDR[,weight=N][,max_inflight=N][,control=unix:PATH|IP:PORT]`;
    /// replaces the config's node list.
    #[arg(long = "node", value_name = "NODE")]
    pub nodes: Vec<NodeEntry>,
    /// Dispatching policy: rr, wrr, lc, chash, lard, lard-r, ext-lard or cap.
    #[arg(long)]
    pub policy: Option<PolicyKind>,
    /// Admin listener address (/metrics, /healthz, /status.json).
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// UDP address on which nodes push load reports.
    #[arg(long)]
    pub report_listen: Option<SocketAddr>,
    /// Worker threads (0: one per core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Client connections open at once; more are answered 503.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Requests in flight on one node at most (0: no cap).
    #[arg(long)]
    pub node_max_inflight: Option<u32>,
    /// How responses reach clients: relay (two-way) or handoff (one-way).
    #[arg(long, value_enum)]
    pub mechanism: Option<Mechanism>,
    /// Persistent connections under handoff.
    #[arg(long, value_enum)]
    pub persistent: Option<Persistent>,
    /// Steering backend for handoffs across hosts.
    #[arg(long, value_enum)]
    pub steering: Option<SteeringKind>,
    /// Interface client packets arrive on (handoffs across hosts).
    #[arg(long)]
    pub steering_iface: Option<String>,
    /// Accept a connection once its first bytes arrive, or after this many ms (0: at once).
    #[arg(long)]
    pub defer_accept_ms: Option<u64>,
    /// Seconds to let open connections finish on SIGTERM/SIGINT.
    #[arg(long, default_value_t = 10)]
    pub drain_secs: u64,
}

impl SwitchArgs {
    /// Apply the flags over a configuration from the file (or defaults). A `--policy` name keeps
    /// the file's other policy settings.
    pub fn merge(&self, mut cfg: SwitchConfig) -> SwitchConfig {
        if let Some(v) = self.listen {
            cfg.listen = v;
        }
        if !self.nodes.is_empty() {
            cfg.nodes = self.nodes.clone();
        }
        if let Some(p) = self.policy {
            cfg.policy.name = p;
        }
        if let Some(v) = self.admin {
            cfg.admin = Some(v);
        }
        if let Some(v) = self.report_listen {
            cfg.report_listen = Some(v);
        }
        if let Some(v) = self.workers {
            cfg.workers = v;
        }
        if let Some(v) = self.max_connections {
            cfg.max_connections = Some(v);
        }
        if let Some(v) = self.node_max_inflight {
            cfg.node_max_inflight = v;
        }
        if let Some(v) = self.mechanism {
            cfg.mechanism = v;
        }
        if let Some(v) = self.persistent {
            cfg.persistent = v;
        }
        if let Some(v) = self.steering {
            cfg.steering = v;
        }
        if let Some(v) = self.defer_accept_ms {
            cfg.defer_accept_ms = v;
        }
        if let Some(v) = &self.steering_iface {
            cfg.steering_iface = v.clone();
        }
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_keys_nodes_and_policy_forms() {
        let cfg: SwitchConfig = toml::from_str(
            r#"
            listen = "127.0.0.1:9000"
            nodes = ["127.0.0.1:1", { addr = "127.0.0.1:2", weight = 3, max_inflight = 7 }]
            policy = "chash"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.nodes.len(), 2);
        assert_eq!(cfg.nodes[1].weight, 3);
        assert_eq!(cfg.nodes[1].max_inflight, Some(7));
        assert_eq!(cfg.policy.name, PolicyKind::Chash);
        assert_eq!(cfg.health_path, "/");
        cfg.validate().unwrap();

        let cfg: SwitchConfig =
            toml::from_str("nodes = [\"127.0.0.1:1\"]\n[policy]\nname = \"lard-r\"\nl_idle = 10\n")
                .unwrap();
        assert_eq!(cfg.policy.name, PolicyKind::LardR);
        assert_eq!(cfg.policy.l_idle, 10);
    }

    #[test]
    fn a_node_s_public_name_for_redirects() {
        let cfg: SwitchConfig = toml::from_str(
            r#"
            nodes = ["127.0.0.1:1,public=www1.example.com:8080",
                     { addr = "127.0.0.1:2", public = "[2001:db8::7]:80" },
                     { addr = "127.0.0.1:3", public = "203.0.113.7" },
                     "127.0.0.1:4"]
            "#,
        )
        .unwrap();
        let public: Vec<_> = cfg.nodes.iter().map(|n| n.public.as_deref()).collect();
        assert_eq!(
            public,
            [
                Some("www1.example.com:8080"),
                Some("[2001:db8::7]:80"),
                Some("203.0.113.7"),
                None
            ]
        );
        for ok in ["a", "a-b.c", "x.example:1", "[::1]", "[::1]:65535"] {
            assert_eq!(check_public(ok).as_deref(), Ok(ok));
        }
        for bad in [
            "",
            "a/b",
            "a b",
            "user@host",
            "host:",
            "host:0",
            "host:65536",
            "host:+80",
            "-a.example",
            "a..b",
            "[::1",
            "[nope]:80",
            "[::1]80",
            "host?x",
            "h\r\nX-Evil: 1",
        ] {
            let e = check_public(bad).unwrap_err();
            assert!(e.contains("public name"), "{bad}: {e}");
            let n = format!("127.0.0.1:1,public={bad}");
            assert!(n.parse::<NodeEntry>().is_err() || bad.is_empty(), "{bad}");
            let t = format!("nodes = [{{ addr = \"127.0.0.1:1\", public = {bad:?} }}]");
            assert!(toml::from_str::<SwitchConfig>(&t).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_keys_and_values_are_clear_errors() {
        let e = toml::from_str::<SwitchConfig>("polcy = \"rr\"").unwrap_err();
        assert!(e.to_string().contains("polcy"), "{e}");
        let e = toml::from_str::<SwitchConfig>("policy = \"fastest\"").unwrap_err();
        assert!(e.to_string().contains("unknown policy"), "{e}");
        let e = toml::from_str::<SwitchConfig>("nodes = [\"nohost\"]").unwrap_err();
        assert!(e.to_string().contains("nohost"), "{e}");
        let e = toml::from_str::<SwitchConfig>("nodes = [{ addr = \"127.0.0.1:1\", w = 1 }]")
            .unwrap_err();
        assert!(e.to_string().contains('w'), "{e}");
        assert!(SwitchConfig::default().validate().is_err());
        let mut c = SwitchConfig::with_nodes(&["127.0.0.1:1".parse().unwrap(); 2]);
        assert!(c.validate().is_err());
        c.nodes.pop();
        c.health_path = "no-slash".into();
        assert!(c.validate().is_err());
    }

    #[test]
    fn flags_override_the_file() {
        let file = SwitchConfig {
            nodes: vec![NodeEntry::new("127.0.0.1:1".parse().unwrap())],
            ..SwitchConfig::default()
        };
        let args = SwitchArgs {
            nodes: vec![
                "127.0.0.1:5".parse().unwrap(),
                "127.0.0.1:6,weight=2,control=unix:/tmp/n6.sock"
                    .parse()
                    .unwrap(),
            ],
            mechanism: Some(Mechanism::Handoff),
            policy: Some(PolicyKind::Rr),
            max_connections: Some(9),
            ..SwitchArgs::default()
        };
        let c = args.merge(file);
        assert_eq!(c.nodes.len(), 2);
        assert_eq!(c.policy.name, PolicyKind::Rr);
        assert_eq!(c.max_connections, Some(9));
        assert_eq!(c.mechanism, Mechanism::Handoff);
        assert_eq!(c.nodes[1].weight, 2);
        assert_eq!(
            c.nodes[1].control,
            Some(ControlAddr::Unix("/tmp/n6.sock".into()))
        );
        c.validate().unwrap();
    }

    #[test]
    fn node_strings_and_control_addresses() {
        let e: NodeEntry = "10.0.0.2:80,control=10.0.0.2:7000,max_inflight=5"
            .parse()
            .unwrap();
        assert_eq!(
            e.control,
            Some(ControlAddr::Tcp("10.0.0.2:7000".parse().unwrap()))
        );
        assert_eq!(e.max_inflight, Some(5));
        for bad in [
            "10.0.0.2",
            "10.0.0.2:80,weight",
            "10.0.0.2:80,weight=x",
            "10.0.0.2:80,colour=red",
            "10.0.0.2:80,control=unix:",
            "10.0.0.2:80,control=nowhere",
        ] {
            assert!(bad.parse::<NodeEntry>().is_err(), "{bad}");
        }
        let cfg: SwitchConfig = toml::from_str(
            "mechanism = \"handoff\"\npersistent = \"backend-forwarding\"\n\
             nodes = [{ addr = \"127.0.0.1:1\", control = \"unix:/tmp/a.sock\" }]\n",
        )
        .unwrap();
        assert_eq!(cfg.persistent, Persistent::BackendForwarding);
        cfg.validate().unwrap();
        let no_control = SwitchConfig {
            mechanism: Mechanism::Handoff,
            ..SwitchConfig::with_nodes(&["127.0.0.1:1".parse().unwrap()])
        };
        let e = no_control.validate().unwrap_err().to_string();
        assert!(e.contains("control"), "{e}");
    }
}
