//! Serving plumbing shared by the switchyard node and switch.
//!
//! Both servers run thread-per-core: [`workers`] starts one OS thread per `SO_REUSEPORT`
//! listener ([`mod@listen`]), each a single-threaded tokio runtime whose
//! [`accept::accept_loop`] bounds open connections with slots and backs off when accepting
//! fails for lack of resources. Connections come bare ([`socket::ClientSocket`]): registered
//! with the event loop only once they must wait. An idle keep-alive connection waits without
//! buffers in [`idle::wait_for_bytes`], and one that stays idle gives up its task and is parked
//! in its worker's table ([`park`]) until its client sends again (the buffers it gave up wait
//! in [`spare`] for the next request on the thread); request heads and bodies are
//! read by [`request::next_head`] and [`request::read_body`] (or passed on as they arrive by
//! [`request::stream_body`]); a connection that ends after an error closes with
//! [`close::linger`]. On shutdown each worker drains: it waits, woken by the last connection
//! that drops its [`workers::Live`] handle, until its connections are gone or the grace period
//! is over.
//!
//! At start the descriptor limit is raised and a default connection cap derived from it
//! ([`nofile`]); when every slot is taken, the connection that has waited longest on its client
//! is shed for a newcomer ([`shed`]).
//!
//! What every request counts (status codes, bytes, response times) is kept once per worker
//! ([`per_worker::PerWorker`]), so the workers never write the same cache lines.
//!
//! The node's load reports to the switch travel as [`report::Datagram`]s.
//!
//! This crate knows nothing of the node or the switch; it depends only on
//! the policy crate for [`switchyard_policy::LoadReport`] and on the http
//! crate for parsing requests.

pub mod accept;
pub mod close;
pub mod idle;
pub mod listen;
pub mod nofile;
pub mod park;
pub mod per_worker;
pub mod report;
pub mod request;
pub mod shed;
pub mod socket;
pub mod spare;
pub mod timer;
pub mod workers;

pub use accept::{accept_loop, AcceptStats, Incoming, Listener, WhenFull};
pub use listen::{listen, listen_std};
pub use socket::ClientSocket;
pub use timer::WaitTimer;
pub use workers::{Live, WeakLive, Workers};
