//! A document root materialized from an access log (`switchyard trace root`), so that a real
//! site's trace can be replayed against a real cluster in log order: every logged target
//! becomes a file of the size the log gives it (the largest byte count logged for it), with
//! deterministic content.
//!
//! Targets are mapped to files exactly as a node maps request targets to paths
//! (`switchyard_http::path::normalize`: percent-decoded once, dot segments resolved, query
//! dropped), and a target naming a directory (`/docs/`) becomes that directory's index file,
//! so a replayed request finds the file written for it. Targets that cannot be files are left
//! out and reported, each with its reason: targets a node refuses (climbing above the root,
//! malformed escapes), names a filesystem cannot hold, and a target that the log also uses as
//! a directory of other targets (`/a` beside `/a/b`: a node answers `/a` with a redirect).
//!
//! Planning ([`plan_root`]) is pure; [`RootPlan::write`] does the file I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::Serialize;

use crate::{TraceError, Workload};

/// Longest file name component most filesystems accept.
const NAME_MAX: usize = 255;

/// Why a logged target has no file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Skipped {
    /// A node would refuse the target (the reason as the node gives it).
    Refused(String),
    /// A component is longer than a file name can be.
    NameTooLong,
    /// Other logged targets lie beneath it, so it must be a directory.
    AlsoADirectory,
}

/// The files of a root made from a log, and the targets left out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RootPlan {
    /// File paths beneath the root (`a/b.html`, no leading slash) and their sizes, sorted.
    pub files: BTreeMap<String, u64>,
    /// Logged targets with no file, and why.
    pub skipped: Vec<(String, Skipped)>,
}

/// The file a target names, as a node resolves it: its clean path, or the directory's
/// `index` file.
pub fn file_of(target: &str, index: &str) -> Result<String, Skipped> {
    let clean =
        switchyard_http::path::normalize(target).map_err(|e| Skipped::Refused(e.to_string()))?;
    let rel = clean.relative();
    let file = if clean.trailing_slash || rel.is_empty() {
        if rel.is_empty() {
            index.to_owned()
        } else {
            format!("{rel}/{index}")
        }
    } else {
        rel.to_owned()
    };
    if file.split('/').any(|c| c.len() > NAME_MAX) {
        return Err(Skipped::NameTooLong);
    }
    Ok(file)
}

/// The files for `workload`'s targets; directories get `index` as their index file.
pub fn plan_root(workload: &Workload, index: &str) -> RootPlan {
    let mut plan = RootPlan::default();
    for t in &workload.targets {
        match file_of(&t.path, index) {
            Ok(f) => {
                let size = plan.files.entry(f).or_insert(0);
                *size = (*size).max(t.size);
            }
            Err(why) => plan.skipped.push((t.path.clone(), why)),
        }
    }
    // Every directory some file lies in.
    let dirs: BTreeSet<&str> = plan
        .files
        .keys()
        .flat_map(|f| f.match_indices('/').map(move |(i, _)| &f[..i]))
        .collect();
    let clashes: Vec<String> = plan
        .files
        .keys()
        .filter(|f| dirs.contains(f.as_str()))
        .cloned()
        .collect();
    for f in clashes {
        plan.files.remove(&f);
        // Report it under the targets that named it.
        for t in &workload.targets {
            if file_of(&t.path, index).as_deref() == Ok(f.as_str()) {
                plan.skipped.push((t.path.clone(), Skipped::AlsoADirectory));
            }
        }
    }
    plan
}

impl RootPlan {
    /// Total bytes of the files.
    pub fn bytes(&self) -> u64 {
        self.files.values().sum()
    }

    /// Write the files beneath `root`. The same `seed` gives the same bytes. `root` must not
    /// exist or be an empty directory unless `force` (files are then written over; nothing is
    /// deleted).
    pub fn write(&self, root: &Path, seed: u64, force: bool) -> Result<(), TraceError> {
        let wrap = |path: &Path| {
            let path: PathBuf = path.to_owned();
            move |source| TraceError::Write { path, source }
        };
        if !force {
            crate::ensure_empty(root)?;
        }
        fs::create_dir_all(root).map_err(wrap(root))?;
        let mut made: BTreeSet<PathBuf> = BTreeSet::new();
        let mut buf = vec![0u8; 64 * 1024];
        for (rel, &size) in &self.files {
            let path = root.join(rel);
            if let Some(parent) = path.parent() {
                if made.insert(parent.to_owned()) {
                    fs::create_dir_all(parent).map_err(wrap(parent))?;
                }
            }
            let file = File::create(&path).map_err(wrap(&path))?;
            let mut out = BufWriter::with_capacity(64 * 1024, file);
            fill(&mut out, rel, size, seed, &mut buf)
                .and_then(|()| out.flush())
                .map_err(wrap(&path))?;
        }
        Ok(())
    }
}

