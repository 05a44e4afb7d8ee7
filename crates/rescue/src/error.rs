//! The crate's configuration error (protocol and session errors live beside their code:
//! [`crate::proto::ProtoError`], [`crate::session::SessionError`]).

/// A setting of the `[rescue]` table is out of range or inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rescue.{key}: {msg}")]
pub struct ConfigError {
    /// The key.
    pub key: &'static str,
    /// What is wrong with it.
    pub msg: String,
}
