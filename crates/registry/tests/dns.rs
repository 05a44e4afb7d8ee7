//! The DNS updater against a real BIND 9: signed updates add and remove round-robin and
//! virtual host records; a wrong key or a zone that refuses updates is logged, retried with
//! backoff and counted; an update waits for a server that is not up yet; and what goes on
//! the wire is always signed.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::{a_records, wait_until, Named, KEY, KEY_NAME};
use hickory_proto::op::{Message, OpCode};
use hickory_proto::rr::{RData, RecordType};
use switchyard_registry::{DnsMetrics, DnsUpdater, RescueHook};
use switchyard_rescue::registry::DnsConfig;
use switchyard_rescue::{Action, EndReason, Grant, PeerId, Sos};
use tokio::io::AsyncReadExt;

const LIMIT: Duration = Duration::from_secs(20);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn cfg(named: &Named, zone: &str) -> DnsConfig {
    let mut c = DnsConfig::new(named.addr, zone, KEY_NAME, KEY);
    c.retry_max_ms = 1000;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_updates_add_and_remove_round_robin_and_vhost_records() {
    let named = common::named();
    let metrics = DnsMetrics::default();
    let dns = DnsUpdater::start(&cfg(&named, "origin.test"), metrics.clone()).unwrap();
    let mut rx = dns.subscribe();
    // Through the hook, as a driver would: an origin gets two rescue servers, a rescue server
    // hands out a virtual host name.
    let mut hook = RescueHook::new(None, Some(dns), "www.origin.test", ip("10.0.0.1"));
    for (peer, addr) in [(1, "10.0.0.2"), (2, "10.0.0.3")] {
        hook.on_action(&Action::RescuerAdded {
            peer: PeerId(peer),
            grant: Grant {
                alias: format!("www-vh{peer}.rescue.test"),
                ip: ip(addr),
                port: 80,
                d_redi_kbps: 100,
            },
        });
    }
    hook.on_action(&Action::OriginAdded {
        peer: PeerId(3),
        origin: Sos {
            fqdn: "www.other.test".into(),
            ip: ip("10.9.9.9"),
            port: 80,
            max_idle_secs: 300,
            want_kbps: None,
        },
        alias: "www-vh7.origin.test".into(),
        d_alloc_kbps: 100.0,
    });
    wait_until(&mut rx, LIMIT, "three updates", |s| s.applied == 3).await;
    assert_eq!(
        a_records(named.addr, "www.origin.test.").await,
        [(ip("10.0.0.1"), 30), (ip("10.0.0.2"), 30), (ip("10.0.0.3"), 30)],
        "an RRset has one TTL (RFC 2136 §3.4.2.2): the round robin's 30 s, the zone's own record included"
    );
    assert_eq!(
        a_records(named.addr, "www-vh7.origin.test.").await,
        [(ip("10.0.0.1"), 300)]
    );
    // Release of the first rescue server: its address leaves the round robin.
    hook.on_action(&Action::RescuerEnded {
        peer: PeerId(1),
        reason: EndReason::PartialRelease,
    });
    wait_until(&mut rx, LIMIT, "the removal", |s| s.applied == 4).await;
    let left: Vec<IpAddr> = a_records(named.addr, "www.origin.test.")
        .await
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(left, [ip("10.0.0.1"), ip("10.0.0.3")]);
    // The virtual host name stays after the relationship ends, and goes when purged.
    hook.on_action(&Action::OriginEnded {
        peer: PeerId(3),
        fqdn: "www.other.test".into(),
        alias: "www-vh7.origin.test".into(),
        reason: EndReason::IdleShutdown,
    });
    hook.vhost_expired("www-vh7.origin.test");
    wait_until(&mut rx, LIMIT, "the vhost removal", |s| s.applied == 5).await;
    assert!(a_records(named.addr, "www-vh7.origin.test.")
        .await
        .is_empty());
    let s = hook.dns().unwrap().snapshot();
    assert_eq!(
        (s.failures, s.pending),
        (0, 0),
        "{:?} {}",
        s.last_error,
        named.log.dump()
    );
    assert_eq!(metrics.updates.get(), 5);
    assert_eq!(metrics.failures.get(), 0);
}

/// Waits for `n` failed attempts; the update must not have been applied.
async fn expect_failures(dns: &DnsUpdater, n: u64) -> switchyard_registry::DnsSnapshot {
    let mut rx = dns.subscribe();
    let t0 = tokio::time::Instant::now();
    let s = wait_until(&mut rx, LIMIT, "failed attempts", |s| s.failures >= n).await;
    // 250 + 500 ms of backoff at least between the first and the third attempt.
    if n >= 3 {
        assert!(
            t0.elapsed() >= Duration::from_millis(700),
            "{:?}",
            t0.elapsed()
        );
    }
    assert_eq!((s.applied, s.pending), (0, 1));
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_is_refused_retried_with_backoff_and_counted() {
    let named = common::named();
    let mut c = cfg(&named, "origin.test");
    // Another 32-byte key under the same name.
    c.tsig_secret.0 = "b3RoZXIta2V5LW9mLTMyLWJ5dGVzLWxvbmcuLi4uLi4=".into();
    let metrics = DnsMetrics::default();
    let dns = DnsUpdater::start(&c, metrics.clone()).unwrap();
    dns.add_a("www.origin.test", ip("10.0.0.66")).unwrap();
    let s = expect_failures(&dns, 3).await;
    assert!(metrics.failures.get() >= 3);
    assert!(s.last_error.is_some());
    let from = 0;
    named
        .log
        .wait_for(from, "request has invalid signature", LIMIT);
    assert_eq!(
        a_records(named.addr, "www.origin.test.").await,
        [(ip("10.0.0.1"), 300)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_that_refuses_updates_is_retried_and_counted() {
    let named = common::named();
    let metrics = DnsMetrics::default();
    let dns = DnsUpdater::start(&cfg(&named, "refuse.test"), metrics.clone()).unwrap();
    dns.add_a("www.refuse.test", ip("10.0.0.66")).unwrap();
    let s = expect_failures(&dns, 3).await;
    assert!(
        s.last_error.as_deref().unwrap().contains("Refused"),
        "{:?}",
        s.last_error
    );
    assert_eq!(metrics.updates.get(), 0);
    // A later removal of the same address replaces the stuck addition.
    dns.remove_a("www.refuse.test", ip("10.0.0.66")).unwrap();
    let mut rx = dns.subscribe();
    wait_until(&mut rx, LIMIT, "the replaced update", |_| {
        metrics.superseded.get() == 1
    })
    .await;
    assert_eq!(
        a_records(named.addr, "www.refuse.test.").await,
        [(ip("10.0.0.1"), 300)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_waits_for_a_server_that_is_not_up_yet() {
    let port = common::free_ports(1)[0];
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut c = DnsConfig::new(addr, "origin.test", KEY_NAME, KEY);
    c.retry_max_ms = 500;
    let dns = DnsUpdater::start(&c, DnsMetrics::default()).unwrap();
    dns.add_a("www.origin.test", ip("10.0.0.5")).unwrap();
    expect_failures(&dns, 1).await;
    let named = common::named_on(port);
    let mut rx = dns.subscribe();
    wait_until(&mut rx, LIMIT, "the update after the server came up", |s| {
        s.applied == 1
    })
    .await;
    let got: Vec<IpAddr> = a_records(named.addr, "www.origin.test.")
        .await
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(got, [ip("10.0.0.1"), ip("10.0.0.5")]);
}

/// A stand-in server that reads what the updater sends: every update carries a TSIG record
/// (the last additional record) with the configured key name and algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_update_on_the_wire_is_tsig_signed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut c = DnsConfig::new(addr, "origin.test", KEY_NAME, KEY);
    c.retry_max_ms = 250;
    let dns = DnsUpdater::start(&c, DnsMetrics::default()).unwrap();
    dns.add_a("www.origin.test", ip("10.0.0.5")).unwrap();
    dns.remove_a("www.origin.test", ip("10.0.0.6")).unwrap();
    // Two attempts (the first update fails, as nothing answers, and is sent again).
    for _ in 0..2 {
        let (mut s, _) = tokio::time::timeout(LIMIT, listener.accept())
            .await
            .unwrap()
            .unwrap();
        let mut len = [0u8; 2];
        s.read_exact(&mut len).await.unwrap();
        let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut buf).await.unwrap();
        let m = Message::from_vec(&buf).unwrap();
        assert_eq!(m.op_code(), OpCode::Update);
        let sig = m.signature();
        assert_eq!(sig.len(), 1, "one TSIG record: {m:?}");
        assert_eq!(sig[0].record_type(), RecordType::TSIG);
        assert_eq!(sig[0].name().to_string(), format!("{KEY_NAME}."));
        let Some(RData::DNSSEC(d)) = sig[0].data() else {
            panic!("{:?}", sig[0])
        };
        let text = format!("{d:?}");
        assert!(text.contains("HmacSha256"), "{text}");
        drop(s);
    }
}
