//! Drivers talking over real loopback sockets with mutual TLS: who is refused, a relationship
//! from SOS to release, RATE, and a lost connection ending the relationship on both sides.
//! The traffic is fed through the request-path API (`Traffic`) by a paced generator; every
//! wait is on the drivers' change notifications, bounded by a deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_rescue::{PeerConfig, PeerId, PeeringConfig, RescueConfig, Sos};
use switchyard_rescue_driver::testcerts::TestCa;
use switchyard_rescue_driver::{wait_for, Driver, DriverParts, TlsIdentity, Verdict, VirtualHosts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(20);

/// The virtual hosts of a rescue server, recorded.
#[derive(Default)]
struct Recorded(Mutex<Vec<String>>);

impl VirtualHosts for Recorded {
    fn origin_added(&self, _: PeerId, origin: &Sos, alias: &str) -> Result<(), String> {
        self.0.lock().push(format!("added {} {alias}", origin.fqdn));
        Ok(())
    }
    fn origin_ended(&self, alias: &str) -> Result<(), String> {
        self.0.lock().push(format!("ended {alias}"));
        Ok(())
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A site configuration: D_out in kB/s, I_ctrl 50 ms, N_low 4.
fn cfg(name: &str, d_out: f64, listen: SocketAddr, peers: Vec<PeerConfig>) -> RescueConfig {
    let mut c = RescueConfig::new(name, "127.0.0.1".parse().unwrap(), 8080, d_out / 0.8);
    c.control_interval_ms = 50;
    c.n_low = 4;
    c.retry_refused_intervals = 100_000;
    c.request_timeout_ms = 5_000;
    c.peering = Some(PeeringConfig {
        listen,
        cert: "unused".into(),
        key: "unused".into(),
        ca: "unused".into(),
        peers,
    });
    c
}

fn peer(name: &str, addr: SocketAddr, d_free: Option<f64>) -> PeerConfig {
    PeerConfig {
        name: name.into(),
        addr,
        d_free_kbps: d_free,
        domain: None,
    }
}

async fn start(
    config: RescueConfig,
    identity: TlsIdentity,
    vhosts: Option<Arc<dyn VirtualHosts>>,
) -> Driver {
    Driver::start(DriverParts {
        config,
        identity,
        vhosts,
        candidates: None,
        directory: None,
    })
    .await
    .unwrap()
}

/// An origin (D_out 100 kB/s, peer 0 = the rescue server) and a rescue server (D_out
/// 2000 kB/s granting at most 500 kB/s, peer 0 = the origin), both from one authority. The
/// rescue server's overload limits (T_high × D_out = 1500 kB/s) stay far above what the tests
/// make it serve, so only RATE reacts to it.
async fn pair() -> (Driver, Driver, Arc<Recorded>) {
    let ca = TestCa::new("peers");
    let (oa, ra) = (free_addr(), free_addr());
    let rec = Arc::new(Recorded::default());
    let mut rescue_cfg = cfg(
        "rescue.test",
        2000.0,
        ra,
        vec![peer("origin.test", oa, None)],
    );
    rescue_cfg.max_grant_kbps = Some(500.0);
    let rescue = start(rescue_cfg, ca.identity("rescue.test"), Some(rec.clone())).await;
    let origin = start(
        cfg(
            "origin.test",
            100.0,
            oa,
            vec![peer("rescue.test", ra, Some(500.0))],
        ),
        ca.identity("origin.test"),
        None,
    )
    .await;
    (origin, rescue, rec)
}

/// Feeds `bytes_per_sec` of the site's own responses into `driver`'s meter in 5 ms steps until
/// the returned handle is dropped.
fn crowd(driver: &Driver, bytes_per_sec: u64) -> tokio::task::JoinHandle<()> {
    let t = driver.traffic();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        loop {
            tick.tick().await;
            t.served(bytes_per_sec / 200);
        }
    })
}

#[tokio::test]
async fn unauthenticated_and_unknown_peers_are_refused() {
    let ca = TestCa::new("peers");
    let other_ca = TestCa::new("someone else");
    let ra = free_addr();
    let rec = Arc::new(Recorded::default());
    let rescue = start(
        cfg(
            "rescue.test",
            1000.0,
            ra,
            vec![peer("origin.test", free_addr(), None)],
        ),
        ca.identity("rescue.test"),
        Some(rec.clone()),
    )
    .await;
    let sos = b"1 SOS origin.test 127.0.0.1 8080 300\n";

    // 1. Plain TCP speaking the protocol: the TLS server takes it for a bad handshake.
    let mut plain = TcpStream::connect(ra).await.unwrap();
    plain.write_all(sos).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(WAIT, plain.read_to_end(&mut got))
        .await
        .expect("the connection is closed");
    assert!(!got.windows(3).any(|w| w == b"200"), "{got:?}");
    wait_for(&rescue, WAIT, |s| s.totals.connections_refused >= 1)
        .await
        .unwrap();

    // 2. TLS without a client certificate; 3. a certificate from another authority; 4. the
    // right authority but a name that is not a configured peer.
    let no_cert = {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert()).unwrap();
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
    };
    let with_cert = |id: TlsIdentity| {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert()).unwrap();
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(id.chain, id.key)
        .unwrap()
    };
    let clients = [
        no_cert,
        with_cert(other_ca.identity_trusting("origin.test", &[&ca])),
        with_cert(ca.identity("stranger.test")),
    ];
    for (i, client) in clients.into_iter().enumerate() {
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let tcp = TcpStream::connect(ra).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("rescue.test").unwrap();
        // With TLS 1.3 the client may finish its side before the server has judged its
        // certificate: then the refusal shows as the connection closing instead of an answer.
        if let Ok(mut tls) = connector.connect(name, tcp).await {
            let _ = tls.write_all(sos).await;
            let mut got = Vec::new();
            let _ = tokio::time::timeout(WAIT, tls.read_to_end(&mut got))
                .await
                .expect("the connection is closed");
            assert!(got.is_empty(), "client {i} got an answer: {got:?}");
        }
        wait_for(&rescue, WAIT, |s| {
            s.totals.connections_refused >= 2 + i as u64
        })
        .await
        .unwrap_or_else(|s| panic!("client {i} not refused: {s:?}"));
    }
    let s = rescue.status();
    assert_eq!(s.state, "normal");
    assert!(s.origins.is_empty());
    assert_eq!(s.totals.connections_refused, 4);
    assert!(rec.0.lock().is_empty(), "no origin was added");
}

