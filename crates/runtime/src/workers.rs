//! Thread-per-core serving, shared by the node and the switch.
//!
//! One OS thread per listener, each running a single-threaded tokio
//! runtime: the accept loop runs until the stop signal, the listener is
//! closed, and the thread then waits for its own connections to finish, or
//! for the abort signal once the caller's grace period is over. A
//! connection holds a clone of the thread's [`Live`] handle while it is open;
//! the last connection to drop its handle wakes the draining worker (no
//! polling).
//!
//! Before a worker sleeps for want of work it yields its CPU to any thread waiting for one
//! (`yield_before_sleep`): on shared cores that turns a wake-up per request into batches.
//!
//! A process may also give its workers a tidy function ([`tidy_with`]), which each calls once
//! every [`TIDY_EVERY`] while it runs: the binary uses it to have its allocator give back what
//! a burst of connections freed on a worker that then went quiet.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::accept::Listener;
use tokio::sync::{watch, Notify};
use tokio::time::MissedTickBehavior;

/// Held by every open connection of a worker; the worker drains until only
/// its own handle is left. Dropping the last handle but the worker's wakes
/// the worker.
#[derive(Debug)]
pub struct Live(Arc<LiveCount>);

#[derive(Debug, Default)]
struct LiveCount {
    /// Handles alive, the worker's own included.
    handles: AtomicUsize,
    /// Signalled when only one handle is left.
    alone: Notify,
}

impl Live {
    /// A worker's own handle: the first of its set.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Live {
        let count = LiveCount::default();
        count.handles.store(1, Ordering::Relaxed);
        Live(Arc::new(count))
    }

    /// A reference that does not keep the worker draining; it can be
    /// upgraded while some handle of the set is alive.
    pub fn downgrade(&self) -> WeakLive {
        WeakLive(Arc::downgrade(&self.0))
    }

    /// Handles of this set that are alive, this one included.
    pub fn count(&self) -> usize {
        self.0.handles.load(Ordering::Acquire)
    }

    /// Wait until this is the only handle of its set left.
    pub async fn alone(&self) {
        loop {
            // `notify_one` keeps a permit when nobody waits yet, so a drop
            // between the check and the wait is not lost.
            if self.count() <= 1 {
                return;
            }
            self.0.alone.notified().await;
        }
    }
}

impl Clone for Live {
    fn clone(&self) -> Live {
        self.0.handles.fetch_add(1, Ordering::Relaxed);
        Live(self.0.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if self.0.handles.fetch_sub(1, Ordering::AcqRel) == 2 {
            self.0.alone.notify_one();
        }
    }
}

/// A [`Live`] that does not count; see [`Live::downgrade`].
#[derive(Clone, Debug)]
pub struct WeakLive(Weak<LiveCount>);

impl WeakLive {
    /// A counting handle, unless every handle of the set is gone.
    pub fn upgrade(&self) -> Option<Live> {
        let count = self.0.upgrade()?;
        // The last handle may be dropping right now: count only from one up.
        count
            .handles
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n + 1)
            })
            .ok()?;
        Some(Live(count))
    }
}

thread_local! {
    /// This thread's index among its [`Workers`], if it is one.
    pub(crate) static INDEX: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The index of the worker thread this is called on (`{name}-{index}`), or `None` on any
/// other thread: per-worker state can be kept without a lock the workers share.
pub fn this_worker() -> Option<usize> {
    INDEX.with(|i| i.get())
}

/// How often each worker calls the process's tidy function.
pub const TIDY_EVERY: Duration = Duration::from_secs(1);

static TIDY: OnceLock<fn()> = OnceLock::new();

/// Have every worker thread of this process call `tidy` once every [`TIDY_EVERY`] while it
/// runs, from the first period after its start: work that belongs to each thread and must go
/// on when the thread has nothing else to do, such as a thread-caching allocator's collection
/// of the memory its thread freed (which otherwise waits for the thread's next allocation).
/// Set once, before the workers start; `false` if a tidy function was already set.
pub fn tidy_with(tidy: fn()) -> bool {
    TIDY.set(tidy).is_ok()
}

/// Call `tidy` once every `period`, from one period on, for as long as the future is polled.
/// A worker running late calls it once, not once per period missed.
async fn tidy_every(period: Duration, tidy: fn()) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        tidy();
    }
}

