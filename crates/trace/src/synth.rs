//! A synthetic web site and a trace of user sessions on it.
//!
//! The site is a set of HTML pages, each with its own embedded objects
//! (images). The model is the one of seed 004 §5.4, Table 1
//! ([`WorkloadModel`]):
//!
//! * page sizes: lognormal body with a Pareto tail, truncated at
//!   [`SynthConfig::max_file_bytes`]; embedded object sizes: lognormal;
//! * embedded objects per page: ⌊X⌋ with X Pareto (α = 1.33, k = 2),
//!   truncated at [`SynthConfig::max_embedded`];
//! * sessions arrive with exponential inter-arrival times (mean
//!   [`SynthConfig::session_interarrival_secs`]; seed 004 uses 10 s for its
//!   light and 1 s for its heavy scenario), each from a client drawn
//!   uniformly among [`SynthConfig::clients`];
//! * a session makes max(1, round(X)) page requests, X inverse Gaussian
//!   (μ = 3.86, λ = 9.46), separated by Pareto think times (α = 1.4, k = 1 s,
//!   truncated at [`SynthConfig::max_think_secs`]);
//! * each page request picks a page by Zipf-like popularity, P(rank r) ∝
//!   r^−α with α = [`SynthConfig::zipf_alpha`] (ranks are assigned to pages
//!   in a random order, so popularity is unrelated to names), and fetches
//!   the page and then all its embedded objects in the same second.
//!
//! File sizes are rounded to whole bytes (at least 1). With only
//! [`SynthConfig::targets`], that many files are drawn; with only
//! [`SynthConfig::total_bytes`], files are drawn until the total is reached
//! (the last one is cut to fit); with both, the drawn sizes are scaled by
//! one common factor so that they add up to the total exactly (this keeps
//! the shape of the distributions and moves their scale).
//!
//! Everything is a pure function of the configuration: each part of the
//! generation draws from its own ChaCha20 stream keyed by the seed, and each
//! file's content from a stream of its own. The same seed gives the same
//! site, trace and file bytes (on the same platform's floating-point math
//! library); different seeds give different ones.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::dist::{below, exponential, unit, WorkloadModel};
use crate::record::TargetKey;
use crate::workload::{Request, Target, Workload};
use crate::TraceError;

/// Most clients a synthetic trace can have: the size of the benchmarking
/// address block 198.18.0.0/15 (RFC 2544) the client addresses are taken from.
pub const MAX_CLIENTS: u32 = 131_070;

/// Default start of a synthetic trace: 2000-01-01T00:00:00Z.
pub const DEFAULT_START_TIME: i64 = 946_684_800;

const STREAM_SITE: u64 = 1;
const STREAM_POPULARITY: u64 = 2;
const STREAM_SESSIONS: u64 = 3;
const STREAM_CONTENT: u64 = 1 << 32;

/// Files of the trace seed 000 §5.1 replayed (UC Berkeley EECS, January 2001).
pub const CYCLONE_FILES: u64 = 74_820;
/// Their total size, bytes ("about 650 MB").
pub const CYCLONE_BYTES: u64 = 650_000_000;
/// Exponent of the page popularity of [`SynthConfig::cyclone`]: 10 % of the files draw more
/// than 80 % of the requests, as seed 000 §3.2 describes such workloads.
pub const CYCLONE_ZIPF_ALPHA: f64 = 1.2;

/// What to generate. [`Default`] gives a small site and trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SynthConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Number of files (pages and embedded objects). Default: 1000 when
    /// `total_bytes` is not given either.
    pub targets: Option<u64>,
    /// Total size of all files, bytes.
    pub total_bytes: Option<u64>,
    /// Exponent of the Zipf-like page popularity (0 = uniform).
    pub zipf_alpha: f64,
    /// Number of requests in the trace (pages and embedded objects).
    pub requests: u64,
    /// Number of distinct clients (at most [`MAX_CLIENTS`]).
    pub clients: u32,
    /// Time of the first session start, Unix seconds.
    pub start_time: i64,
    /// Mean time between session starts, seconds.
    pub session_interarrival_secs: f64,
    /// Largest file size: the truncation point of the size distributions
    /// (applied before sizes are scaled to `total_bytes`, when both
    /// `targets` and `total_bytes` are given).
    pub max_file_bytes: u64,
    /// Most embedded objects on one page.
    pub max_embedded: u32,
    /// Longest think time, seconds.
    pub max_think_secs: f64,
    /// Most page requests in one session.
    pub max_pages_per_session: u32,
    /// The distributions.
    pub model: WorkloadModel,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            seed: 1,
            targets: None,
            total_bytes: None,
            zipf_alpha: 1.0,
            requests: 10_000,
            clients: 100,
            start_time: DEFAULT_START_TIME,
            session_interarrival_secs: 1.0,
            max_file_bytes: 64 << 20,
            max_embedded: 64,
            max_think_secs: 600.0,
            max_pages_per_session: 1000,
            model: WorkloadModel::default(),
        }
    }
}

