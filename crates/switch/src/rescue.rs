//! The switch as the face of a site in flash-crowd rescue (seed 001): with `[rescue.peering]`
//! it runs the rescue driver for the whole cluster. Every request for the site's content is
//! first offered to the driver's redirector (a 302 to a rescue server's virtual host during a
//! rescue, counted with its real size); the site's outbound rate is metered from the responses
//! the switch relays (two-way) or, in one-way mode where responses leave from the nodes, from
//! the bytes-out counters of the nodes' load reports.
//!
//! The switch only asks for rescue: it has no rescue proxy, so it refuses every SOS
//! (`gives_rescue = false`). A cluster gives rescue through nodes that are rescue servers
//! themselves.
//!
//! The redirector's budgets need the size of the requested file before it is served; the
//! switch learns it from earlier responses for the same target (a bounded table), and uses the
//! mean response size for a target it has not seen.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;
use switchyard_rescue::RescueConfig;
use switchyard_rescue_driver::{Driver, DriverParts, TlsIdentity, Traffic};

use crate::error::SwitchError;

/// Targets whose response size is remembered; the table starts over when full.
const SIZES: usize = 65_536;

/// The rescue driver and what the request path needs of it.
pub(crate) struct SiteRescue {
    pub(crate) driver: Arc<Driver>,
    pub(crate) traffic: Arc<Traffic>,
    /// Metered from load reports (one-way delivery) rather than from relayed responses.
    one_way: bool,
    sizes: Mutex<HashMap<String, u64>>,
    bytes: AtomicU64,
    responses: AtomicU64,
}

impl SiteRescue {
    /// Starts the driver for `cfg` (which has `[rescue.peering]`).
    pub(crate) async fn start(cfg: &RescueConfig, one_way: bool) -> Result<Self, SwitchError> {
        let mut cfg = cfg.clone();
        let peering = cfg
            .peering
            .as_ref()
            .ok_or_else(|| SwitchError::Config("[rescue] has no [rescue.peering]".into()))?;
        let identity =
            TlsIdentity::from_files(peering).map_err(|e| SwitchError::Config(e.to_string()))?;
        // No rescue proxy here: every SOS is refused.
        cfg.gives_rescue = false;
        let driver = Driver::start(DriverParts {
            config: cfg,
            identity,
            vhosts: None,
            candidates: None,
            directory: None,
        })
        .await
        .map_err(|e| SwitchError::Config(e.to_string()))?;
        Ok(SiteRescue {
            traffic: driver.traffic(),
            driver: Arc::new(driver),
            one_way,
            sizes: Mutex::new(HashMap::new()),
            bytes: AtomicU64::new(0),
            responses: AtomicU64::new(0),
        })
    }

    /// The expected size of the response for `target`.
    pub(crate) fn size_of(&self, target: &str) -> u64 {
        if let Some(s) = self.sizes.lock().get(target) {
            return *s;
        }
        let n = self.responses.load(Relaxed);
        self.bytes.load(Relaxed).checked_div(n).unwrap_or(0)
    }

    /// A response of `bytes` (head and body) with `status` for `target` went to a client
    /// through the switch.
    pub(crate) fn relayed(&self, target: &str, status: u16, bytes: u64) {
        if status == 200 {
            let mut sizes = self.sizes.lock();
            if sizes.len() >= SIZES && !sizes.contains_key(target) {
                sizes.clear();
            }
            sizes.insert(target.to_string(), bytes);
            drop(sizes);
            self.bytes.fetch_add(bytes, Relaxed);
            self.responses.fetch_add(1, Relaxed);
        }
        if !self.one_way {
            self.traffic.served(bytes);
        }
    }

    /// A response the switch wrote itself (a redirect to a node, an error).
    pub(crate) fn answered(&self, bytes: u64) {
        self.traffic.served(bytes);
    }

    /// A node's load report: its bytes-out counter went from `before` to `now`.
    pub(crate) fn reported(&self, before: Option<u64>, now: u64) {
        if !self.one_way {
            return;
        }
        let delta = match before {
            // A counter that went back belongs to a restarted node.
            Some(b) if b <= now => now - b,
            Some(_) => now,
            // The first report: its bytes were sent before the switch listened.
            None => 0,
        };
        if delta > 0 {
            self.traffic.served(delta);
        }
    }
}
