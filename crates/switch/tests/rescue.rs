//! The switch as a site's face in flash-crowd rescue, over real sockets: a cluster (one node
//! behind a switch with `[rescue.peering]`) gets a crowd above its D_out, asks a rescue server
//! (a node with `[rescue.peering]`) for help over mutual TLS, redirects part of the crowd to
//! it, and releases it when the crowd ends. And the third delivery mechanism: `redirect`.
//!
//! The cluster's link is not shaped: only D_out is set (200 kB/s), as in the paper's
//! experiments. Waits follow the drivers' change notifications, bounded by a deadline.
//!
//! The dashboards follow the rescue: the switch's update stream (`/events`) and the rescue
//! server's (a node outside a cluster with a driver serves a page about itself) carry each
//! site's state and relationships.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestNode, TestSwitch};
use switchyard_admin::dashboard::{Meta, RescueBrief, RescueSite, Update};
use switchyard_admin::status::RescueStatus;
use switchyard_rescue::{PeerConfig, PeeringConfig, RescueConfig};
use switchyard_rescue_driver::testcerts::TestCa;
use switchyard_rescue_driver::Driver;
use switchyard_switch::config::Mechanism;
use switchyard_testkit::crowd::{fill, one_client, FILES, FILE_BYTES};

/// A viewer of a dashboard's `/events`: reads one update at a time, and keeps the site's
/// rescue part of the last meta event.
struct Viewer {
    lines: std::io::BufReader<std::net::TcpStream>,
    site: Option<RescueSite>,
}

impl Viewer {
    fn open(admin: SocketAddr) -> Viewer {
        use std::io::{BufRead, Write};
        let mut s = std::net::TcpStream::connect(admin).unwrap();
        // Updates come every second: a read waiting longer than this means none came.
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /events HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n")
            .unwrap();
        let mut r = std::io::BufReader::new(s);
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        assert!(l.starts_with("HTTP/1.1 200"), "{l}");
        Viewer {
            lines: r,
            site: None,
        }
    }

    /// The next `update` event (the meta and the kept history's updates come first).
    fn update(&mut self) -> Update {
        use std::io::BufRead;
        let (mut name, mut data) = (String::new(), String::new());
        loop {
            let mut l = String::new();
            let n = self.lines.read_line(&mut l).expect("an event within 5 s");
            assert!(n > 0, "the stream ended");
            let l = l.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if name == "update" && !data.is_empty() {
                    assert!(data.len() < 4096, "{} bytes", data.len());
                    return serde_json::from_str(&data).unwrap();
                }
                if name == "meta" && !data.is_empty() {
                    self.site = serde_json::from_str::<Meta>(&data).unwrap().site;
                }
                data.clear();
                continue;
            }
            if let Some(v) = l.strip_prefix("event: ") {
                v.clone_into(&mut name);
            } else if let Some(v) = l.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
    }

    /// Updates until one's rescue part satisfies `f`, for at most `limit` updates.
    fn until(&mut self, what: &str, limit: usize, f: impl Fn(&RescueBrief) -> bool) -> RescueBrief {
        let mut last = None;
        for _ in 0..limit {
            match self.update().r {
                Some(r) if f(&r) => return r,
                r => last = r,
            }
        }
        panic!("{what}: not in {limit} updates; the last rescue part: {last:?}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn rescue_table(
    name: &str,
    web_port: u16,
    peer_port: u16,
    ca: &TestCa,
    dir: &Path,
    peer: PeerConfig,
) -> RescueConfig {
    let (cert, key, ca_path) = ca.write_identity(name, dir).unwrap();
    let mut r = RescueConfig::new(name, [127, 0, 0, 1].into(), web_port, 1000.0);
    r.control_interval_ms = 200;
    r.n_low = 5;
    r.retry_refused_intervals = 100_000;
    r.peering = Some(PeeringConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], peer_port)),
        cert,
        key,
        ca: ca_path,
        peers: vec![peer],
    });
    r
}

/// Polls `f` on `driver`'s status until it holds, for at most 30 s.
fn wait_status(
    rt: &tokio::runtime::Runtime,
    driver: &Driver,
    what: &str,
    mut f: impl FnMut(&RescueStatus) -> bool,
) -> RescueStatus {
    let until = Instant::now() + Duration::from_secs(30);
    let mut rx = driver.subscribe();
    loop {
        let s = driver.status();
        if f(&s) {
            return s;
        }
        assert!(Instant::now() < until, "{what}: {s:#?}");
        let _ =
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(1), rx.changed()).await });
    }
}

