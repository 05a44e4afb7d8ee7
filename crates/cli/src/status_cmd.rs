//! `switchyard status`: a running cluster's state in the terminal, from an admin listener: a
//! switch's, a cooperative member's (the whole cluster as that member sees it), or a node's
//! that runs a rescue driver outside a cluster.
//!
//! Reads `/status.json` (counters since start; its shape tells the kind of process) and
//! `/dashboard.json` (the dashboard's last update: rates and response times over the last
//! second or seconds) and prints one line per node or member, like `haproxy show stat`, and
//! the site's flash-crowd rescue state when it has one; `--json` prints both documents as one
//! JSON object for scripts; `--watch` redraws in place every `--interval` until Ctrl-C.
//!
//! A cooperative member samples its peers only while someone watches: its first
//! `/dashboard.json` may be old, so a single reading waits (at most [`FRESH_WAIT`]) for an
//! update newer than the first one it saw.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};
use switchyard_admin::cluster::ClusterStatus;
use switchyard_admin::dashboard::{Meta, NodeRow, State as NodeState, Update};
use switchyard_admin::status::{RescueStatus, SwitchStatus};

/// The admin address of `switchyard demo` (and the fallback when no config names one).
const DEFAULT_ADMIN: &str = "127.0.0.1:9080";
/// Longest wait for the admin listener's answer.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// How long a single reading of a cooperative member waits for a fresh update.
const FRESH_WAIT: Duration = Duration::from_millis(2500);
/// Time between two readings of `/dashboard.json` while waiting for a fresh update.
const FRESH_POLL: Duration = Duration::from_millis(200);

/// Flags of `switchyard status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The admin listener of a switch or of a cooperative member (default: `admin` of the
    /// config file's [switch], else of its [node], else 127.0.0.1:9080, where `switchyard demo`
    /// puts it).
    #[arg(long)]
    pub admin: Option<String>,
    /// Print the state as JSON: {"kind": …, "status": …, "dashboard": {"meta": …, "update": …}}.
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

/// What `/dashboard.json` holds (both `null` before the first sample).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Dashboard {
    pub meta: Option<Meta>,
    pub update: Option<Update>,
}

/// A node's `/status.json` outside a cluster: its rescue driver's state.
#[derive(Debug, Serialize, Deserialize)]
pub struct AloneStatus {
    pub rescue: Option<RescueStatus>,
}

/// `/status.json` of one of the three kinds of process with a dashboard.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Status {
    /// A switch.
    Switch(SwitchStatus),
    /// A cooperative member: the cluster as it sees it.
    Cluster(ClusterStatus),
    /// A node outside a cluster with a rescue driver.
    Alone(AloneStatus),
}

impl Status {
    /// The kind's name, as `--json` gives it.
    pub fn kind(&self) -> &'static str {
        match self {
            Status::Switch(_) => "switch",
            Status::Cluster(_) => "cooperative",
            Status::Alone(_) => "node",
        }
    }

    /// Reads `/status.json`: its shape tells the kind.
    pub fn parse(body: &[u8]) -> anyhow::Result<Status> {
        let v: serde_json::Value = serde_json::from_slice(body).context("not JSON")?;
        let has = |k: &str| v.get(k).is_some();
        Ok(if has("members") {
            Status::Cluster(serde_json::from_value(v).context("not a cooperative member's status")?)
        } else if has("nodes") {
            Status::Switch(serde_json::from_value(v).context("not a switch's status")?)
        } else if has("rescue") {
            Status::Alone(serde_json::from_value(v).context("not a node's rescue status")?)
        } else {
            anyhow::bail!("neither a switch's, a cooperative member's nor a node's status")
        })
    }

    fn rescue(&self) -> Option<&RescueStatus> {
        match self {
            Status::Switch(s) => s.rescue.as_ref(),
            Status::Cluster(c) => c.rescue.as_ref(),
            Status::Alone(a) => a.rescue.as_ref(),
        }
    }
}

/// The two documents together, as `--json` prints them.
#[derive(Debug, Serialize)]
pub struct State {
    pub kind: &'static str,
    pub status: Status,
    pub dashboard: Dashboard,
}

/// GET `path` from `addr` (one request, `Connection: close`); the body of a 200.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).with_context(|| {
        format!("cannot reach the admin listener at {addr} (is a switch or node running with `admin` set there?)")
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