/// Run by a worker each time it has nothing left to do, just before it sleeps waiting for
/// events: it first gives its CPU to any thread that is waiting for one (`sched_yield`).
///
/// A worker shares its cores with other busy threads: the clients' on the same host, the other
/// workers, a switch's nodes. Going straight to sleep, it was woken by the first request that
/// arrived and, having slept, ran at once ahead of the thread that sent it (the scheduler
/// favours a waking thread): a wake-up and a context switch for each request or two, the
/// sender cut off in the middle of its own batch, and connections served in the order those
/// wake-ups happened to come, not in turn. Yielding first lets the threads that are ready run
/// until they wait themselves; the worker then finds their requests together when it asks for
/// events, and serves them in one pass. On the node against nginx (bench/RESULTS.md,
/// 2026-12-06): p99 at 1 KiB keep-alive 7.9 ms before, 0.6-2.4 ms after (nginx 2.1-4.9);
/// Connection: close 17-23 % more requests a second for about a third less CPU each. A relay
/// gains from it only when the servers behind it yield too (measured both ways there), so the
/// switch's workers, on this same runtime, yield as the node's do. With no other thread
/// waiting, the call returns at once: one system call each time the worker goes idle.
fn yield_before_sleep() {
    std::thread::yield_now();
}

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
        A: Fn(usize, Listener, Live) -> Fut + Clone + Send + 'static,
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
                    INDEX.with(|x| x.set(Some(i)));
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
    A: Fn(usize, Listener, Live) -> Fut,
    Fut: Future<Output = ()>,
{
    // I/O and timers only: with the signal and process drivers too (`enable_all`), every park
    // of the loop also looks for exited child processes to reap (0.3 % of a node's CPU
    // answering Connection: close, profiled), and nothing on a worker starts a process or
    // waits for a signal.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .on_thread_park(yield_before_sleep)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot build a worker runtime");
            return;
        }
    };
    rt.block_on(async move {
        let listener = match Listener::new(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot register the listener");
                return;
            }
        };
        // Ends with the runtime, after the worker's last connection.
        if let Some(&tidy) = TIDY.get() {
            tokio::spawn(tidy_every(TIDY_EVERY, tidy));
        }
        let live = Live::new();
        // The listener closes when the accept loop is dropped.
        tokio::select! {
            _ = accept(index, listener, live.clone()) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
        tokio::select! {
            _ = live.alone() => {}
            _ = abort.wait_for(|a| *a) => {}
        }
    });
    // Dropping the runtime drops the connections that are left.
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// The worker wakes when the last connection's handle drops, not before.
    #[test]
    fn the_last_drop_wakes_the_worker() {
        rt().block_on(async {
            let live = Live::new();
            let (a, b) = (live.clone(), live.clone());
            assert_eq!(live.count(), 3);
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let holder = tokio::spawn(async move {
                let _ = rx.await;
                drop(b);
            });
            drop(a);
            // One handle is still held by the task: not alone yet.
            let mut waiting = std::pin::pin!(live.alone());
            assert!(futures_poll(waiting.as_mut()).is_pending());
            tx.send(()).unwrap();
            holder.await.unwrap();
            waiting.await;
            assert_eq!(live.count(), 1);
        });
    }

    #[test]
    fn weak_handles_count_only_while_the_set_lives() {
        let live = Live::new();
        let weak = live.downgrade();
        let up = weak.upgrade().expect("the set is alive");
        assert_eq!(live.count(), 2);
        drop(live);
        drop(up);
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn workers_drain_then_stop() {
        rt().block_on(async {
            let listener =
                crate::listen::listen_std("127.0.0.1:0".parse().unwrap(), false).unwrap();
            let (stop, stop_rx) = watch::channel(false);
            let (held_tx, held_rx) = mpsc::channel::<Live>();
            let workers = Workers::spawn("t", vec![listener], stop_rx, move |_, _l, live| {
                let _ = held_tx.send(live);
                std::future::pending::<()>()
            })
            .unwrap();
            // A connection's handle, held outside the worker.
            let conn = tokio::task::spawn_blocking(move || held_rx.recv().unwrap())
                .await
                .unwrap();
            stop.send(true).unwrap();
            let finish = tokio::spawn(workers.finish(Duration::from_secs(3600)));
            // Dropping the connection's handle ends the drain long before the grace period.
            drop(conn);
            finish.await.unwrap();
        });
    }

    /// Each worker thread knows its index; other threads have none.
    #[test]
    fn workers_know_their_index() {
        rt().block_on(async {
            let listeners = (0..2)
                .map(|_| crate::listen::listen_std("127.0.0.1:0".parse().unwrap(), false).unwrap())
                .collect();
            let (stop, stop_rx) = watch::channel(false);
            let (tx, rx) = mpsc::channel();
            let workers = Workers::spawn("t", listeners, stop_rx, move |i, _l, _live| {
                let _ = tx.send((i, this_worker()));
                async {}
            })
            .unwrap();
            let mut seen =
                tokio::task::spawn_blocking(move || [rx.recv().unwrap(), rx.recv().unwrap()])
                    .await
                    .unwrap();
            seen.sort();
            assert_eq!(seen, [(0, Some(0)), (1, Some(1))]);
            assert_eq!(this_worker(), None);
            // (The workers may have ended already: their accept loops returned at once.)
            let _ = stop.send(true);
            workers.finish(Duration::from_secs(5)).await;
        });
    }

    static TIDIED: AtomicUsize = AtomicUsize::new(0);

    fn count_tidy() {
        TIDIED.fetch_add(1, Ordering::SeqCst);
    }

    /// The tidy loop calls once per period from one period on, and once (not once per period
    /// missed) when it runs late.
    #[tokio::test(start_paused = true)]
    async fn tidying_comes_once_a_period() {
        let looping = tokio::spawn(tidy_every(Duration::from_secs(1), count_tidy));
        // (time to advance by, in ms; calls made by then). The jump of 3,500 ms passes three
        // periods: one call, then one per period from there.
        let steps = [
            (0, 0),
            (999, 0),
            (1, 1),
            (1_000, 2),
            (3_500, 3),
            (999, 3),
            (1, 4),
        ];
        for (at, (advance, calls)) in steps.into_iter().enumerate() {
            tokio::time::advance(Duration::from_millis(advance)).await;
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            assert_eq!(TIDIED.load(Ordering::SeqCst), calls, "step {at}");
        }
        looping.abort();
    }

    static TIDIED_ON: std::sync::Mutex<Vec<Option<usize>>> = std::sync::Mutex::new(Vec::new());
    static TIDY_SEEN: std::sync::Condvar = std::sync::Condvar::new();

    fn note_tidy() {
        TIDIED_ON.lock().unwrap().push(this_worker());
        TIDY_SEEN.notify_all();
    }

    /// Every worker thread calls the process's tidy function, on itself, while it runs.
    #[test]
    fn every_worker_tidies() {
        assert!(tidy_with(note_tidy), "set once");
        assert!(!tidy_with(count_tidy), "and only once");
        let listeners = (0..2)
            .map(|_| crate::listen::listen_std("127.0.0.1:0".parse().unwrap(), false).unwrap())
            .collect();
        let (stop, stop_rx) = watch::channel(false);
        let workers = Workers::spawn("t", listeners, stop_rx, |_, _l, _live| {
            std::future::pending::<()>()
        })
        .unwrap();
        let seen = TIDIED_ON.lock().unwrap();
        let (seen, waited) = TIDY_SEEN
            .wait_timeout_while(seen, Duration::from_secs(30), |seen| {
                !(seen.contains(&Some(0)) && seen.contains(&Some(1)))
            })
            .unwrap();
        assert!(!waited.timed_out(), "tidied on {seen:?}");
        assert!(
            seen.iter().all(Option::is_some),
            "only workers tidy: {seen:?}"
        );
        drop(seen);
        stop.send(true).unwrap();
        rt().block_on(workers.finish(Duration::from_secs(5)));
    }

    fn futures_poll<F: Future>(f: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        f.poll(&mut std::task::Context::from_waker(waker))
    }
}