#[test]
fn a_cluster_behind_a_switch_is_rescued_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("peers");
    let (sw_web, sw_peer, r_web, r_peer) = (free_port(), free_port(), free_port(), free_port());
    let backend = TestNode::start(fill, |_| {});
    let rescue_cfg = rescue_table(
        "rescue.test",
        r_web,
        r_peer,
        &ca,
        dir.path(),
        PeerConfig {
            name: "site.test".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], sw_peer)),
            d_free_kbps: None,
            domain: None,
        },
    );
    // A large rescue server (D_out 4000 kB/s) granting 100 kB/s: the redirected clients'
    // embedded objects stay far below its overload limits.
    let mut rescue_cfg = rescue_cfg;
    rescue_cfg.d_out_kbps = Some(4000.0);
    rescue_cfg.max_grant_kbps = Some(100.0);
    let rescue = TestNode::start_on(
        SocketAddr::from(([127, 0, 0, 1], r_web)),
        |r| common::write(r, "own.html", b"own"),
        |c| {
            c.rescue = Some(rescue_cfg);
            c.admin = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        },
    );
    let mut site_cfg = rescue_table(
        "site.test",
        sw_web,
        sw_peer,
        &ca,
        dir.path(),
        PeerConfig {
            name: "rescue.test".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], r_peer)),
            d_free_kbps: Some(2000.0),
            domain: None,
        },
    );
    site_cfg.d_out_kbps = Some(200.0);
    let sw = TestSwitch::start(&[backend.addr], |c| {
        c.listen = SocketAddr::from(([127, 0, 0, 1], sw_web));
        c.rescue = Some(site_cfg);
    });
    let site = sw.sw().rescue_driver().expect("the switch runs the driver");
    let rescuer = rescue.node.as_ref().unwrap().rescue_driver().unwrap();
    // Both dashboards show each site's rescue state before the crowd: normal.
    let mut site_view = Viewer::open(sw.sw().admin_addr().unwrap());
    let r = site_view.until("the site's rescue part", 3, |_| true);
    assert_eq!(r.st, "normal");
    let site_meta = site_view.site.clone().expect("the site in the meta");
    assert_eq!(site_meta.name, "site.test");
    assert_eq!(site_meta.max.0, 200.0, "D_out in kB/s");
    assert_eq!(site_meta.peers, ["rescue.test"]);
    let mut rescue_view = Viewer::open(rescue.node.as_ref().unwrap().admin_addr().unwrap());
    let r = rescue_view.until("the rescue server's rescue part", 3, |_| true);
    assert_eq!(r.st, "normal");
    let rescue_meta = rescue_view
        .site
        .clone()
        .expect("the rescue server in the meta");
    assert_eq!(
        (rescue_meta.name.as_str(), rescue_meta.peers.as_slice()),
        ("rescue.test", &["site.test".to_owned()][..])
    );

    // The crowd: 60 requests/s for 6 kB files, about 370 kB/s against D_out 200 kB/s.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let errs = errors.clone();
    let (sw_addr, r_addr) = (sw.addr, rescue.addr);
    let crowd = rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / 60));
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0usize.. {
            tick.tick().await;
            tasks.spawn(one_client(sw_addr, "site.test".into(), r_addr, n));
            while let Some(done) = tasks.try_join_next() {
                if let Ok(Err(e)) = done {
                    errs.lock().unwrap().push(e);
                }
            }
        }
    });

    let s = wait_status(&rt, &site, "SOS from the switch", |s| {
        s.state == "sos" && !s.rescuers.is_empty()
    });
    assert_eq!(s.rescuers[0].alias, "rescue-vh1.test");
    let s = wait_status(&rt, &site, "redirects by the switch", |s| {
        s.totals.requests_redirected >= 20
    });
    assert!(s.totals.requests_served > 0, "{s:?}");
    let rs = wait_status(&rt, &rescuer, "rescued requests", |s| {
        s.totals.requests_rescued >= 60
    });
    assert_eq!(rs.origins[0].fqdn, "site.test");
    // The switch's update stream shows the site rescued by the rescue server's virtual host,
    // and the redirects; the rescue server's shows it rescuing the site.
    let r = site_view.until("the site in SOS on its dashboard", 60, |r| {
        r.st == "sos" && !r.rs.is_empty() && r.rr.0 > 0.0
    });
    assert_eq!(
        (
            site_meta.peers[r.rs[0].0 as usize].as_str(),
            r.rs[0].1.as_str()
        ),
        ("rescue.test", "rescue-vh1.test")
    );
    assert!(r.rs[0].2 .0 > 0.0, "D_redi granted: {r:?}");
    let r = rescue_view.until("the rescue server rescuing on its dashboard", 60, |r| {
        r.st == "rescue" && !r.os.is_empty()
    });
    assert_eq!(
        (
            rescue_meta.peers[r.os[0].0 as usize].as_str(),
            r.os[0].1.as_str()
        ),
        ("site.test", rs.origins[0].alias.as_str())
    );
    // The rescue server fetched through the switch (its requests are never redirected) from
    // the node behind it.
    let proxy = rescue.node.as_ref().unwrap().rescue().unwrap().stats();
    assert!(proxy.fetches >= 1 && proxy.fetch_errors == 0, "{proxy:?}");
    let status = sw.sw().status();
    assert_eq!(status.rescue.as_ref().unwrap().state, "sos");
    assert!(sw
        .metrics()
        .contains("switchyard_rescue_state{state=\"sos\"} 1"));

    crowd.abort();
    let errors = errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "{errors:?}");
    let s = wait_status(&rt, &site, "release", |s| {
        s.state == "normal" && s.rescuers.is_empty()
    });
    assert_eq!(s.totals.connections_lost, 0);
    wait_status(&rt, &rescuer, "the rescue server back to normal", |s| {
        s.state == "normal" && s.origins.is_empty()
    });
    site_view.until("the site back to normal on its dashboard", 60, |r| {
        r.st == "normal" && r.rs.is_empty()
    });
    // The switch never rescues others: it advertises no free capacity.
    assert_eq!(s.d_free, 0.0);
}

