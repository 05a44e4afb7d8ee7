//! Whether the io_uring loop's waits hold the responses already in for more: a small
//! controller in the manner of Linux's dynamic interrupt moderation (`lib/dim`), which tunes
//! a NIC's interrupt coalescing by trying a setting for an epoch and keeping it only if the
//! packet rate improved.
//!
//! Holding pays when the client shares busy cores with the server: both sides wake less and
//! the closed loop goes faster (bench/RESULTS.md, 2026-12-06: +20 % against nginx on two
//! cores). Against a slow server on idle cores it only makes each response look later and the
//! loop slower (a server answering in 10 ms: 0.8-1 ms added, 8 % fewer requests). In a closed
//! loop the request rate is the number of connections over the mean response time as the
//! client sees it, so the setting that gives the higher rate is also the one that distorts the
//! measured times less; the controller measures both and keeps the better.
//!
//! It runs one setting for [`STAY`] epochs, then the other for one epoch (a probe), and
//! switches when the probe's rate beats the epoch just before it by [`MARGIN`]. An epoch lasts
//! until [`EPOCH_COMPLETIONS`] responses and [`EPOCH_MIN`] have passed, or [`EPOCH_MAX`]. No
//! I/O and no clock: the loop passes the time in.

use std::time::{Duration, Instant};

/// Epochs at the chosen setting between two probes of the other.
pub(crate) const STAY: u32 = 10;
/// How much faster the probe must be to be adopted.
pub(crate) const MARGIN: f64 = 0.05;
/// Responses an epoch counts at least (fewer make the rate too noisy to compare)...
pub(crate) const EPOCH_COMPLETIONS: u64 = 500;
/// ...over at least this long...
pub(crate) const EPOCH_MIN: Duration = Duration::from_millis(20);
/// ...unless this long has passed.
pub(crate) const EPOCH_MAX: Duration = Duration::from_secs(1);

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Moderation {
    /// The setting chosen: hold or not.
    hold: bool,
    /// This epoch tries the other one.
    probing: bool,
    epoch_start: Instant,
    epoch_count: u64,
    epochs_left: u32,
    /// Rate of the last epoch at the chosen setting, responses per second.
    last_rate: f64,
}

impl Moderation {
    /// Starts without holding.
    pub(crate) fn new(now: Instant) -> Self {
        Moderation {
            hold: false,
            probing: false,
            epoch_start: now,
            epoch_count: 0,
            epochs_left: STAY,
            last_rate: 0.0,
        }
    }

    /// Whether the waits of this epoch hold completions for more.
    pub(crate) fn holding(&self) -> bool {
        self.hold != self.probing
    }

    /// Counts `n` responses completed by `now`.
    pub(crate) fn completed(&mut self, n: u64, now: Instant) {
        self.epoch_count += n;
        let took = now.saturating_duration_since(self.epoch_start);
        let full = self.epoch_count >= EPOCH_COMPLETIONS && took >= EPOCH_MIN;
        if !full && took < EPOCH_MAX {
            return;
        }
        let rate = self.epoch_count as f64 / took.as_secs_f64().max(1e-9);
        self.epoch_start = now;
        self.epoch_count = 0;
        if self.probing {
            self.probing = false;
            if rate > self.last_rate * (1.0 + MARGIN) {
                self.hold = !self.hold;
                self.last_rate = rate;
            }
            self.epochs_left = STAY;
        } else {
            self.last_rate = rate;
            self.epochs_left -= 1;
            if self.epochs_left == 0 {
                self.probing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `epochs` epochs in which holding gives `hold_rate` responses per second and not
    /// holding `free_rate`; returns how many epochs held.
    fn run(
        m: &mut Moderation,
        t: &mut Instant,
        epochs: u32,
        hold_rate: f64,
        free_rate: f64,
    ) -> u32 {
        let mut held = 0;
        for _ in 0..epochs {
            let rate = if m.holding() { hold_rate } else { free_rate };
            held += u32::from(m.holding());
            // One epoch: EPOCH_COMPLETIONS responses in 1 ms steps at `rate`.
            let step = Duration::from_millis(1);
            let per_step = rate / 1000.0;
            let mut carried = 0.0;
            let before = m.holding();
            let probing = m.probing;
            let epochs_left = m.epochs_left;
            loop {
                *t += step;
                carried += per_step;
                let n = carried as u64;
                carried -= n as f64;
                m.completed(n, *t);
                if m.probing != probing || m.epochs_left != epochs_left || m.holding() != before {
                    break;
                }
            }
        }
        held
    }

    #[test]
    fn keeps_holding_when_it_is_faster_and_not_when_it_is_slower() {
        let mut t = Instant::now();
        let mut m = Moderation::new(t);
        assert!(!m.holding());
        // Holding 20 % faster: after the first probe it holds, probing the other 1 in 11.
        let held = run(&mut m, &mut t, 11, 120_000.0, 100_000.0);
        assert_eq!(held, 1, "only the probe held");
        assert!(m.holding());
        let held = run(&mut m, &mut t, 110, 120_000.0, 100_000.0);
        assert_eq!(held, 100);
        // The server slows down and holding costs 8 %: the next probe gives it up.
        let held = run(&mut m, &mut t, 22, 2_700.0, 2_950.0);
        assert!(!m.holding());
        assert!(held <= 11, "{held}");
        let held = run(&mut m, &mut t, 110, 2_700.0, 2_950.0);
        assert_eq!(held, 10, "only the probes held");
    }

    #[test]
    fn a_difference_within_the_margin_changes_nothing() {
        let mut t = Instant::now();
        let mut m = Moderation::new(t);
        let held = run(&mut m, &mut t, 110, 103_000.0, 100_000.0);
        assert_eq!(held, 10);
        assert!(!m.holding());
    }

    proptest::proptest! {
        /// Whatever the two settings' rates, one epoch in STAY + 1 probes, and after two full
        /// cycles the controller holds exactly when holding is the clearly faster setting
        /// (equal-ish rates keep the setting it had).
        #[test]
        fn settles_on_the_faster_setting(hold in 1_000.0f64..200_000.0, free in 1_000.0f64..200_000.0) {
            let mut t = Instant::now();
            let mut m = Moderation::new(t);
            run(&mut m, &mut t, 2 * (STAY + 1), hold, free);
            let held = run(&mut m, &mut t, STAY + 1, hold, free);
            if hold > free * (1.0 + MARGIN) {
                proptest::prop_assert!(m.holding());
                proptest::prop_assert_eq!(held, STAY);
            } else {
                proptest::prop_assert!(!m.holding());
                proptest::prop_assert_eq!(held, 1);
            }
        }
    }

    #[test]
    fn a_slow_epoch_ends_after_the_longest_epoch() {
        let t0 = Instant::now();
        let mut m = Moderation::new(t0);
        // Ten responses a second: each epoch is cut at EPOCH_MAX.
        for k in 1..=STAY {
            m.completed(10, t0 + EPOCH_MAX * k);
        }
        assert!(m.probing && m.holding());
    }
}
