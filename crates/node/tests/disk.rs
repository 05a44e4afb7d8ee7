//! The disk beneath the node over real sockets: cache misses read with `O_DIRECT`
//! (`disk.o_direct`) on a real file system, its refusal on tmpfs, and emulated per-miss
//! latencies, sub-millisecond ones included.
//!
//! `O_DIRECT` needs a file system with a disk: the temp dir's when it takes `O_DIRECT`, else
//! (as root) an ext4 image mounted on a loop device; without either the test is reported
//! ignored with the reason. The tmpfs refusal uses `/dev/shm` when it is tmpfs, else (as root)
//! a tmpfs mounted for the test. Latencies are measured by the client around each request,
//! misses and hits interleaved, and compared on their fastest samples: the load of a busy
//! machine only ever adds time (medians moved by milliseconds under a parallel build), while a
//! wait rounded up to the runtime's 1 ms tick can never be faster than the tick, so the
//! fastest sample still shows the rounding.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{pattern, write, Client};
use libtest_mimic::{Arguments, Completion, Trial};
use switchyard_node::{NodeConfig, RunningNode};

/// A test: completed, ignored with a reason, or failed with a message.
type Test = fn() -> Result<Completion, String>;

fn main() {
    let args = Arguments::from_args();
    let tests: Vec<(&'static str, Test)> = vec![
        (
            "o_direct_misses_read_the_disk_and_hits_do_not",
            o_direct_misses_read_the_disk_and_hits_do_not,
        ),
        ("o_direct_is_refused_on_tmpfs", o_direct_is_refused_on_tmpfs),
        (
            "sub_millisecond_latency_is_honoured",
            sub_millisecond_latency_is_honoured,
        ),
        ("multi_millisecond_latency", multi_millisecond_latency),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, body)| {
            Trial::ignorable_test(name, move || {
                body().map_err(|e| format!("{name}: {e}").into())
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}

/// A node over `root` on its own runtime.
struct Node {
    node: Option<RunningNode>,
    rt: tokio::runtime::Runtime,
}

impl Node {
    fn start(root: &Path, tweak: impl FnOnce(&mut NodeConfig)) -> Result<Node, String> {
        let mut cfg = NodeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            admin: Some("127.0.0.1:0".parse().unwrap()),
            root: root.to_path_buf(),
            workers: 1,
            ..NodeConfig::default()
        };
        tweak(&mut cfg);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let node = rt
            .block_on(switchyard_node::start(cfg))
            .map_err(|e| e.to_string())?;
        Ok(Node {
            node: Some(node),
            rt,
        })
    }

    fn running(&self) -> &RunningNode {
        self.node.as_ref().unwrap()
    }

    fn client(&self) -> Client {
        Client::connect(self.running().addr())
    }

    /// `O_DIRECT` reads and the bytes they asked for, as the node counts them.
    fn direct_reads(&self) -> (u64, u64) {
        self.running().store().direct_reads()
    }

    fn cache_hits(&self) -> u64 {
        self.running().store().cache_stats().hits
    }

    fn metrics(&self) -> String {
        let mut c = Client::connect(self.running().admin_addr().unwrap());
        c.send(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
        String::from_utf8(c.response(false).body).unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(n) = self.node.take() {
            self.rt.block_on(n.shutdown(Duration::from_secs(2)));
        }
    }
}

/// A directory for a test, on a mount made for it when one was needed; unmounted at the end.
struct Place {
    dir: PathBuf,
    mounted: bool,
    _keep: tempfile::TempDir,
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.dir).status();
        }
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `dir`'s file system takes O_DIRECT reads of a file and has a disk beneath it.
fn takes_o_direct(dir: &Path) -> bool {
    use nix::sys::statfs::{statfs, TMPFS_MAGIC};
    use std::os::unix::fs::OpenOptionsExt;
    if statfs(dir).is_ok_and(|s| s.filesystem_type() == TMPFS_MAGIC) {
        return false;
    }
    let probe = dir.join(".o_direct_probe");
    if std::fs::write(&probe, vec![0u8; 4096]).is_err() {
        return false;
    }
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// A directory on a file system that takes O_DIRECT, or why there is none.
fn direct_place() -> Result<Place, String> {
    let keep = tempfile::tempdir().map_err(|e| e.to_string())?;
    if takes_o_direct(keep.path()) {
        return Ok(Place {
            dir: keep.path().to_path_buf(),
            mounted: false,
            _keep: keep,
        });
    }
    if !is_root() {
        return Err(format!(
            "the temp dir {} does not take O_DIRECT, and mounting an ext4 image needs root",
            keep.path().display()
        ));
    }
    let image = keep.path().join("ext4.img");
    let dir = keep.path().join("mnt");
    std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(64 << 20))
        .map_err(|e| e.to_string())?;
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?;
    run(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&image)
        .arg(&dir))?;
    let place = Place {
        dir,
        mounted: true,
        _keep: keep,
    };
    if !takes_o_direct(&place.dir) {
        return Err("a loop-mounted ext4 image does not take O_DIRECT here".into());
    }
    Ok(place)
}

/// A directory on tmpfs, or why there is none.
fn tmpfs_place() -> Result<Place, String> {
    use nix::sys::statfs::{statfs, TMPFS_MAGIC};
    let shm = Path::new("/dev/shm");
    if statfs(shm).is_ok_and(|s| s.filesystem_type() == TMPFS_MAGIC) {
        if let Ok(keep) = tempfile::tempdir_in(shm) {
            return Ok(Place {
                dir: keep.path().to_path_buf(),
                mounted: false,
                _keep: keep,
            });
        }
    }
    if !is_root() {
        return Err("/dev/shm is not a writable tmpfs, and mounting one needs root".into());
    }
    let keep = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = keep.path().join("tmpfs");
    std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
    run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&dir))?;
    Ok(Place {
        dir,
        mounted: true,
        _keep: keep,
    })
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

