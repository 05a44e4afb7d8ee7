//! Service discovery (§4.5) without I/O: what a site registers, when it registers again, how
//! search results become allocation candidates, and when a registration is presumed gone.
//!
//! A registration is soft state held under a lease of `ttl`: it lives while its owner keeps
//! the lease alive and disappears `ttl` after the last renewal the registry saw. An
//! [`Advertiser`] decides, at each call with the current time, what the owner should do next:
//! take a new lease and publish (at start, or when its lease must be presumed expired),
//! publish again at once (d_free changed beyond the threshold), publish periodically, renew the
//! lease, or nothing. The caller does it and reports the outcome. [`rank`] turns a search's
//! registrations into the candidate list sorted by free capacity, and [`to_candidates`] into the
//! [`Candidate`]s [`crate::Core::on_tick`] takes.
//!
//! d_free itself is [`crate::Core::d_free`]: D_resc = D_out × (1 − T_alert) when normal, 0 in
//! SOS, D_resc minus the allocations in rescue. The registry carries it in kB/s.
//!
//! # The bound on a crashed site's disappearance
//!
//! A site that stops renewing is removed by the registry at most `ttl` after its last renewal;
//! a searcher learns of it at its next search, so the site leaves every searcher's list within
//! `ttl + search_interval` of the crash ([`disappearance_bound`]).

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::proto::valid_name;
use crate::{Candidate, ConfigError, PeerId, RescueConfig};

/// What one site registers (§4.5's service template: URL, IP address, PortDots, d_free), plus
/// an optional administrative domain so that origins can spread their rescue servers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    /// The site's URL: `http://name/` or `http://name:port/` when the port is not 80.
    pub url: String,
    /// Its IP address (used to bypass DNS round robin when connecting to it).
    pub ip: IpAddr,
    /// The port of its rescue protocol (PortDots).
    pub port_dots: u16,
    /// Its free rescue capacity d_free, kB/s.
    pub d_free_kbps: f64,
    /// Its administrative domain, if it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// Why a registration read from the registry was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RegistrationError {
    /// Not a JSON registration.
    #[error("registration is not valid JSON of the expected shape: {0}")]
    Syntax(String),
    /// The URL is not `http://host[:port]/`.
    #[error("registration URL `{0}` is not of the form http://host[:port]/")]
    Url(String),
    /// PortDots is 0.
    #[error("registration has rescue port 0")]
    Port,
    /// d_free is negative, infinite or not a number.
    #[error("registration has d_free {0}, which is not a finite non-negative rate")]
    DFree(f64),
}

impl Registration {
    /// The registration of the server `cfg` describes, with its rescue protocol on `port_dots`
    /// and free capacity `d_free_bytes` (bytes per second, as [`crate::Core::d_free`] gives it).
    pub fn new(cfg: &RescueConfig, port_dots: u16, d_free_bytes: f64) -> Self {
        let url = if cfg.web_port == 80 {
            format!("http://{}/", cfg.server_name)
        } else {
            format!("http://{}:{}/", cfg.server_name, cfg.web_port)
        };
        Registration {
            url,
            ip: cfg.web_ip,
            port_dots,
            d_free_kbps: d_free_bytes / 1000.0,
            domain: None,
        }
    }

    /// The host name in the URL: the registration's key in the registry.
    pub fn name(&self) -> &str {
        url_host(&self.url).unwrap_or(&self.url)
    }

    /// Checks the fields a registration read from elsewhere must satisfy.
    pub fn validate(&self) -> Result<(), RegistrationError> {
        if url_host(&self.url).is_none() {
            return Err(RegistrationError::Url(self.url.clone()));
        }
        if self.port_dots == 0 {
            return Err(RegistrationError::Port);
        }
        if !self.d_free_kbps.is_finite() || self.d_free_kbps < 0.0 {
            return Err(RegistrationError::DFree(self.d_free_kbps));
        }
        Ok(())
    }

    /// The value stored in the registry (JSON).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a registration always serializes")
    }

    /// Reads and checks a value from the registry.
    pub fn decode(bytes: &[u8]) -> Result<Self, RegistrationError> {
        let r: Registration =
            serde_json::from_slice(bytes).map_err(|e| RegistrationError::Syntax(e.to_string()))?;
        r.validate()?;
        Ok(r)
    }
}

/// The host of `http://host[:port]/`, if `url` has that form with a plausible host name.
fn url_host(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("http://")?.strip_suffix('/')?;
    let host = match rest.rsplit_once(':') {
        Some((h, p)) => {
            let port: u16 = p.parse().ok()?;
            if port == 0 || p.starts_with('0') {
                return None;
            }
            h
        }
        None => rest,
    };
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    ok.then_some(host)
}

