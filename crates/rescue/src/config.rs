//! The rescue settings: the `[rescue]` table of the configuration file, with the defaults and
//! ranges of seed 001 Table 1.
//!
//! ```toml
//! [rescue]
//! server_name = "www.origin.com"   # required: FQDN, base of the virtual host names
//! web_ip = "1.2.3.4"               # required
//! web_port = 8080                  # required
//! bandwidth_kbps = 1250            # required: B; D_out = B × U = 1000 kB/s
//! # usable = 0.8   t_low = 0.10   t_alert = 0.50   t_high = 0.75   t_coff = 0.90
//! # control_interval_ms = 1000   n_low = 30   max_idle_secs = 300   a_redi_bytes = 468
//! # server_aliases = ["origin.com"]   expired_redirect_secs = 86400
//!
//! [rescue.proxy]                   # the reverse caching proxy of a rescue server
//! # cache_bytes = 67108864   origin_bytes = 33554432   max_object_bytes = 1048576
//! # fresh_ms = 10000   fetch_timeout_ms = 10000
//!
//! [rescue.registry]                # optional: see `registry::RegistryConfig`
//! endpoints = ["http://10.0.0.11:2379"]
//!
//! [rescue.dns]                     # optional: see `registry::DnsConfig`
//! server = "10.0.0.2:53"
//! zone = "origin.com"
//! tsig_key_name = "switchyard-update"
//! tsig_secret = "…base64…"
//! ```

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::proto::{valid_name, MAX_RATE_KBPS};
use crate::registry::{DnsConfig, RegistryConfig};

/// Bytes of TCP/IP and Ethernet headers and trailers a redirect costs beyond its own bytes:
/// (40 + 32×4) + 20×5 + (14 + 4)×5 (seed 001 §4.3).
pub const REDIRECT_OVERHEAD_BYTES: u64 = 358;

