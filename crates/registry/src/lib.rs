//! Rescue service discovery and DNS round robin over real engines (seed 001 §4.2, §4.5).
//!
//! * [`Registry`] ([`etcd`]) — this site's soft-state registration in etcd under a lease
//!   (renewed periodically and at once when d_free changes beyond the threshold of
//!   [`switchyard_rescue::registry::RenewalPolicy`]), and periodic searches that keep the
//!   candidates sorted by free capacity. Turn them into the core's candidates with
//!   [`switchyard_rescue::registry::to_candidates`].
//! * [`DnsUpdater`] ([`dns`]) — RFC 2136 updates of the site's zone signed with TSIG: rescue
//!   servers' addresses in the origin's round robin, virtual host names' A records.
//! * [`RescueHook`] ([`hook`]) — carries out the core's registry and DNS actions with both.
//! * [`RegistryMetrics`], [`DnsMetrics`] ([`metrics`]) — counters for the admin endpoint.
//!
//! The decisions (when to renew, how to rank, when a lease is presumed gone) are in
//! `switchyard_rescue::registry`, without I/O; this crate carries them out with tokio.

#![warn(missing_docs)]

pub mod backoff;
pub mod dns;
pub mod etcd;
pub mod hook;
pub mod metrics;

pub use crate::dns::{DnsSnapshot, DnsUpdater, Op};
pub use crate::etcd::{Registry, Site, Snapshot};
pub use crate::hook::{DnsChange, DnsPlan, RescueHook};
pub use crate::metrics::{DnsMetrics, RegistryMetrics};

/// What can go wrong starting or using the registry client or the DNS updater.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is out of range.
    #[error(transparent)]
    Config(#[from] switchyard_rescue::ConfigError),
    /// This site's registration is not valid.
    #[error("invalid registration: {0}")]
    Registration(String),
    /// The etcd client could not be set up.
    #[error("etcd client: {0}")]
    Etcd(Box<etcd_client::Error>),
    /// A name is not a DNS name.
    #[error("`{0}` is not a DNS name: {1}")]
    Name(String, String),
    /// A name is outside the zone the updater may change.
    #[error("`{name}` is not in zone `{zone}`")]
    NotInZone {
        /// The name.
        name: String,
        /// The zone.
        zone: String,
    },
    /// The TSIG key cannot sign.
    #[error("TSIG key: {0}")]
    Tsig(String),
    /// The updater's task has stopped.
    #[error("the DNS updater has stopped")]
    Stopped,
}

impl From<etcd_client::Error> for Error {
    fn from(e: etcd_client::Error) -> Self {
        Error::Etcd(Box::new(e))
    }
}
