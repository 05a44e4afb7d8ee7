//! The rescue server's virtual host table (seed 001 §4.1, §5.4.3): which site a request's
//! `Host` names.
//!
//! A rescue server gets requests under three kinds of names: its own (`server_name` and the
//! configured `server_aliases`: its configured content), the virtual host name it gave an
//! origin (`host-vhN.domain`, from the origin's HTTP redirects), and an origin's own name (from
//! DNS round robin once the origin added the rescue server's address). The last two are served
//! by proxying for that origin. When a relationship ends, the origin's names are kept for
//! `expired_redirect_secs` (clients and resolvers still use the old names): requests under
//! the virtual host name are redirected back to the origin's name, while requests under the
//! origin's own name go on being proxied, uncached. Those came by DNS round robin, from a
//! resolver that still gives this server's address for the name, so a redirect to the same
//! name would come straight back here (a loop until the resolver's record expires; seed 001
//! §4.1 redirects back, which holds for the virtual host names only). Afterwards both names
//! are unknown. Any other name is misdirected: the server answers 421 and fetches nothing,
//! so it is never an open proxy.
//!
//! Virtual host names are never reused (§4.1: "a rescue server does not reuse a virtual host
//! name for two different origin servers"): the table remembers every alias it was given and
//! refuses one it has seen before, even long after that origin was forgotten.
//!
//! Names are compared the way DNS compares them: case-insensitively, a port suffix stripped, a
//! trailing dot ignored ([`normalize_host`]). The table does no I/O and reads no clock: `now`
//! is a `Duration` since an origin the caller picks.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::config::RescueConfig;
use crate::proto::{valid_name, Sos};
use crate::PeerId;

/// An origin's entry, numbered by the table (never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OriginId(pub u64);

/// An origin the rescue server proxies for, or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The table's number for this relationship.
    pub id: OriginId,
    /// The peer it came from.
    pub peer: PeerId,
    /// The origin's name (sent as `Host` on fetches, and the target of redirects back).
    pub fqdn: String,
    /// The virtual host name given to it.
    pub alias: String,
    /// Where it is fetched from (its SOS's IP and web port: fetches bypass DNS, §4.2).
    pub addr: SocketAddr,
    /// Until when an ended origin is redirected back to; `None` while it is rescued.
    pub expires: Option<Duration>,
}

impl Origin {
    /// Whether it is still rescued.
    pub fn is_live(&self) -> bool {
        self.expires.is_none()
    }

    /// The URL an ended origin's request for `target` (origin-form) is redirected to:
    /// `http://<fqdn>[:port]<target>`, the port left out when it is 80.
    pub fn location(&self, target: &str) -> String {
        match self.addr.port() {
            80 => format!("http://{}{target}", self.fqdn),
            p => format!("http://{}:{p}{target}", self.fqdn),
        }
    }
}