/// Rescue settings. Every key but the server's identity and bandwidth has a default; the
/// thresholds default to Table 1 and must lie in its ranges.
///
/// Rates are in kB/s (1 kB = 1000 bytes), thresholds are fractions (0.5 = 50%).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RescueConfig {
    /// The server's configured name (FQDN, Apache's `ServerName`): sent in SOS requests, and the
    /// base of the virtual host names given to origins (`www.rescue.com` → `www-vh1.rescue.com`).
    pub server_name: String,
    /// Domain for virtual host names instead of the server name's own: with `host = "foo"` and
    /// this `dotslash.example.org`, names are `foo-vh<n>.dotslash.example.org` (§4.1).
    #[serde(default)]
    pub vhost_domain: Option<String>,
    /// The host part used with `vhost_domain`; defaults to the first label of `server_name`.
    #[serde(default)]
    pub vhost_host: Option<String>,
    /// The IP address clients and peers reach the web server at (sent in SOS and in grants).
    pub web_ip: IpAddr,
    /// The web port.
    pub web_port: u16,
    /// B: outbound bandwidth, kB/s.
    pub bandwidth_kbps: f64,
    /// U: the share of B usable for HTTP traffic. Default 0.8.
    #[serde(default = "d_usable")]
    pub usable: f64,
    /// D_out, kB/s, when set directly (the paper's experiments set only this); default B × U.
    #[serde(default)]
    pub d_out_kbps: Option<f64>,
    /// T_low, release threshold. Default 0.10, range (0, 0.20].
    #[serde(default = "d_t_low")]
    pub t_low: f64,
    /// T_alert, initial allocation. Default 0.50, range [0.40, 0.60].
    #[serde(default = "d_t_alert")]
    pub t_alert: f64,
    /// T_high, redirects start. Default 0.75, range [0.60, 0.80].
    #[serde(default = "d_t_high")]
    pub t_high: f64,
    /// T_coff, additional allocation. Default 0.90, range [0.80, 1.0).
    #[serde(default = "d_t_coff")]
    pub t_coff: f64,
    /// I_ctrl, the control interval, milliseconds. Default 1000.
    #[serde(default = "d_i_ctrl")]
    pub control_interval_ms: u64,
    /// N_low: intervals below T_low that make a load level consistently low. Default 30.
    #[serde(default = "d_n_low")]
    pub n_low: u32,
    /// MaxIdle sent in this server's SOS requests, seconds. Default 10 × N_low × I_ctrl.
    #[serde(default)]
    pub max_idle_secs: Option<u32>,
    /// A_redi before any redirect has been measured, bytes. Default 468 (§4.3); afterwards the
    /// mean accounted size of the last interval's redirects is used.
    #[serde(default = "d_a_redi")]
    pub a_redi_bytes: f64,
    /// Files of at least this many bytes are redirected by consistent hashing, smaller ones by
    /// weighted round robin. Default 1 MiB.
    #[serde(default = "d_large")]
    pub large_file_bytes: u64,
    /// Ring points per rescue server for the consistent hashing of large files. Default 64.
    #[serde(default = "d_points")]
    pub chash_points: u32,
    /// The allocation asked for in SOS requests, kB/s; unset: as much as the rescue server gives.
    #[serde(default)]
    pub sos_want_kbps: Option<u64>,
    /// Smallest allocation this server grants, kB/s; with less free capacity an SOS is refused.
    /// Default 10.
    #[serde(default = "d_min_grant")]
    pub min_grant_kbps: f64,
    /// Largest allocation D_alloc this server grants one origin, kB/s; unset: all its free
    /// rescue capacity (as in the paper's experiments).
    #[serde(default)]
    pub max_grant_kbps: Option<f64>,
    /// Whether this server rescues others. Default true; false for a site that can only ask
    /// for rescue (a switch, which has no rescue proxy): it refuses every SOS and advertises no
    /// free capacity.
    #[serde(default = "d_gives_rescue")]
    pub gives_rescue: bool,
    /// Most origins rescued at once. Default 8.
    #[serde(default = "d_max_origins")]
    pub max_origins: usize,
    /// Control intervals before a candidate that refused an SOS (or could not be reached) is
    /// asked again. Default 30.
    #[serde(default = "d_retry")]
    pub retry_refused_intervals: u32,
    /// How long a protocol request may wait for its answer, milliseconds. Default 10000.
    #[serde(default = "d_timeout")]
    pub request_timeout_ms: u64,
    /// The first virtual host sequence number. Names are never reused, so a restarted server
    /// should start above the last one it gave out ([`crate::Core::next_vhost_seq`]). Default 1.
    #[serde(default = "d_first_vhost")]
    pub first_vhost_seq: u64,
    /// The status page, never redirected. Default `/dotslash-status`.
    #[serde(default = "d_status")]
    pub status_path: String,
    /// Further names of this server's own site besides `server_name` (its configured
    /// content). Requests naming neither these, nor an origin it rescues, nor an expired origin
    /// still redirected back, are misdirected (421): a rescue server is never an open proxy.
    #[serde(default)]
    pub server_aliases: Vec<String>,
    /// How long an ended origin's names keep being redirected back to it, seconds (§4.1:
    /// clients and their DNS resolvers keep using a rescue server's names after the relationship
    /// ends; the paper keeps them "a few hours or a few days"). Default 86400 (one day): the
    /// longest lifetime common browser and proxy caches give a page without validators
    /// (heuristic freshness is usually capped at 24 h), so a page cached during the crowd that
    /// links the virtual host name still finds its way back. Afterwards the names are unknown
    /// (421) but never given out again.
    #[serde(default = "d_expired_redirect")]
    pub expired_redirect_secs: u64,
    /// `[rescue.proxy]`: the reverse caching proxy a rescue server serves its origins with.
    #[serde(default)]
    pub proxy: ProxyConfig,
    /// `[rescue.registry]`: the service registry (none: no registration, no searches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryConfig>,
    /// `[rescue.dns]`: dynamic DNS updates of the site's zone (none: no DNS round robin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsConfig>,
    /// `[rescue.peering]`: where the rescue protocol listens, this server's TLS identity and the
    /// peers it talks to. Without it the server runs no control loop (a rescue proxy whose
    /// origins are added by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peering: Option<PeeringConfig>,
}

