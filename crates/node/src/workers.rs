//! Thread-per-core serving, shared by the node and the switch.
//!
//! One OS thread per listener, each running a single-threaded tokio
//! runtime: the accept loop runs until the stop signal, the listener is
//! closed, and the thread then waits for its own connections to finish, or
//! for the abort signal once the caller's grace period is over. A
//! connection holds a clone of the thread's [`Live`] handle while it is open.

use std::future::Future;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;

/// Held by every open connection of a worker; the worker drains until only
/// its own reference is left.
pub type Live = Arc<()>;

/// The running worker threads.
pub struct Workers {
    abort: watch::Sender<bool>,
    done: Vec<mpsc::Receiver<()>>,
}

impl Workers {
    /// Start one thread per listener, named `{name}-{index}`. On each,
    /// `accept(index, listener, live)` runs until `stop` turns true.
    pub fn spawn<A, Fut>(
        name: &str,
        listeners: Vec<std::net::TcpListener>,
        stop: watch::Receiver<bool>,
        accept: A,
    ) -> std::io::Result<Workers>
    where
        A: Fn(usize, TcpListener, Live) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let (abort, abort_rx) = watch::channel(false);
        let mut done = Vec::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            let (stop, abort_rx, accept) = (stop.clone(), abort_rx.clone(), accept.clone());
            // On failure the senders of the threads already started are
            // dropped with `abort`, which ends them.
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    run(i, listener, stop, abort_rx, accept);
                    let _ = tx.send(());
                })?;
            done.push(rx);
        }
        Ok(Workers { abort, done })
    }

    /// Wait up to `grace` for every worker to drain, then abort the rest
    /// and wait for them to drop what is left. Call after the stop signal.
    pub async fn finish(self, grace: Duration) {
        let Workers { abort, done } = self;
        // The workers run on their own threads; wait off the caller's runtime.
        let _ = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + grace;
            for w in &done {
                let left = deadline.saturating_duration_since(Instant::now());
                if w.recv_timeout(left).is_err() {
                    break;
                }
            }
            let _ = abort.send(true);
            for w in &done {
                let _ = w.recv_timeout(Duration::from_secs(5));
            }
        })
        .await;
    }
}

fn run<A, Fut>(
    index: usize,
    listener: std::net::TcpListener,
    mut stop: watch::Receiver<bool>,
    mut abort: watch::Receiver<bool>,
    accept: A,
) where
    A: Fn(usize, TcpListener, Live) -> Fut,
    Fut: Future<Output = ()>,
{
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot build a worker runtime");
            return;
        }
    };
    rt.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot register the listener");
                return;
            }
        };
        let live: Live = Arc::new(());
        // The listener closes when the accept loop is dropped.
        tokio::select! {
            _ = accept(index, listener, live.clone()) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
        while Arc::strong_count(&live) > 1 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                _ = abort.wait_for(|a| *a) => break,
            }
        }
    });
    // Dropping the runtime drops the connections that are left.
}
