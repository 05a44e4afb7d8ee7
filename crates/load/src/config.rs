//! Run configuration: what to request, how fast and for how long.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::request::{HttpVersion, Url};
use crate::LoadError;

/// One request of a replayed trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayRequest {
    /// Method token (`GET`, `HEAD`, …).
    pub method: String,
    /// Request target (path and query), starting with `/`.
    pub path: String,
    /// `Host` header for this request; the run's default when `None`.
    pub host: Option<String>,
}

impl ReplayRequest {
    /// A `GET` of `path` with the run's default `Host`.
    pub fn get(path: impl Into<String>) -> Self {
        ReplayRequest {
            method: "GET".to_owned(),
            path: path.into(),
            host: None,
        }
    }
}

/// One client connection of a session replay: batches of pipelined requests.
///
/// All requests of a batch are written at once; the next batch is sent only after every
/// response of the previous one has arrived (and the think time has passed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    /// Pipelined batches, in order.
    pub batches: Vec<Vec<ReplayRequest>>,
    /// Recorded pause before each batch after the first (`think_times[i]` precedes batch
    /// `i + 1`); missing entries mean no pause. Used with [`ThinkTime::Trace`].
    pub think_times: Vec<Duration>,
}

/// What the generator requests.
#[derive(Debug, Clone, Default)]
pub enum Workload {
    /// The target URL, over and over (like wrk).
    #[default]
    Url,
    /// Requests in log order, spread over the connections (like a replaying http_load).
    Trace(Vec<ReplayRequest>),
    /// HTTP/1.1 sessions with pipelined batches, one session per connection at a time.
    Sessions(Vec<Session>),
}

/// One step of an open-loop rate profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateStep {
    /// Requests per second to issue.
    pub rate: f64,
    /// How long to issue them.
    pub duration: Duration,
}

/// A list of open-loop rate steps, run in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RateProfile {
    /// The steps.
    pub steps: Vec<RateStep>,
}

impl RateProfile {
    /// Parses `"rate:duration,rate:duration,…"`, e.g. `"100:10,200:10s,400:500ms"`.
    pub fn parse(s: &str) -> Result<RateProfile, LoadError> {
        let mut steps = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (rate, dur) = part.split_once(':').ok_or_else(|| {
                LoadError::Config(format!("rate step {part:?} is not RATE:DURATION"))
            })?;
            let rate: f64 = rate
                .trim()
                .parse()
                .map_err(|_| LoadError::Config(format!("bad rate in {part:?}")))?;
            if !rate.is_finite() || rate < 0.0 {
                return Err(LoadError::Config(format!("bad rate in {part:?}")));
            }
            let duration = parse_duration(dur)?;
            steps.push(RateStep { rate, duration });
        }
        if steps.is_empty() {
            return Err(LoadError::Config("empty rate profile".into()));
        }
        Ok(RateProfile { steps })
    }

    /// Total length of the profile.
    pub fn total(&self) -> Duration {
        self.steps.iter().map(|s| s.duration).sum()
    }
}

/// How open-loop requests are spaced in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arrival {
    /// Evenly spaced.
    #[default]
    Uniform,
    /// Poisson process (exponential gaps), seeded.
    Poisson,
}

/// Pause between consecutive requests (or batches) of one connection in closed-loop modes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ThinkTime {
    /// Send the next request as soon as the previous response is in.
    #[default]
    None,
    /// A fixed pause.
    Fixed(Duration),
    /// The pauses recorded in the sessions, multiplied by this factor.
    Trace(f64),
}

