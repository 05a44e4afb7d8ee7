//! The lab's layer-4 director for cooperative mode: LVS direct routing built from nftables.
//!
//! Seed 000 §5 spread connections over the nodes with LVS in direct-routing mode (IPVS,
//! `ipvsadm`). This machine's kernel has no IPVS (`CONFIG_IP_VS` is not set), so the director
//! does what IPVS-DR does with what the kernel has: an nftables `netdev` ingress chain on the
//! director's interface picks a real server per flow and sends the frame there unchanged with
//! `fwd ip to … device …` (the kernel resolves the server's MAC address and transmits; the IP
//! header, addressed to the VIP, is left as it is). The real servers hold the VIP on `lo` with
//! `arp_ignore=1`/`arp_announce=2`, accept the packets as their own and answer the client
//! directly. Only the director answers ARP for the VIP.
//!
//! ```text
//! table netdev sy_director {
//!   chain ingress {
//!     type filter hook ingress device "eth0" priority -500; policy accept;
//!     ip daddr VIP tcp dport PORT
//!       fwd ip to jhash ip saddr . tcp sport mod 64 seed 0x… map { 0 : n0, 1 : n1, … } device "eth0"
//!   }
//! }
//! ```
//!
//! Every packet of a flow hashes to the same bucket (the client's address and port, with a
//! fixed seed), so a connection stays on its node; there is no per-flow state, so nothing
//! expires. The buckets are spread round robin over the nodes ([`assign`]); when a node is
//! taken out ([`Director::set_live`]) only its buckets go to the others, so connections on
//! the other nodes keep their node (like IPVS with a health checker taking a real server out;
//! the connections of the node taken out are lost, as they would be with IPVS). The chain is
//! replaced in one nftables transaction.
//!
//! DNS round robin (several A records for one name, BIND is installed by
//! `scripts/install-deps`) is the documented alternative; it needs no director at all but
//! spreads per client lookup, not per connection.

use std::net::Ipv4Addr;

use switchyard_handoff::netns::NetNs;
use switchyard_handoff::steer::nft::run_nft_script;
use switchyard_handoff::Result;

/// Buckets of the flow hash: enough that a node taken out spreads its share evenly.
pub const BUCKETS: usize = 64;
/// The hash's seed: fixed, so that replacing the chain keeps every flow in its bucket.
pub const SEED: u32 = 0x5eed_d1e5;
/// The nftables table's name.
pub const TABLE: &str = "sy_director";

/// Which node each bucket goes to: bucket `b` to node `b mod n` when that node is live,
/// otherwise to the live nodes in turn. `None` when no node is live.
pub fn assign(live: &[bool]) -> Option<Vec<usize>> {
    let n = live.len();
    let up: Vec<usize> = (0..n).filter(|&i| live[i]).collect();
    if up.is_empty() {
        return None;
    }
    let mut spare = 0;
    Some(
        (0..BUCKETS)
            .map(|b| {
                let home = b % n;
                if live[home] {
                    home
                } else {
                    spare += 1;
                    up[(spare - 1) % up.len()]
                }
            })
            .collect(),
    )
}

/// The director of one lab: the VIP's port spread over `nodes`.
#[derive(Debug, Clone)]
pub struct Director {
    /// The director's interface (where clients' packets arrive and leave again).
    pub iface: String,
    /// The VIP.
    pub vip: Ipv4Addr,
    /// The service port.
    pub port: u16,
    /// The real servers' addresses.
    pub nodes: Vec<Ipv4Addr>,
}

impl Director {
    /// The nftables script that spreads over the nodes marked live.
    pub fn script(&self, live: &[bool]) -> Option<String> {
        let buckets = assign(live)?;
        let map: Vec<String> = buckets
            .iter()
            .enumerate()
            .map(|(b, &i)| format!("{b} : {}", self.nodes[i]))
            .collect();
        let (vip, port, iface) = (self.vip, self.port, &self.iface);
        Some(format!(
            "add table netdev {TABLE}\n\
             delete table netdev {TABLE}\n\
             table netdev {TABLE} {{\n\
             \tchain ingress {{\n\
             \t\ttype filter hook ingress device \"{iface}\" priority -500; policy accept;\n\
             \t\tip daddr {vip} tcp dport {port} fwd ip to jhash ip saddr . tcp sport mod {BUCKETS} seed {SEED:#x} map {{ {} }} device \"{iface}\"\n\
             \t}}\n\
             }}\n",
            map.join(", ")
        ))
    }

    /// Installs (or replaces, in one transaction) the director in `ns` with every node live.
    pub fn install(&self, ns: &NetNs) -> Result<()> {
        self.set_live(ns, &vec![true; self.nodes.len()])
    }

    /// Spreads over the nodes marked live only (a node taken out loses its buckets to the
    /// others; every other bucket keeps its node).
    pub fn set_live(&self, ns: &NetNs, live: &[bool]) -> Result<()> {
        let script = self.script(live).ok_or_else(|| {
            switchyard_handoff::HandoffError::Other("the director needs a live node".into())
        })?;
        run_nft_script(Some(ns), &script)
    }

    /// Removes the director's table from `ns`.
    pub fn remove(ns: &NetNs) {
        let _ = run_nft_script(
            Some(ns),
            &format!("add table netdev {TABLE}\ndelete table netdev {TABLE}\n"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_go_round_robin_and_a_node_out_moves_only_its_own() {
        let all = assign(&[true, true, true]).unwrap();
        assert_eq!(all.len(), BUCKETS);
        for (b, &n) in all.iter().enumerate() {
            assert_eq!(n, b % 3);
        }
        let without1 = assign(&[true, false, true]).unwrap();
        for (b, (&before, &after)) in all.iter().zip(&without1).enumerate() {
            if before == 1 {
                assert_ne!(after, 1, "bucket {b} still goes to the node taken out");
            } else {
                assert_eq!(after, before, "bucket {b} moved though its node is live");
            }
        }
        // The node taken out's buckets are shared evenly.
        let to0 = (0..BUCKETS)
            .filter(|&b| all[b] == 1 && without1[b] == 0)
            .count();
        let to2 = (0..BUCKETS)
            .filter(|&b| all[b] == 1 && without1[b] == 2)
            .count();
        assert!(to0.abs_diff(to2) <= 1, "{to0} vs {to2}");
        assert_eq!(assign(&[false, false]), None);
    }

    #[test]
    fn the_script_names_every_bucket_and_a_fixed_seed() {
        let d = Director {
            iface: "eth0".into(),
            vip: "10.213.0.100".parse().unwrap(),
            port: 80,
            nodes: vec![
                "10.213.0.11".parse().unwrap(),
                "10.213.0.12".parse().unwrap(),
            ],
        };
        let s = d.script(&[true, true]).unwrap();
        assert!(s.contains("ip daddr 10.213.0.100 tcp dport 80 fwd ip to jhash ip saddr . tcp sport mod 64 seed 0x5eedd1e5 map { 0 : 10.213.0.11, 1 : 10.213.0.12, 2 : 10.213.0.11"), "{s}");
        assert!(s.contains("63 : 10.213.0.12 }"), "{s}");
        assert!(s.starts_with("add table netdev sy_director\ndelete table netdev sy_director\n"));
        assert!(d.script(&[false, false]).is_none());
    }
}