/// When to renew a registration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RenewalPolicy {
    /// The lease's time to live: how long the registry keeps a registration nobody renews.
    pub ttl: Duration,
    /// How often the lease is renewed. A third of the TTL: two renewals in a row may be lost
    /// (a leader election, a member going away) before the lease is in danger.
    pub keepalive: Duration,
    /// How often the registration is written again even if nothing changed (§4.5's periodic
    /// registration; it also publishes changes smaller than the threshold).
    pub refresh: Duration,
    /// A change of d_free by at least this fraction of D_resc is published at once.
    ///
    /// 10%: the registered d_free only ranks candidates and sizes the origin's expectations; the
    /// rescue server checks its real capacity when an SOS arrives and grants what it has. A
    /// smaller error does not reorder sites whose capacities differ by more than that, and the
    /// threshold keeps a rescue whose allocations move a little every interval from writing to
    /// the registry every interval. A change to or from 0 (entering or leaving SOS, or being
    /// fully allocated) is always published at once: a server with nothing to give must stop
    /// being asked.
    pub change_threshold: f64,
}

impl RenewalPolicy {
    /// The policy for a lease of `ttl`: keep-alive every ttl/3, refresh every 3 × ttl, 10%.
    pub fn new(ttl: Duration) -> Self {
        RenewalPolicy {
            ttl,
            keepalive: ttl / 3,
            refresh: ttl * 3,
            change_threshold: 0.1,
        }
    }
}

/// What the owner of a registration should do now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Write the registration with this d_free (kB/s). With `new_lease`, under a new lease
    /// (there is none, or the registry said the old one is gone); otherwise under the current
    /// one.
    Publish {
        /// d_free to write, kB/s.
        d_free_kbps: f64,
        /// Take a new lease first.
        new_lease: bool,
        /// Why.
        reason: PublishReason,
    },
    /// Renew the lease (also when it is presumed expired: the registry's answer tells).
    KeepAlive,
    /// Nothing until [`Advertiser::next_deadline`].
    Idle,
}

/// Why a registration is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublishReason {
    /// No lease yet, or the registry said the last one is gone.
    NoLease,
    /// d_free changed beyond the threshold.
    Changed,
    /// The periodic registration.
    Periodic,
}

/// The renewal state machine of one site's registration. Time is passed in.
#[derive(Debug, Clone)]
pub struct Advertiser {
    policy: RenewalPolicy,
    d_resc_kbps: f64,
    current: f64,
    published: Option<f64>,
    last_publish: Duration,
    /// When the lease expires at the latest by what we know (measured from when the request
    /// that set it was sent, so never later than the registry's own expiry).
    lease_until: Option<Duration>,
    last_keepalive: Duration,
    /// A failed attempt: no new attempt before this.
    retry_at: Duration,
}