/// `[rescue.peering]`: the rescue protocol's listener and mutual TLS (beyond the paper, whose
/// peers trust any TCP connection). Peers prove who they are with certificates issued by `ca`;
/// a certificate must name (DNS subject alternative name) one of `peers`, whatever its issuer,
/// or the connection is refused.
///
/// ```toml
/// [rescue.peering]
/// listen = "0.0.0.0:7070"
/// cert = "/etc/switchyard/rescue.crt"   # this server's certificate chain, PEM
/// key = "/etc/switchyard/rescue.key"    # its private key, PEM
/// ca = "/etc/switchyard/peers-ca.crt"   # the issuers peers' certificates must chain to, PEM
///
/// [[rescue.peering.peers]]
/// name = "www.rescue.com"      # the name its certificate carries
/// addr = "192.0.2.7:7070"      # its rescue protocol listener
/// d_free_kbps = 2000           # a rescue candidate with this free capacity (static registry)
/// # domain = "example.net"     # its administrative domain, for diversity (§4.5)
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeeringConfig {
    /// The rescue protocol's listener.
    pub listen: std::net::SocketAddr,
    /// This server's certificate chain (PEM), leaf first.
    pub cert: std::path::PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
    /// The certificate authorities peers' certificates must chain to (PEM).
    pub ca: std::path::PathBuf,
    /// The servers this one exchanges rescue messages with; every other is refused.
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
}

/// One `[[rescue.peering.peers]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// The name its certificate carries (a DNS subject alternative name).
    pub name: String,
    /// Its rescue protocol listener.
    pub addr: std::net::SocketAddr,
    /// Its free rescue capacity d_free, kB/s, when it is a rescue candidate; unset: it is a
    /// peer (an origin it may rescue) but never asked for rescue. Stands in for the registry's
    /// advertisement until one is configured.
    #[serde(default)]
    pub d_free_kbps: Option<f64>,
    /// Its administrative domain (§4.5: rescue servers in diverse domains are preferred).
    #[serde(default)]
    pub domain: Option<String>,
}

impl PeeringConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let err = |key: &'static str, msg: String| Err(ConfigError { key, msg });
        let mut names = std::collections::BTreeSet::new();
        for p in &self.peers {
            if !valid_name(&p.name) {
                return err(
                    "peering.peers.name",
                    format!("`{}` is not a host name", p.name),
                );
            }
            if !names.insert(p.name.to_ascii_lowercase()) {
                return err("peering.peers.name", format!("`{}` listed twice", p.name));
            }
            if p.addr.port() == 0 {
                return err("peering.peers.addr", format!("`{}`: port 0", p.name));
            }
            if let Some(d) = p.d_free_kbps {
                if !(d.is_finite() && d > 0.0 && d <= MAX_RATE_KBPS as f64) {
                    return err(
                        "peering.peers.d_free_kbps",
                        format!("`{}`: must be a positive number of kB/s", p.name),
                    );
                }
            }
        }
        if self.peers.len() > u32::MAX as usize {
            return err("peering.peers", "too many peers".into());
        }
        Ok(())
    }
}

