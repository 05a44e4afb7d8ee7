//! The registry against a real three-member etcd cluster on loopback: registration, ranking
//! and immediate re-registration; the loss of a member that is the leader causes no false
//! expiry; a crashed site (its lease keeper stopped, or its process killed) leaves within TTL
//! plus one search interval; with etcd gone the handle keeps its candidates and recovers when
//! etcd is back.

mod common;

use std::time::Duration;

use common::{wait_until, Etcd};
use switchyard_registry::{Registry, RegistryMetrics, Site};
use switchyard_rescue::registry::{Registration, RegistryConfig};
use switchyard_rescue::{PeerId, RescueConfig};
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(30);

fn reg_cfg(etcd: &Etcd, ttl_secs: u64, search_ms: u64) -> RegistryConfig {
    let mut c = RegistryConfig::new(etcd.endpoints());
    c.ttl_secs = ttl_secs;
    c.search_interval_ms = search_ms;
    c.request_timeout_ms = 500;
    c.port_dots = Some(9000);
    c
}

/// A site named `name` with outbound bandwidth `b_kbps` (D_resc = 0.4 × B).
fn site(reg: &RegistryConfig, name: &str, b_kbps: f64) -> Site {
    let cfg = RescueConfig::new(name, "127.0.0.1".parse().unwrap(), 8080, b_kbps);
    Site::new(&cfg, reg, cfg.d_resc())
}

/// A site `name` of bandwidth `b_kbps`, registered, with default metrics.
async fn registered(cfg: &RegistryConfig, name: &str, b_kbps: f64) -> Registry {
    Registry::start(
        cfg,
        Some(site(cfg, name, b_kbps)),
        RegistryMetrics::default(),
    )
    .await
    .unwrap()
}

/// A registry client that only searches, default metrics.
async fn searching(cfg: &RegistryConfig) -> Registry {
    Registry::start(cfg, None, RegistryMetrics::default())
        .await
        .unwrap()
}