/// Misses and hits, interleaved: `misses` distinct files read once each (misses), each
/// followed by a request for one cached file (a hit). Returns the fastest of each.
fn miss_and_hit_fastest(node: &Node, misses: usize) -> Result<(Duration, Duration), String> {
    let mut c = node.client();
    let r = c.get("/hot.txt");
    check(r.status == 200, || format!("warming: {r:?}"))?;
    let mut miss = Vec::with_capacity(misses);
    let mut hit = Vec::with_capacity(misses);
    for i in 0..misses {
        let t = Instant::now();
        let r = c.get(&format!("/m{i}.txt"));
        miss.push(t.elapsed());
        check(
            r.status == 200 && r.body == format!("miss {i}\n").as_bytes(),
            || format!("/m{i}.txt: {r:?}"),
        )?;
        let t = Instant::now();
        let r = c.get("/hot.txt");
        hit.push(t.elapsed());
        check(r.status == 200, || format!("/hot.txt: {r:?}"))?;
    }
    let fastest = |v: &[Duration]| v.iter().copied().min().unwrap_or_default();
    Ok((fastest(&miss), fastest(&hit)))
}

fn fill_misses(root: &Path, n: usize) {
    write(root, "hot.txt", b"hot\n");
    for i in 0..n {
        write(root, &format!("m{i}.txt"), format!("miss {i}\n").as_bytes());
    }
}

