//! `switchyard load`: an HTTP/1.x load generator for measuring web servers and clusters.
//!
//! It drives a server in four ways:
//!
//! * **closed loop** over one URL with `C` connections, like wrk (optionally pipelined);
//! * **trace replay** in log order over `C` connections, like the replaying http_load of
//!   seed 000 §5.1 (each connection takes the next request of the log);
//! * **session replay**: HTTP/1.1 connections reconstructed from a log (seed 003 §6), each
//!   sending its pipelined batches in order, with think times between batches;
//! * **open loop** rate profiles (`rate:secs` steps): requests are issued on schedule whatever
//!   the server does, each with a timeout (7 s by default); a step in which more than 10% of
//!   the requests time out overloads the server, which gives R_max and D_max (seed 001 §6.2).
//!
//! It follows redirects (counted), speaks HTTP/1.0 or 1.1, and reports requests/s, MB/s,
//! latency percentiles to the first and to the last byte (HdrHistogram), statuses, errors by
//! kind and timeouts, plus a per-second time series (CSV, JSON, SVG plot) and a live progress
//! line on a terminal.
//!
//! Worker threads each own their share of the connections. The closed loop over one URL runs
//! on io_uring where the kernel offers it (module `uring`): a thread submits the next requests of
//! all its connections and collects their responses in one system call, and sleeps until a
//! share of them is in rather than waking for each. Everything else (and that loop too, with
//! `--io epoll` or on older kernels) runs on a single-threaded tokio runtime per thread.
//! Requests are rendered before the run and buffers are reused, so the closed loop does no
//! per-request allocation. [`cli::run`] is the command-line entry point;
//! [`run_load`] runs a [`LoadConfig`] built in code.

#![warn(missing_docs)]

pub mod cli;
mod config;
mod engine;
mod moderation;
mod report;
pub mod request;
pub mod response;
mod run;
mod stats;
pub mod svg;
pub mod trace_input;
mod uring;

pub use config::{
    default_threads, parse_duration, Arrival, IoEngine, LoadConfig, RateProfile, RateStep,
    ReplayRequest, Session, ThinkTime, Workload,
};
pub use report::{
    capacity, Capacity, CpuUsage, LatencyStats, StepSummary, Summary, OVERLOAD_TIMEOUT_FRACTION,
};
pub use request::{HttpVersion, Url};
pub use run::run_load;
pub use stats::{ErrorKind, SeriesPoint};

/// Everything that can stop a load run before it starts, or make its output unwritable.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The target URL cannot be used.
    #[error("bad URL {0}")]
    BadUrl(String),
    /// Inconsistent or invalid options.
    #[error("{0}")]
    Config(String),
    /// The target host did not resolve.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        /// `host:port` looked up.
        host: String,
        /// Why.
        source: std::io::Error,
    },
    /// The trace or session file cannot be read or holds no usable request.
    #[error("trace {path}: {message}")]
    Trace {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// An output file cannot be written.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Starting a worker thread or runtime failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}
