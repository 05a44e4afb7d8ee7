//! DNS round robin and virtual host names through dynamic updates (RFC 2136) of the site's
//! zone, each signed with TSIG (RFC 8945).
//!
//! An origin adds a rescue server's address to its own name's A records when the rescue
//! starts and removes it at the end (§4.2); a rescue server adds an A record for each virtual
//! host name it hands out. Updates are queued and sent in order by one task over TCP with the
//! hickory client; a failed update (refused, not authorized, no answer) is logged, counted in
//! [`DnsMetrics::failures`] and retried after a delay that doubles up to `retry_max_ms`, until it
//! succeeds or a later update of the same name and address replaces it.
//!
//! Every message the updater sends goes through a client built with the TSIG signer made from
//! the configured key: there is no way to build an updater without a key, so an update is never
//! sent unsigned. Answers are checked against the same key.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_client::client::{AsyncClient, ClientHandle, Signer};
use hickory_proto::iocompat::AsyncIoTokioAsStd;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::dnssec::rdata::tsig::TsigAlgorithm;
use hickory_proto::rr::dnssec::tsig::TSigner;
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record};
use hickory_proto::tcp::TcpClientStream;
use switchyard_rescue::registry::DnsConfig;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::metrics::DnsMetrics;
use crate::Error;

/// Add or remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Add the address to the name's records.
    Add,
    /// Remove the address from the name's records.
    Remove,
}

/// One update: an address added to or removed from a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Add or remove.
    pub op: Op,
    /// The fully qualified name (inside the zone).
    pub name: Name,
    /// The address: an A record for IPv4, AAAA for IPv6.
    pub ip: IpAddr,
    /// The record's TTL, seconds.
    pub ttl: u32,
}

/// What the updater has done.
#[derive(Debug, Clone, Default)]
pub struct DnsSnapshot {
    /// Updates the server accepted.
    pub applied: u64,
    /// Failed attempts.
    pub failures: u64,
    /// Updates waiting (including one being retried).
    pub pending: usize,
    /// The last failure.
    pub last_error: Option<String>,
}

/// The handle to the update task.
pub struct DnsUpdater {
    zone: Name,
    ttl: u32,
    vhost_ttl: u32,
    tx: mpsc::UnboundedSender<Update>,
    state: watch::Receiver<DnsSnapshot>,
    task: JoinHandle<()>,
}

/// The TSIG signer for the configured key.
pub fn signer(cfg: &DnsConfig) -> Result<TSigner, Error> {
    cfg.validate()?;
    let algorithm = match cfg.tsig_algorithm.as_str() {
        "hmac-sha256" => TsigAlgorithm::HmacSha256,
        "hmac-sha384" => TsigAlgorithm::HmacSha384,
        "hmac-sha512" => TsigAlgorithm::HmacSha512,
        other => return Err(Error::Tsig(format!("unsupported algorithm {other}"))),
    };
    let key_name = fqdn(&cfg.tsig_key_name)?;
    // 300 s of clock difference allowed, the fudge RFC 8945 recommends.
    TSigner::new(cfg.tsig_key()?, algorithm, key_name, 300).map_err(|e| Error::Tsig(e.to_string()))
}

/// `name` as an absolute DNS name.
pub fn fqdn(name: &str) -> Result<Name, Error> {
    let mut n = Name::from_ascii(name).map_err(|e| Error::Name(name.into(), e.to_string()))?;
    n.set_fqdn(true);
    Ok(n)
}

impl DnsUpdater {
    /// Starts the update task for the zone and key in `cfg`.
    pub fn start(cfg: &DnsConfig, metrics: DnsMetrics) -> Result<DnsUpdater, Error> {
        let tsigner = signer(cfg)?;
        let zone = fqdn(&cfg.zone)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (state_tx, state) = watch::channel(DnsSnapshot::default());
        let worker = Worker {
            server: cfg.server,
            zone: zone.clone(),
            signer: Arc::new(Signer::from(tsigner)),
            timeout: Duration::from_millis(cfg.timeout_ms),
            backoff: Backoff::new(
                Duration::from_millis(250),
                Duration::from_millis(cfg.retry_max_ms),
            ),
            metrics,
            state: state_tx,
        };
        let task = tokio::spawn(worker.run(rx));
        Ok(DnsUpdater {
            zone,
            ttl: cfg.ttl_secs,
            vhost_ttl: cfg.vhost_ttl_secs,
            tx,
            state,
            task,
        })
    }

