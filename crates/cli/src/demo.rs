//! `switchyard demo`: a running system on a generated site, no setup.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_switch::config::{ControlAddr, Mechanism, Persistent};
use switchyard_switch::{NodeEntry, SwitchConfig};

use crate::runtime;

/// Flags of `switchyard demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Address of the site.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of the switch's admin listener: the live dashboard (`/`), `/metrics`,
    /// `/status.json`. With `--cooperative`: the first node's, the others' on the ports after
    /// it (any free ones with port 0).
    #[arg(long, default_value = "127.0.0.1:9080")]
    pub admin: SocketAddr,
    /// Where to generate the site (default: a temporary directory removed on exit).
    #[arg(long, conflicts_with = "root")]
    pub dir: Option<PathBuf>,
    /// Serve this existing document root instead of generating a site
    /// (e.g. one written by `switchyard trace synth --out-root`).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Number of node processes behind the switch.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Dispatching policy of the switch (rr wrr lc chash lard lard-r ext-lard cap).
    #[arg(long, default_value = "lard")]
    pub policy: String,
    /// Object cache budget of each node, in bytes; smaller than the site, so
    /// one node alone cannot hold it while the cluster's caches together can.
    #[arg(long, default_value_t = 6 * 1024 * 1024)]
    pub cache_bytes: u64,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub duration: Option<u64>,
    /// Seed of the generated site.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How responses reach clients: handoff (one-way: the switch passes each client
    /// connection to the node, which answers it directly) or relay (two-way).
    #[arg(long, value_enum, default_value = "handoff")]
    pub mechanism: Mechanism,
    /// Further requests on a handed-off connection: auto, single, multiple-handoff or
    /// backend-forwarding.
    #[arg(long, value_enum, default_value = "auto")]
    pub persistent: Persistent,
    /// Cooperative mode: no switch; the node processes share the site's port (the kernel
    /// spreads connections over them) and move each connection to the node that owns the
    /// request, which answers and gives it back.
    #[arg(long)]
    pub cooperative: bool,
}

/// What [`generate_site`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteSummary {
    pub files: usize,
    pub bytes: u64,
    /// A page of the site to suggest trying (a URL path).
    pub sample: String,
}

/// Write a deterministic sample site: an index, HTML pages of 1–64 KiB,
/// binary objects of 4–256 KiB and a few files of 2 MiB (sent with
/// sendfile, since they exceed the cache's object limit).
pub fn generate_site(dir: &Path, seed: u64) -> std::io::Result<SiteSummary> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut files = 0usize;
    let mut bytes = 0u64;
    let mut put = |rel: &str, data: &[u8]| -> std::io::Result<()> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, data)?;
        files += 1;
        bytes += data.len() as u64;
        Ok(())
    };
    let mut index = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>switchyard demo site</title></head>\n<body><h1>switchyard demo site</h1>\n<ul>\n",
    );
    for i in 0..200 {
        // Log-uniform sizes: many small pages, a few large ones.
        let size = (1024.0 * 64f64.powf(rng.random::<f64>())) as usize;
        let mut page = format!("<!doctype html>\n<html><head><title>page {i}</title></head><body>\n<h1>page {i}</h1>\n<p>");
        while page.len() + 20 < size {
            let word = rng.random_range(0..1000u32);
            let _ = write!(page, "w{word} ");
        }
        page.push_str("</p></body></html>\n");
        put(&format!("pages/p{i}.html"), page.as_bytes())?;
        let _ = writeln!(index, "<li><a href=\"/pages/p{i}.html\">page {i}</a></li>");
    }
    for i in 0..100 {
        let size = (4096.0 * 64f64.powf(rng.random::<f64>())) as usize;
        let mut data = vec![0u8; size];
        rng.fill(&mut data[..]);
        put(&format!("objects/o{i}.bin"), &data)?;
        let _ = writeln!(
            index,
            "<li><a href=\"/objects/o{i}.bin\">object {i}</a></li>"
        );
    }
    for i in 0..3 {
        let mut data = vec![0u8; 2 * 1024 * 1024];
        rng.fill(&mut data[..]);
        put(&format!("large/l{i}.bin"), &data)?;
        let _ = writeln!(index, "<li><a href=\"/large/l{i}.bin\">large {i}</a></li>");
    }
    index.push_str("</ul></body></html>\n");
    put("index.html", index.as_bytes())?;
    Ok(SiteSummary {
        files,
        bytes,
        sample: "/pages/p1.html".to_owned(),
    })
}

