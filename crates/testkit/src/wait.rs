//! Bounded waits for states that show no event: one that should come ([`eventually`]) and one
//! that should last ([`holds_for`]).

use std::time::{Duration, Instant};

/// Waits until `f` holds, up to `limit`; false if it still does not. Only
/// for states a server shows no event for (a gauge or counter in
/// `/metrics`, a node's health): `f` is rechecked after a short yield until
/// the deadline, and once more at it.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// Whether `f` holds at every check until `window` has passed (and once more at its end):
/// false at the first check it fails. For showing that a state does not change for a while
/// (an entry that must outlive a timer), checked at the same short yields as [`eventually`].
pub fn holds_for(window: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + window;
    while Instant::now() < end {
        if !f() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}
