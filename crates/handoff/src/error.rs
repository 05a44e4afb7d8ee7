//! The crate's error type.

use std::io;

use crate::proto::ProtoError;

/// Everything that can go wrong while moving a connection, steering its
/// packets or working in network namespaces (the lab crate, which builds its
/// hosts with [`crate::netns`], reports its errors in these terms too).
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// A system call failed; `what` names the operation.
    #[error("{what}: {source}")]
    Io {
        /// The operation that failed.
        what: String,
        /// The error the kernel returned.
        #[source]
        source: io::Error,
    },
    /// The operation needs a capability this process lacks (TCP_REPAIR,
    /// namespaces, tc and nftables all need CAP_NET_ADMIN).
    #[error("{what} needs CAP_NET_ADMIN (run as root or grant the capability); the switch relays instead")]
    NoPrivilege {
        /// The operation that was refused.
        what: String,
    },
    /// The connection is not in a state that can be moved (only ESTABLISHED
    /// connections are).
    #[error("connection cannot be moved: {0}")]
    NotMovable(String),
    /// A control-protocol frame was malformed.
    #[error("control protocol: {0}")]
    Proto(#[from] ProtoError),
    /// A required tool or kernel feature is missing.
    #[error("missing: {0}")]
    Missing(String),
    /// An external command (ip, tc, nft, clang, bpftool) failed.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// What it printed on standard error.
        stderr: String,
    },
    /// Anything else, with a message.
    #[error("{0}")]
    Other(String),
}

impl HandoffError {
    /// Wraps an `io::Error`, turning EPERM into [`HandoffError::NoPrivilege`].
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        let what = what.into();
        if source.raw_os_error() == Some(libc::EPERM) {
            HandoffError::NoPrivilege { what }
        } else {
            HandoffError::Io { what, source }
        }
    }

    /// Wraps the current `errno`.
    pub fn last_os(what: impl Into<String>) -> Self {
        Self::io(what, io::Error::last_os_error())
    }

    /// True when the error says privileges are missing.
    pub fn is_no_privilege(&self) -> bool {
        matches!(self, HandoffError::NoPrivilege { .. })
    }
}

impl From<nix::Error> for HandoffError {
    fn from(e: nix::Error) -> Self {
        HandoffError::io("system call", io::Error::from(e))
    }
}

/// The crate's result type.
pub type Result<T, E = HandoffError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eperm_becomes_no_privilege() {
        let e = HandoffError::io("TCP_REPAIR", io::Error::from_raw_os_error(libc::EPERM));
        assert!(e.is_no_privilege());
        assert!(e.to_string().contains("CAP_NET_ADMIN"));
        let e = HandoffError::io("x", io::Error::from_raw_os_error(libc::EINVAL));
        assert!(!e.is_no_privilege());
    }
}