impl Advertiser {
    /// A site with rescue capacity `d_resc_kbps` (kB/s) advertising `d_free_kbps` at first.
    pub fn new(policy: RenewalPolicy, d_resc_kbps: f64, d_free_kbps: f64) -> Self {
        Advertiser {
            policy,
            d_resc_kbps,
            current: d_free_kbps,
            published: None,
            last_publish: Duration::ZERO,
            lease_until: None,
            last_keepalive: Duration::ZERO,
            retry_at: Duration::ZERO,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RenewalPolicy {
        &self.policy
    }

    /// d_free changed (kB/s).
    pub fn set_d_free(&mut self, d_free_kbps: f64) {
        self.current = d_free_kbps;
    }

    /// The d_free to advertise, kB/s.
    pub fn d_free(&self) -> f64 {
        self.current
    }

    /// What the registry holds, if a publication succeeded under a lease still presumed alive.
    pub fn published(&self, now: Duration) -> Option<f64> {
        if self.lease_alive(now) {
            self.published
        } else {
            None
        }
    }

    /// Whether our lease is still alive by what we know.
    pub fn lease_alive(&self, now: Duration) -> bool {
        self.lease_until.is_some_and(|t| now < t)
    }

    fn differs(&self, published: f64) -> bool {
        let (a, b) = (published, self.current);
        if (a <= 0.0) != (b <= 0.0) {
            return true;
        }
        (a - b).abs() >= self.policy.change_threshold * self.d_resc_kbps && a != b
    }

    /// What to do at `now`.
    pub fn poll(&self, now: Duration) -> Step {
        if now < self.retry_at {
            return Step::Idle;
        }
        let publish = |new_lease, reason| Step::Publish {
            d_free_kbps: self.current,
            new_lease,
            reason,
        };
        match self.lease_until {
            None => return publish(true, PublishReason::NoLease),
            // Our estimate ran out (renewals failed for a while): ask the registry, which
            // may still hold the lease (a new leader renews every lease when it takes
            // over). Only when it says the lease is gone is a new one taken, so a
            // registration is never replaced while it is still alive.
            Some(until) if now >= until => return Step::KeepAlive,
            Some(_) => {}
        }
        match self.published {
            None => return publish(false, PublishReason::NoLease),
            Some(p) if self.differs(p) => return publish(false, PublishReason::Changed),
            Some(_) if now >= self.last_publish + self.policy.refresh => {
                return publish(false, PublishReason::Periodic)
            }
            Some(_) => {}
        }
        if now >= self.last_keepalive + self.policy.keepalive {
            return Step::KeepAlive;
        }
        Step::Idle
    }

    /// When [`Self::poll`] may next answer something other than `Idle` (if d_free does not
    /// change).
    pub fn next_deadline(&self, now: Duration) -> Duration {
        if now < self.retry_at {
            return self.retry_at;
        }
        match (self.lease_until, self.published) {
            (Some(until), Some(_)) if now < until => (self.last_keepalive + self.policy.keepalive)
                .min(self.last_publish + self.policy.refresh)
                .min(until)
                .max(now),
            _ => now,
        }
    }

    /// A publication sent at `sent_at` with `d_free_kbps` succeeded. With `lease_ttl`, it was
    /// made under a new lease granted with that TTL (whose grant request was sent at
    /// `sent_at` too).
    pub fn on_published(
        &mut self,
        sent_at: Duration,
        d_free_kbps: f64,
        lease_ttl: Option<Duration>,
    ) {
        self.published = Some(d_free_kbps);
        self.last_publish = sent_at;
        if let Some(ttl) = lease_ttl {
            self.lease_until = Some(sent_at + ttl);
            self.last_keepalive = sent_at;
        }
    }

    /// A keep-alive sent at `sent_at` was answered: the lease has `remaining` to live, or is
    /// gone when `remaining` is zero (the registry answers a keep-alive of an expired lease so).
    pub fn on_kept_alive(&mut self, sent_at: Duration, remaining: Duration) {
        self.last_keepalive = sent_at;
        if remaining.is_zero() {
            self.lease_lost();
        } else {
            self.lease_until = Some(sent_at + remaining);
        }
    }

    /// The registry says the lease no longer exists.
    pub fn lease_lost(&mut self) {
        self.lease_until = None;
        self.published = None;
    }

    /// An attempt at `now` failed: try again no sooner than `now + backoff`. The lease is not
    /// given up for that: it stays presumed alive until its known expiry.
    pub fn on_failure(&mut self, now: Duration, backoff: Duration) {
        self.retry_at = now + backoff;
    }
}

/// `[rescue.registry]`: where the registry is and how registrations and searches are timed.
///
/// ```toml
/// [rescue.registry]
/// endpoints = ["http://10.0.0.11:2379", "http://10.0.0.12:2379", "http://10.0.0.13:2379"]
/// # ttl_secs = 10   search_interval_ms = 1000   request_timeout_ms = 1000
/// # prefix = "/switchyard/rescue/"   max_candidates = 32   port_dots = 9000   domain = "example.org"
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// The etcd members' client URLs, `http://host:port`.
    pub endpoints: Vec<String>,
    /// The lease TTL, seconds: a crashed site leaves the registry this long after its last
    /// renewal. 10 s: renewals every 3.3 s survive two lost in a row (an election takes about
    /// one election timeout, 1 s by default), and a crashed site stops being asked for help
    /// within about ten control intervals.
    #[serde(default = "d_ttl")]
    pub ttl_secs: u64,
    /// How often the registry is searched, ms. One control interval (seed 001 runs its search
    /// timer in the control thread).
    #[serde(default = "d_search")]
    pub search_interval_ms: u64,
    /// The time limit of one registry request, ms. Less than a third of the TTL, so that a
    /// renewal sent to a member that died can time out and go to another one in time.
    #[serde(default = "d_req_timeout")]
    pub request_timeout_ms: u64,
    /// The key prefix of registrations: `/…/`.
    #[serde(default = "d_prefix")]
    pub prefix: String,
    /// The most candidates kept from a search.
    #[serde(default = "d_max_candidates")]
    pub max_candidates: usize,
    /// The port of this site's rescue protocol (PortDots), registered for others to connect to.
    /// None (the default): the port the `[rescue.peering]` listener is bound to. Set it when
    /// peers reach this site through a translated address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_dots: Option<u16>,
    /// This site's administrative domain, registered so origins can spread their rescue servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

fn d_ttl() -> u64 {
    10
}
fn d_search() -> u64 {
    1000
}
fn d_req_timeout() -> u64 {
    1000
}
fn d_prefix() -> String {
    "/switchyard/rescue/".into()
}
fn d_max_candidates() -> usize {
    32
}

impl RegistryConfig {
    /// The defaults with these endpoints.
    pub fn new(endpoints: Vec<String>) -> Self {
        RegistryConfig {
            endpoints,
            ttl_secs: d_ttl(),
            search_interval_ms: d_search(),
            request_timeout_ms: d_req_timeout(),
            prefix: d_prefix(),
            max_candidates: d_max_candidates(),
            port_dots: None,
            domain: None,
        }
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs)
    }

    /// The search interval.
    pub fn search_interval(&self) -> Duration {
        Duration::from_millis(self.search_interval_ms)
    }

    /// The time limit of one request.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The renewal policy for this TTL.
    pub fn renewal(&self) -> RenewalPolicy {
        RenewalPolicy::new(self.ttl())
    }

    /// The registry key of the site named `name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{}", self.prefix, name)
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key: &'static str, msg: String| Err(ConfigError { key, msg });
        if self.endpoints.is_empty() {
            return err(
                "registry.endpoints",
                "must name at least one etcd member".into(),
            );
        }
        for e in &self.endpoints {
            if endpoint_host_port(e).is_none() {
                return err(
                    "registry.endpoints",
                    format!("`{e}` is not of the form http://host:port"),
                );
            }
        }
        if !(2..=3600).contains(&self.ttl_secs) {
            return err("registry.ttl_secs", "must be from 2 to 3600".into());
        }
        if self.search_interval_ms < 100 || self.search_interval_ms > self.ttl_secs * 1000 {
            return err(
                "registry.search_interval_ms",
                "must be from 100 ms to the TTL".into(),
            );
        }
        if self.request_timeout_ms < 10 || self.request_timeout_ms * 3 > self.ttl_secs * 1000 {
            return err(
                "registry.request_timeout_ms",
                "must be at least 10 ms and at most a third of the TTL".into(),
            );
        }
        if !(self.prefix.starts_with('/') && self.prefix.ends_with('/') && self.prefix.len() > 1)
            || self.prefix.bytes().any(|b| !b.is_ascii_graphic())
        {
            return err(
                "registry.prefix",
                format!(
                    "`{}` must start and end with `/` and hold only printable ASCII",
                    self.prefix
                ),
            );
        }
        if self.max_candidates == 0 {
            return err("registry.max_candidates", "must be at least 1".into());
        }
        if self.port_dots == Some(0) {
            return err("registry.port_dots", "must not be 0".into());
        }
        if let Some(d) = &self.domain {
            if !valid_name(d) {
                return err("registry.domain", format!("`{d}` is not a domain name"));
            }
        }
        Ok(())
    }
}

