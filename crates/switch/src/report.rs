//! The switch side of the distributed load monitor: node load reports arrive as UDP datagrams
//! (format in [`switchyard_runtime::report`]) and go to the policy's `load_report` hook.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use switchyard_policy::{LoadReport, NodeId};
use switchyard_runtime::report::Datagram;
use tokio::net::UdpSocket;
use tokio::sync::watch;

use crate::generation::Generation;
use crate::state::Shared;

/// Receive reports until the switch stops.
pub(crate) async fn receive(shared: Arc<Shared>, sock: UdpSocket, mut stop: watch::Receiver<bool>) {
    let mut buf = [0u8; 1024];
    loop {
        let (n, from) = tokio::select! {
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "load report receive failed");
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        match Datagram::decode(&buf[..n]) {
            Some(r) => apply(&shared, &r, from),
            None => {
                shared.metrics.reports_invalid.fetch_add(1, Relaxed);
                tracing::debug!(%from, "datagram is not a load report");
            }
        }
    }
}

/// Hand one report to the policy of the generation in force.
pub(crate) fn apply(shared: &Shared, r: &Datagram, from: SocketAddr) {
    let g = shared.current();
    let idx = r.listen.and_then(|l| {
        g.nodes.iter().position(|b| b.addr == l).or_else(|| {
            // A node on a wildcard address: its source IP with the port it serves on.
            g.nodes
                .iter()
                .position(|b| b.addr.ip() == from.ip() && b.addr.port() == l.port())
        })
    });
    let Some(i) = idx else {
        shared.metrics.reports_invalid.fetch_add(1, Relaxed);
        tracing::debug!(%from, listen = ?r.listen, "load report from an unknown node");
        return;
    };
    take(shared, &g, i, r.load);
}

/// Give node `i`'s load report to the policy.
fn take(shared: &Shared, g: &Generation, i: usize, report: LoadReport) {
    let before = g.nodes[i].last_report.lock().replace(report);
    if let Some(r) = &shared.rescue {
        r.reported(before.map(|b| b.bytes_out), report.bytes_out);
    }
    g.policy
        .lock()
        .load_report(NodeId(i as u32), &report, shared.now());
    shared.metrics.reports.fetch_add(1, Relaxed);
}
