//! The process's descriptor limit (`RLIMIT_NOFILE`) and the connection cap derived from it.
//!
//! A server that accepts more connections than it has descriptors for fails at the worst place:
//! its own connections to the nodes, pipes and files. So at start the soft limit is raised to
//! the hard limit (an unprivileged process may do so), and when no cap is configured the cap on
//! client connections is what the limit leaves after a reserve for the process's other
//! descriptors, divided by the descriptors one client connection may need at once.

use std::io;

/// The `RLIMIT_NOFILE` limits: soft (in force) and hard (the ceiling).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NofileLimit {
    pub soft: u64,
    pub hard: u64,
}

/// The current limits.
pub fn current() -> io::Result<NofileLimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(NofileLimit {
        soft: r.rlim_cur,
        hard: r.rlim_max,
    })
}

/// Raise the soft limit to the hard limit; returns the limits now in force. A failure to raise
/// leaves the limit as it was (and is returned as such), so a server still starts.
pub fn raise() -> io::Result<NofileLimit> {
    let before = current()?;
    if before.soft >= before.hard {
        return Ok(before);
    }
    let r = libc::rlimit {
        rlim_cur: before.hard,
        rlim_max: before.hard,
    };
    // SAFETY: setrlimit only reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        let e = io::Error::last_os_error();
        tracing::warn!(soft = before.soft, hard = before.hard, error = %e, "cannot raise the descriptor limit");
        return Ok(before);
    }
    let now = current()?;
    tracing::debug!(from = before.soft, to = now.soft, "descriptor limit raised");
    Ok(now)
}

/// The connection cap a limit of `soft` descriptors allows: `(soft - reserve) / per_connection`
/// when that leaves room for at least 64 connections; with a limit too small for the reserve,
/// a quarter of it divided the same way (a test or a tiny limit still serves). Never 0.
pub fn derive_max_connections(soft: u64, reserve: u64, per_connection: u64) -> usize {
    let per = per_connection.max(1);
    let n = if soft > reserve + 64 * per {
        (soft - reserve) / per
    } else {
        soft / 4 / per
    };
    usize::try_from(n.max(1)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_caps() {
        // 20,000 descriptors, 2,816 reserved, two per relayed connection.
        assert_eq!(derive_max_connections(20_000, 2_816, 2), 8_592);
        assert_eq!(derive_max_connections(1_048_576, 1_024, 2), 523_776);
        // A limit below the reserve still gives a cap.
        assert_eq!(derive_max_connections(1_024, 2_816, 2), 128);
        assert_eq!(derive_max_connections(3, 2_816, 2), 1);
    }

    #[test]
    fn raising_reaches_the_hard_limit() {
        let now = raise().unwrap();
        assert_eq!(now, current().unwrap());
        assert_eq!(now.soft, now.hard);
    }
}