/// `(host, port)` of `http://host:port` (or `http://host:port/`).
pub fn endpoint_host_port(url: &str) -> Option<(&str, u16)> {
    let rest = url.strip_prefix("http://")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let host_ok = valid_name(host)
        || host.parse::<std::net::Ipv4Addr>().is_ok()
        || host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok());
    host_ok.then_some((host, port))
}

/// A TSIG secret: kept out of debug output.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// `[rescue.dns]`: the DNS server holding this site's zone, which takes RFC 2136 updates
/// signed with a TSIG key. The site's own name (its round robin, as an origin) and its virtual
/// host names (as a rescue server) are in this zone.
///
/// ```toml
/// [rescue.dns]
/// server = "10.0.0.2:53"
/// zone = "origin.example"
/// tsig_key_name = "switchyard-update"
/// tsig_secret = "base64 of the key, as tsig-keygen prints it"
/// # tsig_algorithm = "hmac-sha256"   ttl_secs = 30   vhost_ttl_secs = 300
/// # timeout_ms = 2000   retry_max_ms = 30000
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsConfig {
    /// The primary server of the zone.
    pub server: std::net::SocketAddr,
    /// The zone.
    pub zone: String,
    /// The TSIG key's name, as the server knows it.
    pub tsig_key_name: String,
    /// The TSIG key, base64.
    pub tsig_secret: Secret,
    /// `hmac-sha256` (default), `hmac-sha384` or `hmac-sha512`.
    #[serde(default = "d_alg")]
    pub tsig_algorithm: String,
    /// TTL of the round-robin A records of the site's own name, seconds.
    ///
    /// 30 s: resolvers keep an address this long, so a released rescue server goes on
    /// receiving DNS-routed clients for up to 30 s (it redirects them back as an expired
    /// origin's, so nothing is lost), and a new one starts receiving them within 30 s, which is
    /// the time scale of the release decision (N_low = 30 intervals of 1 s). Shorter would
    /// multiply the queries the site's DNS answers during the crowd. An RRset has one TTL
    /// (RFC 2136 §3.4.2.2): the first addition also gives the site's own A record this TTL.
    #[serde(default = "d_rr_ttl")]
    pub ttl_secs: u32,
    /// TTL of virtual host names' A records, seconds.
    ///
    /// 300 s: a virtual host name maps to its rescue server for the relationship's life and
    /// afterwards (the server redirects an expired origin's requests back), so a cached answer
    /// never goes stale in a harmful way; a long TTL spares the rescue server's DNS.
    #[serde(default = "d_vhost_ttl")]
    pub vhost_ttl_secs: u32,
    /// The time limit of one update, ms.
    #[serde(default = "d_dns_timeout")]
    pub timeout_ms: u64,
    /// The longest wait between retries of a failed update, ms (they start at 250 ms and
    /// double).
    #[serde(default = "d_retry_max")]
    pub retry_max_ms: u64,
}

fn d_alg() -> String {
    "hmac-sha256".into()
}
fn d_rr_ttl() -> u32 {
    30
}
fn d_vhost_ttl() -> u32 {
    300
}
fn d_dns_timeout() -> u64 {
    2000
}
fn d_retry_max() -> u64 {
    30_000
}

/// The TSIG algorithms accepted.
pub const TSIG_ALGORITHMS: [&str; 3] = ["hmac-sha256", "hmac-sha384", "hmac-sha512"];