/// What a request's host names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// The server's own site.
    Own,
    /// An origin it rescues: proxy for it.
    Proxy(&'a Origin),
    /// An origin it rescued recently, under its virtual host name: redirect the client back
    /// to the origin's own name.
    RedirectBack(&'a Origin),
    /// An origin it rescued recently, under the origin's own name (DNS round robin): proxy
    /// the request, storing nothing (a redirect to the same name could loop back here).
    ProxyEnded(&'a Origin),
    /// Nothing this server serves: 421, and no fetch.
    Misdirected,
}

/// Why the table refused to add or end an origin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VhostError {
    /// The alias was given out before: names are never reused.
    #[error("virtual host name `{0}` was used before")]
    AliasReused(String),
    /// A name is not a valid host name.
    #[error("`{0}` is not a host name")]
    BadName(String),
    /// A name is one of the server's own.
    #[error("`{0}` is a name of this server's own site")]
    OwnName(String),
    /// A name already maps to another relationship (a live origin, or an expired one's alias).
    #[error("`{0}` already names another origin")]
    NameTaken(String),
    /// No live origin has this alias.
    #[error("no live origin has the virtual host name `{0}`")]
    NotLive(String),
}

/// The virtual host table. See the module docs.
#[derive(Debug, Clone)]
pub struct VhostTable {
    own: HashSet<String>,
    own_ip: IpAddr,
    /// Normalized name (alias or FQDN) to the entry it maps to.
    names: HashMap<String, OriginId>,
    entries: HashMap<OriginId, Origin>,
    /// Every alias ever added, normalized.
    seen: HashSet<String>,
    retention: Duration,
    next_id: u64,
}

/// `host` as the table compares it: lower case, without a port suffix or a trailing dot, an
/// IPv6 literal without its brackets. `None` for an empty or malformed host.
pub fn normalize_host(host: &str) -> Option<String> {
    let name = if let Some(rest) = host.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        if !(after.is_empty() || valid_port(after.strip_prefix(':')?)) {
            return None;
        }
        addr
    } else {
        match host.split_once(':') {
            Some((name, port)) if valid_port(port) => name,
            Some(_) => return None,
            None => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.ends_with('.') {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

/// A port suffix: digits, at most 65535 (empty is allowed by RFC 3986's `port = *DIGIT`).
fn valid_port(p: &str) -> bool {
    p.is_empty()
        || (p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| n <= 65535))
}

impl VhostTable {
    /// An empty table for the server configured by `cfg`: its own names are `server_name`
    /// and `server_aliases` (and its `web_ip` written as a host), ended origins are redirected
    /// back for `expired_redirect_secs`.
    pub fn new(cfg: &RescueConfig) -> Self {
        let own = std::iter::once(&cfg.server_name)
            .chain(&cfg.server_aliases)
            .filter_map(|n| normalize_host(n))
            .collect();
        VhostTable {
            own,
            own_ip: cfg.web_ip,
            names: HashMap::new(),
            entries: HashMap::new(),
            seen: HashSet::new(),
            retention: cfg.expired_redirect(),
            next_id: 1,
        }
    }

    fn is_own(&self, name: &str) -> bool {
        self.own.contains(name) || name.parse::<IpAddr>().is_ok_and(|ip| ip == self.own_ip)
    }

    /// Start proxying for the origin `sos` from `peer` under the virtual host name `alias`
    /// (what [`crate::Action::OriginAdded`] carries). Refused if the alias was ever used
    /// before, if either name is the server's own, or if either already names another
    /// relationship (an expired origin's FQDN is taken over: the same origin rescued again).
    pub fn add_origin(
        &mut self,
        now: Duration,
        peer: PeerId,
        sos: &Sos,
        alias: &str,
    ) -> Result<OriginId, VhostError> {
        self.purge(now);
        let name = |n: &str| {
            let bare = n.strip_suffix('.').unwrap_or(n);
            match valid_name(bare) {
                true => Ok(bare.to_ascii_lowercase()),
                false => Err(VhostError::BadName(n.to_string())),
            }
        };
        let a = name(alias)?;
        let f = name(&sos.fqdn)?;
        if self.seen.contains(&a) {
            return Err(VhostError::AliasReused(alias.to_string()));
        }
        for n in [&a, &f] {
            if self.is_own(n) {
                return Err(VhostError::OwnName(n.clone()));
            }
        }
        if a == f || self.names.contains_key(&a) {
            return Err(VhostError::NameTaken(alias.to_string()));
        }
        if self.seen.contains(&f) {
            return Err(VhostError::NameTaken(sos.fqdn.clone()));
        }
        if let Some(id) = self.names.get(&f) {
            if self.entries[id].is_live() {
                return Err(VhostError::NameTaken(sos.fqdn.clone()));
            }
        }
        let id = OriginId(self.next_id);
        self.next_id += 1;
        self.seen.insert(a.clone());
        self.names.insert(a, id);
        self.names.insert(f, id);
        self.entries.insert(
            id,
            Origin {
                id,
                peer,
                fqdn: sos.fqdn.clone(),
                alias: alias.to_string(),
                addr: SocketAddr::new(sos.ip, sos.port),
                expires: None,
            },
        );
        Ok(id)
    }

    /// Stop proxying for the live origin with virtual host name `alias` (what
    /// [`crate::Action::OriginEnded`] carries): its names are redirected back to it until
    /// `now` + `expired_redirect_secs`.
    pub fn end_origin(&mut self, now: Duration, alias: &str) -> Result<OriginId, VhostError> {
        self.purge(now);
        let not_live = || VhostError::NotLive(alias.to_string());
        let a = normalize_host(alias).ok_or_else(not_live)?;
        let id = *self.names.get(&a).ok_or_else(not_live)?;
        let o = self.entries.get_mut(&id).ok_or_else(not_live)?;
        if !o.is_live() || normalize_host(&o.alias).as_deref() != Some(a.as_str()) {
            return Err(not_live());
        }
        o.expires = Some(now.saturating_add(self.retention));
        Ok(id)
    }

    /// What `host` (a `Host` field or a URI's authority) names at `now`. A request without
    /// any host is the server's own.
    pub fn lookup(&self, now: Duration, host: Option<&str>) -> Lookup<'_> {
        let Some(host) = host else {
            return Lookup::Own;
        };
        let Some(name) = normalize_host(host) else {
            return Lookup::Misdirected;
        };
        if self.is_own(&name) {
            return Lookup::Own;
        }
        let Some(o) = self.names.get(&name).and_then(|id| self.entries.get(id)) else {
            return Lookup::Misdirected;
        };
        match o.expires {
            None => Lookup::Proxy(o),
            Some(until) if now < until => {
                if normalize_host(&o.fqdn).is_some_and(|own| own == name) {
                    Lookup::ProxyEnded(o)
                } else {
                    Lookup::RedirectBack(o)
                }
            }
            Some(_) => Lookup::Misdirected,
        }
    }

    /// Forget the ended origins whose redirect period is over (their aliases stay used);
    /// returns their numbers.
    pub fn purge(&mut self, now: Duration) -> Vec<OriginId> {
        let gone: Vec<OriginId> = self
            .entries
            .values()
            .filter(|o| o.expires.is_some_and(|t| now >= t))
            .map(|o| o.id)
            .collect();
        for id in &gone {
            self.entries.remove(id);
        }
        self.names.retain(|_, id| !gone.contains(id));
        gone
    }

    /// An entry by number (live, or ended and not yet purged).
    pub fn origin(&self, id: OriginId) -> Option<&Origin> {
        self.entries.get(&id)
    }

    /// The origins being rescued.
    pub fn live(&self) -> impl Iterator<Item = &Origin> + '_ {
        self.entries.values().filter(|o| o.is_live())
    }

    /// The entries kept: live and ended ones not yet purged.
    pub fn entries(&self) -> impl Iterator<Item = &Origin> + '_ {
        self.entries.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RescueConfig {
        let mut c = RescueConfig::new("www.rescue.com", [5, 6, 7, 8].into(), 8080, 1250.0);
        c.server_aliases = vec!["Rescue.com.".into()];
        c.expired_redirect_secs = 100;
        c
    }

    fn sos(fqdn: &str, port: u16) -> Sos {
        Sos {
            fqdn: fqdn.into(),
            ip: [1, 2, 3, 4].into(),
            port,
            max_idle_secs: 300,
            want_kbps: None,
        }
    }

    const T0: Duration = Duration::ZERO;

    #[test]
    fn normalizes_hosts() {
        assert_eq!(
            normalize_host("WWW.Origin.COM").as_deref(),
            Some("www.origin.com")
        );
        assert_eq!(
            normalize_host("www.origin.com.:8080").as_deref(),
            Some("www.origin.com")
        );
        assert_eq!(
            normalize_host("www.origin.com:").as_deref(),
            Some("www.origin.com")
        );
        assert_eq!(normalize_host("[::1]:80").as_deref(), Some("::1"));
        assert_eq!(normalize_host("[::1]").as_deref(), Some("::1"));
        assert_eq!(normalize_host("5.6.7.8:1").as_deref(), Some("5.6.7.8"));
        for bad in [
            "", ".", "a..", "a:b", "a:1:2", "a:99999", "[::1", "[::1]x", ":80",
        ] {
            assert_eq!(normalize_host(bad), None, "{bad}");
        }
    }

    #[test]
    fn maps_own_alias_origin_and_others() {
        let mut t = VhostTable::new(&cfg());
        let id = t
            .add_origin(
                T0,
                PeerId(3),
                &sos("www.origin.com", 80),
                "www-vh1.rescue.com",
            )
            .unwrap();
        for own in [
            "www.rescue.com",
            "RESCUE.COM:8080",
            "5.6.7.8",
            "[5.6.7.8]:8080",
        ] {
            assert_eq!(t.lookup(T0, Some(own)), Lookup::Own, "{own}");
        }
        assert_eq!(t.lookup(T0, None), Lookup::Own);
        for name in [
            "www-vh1.rescue.com",
            "WWW-VH1.rescue.com.:8080",
            "www.origin.com",
            "Www.Origin.Com:80",
        ] {
            let Lookup::Proxy(o) = t.lookup(T0, Some(name)) else {
                panic!("{name}")
            };
            assert_eq!(o.id, id);
            assert_eq!(o.addr, "1.2.3.4:80".parse().unwrap());
            assert_eq!(o.fqdn, "www.origin.com");
        }
        for other in [
            "www-vh2.rescue.com",
            "evil.example",
            "1.2.3.4",
            "127.0.0.1",
            "a:b",
            "",
        ] {
            assert_eq!(t.lookup(T0, Some(other)), Lookup::Misdirected, "{other}");
        }
    }

    #[test]
    fn ended_origins_are_redirected_back_then_unknown() {
        let mut t = VhostTable::new(&cfg());
        let id = t
            .add_origin(
                T0,
                PeerId(3),
                &sos("www.origin.com", 8080),
                "www-vh1.rescue.com",
            )
            .unwrap();
        let t1 = Duration::from_secs(10);
        assert_eq!(t.end_origin(t1, "www-vh1.rescue.com"), Ok(id));
        assert!(matches!(
            t.end_origin(t1, "www-vh1.rescue.com"),
            Err(VhostError::NotLive(_))
        ));
        for name in ["www-vh1.rescue.com", "WWW.origin.com."] {
            let o = match t.lookup(t1, Some(name)) {
                // The virtual host name is sent back to the origin's name...
                Lookup::RedirectBack(o) if name.starts_with("www-vh1") => o,
                // ...and the origin's own name, which only DNS round robin sends here, is
                // proxied: a redirect to the same name could come straight back.
                Lookup::ProxyEnded(o) if name.starts_with("WWW.origin") => o,
                other => panic!("{name}: {other:?}"),
            };
            assert_eq!(o.location("/a?b"), "http://www.origin.com:8080/a?b");
            assert!(matches!(
                t.lookup(Duration::from_secs(109), Some(name)),
                Lookup::RedirectBack(_) | Lookup::ProxyEnded(_)
            ));
            assert_eq!(
                t.lookup(Duration::from_secs(110), Some(name)),
                Lookup::Misdirected
            );
        }
        assert_eq!(t.purge(Duration::from_secs(110)), vec![id]);
        assert!(t.origin(id).is_none());
        // The alias is never given out again, even after the entry is gone.
        assert_eq!(
            t.add_origin(
                Duration::from_secs(200),
                PeerId(4),
                &sos("www.other.com", 80),
                "WWW-VH1.rescue.com"
            ),
            Err(VhostError::AliasReused("WWW-VH1.rescue.com".into()))
        );
        assert_eq!(
            t.lookup(Duration::from_secs(200), Some("www-vh1.rescue.com")),
            Lookup::Misdirected
        );
    }

    #[test]
    fn an_origin_rescued_again_takes_its_name_back() {
        let mut t = VhostTable::new(&cfg());
        t.add_origin(
            T0,
            PeerId(3),
            &sos("www.origin.com", 80),
            "www-vh1.rescue.com",
        )
        .unwrap();
        t.end_origin(T0, "www-vh1.rescue.com").unwrap();
        let id2 = t
            .add_origin(
                T0,
                PeerId(3),
                &sos("www.origin.com", 80),
                "www-vh2.rescue.com",
            )
            .unwrap();
        assert!(matches!(t.lookup(T0, Some("www.origin.com")), Lookup::Proxy(o) if o.id == id2));
        assert!(matches!(
            t.lookup(T0, Some("www-vh1.rescue.com")),
            Lookup::RedirectBack(_)
        ));
        // Its old entry's purge leaves the new mapping alone.
        t.purge(Duration::from_secs(100));
        assert!(
            matches!(t.lookup(Duration::from_secs(100), Some("www.origin.com")), Lookup::Proxy(o) if o.id == id2)
        );
    }

    #[test]
    fn refuses_clashing_names() {
        let mut t = VhostTable::new(&cfg());
        t.add_origin(
            T0,
            PeerId(3),
            &sos("www.origin.com", 80),
            "www-vh1.rescue.com",
        )
        .unwrap();
        let cases = [
            (
                "www.origin.com",
                "www-vh2.rescue.com",
                VhostError::NameTaken("www.origin.com".into()),
            ),
            (
                "www.b.com",
                "www.origin.com",
                VhostError::NameTaken("www.origin.com".into()),
            ),
            (
                "www.b.com",
                "www.rescue.com",
                VhostError::OwnName("www.rescue.com".into()),
            ),
            (
                "rescue.com",
                "www-vh3.rescue.com",
                VhostError::OwnName("rescue.com".into()),
            ),
            (
                "www-vh1.rescue.com",
                "www-vh4.rescue.com",
                VhostError::NameTaken("www-vh1.rescue.com".into()),
            ),
            (
                "www.b.com",
                "bad name",
                VhostError::BadName("bad name".into()),
            ),
            (
                "www.b.com",
                "www-vh5.rescue.com:80",
                VhostError::BadName("www-vh5.rescue.com:80".into()),
            ),
            (
                "www.b.com",
                "www.b.com",
                VhostError::NameTaken("www.b.com".into()),
            ),
        ];
        for (fqdn, alias, want) in cases {
            assert_eq!(
                t.add_origin(T0, PeerId(4), &sos(fqdn, 80), alias),
                Err(want),
                "{fqdn} {alias}"
            );
        }
        assert!(matches!(
            t.end_origin(T0, "www.origin.com"),
            Err(VhostError::NotLive(_))
        ));
        assert_eq!(t.live().count(), 1);
    }
}
