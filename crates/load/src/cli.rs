//! Command-line interface: `switchyard load …`.
//!
//! ```text
//! switchyard load http://127.0.0.1:8080/index.html --connections 64 --duration 10 --json
//! switchyard load http://127.0.0.1:8080/ --rate-profile 500:10,1000:10,2000:10 --timeout 7s
//! switchyard load http://127.0.0.1:8080 --trace access.log --connections 38
//! switchyard load http://127.0.0.1:8080 --trace access.log --sessions --think-time trace
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{Arrival, IoEngine, LoadConfig, RateProfile, ThinkTime, Workload};
use crate::request::{parse_header, HttpVersion, Url};
use crate::trace_input::{load_trace, TraceOptions};
use crate::{parse_duration, LoadError, Summary};

fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// Spacing of open-loop requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ArrivalArg {
    /// Evenly spaced.
    Uniform,
    /// Poisson process.
    Poisson,
}

/// Event loop of the connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IoArg {
    /// io_uring for the closed loop over the URL where the kernel offers it, epoll otherwise.
    Auto,
    /// io_uring, or fail.
    Uring,
    /// tokio's epoll loop.
    Epoll,
}

/// Options of `switchyard load`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Target URL (http://host[:port]/path). With --trace, the server to replay against.
    #[arg(value_name = "URL")]
    pub url: String,

    /// Replay this access log (Common or Combined Log Format) in log order.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,

    /// With --trace: replay reconstructed HTTP/1.1 sessions with pipelined batches.
    #[arg(long, requires = "trace")]
    pub sessions: bool,

    /// Session grouping: a client's gap that closes its connection.
    #[arg(long, default_value = "15s", value_parser = duration_arg, value_name = "DURATION")]
    pub session_gap: Duration,

    /// Session grouping: a gap that starts a new pipelined batch.
    #[arg(long, default_value = "5s", value_parser = duration_arg, value_name = "DURATION")]
    pub batch_gap: Duration,

    /// Start the trace over when it is used up (until --duration ends).
    #[arg(long = "loop")]
    pub loop_trace: bool,

    /// Concurrent connections (closed loop) or session slots.
    #[arg(short = 'c', long, default_value_t = 10)]
    pub connections: usize,

    /// Worker threads [default: number of cores].
    #[arg(short = 't', long)]
    pub threads: Option<usize>,

    /// How long to run (e.g. 10, 30s, 2m) [default: 10s for URL runs, the whole trace otherwise].
    #[arg(short = 'd', long, value_parser = duration_arg, value_name = "DURATION")]
    pub duration: Option<Duration>,

    /// Stop after this many requests.
    #[arg(short = 'n', long)]
    pub requests: Option<u64>,

    /// Open loop: "rate:secs" steps, e.g. "100:10,200:10".
    #[arg(long, value_name = "RATE:SECS,...")]
    pub rate_profile: Option<String>,

    /// Open loop: request spacing.
    #[arg(long, value_enum, default_value = "uniform")]
    pub arrival: ArrivalArg,

    /// Open loop: most requests in flight [default: from the open-files limit].
    #[arg(long)]
    pub max_inflight: Option<usize>,

    /// Per-request timeout, from sending to the last response byte.
    #[arg(long, default_value = "7s", value_parser = duration_arg, value_name = "DURATION")]
    pub timeout: Duration,

    /// Speak HTTP/1.0 (one request per connection).
    #[arg(long = "http1.0")]
    pub http10: bool,

    /// HTTP/1.1 without persistent connections (sends Connection: close).
    #[arg(long)]
    pub no_keepalive: bool,

    /// Request method for URL runs.
    #[arg(short = 'm', long, default_value = "GET")]
    pub method: String,

    /// Host header to send (default: from the URL).
    #[arg(long)]
    pub host: Option<String>,

    /// Extra header, "Name: value" (repeatable).
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,

    /// URL runs: requests written at once on each connection.
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,

    /// Pause between a connection's requests (or batches): a duration, or "trace" to use the
    /// gaps recorded in the sessions.
    #[arg(long, value_name = "DURATION|trace")]
    pub think_time: Option<String>,

    /// Multiplier for recorded think times.
    #[arg(long, default_value_t = 1.0)]
    pub think_scale: f64,

    /// Redirects followed per request (0: do not follow).
    #[arg(long, default_value_t = 5)]
    pub max_redirects: u32,

    /// Use ADDR for HOST:PORT instead of resolving it (repeatable), like curl's --resolve:
    /// for the target and for the hosts redirects lead to. IPv6 addresses in brackets.
    #[arg(long, value_name = "HOST:PORT:ADDR")]
    pub resolve: Vec<String>,

    /// Event loop: io_uring for the closed loop over the URL where the kernel offers it
    /// (auto), or always tokio's epoll loop (epoll), or io_uring or fail (uring).
    #[arg(long, value_enum, default_value = "auto")]
    pub io: IoArg,

    /// Make connections from this local address.
    #[arg(long, value_name = "IP")]
    pub local_addr: Option<std::net::IpAddr>,

    /// With --trace: connect round robin to these addresses (comma separated) instead of the
    /// URL's, as a layer-4 director spreads connections over nodes: the connection opened for
    /// request i of the trace goes to address i mod n. With HTTP/1.0 every request opens one.
    #[arg(
        long,
        value_name = "ADDR,...",
        value_delimiter = ',',
        requires = "trace"
    )]
    pub spread: Vec<std::net::SocketAddr>,

    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,

    /// Write the per-second time series as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,

    /// Write the per-second time series as JSON.
    #[arg(long, value_name = "FILE")]
    pub series_json: Option<PathBuf>,

    /// Write an SVG plot of requests/s and p99 latency over time.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,

    /// Write one CSV line per request.
    #[arg(long, value_name = "FILE")]
    pub request_log: Option<PathBuf>,

    /// No live progress line.
    #[arg(short = 'q', long)]
    pub quiet: bool,

    /// Seed for Poisson arrivals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Turns command-line options into a [`LoadConfig`] (reading the trace, if any).
