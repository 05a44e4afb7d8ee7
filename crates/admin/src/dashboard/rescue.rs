//! The site's flash-crowd rescue (seed 001, DotSlash) on the dashboard: what does not change
//! (the site's name, its outbound capacity D_out, its configured peers) travels once in the
//! meta event ([`RescueSite`]); each update carries one small part ([`RescueBrief`]): the
//! site's state, its redirect rate, and the rescue servers it redirects to or the origins it
//! serves for, each as its peer's index in the meta's list with the virtual host name and the
//! rates. At most [`LISTED`] relationships are listed and names are cut to
//! [`MAX_NAME_BYTES`], so that the update of a busy 64-node cluster in rescue stays under 4 KB.

use serde::{Deserialize, Serialize};

use super::Num;
use crate::status::RescueStatus;

/// Relationships (rescue servers and origins together) listed in an update; the others are
/// counted in [`RescueBrief::more`].
pub const LISTED: usize = 2;

/// The longest name sent (a site's, a peer's, or a virtual host's); longer ones are cut at a
/// character boundary.
pub const MAX_NAME_BYTES: usize = 48;

/// What the meta event says of the site's rescue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RescueSite {
    /// The site's name.
    pub name: String,
    /// Its outbound capacity D_out, kB/s.
    pub max: Num,
    /// Its configured peers; relationships name them by index.
    pub peers: Vec<String>,
}

impl RescueSite {
    /// The static part of a driver's status.
    pub fn of(s: &RescueStatus) -> RescueSite {
        RescueSite {
            name: short(&s.server_name),
            max: kb(s.d_out_max),
            peers: s.peers.iter().map(|p| short(&p.name)).collect(),
        }
    }
}

/// A relationship with a peer: `[peer index, virtual host, D_redi kB/s, rate kB/s]`. For a
/// rescue server the virtual host is the one it gave the site and the rate is d_redi (what
/// the site redirects to it); for an origin the virtual host is its name here and the rate is
/// d_resc (what the site serves for it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Relation(pub u32, pub String, pub Num, pub Num);

/// The rescue part of an update.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RescueBrief {
    /// `normal`, `sos` (rescued by others) or `rescue` (rescuing others).
    pub st: String,
    /// The last interval's outbound rate d_out, kB/s.
    pub out: Num,
    /// The last interval's redirect rate R_redi, redirects per second.
    pub rr: Num,
    /// The site's rescue servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rs: Vec<Relation>,
    /// The origins the site serves for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub os: Vec<Relation>,
    /// Relationships not listed (beyond [`LISTED`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// `s` cut to at most [`MAX_NAME_BYTES`], at a character boundary.
