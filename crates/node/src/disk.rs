//! An emulated disk, so that memory-versus-disk effects show up on a
//! machine whose page cache holds every file.
//!
//! [`DiskModel`] is the pure part (time passed in): one FIFO server; a
//! read of `n` bytes issued at `now` starts when the disk is free and takes
//! `latency + n / bandwidth`. The node waits until the completion time it
//! returns, so queueing delay grows under load exactly as on one spindle.

use std::time::Duration;

use crate::config::DiskConfig;

/// A single-queue disk: positioning latency plus transfer time.
#[derive(Clone, Debug)]
pub struct DiskModel {
    latency: Duration,
    bandwidth: u64,
    busy_until: Duration,
    queued: u64,
}

impl DiskModel {
    /// A disk with the configured latency and bandwidth.
    pub fn new(cfg: &DiskConfig) -> Self {
        DiskModel {
            latency: Duration::from_micros(cfg.latency_us),
            bandwidth: cfg.bandwidth_bytes_per_sec,
            busy_until: Duration::ZERO,
            queued: 0,
        }
    }

    /// Service time of one read of `bytes`.
    pub fn service_time(&self, bytes: u64) -> Duration {
        let transfer = if self.bandwidth == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(
                ((u128::from(bytes) * 1_000_000_000) / u128::from(self.bandwidth)) as u64,
            )
        };
        self.latency + transfer
    }

    /// Queue a read of `bytes` issued at `now`; returns when it completes.
    /// Call [`DiskModel::complete`] once the caller has waited for it.
    pub fn submit(&mut self, now: Duration, bytes: u64) -> Duration {
        let start = self.busy_until.max(now);
        self.busy_until = start + self.service_time(bytes);
        self.queued += 1;
        self.busy_until
    }

    /// A read submitted earlier has been waited for.
    pub fn complete(&mut self) {
        self.queued = self.queued.saturating_sub(1);
    }

    /// Reads submitted and not yet completed (the disk queue length).
    pub fn queued(&self) -> u64 {
        self.queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_queueing() {
        let mut d = DiskModel::new(&DiskConfig {
            latency_us: 1000,
            bandwidth_bytes_per_sec: 1_000_000,
        });
        let ms = Duration::from_millis;
        // 1 ms latency + 1000 bytes at 1 MB/s = 2 ms.
        assert_eq!(d.submit(ms(0), 1000), ms(2));
        // Issued while busy: waits for the first.
        assert_eq!(d.submit(ms(1), 1000), ms(4));
        assert_eq!(d.queued(), 2);
        d.complete();
        d.complete();
        assert_eq!(d.queued(), 0);
        // Issued after idle: starts at once.
        assert_eq!(d.submit(ms(10), 0), ms(11));
    }

    #[test]
    fn unlimited_bandwidth() {
        let d = DiskModel::new(&DiskConfig {
            latency_us: 5,
            bandwidth_bytes_per_sec: 0,
        });
        assert_eq!(d.service_time(1 << 30), Duration::from_micros(5));
    }
}
