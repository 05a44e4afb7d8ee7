//! `[node]` configuration: the same keys as the command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use switchyard_handoff::link::ControlAddr;
use switchyard_policy::PolicyConfig;
pub use switchyard_rescue::ProxyConfig as RescueProxyConfig;

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
    /// Accept a client's connection only once its first bytes have arrived, or after this long
    /// without any (`TCP_DEFER_ACCEPT`, rounded up by the kernel to 1, 3, 7, ... s); 0 = accept
    /// at the handshake (`--defer-accept-ms`). A request sent with the handshake is then read
    /// right after the accept, with no wait for readiness. A silent client's header timeout
    /// counts from when it is accepted.
    pub defer_accept_ms: u64,
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
    /// Cooperative mode (`switchyard node --cooperative`): the node takes its place in a
    /// cluster of peers that move connections among themselves. Set from the top-level
    /// `[cluster]` table, not from `[node]`.
    #[serde(skip)]
    pub cluster: Option<ClusterConfig>,
    /// The node is a rescue server (seed 001): it serves the origins it rescues as a reverse
    /// caching proxy under their names and its virtual host names, and answers names it does
    /// not serve 421. Set from the top-level `[rescue]` table, not from `[node]`.
    #[serde(skip)]
    pub rescue: Option<switchyard_rescue::RescueConfig>,
    /// Dynamic content: paths forwarded to a local application server. Set from the
    /// top-level `[dynamic]` table (which a switch reads too), not from `[node]`.
    #[serde(skip)]
    pub dynamic: Option<DynamicConfig>,
}

/// `[dynamic]`: requests for these paths are forwarded to an application server on the node's
/// host over pooled keep-alive connections, their bodies streamed both ways; everything else
/// is served from the document root as before.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DynamicConfig {
    /// The application server: any HTTP/1.1 server, normally on this host.
    pub upstream: SocketAddr,
    /// The paths it serves, in the grammar of `cap`'s service classes: `/app/` or `/app/*`
    /// (prefix), `*.php` (suffix), `*search*` (substring), `=/exact`, `*` (everything).
    /// Matched against the normalized path (percent-decoding and dot segments resolved), the
    /// query excluded; the request goes out with its target as the client sent it.
    pub paths: Vec<String>,
    /// Paths of heavy requests (CPU-bound pages, reports, searches), in the same grammar: the
    /// node forwards them to the application server like `paths`, and a switch running `cap`
    /// puts them in the service class `heavy` of their own (ahead of `dynamic`), so that a
    /// few expensive requests are spread over the nodes apart from the cheap dynamic ones.
    #[serde(default)]
    pub heavy: Vec<String>,
    /// Time allowed to connect to the application server; a timeout is answered 504, a
    /// refused connection 502.
    #[serde(default = "default_dynamic_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Time allowed for each wait on the application server: taking the next bytes of the
    /// request, sending its response head, each read of its response body. A response head
    /// that does not come in time is answered 504.
    #[serde(default = "default_dynamic_timeout_ms")]
    pub timeout_ms: u64,
    /// Idle keep-alive connections kept per worker thread.
    #[serde(default = "default_dynamic_max_idle")]
    pub max_idle: usize,
    /// Append the client's address to `X-Forwarded-For`.
    #[serde(default = "default_true")]
    pub forwarded_for: bool,
}

fn default_dynamic_connect_timeout_ms() -> u64 {
    1000
}

fn default_dynamic_timeout_ms() -> u64 {
    30_000
}

fn default_dynamic_max_idle() -> usize {
    32
}

fn default_true() -> bool {
    true
}

impl DynamicConfig {
    /// Forward `paths` to the application server at `upstream`, other settings at their
    /// defaults.
    pub fn new(upstream: SocketAddr, paths: Vec<String>) -> Self {
        DynamicConfig {
            upstream,
            paths,
            heavy: Vec::new(),
            connect_timeout_ms: default_dynamic_connect_timeout_ms(),
            timeout_ms: default_dynamic_timeout_ms(),
            max_idle: default_dynamic_max_idle(),
            forwarded_for: true,
        }
    }

