//! Errors of configuration and membership.

use crate::types::NodeId;

/// Error building or configuring a policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The policy name is not one of [`crate::PolicyKind::NAMES`].
    #[error("unknown policy `{name}` (known policies: {known})")]
    UnknownPolicy {
        /// The name given.
        name: String,
        /// The known names, comma separated.
        known: &'static str,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid policy setting `{key}`: {reason}")]
    InvalidConfig {
        /// The config key.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A `cap` class pattern cannot be used.
    #[error("invalid pattern `{pattern}` for class `{class}`: {reason}")]
    InvalidPattern {
        /// Class name.
        class: String,
        /// The pattern.
        pattern: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The same node id was given twice.
    #[error("{0} is already known to the policy")]
    DuplicateNode(NodeId),
    /// A node spec is unusable (e.g. weight out of range).
    #[error("invalid spec for {node}: {reason}")]
    InvalidNode {
        /// The node.
        node: NodeId,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl PolicyError {
    pub(crate) fn config(key: &'static str, reason: impl Into<String>) -> Self {
        PolicyError::InvalidConfig {
            key,
            reason: reason.into(),
        }
    }
}
