//! Two nodes rescuing each other over real sockets: an origin site and a rescue server, each
//! with `[rescue.peering]` (mutual TLS from certificates made at test time). A crowd on the
//! origin — more than its configured D_out, sent by a paced client from its own loopback
//! address — makes it send SOS, redirect part of the crowd to the rescue server's virtual
//! host, follow the rescue server's RATE adjustments, and release it when the crowd ends.
//!
//! The origin's outbound link is not shaped: like the paper's experiments, only D_out is set
//! (200 kB/s), and the control loop acts on the measured rate against it. Waits are status
//! polls with a deadline.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::TestNode;
use switchyard_admin::status::RescueStatus;
use switchyard_node::RescueConfig;
use switchyard_rescue::{PeerConfig, PeeringConfig};
use switchyard_rescue_driver::testcerts::TestCa;
use switchyard_testkit::crowd::{fill, get, one_client, FILES, FILE_BYTES};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Site {
    node: TestNode,
    web: SocketAddr,
}

#[allow(clippy::too_many_arguments)]
fn site(
    name: &str,
    web_port: u16,
    peer_port: u16,
    ca: &TestCa,
    dir: &Path,
    peers: Vec<PeerConfig>,
    tweak: impl FnOnce(&mut RescueConfig),
) -> Site {
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
        peers,
    });
    tweak(&mut r);
    let node = TestNode::start(fill, |c| {
        c.listen = SocketAddr::from(([127, 0, 0, 1], web_port));
        c.rescue = Some(r);
    });
    let web = node.addr;
    Site { node, web }
}

/// `/dotslash-status?auto` of a node's admin listener.
fn auto(node: &TestNode) -> String {
    let mut c = common::Client::connect(node.admin());
    c.send(b"GET /dotslash-status?auto HTTP/1.1\r\nHost: t\r\n\r\n");
    String::from_utf8(c.response(false).body).unwrap()
}

fn value(auto: &str, key: &str) -> f64 {
    RescueStatus::auto_value(auto, key).unwrap_or_else(|| panic!("{key} missing in {auto}"))
}

fn status(node: &TestNode) -> RescueStatus {
    node.node
        .as_ref()
        .unwrap()
        .rescue_driver()
        .unwrap()
        .status()
}

/// Polls `f` on the node's status until it holds, for at most 30 s.
fn wait_status(
    node: &TestNode,
    what: &str,
    mut f: impl FnMut(&RescueStatus) -> bool,
) -> RescueStatus {
    let until = Instant::now() + Duration::from_secs(30);
    let rx = node
        .node
        .as_ref()
        .unwrap()
        .rescue_driver()
        .unwrap()
        .subscribe();
    let mut rx = rx;
    loop {
        let s = status(node);
        if f(&s) {
            return s;
        }
        assert!(Instant::now() < until, "{what}: {s:#?}");
        // Wait for the driver's next change (each control interval is one).
        let _ = node
            .rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(1), rx.changed()).await });
    }
}