/// Full description of a load run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Server to load (for traces and sessions: the origin; their paths replace the URL's).
    pub target: Url,
    /// What to request.
    pub workload: Workload,
    /// Concurrent connections (closed loop) or session slots.
    pub connections: usize,
    /// Worker threads, each a single-threaded runtime owning its share of connections.
    pub threads: usize,
    /// How long to run; `None` runs until the trace or request budget is used up.
    pub duration: Option<Duration>,
    /// Stop after this many requests.
    pub requests: Option<u64>,
    /// Open-loop rate profile; closed loop when `None`.
    pub rate_profile: Option<RateProfile>,
    /// Open-loop spacing of requests.
    pub arrival: Arrival,
    /// Per-request timeout, from sending the request to its last response byte.
    pub timeout: Duration,
    /// Protocol version.
    pub version: HttpVersion,
    /// Ask for persistent connections.
    pub keep_alive: bool,
    /// Method for URL workloads.
    pub method: String,
    /// `Host` header override.
    pub host: Option<String>,
    /// Extra request header fields.
    pub headers: Vec<(String, String)>,
    /// Requests written at once per connection in URL closed-loop mode.
    pub pipeline: usize,
    /// Pause between requests or batches of a connection (closed loop).
    pub think_time: ThinkTime,
    /// Redirects followed per request; 0 disables following.
    pub max_redirects: u32,
    /// Start the trace again when it is used up (until the duration ends).
    pub loop_trace: bool,
    /// Most open-loop requests in flight per run; later ones are counted as client-limited.
    pub max_inflight: usize,
    /// Write one CSV line per request to this file.
    pub request_log: Option<PathBuf>,
    /// Show a live progress line on standard error (only if it is a terminal).
    pub progress: bool,
    /// Seed for Poisson arrivals.
    pub seed: u64,
    /// Fixed addresses for `host:port` names, used instead of the resolver (like curl's
    /// `--resolve`): for the target and for the hosts redirects lead to.
    pub resolve: Vec<(String, SocketAddr)>,
    /// Local address connections are made from (the kernel's choice when `None`).
    pub local_addr: Option<IpAddr>,
    /// Trace replay: connect round robin to these addresses instead of the target's (as a
    /// layer-4 director's round robin spreads connections over nodes): a connection opened for
    /// request `i` of the trace (or for a session whose first request is `i`) goes to address
    /// `i mod n`. Empty: every connection goes to the target.
    pub spread: Vec<SocketAddr>,
    /// Which event loop drives the connections.
    pub io: IoEngine,
}

/// The event loop behind the connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoEngine {
    /// io_uring for the closed loop over the target URL, one request at a time per
    /// connection, when the kernel offers it (Linux 6.12 and later); tokio's epoll loop
    /// otherwise.
    #[default]
    Auto,
    /// io_uring; the run fails if the kernel or the workload does not allow it.
    Uring,
    /// tokio's epoll loop, for every workload.
    Epoll,
}

impl LoadConfig {
    /// A closed-loop URL run with the defaults of the command line.
    pub fn new(target: Url) -> Self {
        LoadConfig {
            target,
            workload: Workload::Url,
            connections: 10,
            threads: default_threads(),
            duration: Some(Duration::from_secs(10)),
            requests: None,
            rate_profile: None,
            arrival: Arrival::Uniform,
            timeout: Duration::from_secs(7),
            version: HttpVersion::Http11,
            keep_alive: true,
            method: "GET".to_owned(),
            host: None,
            headers: Vec::new(),
            pipeline: 1,
            think_time: ThinkTime::None,
            max_redirects: 5,
            loop_trace: false,
            max_inflight: 0,
            request_log: None,
            progress: false,
            seed: 1,
            resolve: Vec::new(),
            local_addr: None,
            spread: Vec::new(),
            io: IoEngine::Auto,
        }
    }
}

/// Number of worker threads used by default: the number of cores.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Parses `"7s"`, `"250ms"`, `"1.5s"`, `"2m"`, `"1h"`, `"100us"`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, LoadError> {
    let s = s.trim();
    let bad = || LoadError::Config(format!("bad duration {s:?}"));
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| bad())?;
    let scale = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    let secs = value * scale;
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("7s").unwrap(), Duration::from_secs(7));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1").is_err());
    }

    #[test]
    fn rate_profiles() {
        let p = RateProfile::parse("100:10, 200:500ms").unwrap();
        assert_eq!(p.steps.len(), 2);
        assert_eq!(p.steps[0].rate, 100.0);
        assert_eq!(p.steps[1].duration, Duration::from_millis(500));
        assert_eq!(p.total(), Duration::from_millis(10_500));
        assert!(RateProfile::parse("").is_err());
        assert!(RateProfile::parse("100").is_err());
        assert!(RateProfile::parse("-1:1").is_err());
    }
}
