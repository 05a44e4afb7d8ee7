//! One-way delivery: the client's TCP connection moves from the switch to a
//! node, which answers the client directly.
//!
//! A layer-7 switch must accept a connection and read the request before it
//! can choose a node. Relaying the response back through the switch makes
//! the switch the bottleneck; seed 004 (§2.1) instead *hands the connection
//! off*: the node re-creates the connection in the state it had on the
//! switch and sends the response itself, with the switch's address (the VIP)
//! as source, while the switch only forwards the client's later packets
//! (ACKs, further requests) below its TCP stack (§4.2, the forwarder).
//!
//! This crate is that mechanism, without policy:
//!
//! * [`proto`]: the control protocol over persistent switch–node streams, in
//!   the spirit of seed 004 §4.3's THOP: `Create` (THOP_CREATE), `Closed`
//!   (THOP_NOTIFYCLS), `Drop` (THOP_NOTIFYDROP), plus `Accepted`, `HandBack`
//!   (multiple handoff, seed 003 §7.2 and seed 000 §3.1.3), `Route`/`Routed`/
//!   `Served` (persistent connections routed per request), `Cancel` (the
//!   sender gave up waiting and asks for the one answer) and `Ping`/`Pong`.
//! * [`mover`] and [`taker`]: the two ends of one handoff as state machines
//!   with time passed in (no I/O, no clock), and [`mover::drive`], the thin
//!   driver on tokio's clock. The mover's docs give the argument why a
//!   connection is never served by two processes.
//! * [`link`]: one control connection seen from the side that moves
//!   connections over it (frames written by the connection's own task, a
//!   flusher for the backlog, the offers waiting for their answers) and
//!   [`link::offer`], which sends one `Create` and runs its mover. The switch
//!   and the nodes in cooperative mode use the same link.
//! * [`fdpass`]: same host. The switch passes the accepted socket itself to
//!   the node process (`SCM_RIGHTS`) with the bytes it already read. No
//!   privileges needed.
//! * [`repair`]: across hosts. `TCP_REPAIR` dump on the switch, restore on
//!   the node, which holds the VIP on `lo` like LVS direct routing. The call
//!   order is the one found to work on this kernel: the steering entry is
//!   installed *before* the dump, `TCP_MAXSEG` is set before `connect`,
//!   `TCP_REPAIR_WINDOW` after the queues are refilled, `SO_REUSEADDR` again
//!   after leaving repair mode, and the timestamp clock continues from the
//!   switch's so timestamps stay monotone for the client (seed 004 §4.4).
//! * [`steer`]: the switch's table of handed-off 4-tuples. The eBPF backend
//!   (tc clsact ingress) rewrites the Ethernet addresses and redirects the
//!   client's packets to the node; a SYN for a 4-tuple that still has an
//!   entry deletes it (port reuse, seed 004 §4.2). The nftables backend
//!   (netdev ingress map + `fwd`) is the fallback. [`steer::NoSocketDrop`]
//!   is the rule every taker needs: packets for the VIP that find no socket
//!   (they arrive while a restore is in progress) are dropped, not reset, so
//!   the client simply retransmits.
//! * [`netns`]: entering network namespaces from threads and commands (the
//!   steering backends configure the switch's namespace with it; the lab
//!   crate, `switchyard-lab`, builds its multi-host topology on it).
//!
//! When a handoff cannot happen (no CAP_NET_ADMIN: [`HandoffError::NoPrivilege`];
//! a connection not in ESTABLISHED: [`HandoffError::NotMovable`]; a node that
//! answers `Drop`), the switch keeps the connection: [`repair::dump`] leaves
//! the socket usable on error, and after a successful dump the switch keeps
//! the (silent, repair-mode) socket until the node says `Accepted`, so on
//! `Drop` it removes the steering entry, leaves repair mode and relays. When
//! the node's answer stays unknown (see [`mover`]) the switch closes that
//! socket in repair mode, which sends nothing, and never relays it.

pub mod error;
pub mod fdpass;
pub mod link;
pub mod metrics;
pub mod mover;
pub mod netns;
pub mod proto;
pub mod repair;
pub mod steer;
pub mod taker;

pub use error::{HandoffError, Result};
