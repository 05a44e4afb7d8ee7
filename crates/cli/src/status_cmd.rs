//! `switchyard status`: a running switch's state in the terminal, from its admin listener.
//!
//! Reads `/status.json` (counters since start) and `/dashboard.json` (the dashboard's last
//! update: rates and response times over the last second or seconds) and prints one line per
//! node, like `haproxy show stat`; `--json` prints both documents as one JSON object for
//! scripts; `--watch` redraws in place every `--interval` until Ctrl-C.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};
use switchyard_admin::dashboard::{Meta, State as NodeState, Update};
use switchyard_admin::status::SwitchStatus;

/// The admin address of `switchyard demo` (and the fallback when no config names one).
const DEFAULT_ADMIN: &str = "127.0.0.1:9080";
/// Longest wait for the admin listener's answer.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Flags of `switchyard status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The switch's admin listener (default: `admin` of the config file's [switch], else
    /// 127.0.0.1:9080, where `switchyard demo` puts it).
    #[arg(long)]
    pub admin: Option<String>,
    /// Print the switch's state as JSON: {"status": …, "dashboard": {"meta": …, "update": …}}.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Redraw in place every --interval until Ctrl-C.
    #[arg(long)]
    pub watch: bool,
    /// Seconds between two redraws with --watch.
    #[arg(long, default_value_t = 1.0, value_parser = positive_seconds)]
    pub interval: f64,
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.05 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds of at least 0.05")),
    }
}

/// What `/dashboard.json` holds (both `null` before the switch's first sample).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Dashboard {
    pub meta: Option<Meta>,
    pub update: Option<Update>,
}

/// The two documents together, as `--json` prints them.
#[derive(Debug, Serialize, Deserialize)]
pub struct State {
    pub status: SwitchStatus,
    pub dashboard: Dashboard,
}

/// GET `path` from `addr` (one request, `Connection: close`); the body of a 200.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).with_context(|| {
        format!("cannot reach the admin listener at {addr} (is a switch running with `admin` set there?)")
    })?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: switchyard-status\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.take(MAX_BODY as u64)
        .read_to_end(&mut raw)
        .with_context(|| format!("reading {path} from {addr}"))?;
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(&raw) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => anyhow::bail!("{addr}{path}: not an HTTP response"),
    };
    let code = resp.code.unwrap_or(0);
    let length = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        });
    let body = raw[head_len..].to_vec();
    if code != 200 {
        anyhow::bail!(
            "{addr}{path}: status {code}: {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    if let Some(n) = length {
        if body.len() != n {
            anyhow::bail!(
                "{addr}{path}: answer cut short ({} of {n} bytes)",
                body.len()
            );
        }
    }
    Ok(body)
}

/// Read both documents from the switch at `addr`.
pub fn fetch(addr: SocketAddr) -> anyhow::Result<State> {
    let status = serde_json::from_slice(&get(addr, "/status.json")?)
        .with_context(|| format!("{addr}/status.json is not a switch's status"))?;
    let dashboard = serde_json::from_slice(&get(addr, "/dashboard.json")?)
        .with_context(|| format!("{addr}/dashboard.json is not a switch's dashboard state"))?;
    Ok(State { status, dashboard })
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v}"))
}

fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
}