    /// Queues an update of `name`, which must be inside the zone.
    pub fn update(&self, op: Op, name: &str, ip: IpAddr, ttl: u32) -> Result<(), Error> {
        let name = fqdn(name)?;
        if !self.zone.zone_of(&name) {
            return Err(Error::NotInZone {
                name: name.to_string(),
                zone: self.zone.to_string(),
            });
        }
        self.tx
            .send(Update { op, name, ip, ttl })
            .map_err(|_| Error::Stopped)
    }

    /// Adds `ip` to the round robin of `name` (an origin's own name), with the round-robin TTL.
    pub fn add_a(&self, name: &str, ip: IpAddr) -> Result<(), Error> {
        self.update(Op::Add, name, ip, self.ttl)
    }

    /// Removes `ip` from the round robin of `name`.
    pub fn remove_a(&self, name: &str, ip: IpAddr) -> Result<(), Error> {
        self.update(Op::Remove, name, ip, self.ttl)
    }

    /// Adds the A record of a virtual host name, with the virtual-host TTL.
    pub fn add_vhost_a(&self, name: &str, ip: IpAddr) -> Result<(), Error> {
        self.update(Op::Add, name, ip, self.vhost_ttl)
    }

    /// Removes the A record of a virtual host name.
    pub fn remove_vhost_a(&self, name: &str, ip: IpAddr) -> Result<(), Error> {
        self.update(Op::Remove, name, ip, self.vhost_ttl)
    }

    /// What the updater has done.
    pub fn snapshot(&self) -> DnsSnapshot {
        self.state.borrow().clone()
    }

    /// Changes of the snapshot, to wait on.
    pub fn subscribe(&self) -> watch::Receiver<DnsSnapshot> {
        self.state.clone()
    }
}

impl Drop for DnsUpdater {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Worker {
    server: SocketAddr,
    zone: Name,
    signer: Arc<Signer>,
    timeout: Duration,
    backoff: Backoff,
    metrics: DnsMetrics,
    state: watch::Sender<DnsSnapshot>,
}

/// Queues `u`, dropping a queued update of the same name and address that it replaces.
fn enqueue(queue: &mut VecDeque<Update>, u: Update, metrics: &DnsMetrics) {
    let before = queue.len();
    queue.retain(|q| !(q.name == u.name && q.ip == u.ip));
    metrics.superseded.inc_by((before - queue.len()) as u64);
    queue.push_back(u);
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Update>) {
        let mut queue: VecDeque<Update> = VecDeque::new();
        let mut client: Option<AsyncClient> = None;
        loop {
            if queue.is_empty() {
                match rx.recv().await {
                    Some(u) => enqueue(&mut queue, u, &self.metrics),
                    None => return,
                }
            }
            while let Ok(u) = rx.try_recv() {
                enqueue(&mut queue, u, &self.metrics);
            }
            self.state.send_modify(|s| s.pending = queue.len());
            let u = queue.front().expect("not empty").clone();
            let res = match timeout(self.timeout, self.send(&mut client, &u)).await {
                Ok(r) => r,
                Err(_) => Err("no answer in time".to_string()),
            };
            match res {
                Ok(()) => {
                    queue.pop_front();
                    if queue.is_empty() {
                        // Updates come in bursts minutes apart; the server closes idle TCP
                        // connections sooner (30 s by default in BIND), so each burst opens
                        // its own.
                        client = None;
                    }
                    self.backoff.succeeded();
                    self.metrics.updates.inc();
                    info!(op = ?u.op, name = %u.name, ip = %u.ip, ttl = u.ttl, "dns: update accepted");
                    self.state.send_modify(|s| {
                        s.applied += 1;
                        s.pending = queue.len();
                    });
                }
                Err(e) => {
                    client = None;
                    self.metrics.failures.inc();
                    let delay = self.backoff.failed();
                    warn!(op = ?u.op, name = %u.name, ip = %u.ip, error = e, attempt = self.backoff.failures(), retry_in = ?delay, "dns: update failed; will retry");
                    self.state.send_modify(|s| {
                        s.failures += 1;
                        s.last_error = Some(e);
                    });
                    // Wait, taking in new updates (one may replace the failing one).
                    let until = Instant::now() + delay;
                    loop {
                        tokio::select! {
                            _ = sleep_until(until) => break,
                            got = rx.recv() => match got {
                                Some(n) => enqueue(&mut queue, n, &self.metrics),
                                None => return,
                            },
                        }
                    }
                    if queue.front() != Some(&u) {
                        debug!(name = %u.name, ip = %u.ip, "dns: failed update replaced by a later one");
                    }
                }
            }
        }
    }

