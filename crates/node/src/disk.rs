//! An emulated disk, so that memory-versus-disk effects show up on a
//! machine whose page cache holds every file, and reads that bypass the page
//! cache (`O_DIRECT`), so that a real disk shows through.
//!
//! [`DiskModel`] is the pure part (time passed in): one FIFO server; a
//! read of `n` bytes issued at `now` starts when the disk is free and takes
//! `latency + n / bandwidth`. The node waits until the completion time it
//! returns with [`sleep_until`], so queueing delay grows under load exactly
//! as on one spindle.
//!
//! [`sleep_until`] waits on a `timerfd` (nanosecond resolution) registered
//! with tokio's reactor: tokio's own timer wheel has millisecond ticks and
//! rounds every wait up to the next one, which turned a 200 µs miss into
//! 1-2 ms. The worker is free while it waits, as with tokio's timer.
//!
//! [`Direct`] reads misses with `O_DIRECT`: the root's file system is
//! checked at start ([`Direct::probe`]: tmpfs and ramfs have no disk beneath
//! them, and a file system that refuses `O_DIRECT` is named), buffers,
//! offsets and lengths are aligned to its direct-I/O block size, and reads
//! run on tokio's blocking pool so a slow disk stalls no worker.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

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

/// Wait until `deadline` with nanosecond resolution: a one-shot `timerfd` on
/// `CLOCK_MONOTONIC` (the clock of [`Instant`]) awaited through tokio's
/// reactor. Should the timer not be had (out of descriptors), tokio's own
/// timer is used, which is late by up to a millisecond but never early.
pub async fn sleep_until(deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return;
    }
    match timer(left) {
        Ok(fd) => {
            let ready = async {
                // SAFETY: an OwnedFd keeps its descriptor open and the same for its whole
                // life, which the AsyncFd owning it bounds.
                let fd =
                    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                        .map_err(io::Error::from)?;
                loop {
                    let mut guard = fd.readable().await?;
                    let mut ticks = [0u8; 8];
                    match nix::unistd::read(guard.get_inner(), &mut ticks) {
                        Ok(_) => return Ok::<(), io::Error>(()),
                        Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            if let Err(e) = ready.await {
                tracing::debug!(error = %e, "timerfd wait failed; using tokio's timer");
                tokio::time::sleep_until(deadline.into()).await;
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "no timerfd; using tokio's timer");
            tokio::time::sleep_until(deadline.into()).await;
        }
    }
}

/// A non-blocking timerfd that expires once, `after` from now.
fn timer(after: Duration) -> io::Result<OwnedFd> {
    // nix wraps timerfd only behind a feature this workspace does not build; the two calls
    // are plain libc.
    // SAFETY: timerfd_create takes no pointers; a non-negative result is a new descriptor
    // owned by nothing else.
    let raw = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor (above) that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: after.as_secs() as libc::time_t,
            tv_nsec: after.subsec_nanos() as libc::c_long,
        },
    };
    // SAFETY: `spec` is a valid itimerspec; a null old value is allowed.
    let rc = unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// `statx` mask bit of the direct-I/O alignment fields (Linux 6.1; the libc crate does not
/// name it for glibc targets).
const STATX_DIOALIGN: u32 = 0x2000;

/// Largest read issued at once (a multiple of every direct-I/O alignment).
pub const DIRECT_CHUNK: usize = 1 << 20;

/// Reads with `O_DIRECT`, aligned for the root's file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Direct {
    /// Alignment of buffers, offsets and lengths (a power of two).
    align: usize,
}

