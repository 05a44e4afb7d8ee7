//! Starting the workers, watching them, and summarising the run.

use std::io::{IsTerminal, Write};
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{IoEngine, LoadConfig, ThinkTime, Workload};
use crate::engine::{run_worker, Rendered, Shared};
use crate::report::{build_summary, RunInfo, Summary};
use crate::request::{validate_token, RequestTemplate};
use crate::stats::{Progress, SeriesAgg, Totals};
use crate::uring;
use crate::LoadError;

/// Delay between starting the worker threads and the common start instant.
const START_DELAY: Duration = Duration::from_millis(20);
/// Seconds a per-second slot stays open for late flushes before its percentiles are fixed.
const SERIES_LAG_S: u64 = 10;

/// Runs a load test described by `cfg` and returns its summary.
///
/// Starts one worker thread per share of the connections, on io_uring or on a
/// single-threaded tokio runtime (see [`IoEngine`]); blocks until the run is over.
pub fn run_load(cfg: &LoadConfig) -> Result<Summary, LoadError> {
    validate(cfg)?;
    let fixed = crate::engine::fixed_address(&cfg.resolve, &cfg.target.origin);
    let addr = match fixed {
        Some(a) => a,
        None => cfg
            .target
            .origin
            .socket_string()
            .to_socket_addrs()
            .map_err(|e| LoadError::Resolve {
                host: cfg.target.origin.socket_string(),
                source: e,
            })?
            .next()
            .ok_or_else(|| LoadError::Resolve {
                host: cfg.target.origin.socket_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
            })?,
    };
    let template = RequestTemplate {
        version: cfg.version,
        keep_alive: cfg.keep_alive,
        host: cfg
            .host
            .clone()
            .unwrap_or_else(|| cfg.target.origin.host_header()),
        headers: cfg.headers.clone(),
    };
    let rendered = Rendered::build(cfg, &template);
    let open_loop = cfg.rate_profile.is_some();
    let threads = if open_loop {
        cfg.threads.max(1)
    } else {
        cfg.threads.clamp(1, cfg.connections.max(1))
    };
    let uring = use_uring(cfg)?;
    let fd_limit = raise_fd_limit();
    let max_inflight = if cfg.max_inflight > 0 {
        cfg.max_inflight
    } else {
        (fd_limit.saturating_sub(64) as usize).clamp(64, 1 << 20)
    };
    let request_log = match &cfg.request_log {
        Some(p) => {
            let mut f = std::fs::File::create(p).map_err(|e| LoadError::Output {
                path: p.display().to_string(),
                source: e,
            })?;
            f.write_all(
                b"issue_us,method,path,status,body_bytes,first_byte_us,complete_us,outcome\n",
            )
            .map_err(|e| LoadError::Output {
                path: p.display().to_string(),
                source: e,
            })?;
            Some(Mutex::new(f))
        }
        None => None,
    };
    let start = Instant::now() + START_DELAY;
    let end = if open_loop {
        None
    } else {
        cfg.duration.map(|d| start + d)
    };
    let series = Arc::new(Mutex::new(SeriesAgg::default()));
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        addr,
        template,
        rendered,
        next: AtomicUsize::new(0),
        budget: cfg
            .requests
            .map(|n| AtomicI64::new(n.min(i64::MAX as u64) as i64)),
        start,
        end,
        series: series.clone(),
        request_log,
        max_inflight_per_thread: max_inflight.div_ceil(threads).max(1),
        log_failed: AtomicBool::new(false),
    });

    let cpu_before = cpu_times();
    let mut handles = Vec::with_capacity(threads);
    let mut progresses = Vec::with_capacity(threads);
    for i in 0..threads {
        let conns = cfg.connections / threads + usize::from(i < cfg.connections % threads);
        let progress = Arc::new(Progress::default());
        progresses.push(progress.clone());
        let shared = shared.clone();
        let h = std::thread::Builder::new()
            .name(format!("load-{i}"))
            .spawn(move || {
                if uring {
                    uring::run_worker(shared, progress, conns)
                } else {
                    run_worker(shared, progress, i, threads, conns)
                }
            })
            .map_err(LoadError::Io)?;
        handles.push(h);
    }

    let show = cfg.progress && std::io::stderr().is_terminal();
    let mut last = (Instant::now(), 0u64, 0u64);
    let mut last_print = Instant::now();
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(start).as_secs();
        if let Ok(mut s) = series.lock() {
            s.finish_before(elapsed.saturating_sub(SERIES_LAG_S));
        }
        if show && now.duration_since(last_print) >= Duration::from_secs(1) {
            last_print = now;
            let (mut req, mut bytes, mut errs, mut tmo) = (0, 0, 0, 0);
            for p in &progresses {
                let (a, b, c, d) = p.snapshot();
                req += a;
                bytes += b;
                errs += c;
                tmo += d;
            }
            let dt = now.duration_since(last.0).as_secs_f64().max(1e-3);
            let rps = (req - last.1) as f64 / dt;
            let mbps = (bytes - last.2) as f64 / dt / 1e6;
            last = (now, req, bytes);
            let _ = write!(
                std::io::stderr(),
                "\r\x1b[K[{:>5.0}s] {:>10.0} req/s {:>8.2} MB/s  total {}  errors {}  timeouts {}",
                now.saturating_duration_since(start).as_secs_f64(),
                rps,
                mbps,
                req,
                errs,
                tmo
            );
        }
    }
    if show {
        let _ = write!(std::io::stderr(), "\r\x1b[K");
    }
    let mut finished = start;
    let mut totals = Totals::new(cfg.rate_profile.as_ref().map_or(0, |p| p.steps.len()));
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok((t, done))) => {
                totals.merge(&t);
                finished = finished.max(done);
            }
            Ok(Err(e)) => failure = Some(LoadError::Io(e)),
            Err(_) => failure = Some(LoadError::Config("a worker thread panicked".into())),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let cpu_after = cpu_times();
    let elapsed_s = match &cfg.rate_profile {
        Some(p) => p.total().as_secs_f64(),
        // Responses completing after the end are not counted, so the run lasts at most
        // the duration asked for.
        None => end
            .map_or(finished, |e| finished.min(e))
            .saturating_duration_since(start)
            .as_secs_f64(),
    };
    let series = series
        .lock()
        .map(|mut s| std::mem::take(&mut *s))
        .unwrap_or_default()
        .into_points(elapsed_s.ceil() as u64);
    let shared_cfg = &shared.cfg;
    let mode = match (&shared_cfg.workload, open_loop) {
        (_, true) => "open",
        (Workload::Url, false) => "closed",
        (Workload::Trace(_), false) => "trace",
        (Workload::Sessions(_), false) => "sessions",
    };
    let url = match shared_cfg.workload {
        Workload::Url => format!(
            "http://{}{}",
            shared_cfg.target.origin.host_header(),
            shared_cfg.target.path
        ),
        _ => format!("http://{}", shared_cfg.target.origin.host_header()),
    };
    let summary = build_summary(
        RunInfo {
            mode,
            url,
            protocol: cfg.version,
            connections: cfg.connections,
            threads,
            io: if uring { "io_uring" } else { "epoll" },
            elapsed_s,
            timeout_s: cfg.timeout.as_secs_f64(),
            profile: cfg.rate_profile.as_ref(),
            cpu: (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1),
        },
        &totals,
        series,
    );
    if shared.log_failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(LoadError::Output {
            path: cfg
                .request_log
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            source: std::io::Error::other("writing the request log failed"),
        });
    }
    Ok(summary)
}

