//! The live dashboard in a real browser: headless Chromium (Debian's `chromium`) driven through
//! `chromedriver` (Debian's `chromium-driver`, installed by `scripts/install-deps`) over
//! WebDriver. The page loads with no console errors, its counters and charts move within 2 s
//! of traffic starting, a killed node shows as down within the health checks' interval and the
//! next update, and a screenshot is saved to `target/dashboard.png` (and to
//! `docs/dashboard.png` with `SWITCHYARD_UPDATE_SCREENSHOT=1`). With `admin_actions` on, a
//! click drains a node and another puts it back.
//!
//! The same page on a member of a cooperative cluster (no switch) shows the whole cluster,
//! read-only: it loads with no console errors, moves within 2 s of traffic entering one
//! member, and shows a killed member down.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client as Browser, ClientBuilder, Locator};
use serde_json::{json, Value};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// A chromedriver process on a loopback port; killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    /// Start chromedriver and wait for the line saying it listens.
    fn start() -> Driver {
        for (path, package) in [(CHROMEDRIVER, "chromium-driver"), (CHROMIUM, "chromium")] {
            assert!(
                Path::new(path).exists(),
                "the dashboard's browser test needs {path}: install the Debian packages \
                 chromium and chromium-driver (scripts/install-deps does, as root: \
                 apt-get install chromium chromium-driver); {package} is missing"
            );
        }
        // A free port: chromedriver takes no port 0.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            let n = out.read_line(&mut line).unwrap();
            assert!(n > 0, "chromedriver exited before it was listening");
            if line.contains("started successfully") {
                break;
            }
        }
        // Keep reading its output so that it never blocks on a full pipe.
        std::thread::spawn(move || for _ in out.lines() {});
        Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The browser's console log since the last call (chromedriver's `se/log`, with
/// `goog:loggingPrefs` set).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(r#"{"type":"browser"}"#.to_owned()))
    }
}

async fn text(b: &Browser, css: &str) -> String {
    b.find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The text of an element that may not be on the page yet.
async fn text_if_any(b: &Browser, css: &str) -> Option<String> {
    match b.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.ok(),
        Err(_) => None,
    }
}

async fn canvas(b: &Browser, id: &str) -> String {
    let v = b
        .execute(
            &format!("return document.getElementById('{id}').toDataURL();"),
            vec![],
        )
        .await
        .unwrap();
    v.as_str().unwrap().to_owned()
}

/// Check `f` until it holds or `limit` passes; the time it took, or `None`. The page changes
/// only through its event stream, which the test cannot subscribe to from here: this polls
/// the DOM, as a person watching would.
async fn within<F, Fut>(limit: Duration, mut f: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::task::yield_now().await;
    }
}

/// Keep-alive GETs of `paths` on `clients` threads until the flag is set (30 s at most).
fn traffic(addr: SocketAddr, clients: usize, paths: &[&str]) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    for k in 0..clients {
        let stop = stop.clone();
        let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
        std::thread::spawn(move || {
            let mut c = Client::connect(addr);
            let end = Instant::now() + Duration::from_secs(30);
            let mut i = k;
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                i += 1;
                if c.try_get(&paths[i % paths.len()]).is_err() {
                    c = Client::connect(addr);
                }
            }
        });
    }
    stop
}

fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One browser at a time: the tests' timings assume the machine is not also running another
/// Chromium.
static ONE_BROWSER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A WebDriver session with headless Chromium, its console log kept.
fn session(rt: &tokio::runtime::Runtime, driver: &Driver) -> Browser {
    rt.block_on(async {
        let caps = json!({
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,1200", "--hide-scrollbars"],
            },
            "goog:loggingPrefs": { "browser": "ALL" },
        });
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&driver.url)
            .await
            .expect("a WebDriver session with headless Chromium")
    })
}

