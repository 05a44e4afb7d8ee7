//! The TOML configuration file: one section per component.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;
use switchyard_node::NodeConfig;

/// The whole configuration file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `[node]`: the back-end web server.
    pub node: Option<NodeConfig>,
    /// `[cluster]`: the members of a cooperative cluster (`switchyard node --cooperative`).
    pub cluster: Option<switchyard_node::ClusterConfig>,
    /// `[rescue]`: cross-site flash-crowd rescue (DotSlash); a node with it is a rescue server.
    pub rescue: Option<switchyard_node::RescueConfig>,
    /// `[switch]`: the layer-7 switch.
    pub switch: Option<switchyard_switch::SwitchConfig>,
    /// `[dynamic]`: paths a node forwards to its application server; a switch running `cap`
    /// puts them in the service classes `dynamic` and `heavy`.
    pub dynamic: Option<switchyard_node::DynamicConfig>,
    /// `[log]`: logging.
    #[serde(default)]
    pub log: LogConfig,
}

/// `[log]` section.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter such as `info` or `switchyard_node=debug`; the
    /// `RUST_LOG` environment variable wins when set.
    pub level: String,
    /// `text` or `json`.
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            format: "text".into(),
        }
    }
}

impl FileConfig {
    /// Parse a configuration text; errors name the offending key.
    pub fn parse(text: &str) -> anyhow::Result<FileConfig> {
        let cfg: FileConfig = toml::from_str(text)?;
        if !matches!(cfg.log.format.as_str(), "text" | "json") {
            anyhow::bail!("log.format must be \"text\" or \"json\"");
        }
        if let Some(d) = &cfg.dynamic {
            d.validate().map_err(|e| anyhow::anyhow!(e))?;
        }
        Ok(cfg)
    }

    /// On a reload: `[rescue]` is read at start only (its control loop, peering listener and
    /// virtual hosts live as long as the process), so a file whose table differs from the one
    /// in force is logged as a warning that names the restart it takes; nothing is silently
    /// ignored. Returns whether it differs.
    pub fn note_rescue_change(&self, running: Option<&switchyard_node::RescueConfig>) -> bool {
        if self.rescue.as_ref() == running {
            return false;
        }
        tracing::warn!(
            "[rescue] changed in the config file: it takes a restart; the table in force is kept"
        );
        true
    }

    /// Read and parse a configuration file.
    pub fn load(path: &Path) -> anyhow::Result<FileConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_file_parses_and_matches_defaults_where_it_says_so() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../switchyard.example.toml");
        let cfg = FileConfig::load(&path).unwrap();
        let node = cfg.node.expect("example has a [node] section");
        assert_eq!(node.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(node.admin.unwrap().to_string(), "127.0.0.1:9080");
        assert_eq!(node.cache_policy, "lfu");
        assert_eq!(node.cache_bytes, 268_435_456);
        assert_eq!(node.disk.latency_us, 0);
        let d = NodeConfig::default();
        assert_eq!(node.header_timeout_ms, d.header_timeout_ms);
        assert_eq!(node.max_head_bytes, d.max_head_bytes);
        assert_eq!(cfg.log.level, "info");
        assert_eq!(node.report_to, None);
        let sw = cfg.switch.expect("example has a [switch] section");
        assert_eq!(sw.nodes.len(), 2);
        assert_eq!(sw.nodes[1].weight, 2);
        assert_eq!(sw.nodes[1].max_inflight, Some(256));
        assert_eq!(sw.policy.name.to_string(), "lard");
        assert_eq!(sw.policy.l_overload, 130);
        let d = switchyard_switch::SwitchConfig::default();
        assert_eq!(sw.queue_max, d.queue_max);
        assert_eq!(sw.health_path, d.health_path);
    }

