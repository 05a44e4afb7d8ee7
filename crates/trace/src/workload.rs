//! A compact, replayable workload: every request of a trace with interned
//! clients and targets.
//!
//! Simulators and load generators read a trace once into a [`Workload`] and
//! then work with small integer ids. A workload is written back as a Common
//! Log Format file ([`Workload::write_log`]), which is also the trace format
//! of the synthetic generator: the same tools read real and synthetic traces.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufRead, BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hash::FxMap;
use crate::parse::{open_log, parse_reader, ParseReport};
use crate::record::{RecordRef, TargetKey};
use crate::stats::{StatsBuilder, StatsOptions, TraceStats};
use crate::TraceError;

/// A distinct target of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// The target's key (its path by default), as requested.
    pub path: String,
    /// Its size in bytes: the largest byte count logged for it (0 if unknown).
    pub size: u64,
}

/// One request of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Unix seconds.
    pub time: i64,
    /// Index into [`Workload::clients`].
    pub client: u32,
    /// Index into [`Workload::targets`].
    pub target: u32,
    /// Index into [`Workload::methods`].
    pub method: u32,
    /// Index into [`Workload::protocols`]; `None` for HTTP/0.9-style requests.
    pub protocol: Option<u32>,
    /// Logged status.
    pub status: Option<u16>,
    /// Logged byte count.
    pub bytes: Option<u64>,
}

/// Requests in log order, with interned clients, targets, methods and protocols.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// What identifies a target.
    pub target_key: TargetKey,
    /// Distinct clients, in order of first appearance.
    pub clients: Vec<String>,
    /// Distinct targets, in order of first appearance (a synthetic workload
    /// lists every file of its document root, requested or not).
    pub targets: Vec<Target>,
    /// Distinct methods.
    pub methods: Vec<String>,
    /// Distinct protocols.
    pub protocols: Vec<String>,
    /// Requests in log order (which need not be time order: log timestamps
    /// are taken when a request starts, lines are written when it ends).
    pub requests: Vec<Request>,
}

/// Builds a [`Workload`] one record at a time.
#[derive(Default)]
pub struct WorkloadBuilder {
    workload: Workload,
    clients: FxMap<Box<str>, u32>,
    targets: FxMap<Box<str>, u32>,
    methods: FxMap<Box<str>, u32>,
    protocols: FxMap<Box<str>, u32>,
}

fn intern(map: &mut FxMap<Box<str>, u32>, list: &mut Vec<String>, s: &str) -> u32 {
    if let Some(&i) = map.get(s) {
        return i;
    }
    let i = u32::try_from(list.len()).expect("more than 2^32 distinct names");
    map.insert(s.into(), i);
    list.push(s.to_owned());
    i
}

impl WorkloadBuilder {
    /// An empty workload whose targets are identified by `target_key`.
    pub fn new(target_key: TargetKey) -> Self {
        let mut b = WorkloadBuilder::default();
        b.workload.target_key = target_key;
        b
    }

    /// Appends one request.
    pub fn add(&mut self, r: &RecordRef<'_>) {
        let w = &mut self.workload;
        let client = intern(&mut self.clients, &mut w.clients, r.client);
        let key = w.target_key.key(&r.target);
        let target = match self.targets.get(key) {
            Some(&i) => i,
            None => {
                let i = u32::try_from(w.targets.len()).expect("more than 2^32 targets");
                self.targets.insert(key.into(), i);
                w.targets.push(Target {
                    path: key.to_owned(),
                    size: 0,
                });
                i
            }
        };
        let size = &mut w.targets[target as usize].size;
        *size = (*size).max(r.bytes.unwrap_or(0));
        let method = intern(&mut self.methods, &mut w.methods, &r.method);
        let protocol = r
            .protocol
            .as_deref()
            .map(|p| intern(&mut self.protocols, &mut w.protocols, p));
        w.requests.push(Request {
            time: r.time,
            client,
            target,
            method,
            protocol,
            status: r.status,
            bytes: r.bytes,
        });
    }

    /// The workload.
    pub fn finish(self) -> Workload {
        self.workload
    }
}

impl Workload {
    /// Reads a log into a workload; returns the parse report as well.
    pub fn from_reader<R: BufRead>(
        reader: R,
        target_key: TargetKey,
    ) -> io::Result<(Workload, ParseReport)> {
        let mut builder = WorkloadBuilder::new(target_key);
        let mut logs = parse_reader(reader);
        logs.for_each_record(|r| builder.add(r))?;
        Ok((builder.finish(), logs.into_report()))
    }

