//! The parser and statistics on real access logs, checked against counts
//! made here independently (splitting lines on quotes and spaces, without
//! the crate's parser).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use switchyard_trace::{
    group_connections, LogRecord, RepairReason, SessionConfig, StatsOptions, TargetKey, TraceStats,
    Workload,
};

fn data(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data")
        .join(name);
    assert!(
        p.is_file(),
        "test log {} is missing: the real logs live in shared/data/ beside the repository",
        p.display()
    );
    p
}

fn read(name: &str) -> String {
    std::fs::read_to_string(data(name)).expect("test logs are UTF-8")
}

/// What the independent classifier extracts from one line.
#[derive(Debug)]
struct Simple {
    client: String,
    method: String,
    target: String,
    has_version: bool,
    status: String,
    bytes: Option<u64>,
}

/// Splits a line on `"`: `host ident user [time] ` / request / ` status bytes ` / …
fn classify(line: &str) -> Option<Simple> {
    let parts: Vec<&str> = line.split('"').collect();
    if parts.len() < 3 {
        return None;
    }
    let client = parts[0].split(' ').next()?.to_string();
    let words: Vec<&str> = parts[1].split(' ').collect();
    let (method, target, has_version) = match words.as_slice() {
        [m, t] => (m, t, false),
        [m, t, v] if v.starts_with("HTTP/") => (m, t, true),
        _ => return None,
    };
    let tail: Vec<&str> = parts[2].split_whitespace().collect();
    let [status, bytes] = tail.as_slice() else {
        return None;
    };
    Some(Simple {
        client,
        method: method.to_string(),
        target: target.to_string(),
        has_version,
        status: status.to_string(),
        bytes: bytes.parse().ok(),
    })
}

fn path_of(target: &str) -> &str {
    target.split(['?', '#']).next().unwrap()
}

struct Independent {
    lines: usize,
    records: Vec<Simple>,
    methods: BTreeMap<String, u64>,
    statuses: BTreeMap<String, u64>,
    sizes: HashMap<String, u64>,
    counts: HashMap<String, u64>,
    clients: HashSet<String>,
    no_version: u64,
}

fn independent(text: &str) -> Independent {
    let mut ind = Independent {
        lines: 0,
        records: Vec::new(),
        methods: BTreeMap::new(),
        statuses: BTreeMap::new(),
        sizes: HashMap::new(),
        counts: HashMap::new(),
        clients: HashSet::new(),
        no_version: 0,
    };
    for line in text.lines() {
        ind.lines += 1;
        let s = classify(line).unwrap_or_else(|| panic!("unclassified line: {line}"));
        *ind.methods.entry(s.method.clone()).or_insert(0) += 1;
        *ind.statuses.entry(s.status.clone()).or_insert(0) += 1;
        let p = path_of(&s.target).to_string();
        let size = ind.sizes.entry(p.clone()).or_insert(0);
        *size = (*size).max(s.bytes.unwrap_or(0));
        *ind.counts.entry(p).or_insert(0) += 1;
        ind.clients.insert(s.client.clone());
        ind.no_version += u64::from(!s.has_version);
        ind.records.push(s);
    }
    ind
}

fn check_against_independent(name: &str, text: &str) -> (TraceStats, Independent) {
    let ind = independent(text);
    let (stats, report) = TraceStats::from_file(&data(name), StatsOptions::default()).unwrap();
    assert_eq!(report.lines, ind.lines as u64, "{name}: lines");
    assert_eq!(
        report.lines,
        report.records + report.skipped_total() + report.invalid_total(),
        "{name}: every line accounted for"
    );
    assert_eq!(stats.requests, ind.records.len() as u64, "{name}: requests");
    assert_eq!(
        stats.unique_targets,
        ind.sizes.len() as u64,
        "{name}: targets"
    );
    assert_eq!(
        stats.unique_clients,
        ind.clients.len() as u64,
        "{name}: clients"
    );
    assert_eq!(
        stats.total_bytes,
        ind.sizes.values().sum::<u64>(),
        "{name}: total bytes"
    );
    assert_eq!(
        stats.transferred_bytes,
        ind.records.iter().filter_map(|r| r.bytes).sum::<u64>(),
        "{name}: transferred"
    );
    assert_eq!(stats.methods, ind.methods, "{name}: methods");
    assert_eq!(stats.statuses, ind.statuses, "{name}: statuses");
    assert_eq!(
        stats.protocols.get("none").copied().unwrap_or(0),
        ind.no_version,
        "{name}: HTTP/0.9-style lines"
    );

    // Concentration and coverage from the independent counts.
    let mut order: Vec<(u64, u64)> = ind.counts.iter().map(|(p, &c)| (c, ind.sizes[p])).collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let n = order.len();
    let top = n.div_ceil(10);
    let top_requests: u64 = order[..top].iter().map(|t| t.0).sum();
    let want = top_requests as f64 / ind.records.len() as f64;
    assert!((stats.top10_share - want).abs() < 1e-12, "{name}: top 10%");
    for q in [97u64, 98, 99] {
        let needed = (q * ind.records.len() as u64).div_ceil(100);
        let (mut reqs, mut bytes) = (0, 0);
        for &(c, s) in &order {
            if reqs >= needed {
                break;
            }
            reqs += c;
            bytes += s;
        }
        assert_eq!(
            stats.coverage_for(q as u32).unwrap().bytes,
            bytes,
            "{name}: coverage {q}%"
        );
    }
    (stats, ind)
}

