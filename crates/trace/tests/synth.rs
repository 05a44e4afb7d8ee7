//! Deterministic synthesis: the same seed gives identical bytes (trace and
//! document root), a different seed gives different ones, and the trace is
//! read back by the log parser unchanged.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use switchyard_trace::cli::{run, TraceCommand};
use switchyard_trace::{synthesize, SynthConfig, TargetKey, Workload};

/// Every file below `root`, by relative path, with its bytes.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn synth_cmd(root: &Path, trace: &Path, seed: u64, force: bool) -> TraceCommand {
    TraceCommand::Synth {
        out_root: Some(root.to_owned()),
        trace: trace.to_owned(),
        seed,
        targets: Some(200),
        total_bytes: Some(3 << 20),
        zipf_alpha: 1.0,
        requests: 2000,
        clients: 30,
        start: 946_684_800,
        session_interarrival: 1.0,
        max_file_bytes: 1 << 20,
        force,
        json: true,
    }
}

#[test]
fn same_seed_same_bytes_different_seed_different_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut outs = Vec::new();
    for (name, seed) in [("a", 7), ("b", 7), ("c", 8)] {
        let mut out = Vec::new();
        run(
            &synth_cmd(
                &d.join(format!("{name}-root")),
                &d.join(format!("{name}.log")),
                seed,
                false,
            ),
            &mut out,
        )
        .unwrap();
        outs.push(out);
    }
    let (ta, tb, tc) = (
        fs::read(d.join("a.log")).unwrap(),
        fs::read(d.join("b.log")).unwrap(),
        fs::read(d.join("c.log")).unwrap(),
    );
    assert_eq!(ta, tb, "same seed, same trace");
    assert_ne!(ta, tc, "different seed, different trace");
    let report = |out: &[u8]| {
        let mut v: serde_json::Value = serde_json::from_slice(out).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("trace");
        o.remove("out_root");
        v
    };
    assert!(
        report(&outs[0]) == report(&outs[1]),
        "same seed, same report"
    );

    let (ra, rb, rc) = (
        tree(&d.join("a-root")),
        tree(&d.join("b-root")),
        tree(&d.join("c-root")),
    );
    assert_eq!(ra.len(), 200);
    assert!(ra == rb, "same seed, same document root");
    assert!(ra != rc, "different seed, different document root");
    let total: usize = ra.values().map(Vec::len).sum();
    assert_eq!(total, 3 << 20, "files add up to --total-bytes");

    // The JSON report describes what was written.
    let v: serde_json::Value = serde_json::from_slice(&outs[0]).unwrap();
    assert_eq!(v["summary"]["requests"], 2000);
    assert_eq!(v["summary"]["files"], 200);
    assert_eq!(v["summary"]["site_bytes"], 3 << 20);
    assert_eq!(v["config"]["seed"], 7);

    // Every requested target exists in the document root with the logged size.
    let (w, report) = Workload::open(&d.join("a.log"), TargetKey::Path).unwrap();
    assert_eq!(report.records, 2000);
    assert_eq!(report.lines, 2000);
    assert!(report.repaired.is_empty());
    for r in &w.requests {
        let t = &w.targets[r.target as usize];
        let bytes = &ra[t.path.trim_start_matches('/')];
        assert_eq!(bytes.len() as u64, t.size, "{}", t.path);
        assert_eq!(r.bytes, Some(t.size));
    }
}

#[test]
fn trace_reads_back_as_the_generated_workload() {
    let cfg = SynthConfig {
        seed: 42,
        targets: Some(500),
        requests: 5000,
        clients: 50,
        ..SynthConfig::default()
    };
    let s = synthesize(&cfg).unwrap();
    let mut log = Vec::new();
    s.workload.write_log(&mut log).unwrap();
    let (back, report) = Workload::from_reader(&log[..], TargetKey::Path).unwrap();
    assert_eq!(report.records, 5000);
    assert_eq!(back.requests.len(), 5000);
    for i in 0..5000 {
        assert_eq!(
            back.record(i).to_owned_record(),
            s.workload.record(i).to_owned_record()
        );
    }
    assert_eq!(back.stats(10), s.workload.stats(10));
    // Deterministic in memory as well.
    assert_eq!(synthesize(&cfg).unwrap(), s);
}

#[test]
fn refuses_non_empty_docroot_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("keep.txt"), "x").unwrap();
    let cmd = synth_cmd(&root, &dir.path().join("t.log"), 1, false);
    let err = run(&cmd, &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    let forced = synth_cmd(&root, &dir.path().join("t.log"), 1, true);
    run(&forced, &mut Vec::new()).unwrap();
    assert!(root.join("keep.txt").exists(), "nothing is deleted");
    assert_eq!(tree(&root).len(), 201);
}