fn short(s: &str) -> String {
    let mut end = s.len().min(MAX_NAME_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn kb(bytes_per_s: f64) -> Num {
    Num::round(bytes_per_s / 1000.0)
}

impl RescueBrief {
    /// The changing part of a driver's status.
    pub fn of(s: &RescueStatus) -> RescueBrief {
        // A peer not in the configured list (never, from a driver) gets the list's length:
        // the page shows it as unknown.
        let index = |name: &str| {
            s.peers
                .iter()
                .position(|p| p.name == name)
                .unwrap_or(s.peers.len()) as u32
        };
        let rs: Vec<Relation> = s
            .rescuers
            .iter()
            .take(LISTED)
            .map(|r| {
                Relation(
                    index(&r.peer),
                    short(&r.alias),
                    Num::round(r.d_redi_kbps as f64),
                    kb(r.d_redi),
                )
            })
            .collect();
        let os: Vec<Relation> = s
            .origins
            .iter()
            .take(LISTED - rs.len())
            .map(|o| Relation(index(&o.peer), short(&o.alias), kb(o.d_redi), kb(o.d_resc)))
            .collect();
        let listed = rs.len() + os.len();
        RescueBrief {
            st: short(&s.state),
            out: kb(s.d_out),
            rr: Num::round(s.r_redi),
            rs,
            os,
            more: (s.rescuers.len() + s.origins.len() - listed) as u64,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::status::{OriginEntry, PeerEntry, RescueTotals, RescuerEntry};

    pub(crate) fn status(rescuers: usize, origins: usize) -> RescueStatus {
        let peer = |name: String| PeerEntry {
            name,
            addr: "127.0.0.1:7000".parse().unwrap(),
            connected: true,
        };
        RescueStatus {
            server_name: "www.origin.test".into(),
            state: if rescuers > 0 { "sos" } else { "rescue" }.into(),
            ticks: 9,
            d_out_max: 200_000.0,
            d_out: 187_654.0,
            d_self: 150_000.0,
            d_resc: 0.0,
            r_redi: 12.345,
            t_redi: 0.69,
            a_redi: 468.0,
            d_free: 0.0,
            pending_sos: None,
            rescuers: (0..rescuers)
                .map(|i| RescuerEntry {
                    peer: format!("rescue{i}.example.test"),
                    alias: format!("www-origin-test-vh{i}.rescue{i}.example.test"),
                    web: "192.0.2.7:8080".into(),
                    d_redi_kbps: 90,
                    d_redi: 40_123.0,
                    redirects: 7,
                })
                .collect(),
            origins: (0..origins)
                .map(|i| OriginEntry {
                    peer: format!("origin{i}.test"),
                    fqdn: format!("www.origin{i}.test"),
                    alias: format!("www-origin{i}-vh1.rescue.test"),
                    d_alloc: 100_000.0,
                    d_redi: 90_000.0,
                    d_resc: 45_678.0,
                })
                .collect(),
            totals: RescueTotals::default(),
            peers: (0..origins)
                .map(|i| peer(format!("origin{i}.test")))
                .chain((0..rescuers).map(|i| peer(format!("rescue{i}.example.test"))))
                .collect(),
        }
    }

    #[test]
    fn a_rescued_site_lists_its_rescue_servers_with_their_rates() {
        let s = status(1, 0);
        let b = RescueBrief::of(&s);
        assert_eq!(b.st, "sos");
        assert_eq!((b.out, b.rr), (Num(188.0), Num(12.3)));
        assert_eq!(
            b.rs,
            vec![Relation(
                0,
                "www-origin-test-vh0.rescue0.example.test".into(),
                Num(90.0),
                Num(40.1)
            )]
        );
        assert!(b.os.is_empty() && b.more == 0);
        let text = serde_json::to_string(&b).unwrap();
        assert!(!text.contains("\"os\"") && !text.contains("more"), "{text}");
        assert_eq!(serde_json::from_str::<RescueBrief>(&text).unwrap(), b);
        let site = RescueSite::of(&s);
        assert_eq!(site.name, "www.origin.test");
        assert_eq!(site.max, Num(200.0));
        assert_eq!(site.peers[b.rs[0].0 as usize], "rescue0.example.test");
    }

    #[test]
    fn a_rescue_server_lists_its_origins_and_counts_the_ones_not_listed() {
        let s = status(0, LISTED + 3);
        let b = RescueBrief::of(&s);
        assert_eq!(b.st, "rescue");
        assert_eq!(b.os.len(), LISTED);
        assert_eq!(
            b.os[1],
            Relation(
                1,
                "www-origin1-vh1.rescue.test".into(),
                Num(90.0),
                Num(45.7)
            )
        );
        assert_eq!(RescueSite::of(&s).peers[1], "origin1.test");
        assert_eq!(b.more, 3);
        // Both roles at once: rescue servers first, the total listed stays LISTED.
        let b = RescueBrief::of(&status(1, 3));
        assert_eq!((b.rs.len(), b.os.len(), b.more), (1, 1, 2));
        assert_eq!(b.rs[0].0, 3, "the rescue server follows the three origins");
    }

    #[test]
    fn long_names_are_cut_at_a_character_boundary() {
        let mut s = status(1, 0);
        s.server_name = "é".repeat(40);
        s.rescuers[0].alias = "x".repeat(300);
        assert_eq!(RescueSite::of(&s).name, "é".repeat(MAX_NAME_BYTES / 2));
        assert_eq!(RescueBrief::of(&s).rs[0].1.len(), MAX_NAME_BYTES);
        s.server_name = format!("a{}", "é".repeat(40));
        assert_eq!(RescueSite::of(&s).name.len(), MAX_NAME_BYTES - 1);
    }

    #[test]
    fn an_unknown_peer_gets_the_index_past_the_list() {
        let mut s = status(1, 0);
        s.peers.clear();
        assert_eq!(RescueBrief::of(&s).rs[0].0, 0);
        s.peers = status(0, 2).peers;
        assert_eq!(RescueBrief::of(&s).rs[0].0, 2);
    }
}