pub fn config_from_args(args: &LoadArgs) -> Result<LoadConfig, LoadError> {
    let target = Url::parse(&args.url)?;
    let mut cfg = LoadConfig::new(target);
    cfg.connections = args.connections;
    if let Some(t) = args.threads {
        if t == 0 {
            return Err(LoadError::Config("--threads must be at least 1".into()));
        }
        cfg.threads = t;
    }
    cfg.requests = args.requests;
    cfg.rate_profile = args
        .rate_profile
        .as_deref()
        .map(RateProfile::parse)
        .transpose()?;
    cfg.arrival = match args.arrival {
        ArrivalArg::Uniform => Arrival::Uniform,
        ArrivalArg::Poisson => Arrival::Poisson,
    };
    cfg.max_inflight = args.max_inflight.unwrap_or(0);
    cfg.timeout = args.timeout;
    cfg.version = if args.http10 {
        HttpVersion::Http10
    } else {
        HttpVersion::Http11
    };
    cfg.keep_alive = !args.http10 && !args.no_keepalive;
    cfg.method = args.method.clone();
    cfg.host = args.host.clone();
    for h in &args.headers {
        let (name, value) = parse_header(h)?;
        if name.eq_ignore_ascii_case("host") {
            cfg.host = Some(value);
        } else {
            cfg.headers.push((name, value));
        }
    }
    cfg.pipeline = args.pipeline;
    cfg.think_time = match args.think_time.as_deref() {
        None => ThinkTime::None,
        Some("trace") => ThinkTime::Trace(args.think_scale),
        Some(d) => ThinkTime::Fixed(parse_duration(d)?.mul_f64(args.think_scale.max(0.0))),
    };
    cfg.max_redirects = args.max_redirects;
    cfg.resolve = args
        .resolve
        .iter()
        .map(|r| parse_resolve(r))
        .collect::<Result<_, _>>()?;
    cfg.local_addr = args.local_addr;
    cfg.io = match args.io {
        IoArg::Auto => IoEngine::Auto,
        IoArg::Uring => IoEngine::Uring,
        IoArg::Epoll => IoEngine::Epoll,
    };
    cfg.spread = args.spread.clone();
    cfg.loop_trace = args.loop_trace;
    cfg.request_log = args.request_log.clone();
    cfg.progress = !args.quiet;
    cfg.seed = args.seed;
    if let Some(path) = &args.trace {
        let opts = TraceOptions {
            sessions: args.sessions,
            session_gap: args.session_gap,
            batch_gap: args.batch_gap,
        };
        cfg.workload = load_trace(path, &opts)?;
    }
    cfg.duration = match (args.duration, &cfg.workload) {
        (Some(d), _) => Some(d),
        (None, Workload::Url) if args.requests.is_none() => Some(Duration::from_secs(10)),
        (None, _) if args.loop_trace && args.requests.is_none() => Some(Duration::from_secs(10)),
        (None, _) => None,
    };
    Ok(cfg)
}

