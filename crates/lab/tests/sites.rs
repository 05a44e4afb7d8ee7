//! Root test of the sites lab (`switchyard_lab::sites`): a DNS host running a real named, a
//! registry host running a real etcd member, two sites with outbound links of their own
//! rates and a client whose resolver goes to the lab's named through its per-namespace
//! resolv.conf. Then teardown leaves no namespace and no `/etc/netns` directory behind.
//! Reported as ignored without root (see `switchyard_testkit::root`).

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use switchyard_handoff::netns::NetNs;
use switchyard_lab::sites::{SiteRole, SiteSpec, SitesLab, SitesSpec, ETC_NETNS};
use switchyard_testkit::engines::{require, spawn, Log, Named, Zone};
use switchyard_testkit::eventually;

fn main() {
    common::root::main(common::root::tests![
        sites_lab_resolves_through_its_named_and_shapes_each_site
    ]);
}

/// Removes the lab when dropped (also on panic).
struct Guard(String);

impl Drop for Guard {
    fn drop(&mut self) {
        SitesLab::teardown(&self.0);
    }
}

fn sites_lab_resolves_through_its_named_and_shapes_each_site() {
    let _w = common::watchdog(
        "sites_lab_resolves_through_its_named_and_shapes_each_site",
        Duration::from_secs(120),
    );
    let prefix = format!("sys{}", std::process::id() % 100_000);
    let _guard = Guard(prefix.clone());
    let spec = SitesSpec {
        prefix: prefix.clone(),
        sites: vec![
            SiteSpec {
                name: "origin".into(),
                out_kbps: Some(1000),
            },
            SiteSpec {
                name: "r1".into(),
                out_kbps: Some(5000),
            },
        ],
        clients: 1,
        registry: 1,
    };
    let lab = SitesLab::build(&spec).unwrap_or_else(|e| panic!("building the sites lab: {e}"));
    assert_eq!(lab.hosts_of(SiteRole::Site).count(), 2);
    let origin = lab.host("origin").unwrap().clone();
    let r1 = lab.host("r1").unwrap().clone();

    // Each site's uplink is shaped to its own rate (kB/s × 8 kbit).
    for (h, rate) in [(&origin, "8Mbit"), (&r1, "40Mbit")] {
        let qd = NetNs::open(&h.netns)
            .unwrap()
            .run(&["tc", "qdisc", "show", "dev", "eth0"])
            .unwrap();
        assert!(
            qd.contains("tbf") && qd.contains(&format!("rate {rate}")),
            "{}: {qd}",
            h.name
        );
    }

    // named on the DNS host, with the origin's zone.
    let dns = SocketAddr::new(IpAddr::V4(lab.dns_ip()), 53);
    let dns_ns = lab.host("dns").unwrap().netns.clone();
    let wrap = move |bin: &std::path::Path| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &dns_ns]).arg(bin);
        c
    };
    let origin_ip = origin.ip.to_string();
    let _named = Named::start_at(
        dns,
        &[Zone::updatable(
            "origin.test",
            &[("www", origin_ip.as_str())],
        )],
        &wrap,
    );

    // The client resolves through its resolv.conf, that is through the lab's named.
    let rc = std::fs::read_to_string(format!(
        "{ETC_NETNS}/{}/resolv.conf",
        lab.host("client0").unwrap().netns
    ))
    .unwrap();
    assert!(rc.contains(&format!("nameserver {}", lab.dns_ip())), "{rc}");
    let mut got = String::new();
    let resolved = eventually(Duration::from_secs(20), || {
        let out = lab
            .command("client0", "getent")
            .unwrap()
            .args(["ahostsv4", "www.origin.test"])
            .output()
            .unwrap();
        got = String::from_utf8_lossy(&out.stdout).into_owned();
        got.lines().any(|l| l.starts_with(&origin_ip))
    });
    assert!(resolved, "client0 resolves www.origin.test: {got:?}");

    // An etcd member on the registry host, reached from a site.
    let etcd = require("etcd", "etcd-server");
    let reg = lab.host("registry0").unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://{}:2379", reg.ip);
    let mut cmd = lab.command("registry0", etcd.to_str().unwrap()).unwrap();
    cmd.arg("--name=m0")
        .arg(format!("--data-dir={}", dir.path().join("m0").display()))
        .arg(format!("--listen-client-urls={url}"))
        .arg(format!("--advertise-client-urls={url}"))
        .arg(format!("--listen-peer-urls=http://{}:2380", reg.ip))
        .arg("--logger=zap")
        .arg("--log-outputs=stderr");
    let log = Log::default();
    let mut child = spawn(&mut cmd, &log);
    log.wait_for(0, "serving client traffic", Duration::from_secs(30));
    let out = lab
        .command("origin", "curl")
        .unwrap()
        .args(["-s", "--max-time", "5", &format!("{url}/health")])
        .output()
        .unwrap();
    let health = String::from_utf8_lossy(&out.stdout);
    assert!(health.contains("\"health\":\"true\""), "{health}");
    let _ = child.kill();
    let _ = child.wait();

    SitesLab::teardown(&prefix);
    assert!(NetNs::list_prefixed(&format!("{prefix}-")).is_empty());
    let left: Vec<String> = std::fs::read_dir(ETC_NETNS)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{prefix}-")))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}