/// The browser's console holds no error (a probe written to it first shows the log is read).
fn assert_no_console_errors(rt: &tokio::runtime::Runtime, browser: &Browser) {
    let log = rt.block_on(async {
        browser
            .execute("console.error('dashboard-test-probe');", vec![])
            .await
            .unwrap();
        browser.issue_cmd(BrowserLog).await.unwrap()
    });
    let entries = log.as_array().expect("a log array");
    assert!(
        entries.iter().any(|e| e["message"]
            .as_str()
            .is_some_and(|m| m.contains("dashboard-test-probe"))),
        "the browser log is not being read: {log}"
    );
    let errors: Vec<&Value> = entries
        .iter()
        .filter(|e| e["level"] == "SEVERE")
        .filter(|e| {
            !e["message"]
                .as_str()
                .unwrap_or("")
                .contains("dashboard-test-probe")
        })
        .collect();
    assert!(errors.is_empty(), "console errors: {errors:?}");
}

#[test]
fn dashboard_in_a_real_browser() {
    let bodies: Vec<(String, Vec<u8>)> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("{n}.html"), vec![b'x'; 2000 * (i + 1)]))
        .collect();
    let files: Vec<(&str, Vec<u8>)> = bodies
        .iter()
        .map(|(n, d)| (n.as_str(), d.clone()))
        .collect();
    let _one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let mut nodes = cluster(3, &files);
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let health = Duration::from_millis(100);
    let sw = TestSwitch::start(&addrs, |c| {
        c.health_interval_ms = health.as_millis() as u64;
        c.health_fall = 1;
        c.admin_actions = true;
    });
    let admin = sw.sw().admin_addr().unwrap();
    let driver = Driver::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let browser = session(&rt, &driver);

    // The page loads and its stream goes live, with a row per node, all up.
    let (chart_before, rps_before) = rt.block_on(async {
        browser.goto(&format!("http://{admin}/")).await.unwrap();
        let live = within(Duration::from_secs(5), || async {
            text(&browser, "#status").await == "live"
                && text(&browser, "#node-2 td.state").await == "up"
        })
        .await;
        assert!(
            live.is_some(),
            "status: {}",
            text(&browser, "#status").await
        );
        for (i, a) in addrs.iter().enumerate() {
            assert_eq!(
                text(&browser, &format!("#node-{i} td.name")).await,
                a.to_string()
            );
        }
        (
            canvas(&browser, "chart-rps").await,
            text(&browser, "#total-rps").await,
        )
    });
    assert_eq!(rps_before, "0", "no traffic yet");

    // Traffic: the counters and the chart move within 2 s.
    let started = Instant::now();
    let stop = traffic(
        sw.addr,
        3,
        &[
            "/a.html", "/b.html", "/c.html", "/d.html", "/e.html", "/f.html",
        ],
    );
    let moved = rt.block_on(within(Duration::from_secs(2), || async {
        text(&browser, "#total-rps").await != "0"
            && canvas(&browser, "chart-rps").await != chart_before
    }));
    let after = started.elapsed();
    assert!(
        moved.is_some(),
        "nothing moved {after:?} after traffic started"
    );
    assert!(after <= Duration::from_millis(2500), "{after:?}");

    // A node killed shows as down within the health checks' interval and the next update.
    // A few more points of traffic on the charts, for the record.
    let points = rt.block_on(within(Duration::from_secs(5), || async {
        let n = browser
            .execute("return times.length;", vec![])
            .await
            .unwrap();
        n.as_u64().unwrap_or(0) >= 5
    }));
    assert!(points.is_some());
    nodes[2].kill();
    let killed = Instant::now();
    let down = rt.block_on(within(health + Duration::from_millis(1500), || async {
        text(&browser, "#node-2 td.state").await == "down"
    }));
    assert!(
        down.is_some(),
        "node 2 not shown down {:?} after it died",
        killed.elapsed()
    );
    rt.block_on(async {
        assert_eq!(text(&browser, "#node-0 td.state").await, "up");
        assert_eq!(text(&browser, "#nodes-up").await, "2 / 3");
    });
    stop.store(true, Ordering::Relaxed);

    // The record: a screenshot, and the console clean (the probe shows the log is read).
    let png = rt.block_on(browser.screenshot()).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let target = workspace_dir().join("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("dashboard.png"), &png).unwrap();
    if std::env::var_os("SWITCHYARD_UPDATE_SCREENSHOT").is_some() {
        std::fs::write(workspace_dir().join("docs/dashboard.png"), &png).unwrap();
    }
    assert_no_console_errors(&rt, &browser);

    // With admin_actions on, the page offers actions: a click drains node 1, another puts it up.
    rt.block_on(async {
        let click = |css: &'static str| {
            let browser = &browser;
            async move {
                browser
                    .find(Locator::Css(css))
                    .await
                    .unwrap()
                    .click()
                    .await
                    .unwrap()
            }
        };
        click("#node-1 button.act-drain").await;
        let drained = within(Duration::from_secs(5), || async {
            matches!(
                text(&browser, "#node-1 td.state").await.as_str(),
                "drained" | "draining"
            )
        })
        .await;
        assert!(
            drained.is_some(),
            "state {:?}, action {:?}",
            text(&browser, "#node-1 td.state").await,
            text(&browser, "#action-result").await
        );
        assert!(
            text(&browser, "#action-result").await.starts_with("drain "),
            "{}",
            text(&browser, "#action-result").await
        );
        click("#node-1 button.act-up").await;
        let up = within(Duration::from_secs(5), || async {
            text(&browser, "#node-1 td.state").await == "up"
        })
        .await;
        assert!(up.is_some(), "{}", text(&browser, "#action-result").await);
    });
    assert_no_console_errors(&rt, &browser);
    rt.block_on(browser.close()).unwrap();
    drop(driver);
}