/// `[rescue.proxy]`: the rescue server's reverse caching proxy (§4.1). Objects are kept in
/// memory (as in the paper, whose hot files fit in memory); larger ones are relayed to each
/// client without being cached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Bytes of proxied objects kept over all origins. Default 64 MiB.
    pub cache_bytes: u64,
    /// Bytes of proxied objects kept for one origin, so that one origin's crowd cannot push
    /// the others out. Default 32 MiB.
    pub origin_bytes: u64,
    /// Largest object cached; larger responses are relayed uncached. Default 1 MiB (the node's
    /// own `cache_max_object_bytes`).
    pub max_object_bytes: u64,
    /// How long a cached object is used without asking the origin, milliseconds, when the
    /// origin gives it no freshness lifetime of its own (`s-maxage` or `max-age`); afterwards it
    /// is revalidated with its validators (`If-None-Match`, `If-Modified-Since`), and a 304
    /// keeps it another interval. Default 10000: the origin answers at most one small 304 per
    /// hot object every 10 s (about A_redi bytes each, far below T_low of any D_out), while its
    /// changes reach clients within 10 s.
    pub fresh_ms: u64,
    /// Time allowed for a fetch from the origin (connect, response head and whole body) before
    /// the waiting clients get 504, milliseconds. Default 10000.
    pub fetch_timeout_ms: u64,
    /// Disk bytes that the spool files of objects over `max_object_bytes` may take at once
    /// (each such object is fetched once and written to a spool file that its clients read as
    /// it fills; the file goes when the last of them is done). An object that would take the
    /// total over is relayed to each client instead. Default 1 GiB.
    pub spool_bytes: u64,
    /// Directory of the spool files (they are unlinked from the start). Default: the system's
    /// temporary directory (`$TMPDIR`, else /tmp).
    pub spool_dir: Option<std::path::PathBuf>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            cache_bytes: 64 << 20,
            origin_bytes: 32 << 20,
            max_object_bytes: 1 << 20,
            fresh_ms: 10_000,
            fetch_timeout_ms: 10_000,
            spool_bytes: 1 << 30,
            spool_dir: None,
        }
    }
}

impl ProxyConfig {
    /// The freshness interval.
    pub fn fresh(&self) -> Duration {
        Duration::from_millis(self.fresh_ms)
    }

    /// The fetch timeout.
    pub fn fetch_timeout(&self) -> Duration {
        Duration::from_millis(self.fetch_timeout_ms)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let err = |key: &'static str, msg: &str| {
            Err(ConfigError {
                key,
                msg: msg.to_string(),
            })
        };
        if self.cache_bytes == 0 {
            return err("proxy.cache_bytes", "must be positive");
        }
        if self.origin_bytes == 0 || self.origin_bytes > self.cache_bytes {
            return err("proxy.origin_bytes", "must be in 1..=proxy.cache_bytes");
        }
        if self.max_object_bytes == 0 || self.max_object_bytes > self.origin_bytes {
            return err(
                "proxy.max_object_bytes",
                "must be in 1..=proxy.origin_bytes",
            );
        }
        if self.fetch_timeout_ms == 0 {
            return err("proxy.fetch_timeout_ms", "must be at least 1");
        }
        if let Some(dir) = &self.spool_dir {
            if !dir.is_dir() {
                return err("proxy.spool_dir", "must be an existing directory");
            }
        }
        Ok(())
    }
}

fn d_usable() -> f64 {
    0.8
}
fn d_t_low() -> f64 {
    0.10
}
fn d_t_alert() -> f64 {
    0.50
}
fn d_t_high() -> f64 {
    0.75
}
fn d_t_coff() -> f64 {
    0.90
}
fn d_i_ctrl() -> u64 {
    1000
}
fn d_n_low() -> u32 {
    30
}
fn d_a_redi() -> f64 {
    468.0
}
fn d_large() -> u64 {
    1 << 20
}
fn d_points() -> u32 {
    64
}
fn d_min_grant() -> f64 {
    10.0
}
fn d_gives_rescue() -> bool {
    true
}
fn d_max_origins() -> usize {
    8
}
fn d_retry() -> u32 {
    30
}
fn d_timeout() -> u64 {
    10_000
}
fn d_first_vhost() -> u64 {
    1
}
fn d_status() -> String {
    "/dotslash-status".to_string()
}
fn d_expired_redirect() -> u64 {
    86_400
}