/// `HOST:PORT:ADDR` of `--resolve` as (`host:port`, address); ADDR an IPv4 address or an
/// IPv6 address in brackets.
fn parse_resolve(s: &str) -> Result<(String, std::net::SocketAddr), LoadError> {
    let bad = || LoadError::Config(format!("--resolve {s:?}: expected HOST:PORT:ADDR"));
    let (host, rest) = s.split_once(':').ok_or_else(bad)?;
    let (port, addr) = rest.split_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let ip: std::net::IpAddr = addr
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .unwrap_or(addr)
        .parse()
        .map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((
        format!("{host}:{port}"),
        std::net::SocketAddr::new(ip, port),
    ))
}

fn write_file(path: &Path, data: &str) -> Result<(), LoadError> {
    std::fs::write(path, data).map_err(|e| LoadError::Output {
        path: path.display().to_string(),
        source: e,
    })
}

/// Runs `switchyard load` with parsed options: prints the summary (text, or JSON with
/// `--json`) to `out`, writes the requested series files, and returns the summary.
pub fn run(args: &LoadArgs, out: &mut dyn std::io::Write) -> Result<Summary, LoadError> {
    let cfg = config_from_args(args)?;
    let summary = crate::run_load(&cfg)?;
    let text = if args.json {
        summary.to_json() + "\n"
    } else {
        summary.to_text()
    };
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| LoadError::Output {
            path: "<output>".into(),
            source: e,
        })?;
    if let Some(p) = &args.csv {
        write_file(p, &summary.series_csv())?;
    }
    if let Some(p) = &args.series_json {
        write_file(p, &summary.series_json())?;
    }
    if let Some(p) = &args.svg {
        let title = format!(
            "switchyard load: {} {} — {:.0} req/s",
            summary.mode, summary.url, summary.requests_per_sec
        );
        write_file(p, &crate::svg::render(&summary.series, &title))?;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        load: LoadArgs,
    }

    #[test]
    fn parses_wrk_like_arguments() {
        let c = Cmd::try_parse_from([
            "load",
            "http://127.0.0.1:8080/x",
            "--connections",
            "64",
            "--duration",
            "5",
            "--json",
            "--http1.0",
            "-H",
            "Host: v.example",
            "--rate-profile",
            "100:10,200:10",
            "--timeout",
            "2s",
        ])
        .unwrap();
        let cfg = config_from_args(&c.load).unwrap();
        assert_eq!(cfg.connections, 64);
        assert_eq!(cfg.duration, Some(Duration::from_secs(5)));
        assert_eq!(cfg.version, HttpVersion::Http10);
        assert!(!cfg.keep_alive);
        assert_eq!(cfg.host.as_deref(), Some("v.example"));
        assert_eq!(cfg.rate_profile.unwrap().steps.len(), 2);
        assert_eq!(cfg.timeout, Duration::from_secs(2));
        assert!(c.load.json);
    }

    #[test]
    fn defaults() {
        let c = Cmd::try_parse_from(["load", "127.0.0.1:1"]).unwrap();
        let cfg = config_from_args(&c.load).unwrap();
        assert_eq!(cfg.timeout, Duration::from_secs(7));
        assert_eq!(cfg.duration, Some(Duration::from_secs(10)));
        assert_eq!(cfg.max_redirects, 5);
        assert!(cfg.resolve.is_empty());
        assert_eq!(cfg.local_addr, None);
        assert!(cfg.keep_alive);
        assert!(Cmd::try_parse_from(["load", "x", "--sessions"]).is_err());
    }

    #[test]
    fn resolve_and_local_address() {
        let c = Cmd::try_parse_from([
            "load",
            "http://site.test:8080/",
            "--resolve",
            "site.test:8080:127.0.0.7",
            "--resolve",
            "v6.test:80:[::1]",
            "--local-addr",
            "127.0.0.5",
        ])
        .unwrap();
        let cfg = config_from_args(&c.load).unwrap();
        assert_eq!(
            cfg.resolve,
            vec![
                (
                    "site.test:8080".to_string(),
                    "127.0.0.7:8080".parse().unwrap()
                ),
                ("v6.test:80".to_string(), "[::1]:80".parse().unwrap()),
            ]
        );
        assert_eq!(cfg.local_addr, Some([127, 0, 0, 5].into()));
        for bad in [
            "site.test",
            "site.test:80",
            "site.test:x:127.0.0.1",
            ":80:127.0.0.1",
            "a:80:nope",
        ] {
            let c = Cmd::try_parse_from(["load", "x", "--resolve", bad]).unwrap();
            let e = config_from_args(&c.load).unwrap_err().to_string();
            assert!(e.contains("HOST:PORT:ADDR"), "{bad}: {e}");
        }
    }
}