fn dashboard(addr: SocketAddr) -> anyhow::Result<Dashboard> {
    serde_json::from_slice(&get(addr, "/dashboard.json")?)
        .with_context(|| format!("{addr}/dashboard.json is not a dashboard's state"))
}

/// Read both documents from the admin listener at `addr`. With `fresh`, a cooperative
/// member's dashboard is read again until its update is newer than the first one seen (the
/// first reading asks the member to sample), for at most [`FRESH_WAIT`].
pub fn fetch(addr: SocketAddr, fresh: bool) -> anyhow::Result<State> {
    let status = Status::parse(&get(addr, "/status.json")?)
        .with_context(|| format!("{addr}/status.json"))?;
    let mut dash = dashboard(addr)?;
    if fresh && matches!(status, Status::Cluster(_)) {
        let first = dash.update.as_ref().map(|u| u.t);
        let until = std::time::Instant::now() + FRESH_WAIT;
        while dash.update.as_ref().map(|u| u.t) == first && std::time::Instant::now() < until {
            std::thread::sleep(FRESH_POLL);
            dash = dashboard(addr)?;
        }
    }
    Ok(State {
        kind: status.kind(),
        status,
        dashboard: dash,
    })
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v}"))
}

fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
}

/// The table of the kind of process read, and its rescue line.
pub fn render(addr: &str, s: &State) -> String {
    let mut out = match &s.status {
        Status::Switch(st) => render_switch(addr, st, &s.dashboard),
        Status::Cluster(c) => render_cluster(addr, c, &s.dashboard),
        Status::Alone(_) => render_alone(addr, &s.dashboard),
    };
    if let Some(r) = s.status.rescue() {
        out.push_str(&rescue_lines(r));
    }
    if s.dashboard.update.is_none() {
        let _ = writeln!(out, "(no rates yet: the dashboard samples once a second)");
    }
    out
}

/// The last update's rows by name (the update may follow another generation of the list).
fn rows(d: &Dashboard) -> Vec<(&String, &NodeRow)> {
    match (&d.meta, &d.update) {
        (Some(m), Some(u)) if m.generation == u.g => m.nodes.iter().zip(&u.n).collect(),
        _ => Vec::new(),
    }
}

/// Cells in columns: the first left-aligned, the others right-aligned.
fn table(out: &mut String, lines: &[Vec<String>]) {
    let cols = lines.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for l in lines {
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
}

/// A row's state, told from the dashboard (an operator's hold) or from `up`.
fn state_word(r: Option<&NodeRow>, up: bool) -> String {
    match (r.map(|r| r.state), up) {
        (Some(NodeState::Draining), _) => "DRAINING",
        (Some(NodeState::Drained), _) => "DRAINED",
        (Some(NodeState::Held), _) => "HELD",
        (_, true) => "UP",
        (_, false) => "DOWN",
    }
    .to_owned()
}

fn hot_line(out: &mut String, d: &Dashboard) {
    if let (Some(m), Some(u)) = (&d.meta, &d.update) {
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
}

fn reasons<'a>(m: impl Iterator<Item = (&'a String, &'a u64)>) -> String {
    let fb: Vec<String> = m
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    if fb.is_empty() {
        "none".to_owned()
    } else {
        fb.join(", ")
    }
}

/// The site's flash-crowd rescue: its state and rates, then one line per relationship.
pub fn rescue_lines(r: &RescueStatus) -> String {
    let mut out = String::new();
    let kb = |v: f64| format!("{:.1}", v / 1000.0);
    let state = match r.state.as_str() {
        "sos" => "SOS (rescued)".to_owned(),
        "rescue" => "RESCUE (rescuing others)".to_owned(),
        other => other.to_owned(),
    };
    let _ = writeln!(
        out,
        "rescue {}: {state}, d_out {} of {} kB/s, R_redi {:.1}/s, {} redirected, {} rescued{}",
        r.server_name,
        kb(r.d_out),
        kb(r.d_out_max),
        r.r_redi,
        r.totals.requests_redirected,
        r.totals.requests_rescued,
        r.pending_sos
            .as_ref()
            .map_or(String::new(), |p| format!(", SOS pending with {p}"))
    );
    for s in &r.rescuers {
        let _ = writeln!(
            out,
            "  rescued by {} as {}: D_redi {} kB/s, d_redi {} kB/s, {} redirects",
            s.peer,
            s.alias,
            s.d_redi_kbps,
            kb(s.d_redi),
            s.redirects
        );
    }
    for o in &r.origins {
        let _ = writeln!(
            out,
            "  rescuing {} as {}: D_redi {} kB/s, d_resc {} kB/s",
            o.fqdn,
            o.alias,
            kb(o.d_redi),
            kb(o.d_resc)
        );
    }
    out
}

/// A node outside a cluster: its own row.
fn render_alone(addr: &str, d: &Dashboard) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "node {addr}: outside a cluster");
    let mut lines = vec![["node", "req/s", "MB/s", "conns", "p50ms", "p99ms", "hit%"]
        .iter()
        .map(|h| (*h).to_owned())
        .collect::<Vec<_>>()];
    for (name, r) in rows(d) {
        lines.push(vec![
            name.clone(),
            r.rps.0.to_string(),
            r.mbps.0.to_string(),
            r.conns.to_string(),
            opt(r.p50.map(|v| v.0)),
            opt(r.p99.map(|v| v.0)),
            opt(r.hit.map(|v| v.0)),
        ]);
    }
    table(&mut out, &lines);
    out
}

