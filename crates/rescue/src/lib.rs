//! Cross-site flash-crowd rescue after DotSlash (seed 001, Zhao and Schulzrinne): a site whose
//! outbound bandwidth runs short asks other sites for help (SOS), redirects part of its clients
//! to them, and lets them go when the crowd has gone. This crate is the decision logic and the
//! protocol, without I/O and without a clock: time comes in as a `Duration` since an origin the
//! caller picks, so servers, tests and the simulator run the same code.
//!
//! # The parts
//!
//! * [`Core`] ([`core`]) — one server's control loop: the states normal / SOS / rescue, rate
//!   monitoring, initial and additional allocation, the redirect threshold T_redi, the D_redi
//!   adjustment with RATE, partial and complete release, idle and overload shutdown, d_free.
//!   It is fed [`Core::on_tick`] once per control interval, [`Core::on_message`] for each
//!   message from a peer and [`Core::on_peer_lost`] when a connection ends, and answers with
//!   [`Action`]s.
//! * [`Meter`] ([`meter`]) — the traffic counters the request path adds to; taken once per
//!   interval as a [`Measurement`].
//! * [`Redirector`] ([`redirect`]) — the origin's per-request choice: serve, redirect (weighted
//!   round robin on D_redi for small files, load-bounded consistent hashing for large ones) or
//!   refuse at the redirect bound.
//! * [`proto`] — the line protocol: [`Message`], its encoder and strict decoder, [`LineReader`].
//! * [`Session`] ([`session`]) — one connection's protocol state: sequence numbers,
//!   outstanding requests, timeouts, answers to malformed requests.
//! * [`RescueConfig`] ([`config`]) — the `[rescue]` table with Table 1's defaults.
//! * [`VhostTable`] ([`vhosts`]) — a rescue server's dynamic virtual hosts: which requests are
//!   its own, which it proxies for an origin, which it redirects back to an ended origin, and
//!   which are misdirected.
//! * [`registry`] — service discovery (§4.5): what a site registers, when it renews its
//!   soft-state registration, and how search results become candidates sorted by free capacity.
//! * [`mesh`] — several cores joined by sessions in memory: the tests' and the simulator's
//!   network, and a complete example of a driver.
//!
//! Peers are named by [`PeerId`]s the driver assigns (an index into its configured peer list,
//! for instance). The driver is responsible for who may be a peer at all: it should pass the
//! core only messages from authenticated peers.
//!
//! # Driving it
//!
//! A driver keeps one `Core`, one `Meter` and (on an origin) one `Redirector`, and one
//! `Session` per peer connection. The request path calls [`Redirector::route`] and the meter for
//! every response. Every I_ctrl the control task takes the meter and calls `on_tick`; a
//! connection task feeds received bytes to its session and what the session delivers to
//! `on_message`; a session error or a closed connection becomes `on_peer_lost`. The actions
//! are carried out in order: `Send` and `Reply` through the peer's session (connecting first
//! for an SOS), `Redirect` into the redirector, the rest to DNS, the registry, the virtual-host
//! table and logs. Under tokio: the core in a mutex (its calls are short and never block) or in
//! one task that owns it and receives events on a channel; each connection task sleeps until
//! [`Session::next_deadline`] and then calls [`Session::check_timeouts`]. A connection may be
//! closed once [`Core::has_relationship`] is false for its peer and [`Session::is_idle`].
//!
//! ```
//! use std::time::Duration;
//! use switchyard_rescue::{
//!     Action, Candidate, Core, Meter, PeerId, Received, Redirector, RescueConfig, Route,
//!     RouteQuery, State,
//! };
//!
//! // An origin with D_out = 100 kB/s (B = 125 kB/s, U = 80%).
//! let cfg = RescueConfig::new("www.origin.com", "1.2.3.4".parse().unwrap(), 8080, 125.0);
//! let mut core = Core::new(cfg.clone()).unwrap();
//! let mut meter = Meter::new(&cfg, Duration::ZERO);
//! let mut redirector = Redirector::new(&cfg);
//! let rescuer = PeerId(1);
//! let mut session = core.new_session(); // one per connection to `rescuer`
//! let candidates = [Candidate { peer: rescuer, d_free_kbps: 500.0, domain: None }];
//!
//! // The request path sent 60 kB in the first second: above T_alert (50%).
//! meter.served(60_000);
//! let now = Duration::from_secs(1);
//! let mut wire = Vec::new();
//! let m = meter.take(now);
//! for action in core.on_tick(now, &m, &candidates) {
//!     match action {
//!         Action::Send { peer, request } => {
//!             assert_eq!(peer, rescuer);
//!             let (_seq, line) = session.send_request(now, request).unwrap();
//!             wire.extend(line);
//!         }
//!         Action::Reply { seq, response, .. } => wire.extend(session.send_response(seq, response).unwrap()),
//!         Action::Redirect(plan) => redirector.apply(plan),
//!         _ => {} // DNS, registry, virtual hosts, logs
//!     }
//! }
//! assert_eq!(wire, b"1 SOS www.origin.com 1.2.3.4 8080 300\n");
//! assert_eq!(core.state(), State::Sos);
//!
//! // The rescue server's answer arrives on the connection.
//! for got in session.receive(b"1 200 OK www-vh1.rescue.com 5.6.7.8 8080 100\n").unwrap() {
//!     if let Received::Deliver(msg) = got {
//!         for action in core.on_message(now, rescuer, msg) {
//!             if let Action::Redirect(plan) = action {
//!                 redirector.apply(plan);
//!             }
//!         }
//!     }
//! }
//! // Past T_redi × D_out in this interval, requests go to the rescue server.
//! meter.served(80_000);
//! let q = RouteQuery { client: "192.0.2.9".parse().unwrap(), path: "/index.html", size: 4096 };
//! let Route::Redirect(target) = redirector.route(&q, meter.out_bytes()) else { panic!() };
//! assert_eq!(target.location(q.path), "http://www-vh1.rescue.com:8080/index.html");
//! let peer = target.peer;
//! meter.redirected(peer, 227, q.size);
//! ```

#![warn(missing_docs)]

pub mod config;
pub mod core;
mod error;
pub mod mesh;
pub mod meter;
pub mod proto;
pub mod redirect;
pub mod registry;
pub mod session;
pub mod vhosts;

use serde::{Deserialize, Serialize};

pub use crate::config::{PeerConfig, PeeringConfig, ProxyConfig, RescueConfig};
pub use crate::core::{Action, Candidate, Core, EndReason, State, Status};
pub use crate::error::ConfigError;
pub use crate::meter::{redirect_accounting, Measurement, Meter, Totals};
pub use crate::proto::{Grant, LineReader, Message, ProtoError, Request, Response, Sos};
pub use crate::redirect::{RedirectPlan, RedirectTarget, Redirector, Route, RouteQuery};
pub use crate::session::{Inbound, Received, Session, SessionError};
pub use crate::vhosts::{normalize_host, Lookup, Origin, OriginId, VhostError, VhostTable};

/// A peer server, numbered by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PeerId(pub u32);

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peer{}", self.0)
    }
}