/// Misses are read with O_DIRECT and served whole (cached, memfd-cached and streamed sizes,
/// ranges); hits do not touch the disk; a configured latency shows as the difference between
/// the fastest misses and hits.
fn o_direct_misses_read_the_disk_and_hits_do_not() -> Result<Completion, String> {
    let place = match direct_place() {
        Ok(p) => p,
        Err(reason) => return Ok(Completion::ignored_with(reason)),
    };
    let root = place.dir.join("site");
    std::fs::create_dir(&root).map_err(|e| e.to_string())?;
    let small = pattern(1000, 1);
    let mid = pattern(100_000, 2);
    let big = pattern(3 * (1 << 20) + 777, 3);
    write(&root, "small.txt", &small);
    write(&root, "mid.bin", &mid);
    write(&root, "big.bin", &big);
    fill_misses(&root, 41);
    let node = Node::start(&root, |c| {
        c.disk.o_direct = true;
        c.disk.latency_us = 1500;
        c.cache_max_object_bytes = 200_000;
    })?;
    let mut c = node.client();

    // A small file: one read on its miss, none on its hit.
    let (reads0, _) = node.direct_reads();
    let r = c.get("/small.txt");
    check(r.status == 200 && r.body == small, || {
        format!("small: {r:?}")
    })?;
    check(node.direct_reads() == (reads0 + 1, 1000), || {
        format!("after the small miss: {:?}", node.direct_reads())
    })?;
    let hits = node.cache_hits();
    let r = c.get("/small.txt");
    check(r.status == 200 && r.body == small, || "small hit".into())?;
    check(node.direct_reads().0 == reads0 + 1, || {
        "a hit went to the disk".into()
    })?;
    check(node.cache_hits() == hits + 1, || {
        "the hit was not counted".into()
    })?;

    // A file cached in a memfd: the same.
    let r = c.get("/mid.bin");
    check(r.status == 200 && r.body == mid, || "mid differs".into())?;
    let r = c.get("/mid.bin");
    check(r.status == 200 && r.body == mid, || {
        "mid hit differs".into()
    })?;
    check(node.direct_reads().0 == reads0 + 2, || {
        format!("mid: {:?}", node.direct_reads())
    })?;

    // Too large for the cache: read in 1 MiB pieces on every request, never cached.
    let pieces = big.len().div_ceil(1 << 20) as u64;
    for round in 1..=2u64 {
        let (before, bytes) = node.direct_reads();
        let r = c.get("/big.bin");
        check(r.status == 200 && r.body == big, || {
            format!("big round {round} differs")
        })?;
        let (after, bytes_after) = node.direct_reads();
        check(
            after == before + pieces && bytes_after == bytes + big.len() as u64,
            || format!("big round {round}: {before} -> {after} reads"),
        )?;
    }
    // A range across a piece boundary, and a HEAD (no body, no read).
    c.send(b"GET /big.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=1048570-1048600\r\n\r\n");
    let r = c.response(false);
    check(
        r.status == 206 && r.body == big[1_048_570..=1_048_600],
        || format!("range: {}", r.status),
    )?;
    let (before, _) = node.direct_reads();
    c.send(b"HEAD /big.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.response(true);
    check(r.status == 200, || format!("head: {}", r.status))?;
    check(node.direct_reads().0 == before, || {
        "a HEAD read the disk".into()
    })?;
    let text = node.metrics();
    check(
        text.contains("switchyard_node_disk_direct_reads_total "),
        || format!("no O_DIRECT counter in\n{text}"),
    )?;

    // O_DIRECT misses are slower than hits by the configured latency.
    let (miss, hit) = miss_and_hit_fastest(&node, 41)?;
    let extra = miss.saturating_sub(hit);
    check(extra >= Duration::from_micros(1500), || {
        format!("misses {miss:?}, hits {hit:?}: {extra:?} extra, configured 1.5 ms")
    })?;
    Ok(Completion::Completed)
}

/// A root on tmpfs with o_direct: the node does not start, and says why.
fn o_direct_is_refused_on_tmpfs() -> Result<Completion, String> {
    let place = match tmpfs_place() {
        Ok(p) => p,
        Err(reason) => return Ok(Completion::ignored_with(reason)),
    };
    write(&place.dir, "a.txt", b"a");
    let err = match Node::start(&place.dir, |c| c.disk.o_direct = true) {
        Ok(_) => return Err("a node with o_direct started on tmpfs".into()),
        Err(e) => e,
    };
    check(
        err.contains("o_direct") && err.contains("tmpfs") && err.contains("no disk"),
        || format!("unclear error: {err}"),
    )?;
    // Without o_direct the same root serves.
    let node = Node::start(&place.dir, |_| {})?;
    let r = node.client().get("/a.txt");
    check(r.status == 200, || format!("{r:?}"))?;
    Ok(Completion::Completed)
}

/// A node over a fresh temp root with `latency_us` per miss.
fn latency_node(latency_us: u64, misses: usize) -> Result<(Node, tempfile::TempDir), String> {
    let root = tempfile::tempdir().map_err(|e| e.to_string())?;
    fill_misses(root.path(), misses);
    let node = Node::start(root.path(), |c| c.disk.latency_us = latency_us)?;
    Ok((node, root))
}

/// 300 µs per miss: the fastest samples differ by at least that and by well under tokio's 1 ms tick
/// (which used to round every such wait up to 1-2 ms).
fn sub_millisecond_latency_is_honoured() -> Result<Completion, String> {
    let (node, _root) = latency_node(300, 301)?;
    let (miss, hit) = miss_and_hit_fastest(&node, 301)?;
    let extra = miss.saturating_sub(hit);
    check(
        extra >= Duration::from_micros(300) && extra < Duration::from_micros(900),
        || format!("misses {miss:?}, hits {hit:?}: {extra:?} extra for 300 µs"),
    )?;
    Ok(Completion::Completed)
}

/// 4 ms per miss: the same, on the millisecond scale.
fn multi_millisecond_latency() -> Result<Completion, String> {
    let (node, _root) = latency_node(4000, 51)?;
    let (miss, hit) = miss_and_hit_fastest(&node, 51)?;
    let extra = miss.saturating_sub(hit);
    check(
        extra >= Duration::from_millis(4) && extra < Duration::from_millis(8),
        || format!("misses {miss:?}, hits {hit:?}: {extra:?} extra for 4 ms"),
    )?;
    Ok(Completion::Completed)
}
