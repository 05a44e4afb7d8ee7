//! Randomized pipelining with a per-request oracle, shared by the suites that stress a delivery
//! mode with it (the switch's same-host modes, the lab's modes across hosts).
//!
//! A trial opens a connection and writes a random run of pipelined requests (GET and HEAD,
//! ranges, bodies, missing targets, HTTP/1.0 and 1.1 with and without keep-alive) in one
//! buffer cut at random points into separate writes. The oracle knows each answer's status and
//! body and whether the connection goes on after it; every answer must arrive, in order, and
//! the connection must close exactly after the first request that ends it. The server's
//! document root holds [`fill`]'s files. A trial is reproducible from its seed, and a failure
//! names the seed and the requests.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;

use crate::fixture::pattern;
use crate::http::Client;

/// Sizes of the targets `/f0`..: small, spanning a read buffer, and large enough to be
/// sent with sendfile and relayed with splice.
pub const SIZES: [usize; 5] = [0, 13, 4_000, 70_000, 300_000];

pub fn body_of(i: usize) -> Vec<u8> {
    pattern(SIZES[i], i as u8 + 1)
}

/// xorshift64*: the trial's randomness, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One request and what must come back.
#[derive(Debug)]
struct Exchange {
    wire: Vec<u8>,
    head_only: bool,
    status: u16,
    body: Vec<u8>,
    /// The connection carries another request after this one.
    keep: bool,
}

fn random_exchange(rng: &mut Rng) -> Exchange {
    let http10 = rng.below(3) == 0;
    let keep = match (http10, rng.below(5)) {
        (true, 0) => false,
        (true, _) => true,
        (false, 0) => false,
        (false, _) => true,
    };
    let missing = rng.below(12) == 0;
    let f = rng.below(SIZES.len() as u64) as usize;
    let target = if missing {
        "/missing".to_owned()
    } else {
        format!("/f{f}")
    };
    let head = rng.below(5) == 0;
    let mut fields = String::new();
    if !http10 {
        fields.push_str("Host: t\r\n");
    }
    match (http10, keep) {
        (true, true) => fields.push_str("Connection: keep-alive\r\n"),
        (false, false) => fields.push_str("Connection: close\r\n"),
        _ => {}
    }
    let full = if missing { Vec::new() } else { body_of(f) };
    let (mut status, mut body) = if missing {
        (404, Vec::new())
    } else {
        (200, full.clone())
    };
    // A single satisfiable range of a non-empty file.
    if !missing && !head && !full.is_empty() && rng.below(4) == 0 {
        let len = full.len() as u64;
        let a = rng.below(len);
        let b = a + rng.below(len - a);
        fields.push_str(&format!("Range: bytes={a}-{b}\r\n"));
        status = 206;
        body = full[a as usize..=b as usize].to_vec();
    }
    // A request body (read and dropped by the node).
    let req_body = if !head && rng.below(6) == 0 {
        let n = rng.below(3_000) as usize + 1;
        fields.push_str(&format!("Content-Length: {n}\r\n"));
        pattern(n, 9)
    } else {
        Vec::new()
    };
    let method = if head { "HEAD" } else { "GET" };
    let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
    let mut wire = format!("{method} {target} {version}\r\n{fields}\r\n").into_bytes();
    wire.extend_from_slice(&req_body);
    if missing {
        // The node's 404 page: only its status is checked.
        body = Vec::new();
    }
    if head {
        body = Vec::new();
    }
    Exchange {
        wire,
        head_only: head,
        status,
        body,
        keep,
    }
}

/// Run one trial on a new connection to `addr`; an error describes what went wrong.
pub fn trial(addr: SocketAddr, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed | 1);
    let n = rng.below(6) + 1;
    // Nothing is sent after a request that ends the connection (RFC 9112 §9.3.2): bytes that
    // reach a closed socket make it answer with a reset, which destroys the answers not yet
    // read.
    let mut exchanges: Vec<Exchange> = Vec::new();
    while exchanges.len() < n as usize && exchanges.last().is_none_or(|e| e.keep) {
        exchanges.push(random_exchange(&mut rng));
    }
    let n = exchanges.len();
    let mut all = Vec::new();
    for e in &exchanges {
        all.extend_from_slice(&e.wire);
    }
    let mut c = Client::connect(addr);
    c.stream.set_nodelay(true).unwrap();
    // Random cuts into separate writes.
    let mut at = 0;
    while at < all.len() {
        let step = match rng.below(4) {
            0 => 1 + rng.below(8) as usize,
            1 => 1 + rng.below(200) as usize,
            _ => all.len() - at,
        };
        let end = (at + step).min(all.len());
        // The server may close after a request that ends the connection: later writes may fail.
        if c.stream.write_all(&all[at..end]).is_err() {
            break;
        }
        at = end;
    }
    let describe = || {
        exchanges
            .iter()
            .map(|e| String::from_utf8_lossy(&e.wire[..e.wire.len().min(120)]).into_owned())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    for (i, e) in exchanges.iter().enumerate() {
        let r = c.try_response(e.head_only).map_err(|err| {
            format!(
                "seed {seed}: answer {i} of {n} missing ({err}); requests: {}",
                describe()
            )
        })?;
        let body_ok = e.status == 404 || e.head_only || r.body == e.body;
        if r.status != e.status || !body_ok {
            return Err(format!(
                "seed {seed}: answer {i}: status {} ({} body bytes), expected {} ({} bytes); requests: {}",
                r.status,
                r.body.len(),
                e.status,
                e.body.len(),
                describe()
            ));
        }
        if !e.keep {
            if !c.is_closed() {
                return Err(format!(
                    "seed {seed}: connection open after answer {i}, which ends it; requests: {}",
                    describe()
                ));
            }
            return Ok(());
        }
    }
    Ok(())
}

/// Writes the trials' targets below `root`: `/f0`.. with [`SIZES`] bytes each, and `/who`
/// naming node `who`.
pub fn fill(root: &Path, who: usize) {
    std::fs::write(root.join("who"), format!("node{who}")).unwrap();
    for i in 0..SIZES.len() {
        std::fs::write(root.join(format!("f{i}")), body_of(i)).unwrap();
    }
}

/// Trials per mode and the first seed: `SWITCHYARD_PIPELINE_TRIALS` and
/// `SWITCHYARD_PIPELINE_SEED` when set, else `default_trials` and a fixed seed.
pub fn trials_from_env(default_trials: u64) -> (u64, u64) {
    let n = std::env::var("SWITCHYARD_PIPELINE_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_trials);
    let seed = std::env::var("SWITCHYARD_PIPELINE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    (n, seed)
}

/// Run `n` trials against `addr` on `clients` connections at once (so that connections
/// interleave at the server), the `k`-th from a seed derived from `seed` and `k`; the
/// descriptions of the failed ones.
pub fn run_trials(addr: SocketAddr, n: u64, seed: u64, clients: u64) -> Vec<String> {
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..clients)
            .map(|c| {
                s.spawn(move || {
                    (0..n)
                        .filter(|k| k % clients == c)
                        .filter_map(|k| {
                            trial(addr, seed.wrapping_mul(1_000_003).wrapping_add(k)).err()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    })
}
