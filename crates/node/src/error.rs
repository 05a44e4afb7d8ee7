//! The errors that stop a node from starting.

use std::net::SocketAddr;
use std::path::PathBuf;

use thiserror::Error;

/// Errors that stop a node from starting.
#[derive(Debug, Error)]
pub enum NodeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("document root {path}: {source}")]
    Root {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on unix socket {path}: {source}")]
    BindUnix {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Admin(#[from] switchyard_admin::AdminError),
}