    /// Sends one update over a signed TCP client (connecting first when needed).
    async fn send(&self, client: &mut Option<AsyncClient>, u: &Update) -> Result<(), String> {
        if client.is_none() {
            let (stream, handle) =
                TcpClientStream::<AsyncIoTokioAsStd<TcpStream>>::new(self.server);
            let (c, bg) =
                AsyncClient::with_timeout(stream, handle, self.timeout, Some(self.signer.clone()))
                    .await
                    .map_err(|e| format!("cannot connect to {}: {e}", self.server))?;
            tokio::spawn(bg);
            *client = Some(c);
        }
        let c = client.as_mut().expect("just connected");
        let rdata = match u.ip {
            IpAddr::V4(v4) => RData::A(A(v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
        };
        let record = Record::from_rdata(u.name.clone(), u.ttl, rdata);
        let resp = match u.op {
            Op::Add => c.append(record, self.zone.clone(), false).await,
            Op::Remove => c.delete_by_rdata(record, self.zone.clone()).await,
        }
        .map_err(|e| e.to_string())?;
        match resp.response_code() {
            ResponseCode::NoError => Ok(()),
            code => Err(format!("server answered {code}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upd(op: Op, name: &str, ip: &str) -> Update {
        Update {
            op,
            name: fqdn(name).unwrap(),
            ip: ip.parse().unwrap(),
            ttl: 30,
        }
    }

    #[test]
    fn a_later_update_replaces_a_queued_one_of_the_same_name_and_address() {
        let m = DnsMetrics::default();
        let mut q = VecDeque::new();
        enqueue(&mut q, upd(Op::Add, "www.o.test", "10.0.0.1"), &m);
        enqueue(&mut q, upd(Op::Add, "www.o.test", "10.0.0.2"), &m);
        enqueue(&mut q, upd(Op::Remove, "www.o.test", "10.0.0.1"), &m);
        let got: Vec<_> = q.iter().map(|u| (u.op, u.ip.to_string())).collect();
        assert_eq!(
            got,
            [
                (Op::Add, "10.0.0.2".into()),
                (Op::Remove, "10.0.0.1".into())
            ]
        );
        assert_eq!(m.superseded.get(), 1);
    }

    #[tokio::test]
    async fn names_outside_the_zone_are_refused_before_sending() {
        let cfg = DnsConfig::new(
            "127.0.0.1:1".parse().unwrap(),
            "origin.test",
            "k",
            "c2VjcmV0LWtleS1vZi0zMi1ieXRlcy1sb25nLi4uLi4=",
        );
        let d = DnsUpdater::start(&cfg, DnsMetrics::default()).unwrap();
        assert!(matches!(
            d.add_a("www.other.test", "10.0.0.1".parse().unwrap()),
            Err(Error::NotInZone { .. })
        ));
        assert!(matches!(
            d.add_a("bad..name", "10.0.0.1".parse().unwrap()),
            Err(Error::Name(..))
        ));
        d.add_a("www.origin.test", "10.0.0.1".parse().unwrap())
            .unwrap();
        let mut bad = cfg.clone();
        bad.tsig_secret.0 = "short".into();
        assert!(matches!(
            DnsUpdater::start(&bad, DnsMetrics::default()),
            Err(Error::Config(_))
        ));
    }
}