impl SynthConfig {
    /// A site and trace shaped like seed 000's (§5.1: 74,820 files, about 650 MB, mean
    /// request about 7 KB), `scale` times as large in files and bytes (clamped to
    /// `[1e-4, 1]`), with `requests` requests, Zipf-like page popularity of exponent
    /// `zipf_alpha` ([`CYCLONE_ZIPF_ALPHA`] is the preset's), 20,000 clients starting a
    /// session every half second.
    pub fn cyclone(scale: f64, requests: u64, zipf_alpha: f64, seed: u64) -> Self {
        let scale = if scale.is_finite() {
            scale.clamp(1e-4, 1.0)
        } else {
            1.0
        };
        SynthConfig {
            seed,
            targets: Some(((CYCLONE_FILES as f64 * scale).round() as u64).max(10)),
            total_bytes: Some(((CYCLONE_BYTES as f64 * scale).round() as u64).max(10_000)),
            zipf_alpha,
            requests,
            clients: 20_000,
            session_interarrival_secs: 0.5,
            ..SynthConfig::default()
        }
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), TraceError> {
        let bad = |m: String| Err(TraceError::Config(m));
        match (self.targets, self.total_bytes) {
            (Some(0), _) => return bad("targets must be at least 1".into()),
            (_, Some(0)) => return bad("total bytes must be at least 1".into()),
            (Some(n), Some(b)) if b < n => {
                return bad(format!(
                    "total bytes ({b}) must be at least the number of targets ({n}): every file has at least one byte"
                ))
            }
            (Some(n), _) if n > u64::from(u32::MAX) => {
                return bad(format!("at most {} targets", u32::MAX))
            }
            _ => {}
        }
        if !(self.zipf_alpha.is_finite() && self.zipf_alpha >= 0.0) {
            return bad(format!("zipf alpha must be >= 0, got {}", self.zipf_alpha));
        }
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return bad(format!(
                "clients must be 1..={MAX_CLIENTS}, got {}",
                self.clients
            ));
        }
        if !(0..=4_102_444_800).contains(&self.start_time) {
            return bad("start time must be between 1970 and 2100".into());
        }
        if !(self.session_interarrival_secs.is_finite() && self.session_interarrival_secs > 0.0) {
            return bad("session inter-arrival time must be positive".into());
        }
        if self.max_file_bytes == 0 {
            return bad("max file bytes must be at least 1".into());
        }
        if !(self.max_think_secs.is_finite() && self.max_think_secs >= 0.0) {
            return bad("max think time must be >= 0".into());
        }
        if self.max_pages_per_session == 0 {
            return bad("max pages per session must be at least 1".into());
        }
        self.model.validate().map_err(TraceError::Config)
    }
}

/// What a file of the site is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// An HTML page.
    Page,
    /// An object embedded in a page.
    Object,
}

/// One file of the synthetic site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteFile {
    /// URL path, also the path below the document root.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Page or embedded object.
    pub kind: FileKind,
    /// For a page, the indices (into [`Site::files`]) of its embedded objects.
    pub embedded: Vec<u32>,
}

/// The synthetic site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Site {
    /// Every file; a page is followed by its embedded objects.
    pub files: Vec<SiteFile>,
    /// Indices of the pages.
    pub pages: Vec<u32>,
}

/// A generated site and trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Synthesis {
    /// The configuration it came from.
    pub config: SynthConfig,
    /// The site.
    pub site: Site,
    /// The trace: targets are the site's files, in the same order (so
    /// request `target` ids index [`Site::files`] too); clients are every
    /// possible client.
    pub workload: Workload,
    /// Sessions started.
    pub sessions: u64,
    /// Page requests made.
    pub page_views: u64,
}

