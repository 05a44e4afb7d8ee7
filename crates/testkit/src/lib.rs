//! Test support shared by the switchyard test suites; used only as a
//! dev-dependency, never by a library or the binary.
//!
//! * [`http`]: a raw HTTP/1.x client over a blocking [`std::net::TcpStream`]
//!   (send bytes, read one response with status, headers and body, keep the
//!   connection for the next one), a reader for callers that hold their own
//!   stream and buffer, and a one-shot HTTP/1.0 `GET`.
//! * [`app`]: a small application server (computed answers, echoed request
//!   bodies, stalls, closes and malformed responses on purpose) for the
//!   tests of dynamic content.
//! * [`fixture`]: files for document roots (deterministic contents, written
//!   below a root).
//! * [`pipeline`]: randomized pipelined exchanges with a per-request oracle, for stressing a
//!   delivery mode.
//! * [`wait`]: a bounded wait for a state that shows no event (a gauge in
//!   `/metrics`).
//! * [`crowd`]: a flash crowd's client for the rescue suites (a loopback address of its own,
//!   redirects followed to the rescue server).
//! * [`engines`]: a real etcd cluster and a real BIND 9 named with TSIG-updatable zones,
//!   started from temporary directories on free loopback ports, and `dig` as their client.
//! * [`exit`]: a process's exit as an event (a pidfd), to wait for processes
//!   without polling.
//! * `root` (feature `root`): the runner of the root test targets, which
//!   reports them as ignored, with the reason, where they cannot run.
//!
//! The crate depends on no server crate (node, switch): a suite that starts
//! real servers does so itself, so no crate's tests link a second copy of
//! that crate.

pub mod app;
pub mod crowd;
pub mod engines;
pub mod exit;
pub mod fixture;
pub mod http;
pub mod pipeline;
#[cfg(feature = "root")]
pub mod root;
pub mod wait;

pub use fixture::{pattern, write};
pub use wait::eventually;