#[test]
fn apache_combined_2015() {
    let name = "apache_combined_2015.log";
    let text = read(name);
    let (stats, ind) = check_against_independent(name, &text);
    assert_eq!(ind.lines, 10_000);
    assert_eq!(stats.requests, 10_000);

    let mut reader = switchyard_trace::open_log(&data(name)).unwrap();
    let records: Vec<LogRecord> = reader.by_ref().collect::<Result<_, _>>().unwrap();
    let report = reader.into_report();
    assert_eq!(report.records, 10_000);
    assert!(report.skipped.is_empty() && report.invalid.is_empty());
    // One line (8899) is cut inside its user agent.
    assert_eq!(
        report.repaired.iter().collect::<Vec<_>>(),
        [(&RepairReason::UnterminatedQuote, &1)]
    );
    assert_eq!(report.examples[0].line, 8899);
    let cut = &records[8898];
    assert!(cut
        .user_agent
        .as_deref()
        .unwrap()
        .ends_with("google.com/bot.html"));

    // Field by field against the independent split.
    for (r, s) in records.iter().zip(&ind.records) {
        assert_eq!(r.client, s.client);
        assert_eq!(r.method, s.method);
        assert_eq!(r.target, s.target);
        assert_eq!(r.protocol.is_some(), s.has_version);
        assert_eq!(
            r.status.map(|x| x.to_string()).unwrap_or("-".into()),
            s.status
        );
        assert_eq!(r.bytes, s.bytes);
    }
    // Combined fields: referers and user agents present on every line.
    let with_ua = records.iter().filter(|r| r.user_agent.is_some()).count();
    let quoted_ua = text
        .lines()
        .filter(|l| {
            let p: Vec<&str> = l.split('"').collect();
            p.len() >= 6 && p[5] != "-"
        })
        .count();
    assert_eq!(with_ua, quoted_ua);
    // First line: 17/May/2015:10:05:03 +0000.
    assert_eq!(records[0].time, 1_431_857_103);
    assert_eq!(
        records[0].referer.as_deref(),
        Some("http://semicomplete.com/presentations/logstash-monitorama-2013/")
    );
}

#[test]
fn usask_1995_excerpt() {
    let name = "usask_1995_excerpt.log";
    let text = read(name);
    let (stats, ind) = check_against_independent(name, &text);
    assert_eq!(ind.lines, 400);
    assert_eq!(stats.requests, 400);
    assert!(ind.no_version > 0, "the excerpt has HTTP/0.9-style lines");
    assert_eq!(stats.protocols["none"], ind.no_version);
    let (w, report) = Workload::open(&data(name), TargetKey::Path).unwrap();
    assert_eq!(report.records, 400);
    assert!(report.repaired.is_empty());
    // 01/Jun/1995:00:00:59 -0600 is 06:00:59 UTC.
    assert_eq!(w.requests[0].time, 801_986_459);
    assert_eq!(w.clients[0], "202.32.92.47");
    assert_eq!(w.target_of(0).path, "/~scottp/publish.html");
}