/// Counts describing a [`Synthesis`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SynthSummary {
    /// The seed.
    pub seed: u64,
    /// Files in the site.
    pub files: u64,
    /// Pages.
    pub pages: u64,
    /// Embedded objects.
    pub objects: u64,
    /// Total size of the site.
    pub site_bytes: u64,
    /// Largest file.
    pub largest_file: u64,
    /// Requests in the trace.
    pub requests: u64,
    /// Sessions started.
    pub sessions: u64,
    /// Page requests.
    pub page_views: u64,
    /// Time of the first request.
    pub first_time: Option<i64>,
    /// Time of the last request.
    pub last_time: Option<i64>,
}

fn rng_for(seed: u64, stream: u64) -> ChaCha20Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..24].copy_from_slice(b"switchyard-trace");
    let mut rng = ChaCha20Rng::from_seed(key);
    rng.set_stream(stream);
    rng
}

fn client_address(c: u32) -> String {
    let a = (198u32 << 24 | 18 << 16) + 1 + c;
    let [w, x, y, z] = a.to_be_bytes();
    format!("{w}.{x}.{y}.{z}")
}

fn page_path(i: usize) -> String {
    format!("/pages/{:04}/p{:07}.html", i / 1000, i)
}

fn object_path(i: usize, ext: &str) -> String {
    format!("/objects/{:04}/o{:07}.{ext}", i / 1000, i)
}

fn to_size(x: f64, max: u64) -> u64 {
    // `as` saturates; NaN cannot occur for validated parameters.
    (x.round() as u64).clamp(1, max)
}

/// Draws the site.
fn build_site(cfg: &SynthConfig) -> Site {
    let model = &cfg.model;
    let mut rng = rng_for(cfg.seed, STREAM_SITE);
    let max = cfg.max_file_bytes;
    let file_limit = match (cfg.targets, cfg.total_bytes) {
        (Some(n), _) => Some(n),
        (None, None) => Some(1000),
        (None, Some(_)) => None,
    };
    let byte_limit = if cfg.targets.is_none() {
        cfg.total_bytes
    } else {
        None
    };
    let mut files: Vec<SiteFile> = Vec::new();
    let mut pages: Vec<u32> = Vec::new();
    let mut sum = 0u64;
    let full = |files: &Vec<SiteFile>, sum: u64| {
        file_limit.is_some_and(|n| files.len() as u64 >= n) || byte_limit.is_some_and(|b| sum >= b)
    };
    // Fits a drawn size under the byte limit.
    let fit = |size: u64, sum: u64| match byte_limit {
        Some(b) => size.min(b - sum),
        None => size,
    };
    'site: while !full(&files, sum) {
        let page = files.len();
        let size = fit(
            to_size(model.html_size.sample(&mut rng, max as f64), max),
            sum,
        );
        sum += size;
        pages.push(page as u32);
        files.push(SiteFile {
            path: page_path(page),
            size,
            kind: FileKind::Page,
            embedded: Vec::new(),
        });
        let cap = f64::from(cfg.max_embedded) + 1.0;
        let count = (model
            .objects_per_page
            .sample_truncated(&mut rng, cap)
            .floor() as u32)
            .min(cfg.max_embedded);
        for _ in 0..count {
            if full(&files, sum) {
                break 'site;
            }
            let i = files.len();
            let size = fit(to_size(model.embedded_size.sample(&mut rng), max), sum);
            let ext = match below(&mut rng, 20) {
                0..=9 => "gif",
                10..=16 => "jpg",
                _ => "png",
            };
            sum += size;
            files.push(SiteFile {
                path: object_path(i, ext),
                size,
                kind: FileKind::Object,
                embedded: Vec::new(),
            });
            files[page].embedded.push(i as u32);
        }
    }
    if let (Some(_), Some(total)) = (cfg.targets, cfg.total_bytes) {
        scale_sizes(&mut files, total);
    }
    Site { files, pages }
}