impl RescueConfig {
    /// The defaults for a server with this identity and outbound bandwidth B (kB/s).
    pub fn new(server_name: &str, web_ip: IpAddr, web_port: u16, bandwidth_kbps: f64) -> Self {
        RescueConfig {
            server_name: server_name.to_string(),
            vhost_domain: None,
            vhost_host: None,
            web_ip,
            web_port,
            bandwidth_kbps,
            usable: d_usable(),
            d_out_kbps: None,
            t_low: d_t_low(),
            t_alert: d_t_alert(),
            t_high: d_t_high(),
            t_coff: d_t_coff(),
            control_interval_ms: d_i_ctrl(),
            n_low: d_n_low(),
            max_idle_secs: None,
            a_redi_bytes: d_a_redi(),
            large_file_bytes: d_large(),
            chash_points: d_points(),
            sos_want_kbps: None,
            min_grant_kbps: d_min_grant(),
            max_grant_kbps: None,
            gives_rescue: d_gives_rescue(),
            max_origins: d_max_origins(),
            retry_refused_intervals: d_retry(),
            request_timeout_ms: d_timeout(),
            first_vhost_seq: d_first_vhost(),
            status_path: d_status(),
            server_aliases: Vec::new(),
            expired_redirect_secs: d_expired_redirect(),
            proxy: ProxyConfig::default(),
            registry: None,
            dns: None,
            peering: None,
        }
    }

    /// The same server with D_out set directly, kB/s.
    pub fn with_d_out(mut self, d_out_kbps: f64) -> Self {
        self.d_out_kbps = Some(d_out_kbps);
        self
    }

    /// D_out = B × U (or the configured value), bytes per second.
    pub fn d_out(&self) -> f64 {
        self.d_out_kbps.unwrap_or(self.bandwidth_kbps * self.usable) * 1000.0
    }

    /// D_resc = D_out × (1 − T_alert), bytes per second (§4.5).
    pub fn d_resc(&self) -> f64 {
        self.d_out() * (1.0 - self.t_alert)
    }

    /// I_ctrl.
    pub fn control_interval(&self) -> Duration {
        Duration::from_millis(self.control_interval_ms)
    }

    /// MaxIdle for this server's SOS requests, seconds (default 10 × N_low × I_ctrl).
    pub fn max_idle(&self) -> u32 {
        self.max_idle_secs.unwrap_or_else(|| {
            let ms = 10 * self.n_low as u64 * self.control_interval_ms;
            ms.div_ceil(1000).clamp(1, u32::MAX as u64) as u32
        })
    }

    /// How long an ended origin's names are redirected back to it.
    pub fn expired_redirect(&self) -> Duration {
        Duration::from_secs(self.expired_redirect_secs)
    }

    /// The protocol's request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The virtual host name with sequence number `seq`: `host-vh<seq>.domain`.
    pub fn vhost_name(&self, seq: u64) -> String {
        let (first, rest) = match self.server_name.split_once('.') {
            Some((a, b)) => (a, Some(b)),
            None => (self.server_name.as_str(), None),
        };
        let host = self.vhost_host.as_deref().unwrap_or(first);
        match self.vhost_domain.as_deref().or(rest) {
            Some(d) => format!("{host}-vh{seq}.{d}"),
            None => format!("{host}-vh{seq}"),
        }
    }

