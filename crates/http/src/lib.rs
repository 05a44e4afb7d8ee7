//! HTTP/1.x message handling shared by every switchyard process.
//!
//! This crate holds the parts of HTTP that the node (origin server), the
//! switch (front end) and the tools must agree on byte for byte:
//!
//! * [`request`]: parsing a request head with strict limits and one single
//!   interpretation of message length (the request-smuggling rules of the
//!   strict proxies: no `Content-Length` together with `Transfer-Encoding`,
//!   no duplicate or malformed `Content-Length`, no obs-fold, only `chunked`
//!   as the final transfer coding). Every failure maps to one status code.
//! * [`chunked`]: an incremental decoder for chunked request bodies.
//! * [`path`]: turning a request target into a normalized, percent-decoded
//!   path that can never climb above the document root.
//! * [`range`] and [`conditional`]: single byte ranges and validators
//!   (ETag, Last-Modified) for 206/304/416 decisions.
//! * [`response`]: writing response heads.
//! * [`cache_control`]: a response's `Cache-Control` directives and the freshness lifetime
//!   they give a shared cache (the rescue server's proxy).
//! * [`upstream`]: reading the response heads of a node as an intermediary
//!   (the switch relaying, a node forwarding for another) with the same
//!   strictness, and rewriting heads in both directions.
//!
//! Nothing here performs I/O or reads a clock: callers pass bytes in and
//! the wall-clock time for `Date` headers in.

pub mod cache_control;
pub mod chunked;
pub mod conditional;
pub mod path;
pub mod range;
pub mod request;
pub mod response;
pub mod status;
pub mod upstream;

pub use request::{BodyFraming, Limits, Method, ParseOutcome, RequestError, RequestHead, Version};
pub use response::ResponseHead;