#[tokio::test]
async fn a_crowd_gets_rescue_rate_and_release() {
    let (origin, rescue, rec) = pair().await;
    // 90 kB/s against D_out 100: above T_alert (50%) → SOS.
    let load = crowd(&origin, 90_000);
    let s = wait_for(&origin, WAIT, |s| {
        s.state == "sos" && !s.rescuers.is_empty()
    })
    .await
    .unwrap_or_else(|s| panic!("no rescue: {s:?}"));
    let r = &s.rescuers[0];
    assert_eq!(r.peer, "rescue.test");
    assert_eq!(r.alias, "rescue-vh1.test");
    // D_init = D_alloc × T_coff = 500 × 0.9.
    assert_eq!(r.d_redi_kbps, 450);
    assert_eq!(s.totals.sos_sent, 1);
    let rs = wait_for(&rescue, WAIT, |s| s.state == "rescue")
        .await
        .unwrap();
    assert_eq!(rs.origins[0].fqdn, "origin.test");
    assert_eq!(rs.origins[0].d_alloc, 500_000.0);
    assert_eq!(*rec.0.lock(), ["added origin.test rescue-vh1.test"]);

    // Above T_redi × D_out in an interval, requests of the origin's own content go to the
    // rescue server; a request from the rescue server's own address never does.
    let t = origin.traffic();
    let client = "192.0.2.9".parse().unwrap();
    let mut redirected = None;
    for _ in 0..10_000 {
        t.served(1000);
        if let Verdict::Redirect { peer, location } = t.route(client, "/a.html?x=1", 6000) {
            redirected = Some((peer, location));
            break;
        }
    }
    let (peer, location) = redirected.expect("a redirect once the threshold is passed");
    assert_eq!(peer, PeerId(0));
    assert_eq!(location, "http://rescue-vh1.test:8080/a.html?x=1");
    t.redirected(peer, 227, 6000);
    assert_eq!(
        t.route("127.0.0.1".parse().unwrap(), "/a.html", 6000),
        Verdict::Serve
    );
    assert_eq!(
        t.route(client, "/dotslash-status", 10),
        Verdict::Serve,
        "the status page is never redirected"
    );

    // The rescue server serves 800 kB/s for the origin, above D_alloc (500): it lowers D_redi
    // by RATE.
    let rt = rescue.traffic();
    let rescued = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        loop {
            tick.tick().await;
            rt.rescued(PeerId(0), 4000);
        }
    });
    let s = wait_for(&origin, WAIT, |s| {
        s.rescuers.first().is_some_and(|r| r.d_redi_kbps < 450)
    })
    .await
    .unwrap_or_else(|s| panic!("no RATE: {s:?}"));
    assert!(s.totals.rate_messages >= 1);
    assert!(rescue.status().totals.rate_messages >= 1);
    rescued.abort();

    // The crowd is gone: after N_low low intervals the origin releases its rescue server and
    // both are back to normal; the rescue server's virtual host ended.
    load.abort();
    let s = wait_for(&origin, WAIT, |s| {
        s.state == "normal" && s.rescuers.is_empty()
    })
    .await
    .unwrap_or_else(|s| panic!("no release: {s:?}"));
    assert_eq!(s.totals.connections_lost, 0);
    assert_eq!(s.totals.requests_redirected, 1);
    let rs = wait_for(&rescue, WAIT, |s| {
        s.state == "normal" && s.origins.is_empty()
    })
    .await
    .unwrap();
    assert_eq!(rs.totals.relationships_ended, 1);
    assert_eq!(
        *rec.0.lock(),
        ["added origin.test rescue-vh1.test", "ended rescue-vh1.test"]
    );
    // The origin closes the connection it dialed once nothing depends on it.
    wait_for(&origin, WAIT, |s| !s.peers[0].connected)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_lost_connection_ends_the_relationship_on_both_sides() {
    let (origin, rescue, rec) = pair().await;
    let _load = crowd(&origin, 90_000);
    wait_for(&origin, WAIT, |s| !s.rescuers.is_empty())
        .await
        .unwrap();
    wait_for(&rescue, WAIT, |s| s.state == "rescue")
        .await
        .unwrap();

    // The rescue server drops the connection: it ends its side at once, and the origin when
    // it sees the connection close (no SHUTDOWN crossed).
    rescue.disconnect(PeerId(0));
    let rs = rescue.status();
    assert_eq!(rs.state, "normal");
    assert!(rs.origins.is_empty());
    assert_eq!(rs.totals.connections_lost, 1);
    let s = wait_for(&origin, WAIT, |s| s.rescuers.is_empty())
        .await
        .unwrap_or_else(|s| panic!("origin kept its rescue server: {s:?}"));
    assert_eq!(s.totals.connections_lost, 1);
    // Still crowded, but the lost rescue server is not asked again within the back-off.
    assert_eq!(s.totals.sos_sent, 1);
    assert_eq!(
        *rec.0.lock(),
        ["added origin.test rescue-vh1.test", "ended rescue-vh1.test"]
    );
}