    /// The path patterns the node forwards (`paths` and `heavy`), parsed.
    pub fn patterns(&self) -> Result<Vec<switchyard_policy::UrlPattern>, String> {
        self.cap_classes()
            .iter()
            .map(|c| {
                switchyard_policy::UrlPattern::parse(&c.name, &c.pattern).map_err(|e| {
                    let key = if c.name == HEAVY_CLASS {
                        "heavy"
                    } else {
                        "paths"
                    };
                    format!("[dynamic] {key}: {e}")
                })
            })
            .collect()
    }

    /// The service classes `cap` gives these paths: `heavy` for the paths of `heavy`, then
    /// `dynamic` for those of `paths` (the first class whose pattern matches wins, so a heavy
    /// path under a dynamic prefix is heavy).
    pub fn cap_classes(&self) -> Vec<switchyard_policy::ClassSpec> {
        let heavy = self.heavy.iter().map(|p| (HEAVY_CLASS, p));
        let dynamic = self.paths.iter().map(|p| (DYNAMIC_CLASS, p));
        heavy
            .chain(dynamic)
            .map(|(name, p)| switchyard_policy::ClassSpec {
                name: name.to_owned(),
                pattern: p.clone(),
            })
            .collect()
    }

    /// Checks the table: at least one valid path pattern, positive timeouts.
    pub fn validate(&self) -> Result<(), String> {
        if self.paths.is_empty() && self.heavy.is_empty() {
            return Err("[dynamic]: `paths` and `heavy` list no path".into());
        }
        self.patterns()?;
        if self.connect_timeout_ms == 0 || self.timeout_ms == 0 {
            return Err("[dynamic]: connect_timeout_ms and timeout_ms must be positive".into());
        }
        Ok(())
    }
}

/// The `cap` service class of the paths of `[dynamic] paths`.
pub const DYNAMIC_CLASS: &str = "dynamic";
/// The `cap` service class of the paths of `[dynamic] heavy`.
pub const HEAVY_CLASS: &str = "heavy";

/// `[cluster]`: the members of a cooperative cluster (seed 000). The same table serves every
/// member; each node finds itself in it by `name` (`switchyard node --cooperative --name n2`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's name: one of the members.
    #[serde(default)]
    pub name: String,
    /// Every node of the cluster, this one included.
    pub members: Vec<Member>,
    /// The owner map: which member owns each target. Default `chash` with the load bound
    /// lifted ([`PolicyConfig::owner_map`]: each member sees only its own load, and hot targets
    /// are spread by replication); any policy of `[policy]` may be named.
    #[serde(default = "default_owner_policy")]
    pub policy: PolicyConfig,
    /// How long a clone waits for its owner's answer (`Accepted` or `Drop`) before it cancels,
    /// and as long again for the answer to the cancel.
    #[serde(default = "default_clone_timeout_ms")]
    pub clone_timeout_ms: u64,
    /// `[cluster.replication]`: copies of hot objects in peers' replica caches.
    #[serde(default)]
    pub replication: ReplicationConfig,
    /// `[cluster.admin]`: the members' admin listeners by member name (`n1 =
    /// "127.0.0.1:9081"`). Any member's dashboard (`/` on its admin listener) shows the whole
    /// cluster from the figures the others serve there (`/member.json`); a member left out is
    /// shown with its control connection's state only.
    #[serde(default)]
    pub admin: std::collections::BTreeMap<String, SocketAddr>,
    /// Members on other hosts (TCP control addresses): the interface on which the layer-4
    /// director delivers clients' packets to this node. A request cloned to such a member
    /// moves as `TCP_REPAIR` state and this node steers the client's packets from this
    /// interface to the owner until the owner gives the connection back.
    #[serde(default = "default_steering_iface")]
    pub steering_iface: String,
    /// The steering backend for clones across hosts: `ebpf` (falls back to nftables when it
    /// cannot be set up) or `nftables`.
    #[serde(default)]
    pub steering: switchyard_handoff::steer::table::Backend,
    /// How a request owned by a peer is served: `clone` (the connection moves to the owner,
    /// seed 000's socket cloning) or `fetch` (this node fetches the whole response from the
    /// owner's HTTP listener, holds it, then sends it: the seed's cooperative caching, "CF";
    /// with `[cluster.replication]` on, a held response for a hot target is kept as this
    /// node's copy, the seed's "CF-REP").
    #[serde(default)]
    pub mechanism: ClusterMechanism,
    /// `[cluster.http]`: the members' HTTP listeners by member name (`n1 = "10.0.0.2:80"`),
    /// where `mechanism = "fetch"` fetches their responses; every peer needs one then.
    #[serde(default)]
    pub http: std::collections::BTreeMap<String, SocketAddr>,
    /// With `mechanism = "fetch"`: the largest response held whole before it is sent; a larger
    /// one (by its `Content-Length`) is relayed as it arrives instead.
    #[serde(default = "default_fetch_hold_max_bytes")]
    pub fetch_hold_max_bytes: u64,
}

