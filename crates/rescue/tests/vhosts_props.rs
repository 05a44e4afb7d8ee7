//! Property tests of the virtual host table against a model: aliases are never reused, a
//! live origin's names proxy to it, an ended origin's virtual host name redirects back (and
//! its own name is still proxied) for exactly the configured time, both unknown afterwards, own names are always the server's, every other
//! name is misdirected, and the spelling of a host (case, port, trailing dot) never matters.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use switchyard_rescue::{Lookup, PeerId, RescueConfig, Sos, VhostError, VhostTable};

const RETENTION: u64 = 50;

fn cfg() -> RescueConfig {
    let mut c = RescueConfig::new("www.rescue.com", [5, 6, 7, 8].into(), 8080, 1250.0);
    c.server_aliases = vec!["rescue.com".into()];
    c.expired_redirect_secs = RETENTION;
    c
}

#[derive(Debug, Clone)]
enum Op {
    /// Add origin `o{fqdn}.com` under alias `vh{alias}.rescue.com`.
    Add { fqdn: u8, alias: u8 },
    /// End the origin with alias `vh{alias}.rescue.com`.
    End { alias: u8 },
    /// Let time pass, seconds.
    Wait(u8),
    /// Forget expired entries.
    Purge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, 0u8..10).prop_map(|(fqdn, alias)| Op::Add { fqdn, alias }),
        2 => (0u8..10).prop_map(|alias| Op::End { alias }),
        2 => (0u8..40).prop_map(Op::Wait),
        1 => Just(Op::Purge),
    ]
}

/// The model's view of one relationship.
#[derive(Debug, Clone)]
struct M {
    fqdn: String,
    alias: String,
    ends: Option<u64>,
}

impl M {
    fn visible(&self, now: u64) -> bool {
        self.ends.is_none_or(|e| now < e + RETENTION)
    }
}

/// How `name` may be spelled in a request.
fn spellings(name: &str) -> [String; 4] {
    [
        name.to_string(),
        name.to_ascii_uppercase(),
        format!("{name}.:8080"),
        format!("{}:80", name.replace('o', "O")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn table_follows_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut t = VhostTable::new(&cfg());
        let mut now = 0u64;
        let mut rels: Vec<M> = Vec::new();
        let mut used_aliases: Vec<String> = Vec::new();
        for op in ops {
            let at = Duration::from_secs(now);
            match op {
                Op::Add { fqdn, alias } => {
                    let fqdn = format!("o{fqdn}.com");
                    let alias = format!("vh{alias}.rescue.com");
                    let sos = Sos { fqdn: fqdn.clone(), ip: [1, 2, 3, 4].into(), port: 80, max_idle_secs: 300, want_kbps: None };
                    let got = t.add_origin(at, PeerId(1), &sos, &alias);
                    let fqdn_live = rels.iter().any(|r| r.fqdn == fqdn && r.ends.is_none());
                    if used_aliases.contains(&alias) {
                        prop_assert_eq!(got, Err(VhostError::AliasReused(alias)));
                    } else if fqdn_live {
                        prop_assert_eq!(got, Err(VhostError::NameTaken(fqdn)));
                    } else {
                        prop_assert!(got.is_ok(), "{:?}", got);
                        used_aliases.push(alias.clone());
                        rels.push(M { fqdn, alias, ends: None });
                    }
                }
                Op::End { alias } => {
                    let alias = format!("vh{alias}.rescue.com");
                    let got = t.end_origin(at, &alias);
                    match rels.iter_mut().find(|r| r.alias == alias && r.ends.is_none()) {
                        Some(r) => {
                            prop_assert!(got.is_ok());
                            r.ends = Some(now);
                        }
                        None => prop_assert_eq!(got, Err(VhostError::NotLive(alias))),
                    }
                }
                Op::Wait(s) => now += s as u64,
                Op::Purge => {
                    t.purge(at);
                }
            }
            // Every name is looked up as the model says, however it is spelled.
            let at = Duration::from_secs(now);
            for own in ["www.rescue.com", "rescue.com", "5.6.7.8"] {
                for s in spellings(own) {
                    prop_assert_eq!(t.lookup(at, Some(&s)), Lookup::Own);
                }
            }
            let mut by_name: HashMap<String, &M> = HashMap::new();
            for r in rels.iter().filter(|r| r.visible(now)) {
                by_name.insert(r.alias.clone(), r);
                // A later relationship of the same origin takes its name over.
                by_name.insert(r.fqdn.clone(), r);
            }
            for i in 0..6 {
                for name in [format!("o{i}.com"), format!("vh{i}.rescue.com"), format!("vh{}.rescue.com", i + 4)] {
                    for s in spellings(&name) {
                        let got = t.lookup(at, Some(&s));
                        match by_name.get(&name) {
                            None => prop_assert_eq!(got, Lookup::Misdirected, "{}", s),
                            Some(r) => match got {
                                Lookup::Proxy(o) => {
                                    prop_assert!(r.ends.is_none());
                                    prop_assert_eq!(&o.alias, &r.alias);
                                    prop_assert_eq!(&o.fqdn, &r.fqdn);
                                }
                                Lookup::RedirectBack(o) => {
                                    prop_assert!(r.ends.is_some());
                                    prop_assert_eq!(&name, &r.alias);
                                    prop_assert_eq!(&o.fqdn, &r.fqdn);
                                    prop_assert_eq!(o.location("/x"), format!("http://{}/x", r.fqdn));
                                }
                                Lookup::ProxyEnded(o) => {
                                    prop_assert!(r.ends.is_some());
                                    prop_assert_eq!(&name, &r.fqdn);
                                    prop_assert_eq!(&o.alias, &r.alias);
                                }
                                other => prop_assert!(false, "{} gave {:?} for {:?}", s, other, r),
                            },
                        }
                    }
                }
            }
            prop_assert_eq!(t.lookup(at, Some("elsewhere.example")), Lookup::Misdirected);
            prop_assert_eq!(t.live().count(), rels.iter().filter(|r| r.ends.is_none()).count());
        }
    }

    /// Any host that is neither own nor given to an origin is misdirected.
    #[test]
    fn unknown_hosts_are_misdirected(host in "[a-zA-Z0-9.:\\[\\]_-]{0,40}") {
        let mut t = VhostTable::new(&cfg());
        let sos = Sos { fqdn: "www.origin.com".into(), ip: [1, 2, 3, 4].into(), port: 80, max_idle_secs: 300, want_kbps: None };
        t.add_origin(Duration::ZERO, PeerId(1), &sos, "www-vh1.rescue.com").unwrap();
        let norm = switchyard_rescue::normalize_host(&host);
        let known = ["www.rescue.com", "rescue.com", "5.6.7.8", "www.origin.com", "www-vh1.rescue.com"];
        let got = t.lookup(Duration::ZERO, Some(&host));
        match norm.as_deref() {
            Some(n) if known.contains(&n) => prop_assert_ne!(got, Lookup::Misdirected),
            _ => prop_assert_eq!(got, Lookup::Misdirected),
        }
    }
}
