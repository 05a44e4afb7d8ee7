//! Process plumbing shared by the subcommands: logging, the tokio
//! runtime, and waiting for a stop signal.

use std::time::Duration;

use tracing_subscriber::EnvFilter;

/// Install the tracing subscriber (`RUST_LOG` wins over `level`).
pub fn init_tracing(level: &str, format: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// A multi-threaded runtime with `workers` threads (0: one per core) for
/// the process's own chores; the servers run their own worker threads.
pub fn build(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if workers > 0 {
        b.worker_threads(workers);
    }
    Ok(b.enable_all().build()?)
}

/// Resolve when SIGINT or SIGTERM arrives, or after `limit` if given.
pub async fn stop_signal(limit: Option<Duration>) -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return "no signal handler",
    };
    let timer = async {
        match limit {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = timer => "duration elapsed",
    }
}
