//! Load reports to the switch: the node side of the distributed load monitor (seed 004 §2.2).
//!
//! With `report_to` set, the node sends its load to the switch in one UDP datagram whenever a
//! connection is handed in or closed — on events rather than on a timer. Events that come faster
//! than [`MIN_GAP`] are coalesced into one report carrying the latest figures, so a burst of
//! connections costs a bounded number of datagrams.
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

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::metrics::NodeMetrics;
use crate::store::Store;

/// Shortest time between two reports.
pub const MIN_GAP: Duration = Duration::from_millis(2);

/// The magic word that starts a report.
const MAGIC: &str = "SYLR1";

/// One load report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The address the node serves on.
    pub listen: Option<SocketAddr>,
    /// Reports sent before this one.
    pub seq: u64,
    /// Client connections open.
    pub connections: u64,
    /// Emulated disk reads queued or in service.
    pub disk_queue: u64,
    /// Object cache hits since start.
    pub cache_hits: u64,
    /// Object cache misses since start.
    pub cache_misses: u64,
    /// Response bytes sent since start.
    pub bytes_out: u64,
}

impl Report {
    /// The datagram text.
    pub fn encode(&self) -> String {
        let listen = self
            .listen
            .map_or_else(|| "-".to_owned(), |a| a.to_string());
        format!(
            "{MAGIC} listen={listen} seq={} conns={} disk={} hits={} misses={} bytes={}",
            self.seq,
            self.connections,
            self.disk_queue,
            self.cache_hits,
            self.cache_misses,
            self.bytes_out
        )
    }

    /// Parse a datagram; `None` when it is not a report. Unknown fields are ignored so that
    /// newer nodes can add some.
    pub fn decode(data: &[u8]) -> Option<Report> {
        let text = std::str::from_utf8(data).ok()?;
        let mut words = text.split_ascii_whitespace();
        if words.next()? != MAGIC {
            return None;
        }
        let mut r = Report::default();
        for w in words {
            let (k, v) = w.split_once('=')?;
            match k {
                "listen" => r.listen = v.parse().ok(),
                "seq" => r.seq = v.parse().ok()?,
                "conns" => r.connections = v.parse().ok()?,
                "disk" => r.disk_queue = v.parse().ok()?,
                "hits" => r.cache_hits = v.parse().ok()?,
                "misses" => r.cache_misses = v.parse().ok()?,
                "bytes" => r.bytes_out = v.parse().ok()?,
                _ => {}
            }
        }
        Some(r)
    }
}

/// The handle connections use to signal events.
#[derive(Debug, Default)]
pub struct Reporter {
    notify: Notify,
}

impl Reporter {
    /// A connection was handed in or closed: a report goes out soon.
    pub fn event(&self) {
        self.notify.notify_one();
    }
}

/// Start sending reports about this node (serving on `listen`) to `target`.
pub fn spawn(
    target: SocketAddr,
    listen: SocketAddr,
    metrics: Arc<NodeMetrics>,
    store: Arc<Store>,
    mut stop: watch::Receiver<bool>,
) -> (Arc<Reporter>, JoinHandle<()>) {
    let reporter = Arc::new(Reporter::default());
    let r = reporter.clone();
    let task = tokio::spawn(async move {
        let bind: SocketAddr = if target.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let sock = match UdpSocket::bind(bind).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the load report socket");
                return;
            }
        };
        let mut seq = 0u64;
        r.event();
        loop {
            tokio::select! {
                _ = r.notify.notified() => {}
                _ = stop.changed() => return,
            }
            let cache = store.cache_stats();
            let report = Report {
                listen: Some(listen),
                seq,
                connections: metrics.connections_active.load(Relaxed),
                disk_queue: store.disk_queue(),
                cache_hits: cache.hits,
                cache_misses: cache.misses,
                bytes_out: metrics.bytes_out.load(Relaxed),
            };
            seq += 1;
            if let Err(e) = sock.send_to(report.encode().as_bytes(), target).await {
                tracing::debug!(error = %e, %target, "load report not sent");
            }
            tokio::time::sleep(MIN_GAP).await;
        }
    });
    (reporter, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let r = Report {
            listen: Some("127.0.0.1:8081".parse().unwrap()),
            seq: 4,
            connections: 17,
            disk_queue: 3,
            cache_hits: 9,
            cache_misses: 1,
            bytes_out: 12345,
        };
        assert_eq!(Report::decode(r.encode().as_bytes()), Some(r));
        assert_eq!(Report::decode(b"HELLO listen=1"), None);
        assert_eq!(Report::decode(b"SYLR1 conns=x"), None);
        assert_eq!(Report::decode(&[0xff, 0xfe]), None);
        let newer = Report::decode(b"SYLR1 conns=2 future=1").unwrap();
        assert_eq!(newer.connections, 2);
    }
}
