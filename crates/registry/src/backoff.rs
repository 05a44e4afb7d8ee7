//! Exponential backoff between retries of a failed request, without a clock: the caller asks
//! for the next delay and resets after a success.

use std::time::Duration;

/// Delays that start at `first` and double up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
    failures: u32,
}

impl Backoff {
    /// Starts at `first`, never more than `max` (at least `first`).
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max: max.max(first),
            next: first,
            failures: 0,
        }
    }

    /// A failure: the delay before the next attempt.
    pub fn failed(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        self.failures += 1;
        d
    }

    /// A success: the next failure starts again at `first`.
    pub fn succeeded(&mut self) {
        self.next = self.first;
        self.failures = 0;
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(250), ms(1500));
        let got: Vec<_> = (0..5).map(|_| b.failed()).collect();
        assert_eq!(got, [ms(250), ms(500), ms(1000), ms(1500), ms(1500)]);
        assert_eq!(b.failures(), 5);
        b.succeeded();
        assert_eq!((b.failed(), b.failures()), (ms(250), 1));
        assert_eq!(Backoff::new(ms(10), ms(1)).failed(), ms(10));
    }
}