impl Direct {
    /// Checks that the file system under `root` (an open directory at `path`) has a disk
    /// that takes `O_DIRECT` reads, and learns their alignment: from `statx`'s direct-I/O
    /// fields for a regular file found beneath the root when the kernel gives them, else the
    /// file system's block size (a multiple of its logical block size). The error says why
    /// the mode cannot work there.
    pub fn probe(root: BorrowedFd<'_>, path: &Path) -> Result<Direct, String> {
        use nix::sys::statfs::{fstatfs, FsType, TMPFS_MAGIC};
        // ramfs's magic number (linux/magic.h), which nix does not name.
        const RAMFS_MAGIC: FsType = FsType(0x8584_58f6);
        let fs = fstatfs(root).map_err(|e| format!("statfs {}: {e}", path.display()))?;
        let kind = fs.filesystem_type();
        let memory = [(TMPFS_MAGIC, "tmpfs"), (RAMFS_MAGIC, "ramfs")]
            .into_iter()
            .find(|&(m, _)| m == kind);
        if let Some((_, name)) = memory {
            return Err(format!(
                "disk.o_direct: the root {} is on {name}, which has no disk beneath it \
                 (O_DIRECT reads there are memory copies); put the root on a disk-backed \
                 file system or turn o_direct off",
                path.display()
            ));
        }
        let mut align = usize::try_from(fs.block_size()).unwrap_or(4096).max(512);
        if let Some(rel) = first_file(root, 3, 256) {
            let file = open_beneath(root, &rel, true).map_err(|e| {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    format!(
                        "disk.o_direct: the file system of {} refuses O_DIRECT \
                         (EINVAL opening {rel}); turn o_direct off or move the root",
                        path.display()
                    )
                } else {
                    format!("disk.o_direct: opening {rel} with O_DIRECT: {e}")
                }
            })?;
            if let Some(a) = dio_align(&file) {
                align = a;
            }
            let probe = Direct { align };
            probe.read(&file, 0, 1).map_err(|e| {
                format!("disk.o_direct: an O_DIRECT read of {rel} (aligned to {align}) failed: {e}")
            })?;
        }
        if !align.is_power_of_two() {
            return Err(format!(
                "disk.o_direct: direct-I/O alignment {align} of {} is not a power of two",
                path.display()
            ));
        }
        Ok(Direct { align })
    }

    /// The alignment of buffers, offsets and lengths.
    pub fn align(&self) -> usize {
        self.align
    }

    /// Read `len` bytes at `offset` of a file opened with `O_DIRECT`: the aligned span
    /// around them is read into an aligned buffer, at most [`DIRECT_CHUNK`] per call, and
    /// the bytes asked for are copied out. Fewer than `len` bytes (the file shrank) is an
    /// error.
    pub fn read(&self, file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let a = self.align as u64;
        let start = offset - offset % a;
        let end = (offset + len as u64).div_ceil(a) * a;
        let span = (end - start) as usize;
        // An aligned window of a plain vector: no allocator calls by hand.
        let mut raw = vec![0u8; span + self.align];
        let lead = raw.as_ptr().align_offset(self.align);
        let buf = &mut raw[lead..lead + span];
        let mut got = 0usize;
        while got < span {
            let want = (span - got).min(DIRECT_CHUNK);
            let n = file.read_at(&mut buf[got..got + want], start + got as u64)?;
            if n == 0 {
                break;
            }
            got += n;
            if n < want {
                // A short read ends at the end of the file; the next would read nothing.
                break;
            }
        }
        let skip = (offset - start) as usize;
        if got < skip + len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shrank while reading",
            ));
        }
        Ok(buf[skip..skip + len].to_vec())
    }
}

/// Open `rel` beneath `root` (as the document root does), with `O_DIRECT` when `direct`.
pub fn open_beneath(root: BorrowedFd<'_>, rel: &str, direct: bool) -> io::Result<File> {
    use nix::fcntl::OFlag;
    let extra = if direct {
        OFlag::O_DIRECT
    } else {
        OFlag::empty()
    };
    Ok(crate::fs::open_beneath(root, rel, extra)?)
}