/// Scales sizes by one factor so that they add up to `total` exactly
/// (each stays at least 1; `total >= files.len()`).
fn scale_sizes(files: &mut [SiteFile], total: u64) {
    let sum: u64 = files.iter().map(|f| f.size).sum();
    let factor = total as f64 / sum as f64;
    let mut fractions: Vec<(f64, usize)> = Vec::with_capacity(files.len());
    let mut new_sum = 0u64;
    for (i, f) in files.iter_mut().enumerate() {
        let x = f.size as f64 * factor;
        f.size = (x.floor() as u64).max(1);
        new_sum += f.size;
        fractions.push((x - x.floor(), i));
    }
    if new_sum < total {
        // Largest remainders first; ties by index.
        fractions.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut missing = total - new_sum;
        while missing > 0 {
            for &(_, i) in &fractions {
                if missing == 0 {
                    break;
                }
                files[i].size += 1;
                missing -= 1;
            }
        }
    } else if new_sum > total {
        // Only possible when many sizes were raised to 1: take from the largest.
        let mut by_size: Vec<usize> = (0..files.len()).collect();
        by_size.sort_by(|&a, &b| files[b].size.cmp(&files[a].size).then(a.cmp(&b)));
        let mut excess = new_sum - total;
        while excess > 0 {
            for &i in &by_size {
                if excess == 0 {
                    break;
                }
                if files[i].size > 1 {
                    files[i].size -= 1;
                    excess -= 1;
                }
            }
        }
    }
}

/// Generates the site and the trace.
pub fn synthesize(cfg: &SynthConfig) -> Result<Synthesis, TraceError> {
    cfg.validate()?;
    let model = &cfg.model;
    let site = build_site(cfg);

    // Popularity: rank r (0-based) has weight (r+1)^-alpha; ranks go to
    // pages in a random order.
    let mut pop = rng_for(cfg.seed, STREAM_POPULARITY);
    let mut by_rank = site.pages.clone();
    for i in (1..by_rank.len()).rev() {
        let j = below(&mut pop, i as u64 + 1) as usize;
        by_rank.swap(i, j);
    }
    let mut cumulative = Vec::with_capacity(by_rank.len());
    let mut acc = 0.0f64;
    for r in 0..by_rank.len() {
        acc += ((r + 1) as f64).powf(-cfg.zipf_alpha);
        cumulative.push(acc);
    }

    let mut rng = rng_for(cfg.seed, STREAM_SESSIONS);
    let want = cfg.requests as usize;
    let mut events: Vec<(i64, u32, u32)> = Vec::with_capacity(want);
    let mut t = cfg.start_time as f64;
    let (mut sessions, mut page_views) = (0u64, 0u64);
    while events.len() < want {
        t += exponential(&mut rng, cfg.session_interarrival_secs);
        sessions += 1;
        let client = below(&mut rng, u64::from(cfg.clients)) as u32;
        let n_pages = model
            .requests_per_session
            .sample(&mut rng)
            .round()
            .clamp(1.0, f64::from(cfg.max_pages_per_session)) as u32;
        let mut tp = t;
        for j in 0..n_pages {
            if j > 0 {
                tp += model
                    .think_time
                    .sample_truncated(&mut rng, cfg.max_think_secs);
            }
            let x = unit(&mut rng) * acc;
            let rank = cumulative
                .partition_point(|&c| c <= x)
                .min(by_rank.len() - 1);
            let page = by_rank[rank];
            page_views += 1;
            let sec = tp.floor() as i64;
            events.push((sec, client, page));
            for &obj in &site.files[page as usize].embedded {
                if events.len() >= want {
                    break;
                }
                events.push((sec, client, obj));
            }
            if events.len() >= want {
                break;
            }
        }
    }
    events.truncate(want);
    events.sort_by_key(|e| e.0);

    let workload = Workload {
        target_key: TargetKey::Path,
        clients: (0..cfg.clients).map(client_address).collect(),
        targets: site
            .files
            .iter()
            .map(|f| Target {
                path: f.path.clone(),
                size: f.size,
            })
            .collect(),
        methods: vec!["GET".to_owned()],
        protocols: vec!["HTTP/1.1".to_owned()],
        requests: events
            .iter()
            .map(|&(time, client, target)| Request {
                time,
                client,
                target,
                method: 0,
                protocol: Some(0),
                status: Some(200),
                bytes: Some(site.files[target as usize].size),
            })
            .collect(),
    };
    Ok(Synthesis {
        config: cfg.clone(),
        site,
        workload,
        sessions,
        page_views,
    })
}

