//! Replays a seed 003-shaped trace on real nodes on loopback and in the simulator, and prints the
//! two hit rates as one JSON object.
//!
//! ```text
//! cargo run --release -p switchyard-sim --example realcheck -- \
//!     [--nodes 4] [--scale 0.05] [--requests 100000] [--clients 8] [--policy lard] [--http 1.0]
//! ```

#[path = "../tests/support/realcheck.rs"]
mod realcheck;

use realcheck::{run_check, CheckConfig};
use switchyard_sim::DEFAULT_CACHE_BYTES;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let scale: f64 = get("--scale").map_or(0.05, |s| s.parse().expect("--scale"));
    let cfg = CheckConfig {
        nodes: get("--nodes").map_or(4, |s| s.parse().expect("--nodes")),
        scale,
        requests: get("--requests").map_or(100_000, |s| s.parse().expect("--requests")),
        seed: get("--seed").map_or(1, |s| s.parse().expect("--seed")),
        cache_bytes: get("--cache-bytes")
            .map_or((DEFAULT_CACHE_BYTES as f64 * scale) as u64, |s| {
                s.parse().expect("--cache-bytes")
            }),
        clients: get("--clients").map_or(8, |s| s.parse().expect("--clients")),
        policy: get("--policy").map_or(switchyard_policy::PolicyKind::Lard, |s| {
            s.parse().expect("--policy")
        }),
        http: get("--http").map_or(switchyard_sim::Http::V10, |s| s.parse().expect("--http")),
    };
    let r = run_check(&cfg);
    println!("{}", serde_json::to_string(&r).unwrap());
}