/// The direct-I/O alignment `statx` reports for `file` (the larger of the memory and offset
/// alignments), when the kernel and file system report one.
fn dio_align(file: &File) -> Option<usize> {
    // SAFETY: an all-zero statx is a valid value of the plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a valid C string, `st` is writable and outlives the call.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            STATX_DIOALIGN,
            &mut st,
        )
    };
    if rc != 0 || st.stx_mask & STATX_DIOALIGN == 0 || st.stx_dio_offset_align == 0 {
        return None;
    }
    Some(st.stx_dio_offset_align.max(st.stx_dio_mem_align) as usize)
}

/// The relative path of a non-empty regular file beneath `root`, looking at most `budget`
/// directory entries down to `depth` levels (the probe of [`Direct::probe`]).
fn first_file(root: BorrowedFd<'_>, depth: usize, budget: usize) -> Option<String> {
    let mut left = budget;
    let mut dirs = vec![(String::new(), 0usize)];
    while let Some((dir, level)) = dirs.pop() {
        let rel = if dir.is_empty() { "." } else { dir.as_str() };
        let Ok(d) = open_beneath(root, rel, false) else {
            continue;
        };
        let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", d.as_raw_fd())) else {
            continue;
        };
        for entry in entries.flatten() {
            if left == 0 {
                return None;
            }
            left -= 1;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let path = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            match entry.file_type() {
                Ok(t) if t.is_file() && entry.metadata().is_ok_and(|m| m.len() > 0) => {
                    return Some(path);
                }
                Ok(t) if t.is_dir() && level < depth => dirs.push((path, level + 1)),
                _ => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_queueing() {
        let mut d = DiskModel::new(&DiskConfig {
            latency_us: 1000,
            bandwidth_bytes_per_sec: 1_000_000,
            o_direct: false,
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
            o_direct: false,
        });
        assert_eq!(d.service_time(1 << 30), Duration::from_micros(5));
    }
}

#[cfg(test)]
mod direct_tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A file system that takes O_DIRECT under the temp dir, or none (then the tests that
    /// need it are covered by the node's integration tests, which say why they are skipped).
    fn direct_dir() -> Option<(tempfile::TempDir, Direct)> {
        let dir = tempfile::tempdir().ok()?;
        std::fs::write(dir.path().join("probe"), vec![7u8; 10_000]).ok()?;
        let root = File::open(dir.path()).ok()?;
        let d = Direct::probe(root.as_fd(), dir.path()).ok()?;
        Some((dir, d))
    }

    /// Unaligned offsets and lengths come back as the plain bytes of the file.
    #[test]
    fn unaligned_spans_read_exactly() {
        let Some((dir, d)) = direct_dir() else {
            eprintln!("no O_DIRECT file system under the temp dir");
            return;
        };
        assert!(d.align().is_power_of_two() && d.align() >= 512);
        let data: Vec<u8> = (0..3 * DIRECT_CHUNK + 1234)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let root = File::open(dir.path()).unwrap();
        let f = open_beneath(root.as_fd(), "f", true).unwrap();
        for (off, len) in [
            (0, data.len()),
            (1, 1),
            (4095, 2),
            (DIRECT_CHUNK as u64 - 3, DIRECT_CHUNK + 7),
            (data.len() as u64 - 10, 10),
        ] {
            let got = d.read(&f, off, len).unwrap();
            assert!(
                got == data[off as usize..off as usize + len],
                "{off}+{len} differs"
            );
        }
        let past = d.read(&f, data.len() as u64 - 10, 11).unwrap_err();
        assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// The timer is never early, and a sub-millisecond wait is not rounded up to tokio's
    /// millisecond ticks (best of many, so a busy machine cannot fail it).
    #[test]
    fn sub_millisecond_waits_are_honoured() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let want = Duration::from_micros(250);
        let best = rt.block_on(async {
            let mut best = Duration::MAX;
            for _ in 0..50 {
                let t = Instant::now();
                sleep_until(t + want).await;
                let took = t.elapsed();
                assert!(took >= want, "early: {took:?}");
                best = best.min(took);
            }
            best
        });
        assert!(best < Duration::from_micros(900), "best wait {best:?}");
    }
}
