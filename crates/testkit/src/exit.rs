//! A process's exit as an event (a pidfd), for tests that wait for
//! processes to end instead of polling.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// A process's exit as an event: a pidfd, which becomes readable when the
/// process ends (whether or not it is our child).
pub struct Exit(Option<OwnedFd>);

impl Exit {
    /// Watches process `pid` (an exit that already happened counts).
    pub fn watch(pid: u32) -> Exit {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(
                e.raw_os_error(),
                Some(libc::ESRCH),
                "pidfd_open({pid}): {e}"
            );
            return Exit(None); // already gone
        }
        // SAFETY: fd is a new descriptor we own.
        Exit(Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    /// Waits until the process has ended, at most `limit`; false on timeout.
    pub fn wait(&self, limit: Duration) -> bool {
        let Some(fd) = &self.0 else { return true };
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, left.as_millis() as libc::c_int) };
            if r > 0 {
                return true;
            }
            if r == 0 {
                return false;
            }
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "poll: {e}");
        }
    }
}
