//! Steering: after a handoff the client still sends to the VIP, which the
//! switch owns; the switch must pass those packets to the node that now owns
//! the connection, below its own TCP stack (seed 004 §4.2, the forwarder).
//!
//! [`Steering`] is the switch's table of handed-off 4-tuples. Two backends:
//!
//! * [`ebpf::EbpfSteering`] (preferred): a tc clsact ingress program
//!   (`bpf/steer.bpf.c`) looks the 4-tuple up in a hash map, rewrites the
//!   Ethernet addresses and redirects the frame to the node. A SYN for a
//!   4-tuple that still has an entry deletes it in the packet path, so a
//!   client reusing its source port reaches the switch again. A map update
//!   from user space is one `bpf(2)` call.
//! * [`nft::NftSteering`] (fallback): an nftables netdev ingress map and
//!   `fwd ip to … device …`. A map element cannot be deleted from the packet
//!   path, so SYNs are recorded in a dynamic set and packets of a 4-tuple
//!   seen with a SYN go to the switch until the switch hands that new
//!   connection off again.
//!
//! The order matters (`shared/notes/tcp-handoff.md`): install the entry
//! *before* dumping the socket, and have [`NoSocketDrop`] on every host that
//! takes connections, so packets that arrive before the restore completes are
//! dropped (the client retransmits) instead of answered with a reset.

pub mod ebpf;
pub mod nft;
pub mod table;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use crate::error::{HandoffError, Result};
use crate::netns::NetNs;

/// A handed-off connection as the switch sees it: client → VIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// The client's address and port.
    pub client: SocketAddrV4,
    /// The VIP and the service port.
    pub vip: SocketAddrV4,
}

impl Flow {
    /// Builds a flow from a connection's peer and local addresses (IPv4 only:
    /// the steering backends handle IPv4).
    pub fn new(client: SocketAddr, vip: SocketAddr) -> Result<Flow> {
        match (client, vip) {
            (SocketAddr::V4(c), SocketAddr::V4(v)) => Ok(Flow { client: c, vip: v }),
            _ => Err(HandoffError::Other(
                "steering supports IPv4 connections only".into(),
            )),
        }
    }
}

/// Where a flow's packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// The node's address on the switch's network.
    pub ip: Ipv4Addr,
    /// The node's MAC address (the eBPF backend rewrites to it).
    pub mac: [u8; 6],
}

/// The switch's table of handed-off flows.
pub trait Steering: Send + Sync {
    /// Sends `flow`'s packets to `to`; replaces an existing entry in one step
    /// (multiple handoff repoints a flow).
    fn insert(&self, flow: &Flow, to: &Target) -> Result<()>;
    /// Removes `flow`'s entry; false when there was none.
    fn remove(&self, flow: &Flow) -> Result<bool>;
    /// Removes the entries of `flows`; returns how many there were. A backend that can
    /// remove several entries in one call overrides this (one call per entry by default).
    fn remove_many(&self, flows: &[Flow]) -> Result<usize> {
        let mut n = 0;
        for f in flows {
            n += usize::from(self.remove(f)?);
        }
        Ok(n)
    }
    /// Entries live now.
    fn live(&self) -> usize;
    /// Backend name (`ebpf` or `nftables`).
    fn kind(&self) -> &'static str;
}

/// The node-side rule: TCP packets to the VIP that find no connected socket
/// are dropped instead of answered with a reset (packets that arrive between
/// the switch's dump and the restore here). SYNs still pass.
///
/// Implemented with nftables' `socket` expression in an `inet` prerouting
/// chain: a packet whose lookup finds a socket bound to a specific address
/// (a restored connection, bound to VIP:port) is accepted; one that finds
/// only a wildcard listener, a TIME_WAIT socket or nothing is dropped. So a
/// node must not run a listener bound to the VIP itself.
#[derive(Debug)]
pub struct NoSocketDrop {
    table: String,
}

impl NoSocketDrop {
    /// Installs the rule in `ns` (or the current namespace) for TCP to `vip`
    /// (and `port`, or every port).
    pub fn install(
        ns: Option<&NetNs>,
        tag: &str,
        vip: Ipv4Addr,
        port: Option<u16>,
    ) -> Result<Self> {
        Self::install_rules(
            ns,
            tag,
            vip,
            port,
            &["socket wildcard 0 accept", "counter drop"],
        )
    }

    /// The rule for a host that also accepts clients at the VIP itself (a cooperative node
    /// behind a layer-4 director): only packets whose socket lookup finds nothing better than
    /// a wildcard listener are dropped. [`NoSocketDrop::install`]'s rule would also drop the
    /// handshake's last ACK of every client the host accepts itself: that packet finds a
    /// request socket, which the `socket wildcard` expression cannot look into (it is not a
    /// full socket: the expression breaks and the rule's final `drop` applies). Here such
    /// packets, those finding an established socket bound to the VIP, TIME_WAIT sockets and
    /// packets finding no socket at all (no listener on the port) pass on to TCP; so the
    /// host's listener must be bound to the wildcard address, not to the VIP.
    pub fn install_beside_listener(
        ns: Option<&NetNs>,
        tag: &str,
        vip: Ipv4Addr,
        port: Option<u16>,
    ) -> Result<Self> {
        Self::install_rules(ns, tag, vip, port, &["socket wildcard 1 counter drop"])
    }