/// A node running as a child process of the demo.
struct NodeProcess {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl NodeProcess {
    /// Start `switchyard node` on free loopback ports and wait until it
    /// says where it serves.
    fn spawn(
        root: &Path,
        cache_bytes: u64,
        listen: SocketAddr,
        admin: SocketAddr,
        control: &Path,
        extra: &[String],
    ) -> anyhow::Result<NodeProcess> {
        let exe = std::env::current_exe().context("cannot find the switchyard binary")?;
        let mut cmd = Command::new(exe);
        cmd.args(["--log-format", "text", "node", "--admin"])
            .arg(admin.to_string())
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--root")
            .arg(root)
            .args(["--cache-bytes", &cache_bytes.to_string(), "--workers", "1"])
            .arg("--handoff-unix")
            .arg(control)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // A node must not outlive the demo, however the demo ends: the
        // kernel sends it SIGTERM when the demo's main thread exits.
        // SAFETY: the closure runs in the child between fork and exec and
        // only makes the async-signal-safe prctl(2) call.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn().context("cannot start a node process")?;
        let stderr = child.stderr.take().expect("piped");
        let mut lines = BufReader::new(stderr).lines();
        let mut addr = None;
        let mut admin = None;
        while addr.is_none() || admin.is_none() {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("a node process exited before it was serving");
            };
            if let Some(u) = line.strip_prefix("switchyard node: serving http://") {
                addr = u.trim_end_matches('/').parse().ok();
            } else if let Some(u) = line.strip_prefix("switchyard node: metrics at http://") {
                admin = u.trim_end_matches("/metrics").parse().ok();
            }
        }
        // Keep draining the node's log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(NodeProcess {
            child,
            addr: addr.expect("checked"),
            admin: admin.expect("checked"),
        })
    }

    /// SIGTERM, then wait for the node to drain and exit.
    fn stop(mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        // On error paths the node is still running; after stop() it has
        // already exited and this does nothing.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Count the files and bytes under an existing root.
fn describe_root(root: &Path) -> SiteSummary {
    let mut sum = SiteSummary {
        files: 0,
        bytes: 0,
        sample: String::new(),
    };
    // The suggested page: the site's index if it has one, else its first file by name among
    // those whose names need no escaping in a URL.
    let mut first: Option<String> = None;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => {
                    sum.files += 1;
                    sum.bytes += e.metadata().map_or(0, |m| m.len());
                    let url = e
                        .path()
                        .strip_prefix(root)
                        .ok()
                        .and_then(|r| r.to_str())
                        .filter(|r| {
                            r.bytes().all(|b| {
                                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'/')
                            })
                        })
                        .map(|r| format!("/{r}"));
                    if let Some(url) = url {
                        if first.as_ref().is_none_or(|f| url < *f) {
                            first = Some(url);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    sum.sample = if root.join("index.html").is_file() {
        "/".to_owned()
    } else {
        first.unwrap_or_else(|| "/".to_owned())
    };
    sum
}

/// Run the demo until Ctrl-C (or `--duration`).
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let (tmp, dir) = match (&args.root, &args.dir) {
        (Some(r), _) => (None, r.clone()),
        (None, Some(d)) => (None, d.clone()),
        (None, None) => {
            let t = tempfile::Builder::new()
                .prefix("switchyard-demo-")
                .tempdir()
                .context("cannot create a temporary directory")?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    };
    let site = match &args.root {
        Some(root) => {
            if !root.is_dir() {
                anyhow::bail!("--root {} is not a directory", root.display());
            }
            describe_root(root)
        }
        None => generate_site(&dir, args.seed)
            .with_context(|| format!("cannot write the demo site to {}", dir.display()))?,
    };
    if args.nodes == 0 {
        anyhow::bail!("--nodes must be at least 1");
    }
    let policy: switchyard_policy::PolicyKind = args
        .policy
        .parse()
        .map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
    // The nodes are separate processes of this same binary, as in a real
    // cluster; the switch runs in this process.
    // Each node takes handed-off connections on a Unix socket of its own.
    let sockets = tempfile::Builder::new()
        .prefix("switchyard-demo-ctl-")
        .tempdir()
        .context("cannot create a directory for the nodes' control sockets")?;
    if args.cooperative {
        return run_cooperative(&args, &dir, &site, sockets.path()).map(|()| drop((sockets, tmp)));
    }
    let mut nodes = Vec::new();
    let mut entries = Vec::new();
    for i in 0..args.nodes {
        let control = sockets.path().join(format!("node{i}.sock"));
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        let n = NodeProcess::spawn(&dir, args.cache_bytes, any, any, &control, &[])?;
        entries.push(NodeEntry {
            control: Some(ControlAddr::Unix(control)),
            ..NodeEntry::new(n.addr)
        });
        nodes.push(n);
    }
    let mut cfg = SwitchConfig {
        listen: args.listen,
        admin: Some(args.admin),
        nodes: entries,
        mechanism: args.mechanism,
        persistent: args.persistent,
        ..SwitchConfig::default()
    };
    cfg.policy.name = policy;
    let rt = runtime::build(1)?;
    rt.block_on(async {
        let switch = switchyard_switch::start(cfg).await.with_context(|| {
            format!(
                "the demo could not start (is {} or {} in use? pick others with --listen/--admin, port 0 for any)",
                args.listen, args.admin
            )
        })?;
        let admin = switch.admin_addr().expect("admin configured");
        if args.mechanism == Mechanism::Handoff
            && !switch.wait_for_controls(Duration::from_secs(5)).await
        {
            tracing::warn!("some nodes' control sockets are not up: their connections are relayed");
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "switchyard demo: live dashboard at http://{admin}/")?;
        writeln!(
            out,
            "switchyard demo: a switch ({policy}, {}) and {} node processes serving {}",
            match args.mechanism {
                Mechanism::Handoff => "one-way: connections handed to the nodes",
                Mechanism::Relay => "relaying",
                Mechanism::Redirect => "redirecting clients to the nodes",
            },
            nodes.len(),
            serving(&args, &site, &dir)
        )?;
        writeln!(out, "  site:    http://{}/", switch.addr())?;
        writeln!(out, "  metrics: http://{admin}/metrics   (switch; /status.json for its state)")?;
        for (i, n) in nodes.iter().enumerate() {
            writeln!(out, "           http://{}/metrics   (node {} at {})", n.admin, i + 1, n.addr)?;
        }
        writeln!(out, "  try:     curl -i http://{}{}", switch.addr(), site.sample)?;
        writeln!(out, "  status:  switchyard status --admin {admin} --watch")?;
        writeln!(out, "Press Ctrl-C to stop.")?;
        out.flush()?;
        drop(out);
        let why = runtime::stop_signal(args.duration.map(Duration::from_secs)).await;
        tracing::info!(reason = why, "demo stopping");
        switch.shutdown(Duration::from_secs(5)).await;
        anyhow::Ok(())
    })?;
    for n in nodes {
        n.stop();
    }
    drop(sockets);
    drop(tmp);
    Ok(())
}

/// What the demo serves, for its first line: which site, its size, each node's cache, where.
fn serving(args: &DemoArgs, site: &SiteSummary, dir: &Path) -> String {
    let what = if args.root.is_some() {
        "the site"
    } else {
        "a generated site"
    };
    format!(
        "{what} ({} files, {:.1} MB; each node caches {:.1} MB) from {}",
        site.files,
        site.bytes as f64 / 1e6,
        args.cache_bytes as f64 / 1e6,
        dir.display()
    )
}

/// `n` admin listener addresses: `first` and the ports after it, or, when its port is 0, free
/// ports the kernel picks now (bound and released: a process started right after takes them).
fn admin_addrs(first: SocketAddr, n: usize) -> anyhow::Result<Vec<SocketAddr>> {
    if first.port() == 0 {
        // All held at once, so that no port is handed out twice.
        let held = (0..n)
            .map(|_| {
                std::net::TcpListener::bind(first)
                    .with_context(|| format!("cannot find a free port on {}", first.ip()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        return held
            .iter()
            .map(|l| l.local_addr().map_err(anyhow::Error::from))
            .collect();
    }
    (0..n)
        .map(|i| {
            let port = u16::try_from(usize::from(first.port()) + i)
                .context("--admin: too few ports above it for every node")?;
            Ok(SocketAddr::new(first.ip(), port))
        })
        .collect()
}

/// The cooperative demo: `args.nodes` node processes on one port, no switch.
fn run_cooperative(
    args: &DemoArgs,
    dir: &Path,
    site: &SiteSummary,
    sockets: &Path,
) -> anyhow::Result<()> {
    if args.listen.port() == 0 {
        anyhow::bail!("--cooperative needs a fixed --listen port: every node shares it");
    }
    let control = |i: usize| sockets.join(format!("node{i}.sock"));
    // Every member's admin listener is in every member's table (the cluster's dashboard on any
    // of them): consecutive ports from --admin, or free ones with port 0.
    let admins = admin_addrs(args.admin, args.nodes)?;
    let mut members = Vec::new();
    for (i, admin) in admins.iter().enumerate() {
        members.push("--member".to_owned());
        members.push(format!("n{}=unix:{}", i + 1, control(i).display()));
        members.push("--member-admin".to_owned());
        members.push(format!("n{}={admin}", i + 1));
    }
    let mut nodes = Vec::new();
    for (i, &admin) in admins.iter().enumerate() {
        let mut extra = vec![
            "--cooperative".to_owned(),
            "--name".to_owned(),
            format!("n{}", i + 1),
        ];
        extra.extend(members.iter().cloned());
        let n = NodeProcess::spawn(
            dir,
            args.cache_bytes,
            args.listen,
            admin,
            &control(i),
            &extra,
        )
        .with_context(|| {
            format!(
                "node n{} did not start (is {} or {} in use? pick others with --listen/--admin)",
                i + 1,
                args.listen,
                admin
            )
        })?;
        nodes.push(n);
    }
    let rt = runtime::build(1)?;
    rt.block_on(async {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "switchyard demo: live dashboard at http://{}/   (the whole cluster, on any member's admin listener)",
            nodes[0].admin
        )?;
        writeln!(
            out,
            "switchyard demo: {} cooperative node processes, no switch, sharing one port and moving each \
             connection to the node that owns the request; serving {}",
            nodes.len(),
            serving(args, site, dir)
        )?;
        writeln!(out, "  site:    http://{}/", args.listen)?;
        for (i, n) in nodes.iter().enumerate() {
            writeln!(out, "  metrics: http://{}/metrics   (node n{})", n.admin, i + 1)?;
        }
        writeln!(out, "  try:     curl -i http://{}{}", args.listen, site.sample)?;
        writeln!(out, "Press Ctrl-C to stop.")?;
        out.flush()?;
        drop(out);
        let why = runtime::stop_signal(args.duration.map(Duration::from_secs)).await;
        tracing::info!(reason = why, "demo stopping");
        anyhow::Ok(())
    })?;
    for n in nodes {
        n.stop();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_is_deterministic_and_larger_than_the_demo_cache() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let sa = generate_site(a.path(), 7).unwrap();
        let sb = generate_site(b.path(), 7).unwrap();
        assert_eq!(sa, sb);
        assert_eq!(sa.files, 304);
        assert!(sa.bytes > 8 * 1024 * 1024, "{sa:?}");
        for rel in [
            "index.html",
            "pages/p3.html",
            "objects/o9.bin",
            "large/l0.bin",
        ] {
            assert_eq!(
                std::fs::read(a.path().join(rel)).unwrap(),
                std::fs::read(b.path().join(rel)).unwrap()
            );
        }
        let c = tempfile::tempdir().unwrap();
        generate_site(c.path(), 8).unwrap();
        assert_ne!(
            std::fs::read(a.path().join("objects/o9.bin")).unwrap(),
            std::fs::read(c.path().join("objects/o9.bin")).unwrap()
        );
        assert!(a.path().join(&sa.sample[1..]).is_file(), "{}", sa.sample);
    }

    #[test]
    fn the_suggested_page_of_a_given_root_exists() {
        let r = tempfile::tempdir().unwrap();
        assert_eq!(describe_root(r.path()).sample, "/");
        std::fs::create_dir_all(r.path().join("b/c")).unwrap();
        std::fs::write(r.path().join("b/c/z.txt"), b"z").unwrap();
        std::fs::write(r.path().join("b/a b.txt"), b"x").unwrap();
        std::fs::write(r.path().join("d.txt"), b"d").unwrap();
        let sum = describe_root(r.path());
        assert_eq!((sum.files, sum.bytes), (3, 3));
        // The first by name whose name needs no escaping.
        assert_eq!(sum.sample, "/b/c/z.txt");
        std::fs::write(r.path().join("index.html"), b"i").unwrap();
        assert_eq!(describe_root(r.path()).sample, "/");
    }
}
