//! A bounded wait for a state that shows no event.

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
