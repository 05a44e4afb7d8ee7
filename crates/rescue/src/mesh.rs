//! Several rescue servers joined in memory: each node has a [`Core`], a [`Meter`] and a
//! [`Redirector`]; each pair of nodes talks through a pair of [`Session`]s whose bytes wait in
//! queues until delivered. No I/O and no clock: the caller chooses when nodes tick, when bytes
//! arrive and when a connection breaks. The tests and the simulator use it, and it is a
//! complete example of a driver: [`Mesh::apply`] is what a network driver does with actions.
//!
//! Node `i` is peer [`PeerId`]`(i)` to the others. An action addressed to a peer that is not a
//! node fails as a lost connection would.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::config::RescueConfig;
use crate::core::{Action, Candidate, Core};
use crate::error::ConfigError;
use crate::meter::{Measurement, Meter};
use crate::redirect::Redirector;
use crate::session::{Received, Session};
use crate::PeerId;

/// One server of the mesh.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its control loop.
    pub core: Core,
    /// Its traffic counters.
    pub meter: Meter,
    /// Its redirect selection (used when it is an origin).
    pub redirector: Redirector,
    /// Every action other than `Send`, `Reply` and `Redirect`, in order.
    pub events: Vec<Action>,
}

/// One line that crossed the mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireLine {
    /// The sender.
    pub from: PeerId,
    /// The receiver.
    pub to: PeerId,
    /// The bytes, `\n` included.
    pub line: Vec<u8>,
}

/// Nodes, their sessions and the bytes in flight. See the module documentation.
#[derive(Debug, Clone)]
pub struct Mesh {
    /// The nodes, by index.
    pub nodes: Vec<Node>,
    /// Session at node `.0` for its connection to node `.1`.
    sessions: BTreeMap<(usize, usize), Session>,
    /// Bytes written by `.0` for `.1`, not yet delivered.
    queues: BTreeMap<(usize, usize), VecDeque<Vec<u8>>>,
    /// Every line written, in order (also the session's own answers).
    pub wire: Vec<WireLine>,
    /// Connections that broke (cut by the caller, timed out or failed).
    pub broken: u64,
}

