//! Load reports to the switch: the node side of the distributed load monitor (seed 004 §2.2).
//!
//! With `report_to` set, the node sends its load to the switch in one UDP datagram whenever a
//! connection is handed in or closed — on events rather than on a timer. Events that come faster
//! than [`MIN_GAP`] are coalesced into one report carrying the latest figures, so a burst of
//! connections costs a bounded number of datagrams.
//!
//! The datagram's format is [`switchyard_runtime::report`].

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use switchyard_policy::LoadReport;
use switchyard_runtime::report::Datagram;
use tokio::net::UdpSocket;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::metrics::NodeMetrics;
use crate::store::Store;

/// Shortest time between two reports.
pub const MIN_GAP: Duration = Duration::from_millis(2);

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
            let clamp = |v: u64| v.min(u64::from(u32::MAX)) as u32;
            let report = Datagram {
                listen: Some(listen),
                seq,
                load: LoadReport {
                    active_connections: clamp(metrics.connections_active.load(Relaxed)),
                    disk_queue: clamp(store.disk_queue()),
                    cache_hits: cache.hits,
                    cache_misses: cache.misses,
                    bytes_out: metrics.bytes_out(),
                },
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