#[test]
fn cooperative_dashboard_in_a_real_browser() {
    use switchyard_handoff::link::ControlAddr;
    use switchyard_node::{ClusterConfig, Member};

    let _one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let sockets = tempfile::tempdir().unwrap();
    let members: Vec<Member> = (0..3)
        .map(|i| Member {
            name: format!("member-{i}"),
            control: ControlAddr::Unix(sockets.path().join(format!("m{i}.sock"))),
        })
        .collect();
    let mut nodes: Vec<TestNode> = (0..3)
        .map(|i| {
            TestNode::start(
                |r| {
                    for t in 0..12 {
                        write(r, &format!("t{t}.html"), &vec![b'x'; 1000 * (t + 1)]);
                    }
                },
                |c| {
                    c.workers = 2;
                    c.admin = Some("127.0.0.1:0".parse().unwrap());
                    c.cluster = Some(ClusterConfig::new(format!("member-{i}"), members.clone()));
                },
            )
        })
        .collect();
    // Every member's admin listener, known once bound, goes into the table by a reload.
    let admins: Vec<SocketAddr> = nodes
        .iter()
        .map(|n| n.node.as_ref().unwrap().admin_addr().unwrap())
        .collect();
    for (i, n) in nodes.iter().enumerate() {
        let node = n.node.as_ref().unwrap();
        let rt = n.rt.as_ref().unwrap();
        assert!(rt.block_on(node.wait_for_peers(Duration::from_secs(10))));
        let mut cfg = ClusterConfig::new(format!("member-{i}"), members.clone());
        cfg.admin = admins
            .iter()
            .enumerate()
            .map(|(j, a)| (format!("member-{j}"), *a))
            .collect();
        let _rt = rt.enter();
        node.reload_cluster(&cfg).unwrap();
    }

    let driver = Driver::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let browser = session(&rt, &driver);
    let (chart_before, rps_before) = rt.block_on(async {
        browser
            .goto(&format!("http://{}/", admins[0]))
            .await
            .unwrap();
        let live = within(Duration::from_secs(5), || async {
            // (A member's first update follows its first viewer by up to a second.)
            text(&browser, "#status").await == "live"
                && text_if_any(&browser, "#node-2 td.state").await.as_deref() == Some("up")
                && text(&browser, "#node-2 td.name").await == "member-2"
        })
        .await;
        assert!(
            live.is_some(),
            "status: {}, what: {}",
            text(&browser, "#status").await,
            text(&browser, "#what").await
        );
        assert!(text(&browser, "#what").await.starts_with("cooperative"));
        let labels = browser
            .execute(
                "return document.querySelector('th.moves-label').textContent;",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(labels, "clones/s");
        // Read-only: no action anywhere.
        let buttons = browser
            .find_all(Locator::Css("td.actions button"))
            .await
            .unwrap();
        assert!(buttons.is_empty(), "a cooperative page offers no actions");
        (
            canvas(&browser, "chart-rps").await,
            text(&browser, "#total-rps").await,
        )
    });
    assert_eq!(rps_before, "0", "no traffic yet");

    // Traffic entering member 1 only: the page of member 0 moves within 2 s.
    let started = Instant::now();
    let paths: Vec<String> = (0..12).map(|t| format!("/t{t}.html")).collect();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    let stop = traffic(nodes[1].addr, 3, &paths);
    let moved = rt.block_on(within(Duration::from_secs(2), || async {
        text(&browser, "#total-rps").await != "0"
            && canvas(&browser, "chart-rps").await != chart_before
    }));
    let after = started.elapsed();
    assert!(
        moved.is_some(),
        "nothing moved {after:?} after traffic started"
    );
    assert!(after <= Duration::from_millis(2500), "{after:?}");
    let clones = rt.block_on(within(Duration::from_secs(3), || async {
        text(&browser, "#total-moves").await != "0" && text(&browser, "#total-backs").await != "0"
    }));
    assert!(clones.is_some(), "clones and hand-backs show");

    // Member 2 killed: shown down at the next update or the one after.
    nodes[2].kill();
    let killed = Instant::now();
    let down = rt.block_on(within(Duration::from_secs(3), || async {
        text(&browser, "#node-2 td.state").await == "down"
    }));
    assert!(
        down.is_some(),
        "member 2 not shown down {:?} after it died",
        killed.elapsed()
    );
    rt.block_on(async {
        assert_eq!(text(&browser, "#node-0 td.state").await, "up");
        assert_eq!(text(&browser, "#nodes-up").await, "2 / 3");
    });
    stop.store(true, Ordering::Relaxed);
    let png = rt.block_on(browser.screenshot()).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    let target = workspace_dir().join("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("dashboard-cooperative.png"), &png).unwrap();
    assert_no_console_errors(&rt, &browser);
    rt.block_on(browser.close()).unwrap();
    drop(driver);
}

/// A site's flash-crowd rescue on the switch's page: the rescue part shows the site normal,
/// then a crowd above its D_out (from an address that is not the rescue server's) makes it
/// ask a rescue server for help, and the page shows it rescued by the rescue server's
/// virtual host, with the redirect rate.
#[test]
fn rescue_state_in_a_real_browser() {
    use switchyard_rescue::{PeerConfig, PeeringConfig, RescueConfig};
    use switchyard_rescue_driver::testcerts::TestCa;

    let _one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("peers");
    let table = |name: &str, web: u16, peering: u16, peer: PeerConfig| {
        let (cert, key, ca_path) = ca.write_identity(name, dir.path()).unwrap();
        let mut r = RescueConfig::new(name, [127, 0, 0, 1].into(), web, 1000.0);
        r.control_interval_ms = 200;
        r.n_low = 5;
        r.retry_refused_intervals = 100_000;
        r.peering = Some(PeeringConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], peering)),
            cert,
            key,
            ca: ca_path,
            peers: vec![peer],
        });
        r
    };
    let (sw_web, sw_peer, r_web, r_peer) = (free_port(), free_port(), free_port(), free_port());
    let backend = TestNode::start(
        |r| {
            for i in 0..20 {
                write(r, &format!("f{i}.html"), &vec![b'a'; 6000]);
            }
        },
        |_| {},
    );
    let mut rescue_cfg = table(
        "rescue.test",
        r_web,
        r_peer,
        PeerConfig {
            name: "site.test".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], sw_peer)),
            d_free_kbps: None,
            domain: None,
        },
    );
    rescue_cfg.d_out_kbps = Some(4000.0);
    rescue_cfg.max_grant_kbps = Some(100.0);
    let _rescue = TestNode::start_on(
        SocketAddr::from(([127, 0, 0, 1], r_web)),
        |r| write(r, "own.html", b"own"),
        |c| c.rescue = Some(rescue_cfg),
    );
    let mut site_cfg = table(
        "site.test",
        sw_web,
        sw_peer,
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
    let admin = sw.sw().admin_addr().unwrap();
    let driver = Driver::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let browser = session(&rt, &driver);
    rt.block_on(async {
        browser.goto(&format!("http://{admin}/")).await.unwrap();
        let shown = within(Duration::from_secs(5), || async {
            text(&browser, "#status").await == "live"
                && text_if_any(&browser, "#rescue-state").await.as_deref() == Some("normal")
        })
        .await;
        assert!(
            shown.is_some(),
            "rescue state: {:?}",
            text_if_any(&browser, "#rescue-state").await
        );
        assert_eq!(text(&browser, "#rescue-name").await, "site.test");
        assert!(
            text(&browser, "#rescue-rates")
                .await
                .contains("of 200 kB/s"),
            "{}",
            text(&browser, "#rescue-rates").await
        );
    });

    // The crowd: 60 requests/s for 6 kB files from 127.0.0.5, about 370 kB/s against D_out
    // 200 kB/s; redirected clients do not follow (the rescue server's side is tested in
    // tests/rescue.rs). Bounded: 40 s at most.
    let crowd_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let site = sw.addr;
    let crowd = crowd_rt.spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / 60));
        for n in 0usize..60 * 40 {
            tick.tick().await;
            tokio::spawn(async move {
                let sock = tokio::net::TcpSocket::new_v4().unwrap();
                sock.bind(SocketAddr::from(([127, 0, 0, 5], 0))).unwrap();
                if let Ok(mut s) = sock.connect(site).await {
                    let req = format!(
                        "GET /f{}.html HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n",
                        n % 20
                    );
                    let _ = s.write_all(req.as_bytes()).await;
                    let _ = s.read_to_end(&mut Vec::new()).await;
                }
            });
        }
    });
    rt.block_on(async {
        let rescued = within(Duration::from_secs(30), || async {
            text_if_any(&browser, "#rescue-state").await.as_deref() == Some("SOS: rescued")
                && text(&browser, "#rescue-rels")
                    .await
                    .contains("rescue-vh1.test")
        })
        .await;
        assert!(
            rescued.is_some(),
            "state {:?}, relationships {:?}, driver {:?}",
            text_if_any(&browser, "#rescue-state").await,
            text_if_any(&browser, "#rescue-rels").await,
            sw.sw().rescue_driver().map(|d| d.status().state)
        );
        let rels = text(&browser, "#rescue-rels").await;
        assert!(
            rels.contains("rescued by") && rels.contains("rescue.test"),
            "{rels}"
        );
    });
    crowd.abort();
    let png = rt.block_on(browser.screenshot()).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    let target = workspace_dir().join("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("dashboard-rescue.png"), &png).unwrap();
    assert_no_console_errors(&rt, &browser);
    rt.block_on(browser.close()).unwrap();
    drop(driver);
}