impl Site {
    /// Total size of all files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Writes the content of file `index` (exactly its size in bytes) to `out`.
    ///
    /// Pages are HTML that reference as many of their embedded objects as
    /// their size allows, padded with pseudo-random text (a page smaller
    /// than the bare markup gets the markup cut short); objects are
    /// pseudo-random bytes.
    pub fn write_file(&self, index: usize, seed: u64, out: &mut impl Write) -> io::Result<()> {
        let file = &self.files[index];
        let mut rng = rng_for(seed, STREAM_CONTENT + index as u64);
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = file.size;
        let mut fill = |out: &mut dyn Write, mut n: u64, text: bool| -> io::Result<()> {
            const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz    \n ";
            while n > 0 {
                let k = n.min(buf.len() as u64) as usize;
                rng.fill_bytes(&mut buf[..k]);
                if text {
                    for b in &mut buf[..k] {
                        *b = ALPHABET[usize::from(*b & 31)];
                    }
                }
                out.write_all(&buf[..k])?;
                n -= k as u64;
            }
            Ok(())
        };
        match file.kind {
            FileKind::Object => fill(out, left, false),
            FileKind::Page => {
                let mut head = format!(
                    "<!DOCTYPE html>\n<html><head><title>Page {index}</title></head><body>\n<h1>Page {index}</h1>\n<p>\n"
                );
                let tail = "\n</p>\n</body></html>\n";
                // As many references to the embedded objects as the size allows.
                for &o in &file.embedded {
                    let img = format!("<img src=\"{}\" alt=\"\">\n", self.files[o as usize].path);
                    if (head.len() + img.len() + tail.len()) as u64 > left {
                        break;
                    }
                    head.push_str(&img);
                }
                let markup = (head.len() + tail.len()) as u64;
                if left < markup {
                    let all = head + tail;
                    return out.write_all(&all.as_bytes()[..left as usize]);
                }
                out.write_all(head.as_bytes())?;
                left -= markup;
                fill(out, left, true)?;
                out.write_all(tail.as_bytes())
            }
        }
    }
}

impl Synthesis {
    /// Counts describing the site and trace.
    pub fn summary(&self) -> SynthSummary {
        let w = &self.workload;
        SynthSummary {
            seed: self.config.seed,
            files: self.site.files.len() as u64,
            pages: self.site.pages.len() as u64,
            objects: (self.site.files.len() - self.site.pages.len()) as u64,
            site_bytes: self.site.total_bytes(),
            largest_file: self.site.files.iter().map(|f| f.size).max().unwrap_or(0),
            requests: w.requests.len() as u64,
            sessions: self.sessions,
            page_views: self.page_views,
            first_time: w.requests.first().map(|r| r.time),
            last_time: w.requests.last().map(|r| r.time),
        }
    }

    /// Writes every file of the site below `root`, creating directories.
    ///
    /// `root` must not exist or be an empty directory, unless `force` is set
    /// (then files are written over; nothing is deleted).
    pub fn write_docroot(&self, root: &Path, force: bool) -> Result<(), TraceError> {
        let wrap = |path: &Path| {
            let path: PathBuf = path.to_owned();
            move |source| TraceError::Write { path, source }
        };
        if !force {
            crate::ensure_empty(root)?;
        }
        let dirs: BTreeSet<PathBuf> = self
            .site
            .files
            .iter()
            .filter_map(|f| {
                Path::new(f.path.trim_start_matches('/'))
                    .parent()
                    .map(|p| root.join(p))
            })
            .collect();
        fs::create_dir_all(root).map_err(wrap(root))?;
        for d in &dirs {
            fs::create_dir_all(d).map_err(wrap(d))?;
        }
        for (i, f) in self.site.files.iter().enumerate() {
            let path = root.join(f.path.trim_start_matches('/'));
            let file = File::create(&path).map_err(wrap(&path))?;
            let mut out = BufWriter::with_capacity(64 * 1024, file);
            self.site
                .write_file(i, self.config.seed, &mut out)
                .and_then(|()| out.flush())
                .map_err(wrap(&path))?;
        }
        Ok(())
    }