impl DnsConfig {
    /// The defaults for this server, zone and key.
    pub fn new(
        server: std::net::SocketAddr,
        zone: &str,
        tsig_key_name: &str,
        tsig_secret: &str,
    ) -> Self {
        DnsConfig {
            server,
            zone: zone.into(),
            tsig_key_name: tsig_key_name.into(),
            tsig_secret: Secret(tsig_secret.into()),
            tsig_algorithm: d_alg(),
            ttl_secs: d_rr_ttl(),
            vhost_ttl_secs: d_vhost_ttl(),
            timeout_ms: d_dns_timeout(),
            retry_max_ms: d_retry_max(),
        }
    }

    /// The key's bytes.
    pub fn tsig_key(&self) -> Result<Vec<u8>, ConfigError> {
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD
            .decode(self.tsig_secret.0.trim())
            .map_err(|e| ConfigError {
                key: "dns.tsig_secret",
                msg: format!("is not base64: {e}"),
            })?;
        if key.len() < 16 {
            return Err(ConfigError {
                key: "dns.tsig_secret",
                msg: format!("is {} bytes long; at least 16 are needed", key.len()),
            });
        }
        Ok(key)
    }

    /// Whether `name` is the zone or inside it.
    pub fn in_zone(&self, name: &str) -> bool {
        let (n, z) = (name.trim_end_matches('.'), self.zone.trim_end_matches('.'));
        n.eq_ignore_ascii_case(z)
            || (n.len() > z.len()
                && n.as_bytes()[n.len() - z.len() - 1] == b'.'
                && n[n.len() - z.len()..].eq_ignore_ascii_case(z))
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key: &'static str, msg: String| Err(ConfigError { key, msg });
        if self.server.port() == 0 {
            return err("dns.server", "port must not be 0".into());
        }
        if !valid_name(self.zone.trim_end_matches('.')) {
            return err("dns.zone", format!("`{}` is not a domain name", self.zone));
        }
        if !valid_name(self.tsig_key_name.trim_end_matches('.')) {
            return err(
                "dns.tsig_key_name",
                format!("`{}` is not a key name", self.tsig_key_name),
            );
        }
        if !TSIG_ALGORITHMS.contains(&self.tsig_algorithm.as_str()) {
            return err(
                "dns.tsig_algorithm",
                format!(
                    "`{}` is not one of {}",
                    self.tsig_algorithm,
                    TSIG_ALGORITHMS.join(", ")
                ),
            );
        }
        self.tsig_key()?;
        if self.ttl_secs == 0 || self.vhost_ttl_secs == 0 {
            return err("dns.ttl_secs", "TTLs must be at least 1 s".into());
        }
        if self.timeout_ms == 0 {
            return err("dns.timeout_ms", "must be at least 1".into());
        }
        if self.retry_max_ms < 250 {
            return err("dns.retry_max_ms", "must be at least 250".into());
        }
        Ok(())
    }
}

/// How long after a site's crash every searcher has stopped listing it, at most.
pub fn disappearance_bound(ttl: Duration, search_interval: Duration) -> Duration {
    ttl + search_interval
}

/// The candidate list from a search: valid registrations other than `own_name` with free
/// capacity, largest d_free first (ties by name, so every searcher sees one order), at most
/// `max` of them, one per name (the largest if a name appears twice).
pub fn rank(
    regs: impl IntoIterator<Item = Registration>,
    own_name: &str,
    max: usize,
) -> Vec<Registration> {
    let mut v: Vec<Registration> = regs
        .into_iter()
        .filter(|r| r.validate().is_ok() && r.d_free_kbps > 0.0 && r.name() != own_name)
        .collect();
    v.sort_by(|a, b| {
        b.d_free_kbps
            .total_cmp(&a.d_free_kbps)
            .then_with(|| a.name().cmp(b.name()))
    });
    let mut seen = std::collections::HashSet::new();
    v.retain(|r| seen.insert(r.name().to_owned()));
    v.truncate(max);
    v
}