    /// Reads the log file at `path` into a workload.
    pub fn open(path: &Path, target_key: TargetKey) -> Result<(Workload, ParseReport), TraceError> {
        let mut builder = WorkloadBuilder::new(target_key);
        let mut logs = open_log(path)?;
        logs.for_each_record(|r| builder.add(r))
            .map_err(|source| TraceError::Read {
                path: path.to_owned(),
                source,
            })?;
        Ok((builder.finish(), logs.into_report()))
    }

    /// Request `i` as a record (no referer or user agent; the target is the
    /// workload's target key, so a query string is present only with
    /// [`TargetKey::Full`]).
    pub fn record(&self, i: usize) -> RecordRef<'_> {
        let r = &self.requests[i];
        RecordRef {
            client: &self.clients[r.client as usize],
            time: r.time,
            method: Cow::Borrowed(&self.methods[r.method as usize]),
            target: Cow::Borrowed(&self.targets[r.target as usize].path),
            protocol: r
                .protocol
                .map(|p| Cow::Borrowed(self.protocols[p as usize].as_str())),
            status: r.status,
            bytes: r.bytes,
            referer: None,
            user_agent: None,
        }
    }

    /// The target of request `i`.
    pub fn target_of(&self, i: usize) -> &Target {
        &self.targets[self.requests[i].target as usize]
    }

    /// Writes every request as a Common Log Format line, in order.
    pub fn write_log(&self, out: &mut impl Write) -> io::Result<()> {
        let mut line = String::with_capacity(128);
        for i in 0..self.requests.len() {
            line.clear();
            self.record(i)
                .write_common(&mut line)
                .expect("writing to a String cannot fail");
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
        Ok(())
    }

    /// Writes the workload as a Common Log Format file at `path`.
    pub fn save_log(&self, path: &Path) -> Result<(), TraceError> {
        let wrap = |source| TraceError::Write {
            path: path.to_owned(),
            source,
        };
        let file = File::create(path).map_err(wrap)?;
        let mut out = BufWriter::with_capacity(256 * 1024, file);
        self.write_log(&mut out).map_err(wrap)?;
        out.flush().map_err(wrap)
    }

    /// Statistics of the workload's requests (targets never requested are not counted).
    pub fn stats(&self, top: usize) -> TraceStats {
        let mut b = StatsBuilder::new(StatsOptions {
            // Targets are already keys; keep them as they are.
            target_key: TargetKey::Full,
            top,
        });
        for i in 0..self.requests.len() {
            b.add(&self.record(i));
        }
        let mut s = b.finish();
        s.target_key = self.target_key;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
a - - [01/Jun/1995:00:00:59 -0600] \"GET /x?1 HTTP/1.0\" 200 10\n\
b - - [01/Jun/1995:00:01:00 -0600] \"HEAD /y\" 304 -\n\
a - - [01/Jun/1995:00:00:58 -0600] \"GET /x HTTP/1.0\" 206 4\n\
garbage\n";

    #[test]
    fn interns_and_keeps_log_order() {
        let (w, rep) = Workload::from_reader(LOG.as_bytes(), TargetKey::Path).unwrap();
        assert_eq!(rep.records, 3);
        assert_eq!(rep.invalid_total(), 1);
        assert_eq!(w.clients, ["a", "b"]);
        assert_eq!(
            w.targets,
            [
                Target {
                    path: "/x".into(),
                    size: 10
                },
                Target {
                    path: "/y".into(),
                    size: 0
                }
            ]
        );
        assert_eq!(w.methods, ["GET", "HEAD"]);
        assert_eq!(w.requests.len(), 3);
        assert_eq!(w.requests[2].time, w.requests[0].time - 1);
        assert_eq!(w.requests[1].protocol, None);
        assert_eq!(w.target_of(2).path, "/x");
    }

    #[test]
    fn written_log_reads_back_the_same() {
        let (w, _) = Workload::from_reader(LOG.as_bytes(), TargetKey::Full).unwrap();
        let mut out = Vec::new();
        w.write_log(&mut out).unwrap();
        let (w2, rep) = Workload::from_reader(&out[..], TargetKey::Full).unwrap();
        assert_eq!(rep.records, 3);
        assert_eq!(rep.lines, 3);
        assert_eq!(w, w2);
        assert_eq!(w.stats(5), w2.stats(5));
        assert_eq!(w.stats(5).unique_targets, 3);
    }

    #[test]
    fn stats_match_streaming_stats() {
        let (w, _) = Workload::from_reader(LOG.as_bytes(), TargetKey::Path).unwrap();
        let (s, _) = TraceStats::from_reader(LOG.as_bytes(), StatsOptions::default()).unwrap();
        assert_eq!(w.stats(10), s);
    }
}