#[tokio::test]
async fn an_origin_that_goes_away_ends_the_rescue() {
    let (origin, rescue, rec) = pair().await;
    let load = crowd(&origin, 90_000);
    wait_for(&rescue, WAIT, |s| s.state == "rescue")
        .await
        .unwrap();
    // The origin's process ends without a word: the rescue server sees the connection close
    // and ends the relationship (its virtual host is redirected back from then on).
    load.abort();
    drop(origin);
    let rs = wait_for(&rescue, WAIT, |s| s.state == "normal")
        .await
        .unwrap_or_else(|s| panic!("still rescuing: {s:?}"));
    assert!(rs.origins.is_empty());
    assert_eq!(rs.totals.connections_lost, 1);
    assert!(!rs.peers[0].connected);
    assert_eq!(
        *rec.0.lock(),
        ["added origin.test rescue-vh1.test", "ended rescue-vh1.test"]
    );
}

#[tokio::test]
async fn identities_load_from_pem_files() {
    let ca = TestCa::new("peers");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca_path) = ca.write_identity("origin.test", dir.path()).unwrap();
    let p = PeeringConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert,
        key,
        ca: ca_path.clone(),
        peers: vec![],
    };
    let id = TlsIdentity::from_files(&p).unwrap();
    assert_eq!(id.chain.len(), 1);
    assert_eq!(id.ca, [ca.cert()]);
    let mut bad = p.clone();
    bad.cert = ca_path.with_file_name("missing.crt");
    let e = TlsIdentity::from_files(&bad).unwrap_err().to_string();
    assert!(e.contains("missing.crt"), "{e}");
    let mut bad = p;
    std::fs::write(dir.path().join("empty.crt"), "").unwrap();
    bad.ca = dir.path().join("empty.crt");
    let e = TlsIdentity::from_files(&bad).unwrap_err().to_string();
    assert!(e.contains("no certificate"), "{e}");
}