/// The table: a heading line, one line per node, a total line, hot targets and fallbacks.
pub fn render(addr: &str, s: &State) -> String {
    let st = &s.status;
    let mut out = String::new();
    let up = st.nodes.iter().filter(|n| n.up).count();
    let _ = writeln!(
        out,
        "switch {addr}: policy {}, {}, generation {}, {} client connections, {} queued, {}/{} nodes up",
        st.policy,
        st.mechanism,
        st.generation,
        st.connections_active,
        st.queue_length,
        up,
        st.nodes.len()
    );
    // The last update's rows, matched by name (the update may follow another generation).
    let rows = match (&s.dashboard.meta, &s.dashboard.update) {
        (Some(m), Some(u)) if m.generation == u.g => m.nodes.iter().zip(&u.n).collect(),
        _ => Vec::new(),
    };
    let row_of = |name: &str| rows.iter().find(|(n, _)| n.as_str() == name).map(|r| r.1);
    let header = [
        "node", "state", "req/s", "MB/s", "active", "load", "p50ms", "p99ms", "ho/s", "fb/s",
        "requests", "MB", "failures", "targets",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for n in &st.nodes {
        let name = n.addr.to_string();
        let r = row_of(&name);
        lines.push(vec![
            name,
            // The dashboard's state tells a node the operator holds out from a failed one.
            match (r.map(|r| r.state), n.up) {
                (Some(NodeState::Draining), _) => "DRAINING",
                (Some(NodeState::Drained), _) => "DRAINED",
                (Some(NodeState::Held), _) => "HELD",
                (_, true) => "UP",
                (_, false) => "DOWN",
            }
            .to_owned(),
            opt(r.map(|r| r.rps.0)),
            opt(r.map(|r| r.mbps.0)),
            n.active.to_string(),
            format!("{:.1}", n.load),
            opt(r.and_then(|r| r.p50).map(|v| v.0)),
            opt(r.and_then(|r| r.p99).map(|v| v.0)),
            opt(r.map(|r| r.moves.0)),
            opt(r.map(|r| r.fallbacks.0)),
            n.requests.to_string(),
            mb(n.bytes),
            n.failures.to_string(),
            n.targets.to_string(),
        ]);
    }
    let u = s.dashboard.update.as_ref();
    lines.push(vec![
        "total".to_owned(),
        String::new(),
        opt(u.map(|u| u.c.rps.0)),
        opt(u.map(|u| u.c.mbps.0)),
        st.nodes.iter().map(|n| n.active).sum::<u64>().to_string(),
        String::new(),
        String::new(),
        String::new(),
        opt(u.map(|u| u.c.moves.0)),
        opt(u.map(|u| u.c.fb.0)),
        st.nodes.iter().map(|n| n.requests).sum::<u64>().to_string(),
        mb(st.nodes.iter().map(|n| n.bytes).sum()),
        st.nodes.iter().map(|n| n.failures).sum::<u64>().to_string(),
        st.policy_stats.targets_mapped.to_string(),
    ]);
    let widths: Vec<usize> = (0..header.len())
        .map(|c| lines.iter().map(|l| l[c].len()).max().unwrap_or(0))
        .collect();
    for l in &lines {
        let mut text = String::new();
        for (c, cell) in l.iter().enumerate() {
            if c == 0 {
                let _ = write!(text, "{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(text, "  {cell:>w$}", w = widths[c]);
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    }
    if let (Some(m), Some(u)) = (&s.dashboard.meta, u) {
        if !u.map.hot.is_empty() {
            let hot: Vec<String> = u
                .map
                .hot
                .iter()
                .map(|h| {
                    let node = m.nodes.get(h.1 as usize).map_or("?", String::as_str);
                    format!("{} → {node} {}/s", h.0, h.2 .0)
                })
                .collect();
            let _ = writeln!(out, "hot targets: {}", hot.join(", "));
        }
    }
    let fb: Vec<String> = st
        .handoff
        .fallbacks
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    let _ = writeln!(
        out,
        "handoffs: {} fd, {} repair, {} hand-backs; fallbacks: {}",
        st.handoff.fd,
        st.handoff.repair,
        st.handoff.hand_backs,
        if fb.is_empty() {
            "none".to_owned()
        } else {
            fb.join(", ")
        }
    );
    if s.dashboard.update.is_none() {
        let _ = writeln!(out, "(no rates yet: the switch samples once a second)");
    }
    out
}

/// The admin address to read: the flag, else the config's, else the demo's.
fn resolve(flag: Option<&str>, config: Option<SocketAddr>) -> anyhow::Result<SocketAddr> {
    match flag {
        Some(a) => a
            .to_socket_addrs()
            .with_context(|| format!("--admin {a}: not an address (host:port)"))?
            .next()
            .with_context(|| format!("--admin {a}: no address")),
        None => Ok(config.unwrap_or_else(|| DEFAULT_ADMIN.parse().expect("a valid address"))),
    }
}

/// Run `switchyard status`.
pub fn run(args: StatusArgs, config_admin: Option<SocketAddr>) -> anyhow::Result<()> {
    let addr = resolve(args.admin.as_deref(), config_admin)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let state = fetch(addr)?;
        serde_json::to_writer_pretty(&mut out, &state)?;
        writeln!(out)?;
        return Ok(());
    }
    if !args.watch {
        out.write_all(render(&addr.to_string(), &fetch(addr)?).as_bytes())?;
        return Ok(());
    }
    let every = Duration::from_secs_f64(args.interval);
    loop {
        // Home, clear the screen, then the table: the terminal shows the latest only.
        let text = match fetch(addr) {
            Ok(s) => render(&addr.to_string(), &s),
            Err(e) => format!("switchyard status: {e:#}\n"),
        };
        write!(out, "\x1b[H\x1b[2J{text}")?;
        writeln!(out, "(every {:.1} s; Ctrl-C to stop)", every.as_secs_f64())?;
        out.flush()?;
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_admin::dashboard::{ClusterSample, HotCount, NodeSample, Sampler};

    fn state() -> State {
        let status: SwitchStatus = serde_json::from_value(serde_json::json!({
            "generation": 1, "policy": "lard", "connections_active": 2, "queue_length": 0,
            "retries": 0,
            "policy_stats": {"decisions": 30, "rejections": 0, "targets_mapped": 4, "replicas": 0,
                             "reassignments": 0, "spills": 0},
            "nodes": [
                {"id": 0, "addr": "127.0.0.1:8081", "up": true, "active": 1, "requests": 20,
                 "bytes": 2500000, "failures": 0, "pool_idle": 1, "targets": 3, "load": 1.0},
                {"id": 1, "addr": "127.0.0.1:8082", "up": false, "active": 0, "requests": 10,
                 "bytes": 1000, "failures": 4, "pool_idle": 0, "targets": 1, "load": 0.0},
                {"id": 2, "addr": "127.0.0.1:8083", "up": false, "active": 0, "requests": 0,
                 "bytes": 0, "failures": 0, "pool_idle": 0, "targets": 0, "load": 0.0}
            ],
            "mechanism": "handoff",
            "handoff": {"fd": 25, "repair": 0, "hand_backs": 0, "backend_forwards": 0,
                        "connections_active": 1, "steering": null, "steering_entries": 0,
                        "steering_error": null, "late_accepts": 0, "abandoned": {},
                        "fallbacks": {"timeout": 2, "refused": 0}}
        }))
        .unwrap();
        let mut sampler = Sampler::new("switch", Duration::from_secs(1), Duration::from_secs(5));
        let sample = |at: u64, requests: u64| ClusterSample {
            at: Duration::from_secs(at),
            generation: 1,
            policy: "lard".into(),
            mechanism: "handoff".into(),
            connections: 2,
            queue: 0,
            fallbacks: Default::default(),
            targets_mapped: 4,
            replicas: 0,
            hot: vec![HotCount {
                target: "/a.html".into(),
                node: 0,
                count: 7,
                error: 0,
            }],
            nodes: vec![
                NodeSample {
                    requests,
                    ..NodeSample::new("127.0.0.1:8081")
                },
                NodeSample {
                    up: false,
                    ..NodeSample::new("127.0.0.1:8082")
                },
                NodeSample {
                    up: false,
                    held: Some(switchyard_admin::dashboard::Hold::Drain),
                    ..NodeSample::new("127.0.0.1:8083")
                },
            ],
        };
        sampler.step(&sample(1, 10));
        let step = sampler.step(&sample(2, 20));
        State {
            status,
            dashboard: Dashboard {
                meta: Some((*step.meta).clone()),
                update: Some(step.update),
            },
        }
    }

    #[test]
    fn a_line_per_node_with_rates_and_totals() {
        let text = render("127.0.0.1:9080", &state());
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("policy lard, handoff, generation 1"),
            "{text}"
        );
        assert!(lines[0].contains("1/3 nodes up"), "{text}");
        assert!(
            lines[1].starts_with("node") && lines[1].contains("p99ms"),
            "{text}"
        );
        let n0: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(&n0[..4], &["127.0.0.1:8081", "UP", "10", "0"], "{text}");
        assert!(lines[3].contains("DOWN"), "{text}");
        assert!(
            lines[4].contains("DRAINED"),
            "drained by the operator: {text}"
        );
        let total: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(total[0], "total");
        assert!(lines[5].contains(" 30 "), "requests summed: {text}");
        assert!(
            text.contains("hot targets: /a.html → 127.0.0.1:8081 7/s"),
            "{text}"
        );
        assert!(text.contains("fallbacks: timeout 2\n"), "{text}");
        // Columns line up: each value ends where its heading does.
        let req_end = lines[1].find("req/s").unwrap() + "req/s".len();
        assert_eq!(lines[2].as_bytes()[req_end - 1], b'0', "{text}");
    }

    #[test]
    fn without_an_update_the_rates_are_dashes() {
        let mut s = state();
        s.dashboard = Dashboard::default();
        let text = render("a", &s);
        let n0: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(&n0[..3], &["127.0.0.1:8081", "UP", "-"]);
        assert!(text.contains("no rates yet"));
    }

    #[test]
    fn the_admin_address_comes_from_the_flag_the_config_or_the_demo() {
        let cfg: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        assert_eq!(resolve(Some("127.0.0.1:1"), Some(cfg)).unwrap().port(), 1);
        assert_eq!(resolve(None, Some(cfg)).unwrap(), cfg);
        assert_eq!(resolve(None, None).unwrap().to_string(), DEFAULT_ADMIN);
        let e = resolve(Some("nope"), None).unwrap_err();
        assert!(format!("{e:#}").contains("--admin nope"), "{e:#}");
    }
}
