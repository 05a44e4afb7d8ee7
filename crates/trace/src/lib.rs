//! Access logs and workloads for switchyard: parsing, statistics, HTTP/1.1
//! connection reconstruction and synthetic workloads.
//!
//! * [`parse_line`], [`parse_reader`]: Common and Combined Log Format,
//!   including HTTP/0.9-style request lines with no version. Every line is
//!   accounted for in a [`ParseReport`]: records, skipped lines and invalid
//!   lines by reason, and records that needed a repair.
//! * [`TraceStats`]: requests, unique targets, total and mean size,
//!   concentration of references (the cumulative curves of seed 000 Fig. 10
//!   and the share of requests to the most popular 10 % of targets) and the
//!   memory needed to cover 97/98/99 % of requests (seed 003 §6), computed in
//!   one streaming pass.
//! * [`Workload`]: a trace with interned clients and targets, for replay and
//!   simulation; written back as Common Log Format.
//! * [`group_connections`]: requests grouped into persistent HTTP/1.1
//!   connections (same client, gaps under 15 s) and pipelined batches (gaps
//!   under 5 s), the heuristic of seed 003 §6.
//! * [`synthesize`]: a synthetic site (document root with files of exact
//!   sizes) and trace with Zipf-like popularity and the session, think-time,
//!   objects-per-page and size distributions of seed 004 Table 1; the same
//!   seed gives the same bytes.
//! * [`cli`]: the `switchyard trace` subcommands.
//!
//! **Targets.** A record keeps the request target exactly as logged. The
//! statistics and workloads tell targets apart by their path by default
//! ([`TargetKey::Path`]: scheme and host of absolute-form targets, query
//! string and fragment removed, no percent-decoding), because a static
//! document is named by its path; [`TargetKey::Full`] keeps the query string.
//! A target's size is the largest byte count logged for it, since partial,
//! not-modified and aborted responses log less (or `-`).
//!
//! **Time.** Log timestamps are converted to Unix seconds using the zone
//! offset they carry. Nothing in this crate reads a clock; file I/O happens
//! only in the thin functions that open a log or write a document root or
//! trace ([`open_log`], [`Workload::open`], [`Workload::save_log`],
//! [`Synthesis::write_docroot`], [`Synthesis::write_trace`]).

use std::io;
use std::path::PathBuf;

pub mod cli;
pub mod dist;
mod hash;
pub mod parse;
pub mod record;
pub mod root;
pub mod session;
pub mod stats;
pub mod synth;
pub mod time;
pub mod workload;

pub use dist::WorkloadModel;
pub use parse::{
    open_log, parse_line, parse_reader, InvalidReason, LineOutcome, LogReader, ParseReport,
    RepairReason, Repairs, SkipReason,
};
pub use record::{target_path, LogRecord, RecordRef, TargetKey};
pub use session::{group_connections, Batch, Connection, SessionConfig, SessionStats};
pub use stats::{StatsBuilder, StatsOptions, TraceStats};
pub use synth::{synthesize, Site, SiteFile, SynthConfig, Synthesis};
pub use workload::{Request, Target, Workload, WorkloadBuilder};

/// Errors of the trace tools.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Another I/O error (standard input or output).
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// An invalid option or configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A document root would be written into a non-empty directory.
    #[error("{} exists and is not empty (use --force to write into it anyway)", path.display())]
    NotEmpty {
        /// The directory.
        path: PathBuf,
    },
    /// JSON output failed.
    #[error("cannot write JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Checks that `root` is absent or an empty directory, before a document root is written there.
pub(crate) fn ensure_empty(root: &std::path::Path) -> Result<(), TraceError> {
    match std::fs::read_dir(root) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(TraceError::NotEmpty {
                path: root.to_owned(),
            }),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(TraceError::Write {
            path: root.to_owned(),
            source,
        }),
    }
}