/// How a cooperative node serves a request whose owner is a peer (`[cluster] mechanism`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClusterMechanism {
    /// Socket cloning: the connection moves to the owner for that request and comes back.
    #[default]
    Clone,
    /// Cooperative caching's cache forwarding: the response is fetched from the owner over
    /// HTTP, held whole here, then sent to the client on this node's connection.
    Fetch,
}

impl ClusterMechanism {
    /// The name used in the configuration and in the node's status.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterMechanism::Clone => "clone",
            ClusterMechanism::Fetch => "fetch",
        }
    }
}

impl std::str::FromStr for ClusterMechanism {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "clone" => Ok(ClusterMechanism::Clone),
            "fetch" => Ok(ClusterMechanism::Fetch),
            _ => Err(format!(
                "unknown cluster mechanism `{s}` (want `clone` or `fetch`)"
            )),
        }
    }
}

fn default_fetch_hold_max_bytes() -> u64 {
    16 * 1024 * 1024
}

fn default_steering_iface() -> String {
    "eth0".to_owned()
}

/// `[cluster.replication]`: hot-object replication (seed 000 §3.2). An owner counts references
/// to its targets (aged: every `aging_interval_ms` all counts are multiplied by
/// `aging_factor`); a peer that moves it a request for a target whose count has reached
/// `hot_threshold` receives a copy for its replica cache (`replica_bytes`, LFU with the same
/// aging), and serves the target itself while the copy is fresh (the owner's
/// `cache_revalidate_ms`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationConfig {
    /// Whether copies are sent and kept at all.
    pub enabled: bool,
    /// Aged references from which a target is hot.
    pub hot_threshold: f64,
    /// Aging period of the counts, in milliseconds.
    pub aging_interval_ms: u64,
    /// Factor the counts are multiplied by every period, in `[0, 1]`.
    pub aging_factor: f64,
    /// Bytes of the replica cache, beside the object cache (`cache_bytes`).
    pub replica_bytes: u64,
    /// Largest object copied.
    pub max_object_bytes: u64,
    /// Targets whose counts an owner keeps.
    pub max_tracked: usize,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        // The replica cache takes the share of memory the seed gave it (12 MB beside a 128 MB
        // cache) of the default object cache; the aging is the object cache's LFU aging.
        ReplicationConfig {
            enabled: true,
            hot_threshold: switchyard_cache::replication::DEFAULT_HOT_THRESHOLD,
            aging_interval_ms: 10_000,
            aging_factor: 0.5,
            replica_bytes: 24 * 1024 * 1024,
            max_object_bytes: 1024 * 1024,
            max_tracked: 65_536,
        }
    }
}

impl ReplicationConfig {
    /// The settings of the replication decisions.
    pub fn settings(&self) -> switchyard_cache::replication::ReplicationSettings {
        switchyard_cache::replication::ReplicationSettings {
            threshold: self.hot_threshold,
            aging_interval: Duration::from_millis(self.aging_interval_ms),
            aging_factor: self.aging_factor,
            max_tracked: self.max_tracked,
            replica_bytes: self.replica_bytes,
            max_object_bytes: self
                .max_object_bytes
                .min(switchyard_handoff::proto::MAX_REPLICA as u64),
        }
    }
}

fn default_owner_policy() -> PolicyConfig {
    PolicyConfig::owner_map()
}

fn default_clone_timeout_ms() -> u64 {
    1000
}

