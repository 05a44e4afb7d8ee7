//! Reading replay workloads from access logs.

use std::path::Path;
use std::time::Duration;

use crate::config::{ReplayRequest, Session, Workload};
use crate::LoadError;

/// How to turn a log into a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceOptions {
    /// Group the requests into HTTP/1.1 sessions with pipelined batches (seed 003 §6).
    pub sessions: bool,
    /// A client's gap that closes its connection (15 s in seed 003).
    pub session_gap: Duration,
    /// A gap inside a connection that starts a new batch (5 s in seed 003).
    pub batch_gap: Duration,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            sessions: false,
            session_gap: Duration::from_secs(15),
            batch_gap: Duration::from_secs(5),
        }
    }
}

/// Splits a logged request target into the target to send and, for absolute-form targets
/// (`http://host/path`), the host they name. Spaces and control characters (which a log may
/// hold but a request line may not) are percent-encoded.
pub fn replay_target(target: &str) -> (String, Option<String>) {
    let lower = target.get(..7).map(str::to_ascii_lowercase);
    let (path, host) = if lower.as_deref() == Some("http://") {
        let rest = &target[7..];
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        (path.to_owned(), (!host.is_empty()).then(|| host.to_owned()))
    } else if target.starts_with('/') || target == "*" {
        (target.to_owned(), None)
    } else {
        (format!("/{target}"), None)
    };
    (encode_unsafe(path), host.map(encode_unsafe))
}

fn encode_unsafe(s: String) -> String {
    if !s.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return s;
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c <= ' ' || c == '\u{7f}' {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A replay request for a logged method and target.
pub fn replay_request(method: &str, target: &str) -> ReplayRequest {
    let (path, host) = replay_target(target);
    ReplayRequest {
        method: method.to_owned(),
        path,
        host,
    }
}

/// Converts a parsed trace into a replay workload: the requests in log order, or (with
/// [`TraceOptions::sessions`]) the HTTP/1.1 connections of seed 003 §6, each a list of
/// pipelined batches with the recorded pauses between them.
///
/// The workload should keep full targets ([`switchyard_trace::TargetKey::Full`]) so that
/// query strings are replayed.
pub fn from_workload(w: &switchyard_trace::Workload, opts: &TraceOptions) -> Workload {
    let request = |i: usize| {
        let r = &w.requests[i];
        replay_request(
            &w.methods[r.method as usize],
            &w.targets[r.target as usize].path,
        )
    };
    if !opts.sessions {
        return Workload::Trace((0..w.requests.len()).map(request).collect());
    }
    let cfg = switchyard_trace::SessionConfig {
        gap_secs: (opts.session_gap.as_secs() as i64).max(1),
        batch_secs: (opts.batch_gap.as_secs() as i64).max(1),
    };
    let sessions = switchyard_trace::group_connections(w, &cfg)
        .iter()
        .map(|c| {
            let batches: Vec<Vec<ReplayRequest>> = c
                .batches
                .iter()
                .map(|b| b.requests.iter().map(|&i| request(i)).collect())
                .collect();
            let think_times = c
                .batches
                .windows(2)
                .map(|pair| {
                    let last = pair[0]
                        .requests
                        .iter()
                        .map(|&i| w.requests[i].time)
                        .max()
                        .unwrap_or(pair[0].start);
                    Duration::from_secs(pair[1].start.saturating_sub(last).max(0) as u64)
                })
                .collect();
            Session {
                batches,
                think_times,
            }
        })
        .collect();
    Workload::Sessions(sessions)
}

/// Reads the access log at `path` (Common or Combined Log Format) into a replay workload
/// (see [`from_workload`]).
pub fn load_trace(path: &Path, opts: &TraceOptions) -> Result<Workload, LoadError> {
    let err = |message: String| LoadError::Trace {
        path: path.display().to_string(),
        message,
    };
    let (w, report) = switchyard_trace::Workload::open(path, switchyard_trace::TargetKey::Full)
        .map_err(|e| err(e.to_string()))?;
    if w.requests.is_empty() {
        return Err(err(format!(
            "no usable request in {} lines ({} skipped, {} invalid)",
            report.lines,
            report.skipped_total(),
            report.invalid_total()
        )));
    }
    Ok(from_workload(&w, opts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(replay_target("/a?b"), ("/a?b".into(), None));
        assert_eq!(
            replay_target("http://h:8/x"),
            ("/x".into(), Some("h:8".into()))
        );
        assert_eq!(replay_target("HTTP://h"), ("/".into(), Some("h".into())));
        assert_eq!(replay_target("a.html"), ("/a.html".into(), None));
        assert_eq!(replay_target("/a b\tc"), ("/a%20b%09c".into(), None));
    }

    fn clf(lines: &[(&str, &str, &str)]) -> String {
        // (client, time as HH:MM:SS, request line)
        lines
            .iter()
            .map(|(c, t, r)| format!("{c} - - [01/Jun/1995:{t} +0000] \"{r}\" 200 100\n"))
            .collect()
    }

    #[test]
    fn log_order_and_sessions() {
        let log = clf(&[
            ("a", "00:00:00", "GET /index.html HTTP/1.1"),
            ("b", "00:00:01", "GET /b?x=1 HTTP/1.1"),
            ("a", "00:00:06", "GET /img1.gif HTTP/1.1"),
            ("a", "00:00:07", "HEAD /img2.gif HTTP/1.1"),
            ("a", "00:00:30", "GET /later.html HTTP/1.1"),
            ("not a log line", "", ""),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        std::fs::write(&path, log).unwrap();
        let Workload::Trace(reqs) = load_trace(&path, &TraceOptions::default()).unwrap() else {
            panic!("expected a trace");
        };
        let paths: Vec<&str> = reqs.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/index.html",
                "/b?x=1",
                "/img1.gif",
                "/img2.gif",
                "/later.html"
            ]
        );
        assert_eq!(reqs[3].method, "HEAD");

        let opts = TraceOptions {
            sessions: true,
            ..TraceOptions::default()
        };
        let Workload::Sessions(sessions) = load_trace(&path, &opts).unwrap() else {
            panic!("expected sessions");
        };
        // a: [index] then a 6 s gap (>= 5 s: new batch) [img1, img2]; a again after 23 s
        // (>= 15 s: new connection); b alone.
        assert_eq!(sessions.len(), 3);
        let a = &sessions[0];
        assert_eq!(a.batches.len(), 2);
        assert_eq!(a.batches[1].len(), 2);
        assert_eq!(a.think_times, vec![Duration::from_secs(6)]);
        assert_eq!(sessions[2].batches[0][0].path, "/later.html");

        std::fs::write(&path, "garbage\n").unwrap();
        assert!(matches!(
            load_trace(&path, &TraceOptions::default()),
            Err(LoadError::Trace { .. })
        ));
    }
}