/// One client of the crowd: the page `n`, and if redirected the page and two embedded objects
/// from the rescue server.
#[test]
fn a_crowd_on_an_origin_is_rescued_redirected_rate_limited_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("peers");
    let (ow, op, rw, rp) = (free_port(), free_port(), free_port(), free_port());
    let rescue = site(
        "rescue.test",
        rw,
        rp,
        &ca,
        dir.path(),
        vec![PeerConfig {
            name: "origin.test".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], op)),
            d_free_kbps: None,
            domain: None,
        }],
        |r| {
            r.d_out_kbps = Some(4000.0);
            // D_alloc 100 kB/s: D_init = 90 kB/s of redirected files.
            r.max_grant_kbps = Some(100.0);
        },
    );
    let origin = site(
        "origin.test",
        ow,
        op,
        &ca,
        dir.path(),
        vec![PeerConfig {
            name: "rescue.test".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], rp)),
            d_free_kbps: Some(2000.0),
            domain: None,
        }],
        |r| r.d_out_kbps = Some(200.0),
    );
    assert_eq!(status(&origin.node).state, "normal");

    // The crowd: 60 requests/s for 6 kB files (about 370 kB/s against D_out 200 kB/s). A
    // client redirected to the rescue server also loads two embedded objects from it (only
    // the redirected page is under the origin's control, §4.2): the rescue server's d_resc
    // then exceeds D_alloc and it lowers D_redi with RATE.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (oweb, rweb) = (origin.web, rescue.web);
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let errs = errors.clone();
    let crowd = rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / 60));
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0usize.. {
            tick.tick().await;
            tasks.spawn(one_client(
                oweb,
                format!("origin.test:{}", oweb.port()),
                rweb,
                n,
            ));
            while let Some(done) = tasks.try_join_next() {
                if let Ok(Err(e)) = done {
                    errs.lock().unwrap().push(e);
                }
            }
        }
    });

    // SOS, a grant and redirects.
    let s = wait_status(&origin.node, "SOS and a rescue server", |s| {
        s.state == "sos" && !s.rescuers.is_empty()
    });
    assert_eq!(s.rescuers[0].peer, "rescue.test");
    assert_eq!(s.rescuers[0].alias, "rescue-vh1.test");
    assert_eq!(s.rescuers[0].d_redi_kbps, 90, "D_init = D_alloc × T_coff");
    let rs = wait_status(&rescue.node, "rescuing the origin", |s| s.state == "rescue");
    assert_eq!(rs.origins[0].fqdn, "origin.test");
    assert_eq!(rs.origins[0].d_alloc, 100_000.0);

    // Redirects go out once the origin's d_out passes T_redi × D_out, and the rescue server
    // serves the redirected clients from its proxy (one fetch per file, then its cache).
    let s = wait_status(&origin.node, "redirects", |s| {
        s.totals.requests_redirected >= 20
    });
    assert!(s.rescuers[0].redirects >= 20);
    // RATE: the rescue server's d_resc(S_o) passed D_alloc, so D_redi went down.
    let s = wait_status(&origin.node, "a RATE below D_init", |s| {
        s.rescuers.first().is_some_and(|r| r.d_redi_kbps < 90)
    });
    assert!(s.totals.rate_messages >= 1);
    // Each of the first 20 redirected clients made three requests to the rescue server.
    wait_status(&rescue.node, "rescued requests", |s| {
        s.totals.requests_rescued >= 60
    });
    let oa = auto(&origin.node);
    let ra = auto(&rescue.node);
    assert!(value(&oa, "RequestsRedirected") >= 20.0, "{oa}");
    assert!(value(&oa, "RequestsServed") > 0.0, "{oa}");
    assert_eq!(value(&oa, "SosSent"), 1.0, "{oa}");
    assert!(value(&ra, "RequestsRescued") >= 60.0, "{ra}");
    assert!(value(&ra, "RateMessages") >= 1.0, "{ra}");
    assert_eq!(value(&ra, "Origins"), 1.0, "{ra}");
    // The proxy fetched each file from the origin about once (plus revalidations after
    // `fresh_ms`), not once per rescued request.
    let proxy = rescue.node.node.as_ref().unwrap().rescue().unwrap().stats();
    assert!(
        proxy.fetches >= 1 && proxy.fetches <= 3 * FILES as u64,
        "{proxy:?}"
    );
    assert!(proxy.hits > proxy.fetches, "{proxy:?}");
    // The rescue server's fetches are never redirected: the origin served every one.
    assert_eq!(proxy.fetch_errors, 0, "{proxy:?}");
    let metrics = origin.node.metrics();
    assert!(
        metrics.contains("switchyard_rescue_state{state=\"sos\"} 1"),
        "{metrics}"
    );

    // The crowd ends: after N_low quiet intervals the origin releases the rescue server.
    crowd.abort();
    let errors = errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "{errors:?}");
    let s = wait_status(&origin.node, "release", |s| {
        s.state == "normal" && s.rescuers.is_empty()
    });
    assert_eq!(s.totals.connections_lost, 0);
    let rs = wait_status(&rescue.node, "the rescue server back to normal", |s| {
        s.state == "normal" && s.origins.is_empty()
    });
    assert_eq!(rs.totals.relationships_ended, 1);
    // The ended origin's virtual host now redirects back to it.
    let (st, loc, _) = rt.block_on(get(rweb, "rescue-vh1.test", "/f1.html"));
    assert_eq!(st, 302);
    assert_eq!(
        loc.as_deref(),
        Some(format!("http://origin.test:{ow}/f1.html").as_str())
    );
    // And the origin serves its crowd itself again.
    let (st, _, len) = rt.block_on(get(oweb, "origin.test", "/f2.html"));
    assert_eq!((st, len), (200, FILE_BYTES));
    let json = {
        let mut c = common::Client::connect(origin.node.admin());
        c.send(b"GET /status.json HTTP/1.1\r\nHost: t\r\n\r\n");
        String::from_utf8(c.response(false).body).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let back: RescueStatus = serde_json::from_value(v["rescue"].clone()).unwrap();
    assert_eq!(back.server_name, "origin.test");
    assert_eq!(back.state, "normal");
    assert_eq!(back.totals.sos_sent, 1);
}