    /// Checks every setting against its range (Table 1 for the thresholds) and against the
    /// others (T_low < T_alert < T_high < T_coff).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key: &'static str, msg: String| Err(ConfigError { key, msg });
        if !valid_name(&self.server_name) {
            return err(
                "server_name",
                format!("`{}` is not a host name", self.server_name),
            );
        }
        if let Some(h) = &self.vhost_host {
            if !valid_name(h) || h.contains('.') {
                return err("vhost_host", format!("`{h}` is not a single label"));
            }
        }
        if let Some(d) = &self.vhost_domain {
            if !valid_name(d) {
                return err("vhost_domain", format!("`{d}` is not a domain name"));
            }
        }
        if !valid_name(&self.vhost_name(u64::MAX)) {
            return err(
                "server_name",
                "virtual host names built from it would be too long".into(),
            );
        }
        if self.web_port == 0 {
            return err("web_port", "must not be 0".into());
        }
        let rate_ok = |v: f64| v.is_finite() && v > 0.0 && v <= MAX_RATE_KBPS as f64;
        if !rate_ok(self.bandwidth_kbps) {
            return err("bandwidth_kbps", "must be a positive number of kB/s".into());
        }
        if !(self.usable.is_finite() && self.usable > 0.0 && self.usable <= 1.0) {
            return err("usable", "must be in (0, 1]".into());
        }
        if let Some(d) = self.d_out_kbps {
            if !rate_ok(d) {
                return err("d_out_kbps", "must be a positive number of kB/s".into());
            }
        }
        let range = |key, v: f64, lo: f64, lo_incl: bool, hi: f64, hi_incl: bool| {
            let above = if lo_incl { v >= lo } else { v > lo };
            let below = if hi_incl { v <= hi } else { v < hi };
            if v.is_finite() && above && below {
                Ok(())
            } else {
                Err(ConfigError {
                    key,
                    msg: format!(
                        "{v} outside {}{lo}, {hi}{} (seed 001 Table 1)",
                        if lo_incl { '[' } else { '(' },
                        if hi_incl { ']' } else { ')' }
                    ),
                })
            }
        };
        range("t_low", self.t_low, 0.0, false, 0.20, true)?;
        range("t_alert", self.t_alert, 0.40, true, 0.60, true)?;
        range("t_high", self.t_high, 0.60, true, 0.80, true)?;
        range("t_coff", self.t_coff, 0.80, true, 1.0, false)?;
        if self.t_alert >= self.t_high {
            return err("t_high", "must be above t_alert".into());
        }
        if self.control_interval_ms == 0 || self.control_interval_ms > 3_600_000 {
            return err("control_interval_ms", "must be in 1..=3600000".into());
        }
        if self.n_low == 0 || self.n_low > 1_000_000 {
            return err("n_low", "must be in 1..=1000000".into());
        }
        if self.max_idle_secs == Some(0) {
            return err("max_idle_secs", "must be at least 1".into());
        }
        if !(self.a_redi_bytes.is_finite() && self.a_redi_bytes >= 1.0) {
            return err("a_redi_bytes", "must be at least 1".into());
        }
        if self.chash_points == 0 || self.chash_points > 4096 {
            return err("chash_points", "must be in 1..=4096".into());
        }
        if let Some(w) = self.sos_want_kbps {
            if w == 0 || w > MAX_RATE_KBPS {
                return err("sos_want_kbps", "must be a positive number of kB/s".into());
            }
        }
        if !(self.min_grant_kbps.is_finite() && self.min_grant_kbps >= 1.0) {
            return err("min_grant_kbps", "must be at least 1".into());
        }
        if let Some(m) = self.max_grant_kbps {
            if !(m.is_finite() && m >= self.min_grant_kbps) {
                return err("max_grant_kbps", "must be at least min_grant_kbps".into());
            }
        }
        if self.max_origins == 0 {
            return err("max_origins", "must be at least 1".into());
        }
        if self.request_timeout_ms == 0 {
            return err("request_timeout_ms", "must be at least 1".into());
        }
        if !self.status_path.starts_with('/') {
            return err("status_path", "must start with `/`".into());
        }
        for a in &self.server_aliases {
            if !valid_name(a) {
                return err("server_aliases", format!("`{a}` is not a host name"));
            }
        }
        if let Some(r) = &self.registry {
            r.validate()?;
        }
        if let Some(d) = &self.dns {
            d.validate()?;
            for name in [
                self.server_name.clone(),
                self.vhost_name(self.first_vhost_seq),
            ] {
                if !d.in_zone(&name) {
                    return err(
                        "dns.zone",
                        format!(
                            "`{name}` is not in zone `{}`, so it cannot be updated",
                            d.zone
                        ),
                    );
                }
            }
        }
        self.proxy.validate()?;
        if let Some(p) = &self.peering {
            p.validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> RescueConfig {
        RescueConfig::new("www.rescue.com", [5, 6, 7, 8].into(), 8080, 1250.0)
    }

    #[test]
    fn table_1_defaults_from_toml() {
        let c: RescueConfig = toml::from_str(
            r#"
            server_name = "www.origin.com"
            web_ip = "1.2.3.4"
            web_port = 8080
            bandwidth_kbps = 1250
            "#,
        )
        .unwrap();
        assert_eq!(c.t_low, 0.10);
        assert_eq!(c.t_alert, 0.50);
        assert_eq!(c.t_high, 0.75);
        assert_eq!(c.t_coff, 0.90);
        assert_eq!(c.usable, 0.80);
        assert_eq!(c.control_interval(), Duration::from_secs(1));
        assert_eq!(c.n_low, 30);
        assert_eq!(c.a_redi_bytes, 468.0);
        assert_eq!(c.max_idle(), 300, "10 × N_low × I_ctrl");
        assert_eq!(c.d_out(), 1_000_000.0, "B × U");
        assert_eq!(c.d_resc(), 500_000.0, "D_out × (1 − T_alert)");
        assert_eq!(c.expired_redirect(), Duration::from_secs(86_400));
        assert!(c.server_aliases.is_empty());
        assert_eq!(c.proxy, ProxyConfig::default());
        assert_eq!(c.proxy.fresh(), Duration::from_secs(10));
        c.validate().unwrap();
        assert_eq!(
            c,
            RescueConfig::new("www.origin.com", [1, 2, 3, 4].into(), 8080, 1250.0)
        );
    }

    #[test]
    fn reads_as_a_rescue_table() {
        #[derive(Deserialize)]
        struct File {
            rescue: RescueConfig,
        }
        let f: File = toml::from_str(
            "[rescue]\nserver_name = \"www.origin.com\"\nweb_ip = \"1.2.3.4\"\nweb_port = 8080\nbandwidth_kbps = 1250\nn_low = 10\n",
        )
        .unwrap();
        assert_eq!(f.rescue.n_low, 10);
        assert_eq!(f.rescue.max_idle(), 100);
        f.rescue.validate().unwrap();
    }

    #[test]
    fn proxy_sub_table() {
        #[derive(Debug, Deserialize)]
        struct File {
            rescue: RescueConfig,
        }
        let f: File = toml::from_str(
            "[rescue]\nserver_name = \"www.rescue.com\"\nweb_ip = \"5.6.7.8\"\nweb_port = 80\nbandwidth_kbps = 1250\nserver_aliases = [\"rescue.com\"]\nexpired_redirect_secs = 60\n[rescue.proxy]\nfresh_ms = 500\nmax_object_bytes = 4096\n",
        )
        .unwrap();
        f.rescue.validate().unwrap();
        assert_eq!(f.rescue.server_aliases, ["rescue.com"]);
        assert_eq!(f.rescue.expired_redirect(), Duration::from_secs(60));
        assert_eq!(f.rescue.proxy.fresh(), Duration::from_millis(500));
        assert_eq!(f.rescue.proxy.max_object_bytes, 4096);
        assert_eq!(
            f.rescue.proxy.cache_bytes,
            ProxyConfig::default().cache_bytes
        );
        let e = toml::from_str::<File>(
            "[rescue]\nserver_name = \"a.b\"\nweb_ip = \"5.6.7.8\"\nweb_port = 80\nbandwidth_kbps = 1\n[rescue.proxy]\nfresh = 1\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("fresh"), "{e}");
    }

    #[test]
    fn serializes_back_to_the_same_table() {
        let c = base().with_d_out(53.9);
        let text = toml::to_string(&c).unwrap();
        let back: RescueConfig = toml::from_str(&text).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.d_out(), 53_900.0);
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = toml::from_str::<RescueConfig>(
            "server_name='a.b'\nweb_ip='1.1.1.1'\nweb_port=1\nbandwidth_kbps=1\nt_lo=0.1",
        )
        .unwrap_err();
        assert!(e.to_string().contains("t_lo"), "{e}");
    }

    #[test]
    fn vhost_names() {
        let c = base();
        assert_eq!(c.vhost_name(1), "www-vh1.rescue.com");
        let mut c = base();
        c.vhost_domain = Some("dotslash.example.org".into());
        c.vhost_host = Some("foo".into());
        assert_eq!(c.vhost_name(12), "foo-vh12.dotslash.example.org");
        let c = RescueConfig::new("localhost", [127, 0, 0, 1].into(), 80, 1.0);
        assert_eq!(c.vhost_name(3), "localhost-vh3");
    }

    #[test]
    fn ranges_of_table_1() {
        type Breaks = fn(&mut RescueConfig);
        let bad: Vec<(&str, Breaks)> = vec![
            ("t_low", |c| c.t_low = 0.0),
            ("t_low", |c| c.t_low = 0.21),
            ("t_alert", |c| c.t_alert = 0.39),
            ("t_alert", |c| c.t_alert = 0.61),
            ("t_high", |c| c.t_high = 0.59),
            ("t_high", |c| c.t_high = 0.81),
            ("t_coff", |c| c.t_coff = 0.79),
            ("t_coff", |c| c.t_coff = 1.0),
            ("t_high", |c| {
                c.t_alert = 0.6;
                c.t_high = 0.6
            }),
            ("usable", |c| c.usable = 0.0),
            ("usable", |c| c.usable = f64::NAN),
            ("bandwidth_kbps", |c| c.bandwidth_kbps = -1.0),
            ("d_out_kbps", |c| c.d_out_kbps = Some(0.0)),
            ("control_interval_ms", |c| c.control_interval_ms = 0),
            ("n_low", |c| c.n_low = 0),
            ("max_idle_secs", |c| c.max_idle_secs = Some(0)),
            ("server_name", |c| c.server_name = "a b".into()),
            ("server_name", |c| c.server_name = "a".repeat(250)),
            ("vhost_host", |c| c.vhost_host = Some("a.b".into())),
            ("web_port", |c| c.web_port = 0),
            ("status_path", |c| c.status_path = "status".into()),
            ("sos_want_kbps", |c| c.sos_want_kbps = Some(0)),
            ("server_aliases", |c| c.server_aliases = vec!["a/b".into()]),
            ("proxy.cache_bytes", |c| c.proxy.cache_bytes = 0),
            ("proxy.origin_bytes", |c| {
                c.proxy.origin_bytes = c.proxy.cache_bytes + 1
            }),
            ("proxy.max_object_bytes", |c| {
                c.proxy.max_object_bytes = c.proxy.origin_bytes + 1
            }),
            ("proxy.fetch_timeout_ms", |c| c.proxy.fetch_timeout_ms = 0),
            ("proxy.spool_dir", |c| {
                c.proxy.spool_dir = Some("/nonexistent/switchyard-spool".into())
            }),
        ];
        for (key, f) in bad {
            let mut c = base();
            f(&mut c);
            let e = c.validate().expect_err(key);
            assert_eq!(e.key, key, "{e}");
        }
        let mut c = base();
        c.peering = Some(PeeringConfig {
            listen: "127.0.0.1:7070".parse().unwrap(),
            cert: "c".into(),
            key: "k".into(),
            ca: "ca".into(),
            peers: vec![
                PeerConfig {
                    name: "a.example".into(),
                    addr: "127.0.0.1:7071".parse().unwrap(),
                    d_free_kbps: Some(100.0),
                    domain: None,
                },
                PeerConfig {
                    name: "A.example".into(),
                    addr: "127.0.0.1:7072".parse().unwrap(),
                    d_free_kbps: None,
                    domain: None,
                },
            ],
        });
        assert_eq!(c.validate().unwrap_err().key, "peering.peers.name");
        let p = c.peering.as_mut().unwrap();
        p.peers[1].name = "b.example".into();
        p.peers[1].d_free_kbps = Some(-1.0);
        assert_eq!(c.validate().unwrap_err().key, "peering.peers.d_free_kbps");
        c.peering.as_mut().unwrap().peers[1].d_free_kbps = None;
        c.validate().unwrap();

        let mut c = base();
        c.t_low = 0.2;
        c.t_alert = 0.4;
        c.t_high = 0.8;
        c.t_coff = 0.99;
        c.validate().unwrap();
    }
}