/// One member of a cooperative cluster.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// Its name, unique in the cluster; the owner map is computed from the names, so every
    /// member computes the same map.
    pub name: String,
    /// Its control listener: `unix:PATH` on this host (connections travel as descriptors) or
    /// `IP:PORT` on another host (connections travel as `TCP_REPAIR` state).
    pub control: ControlAddr,
}

impl ClusterConfig {
    /// A cluster of `members` seen from the member called `name`, with the default owner map.
    pub fn new(name: impl Into<String>, members: Vec<Member>) -> Self {
        ClusterConfig {
            name: name.into(),
            members,
            policy: default_owner_policy(),
            clone_timeout_ms: default_clone_timeout_ms(),
            replication: ReplicationConfig::default(),
            admin: Default::default(),
            steering_iface: default_steering_iface(),
            steering: Default::default(),
            mechanism: ClusterMechanism::default(),
            http: Default::default(),
            fetch_hold_max_bytes: default_fetch_hold_max_bytes(),
        }
    }

    /// Whether some member other than this node is on another host (a TCP control address).
    pub fn crosses_hosts(&self) -> bool {
        self.members
            .iter()
            .any(|m| m.name != self.name && !m.control.same_host())
    }

    /// This node's entry.
    pub fn me(&self) -> Option<&Member> {
        self.members.iter().find(|m| m.name == self.name)
    }

    /// Checks the table: a name, unique members, this node among them, a valid owner policy.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("[cluster]: this node's name is not set (`name` or --name)".into());
        }
        for (i, m) in self.members.iter().enumerate() {
            if m.name.is_empty() {
                return Err(format!("[cluster]: member {i} has an empty name"));
            }
            if self.members[..i].iter().any(|o| o.name == m.name) {
                return Err(format!("[cluster]: member `{}` is listed twice", m.name));
            }
        }
        if self.me().is_none() {
            return Err(format!(
                "[cluster]: this node (`{}`) is not among the members",
                self.name
            ));
        }
        if let Some(n) = self
            .admin
            .keys()
            .find(|n| !self.members.iter().any(|m| &m.name == *n))
        {
            return Err(format!("[cluster.admin]: `{n}` is not a member"));
        }
        if let Some(n) = self
            .http
            .keys()
            .find(|n| !self.members.iter().any(|m| &m.name == *n))
        {
            return Err(format!("[cluster.http]: `{n}` is not a member"));
        }
        if self.mechanism == ClusterMechanism::Fetch {
            if let Some(m) = self
                .members
                .iter()
                .find(|m| m.name != self.name && !self.http.contains_key(&m.name))
            {
                return Err(format!(
                    "[cluster]: mechanism = \"fetch\" needs every peer's HTTP listener in \
                     [cluster.http]; `{}` has none",
                    m.name
                ));
            }
            if self.fetch_hold_max_bytes == 0 {
                return Err("[cluster]: fetch_hold_max_bytes must be positive".into());
            }
        }
        if self.clone_timeout_ms == 0 {
            return Err("[cluster]: clone_timeout_ms must be positive".into());
        }
        self.replication
            .settings()
            .validate()
            .map_err(|e| format!("[cluster.replication]: {e}"))?;
        switchyard_policy::build(&self.policy)
            .map(drop)
            .map_err(|e| format!("[cluster] policy: {e}"))
    }
}

/// Emulated disk: every read that misses the object cache waits as if a
/// single disk served it (FIFO): `latency_us` plus size / bandwidth. Waits
/// below a millisecond are honoured (a nanosecond timer, not tokio's
/// millisecond wheel).
///
/// With `o_direct`, misses are also read from the file with `O_DIRECT`
/// (aligned to the file system's direct-I/O block size, on the blocking
/// pool), so the page cache cannot hide the real disk; the node refuses to
/// start when the root's file system has no disk beneath it (tmpfs, ramfs)
/// or refuses `O_DIRECT`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DiskConfig {
    /// Per-read positioning latency in microseconds (0: none).
    pub latency_us: u64,
    /// Transfer rate in bytes per second (0: unlimited).
    pub bandwidth_bytes_per_sec: u64,
    /// Read cache misses with `O_DIRECT`, bypassing the page cache.
    pub o_direct: bool,
}