    /// The table `sy_nosock_<tag>` (replacing one a killed process left behind): a
    /// handshake's SYN to `vip` (and `port`) passes, then each of `rules` applies to the TCP
    /// packets to it.
    fn install_rules(
        ns: Option<&NetNs>,
        tag: &str,
        vip: Ipv4Addr,
        port: Option<u16>,
        rules: &[&str],
    ) -> Result<Self> {
        let table = format!("sy_nosock_{tag}");
        let port_match = port.map(|p| format!("tcp dport {p} ")).unwrap_or_default();
        let matches = format!("ip daddr {vip} meta l4proto tcp {port_match}");
        let mut script = format!(
            "table inet {table} {{\n\
             \tchain pre {{\n\
             \t\ttype filter hook prerouting priority -150; policy accept;\n\
             \t\t{matches}tcp flags & (syn | ack) == syn accept\n"
        );
        for rule in rules {
            script.push_str(&format!("\t\t{matches}{rule}\n"));
        }
        script.push_str("\t}\n}\n");
        let _ = nft::run_nft_script(ns, &format!("delete table inet {table}\n"));
        nft::run_nft_script(ns, &script)?;
        Ok(NoSocketDrop { table })
    }

    /// Removes the rule.
    pub fn remove(self, ns: Option<&NetNs>) -> Result<()> {
        nft::run_nft_script(ns, &format!("delete table inet {}\n", self.table))
    }

    /// The nftables table's name.
    pub fn table(&self) -> &str {
        &self.table
    }
}

/// MAC address and index of an interface in the current namespace.
pub fn interface_info(ifname: &str) -> Result<([u8; 6], u32)> {
    let cname = std::ffi::CString::new(ifname)
        .map_err(|_| HandoffError::Other("interface name with NUL".into()))?;
    // SAFETY: valid C string.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(HandoffError::last_os(format!("interface {ifname}")));
    }
    // SAFETY: a throw-away datagram socket for the ioctl.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(HandoffError::last_os("socket"));
    }
    // SAFETY: zeroed ifreq with the name copied in; SIOCGIFHWADDR fills it.
    let mac = unsafe {
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(ifname.as_bytes()) {
            *d = *s as libc::c_char;
        }
        let r = libc::ioctl(s, libc::SIOCGIFHWADDR as _, &mut ifr);
        let err = std::io::Error::last_os_error();
        libc::close(s);
        if r != 0 {
            return Err(HandoffError::io(format!("SIOCGIFHWADDR {ifname}"), err));
        }
        let sa = ifr.ifr_ifru.ifru_hwaddr.sa_data;
        [sa[0], sa[1], sa[2], sa[3], sa[4], sa[5]].map(|b| b as u8)
    };
    Ok((mac, index))
}

/// The MAC address the current namespace's neighbour table has for `ip`
/// (`/proc/net/arp`), if it is resolved.
pub fn neighbour_mac(ip: Ipv4Addr) -> Option<[u8; 6]> {
    let text = std::fs::read_to_string("/proc/self/net/arp").ok()?;
    parse_arp(&text, ip)
}

fn parse_arp(text: &str, ip: Ipv4Addr) -> Option<[u8; 6]> {
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 || f[0].parse::<Ipv4Addr>().ok() != Some(ip) {
            continue;
        }
        // flags 0x2 = complete
        if u32::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap_or(0) & 2 == 0 {
            return None;
        }
        return parse_mac(f[3]);
    }
    None
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut it = s.split(':');
    for b in out.iter_mut() {
        *b = u8::from_str_radix(it.next()?, 16).ok()?;
    }
    if it.next().is_some() {
        return None;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arp_table_parsing() {
        let t = "IP address       HW type     Flags       HW address            Mask     Device\n\
                 10.0.0.11        0x1         0x2         02:00:00:00:00:0b     *        eth0\n\
                 10.0.0.12        0x1         0x0         00:00:00:00:00:00     *        eth0\n";
        assert_eq!(
            parse_arp(t, "10.0.0.11".parse().unwrap()),
            Some([2, 0, 0, 0, 0, 0x0b])
        );
        assert_eq!(parse_arp(t, "10.0.0.12".parse().unwrap()), None);
        assert_eq!(parse_arp(t, "10.0.0.13".parse().unwrap()), None);
        assert_eq!(parse_mac("1:2:3:4:5"), None);
        assert_eq!(parse_mac("01:02:03:04:05:06:07"), None);
    }

    #[test]
    fn flows_are_ipv4_only() {
        assert!(Flow::new("1.2.3.4:5".parse().unwrap(), "5.6.7.8:80".parse().unwrap()).is_ok());
        assert!(Flow::new("[::1]:5".parse().unwrap(), "5.6.7.8:80".parse().unwrap()).is_err());
    }

    #[test]
    fn loopback_interface_info() {
        let (mac, idx) = interface_info("lo").unwrap();
        assert_eq!(mac, [0; 6]);
        assert!(idx > 0);
    }
}