/// A cooperative member's view of its cluster: one line per member, with its rates from the
/// dashboard and this member's counts of what it routed to it.
fn render_cluster(addr: &str, c: &ClusterStatus, d: &Dashboard) -> String {
    let mut out = String::new();
    let up = c.members.iter().filter(|m| m.up).count();
    let _ = writeln!(
        out,
        "cooperative member {} at {addr}: policy {}, clone, {} clones outstanding, {}/{} members up",
        c.name,
        c.policy,
        c.clones_outstanding,
        up,
        c.members.len()
    );
    let rows = rows(d);
    let row_of = |name: &str| rows.iter().find(|(n, _)| n.as_str() == name).map(|r| r.1);
    let header = [
        "member", "state", "req/s", "MB/s", "conns", "load", "p50ms", "p99ms", "clones/s", "fb/s",
        "hit%", "replicas", "routed", "clones", "backs", "lost",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for m in &c.members {
        let r = row_of(&m.name);
        // The dashboard knows whether a member answered its figures; the status whether its
        // control connection is up. Either one down shows it down.
        let up = m.up && r.is_none_or(|r| r.up);
        lines.push(vec![
            if m.this_node {
                format!("{} (this)", m.name)
            } else {
                m.name.clone()
            },
            state_word(r, up),
            opt(r.map(|r| r.rps.0)),
            opt(r.map(|r| r.mbps.0)),
            r.map_or_else(|| "-".to_owned(), |r| r.conns.to_string()),
            opt(r.map(|r| r.load.0)),
            opt(r.and_then(|r| r.p50).map(|v| v.0)),
            opt(r.and_then(|r| r.p99).map(|v| v.0)),
            opt(r.map(|r| r.moves.0)),
            opt(r.map(|r| r.fallbacks.0)),
            opt(r.and_then(|r| r.hit).map(|v| v.0)),
            r.and_then(|r| r.coop)
                .and_then(|c| c.replicas)
                .map_or_else(|| "-".to_owned(), |v| v.to_string()),
            m.routed.to_string(),
            m.clones.to_string(),
            m.hand_backs.to_string(),
            m.lost.to_string(),
        ]);
    }
    let u = d.update.as_ref();
    let sum = |f: fn(&switchyard_admin::cluster::MemberStatus) -> u64| {
        c.members.iter().map(f).sum::<u64>().to_string()
    };
    let mut total = vec![
        "total".to_owned(),
        String::new(),
        opt(u.map(|u| u.c.rps.0)),
        opt(u.map(|u| u.c.mbps.0)),
        u.map_or_else(|| "-".to_owned(), |u| u.c.conns.to_string()),
        String::new(),
        String::new(),
        String::new(),
        opt(u.map(|u| u.c.moves.0)),
        opt(u.map(|u| u.c.fb.0)),
        String::new(),
        String::new(),
    ];
    total.extend([
        sum(|m| m.routed),
        sum(|m| m.clones),
        sum(|m| m.hand_backs),
        sum(|m| m.lost),
    ]);
    lines.push(total);
    table(&mut out, &lines);
    hot_line(&mut out, d);
    let _ = writeln!(out, "fallbacks: {}", reasons(c.fallbacks.iter()));
    if let Some(r) = &c.replication {
        let _ = writeln!(
            out,
            "replication: {} replicas held ({} of {} MB), {} replica hits, {} objects shipped",
            r.replicas,
            mb(r.replica_bytes),
            mb(r.replica_capacity_bytes),
            r.replica_hits,
            r.objects_shipped
        );
    }
    out
}

/// The switch's table: a heading line, one line per node, a total line, hot targets and
/// fallbacks.
fn render_switch(addr: &str, st: &SwitchStatus, d: &Dashboard) -> String {
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
    let rows = rows(d);
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
            state_word(r, n.up),
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
    let u = d.update.as_ref();
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
    table(&mut out, &lines);
    hot_line(&mut out, d);
    let _ = writeln!(
        out,
        "handoffs: {} fd, {} repair, {} hand-backs; fallbacks: {}",
        st.handoff.fd,
        st.handoff.repair,
        st.handoff.hand_backs,
        reasons(st.handoff.fallbacks.iter())
    );
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
        let state = fetch(addr, true)?;
        serde_json::to_writer_pretty(&mut out, &state)?;
        writeln!(out)?;
        return Ok(());
    }
    if !args.watch {
        out.write_all(render(&addr.to_string(), &fetch(addr, true)?).as_bytes())?;
        return Ok(());
    }
    let every = Duration::from_secs_f64(args.interval);
    loop {
        // Home, clear the screen, then the table: the terminal shows the latest only.
        // Each reading asks a cooperative member for the next one: no wait for freshness.
        let text = match fetch(addr, false) {
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
            rescue: None,
        };
        sampler.step(&sample(1, 10));
        let step = sampler.step(&sample(2, 20));
        State {
            kind: "switch",
            status: Status::Switch(status),
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

    fn rescue() -> RescueStatus {
        serde_json::from_value(serde_json::json!({
            "server_name": "site.test", "state": "sos", "ticks": 40, "d_out_max": 200000.0,
            "d_out": 187654.0, "d_self": 150000.0, "d_resc": 0.0, "r_redi": 12.34,
            "t_redi": 0.7, "a_redi": 6000.0, "d_free": 0.0, "pending_sos": null,
            "rescuers": [{"peer": "rescue.test", "alias": "rescue-vh1.test",
                          "web": "127.0.0.1:8090", "d_redi_kbps": 100, "d_redi": 37500.0,
                          "redirects": 25}],
            "origins": [],
            "totals": {"bytes_served": 1, "requests_served": 2, "requests_redirected": 25,
                       "requests_rescued": 0, "requests_refused": 0, "sos_sent": 1,
                       "rate_messages": 3, "relationships_ended": 0,
                       "connections_refused": 0, "connections_lost": 0},
            "peers": []
        }))
        .unwrap()
    }

    #[test]
    fn a_site_in_rescue_shows_its_state_and_rescue_servers() {
        let mut s = state();
        let Status::Switch(st) = &mut s.status else {
            unreachable!()
        };
        st.rescue = Some(rescue());
        let text = render("a", &s);
        assert!(
            text.contains(
                "rescue site.test: SOS (rescued), d_out 187.7 of 200.0 kB/s, R_redi 12.3/s, 25 redirected"
            ),
            "{text}"
        );
        assert!(
            text.contains("  rescued by rescue.test as rescue-vh1.test: D_redi 100 kB/s, d_redi 37.5 kB/s, 25 redirects"),
            "{text}"
        );
        // Without a driver, no rescue line.
        assert!(!render("a", &state()).contains("rescue "));
    }

    #[test]
    fn the_kind_comes_from_the_status_s_shape() {
        let switch = serde_json::to_vec(&match state().status {
            Status::Switch(s) => s,
            _ => unreachable!(),
        })
        .unwrap();
        assert_eq!(Status::parse(&switch).unwrap().kind(), "switch");
        let alone = serde_json::to_vec(&serde_json::json!({ "rescue": rescue() })).unwrap();
        assert_eq!(Status::parse(&alone).unwrap().kind(), "node");
        let e = Status::parse(b"{\"x\": 1}").unwrap_err();
        assert!(format!("{e:#}").contains("neither a switch"), "{e:#}");
        let e = Status::parse(b"{\"members\": 3}").unwrap_err();
        assert!(
            format!("{e:#}").contains("not a cooperative member's status"),
            "{e:#}"
        );
    }

    /// A cooperative member's status and dashboard, as the node serves them: three members,
    /// the second one's control connection down.
    fn cluster_state() -> State {
        let status: ClusterStatus = serde_json::from_value(serde_json::json!({
            "name": "n1", "policy": "chash",
            "members": [
                {"name": "n1", "control": "127.0.0.1:7001", "this_node": true, "up": true,
                 "routed": 12, "clones": 0, "hand_backs": 0, "lost": 0},
                {"name": "n2", "control": "127.0.0.1:7002", "this_node": false, "up": false,
                 "routed": 5, "clones": 5, "hand_backs": 5, "lost": 1},
                {"name": "n3", "control": "127.0.0.1:7003", "this_node": false, "up": true,
                 "routed": 7, "clones": 7, "hand_backs": 6, "lost": 0}
            ],
            "clones_outstanding": 1,
            "fallbacks": {"control_down": 2},
            "replication": null
        }))
        .unwrap();
        let members: Vec<switchyard_admin::cluster::MemberSample> = ["n1", "n2", "n3"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                serde_json::from_value(serde_json::json!({
                    "name": n, "requests": 10 * (i as u64 + 1), "bytes": 1000, "connections": 1,
                    "load": 1.0, "targets": 2, "clones_in": 3, "hand_backs": 3, "clones_lost": 0,
                    "fallbacks": {}, "cache_lookups": 4, "cache_hits": 3, "latency": [0, 5],
                    "replicas": 2, "targets_mapped": 6, "map_replicas": 0, "hot": []
                }))
                .unwrap()
            })
            .collect();
        let mut sampler = Sampler::new(
            switchyard_admin::dashboard::COOPERATIVE,
            Duration::from_secs(1),
            Duration::from_secs(5),
        );
        let sample = |at: u64, k: u64| {
            let bumped: Vec<_> = members
                .iter()
                .map(|m| switchyard_admin::cluster::MemberSample {
                    requests: m.requests * k,
                    ..m.clone()
                })
                .collect();
            let views: Vec<switchyard_admin::dashboard::coop::MemberView> = bumped
                .iter()
                .enumerate()
                .map(|(i, m)| switchyard_admin::dashboard::coop::MemberView {
                    name: &m.name,
                    up: i != 1,
                    sample: Some(m),
                })
                .collect();
            switchyard_admin::dashboard::coop::cluster_sample(
                Duration::from_secs(at),
                1,
                "chash",
                &views,
                0,
            )
        };
        sampler.step(&sample(1, 1));
        let step = sampler.step(&sample(2, 2));
        State {
            kind: "cooperative",
            status: Status::Cluster(status),
            dashboard: Dashboard {
                meta: Some((*step.meta).clone()),
                update: Some(step.update),
            },
        }
    }

    #[test]
    fn a_cooperative_member_shows_every_member_of_its_cluster() {
        let text = render("127.0.0.1:9081", &cluster_state());
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("cooperative member n1 at 127.0.0.1:9081: policy chash"),
            "{text}"
        );
        assert!(lines[0].contains("2/3 members up"), "{text}");
        assert!(
            lines[1].starts_with("member") && lines[1].contains("clones/s"),
            "{text}"
        );
        let n1: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(&n1[..4], &["n1", "(this)", "UP", "10"], "{text}");
        let n2: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(&n2[..2], &["n2", "DOWN"], "{text}");
        let n3: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(&n3[..3], &["n3", "UP", "30"], "{text}");
        // routed, clones, hand-backs, lost: this member's counts, summed on the total line.
        assert_eq!(&n3[n3.len() - 4..], &["7", "7", "6", "0"], "{text}");
        let total: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(total[0], "total");
        assert_eq!(
            &total[total.len() - 4..],
            &["24", "12", "11", "1"],
            "{text}"
        );
        assert!(text.contains("fallbacks: control_down 2\n"), "{text}");
        assert!(!text.contains("rescue "), "{text}");
        // With the member's rescue driver, the rescue line follows the table.
        let mut s = cluster_state();
        let Status::Cluster(c) = &mut s.status else {
            unreachable!()
        };
        c.rescue = Some(rescue());
        assert!(render("a", &s).contains("rescue site.test: SOS (rescued)"));
        // --json carries the kind and both documents.
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["kind"], "cooperative");
        assert_eq!(j["status"]["members"].as_array().unwrap().len(), 3);
        assert_eq!(j["status"]["rescue"]["state"], "sos");
        assert_eq!(j["dashboard"]["meta"]["kind"], "cooperative");
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