/// Whether the run goes on io_uring (see [`IoEngine`]).
fn use_uring(cfg: &LoadConfig) -> Result<bool, LoadError> {
    match cfg.io {
        IoEngine::Epoll => Ok(false),
        IoEngine::Auto => Ok(uring::unsupported(cfg).is_none() && uring::probe().is_ok()),
        IoEngine::Uring => {
            if let Some(what) = uring::unsupported(cfg) {
                return Err(LoadError::Config(format!(
                    "--io uring runs the closed loop over one URL, not {what}; use --io auto or epoll"
                )));
            }
            uring::probe().map_err(|e| {
                LoadError::Config(format!(
                    "--io uring: this kernel offers no usable io_uring: {e}"
                ))
            })?;
            Ok(true)
        }
    }
}

fn validate(cfg: &LoadConfig) -> Result<(), LoadError> {
    let err = |m: &str| Err(LoadError::Config(m.to_owned()));
    if cfg.connections == 0 {
        return err("--connections must be at least 1");
    }
    if cfg.pipeline == 0 {
        return err("--pipeline must be at least 1");
    }
    if cfg.timeout.is_zero() {
        return err("--timeout must be positive");
    }
    validate_token("method", &cfg.method)?;
    validate_token("URL path", &cfg.target.path)?;
    if let Some(h) = &cfg.host {
        validate_token("Host", h)?;
    }
    match &cfg.workload {
        Workload::Url => {
            if cfg.rate_profile.is_none() && cfg.duration.is_none() && cfg.requests.is_none() {
                return err("a URL run needs --duration or --requests");
            }
        }
        Workload::Trace(reqs) => {
            if reqs.is_empty() {
                return err("the trace has no requests");
            }
            for r in reqs {
                validate_token("method", &r.method)?;
                validate_token("request target", &r.path)?;
            }
        }
        Workload::Sessions(sessions) => {
            if cfg.rate_profile.is_some() {
                return err(
                    "a rate profile cannot drive session replay (sessions are closed-loop)",
                );
            }
            if sessions
                .iter()
                .all(|s| s.batches.iter().all(|b| b.is_empty()))
            {
                return err("the sessions have no requests");
            }
            for r in sessions.iter().flat_map(|s| s.batches.iter().flatten()) {
                validate_token("method", &r.method)?;
                validate_token("request target", &r.path)?;
            }
        }
    }
    if cfg.pipeline > 1 && !matches!(cfg.workload, Workload::Url) {
        return err("--pipeline applies to URL runs (sessions pipeline their own batches)");
    }
    if cfg.pipeline > 1 && cfg.rate_profile.is_some() {
        return err("--pipeline applies to closed-loop runs");
    }
    if let ThinkTime::Trace(s) = cfg.think_time {
        if !matches!(cfg.workload, Workload::Sessions(_)) || !s.is_finite() || s < 0.0 {
            return err("recorded think times need session replay and a non-negative scale");
        }
    }
    if let Some(p) = &cfg.rate_profile {
        if p.steps.is_empty() {
            return err("empty rate profile");
        }
    }
    Ok(())
}

/// Raises the soft open-files limit to the hard one; returns the soft limit in force.
fn raise_fd_limit() -> libc::rlim_t {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max.min(1 << 20),
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim.rlim_cur = want.rlim_cur;
            }
        }
        lim.rlim_cur
    }
}

/// User and system CPU seconds used by this process so far.
fn cpu_times() -> (f64, f64) {
    // SAFETY: getrusage writes into the zeroed struct passed to it.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return (0.0, 0.0);
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        (tv(ru.ru_utime), tv(ru.ru_stime))
    }
}
