//! One timer reused for a connection's successive waits.
//!
//! A tokio timer is registered in its runtime's wheel when it is first polled and removed when
//! it is dropped, each under the time driver's lock: a wait with a fresh timer per request cost
//! the switch about 850 instructions per relayed request. A timer that stays registered and is
//! moved to a later deadline costs one atomic exchange instead (it is filed again only when
//! the wheel reaches its old deadline); moved earlier, it is filed again at once. So a
//! connection keeps one [`WaitTimer`] and sets it before each wait.
//!
//! A timer set for a wait that ended early stays registered until the connection sets it
//! again or drops it; if it comes due in between, it wakes the task that last waited on it
//! once, to no effect.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{sleep_until, Instant, Sleep};

/// A connection's timer for its waits. See the module docs.
#[derive(Debug, Default)]
pub struct WaitTimer(Option<Pin<Box<Sleep>>>);

impl WaitTimer {
    /// A timer not set yet: it allocates at its first [`set`](Self::set).
    pub const fn new() -> WaitTimer {
        WaitTimer(None)
    }

    /// Set the timer to come due at `until`.
    pub fn set(&mut self, until: Instant) {
        match &mut self.0 {
            Some(s) => s.as_mut().reset(until),
            None => self.0 = Some(Box::pin(sleep_until(until))),
        }
    }

    /// Ready once the deadline last [`set`](Self::set) has come; never, if it was never set.
    pub fn poll_due(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.0 {
            Some(s) => s.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    /// [`poll_due`](Self::poll_due) as a future.
    pub fn due(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.poll_due(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Wait on `t` until `until`, which must come first.
    async fn not_due_before(t: &mut WaitTimer, until: Instant) {
        tokio::select! {
            () = t.due() => panic!("came due before its deadline"),
            () = sleep_until(until) => {}
        }
    }

    /// On a virtual clock: the timer comes due at each deadline set, later or earlier than
    /// the one it holds, whether that one came due or a wait ended before it; never set, it
    /// never comes due.
    #[tokio::test(start_paused = true)]
    async fn each_wait_ends_at_its_own_deadline() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut t = WaitTimer::new();
        not_due_before(&mut t, at(100)).await;
        // First set; then later, after it came due.
        for due in [110, 120] {
            t.set(at(due));
            t.due().await;
            assert_eq!(Instant::now(), at(due));
        }
        // A wait that ends first leaves it set for 150; set earlier, it comes due at 140.
        t.set(at(150));
        not_due_before(&mut t, at(130)).await;
        t.set(at(140));
        t.due().await;
        assert_eq!(Instant::now(), at(140));
        // Left set for 200, then set later (moved, not filed again): due at 210, not 200.
        t.set(at(200));
        not_due_before(&mut t, at(170)).await;
        t.set(at(210));
        t.due().await;
        assert_eq!(Instant::now(), at(210));
    }
}