#[test]
fn the_redirect_mechanism_sends_clients_to_the_node() {
    let backend = TestNode::start(fill, |_| {});
    let sw = TestSwitch::start(&[backend.addr], |c| c.mechanism = Mechanism::Redirect);
    let mut c = sw.client();
    c.send(b"GET /f3.html?x=1 HTTP/1.1\r\nHost: site.test\r\n\r\n");
    let r = c.response(false);
    assert_eq!(r.status, 302);
    let location = format!("http://{}/f3.html?x=1", backend.addr);
    assert_eq!(r.header("location"), Some(location.as_str()));
    // The connection stays open for the next request; a POST keeps its method with 307.
    c.send(b"POST /form HTTP/1.1\r\nHost: site.test\r\nContent-Length: 2\r\n\r\nab");
    let r = c.response(false);
    assert_eq!(r.status, 307);
    // The node serves what the client fetches from it.
    let mut direct = common::Client::connect(backend.addr);
    direct.send(b"GET /f3.html?x=1 HTTP/1.1\r\nHost: site.test\r\n\r\n");
    let r = direct.response(false);
    assert_eq!((r.status, r.body.len()), (200, FILE_BYTES));
    assert_eq!(sw.sw().policy_stats().decisions, 2);
    assert_eq!(sw.sw().status().mechanism, Mechanism::Redirect);
}

#[test]
fn a_redirect_names_the_node_s_public_name_when_it_has_one() {
    let (a, b) = (TestNode::start(fill, |_| {}), TestNode::start(fill, |_| {}));
    let sw = TestSwitch::start(&[a.addr, b.addr], |c| {
        c.mechanism = Mechanism::Redirect;
        c.policy.name = switchyard_policy::PolicyKind::Rr;
        c.nodes[0].public = Some("www1.site.test:8080".into());
    });
    let mut c = sw.client();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        c.send(b"GET /f1.html HTTP/1.1\r\nHost: site.test\r\n\r\n");
        let r = c.response(false);
        assert_eq!(r.status, 302);
        seen.insert(r.header("location").unwrap().to_string());
    }
    // Round robin over both: the first by its public name, the second by its address.
    let expect: std::collections::BTreeSet<String> = [
        "http://www1.site.test:8080/f1.html".to_string(),
        format!("http://{}/f1.html", b.addr),
    ]
    .into();
    assert_eq!(seen, expect);
}

#[test]
fn in_one_way_mode_the_site_is_metered_from_the_nodes_load_reports() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("peers");
    let report: SocketAddr = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let sock = dir.path().join("node.sock");
    let s = sock.clone();
    let backend = TestNode::start(fill, move |c| {
        c.handoff_unix = Some(s);
        c.report_to = Some(report);
    });
    let site_cfg = rescue_table(
        "site.test",
        free_port(),
        free_port(),
        &ca,
        dir.path(),
        PeerConfig {
            name: "rescue.test".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            d_free_kbps: None,
            domain: None,
        },
    );
    let sw = TestSwitch::start(&[backend.addr], |c| {
        c.nodes = vec![switchyard_switch::NodeEntry {
            control: Some(switchyard_switch::config::ControlAddr::Unix(sock)),
            ..switchyard_switch::NodeEntry::new(backend.addr)
        }];
        c.mechanism = Mechanism::Handoff;
        c.report_listen = Some(report);
        c.rescue = Some(site_cfg);
    });
    assert!(sw
        .rt
        .block_on(sw.sw().wait_for_controls(Duration::from_secs(5))));
    let site = sw.sw().rescue_driver().unwrap();
    let fd_before = sw.sw().handoff_metrics().handoffs_fd.get();
    for i in 0..20 {
        let mut c = sw.client();
        let r = c.get(&format!("/f{}.html", i % FILES));
        assert_eq!((r.status, r.body.len()), (200, FILE_BYTES));
    }
    assert!(sw.sw().handoff_metrics().handoffs_fd.get() > fd_before);
    // The responses left from the node, not through the switch: the site's meter has them
    // from the node's reports (the first report is the baseline).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    wait_status(&rt, &site, "bytes from load reports", |s| {
        s.totals.bytes_served >= 10 * FILE_BYTES as u64
    });
}