/// The [`Candidate`]s for [`crate::Core::on_tick`], in the order of `ranked`: `peer_of` names
/// the peer a registration belongs to (the driver's peer table); registrations of sites that
/// are not peers are left out.
pub fn to_candidates(
    ranked: &[Registration],
    mut peer_of: impl FnMut(&Registration) -> Option<PeerId>,
) -> Vec<Candidate> {
    ranked
        .iter()
        .filter_map(|r| {
            peer_of(r).map(|peer| Candidate {
                peer,
                d_free_kbps: r.d_free_kbps,
                domain: r.domain.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reg(name: &str, d: f64) -> Registration {
        Registration {
            url: format!("http://{name}/"),
            ip: "192.0.2.1".parse().unwrap(),
            port_dots: 9000,
            d_free_kbps: d,
            domain: None,
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    const KEY: &str = "c2VjcmV0LWtleS1vZi0zMi1ieXRlcy1sb25nLi4uLi4=";

    fn site_toml(extra: &str) -> String {
        format!(
            "server_name = \"www.origin.com\"\nweb_ip = \"1.2.3.4\"\nweb_port = 8080\n\
             bandwidth_kbps = 1250\n{extra}"
        )
    }

    #[test]
    fn registry_and_dns_tables_parse_with_defaults() {
        let text = site_toml(&format!(
            "[registry]\nendpoints = [\"http://127.0.0.1:2379\", \"http://[::1]:2379/\", \"http://etcd-2.lab:2379\"]\n\
             [dns]\nserver = \"127.0.0.1:5353\"\nzone = \"origin.com.\"\ntsig_key_name = \"k1\"\ntsig_secret = \"{KEY}\"\n"
        ));
        let c: RescueConfig = toml::from_str(&text).unwrap();
        c.validate().unwrap();
        let r = c.registry.as_ref().unwrap();
        assert_eq!(
            (r.ttl_secs, r.search_interval_ms, r.port_dots),
            (10, 1000, None)
        );
        assert_eq!(r.key("www.origin.com"), "/switchyard/rescue/www.origin.com");
        let d = c.dns.as_ref().unwrap();
        assert_eq!(
            (d.tsig_algorithm.as_str(), d.ttl_secs, d.vhost_ttl_secs),
            ("hmac-sha256", 30, 300)
        );
        assert_eq!(d.tsig_key().unwrap(), b"secret-key-of-32-bytes-long.....");
        assert!(!format!("{d:?}").contains(KEY));
        assert!(
            d.in_zone("www-vh1.origin.com") && d.in_zone("ORIGIN.com") && !d.in_zone("xorigin.com")
        );
        // Serialized back, the same.
        let back: RescueConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn bad_registry_and_dns_values_say_which_key() {
        let dns = |extra: &str| {
            format!("[dns]\nserver = \"127.0.0.1:53\"\nzone = \"origin.com\"\ntsig_key_name = \"k\"\ntsig_secret = \"{KEY}\"\n{extra}")
        };
        let cases = [
            ("[registry]\nendpoints = []\n".to_string(), "registry.endpoints"),
            ("[registry]\nendpoints = [\"https://a:1\"]\n".into(), "registry.endpoints"),
            ("[registry]\nendpoints = [\"http://a\"]\n".into(), "registry.endpoints"),
            ("[registry]\nendpoints = [\"http://a:1\"]\nttl_secs = 1\n".into(), "registry.ttl_secs"),
            ("[registry]\nendpoints = [\"http://a:1\"]\nttl_secs = 3\nrequest_timeout_ms = 1500\n".into(), "registry.request_timeout_ms"),
            ("[registry]\nendpoints = [\"http://a:1\"]\nsearch_interval_ms = 20000\n".into(), "registry.search_interval_ms"),
            ("[registry]\nendpoints = [\"http://a:1\"]\nprefix = \"x\"\n".into(), "registry.prefix"),
            ("[registry]\nendpoints = [\"http://a:1\"]\nmax_candidates = 0\n".into(), "registry.max_candidates"),
            ("[registry]\nendpoints = [\"http://a:1\"]\nport_dots = 0\n".into(), "registry.port_dots"),
            (dns("tsig_algorithm = \"hmac-md5\"\n"), "dns.tsig_algorithm"),
            (dns("ttl_secs = 0\n"), "dns.ttl_secs"),
            (dns("retry_max_ms = 1\n"), "dns.retry_max_ms"),
            (dns("").replace(KEY, "not base64!"), "dns.tsig_secret"),
            (dns("").replace(KEY, "c2hvcnQ="), "dns.tsig_secret"),
            (dns("").replace("zone = \"origin.com\"", "zone = \"other.com\""), "dns.zone"),
            (dns("").replace("zone = \"origin.com\"", "zone = \"a..b\""), "dns.zone"),
            (dns("").replace("tsig_key_name = \"k\"", "tsig_key_name = \"\""), "dns.tsig_key_name"),
        ];
        for (extra, key) in cases {
            let c: RescueConfig = toml::from_str(&site_toml(&extra)).unwrap();
            let e = c.validate().unwrap_err();
            assert_eq!(e.key, key, "{extra}: {e}");
        }
        // Unknown keys and unparsable values fail at parse time, naming the key.
        let e = toml::from_str::<RescueConfig>(&site_toml(
            "[registry]\nendpoints = [\"http://a:1\"]\nttl = 3\n",
        ))
        .unwrap_err();
        assert!(e.to_string().contains("ttl"), "{e}");
        let e =
            toml::from_str::<RescueConfig>(&site_toml(&dns("").replace("127.0.0.1:53", "nowhere")))
                .unwrap_err();
        assert!(e.to_string().contains("server"), "{e}");
    }

    #[test]
    fn registration_of_a_config() {
        let cfg = RescueConfig::new("www.origin.com", "1.2.3.4".parse().unwrap(), 8080, 1250.0);
        let core = crate::Core::new(cfg.clone()).unwrap();
        let r = Registration::new(&cfg, 9000, core.d_free());
        assert_eq!(r.url, "http://www.origin.com:8080/");
        assert_eq!(r.name(), "www.origin.com");
        // D_out = 1250 × 0.8 = 1000 kB/s; D_resc = 1000 × (1 − 0.5) = 500 kB/s when normal.
        assert!((r.d_free_kbps - 500.0).abs() < 1e-9);
        let cfg80 = RescueConfig::new("a.example", "1.2.3.4".parse().unwrap(), 80, 1.0);
        assert_eq!(Registration::new(&cfg80, 1, 0.0).url, "http://a.example/");
        assert_eq!(Registration::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn decode_rejects_bad_values() {
        let bad = [
            &br#"{"url":"http://a/","ip":"1.2.3.4","port_dots":0,"d_free_kbps":1}"#[..],
            br#"{"url":"ftp://a/","ip":"1.2.3.4","port_dots":1,"d_free_kbps":1}"#,
            br#"{"url":"http://a:0/","ip":"1.2.3.4","port_dots":1,"d_free_kbps":1}"#,
            br#"{"url":"http://a b/","ip":"1.2.3.4","port_dots":1,"d_free_kbps":1}"#,
            br#"{"url":"http://a/","ip":"1.2.3.4","port_dots":1,"d_free_kbps":-1}"#,
            br#"{"url":"http://a/","ip":"1.2.3.4","port_dots":1,"d_free_kbps":1,"x":1}"#,
            br#"{"url":"http://a/","ip":"1.2.3","port_dots":1,"d_free_kbps":1}"#,
            b"",
        ];
        for b in bad {
            assert!(
                Registration::decode(b).is_err(),
                "{}",
                String::from_utf8_lossy(b)
            );
        }
        let ok =
            br#"{"url":"http://a.b:81/","ip":"::1","port_dots":1,"d_free_kbps":0,"domain":"b"}"#;
        assert_eq!(Registration::decode(ok).unwrap().name(), "a.b");
    }

    #[test]
    fn advertiser_lifecycle() {
        let mut a = Advertiser::new(RenewalPolicy::new(S(9)), 500.0, 500.0);
        let Step::Publish {
            new_lease: true,
            reason: PublishReason::NoLease,
            ..
        } = a.poll(S(0))
        else {
            panic!("{:?}", a.poll(S(0)))
        };
        a.on_published(S(0), 500.0, Some(S(9)));
        assert_eq!(a.poll(S(1)), Step::Idle);
        assert_eq!(a.next_deadline(S(1)), S(3));
        assert_eq!(a.poll(S(3)), Step::KeepAlive);
        a.on_kept_alive(S(3), S(9));
        // A small change waits for the periodic registration.
        a.set_d_free(460.0);
        assert_eq!(a.poll(S(4)), Step::Idle);
        // Going to 0 (SOS) is published at once.
        a.set_d_free(0.0);
        assert!(matches!(
            a.poll(S(4)),
            Step::Publish {
                d_free_kbps: 0.0,
                new_lease: false,
                reason: PublishReason::Changed
            }
        ));
        a.on_published(S(4), 0.0, None);
        assert_eq!(a.published(S(4)), Some(0.0));
        // A failure backs off without giving up the lease.
        a.set_d_free(500.0);
        a.on_failure(S(5), S(1));
        assert_eq!(a.poll(S(5)), Step::Idle);
        assert!(matches!(
            a.poll(S(6)),
            Step::Publish {
                new_lease: false,
                ..
            }
        ));
        // Without renewals the lease is presumed gone at its expiry, 3 + 9; the registry is
        // asked before a new lease is taken.
        assert!(a.lease_alive(S(11)));
        assert!(!a.lease_alive(S(12)));
        assert_eq!(a.published(S(12)), None);
        assert_eq!(a.poll(S(12)), Step::KeepAlive);
        // It is still there (a new leader renewed it): carry on under it.
        a.on_kept_alive(S(12), S(9));
        assert!(matches!(
            a.poll(S(12)),
            Step::Publish {
                new_lease: false,
                ..
            }
        ));
        a.on_published(S(12), 500.0, None);
        assert_eq!(a.poll(S(12)), Step::Idle);
        // A renewal answered with TTL 0: the registry dropped the lease.
        a.on_kept_alive(S(15), Duration::ZERO);
        assert_eq!(a.published(S(15)), None);
        assert!(matches!(
            a.poll(S(15)),
            Step::Publish {
                new_lease: true,
                ..
            }
        ));
    }

    #[test]
    fn rank_and_candidates() {
        let regs = vec![
            reg("c.x", 100.0),
            reg("a.x", 300.0),
            reg("me.x", 900.0),
            reg("b.x", 300.0),
            reg("z.x", 0.0),
            reg("a.x", 50.0),
        ];
        let r = rank(regs, "me.x", 10);
        let names: Vec<_> = r.iter().map(|r| r.name()).collect();
        assert_eq!(names, ["a.x", "b.x", "c.x"]);
        assert_eq!(r[0].d_free_kbps, 300.0);
        let c = to_candidates(&r, |r| {
            (r.name() != "b.x").then_some(PeerId(r.name().len() as u32))
        });
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].peer, PeerId(3));
        assert_eq!(c[1].d_free_kbps, 100.0);
        assert_eq!(disappearance_bound(S(10), S(1)), S(11));
    }

    fn arb_reg() -> impl Strategy<Value = Registration> {
        (
            "[a-d]\\.x",
            prop_oneof![Just(0.0), 0.0..1000.0f64, Just(-1.0), Just(f64::NAN)],
        )
            .prop_map(|(n, d)| reg(&n, d))
    }

    proptest! {
        #[test]
        fn rank_is_sorted_unique_and_valid(regs in proptest::collection::vec(arb_reg(), 0..20), max in 0usize..6) {
            let r = rank(regs.clone(), "a.x", max);
            prop_assert!(r.len() <= max);
            for w in r.windows(2) {
                prop_assert!(w[0].d_free_kbps >= w[1].d_free_kbps);
                prop_assert!(w[0].name() != w[1].name());
            }
            for x in &r {
                prop_assert!(x.d_free_kbps > 0.0 && x.d_free_kbps.is_finite());
                prop_assert!(x.name() != "a.x");
                // Each listed site appears with its largest valid offer.
                let best = regs.iter().filter(|y| y.name() == x.name() && y.validate().is_ok())
                    .map(|y| y.d_free_kbps).fold(0.0, f64::max);
                prop_assert_eq!(x.d_free_kbps, best);
            }
            // Nothing better was left out.
            if r.len() == max && max > 0 {
                let last = r[max - 1].d_free_kbps;
                for y in regs.iter().filter(|y| y.validate().is_ok() && y.name() != "a.x") {
                    if !r.iter().any(|x| x.name() == y.name()) {
                        prop_assert!(y.d_free_kbps <= last);
                    }
                }
            }
        }

        /// Whatever fails, a new lease is asked for only at the start or after the registry
        /// said the old one is gone; and the machine never stalls (Idle always has a later
        /// deadline).
        #[test]
        fn a_new_lease_only_after_the_registry_dropped_the_old_one(
            outcomes in proptest::collection::vec(0u8..10, 1..300),
            ttl_s in 3u64..20,
        ) {
            let policy = RenewalPolicy::new(S(ttl_s));
            let mut a = Advertiser::new(policy, 500.0, 500.0);
            let mut now = Duration::ZERO;
            let mut gone = true;
            for o in outcomes {
                match a.poll(now) {
                    Step::Publish { d_free_kbps, new_lease, .. } => {
                        if new_lease {
                            prop_assert!(gone, "new lease at {now:?} while the old one lives");
                        }
                        if o < 3 {
                            a.on_failure(now, Duration::from_millis(500));
                        } else {
                            a.on_published(now, d_free_kbps, new_lease.then_some(policy.ttl));
                            gone &= !new_lease;
                        }
                    }
                    Step::KeepAlive => {
                        if o < 3 {
                            a.on_failure(now, Duration::from_millis(500));
                        } else if o == 3 {
                            a.on_kept_alive(now, Duration::ZERO);
                            gone = true;
                        } else {
                            a.on_kept_alive(now, policy.ttl);
                        }
                    }
                    Step::Idle => {
                        let next = a.next_deadline(now);
                        prop_assert!(next > now);
                        now = next;
                    }
                }
                now += Duration::from_millis(100);
                if o == 9 {
                    a.set_d_free(if a.d_free() > 0.0 { 0.0 } else { 500.0 });
                }
            }
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Registration::decode(&bytes);
        }

        /// With every step done at once, a site that is polled at least every second never
        /// loses its lease, the registry is never further from d_free than the threshold (or
        /// on the wrong side of 0), and once d_free settles the exact value is published
        /// within one refresh period.
        #[test]
        fn advertiser_keeps_lease_and_tracks_d_free(
            changes in proptest::collection::vec((1u64..2000, prop_oneof![Just(0.0), 0.0..500.0f64]), 1..40),
            ttl_s in 3u64..30,
        ) {
            let policy = RenewalPolicy::new(S(ttl_s));
            let mut a = Advertiser::new(policy, 500.0, 500.0);
            let mut now = Duration::ZERO;
            let mut grants = 0;
            let run_until = |a: &mut Advertiser, now: &mut Duration, end: Duration, grants: &mut u32| -> Result<(), TestCaseError> {
                loop {
                    loop {
                        match a.poll(*now) {
                            Step::Publish { d_free_kbps, new_lease, .. } => {
                                if new_lease { *grants += 1; }
                                a.on_published(*now, d_free_kbps, new_lease.then_some(policy.ttl));
                            }
                            Step::KeepAlive => a.on_kept_alive(*now, policy.ttl),
                            Step::Idle => break,
                        }
                    }
                    prop_assert!(a.lease_alive(*now));
                    let p = a.published(*now).unwrap();
                    prop_assert_eq!(p <= 0.0, a.d_free() <= 0.0);
                    prop_assert!((p - a.d_free()).abs() < 0.1 * 500.0 + 1e-9);
                    let next = a.next_deadline(*now);
                    prop_assert!(next > *now);
                    if *now >= end { return Ok(()); }
                    *now = next.min(*now + S(1)).min(end);
                }
            };
            for (dt_ms, d) in changes {
                a.set_d_free(d);
                let end = now + Duration::from_millis(dt_ms * 10);
                run_until(&mut a, &mut now, end, &mut grants)?;
            }
            let end = now + policy.refresh;
            run_until(&mut a, &mut now, end, &mut grants)?;
            prop_assert_eq!(a.published(now), Some(a.d_free()));
            prop_assert_eq!(grants, 1);
        }
    }
}