    /// Writes the trace as a Common Log Format file.
    pub fn write_trace(&self, path: &Path) -> Result<(), TraceError> {
        self.workload.save_log(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SynthConfig {
        SynthConfig {
            targets: Some(300),
            requests: 3000,
            clients: 20,
            ..SynthConfig::default()
        }
    }

    #[test]
    fn site_shape() {
        let s = synthesize(&cfg()).unwrap();
        assert_eq!(s.site.files.len(), 300);
        assert_eq!(s.site.files[0].kind, FileKind::Page);
        let objects: usize = s
            .site
            .pages
            .iter()
            .map(|&p| s.site.files[p as usize].embedded.len())
            .sum();
        assert_eq!(objects + s.site.pages.len(), 300);
        for &p in &s.site.pages {
            for &o in &s.site.files[p as usize].embedded {
                assert_eq!(s.site.files[o as usize].kind, FileKind::Object);
            }
        }
        assert!(s
            .site
            .files
            .iter()
            .all(|f| f.size >= 1 && f.size <= 64 << 20));
        // About 1 page per 8 objects (mean of the truncated Pareto is ~6–8).
        assert!(
            s.site.pages.len() > 20 && s.site.pages.len() < 100,
            "{}",
            s.site.pages.len()
        );
    }

    #[test]
    fn trace_shape() {
        let s = synthesize(&cfg()).unwrap();
        let w = &s.workload;
        assert_eq!(w.requests.len(), 3000);
        assert!(w.requests.windows(2).all(|p| p[0].time <= p[1].time));
        assert!(w.requests[0].time >= DEFAULT_START_TIME);
        assert!(s.page_views > 0 && s.sessions > 0);
        // Every page view is followed by its objects in the same second.
        assert!(w
            .requests
            .iter()
            .all(|r| r.bytes == Some(w.targets[r.target as usize].size)));
        assert_eq!(w.clients[0], "198.18.0.1");
        assert_eq!(client_address(MAX_CLIENTS - 1), "198.19.255.254");
        let st = w.stats(5);
        assert_eq!(st.requests, 3000);
        assert!(st.top10_share > 0.3, "{}", st.top10_share);
    }

    #[test]
    fn total_bytes_only_and_both() {
        let c = SynthConfig {
            targets: None,
            total_bytes: Some(1_000_000),
            requests: 10,
            ..SynthConfig::default()
        };
        let s = synthesize(&c).unwrap();
        assert_eq!(s.site.total_bytes(), 1_000_000);
        let c = SynthConfig {
            targets: Some(500),
            total_bytes: Some(5 << 20),
            ..c
        };
        let s = synthesize(&c).unwrap();
        assert_eq!(s.site.files.len(), 500);
        assert_eq!(s.site.total_bytes(), 5 << 20);
        // Tight total: every file gets a byte or two.
        let c = SynthConfig {
            targets: Some(500),
            total_bytes: Some(600),
            ..c
        };
        let s = synthesize(&c).unwrap();
        assert_eq!(s.site.total_bytes(), 600);
        assert!(s.site.files.iter().all(|f| f.size >= 1));
    }

    #[test]
    fn zipf_alpha_controls_concentration() {
        let flat = synthesize(&SynthConfig {
            zipf_alpha: 0.0,
            ..cfg()
        })
        .unwrap();
        let steep = synthesize(&SynthConfig {
            zipf_alpha: 1.5,
            ..cfg()
        })
        .unwrap();
        assert!(flat.workload.stats(1).top10_share < steep.workload.stats(1).top10_share);
    }

    #[test]
    fn rejects_bad_configs() {
        for c in [
            SynthConfig {
                targets: Some(0),
                ..cfg()
            },
            SynthConfig {
                targets: Some(10),
                total_bytes: Some(9),
                ..cfg()
            },
            SynthConfig {
                clients: 0,
                ..cfg()
            },
            SynthConfig {
                clients: MAX_CLIENTS + 1,
                ..cfg()
            },
            SynthConfig {
                zipf_alpha: f64::NAN,
                ..cfg()
            },
            SynthConfig {
                session_interarrival_secs: 0.0,
                ..cfg()
            },
        ] {
            assert!(
                matches!(synthesize(&c), Err(TraceError::Config(_))),
                "{c:?}"
            );
        }
    }

    #[test]
    fn file_content_has_exact_size() {
        let s = synthesize(&cfg()).unwrap();
        for i in 0..s.site.files.len() {
            let mut v = Vec::new();
            s.site.write_file(i, 1, &mut v).unwrap();
            assert_eq!(v.len() as u64, s.site.files[i].size, "file {i}");
        }
        let page = s.site.pages[0] as usize;
        let mut v = Vec::new();
        s.site.write_file(page, 1, &mut v).unwrap();
        let text = String::from_utf8(v).unwrap();
        if s.site.files[page].size > 600 {
            assert!(text.starts_with("<!DOCTYPE html>"));
            assert!(text.ends_with("</html>\n"));
        }
    }
}