impl Mesh {
    /// A mesh of nodes with these configurations, their meters starting at `now`.
    pub fn new(configs: Vec<RescueConfig>, now: Duration) -> Result<Mesh, ConfigError> {
        let nodes = configs
            .into_iter()
            .map(|cfg| {
                Ok(Node {
                    meter: Meter::new(&cfg, now),
                    redirector: Redirector::new(&cfg),
                    core: Core::new(cfg)?,
                    events: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        Ok(Mesh {
            nodes,
            sessions: BTreeMap::new(),
            queues: BTreeMap::new(),
            wire: Vec::new(),
            broken: 0,
        })
    }

    /// The peer id of node `i`.
    pub fn peer(i: usize) -> PeerId {
        PeerId(i as u32)
    }

    fn index(&self, p: PeerId) -> Option<usize> {
        let i = p.0 as usize;
        (i < self.nodes.len()).then_some(i)
    }

    fn session(&mut self, me: usize, peer: usize) -> &mut Session {
        let timeout = self.nodes[me].core.config().request_timeout();
        self.sessions
            .entry((me, peer))
            .or_insert_with(|| Session::new(timeout))
    }

    /// Node `i`'s control interval: takes its meter at `now` and ticks its core.
    pub fn tick(&mut self, i: usize, now: Duration, candidates: &[Candidate]) {
        let m = self.nodes[i].meter.take(now);
        self.tick_with(i, now, &m, candidates);
    }

    /// Node `i`'s control interval with a given measurement (its meter is left alone).
    pub fn tick_with(
        &mut self,
        i: usize,
        now: Duration,
        m: &Measurement,
        candidates: &[Candidate],
    ) {
        let acts = self.nodes[i].core.on_tick(now, m, candidates);
        self.apply(i, now, acts);
    }

    /// Carries out node `i`'s actions, as a network driver would.
    pub fn apply(&mut self, i: usize, now: Duration, acts: Vec<Action>) {
        for a in acts {
            match a {
                Action::Send { peer, request } => {
                    let Some(j) = self.index(peer).filter(|&j| j != i) else {
                        let more = self.nodes[i].core.on_peer_lost(now, peer);
                        self.apply(i, now, more);
                        continue;
                    };
                    match self.session(i, j).send_request(now, request) {
                        Ok((_, line)) => self.write(i, j, line),
                        Err(_) => self.cut(i, j, now),
                    }
                }
                Action::Reply {
                    peer,
                    seq,
                    response,
                } => {
                    let Some(j) = self.index(peer).filter(|&j| j != i) else {
                        continue;
                    };
                    match self.session(i, j).send_response(seq, response) {
                        Ok(line) => self.write(i, j, line),
                        Err(_) => self.cut(i, j, now),
                    }
                }
                Action::Redirect(plan) => self.nodes[i].redirector.apply(plan),
                other => self.nodes[i].events.push(other),
            }
        }
    }

    fn write(&mut self, from: usize, to: usize, line: Vec<u8>) {
        self.wire.push(WireLine {
            from: Mesh::peer(from),
            to: Mesh::peer(to),
            line: line.clone(),
        });
        self.queues.entry((from, to)).or_default().push_back(line);
    }

    /// The connections with bytes in flight, as (sender, receiver).
    pub fn busy_links(&self) -> Vec<(usize, usize)> {
        self.queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(k, _)| *k)
            .collect()
    }

    /// Delivers the oldest line in flight from `from` to `to`; false if there was none.
    pub fn deliver_one(&mut self, now: Duration, from: usize, to: usize) -> bool {
        let Some(bytes) = self.queues.get_mut(&(from, to)).and_then(|q| q.pop_front()) else {
            return false;
        };
        let got = self.session(to, from).receive(&bytes);
        match got {
            Ok(items) => {
                for item in items {
                    match item {
                        Received::Deliver(msg) => {
                            let acts = self.nodes[to].core.on_message(now, Mesh::peer(from), msg);
                            self.apply(to, now, acts);
                        }
                        Received::Reply(line) => self.write(to, from, line),
                    }
                }
            }
            Err(_) => self.cut(to, from, now),
        }
        true
    }

    /// Delivers everything in flight, and what that causes, until nothing is left.
    pub fn deliver_all(&mut self, now: Duration) {
        while let Some(&(a, b)) = self.busy_links().first() {
            self.deliver_one(now, a, b);
        }
    }

    /// Lets the sessions check their timeouts at `now`; a late answer breaks its connection.
    pub fn check_timeouts(&mut self, now: Duration) {
        let late: Vec<(usize, usize)> = self
            .sessions
            .iter_mut()
            .filter_map(|(k, s)| s.check_timeouts(now).is_err().then_some(*k))
            .collect();
        for (a, b) in late {
            self.cut(a, b, now);
        }
    }

    /// Breaks the connection between `a` and `b`: bytes in flight are lost, both sessions end
    /// and both cores hear [`Core::on_peer_lost`]. A later message opens a new connection.
    pub fn cut(&mut self, a: usize, b: usize, now: Duration) {
        let had = self.sessions.remove(&(a, b)).is_some() | self.sessions.remove(&(b, a)).is_some();
        self.queues.remove(&(a, b));
        self.queues.remove(&(b, a));
        if had {
            self.broken += 1;
        }
        let acts = self.nodes[a].core.on_peer_lost(now, Mesh::peer(b));
        self.apply(a, now, acts);
        let acts = self.nodes[b].core.on_peer_lost(now, Mesh::peer(a));
        self.apply(b, now, acts);
    }

    /// The lines that crossed the mesh, as text, in order ("from>to: line").
    pub fn transcript(&self) -> Vec<String> {
        self.wire
            .iter()
            .map(|w| {
                format!(
                    "{}>{}: {}",
                    w.from.0,
                    w.to.0,
                    String::from_utf8_lossy(&w.line).trim_end()
                )
            })
            .collect()
    }
}
