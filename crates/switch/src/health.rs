//! Active health checks: every `health_interval_ms`, `GET health_path` on a new connection to the
//! node; any status below 500 within `health_timeout_ms` is a success. `health_fall` consecutive
//! failures (failed relayed requests count too) take the node out, `health_rise` consecutive
//! successes bring it back. A check that cannot even open its connection for lack of local
//! descriptors or memory says nothing about the node and counts neither way. A node the
//! operator holds out (drained or marked down) is not checked until they release it.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::backend::Backend;
use crate::state::Shared;

/// Check `b` until it leaves the configuration or the switch stops.
pub(crate) async fn run(shared: Arc<Shared>, b: Arc<Backend>) {
    let mut stop = shared.stop.clone();
    loop {
        let cfg = shared.current().cfg.clone();
        let interval = match cfg.health_interval_ms {
            // No active checks: look again later in case a reload turns them on.
            0 => Duration::from_secs(1),
            ms => Duration::from_millis(ms),
        };
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => return,
        }
        if b.retired.load(Relaxed) || *stop.borrow() {
            return;
        }
        if b.hold().is_some() {
            // Held out by the operator: only the operator brings it back.
            continue;
        }
        if cfg.health_interval_ms == 0 {
            if !b.is_up() && b.hold().is_none() {
                shared.mark_up(&b);
            }
            continue;
        }
        let health = check(
            b.addr,
            &cfg.health_path,
            Duration::from_millis(cfg.health_timeout_ms),
        )
        .await;
        shared.metrics.health_checks.fetch_add(1, Relaxed);
        if health == Health::Local {
            shared.metrics.local_errors.fetch_add(1, Relaxed);
            tracing::debug!(node = %b.addr, "health check skipped: no local descriptors");
            continue;
        }
        if health == Health::Up {
            b.fails.store(0, Relaxed);
            if !b.is_up() {
                let rises = b.rises.fetch_add(1, Relaxed) + 1;
                // (Held meanwhile: the check started before the operator's action.)
                if rises >= cfg.health_rise && b.hold().is_none() {
                    shared.mark_up(&b);
                }
            }
        } else {
            shared.metrics.health_failures.fetch_add(1, Relaxed);
            b.rises.store(0, Relaxed);
            let fails = b.fails.fetch_add(1, Relaxed) + 1;
            tracing::debug!(node = %b.addr, fails, "health check failed");
            if fails >= cfg.health_fall {
                shared.mark_down(&b, "health check");
            }
        }
    }
}

/// What one health check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    /// The node answered with a status below 500 in time.
    Up,
    /// It did not.
    Down,
    /// The check could not open its connection for lack of local resources (descriptors,
    /// memory): nothing is known about the node.
    Local,
}

/// One health check of the node at `addr`: `GET path` on a new connection.
pub(crate) async fn check(addr: SocketAddr, path: &str, limit: Duration) -> Health {
    let socket = match if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    } {
        Ok(s) => s,
        Err(e) if switchyard_runtime::accept::is_resource_exhaustion(&e) => return Health::Local,
        Err(_) => return Health::Down,
    };
    let probe = async {
        let mut s = socket.connect(addr).await?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: switchyard-health\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::with_capacity(512);
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut headers);
            match r.parse(&buf) {
                Ok(httparse::Status::Complete(_)) => return Ok(r.code.unwrap_or(599)),
                Ok(httparse::Status::Partial) if buf.len() < 16 * 1024 => {}
                _ => return Ok(599),
            }
            if s.read_buf(&mut buf).await? == 0 {
                return Ok::<u16, std::io::Error>(599);
            }
        }
    };
    match tokio::time::timeout(limit, probe).await {
        Ok(Ok(code)) if code < 500 => Health::Up,
        Ok(Err(e)) if switchyard_runtime::accept::is_resource_exhaustion(&e) => Health::Local,
        _ => Health::Down,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn server(answer: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut b = [0u8; 1024];
                let _ = s.read(&mut b).await;
                let _ = s.write_all(answer).await;
            }
        });
        a
    }

    #[tokio::test]
    async fn statuses_below_500_are_healthy() {
        let t = Duration::from_secs(2);
        let a = server(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(check(a, "/", t).await, Health::Up);
        let a = server(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(check(a, "/", t).await, Health::Down);
        let a = server(b"garbage\r\n\r\n").await;
        assert_eq!(check(a, "/", t).await, Health::Down);
        // Nobody listening.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        assert_eq!(check(a, "/", t).await, Health::Down);
        // Accepts but never answers: the timeout decides.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        assert_eq!(
            check(a, "/", Duration::from_millis(100)).await,
            Health::Down
        );
        drop(l);
    }
}