fn names(c: &[Registration]) -> Vec<&str> {
    c.iter().map(|r| r.name()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sites_register_and_searches_rank_them_by_free_capacity() {
    let etcd = Etcd::start(3);
    let cfg = reg_cfg(&etcd, 5, 200);
    let mut sites = Vec::new();
    for (name, b) in [
        ("a.site.test", 1250.0),
        ("b.site.test", 750.0),
        ("c.site.test", 2500.0),
    ] {
        sites.push(
            Registry::start(&cfg, Some(site(&cfg, name, b)), RegistryMetrics::default())
                .await
                .unwrap(),
        );
    }
    let metrics = RegistryMetrics::default();
    let searcher = Registry::start(&cfg, None, metrics.clone()).await.unwrap();
    let mut rx = searcher.subscribe();
    let s = wait_until(&mut rx, LIMIT, "three registrations", |s| {
        s.candidates.len() == 3
    })
    .await;
    assert_eq!(
        names(&s.candidates),
        ["c.site.test", "a.site.test", "b.site.test"]
    );
    assert_eq!(s.candidates[0].d_free_kbps, 1000.0);
    assert_eq!(s.candidates[0].url, "http://c.site.test:8080/");
    assert_eq!(s.candidates[0].port_dots, 9000);
    // A site does not list itself.
    let mut arx = sites[0].subscribe();
    let a = wait_until(&mut arx, LIMIT, "a's search", |s| s.candidates.len() == 2).await;
    assert_eq!(names(&a.candidates), ["c.site.test", "b.site.test"]);
    // The driver's peer table turns them into the core's candidates.
    let cands = searcher.core_candidates(|r| match r.name() {
        "c.site.test" => Some(PeerId(3)),
        "a.site.test" => Some(PeerId(1)),
        _ => None,
    });
    assert_eq!(
        cands.iter().map(|c| c.peer).collect::<Vec<_>>(),
        [PeerId(3), PeerId(1)]
    );

    // c enters SOS: d_free 0 is registered at once and c leaves the candidates; b's small
    // change (less than 10% of its D_resc of 300 kB/s) waits for the periodic registration.
    sites[2].set_d_free(0.0);
    sites[1].set_d_free(290.0);
    let s = wait_until(&mut rx, LIMIT, "c's SOS", |s| s.candidates.len() == 2).await;
    assert_eq!(names(&s.candidates), ["a.site.test", "b.site.test"]);
    assert_eq!(s.candidates[1].d_free_kbps, 300.0);
    // c rescues again with 600 of 1000 kB/s free.
    sites[2].set_d_free(600.0);
    let s = wait_until(&mut rx, LIMIT, "c back", |s| s.candidates.len() == 3).await;
    assert_eq!(
        names(&s.candidates),
        ["c.site.test", "a.site.test", "b.site.test"]
    );
    assert_eq!(s.candidates[0].d_free_kbps, 600.0);
    assert_eq!(metrics.search_failures.get(), 0);
    // A clean shutdown withdraws the registration at once.
    let a = sites.remove(0);
    a.shutdown().await;
    let s = wait_until(&mut rx, Duration::from_secs(3), "a withdrawn", |s| {
        s.candidates.len() == 2
    })
    .await;
    assert_eq!(names(&s.candidates), ["c.site.test", "b.site.test"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_leader_member_causes_no_false_expiry() {
    let mut etcd = Etcd::start(3);
    let ttl = 3;
    let cfg = reg_cfg(&etcd, ttl, 200);
    let a = registered(&cfg, "a.site.test", 1250.0).await;
    let searcher = searching(&cfg).await;
    let mut rx = searcher.subscribe();
    wait_until(&mut rx, LIMIT, "a registered", |s| s.candidates.len() == 1).await;
    let mut client = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .unwrap();
    let key = cfg.key("a.site.test");
    let before = client.get(key.as_str(), None).await.unwrap();
    let created = before.kvs()[0].create_revision();
    let lease = before.kvs()[0].lease();

    let leader = common::leader(&etcd, 0)
        .await
        .expect("the cluster has a leader");
    etcd.kill(leader);
    let killed = Instant::now();
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    // Three TTLs of searches after the kill: a is in every one that is answered.
    let mut seen_after = 0u64;
    let start_searches = rx.borrow().searches;
    let end = killed + Duration::from_secs(3 * ttl);
    loop {
        let s = wait_until(&mut rx, LIMIT, "the next search", |_| true).await;
        rx.mark_unchanged();
        if s.searches > start_searches {
            seen_after = s.searches - start_searches;
        }
        assert_eq!(
            names(&s.candidates),
            ["a.site.test"],
            "false expiry after {:?}",
            killed.elapsed()
        );
        if Instant::now() >= end {
            break;
        }
        tokio::time::timeout(LIMIT, rx.changed())
            .await
            .unwrap()
            .unwrap();
    }
    assert!(
        seen_after >= 5,
        "searches answered after the kill: {seen_after}"
    );
    // A new leader among the two left.
    let new_leader = common::leader(&etcd, others[0])
        .await
        .expect("a new leader");
    assert_ne!(new_leader, leader);
    // The registration was never deleted: same key creation, same lease, still alive.
    let mut client = etcd_client::Client::connect(
        others
            .iter()
            .map(|i| etcd.members[*i].client_url.clone())
            .collect::<Vec<_>>(),
        None,
    )
    .await
    .unwrap();
    let after = client.get(key.as_str(), None).await.unwrap();
    assert_eq!(after.kvs()[0].create_revision(), created);
    assert_eq!(after.kvs()[0].lease(), lease);
    let sa = a.snapshot();
    assert_eq!(sa.leases_granted, 1, "{sa:?}");
    assert!(sa.keepalives >= 3, "{sa:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_site_disappears_within_ttl_and_one_search_interval() {
    let etcd = Etcd::start(3);
    let ttl = Duration::from_secs(3);
    let interval = Duration::from_millis(250);
    let cfg = reg_cfg(&etcd, ttl.as_secs(), interval.as_millis() as u64);
    let a = registered(&cfg, "a.site.test", 1250.0).await;
    let b = registered(&cfg, "b.site.test", 1250.0).await;
    let searcher = searching(&cfg).await;
    let mut rx = searcher.subscribe();
    wait_until(&mut rx, LIMIT, "both registered", |s| {
        s.candidates.len() == 2
    })
    .await;
    // Let a renew at least once, then crash it: its tasks stop, its lease is not revoked.
    let mut arx = a.subscribe();
    wait_until(&mut arx, LIMIT, "a renewal", |s| s.keepalives >= 1).await;
    drop(a);
    let crashed = Instant::now();
    let s = wait_until(&mut rx, LIMIT, "a gone", |s| s.candidates.len() == 1).await;
    let took = crashed.elapsed();
    assert_eq!(names(&s.candidates), ["b.site.test"]);
    // The bound: TTL + one search interval, plus etcd's own expiry check, which runs every
    // 500 ms, and one request time.
    let bound = switchyard_rescue::registry::disappearance_bound(ttl, interval)
        + Duration::from_millis(500 + 500);
    assert!(took <= bound, "gone after {took:?}, bound {bound:?}");
    // And not before its lease could have run out: the last renewal was at most TTL/3 ago.
    assert!(took >= ttl - ttl / 3 - interval, "gone after only {took:?}");
    // b, which kept renewing, is still there.
    assert_eq!(b.snapshot().leases_granted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_unreachable_the_last_candidates_are_kept_and_it_recovers() {
    let mut etcd = Etcd::start(3);
    let cfg = reg_cfg(&etcd, 3, 200);
    let a = registered(&cfg, "a.site.test", 1250.0).await;
    let metrics = RegistryMetrics::default();
    let searcher = Registry::start(&cfg, None, metrics.clone()).await.unwrap();
    let mut rx = searcher.subscribe();
    wait_until(&mut rx, LIMIT, "a registered", |s| s.candidates.len() == 1).await;
    for i in 0..3 {
        etcd.kill(i);
    }
    let s = wait_until(&mut rx, LIMIT, "failed searches", |s| {
        s.search_failures >= 3
    })
    .await;
    assert_eq!(names(&s.candidates), ["a.site.test"]);
    assert_eq!(names(&searcher.candidates()), ["a.site.test"]);
    assert!(metrics.search_failures.get() >= 3);
    let mut arx = a.subscribe();
    wait_until(&mut arx, LIMIT, "failed renewals", |s| {
        s.renew_failures >= 2
    })
    .await;
    // Back: searches are answered again and a is registered (under a new lease if its old
    // one ran out meanwhile).
    let kept = arx.borrow().keepalives;
    etcd.restart(&[0, 1, 2]);
    let searches = rx.borrow().searches;
    let s = wait_until(&mut rx, LIMIT, "searches answered again", |s| {
        s.searches > searches + 2 && s.candidates.len() == 1
    })
    .await;
    assert_eq!(names(&s.candidates), ["a.site.test"]);
    wait_until(&mut arx, LIMIT, "a renewing again", |s| s.keepalives > kept).await;
}

/// The environment variable that makes [`site_process`] run: the etcd endpoints.
const CHILD_ENV: &str = "SWITCHYARD_TEST_SITE_PROCESS_ETCD";

/// A site in a process of its own, started by
/// `a_killed_site_process_disappears_within_ttl_and_one_search_interval`: registers, says so
/// on stderr and waits to be killed.
#[test]
#[ignore = "a helper process, started (with its etcd endpoints) by a_killed_site_process_disappears_within_ttl_and_one_search_interval"]
fn site_process() {
    let endpoints = std::env::var(CHILD_ENV).expect("started by the killed-process test");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cfg = RegistryConfig::new(endpoints.split(',').map(String::from).collect());
        cfg.ttl_secs = 3;
        cfg.request_timeout_ms = 500;
        cfg.port_dots = Some(9000);
        let site = site(&cfg, "p.site.test", 1250.0);
        let r = Registry::start(&cfg, Some(site), RegistryMetrics::default())
            .await
            .unwrap();
        let mut rx = r.subscribe();
        wait_until(&mut rx, LIMIT, "registered and renewed", |s| {
            s.keepalives >= 1
        })
        .await;
        eprintln!("SITE-REGISTERED");
        std::future::pending::<()>().await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_site_process_disappears_within_ttl_and_one_search_interval() {
    let etcd = Etcd::start(3);
    let ttl = Duration::from_secs(3);
    let interval = Duration::from_millis(250);
    let cfg = reg_cfg(&etcd, ttl.as_secs(), interval.as_millis() as u64);
    let searcher = searching(&cfg).await;
    let mut rx = searcher.subscribe();
    let log = common::Log::default();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["site_process", "--exact", "--ignored", "--nocapture"])
        .env(CHILD_ENV, etcd.endpoints().join(","));
    let mut child = common::spawn(&mut cmd, &log);
    log.wait_for(0, "SITE-REGISTERED", LIMIT);
    wait_until(&mut rx, LIMIT, "the site process listed", |s| {
        s.candidates.len() == 1
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    wait_until(&mut rx, LIMIT, "the site process gone", |s| {
        s.candidates.is_empty()
    })
    .await;
    let took = killed.elapsed();
    // As for a crashed lease keeper: TTL + one search interval, plus etcd's 500 ms expiry
    // check and one request time.
    let bound = switchyard_rescue::registry::disappearance_bound(ttl, interval)
        + Duration::from_millis(500 + 500);
    assert!(took <= bound, "gone after {took:?}, bound {bound:?}");
    assert!(took >= ttl - ttl / 3 - interval, "gone after only {took:?}");
}