impl DiskConfig {
    /// Whether a latency or bandwidth model is configured.
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
            defer_accept_ms: 0,
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
            cluster: None,
            rescue: None,
            dynamic: None,
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

    /// `mechanism = "fetch"` needs every peer's HTTP listener; unknown mechanisms and HTTP
    /// listeners of non-members are refused with what is wrong named.
    #[test]
    fn cluster_fetch_mechanism() {
        let base = "name = \"a\"\nmembers = [{ name = \"a\", control = \"unix:/tmp/a\" }, \
                    { name = \"b\", control = \"unix:/tmp/b\" }]\n";
        let parse = |extra: &str| toml::from_str::<ClusterConfig>(&format!("{base}{extra}"));
        let c = parse("").unwrap();
        assert_eq!(c.mechanism, ClusterMechanism::Clone, "clone by default");
        c.validate().unwrap();
        let c = parse("mechanism = \"fetch\"\n[http]\nb = \"127.0.0.1:8081\"\n").unwrap();
        assert_eq!(c.mechanism, ClusterMechanism::Fetch);
        assert_eq!(c.http["b"], "127.0.0.1:8081".parse().unwrap());
        c.validate().unwrap();
        // This node's own listener is not needed.
        let e = parse("mechanism = \"fetch\"\n[http]\na = \"127.0.0.1:8080\"\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.contains("`b` has none"), "{e}");
        let e =
            parse("mechanism = \"fetch\"\nfetch_hold_max_bytes = 0\n[http]\nb = \"127.0.0.1:1\"\n")
                .unwrap()
                .validate()
                .unwrap_err();
        assert!(e.contains("fetch_hold_max_bytes"), "{e}");
        let e = parse("[http]\nc = \"127.0.0.1:1\"\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.contains("[cluster.http]: `c` is not a member"), "{e}");
        let e = parse("mechanism = \"relay\"\n").unwrap_err().to_string();
        assert!(e.contains("unknown variant `relay`"), "{e}");
        assert!(parse("[http]\nb = \"nowhere\"\n").is_err());
        assert_eq!("fetch".parse(), Ok(ClusterMechanism::Fetch));
        assert_eq!(ClusterMechanism::Fetch.as_str(), "fetch");
        assert!("CF"
            .parse::<ClusterMechanism>()
            .unwrap_err()
            .contains("`clone` or `fetch`"));
    }

    /// `[dynamic]` needs an upstream and paths; the rest has defaults; bad patterns and
    /// zero timeouts are refused with the key named.
    #[test]
    fn dynamic_table() {
        let d: DynamicConfig =
            toml::from_str("upstream = \"127.0.0.1:9\"\npaths = [\"/app/\", \"*.php\"]\n").unwrap();
        assert_eq!(d, DynamicConfig::new(d.upstream, d.paths.clone()));
        d.validate().unwrap();
        assert_eq!(d.patterns().unwrap().len(), 2);
        assert!(toml::from_str::<DynamicConfig>("paths = [\"/app/\"]\n").is_err());
        assert!(toml::from_str::<DynamicConfig>(
            "upstream = \"127.0.0.1:9\"\npaths = []\nretries = 2\n"
        )
        .is_err());
        let bad = |f: &dyn Fn(&mut DynamicConfig)| {
            let mut c = d.clone();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(&|c| c.paths.clear()).contains("paths"));
        assert!(bad(&|c| c.paths.push("/a*b".into())).contains("/a*b"));
        assert!(bad(&|c| c.timeout_ms = 0).contains("timeout_ms"));
        assert!(bad(&|c| c.heavy.push("*a*b".into())).contains("heavy"));
        // Heavy paths alone are enough, and come first as their own class.
        let mut h = d.clone();
        h.paths.clear();
        h.heavy = vec!["/report".into()];
        h.validate().unwrap();
        h.paths = vec!["/app/".into()];
        let classes: Vec<_> = h
            .cap_classes()
            .into_iter()
            .map(|c| (c.name, c.pattern))
            .collect();
        assert_eq!(
            classes,
            [
                ("heavy".to_owned(), "/report".to_owned()),
                ("dynamic".to_owned(), "/app/".to_owned())
            ]
        );
        assert_eq!(h.patterns().unwrap().len(), 2);
    }
}