    /// The example's commented `[cluster]` table, switched on, is a valid cluster.
    #[test]
    fn example_cluster_table_parses() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../switchyard.example.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let start = text.find("# [cluster]").expect("a [cluster] example");
        // The `[cluster]` tables only: up to the next commented table of another name.
        let table: String = text[start..]
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .take_while(|l| !l.starts_with('[') || l.starts_with("[cluster"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!table.lines().any(|l| l.starts_with("[rescue")), "{table}");
        let cfg = FileConfig::parse(&table).unwrap();
        let mut c = cfg.cluster.expect("the [cluster] table");
        assert_eq!(c.members.len(), 2);
        assert_eq!(c.clone_timeout_ms, 1000);
        assert_eq!(c.admin["n2"].to_string(), "127.0.0.1:9082");
        assert_eq!(
            c.replication,
            switchyard_node::config::ReplicationConfig::default()
        );
        c.name = "n2".into();
        c.validate().unwrap();
        let e = FileConfig::parse("[cluster]\nmembers = [{ name = \"a\", control = \"bogus\" }]\n")
            .unwrap_err();
        assert!(format!("{e:#}").contains("control address"), "{e:#}");
        c.admin
            .insert("n3".into(), "127.0.0.1:9083".parse().unwrap());
        let e = c.validate().unwrap_err();
        assert!(e.contains("`n3` is not a member"), "{e}");
        let e = FileConfig::parse(
            "[cluster]\nmembers = []\n[cluster.replication]\nhot_treshold = 3.0\n",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("hot_treshold"), "{e:#}");
    }

    /// The example's commented `[rescue]` table, switched on, is a valid rescue table.
    #[test]
    fn example_rescue_table_parses() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../switchyard.example.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let start = text.find("# [rescue]").expect("a [rescue] example");
        let end = text[start..].find("\n\n").map_or(text.len(), |e| start + e);
        let table: String = text[start..end]
            .lines()
            .filter(|l| !l.starts_with("##"))
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let cfg = FileConfig::parse(&table).unwrap();
        let r = cfg.rescue.expect("the [rescue] table");
        r.validate().unwrap();
        assert_eq!(r.server_name, "www.rescue.example");
        assert_eq!(r.server_aliases, ["rescue.example"]);
        assert_eq!(r.expired_redirect_secs, 86_400);
        assert_eq!(
            r.proxy,
            switchyard_node::config::RescueProxyConfig::default()
        );
        let peering = r.peering.expect("the [rescue.peering] table");
        assert_eq!(peering.listen, "0.0.0.0:7070".parse().unwrap());
        assert_eq!(peering.peers.len(), 2);
        assert_eq!(peering.peers[0].d_free_kbps, None);
        assert_eq!(peering.peers[1].d_free_kbps, Some(5000.0));
        assert!(FileConfig::parse("[rescue]\nserver_name = \"a.b\"\n").is_err());
    }

    /// The example's commented `[dynamic]` table, switched on, is valid, with the defaults it
    /// shows; a bad pattern in it is an error naming the pattern.
    #[test]
    fn example_dynamic_table_parses() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../switchyard.example.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let start = text.find("# [dynamic]").expect("a [dynamic] example");
        let table: String = text[start..]
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        let cfg = FileConfig::parse(&table).unwrap();
        let d = cfg.dynamic.expect("the [dynamic] table");
        assert_eq!(d.upstream.to_string(), "127.0.0.1:3000");
        assert_eq!(d.paths, ["/app/", "/api/*", "*.php"]);
        assert_eq!(d.heavy, ["/app/report/"]);
        let defaults = switchyard_node::DynamicConfig {
            heavy: d.heavy.clone(),
            ..switchyard_node::DynamicConfig::new(d.upstream, d.paths.clone())
        };
        assert_eq!(d, defaults);
        let e = FileConfig::parse("[dynamic]\nupstream = \"127.0.0.1:8000\"\npaths = [\"/a*b\"]\n")
            .unwrap_err();
        assert!(format!("{e:#}").contains("/a*b"), "{e:#}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let e =
            FileConfig::parse("[node]\nlisten = \"127.0.0.1:1\"\ncache_byte = 5\n").unwrap_err();
        assert!(format!("{e:#}").contains("cache_byte"), "{e:#}");
        assert!(FileConfig::parse("[node]\nlisten = \"nope\"\n").is_err());
        assert!(FileConfig::parse("[log]\nformat = \"xml\"\n").is_err());
        assert!(FileConfig::parse("[nodes]\n").is_err());
    }
}
