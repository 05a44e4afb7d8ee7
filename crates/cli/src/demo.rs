//! `switchyard demo`: a running system on a generated site, no setup.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_node::NodeConfig;

use crate::runtime;

/// Flags of `switchyard demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Address of the site.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of the metrics endpoint.
    #[arg(long, default_value = "127.0.0.1:9080")]
    pub admin: SocketAddr,
    /// Where to generate the site (default: a temporary directory removed on exit).
    #[arg(long, conflicts_with = "root")]
    pub dir: Option<PathBuf>,
    /// Serve this existing document root instead of generating a site
    /// (e.g. one written by `switchyard trace synth --out-root`).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Object cache budget of the node, in bytes; smaller than the site so
    /// that the cache has to choose.
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    pub cache_bytes: u64,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub duration: Option<u64>,
    /// Seed of the generated site.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// What [`generate_site`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteSummary {
    pub files: usize,
    pub bytes: u64,
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
    Ok(SiteSummary { files, bytes })
}

/// Count the files and bytes under an existing root.
fn describe_root(root: &Path) -> SiteSummary {
    let mut sum = SiteSummary { files: 0, bytes: 0 };
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
                }
                _ => {}
            }
        }
    }
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
    let cfg = NodeConfig {
        listen: args.listen,
        admin: Some(args.admin),
        root: dir.clone(),
        cache_bytes: args.cache_bytes,
        ..NodeConfig::default()
    };
    let rt = runtime::build(0)?;
    rt.block_on(async {
        let node = switchyard_node::start(cfg).await.with_context(|| {
            format!(
                "the demo could not start (is {} or {} in use? pick others with --listen/--admin, port 0 for any)",
                args.listen, args.admin
            )
        })?;
        let admin = node.admin_addr().expect("admin configured");
        let mut out = std::io::stdout().lock();
        let what = if args.root.is_some() { "the site" } else { "a generated site" };
        writeln!(out, "switchyard demo: 1 node serving {what} ({} files, {:.1} MB) from {}", site.files, site.bytes as f64 / 1e6, dir.display())?;
        writeln!(out, "  site:    http://{}/", node.addr())?;
        writeln!(out, "  metrics: http://{admin}/metrics")?;
        writeln!(out, "  try:     curl -i http://{}/pages/p1.html", node.addr())?;
        writeln!(out, "Press Ctrl-C to stop.")?;
        out.flush()?;
        drop(out);
        let why = runtime::stop_signal(args.duration.map(Duration::from_secs)).await;
        tracing::info!(reason = why, "demo stopping");
        node.shutdown(Duration::from_secs(5)).await;
        anyhow::Ok(())
    })?;
    drop(tmp);
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
    }
}