/// Connections and batches counted independently: per client, sorted times,
/// one connection per gap of 15 s or more, one batch per gap of 5 s or more
/// after the first request.
#[test]
fn sessions_on_real_logs() {
    for name in ["apache_combined_2015.log", "usask_1995_excerpt.log"] {
        let (w, _) = Workload::open(&data(name), TargetKey::Path).unwrap();
        let cfg = SessionConfig::default();
        let conns = group_connections(&w, &cfg);

        let mut by_client: HashMap<u32, Vec<i64>> = HashMap::new();
        for r in &w.requests {
            by_client.entry(r.client).or_default().push(r.time);
        }
        let (mut want_conns, mut want_batches) = (0usize, 0usize);
        for times in by_client.values_mut() {
            times.sort();
            want_conns += 1;
            want_batches += 1;
            let mut first_in_conn = true;
            for pair in times.windows(2) {
                let gap = pair[1] - pair[0];
                if gap >= 15 {
                    want_conns += 1;
                    want_batches += 1;
                    first_in_conn = true;
                } else if first_in_conn || gap >= 5 {
                    want_batches += 1;
                    first_in_conn = false;
                }
            }
        }
        assert_eq!(conns.len(), want_conns, "{name}: connections");
        let batches: usize = conns.iter().map(|c| c.batches.len()).sum();
        assert_eq!(batches, want_batches, "{name}: batches");
        let mut seen: Vec<usize> = conns.iter().flat_map(|c| c.requests()).collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..w.requests.len()).collect::<Vec<_>>(),
            "{name}: each request once"
        );
        assert!(conns.windows(2).all(|p| p[0].start() <= p[1].start()));
    }
}

#[test]
fn real_logs_round_trip_through_the_formatter() {
    for name in ["apache_combined_2015.log", "usask_1995_excerpt.log"] {
        let mut reader = switchyard_trace::open_log(&data(name)).unwrap();
        for r in reader.by_ref() {
            let r = r.unwrap();
            let line = r.to_string();
            match switchyard_trace::parse_line(&line) {
                switchyard_trace::LineOutcome::Record(back, _) => {
                    assert_eq!(back.to_owned_record(), r, "{line}")
                }
                other => panic!("{line}: {other:?}"),
            }
        }
    }
}

/// `trace root` on the real logs: every logged target has a file of exactly the largest byte
/// count logged for it (by the independent count above), or is listed as left out with a
/// reason that holds. The small log's root is written and measured on disk; the large one's
/// (560 MB) is checked as planned, which is what is written.
#[test]
fn a_root_from_real_logs_reproduces_every_logged_size() {
    use switchyard_trace::root::{file_of, plan_root, Skipped};
    for (name, on_disk) in [
        ("apache_combined_2015.log", false),
        ("usask_1995_excerpt.log", true),
    ] {
        let ind = independent(&read(name));
        let (workload, _) = Workload::open(&data(name), TargetKey::Path).unwrap();
        let plan = plan_root(&workload, "index.html");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        if on_disk {
            plan.write(&root, 7, false).unwrap();
        }
        let size_of = |f: &str| -> u64 {
            if on_disk {
                std::fs::metadata(root.join(f))
                    .unwrap_or_else(|e| panic!("{name}: {f}: {e}"))
                    .len()
            } else {
                plan.files[f]
            }
        };
        // The expected size of each file: the largest over the logged paths that name it.
        let mut expected: HashMap<String, u64> = HashMap::new();
        for (path, &size) in &ind.sizes {
            if let Ok(f) = file_of(path, "index.html") {
                let e = expected.entry(f).or_insert(0);
                *e = (*e).max(size);
            }
        }
        let skipped: HashSet<&str> = plan.skipped.iter().map(|(t, _)| t.as_str()).collect();
        let mut checked = 0;
        for path in ind.sizes.keys() {
            match file_of(path, "index.html") {
                Ok(f) if !skipped.contains(path.as_str()) => {
                    assert_eq!(size_of(&f), expected[&f], "{name}: {path}");
                    checked += 1;
                }
                Ok(f) => {
                    // Left out only because other targets lie beneath it.
                    assert!(
                        expected.keys().any(|o| o.starts_with(&format!("{f}/"))),
                        "{name}: {path} left out"
                    );
                }
                Err(_) => assert!(skipped.contains(path.as_str()), "{name}: {path}"),
            }
        }
        assert!(
            checked as f64 >= 0.95 * ind.sizes.len() as f64,
            "{name}: {checked} of {} targets have files",
            ind.sizes.len()
        );
        for (t, why) in &plan.skipped {
            assert!(ind.sizes.contains_key(t.as_str()), "{name}: {t} was logged");
            if *why == Skipped::AlsoADirectory && on_disk {
                assert!(root.join(file_of(t, "index.html").unwrap()).is_dir());
            }
        }
        if on_disk {
            assert_eq!(
                plan.files.len(),
                walk(&root),
                "{name}: one file per planned file"
            );
        }
    }
}

/// Regular files beneath `dir`.
fn walk(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walk(&e.path())
            } else {
                1
            }
        })
        .sum()
}
