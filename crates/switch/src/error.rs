//! The errors that stop the switch from starting or a reload from taking effect.

use std::net::SocketAddr;

use thiserror::Error;

/// Errors that stop the switch from starting or a reload from taking effect.
#[derive(Debug, Error)]
pub enum SwitchError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration is unusable.
    #[error("invalid switch configuration: {0}")]
    Config(String),
    /// A key that cannot change while running was changed in a reload.
    #[error("`{0}` cannot change on reload; restart the switch")]
    NotReloadable(&'static str),
    /// The admin listener could not start.
    #[error(transparent)]
    Admin(#[from] switchyard_admin::AdminError),
}
