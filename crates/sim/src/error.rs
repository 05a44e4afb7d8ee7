//! Errors of the simulator.

use std::path::PathBuf;

/// What can go wrong setting up or running a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// An invalid option or configuration value.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The policy could not be built or initialized.
    #[error(transparent)]
    PolicyConfig(#[from] switchyard_policy::PolicyError),
    /// The policy answered something the simulator cannot carry out.
    #[error("policy: {0}")]
    Policy(String),
    /// The workload is unusable.
    #[error("workload: {0}")]
    Workload(String),
    /// Reading or generating a trace failed.
    #[error(transparent)]
    Trace(#[from] switchyard_trace::TraceError),
    /// Nothing was left to happen while requests were still unanswered.
    #[error("simulation stalled after {completed} of {requests} requests")]
    Stalled {
        /// Requests completed.
        completed: u64,
        /// Requests in the workload.
        requests: u64,
    },
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Writing the output failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// JSON output failed.
    #[error("cannot write JSON: {0}")]
    Json(#[from] serde_json::Error),
}
