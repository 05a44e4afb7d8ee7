//! switchyard-sim: a trace-driven, discrete-event simulator of a switchyard cluster that runs the
//! real dispatching policies (`switchyard-policy`) and the real node caches (`switchyard-cache`),
//! so that design questions can be answered at cluster sizes one machine cannot host.
//!
//! It follows the simulator of seed 003 §6 (Aron, Druschel, Zwaenepoel, "Efficient Support for
//! P-HTTP in Cluster-Based Web Servers", which extends the one of Pai et al., ASPLOS 1998).
//!
//! # The model
//!
//! * **Engine** ([`engine`]): a binary heap of events keyed by simulated time (nanoseconds) and a
//!   sequence number, so that events at the same time are taken in the order they were
//!   scheduled; a run is a pure function of its configuration and workload. No I/O, no clock.
//! * **Node**: a CPU and a disk, each a FIFO queue of jobs, and a main-memory cache (the real
//!   [`switchyard_cache::Cache`], 85 MB LRU by default as in seed 003 §6). A request costs the
//!   serving node's CPU a per-request overhead, then (cache hit) the transmit cost of
//!   24 µs per 512 bytes, or (miss) a disk read and then the transmit cost. The node that first
//!   handles a connection pays its establishment, the one holding it at the end its teardown.
//!   Costs come from [`CpuCosts`]: the Apache and Flash figures of §6 as presets. The disk
//!   ([`DiskCosts`]) charges 28 ms of positioning, 410 µs per 4 KB, and 14 ms more per 44 KB
//!   extent after the first. Only the job at the head of a queue is in service, so the event
//!   heap never holds more than two events per node.
//! * **Mechanisms** ([`RequestDistribution`], seed 003 §3): *single handoff* places each connection once
//!   (HTTP/1.0, or simple persistent connections); *multiple handoff* moves the connection to
//!   the node the policy chose, at a handoff cost on the receiving node, after the responses
//!   under way have been sent; *back-end forwarding* leaves the connection where it is and has
//!   the handling node relay the response at a per-byte cost; a *relaying front end* keeps
//!   persistent connections to the nodes (which then pay no per-client connection costs) and may
//!   itself be given costs ([`FrontEndCosts`]); the *zero-cost ideal* moves connections for free.
//!   The policy's [`switchyard_policy::Decision`] says which node serves and whether it caches
//!   the target; the mechanism says what that costs and where.
//! * **Policies**: any `switchyard-policy` policy, built from a
//!   [`switchyard_policy::PolicyConfig`] and driven exactly as the switch drives it:
//!   `connection_start`, `select` per request (per connection under single handoff),
//!   `post_request` when the response is sent, `connection_end`, and a `load_report` from a node
//!   (active connections, disk queue) each time its disk queue or connections change — the
//!   event-driven load reports of seed 004 §2.2.
//! * **Workloads** ([`workload`]): a `switchyard trace` workload, as HTTP/1.0 (a connection per
//!   request) or HTTP/1.1 (the grouping of seed 003 §6: same client, gaps under 15 s; pipelined
//!   batches under 5 s), from an access log or from the synthetic generator (seed 004 Table 1
//!   model; [`workload::seed003_synth`] shapes it like seed 003's trace).
//! * **Arrival matched to throughput** (seed 003 §6): a closed loop. A fixed population of
//!   clients ([`SimConfig::clients`], by default `L_idle` = 30 per node, the load at which seed
//!   003 Fig. 3 puts a node at full utilization) each runs the trace's next connection as soon as
//!   its previous one has ended, sends a batch when the previous batch is answered and never
//!   thinks: requests enter exactly as fast as the cluster completes them. A request the policy
//!   refuses (all nodes past `L_overload`) waits at the front end and is offered again after
//!   each completion. Throughput is the number of requests divided by the simulated time until
//!   the last response (after an optional warm-up), as in the paper.
//! * **Pipelining** ([`Pipelining`]): the requests of a batch are selected together when the
//!   batch arrives and are then under way concurrently (default) or one at a time.
//!
//! # Output
//!
//! [`RunResult`] holds throughput, hit rate, bandwidth, mean response time, CPU and disk idle
//! share per node and the policy's counters; [`report`] writes CSV, and everything serializes to
//! JSON. [`sweep`] runs series × cluster sizes on several threads; [`plot`] draws SVG charts in
//! the style of seed 003 Figs. 5–8; [`analysis`] reproduces the §5 comparison of multiple handoff
//! and back-end forwarding by response size; [`paper`] runs the whole §5–§6 reproduction and
//! checks the paper's findings; [`cli`] is `switchyard sim`. [`rescue`] runs a different model:
//! an origin site and rescue servers driven by the rescue core of `switchyard-rescue` (seed 001).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use switchyard_policy::PolicyKind;
//! use switchyard_sim::{simulate, Http, RequestDistribution, SimConfig, SimWorkload, Targets};
//!
//! let targets = Arc::new(Targets {
//!     keys: vec!["/a.html".into(), "/b.gif".into()],
//!     sizes: vec![8192, 2048],
//! });
//! // Two persistent connections: a page, then a pipelined batch of two requests.
//! let conns = vec![vec![vec![0], vec![1, 1]]; 2];
//! let w = SimWorkload::from_connections(targets, Http::V11, &conns).unwrap();
//! let cfg = SimConfig::new(2, PolicyKind::ExtLard, RequestDistribution::Forward);
//! let r = simulate(&cfg, &w).unwrap();
//! assert_eq!(r.measured_requests, 6);
//! assert!(r.throughput > 0.0);
//! ```

#![warn(missing_docs)]

pub mod analysis;
pub mod cli;
pub mod config;
pub mod cyclone;
mod cyclone_cli;
pub mod engine;
mod error;
pub mod paper;
pub mod plot;
pub mod report;
pub mod rescue;
mod sim;
pub mod sweep;
pub mod workload;

pub use config::{
    CpuCosts, DiskCosts, FrontEndCosts, Nanos, Pipelining, Preset, RequestDistribution, SimConfig,
    DEFAULT_CACHE_BYTES,
};
pub use error::SimError;
pub use report::{NodeResult, RunResult};
pub use sim::{simulate, simulate_observed, simulate_with_policy, Completion};
pub use workload::{Http, SimWorkload, Targets, WorkloadSummary};