/// `size` bytes of text for the file `rel`: a block drawn from a stream chosen by the seed and
/// the name, repeated (a site of hundreds of megabytes is written at disk speed).
fn fill(out: &mut impl Write, rel: &str, size: u64, seed: u64, buf: &mut [u8]) -> io::Result<()> {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz    \n ";
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..24].copy_from_slice(b"switchyard-root\0");
    let mut rng = ChaCha20Rng::from_seed(key);
    rng.set_stream(name_hash(rel));
    let block = size.min(buf.len() as u64) as usize;
    rng.fill_bytes(&mut buf[..block]);
    for b in &mut buf[..block] {
        *b = ALPHABET[usize::from(*b & 31)];
    }
    let mut left = size;
    while left > 0 {
        let k = left.min(block as u64) as usize;
        out.write_all(&buf[..k])?;
        left -= k as u64;
    }
    Ok(())
}

/// FNV-1a of a name: a stable stream number whatever the build.
fn name_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Target;

    fn workload(targets: &[(&str, u64)]) -> Workload {
        Workload {
            targets: targets
                .iter()
                .map(|(p, s)| Target {
                    path: (*p).to_owned(),
                    size: *s,
                })
                .collect(),
            ..Workload::default()
        }
    }

    #[test]
    fn targets_map_to_the_files_a_node_opens() {
        assert_eq!(file_of("/a/b.html", "index.html").unwrap(), "a/b.html");
        assert_eq!(file_of("/", "index.html").unwrap(), "index.html");
        assert_eq!(file_of("/docs/", "index.html").unwrap(), "docs/index.html");
        assert_eq!(file_of("/a/./c/../b%20c.txt", "i").unwrap(), "a/b c.txt");
        assert!(matches!(
            file_of("/../etc/passwd", "i"),
            Err(Skipped::Refused(_))
        ));
        assert!(matches!(file_of("/a%zz", "i"), Err(Skipped::Refused(_))));
        assert_eq!(
            file_of(&format!("/{}", "x".repeat(256)), "i"),
            Err(Skipped::NameTooLong)
        );
    }

    #[test]
    fn sizes_are_the_largest_logged_and_clashes_are_reported() {
        let w = workload(&[
            ("/a", 10),
            ("/a/b", 20),
            ("/c", 5),
            ("/c%2E", 0),
            ("/d/", 7),
            ("/../x", 1),
        ]);
        let plan = plan_root(&w, "index.html");
        let files: Vec<(&str, u64)> = plan.files.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(
            files,
            vec![("a/b", 20), ("c", 5), ("c.", 0), ("d/index.html", 7)]
        );
        assert_eq!(plan.bytes(), 32);
        assert_eq!(plan.skipped.len(), 2);
        assert!(plan
            .skipped
            .contains(&("/a".into(), Skipped::AlsoADirectory)));
        assert!(matches!(&plan.skipped[0], (p, Skipped::Refused(_)) if p == "/../x"));
    }

    #[test]
    fn the_same_seed_writes_the_same_bytes() {
        let w = workload(&[("/x/y.txt", 70_000), ("/z", 3), ("/e", 0)]);
        let plan = plan_root(&w, "index.html");
        let (a, b, c) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        plan.write(a.path(), 1, false).unwrap();
        plan.write(b.path(), 1, false).unwrap();
        plan.write(c.path(), 2, false).unwrap();
        let read = |d: &Path, f: &str| fs::read(d.join(f)).unwrap();
        assert_eq!(read(a.path(), "x/y.txt").len(), 70_000);
        assert_eq!(read(a.path(), "x/y.txt"), read(b.path(), "x/y.txt"));
        assert_ne!(read(a.path(), "x/y.txt"), read(c.path(), "x/y.txt"));
        assert_ne!(read(a.path(), "z"), b"aaa");
        assert!(read(a.path(), "e").is_empty());
        // A root that is not empty is refused unless forced.
        assert!(matches!(
            plan.write(a.path(), 1, false),
            Err(TraceError::NotEmpty { .. })
        ));
        plan.write(a.path(), 1, true).unwrap();
    }
}
