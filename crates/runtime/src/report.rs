//! The load-report datagram: how a node's [`LoadReport`] travels to the
//! switch over UDP (the distributed load monitor of seed 004 §2.2).
//!
//! A report is one line of text:
//!
//! ```text
//! SYLR1 listen=127.0.0.1:8081 seq=42 conns=17 disk=3 hits=9120 misses=311 bytes=48211950
//! ```
//!
//! `listen` is the address the node serves on (the switch matches it against its node list, or
//! the datagram's source IP with that port when the node listens on a wildcard address), `seq`
//! counts reports, `conns` is the number of open client connections, `disk` the emulated disk's
//! queue, `hits`/`misses` the object cache's counters and `bytes` the response bytes sent so far.
//! Counts beyond `u32::MAX` in `conns` and `disk` are read as `u32::MAX`; unknown fields are
//! ignored so that newer nodes can add some.

use std::net::SocketAddr;

use switchyard_policy::LoadReport;

/// The magic word that starts a report.
const MAGIC: &str = "SYLR1";

/// One datagram: a node's load and where it comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Datagram {
    /// The address the node serves on.
    pub listen: Option<SocketAddr>,
    /// Reports sent before this one.
    pub seq: u64,
    /// The load.
    pub load: LoadReport,
}

impl Datagram {
    /// The datagram text.
    pub fn encode(&self) -> String {
        let listen = self
            .listen
            .map_or_else(|| "-".to_owned(), |a| a.to_string());
        let l = &self.load;
        format!(
            "{MAGIC} listen={listen} seq={} conns={} disk={} hits={} misses={} bytes={}",
            self.seq, l.active_connections, l.disk_queue, l.cache_hits, l.cache_misses, l.bytes_out
        )
    }

    /// Parse a datagram; `None` when it is not a report.
    pub fn decode(data: &[u8]) -> Option<Datagram> {
        let text = std::str::from_utf8(data).ok()?;
        let mut words = text.split_ascii_whitespace();
        if words.next()? != MAGIC {
            return None;
        }
        let clamp = |v: u64| v.min(u64::from(u32::MAX)) as u32;
        let mut d = Datagram::default();
        for w in words {
            let (k, v) = w.split_once('=')?;
            match k {
                "listen" => d.listen = v.parse().ok(),
                "seq" => d.seq = v.parse().ok()?,
                "conns" => d.load.active_connections = clamp(v.parse().ok()?),
                "disk" => d.load.disk_queue = clamp(v.parse().ok()?),
                "hits" => d.load.cache_hits = v.parse().ok()?,
                "misses" => d.load.cache_misses = v.parse().ok()?,
                "bytes" => d.load.bytes_out = v.parse().ok()?,
                _ => {}
            }
        }
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let d = Datagram {
            listen: Some("127.0.0.1:8081".parse().unwrap()),
            seq: 4,
            load: LoadReport {
                active_connections: 17,
                disk_queue: 3,
                cache_hits: 9,
                cache_misses: 1,
                bytes_out: 12345,
            },
        };
        assert_eq!(Datagram::decode(d.encode().as_bytes()), Some(d));
        assert_eq!(Datagram::decode(b"HELLO listen=1"), None);
        assert_eq!(Datagram::decode(b"SYLR1 conns=x"), None);
        assert_eq!(Datagram::decode(&[0xff, 0xfe]), None);
        let newer = Datagram::decode(b"SYLR1 conns=2 future=1").unwrap();
        assert_eq!(newer.load.active_connections, 2);
    }

    #[test]
    fn large_counts_are_clamped() {
        let d = Datagram::decode(b"SYLR1 conns=99999999999 disk=4294967296").unwrap();
        assert_eq!(d.load.active_connections, u32::MAX);
        assert_eq!(d.load.disk_queue, u32::MAX);
        assert_eq!(Datagram::decode(d.encode().as_bytes()), Some(d));
    }
}
