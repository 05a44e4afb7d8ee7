//! One configuration in force: its nodes, its policy, its limits and timeouts. A reload
//! installs a new generation; connections and requests that hold the old one finish on it.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_http::request::Limits;
use switchyard_policy::Policy;

use crate::backend::Backend;
use crate::config::SwitchConfig;

/// Timeouts of one configuration, as durations.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub header: Duration,
    pub idle: Duration,
    pub send: Duration,
    pub connect: Duration,
    pub node: Duration,
    pub queue: Duration,
}

/// One configuration in force: its nodes (node id = index) and its policy. A reload installs a
/// new generation; connections and requests that hold the old one finish on it.
pub(crate) struct Generation {
    pub id: u64,
    pub cfg: SwitchConfig,
    pub limits: Limits,
    pub t: Timeouts,
    pub nodes: Vec<Arc<Backend>>,
    pub policy: Mutex<Box<dyn Policy>>,
}

impl Generation {
    /// The node id of `b` in this generation.
    pub fn index_of(&self, b: &Backend) -> Option<usize> {
        self.nodes.iter().position(|n| std::ptr::eq(&**n, b))
    }
}

pub(crate) fn limits(cfg: &SwitchConfig) -> Limits {
    Limits {
        max_request_line: cfg.max_request_line,
        max_head_bytes: cfg.max_head_bytes,
        max_body_bytes: cfg.max_body_bytes,
    }
}

pub(crate) fn timeouts(cfg: &SwitchConfig) -> Timeouts {
    let ms = Duration::from_millis;
    Timeouts {
        header: ms(cfg.header_timeout_ms),
        idle: ms(cfg.idle_timeout_ms),
        send: ms(cfg.send_timeout_ms),
        connect: ms(cfg.connect_timeout_ms),
        node: ms(cfg.node_timeout_ms),
        queue: ms(cfg.queue_timeout_ms),
    }
}
