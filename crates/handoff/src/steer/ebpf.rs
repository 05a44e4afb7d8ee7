//! The eBPF steering backend: `bpf/steer.bpf.c` on the switch interface's
//! tc clsact ingress hook, and per-connection map updates from Rust.
//!
//! Setup ([`EbpfSteering::setup`]) compiles the program with clang (once per
//! source version, cached under the temporary directory), loads it with
//! `bpftool prog load … pinmaps …` into a BPF file system under
//! [`DEFAULT_PIN_ROOT`] (mounted there if needed: `ip netns exec` hides
//! `/sys/fs/bpf` behind a fresh `/sys`, `/run` stays visible), and attaches
//! the pinned program with `tc filter add … bpf direct-action pinned …`.
//! [`EbpfSteering::open`] attaches to a table another process set up.
//!
//! Map updates go through a hand-written wrapper of the five `bpf(2)`
//! commands needed (`BPF_OBJ_GET`, `BPF_MAP_UPDATE_ELEM`,
//! `BPF_MAP_DELETE_ELEM`, `BPF_MAP_DELETE_BATCH`, `BPF_MAP_LOOKUP_ELEM`): about a hundred lines
//! against a stable kernel ABI, no loader, no new dependency tree and no
//! allocation per call, whereas `aya` would bring its own ELF loader and
//! tokio integration that tc and bpftool already cover here.

use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI64, Ordering};

use tracing::{debug, info};

use super::{Flow, Steering, Target};
use crate::error::{HandoffError, Result};
use crate::netns::{self, NetNs};

/// The program's source, kept in the repository and compiled at setup.
pub const SOURCE: &str = include_str!("../../bpf/steer.bpf.c");
/// Where the BPF file system for pins is mounted.
pub const DEFAULT_PIN_ROOT: &str = "/run/switchyard/bpf";
/// Name of the pinned steering map.
pub const MAP_NAME: &str = "sy_steer";
/// Name of the pinned statistics map.
pub const STATS_NAME: &str = "sy_stats";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// tc filter priority used for the program.
const TC_PREF: &str = "49";

const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
const BPF_OBJ_GET: libc::c_int = 7;
const BPF_MAP_DELETE_BATCH: libc::c_int = 27;
const BPF_ANY: u64 = 0;
const BPF_NOEXIST: u64 = 1;

/// Key of `sy_steer` (mirrors `struct sy_key`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Key {
    /// Client address, network order.
    pub saddr: [u8; 4],
    /// VIP, network order.
    pub daddr: [u8; 4],
    /// Client port, network order.
    pub sport: [u8; 2],
    /// Service port, network order.
    pub dport: [u8; 2],
}

impl Key {
    /// The key of a flow.
    pub fn of(flow: &Flow) -> Key {
        Key {
            saddr: flow.client.ip().octets(),
            daddr: flow.vip.ip().octets(),
            sport: flow.client.port().to_be_bytes(),
            dport: flow.vip.port().to_be_bytes(),
        }
    }
}

/// Value of `sy_steer` (mirrors `struct sy_val`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Value {
    /// Destination MAC: the node.
    pub dmac: [u8; 6],
    /// Source MAC: the outgoing interface.
    pub smac: [u8; 6],
    /// Outgoing interface index (0: the incoming one).
    pub ifindex: u32,
    /// Packets forwarded (maintained by the program).
    pub packets: u64,
}

#[repr(C)]
struct AttrObj {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

#[repr(C)]
struct AttrElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The `batch` member of `union bpf_attr` (`BPF_MAP_*_BATCH`, Linux 5.6).
#[repr(C)]
struct AttrBatch {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: attr is a valid, initialised bpf_attr prefix for `cmd`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A BPF map opened from its pin.
#[derive(Debug)]
pub struct PinnedMap {
    fd: OwnedFd,
}

impl PinnedMap {
    /// `BPF_OBJ_GET` on a pinned path.
    pub fn open(path: &Path) -> Result<PinnedMap> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| HandoffError::Other("pin path with NUL".into()))?;
        let mut attr = AttrObj {
            pathname: c.as_ptr() as u64,
            bpf_fd: 0,
            file_flags: 0,
        };
        let fd = bpf(BPF_OBJ_GET, &mut attr)
            .map_err(|e| HandoffError::io(format!("bpf(BPF_OBJ_GET, {})", path.display()), e))?;
        // SAFETY: the kernel returned a new descriptor.
        Ok(PinnedMap {
            fd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
        })
    }

    fn elem(
        &self,
        cmd: libc::c_int,
        key: *const u8,
        value: *const u8,
        flags: u64,
    ) -> io::Result<()> {
        let mut attr = AttrElem {
            map_fd: self.fd.as_raw_fd() as u32,
            _pad: 0,
            key: key as u64,
            value: value as u64,
            flags,
        };
        bpf(cmd, &mut attr).map(|_| ())
    }

    /// `BPF_MAP_UPDATE_ELEM`.
    pub fn update<K, V>(&self, key: &K, value: &V, flags: u64) -> io::Result<()> {
        self.elem(
            BPF_MAP_UPDATE_ELEM,
            key as *const K as *const u8,
            value as *const V as *const u8,
            flags,
        )
    }

    /// `BPF_MAP_DELETE_ELEM`; false when the key was absent.
    pub fn delete<K>(&self, key: &K) -> io::Result<bool> {
        match self.elem(
            BPF_MAP_DELETE_ELEM,
            key as *const K as *const u8,
            std::ptr::null(),
            0,
        ) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes `keys` with `BPF_MAP_DELETE_BATCH`, one call for all of them where the keys
    /// are present; returns how many were. The kernel stops a batch at the first key that is
    /// absent (`ENOENT`, counting those before it), so the rest goes in a further call. A
    /// kernel without batch operations answers `EINVAL` (or `ENOTSUPP`) before deleting
    /// anything: the keys are then deleted one by one.
    pub fn delete_batch<K>(&self, keys: &[K]) -> io::Result<usize> {
        let mut deleted = 0;
        let mut rest = keys;
        while !rest.is_empty() {
            let mut attr = AttrBatch {
                in_batch: 0,
                out_batch: 0,
                keys: rest.as_ptr() as u64,
                values: 0,
                count: rest.len() as u32,
                map_fd: self.fd.as_raw_fd() as u32,
                elem_flags: 0,
                flags: 0,
            };
            match bpf(BPF_MAP_DELETE_BATCH, &mut attr) {
                Ok(_) => return Ok(deleted + rest.len()),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    // `count` keys went; the next one was absent.
                    let done = (attr.count as usize).min(rest.len());
                    deleted += done;
                    rest = &rest[(done + 1).min(rest.len())..];
                }
                // ENOTSUPP (524) is the kernel's own code for a map without batch operations.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(524)) => {
                    for k in rest {
                        deleted += usize::from(self.delete(k)?);
                    }
                    return Ok(deleted);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    /// `BPF_MAP_LOOKUP_ELEM`.
    pub fn lookup<K, V: Default>(&self, key: &K) -> io::Result<Option<V>> {
        let mut v = V::default();
        match self.elem(
            BPF_MAP_LOOKUP_ELEM,
            key as *const K as *const u8,
            &mut v as *mut V as *const u8,
            0,
        ) {
            Ok(()) => Ok(Some(v)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Setup parameters.
#[derive(Debug, Clone)]
pub struct EbpfConfig {
    /// The switch's interface where client packets arrive (and leave again
    /// towards the nodes).
    pub iface: String,
    /// Directory for this instance's pins, on a BPF file system
    /// (default: `DEFAULT_PIN_ROOT/<iface>`).
    pub pin_dir: PathBuf,
    /// A precompiled object instead of compiling [`SOURCE`].
    pub object: Option<PathBuf>,
}

impl EbpfConfig {
    /// Defaults for an interface; `instance` keeps concurrent setups apart.
    pub fn new(iface: &str, instance: &str) -> Self {
        EbpfConfig {
            iface: iface.to_string(),
            pin_dir: PathBuf::from(DEFAULT_PIN_ROOT).join(instance),
            object: None,
        }
    }
}

/// The eBPF steering table.
#[derive(Debug)]
pub struct EbpfSteering {
    map: PinnedMap,
    stats: PinnedMap,
    smac: [u8; 6],
    ifindex: u32,
    inserted: AtomicI64,
    iface: String,
    pin_dir: PathBuf,
}

/// Makes sure `dir` is on a BPF file system, mounting one if needed. A process started by
/// `ip netns exec` has a mount namespace of its own, so a file system it mounts is seen by it
/// alone (its pins die with it and no later process finds them): whoever starts such processes
/// mounts it first in its own namespace, which they inherit (`switchyard lab up` does).
pub fn ensure_bpffs(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| HandoffError::io(format!("mkdir {}", dir.display()), e))?;
    if is_bpffs(dir) {
        return Ok(());
    }
    // Processes that start together (a lab's switches, a suite's threads) would each find no
    // BPF file system and each mount one, stacked: pins made in a lower one are then hidden from
    // every later look-up of the path. The look and the mount are one step under a lock file
    // beside the directory.
    let lock_path = dir.with_extension("mount-lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| HandoffError::io(format!("open {}", lock_path.display()), e))?;
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| HandoffError::io(format!("flock {}", lock_path.display()), e.into()))?;
    if is_bpffs(dir) {
        return Ok(());
    }
    let c =
        CString::new(dir.as_os_str().as_bytes()).map_err(|_| HandoffError::Other("path".into()))?;
    // SAFETY: plain mount(2) with static strings.
    let r = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(HandoffError::last_os(format!(
            "mount bpffs on {}",
            dir.display()
        )));
    }
    Ok(())
}

fn is_bpffs(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}

fn multiarch_include() -> Option<PathBuf> {
    let triple = match std::env::consts::ARCH {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        _ => return None,
    };
    let p = PathBuf::from("/usr/include").join(triple);
    p.is_dir().then_some(p)
}

/// Compiles [`SOURCE`] with clang (cached by content) and returns the object.
pub fn compile() -> Result<PathBuf> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in SOURCE.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let dir = std::env::temp_dir().join("switchyard-bpf");
    std::fs::create_dir_all(&dir).map_err(|e| HandoffError::io("mkdir bpf cache", e))?;
    let obj = dir.join(format!("steer-{h:016x}.o"));
    if obj.is_file() {
        return Ok(obj);
    }
    let src = dir.join(format!("steer-{h:016x}.c"));
    std::fs::write(&src, SOURCE).map_err(|e| HandoffError::io("write bpf source", e))?;
    let clang = netns::which("clang").ok_or_else(|| {
        HandoffError::Missing("clang (scripts/install-lab-deps installs it)".into())
    })?;
    if !Path::new("/usr/include/bpf/bpf_helpers.h").is_file() {
        return Err(HandoffError::Missing(
            "libbpf-dev headers (scripts/install-lab-deps installs them)".into(),
        ));
    }
    let tmp = dir.join(format!("steer-{h:016x}.{}.tmp", std::process::id()));
    let mut cmd = Command::new(clang);
    cmd.args(["-O2", "-g", "-Wall", "-target", "bpf"]);
    if let Some(inc) = multiarch_include() {
        cmd.arg("-I").arg(inc);
    }
    cmd.arg("-c").arg(&src).arg("-o").arg(&tmp);
    netns::run(&mut cmd)?;
    std::fs::rename(&tmp, &obj).map_err(|e| HandoffError::io("rename bpf object", e))?;
    info!(object = %obj.display(), "compiled steering program");
    Ok(obj)
}

fn tc(ns: Option<&NetNs>, args: &[&str]) -> Result<String> {
    let prog = netns::which("tc").ok_or_else(|| HandoffError::Missing("tc (iproute2)".into()))?;
    let prog = prog.to_string_lossy().into_owned();
    let mut cmd = match ns {
        Some(ns) => ns.command(&prog),
        None => Command::new(&prog),
    };
    netns::run(cmd.args(args))
}

impl EbpfSteering {
    /// Compiles, loads, pins and attaches the program on `cfg.iface` in `ns`
    /// (or the current namespace), replacing an earlier setup of the same
    /// pin directory. The calling thread must be in the switch's namespace
    /// when `ns` is `None`.
    pub fn setup(cfg: &EbpfConfig, ns: Option<&NetNs>) -> Result<EbpfSteering> {
        let obj = match &cfg.object {
            Some(o) => o.clone(),
            None => compile()?,
        };
        let root = cfg.pin_dir.parent().unwrap_or(Path::new(DEFAULT_PIN_ROOT));
        ensure_bpffs(root)?;
        remove_pins(&cfg.pin_dir);
        std::fs::create_dir_all(&cfg.pin_dir)
            .map_err(|e| HandoffError::io(format!("mkdir {}", cfg.pin_dir.display()), e))?;
        let bpftool = netns::which("bpftool").ok_or_else(|| {
            HandoffError::Missing("bpftool (scripts/install-lab-deps installs it)".into())
        })?;
        let prog_pin = cfg.pin_dir.join("prog");
        netns::run(
            Command::new(bpftool)
                .args(["prog", "load"])
                .arg(&obj)
                .arg(&prog_pin)
                .args(["type", "classifier", "pinmaps"])
                .arg(&cfg.pin_dir),
        )?;
        let prog_pin_s = prog_pin.to_string_lossy().into_owned();
        let iface = cfg.iface.as_str();
        tc(ns, &["qdisc", "replace", "dev", iface, "clsact"])?;
        let _ = tc(
            ns,
            &["filter", "del", "dev", iface, "ingress", "pref", TC_PREF],
        );
        tc(
            ns,
            &[
                "filter",
                "add",
                "dev",
                iface,
                "ingress",
                "pref",
                TC_PREF,
                "bpf",
                "direct-action",
                "pinned",
                &prog_pin_s,
            ],
        )?;
        info!(iface, pins = %cfg.pin_dir.display(), "eBPF steering attached");
        let _guard = ns.map(|n| n.enter()).transpose()?;
        Self::open(&cfg.pin_dir, iface)
    }

    /// Opens the pinned maps of an existing setup; `iface` (resolved in the
    /// calling thread's namespace) gives the source MAC and the outgoing
    /// interface.
    pub fn open(pin_dir: &Path, iface: &str) -> Result<EbpfSteering> {
        let map = PinnedMap::open(&pin_dir.join(MAP_NAME))?;
        let stats = PinnedMap::open(&pin_dir.join(STATS_NAME))?;
        let (smac, ifindex) = super::interface_info(iface)?;
        Ok(EbpfSteering {
            map,
            stats,
            smac,
            ifindex,
            inserted: AtomicI64::new(0),
            iface: iface.to_string(),
            pin_dir: pin_dir.to_path_buf(),
        })
    }

    /// Detaches the program from `iface` and removes the pins.
    pub fn teardown(ns: Option<&NetNs>, iface: &str, pin_dir: &Path) {
        let _ = tc(
            ns,
            &["filter", "del", "dev", iface, "ingress", "pref", TC_PREF],
        );
        remove_pins(pin_dir);
    }

    /// Interface name.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Pin directory.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// A counter of the program: 0 packets forwarded, 1 stale entries
    /// deleted by a SYN, 2 packets passed to the stack.
    pub fn stat(&self, idx: u32) -> u64 {
        self.stats
            .lookup::<u32, u64>(&idx)
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    /// The entry of a flow, if any.
    pub fn get(&self, flow: &Flow) -> Result<Option<Value>> {
        self.map
            .lookup(&Key::of(flow))
            .map_err(|e| HandoffError::io("bpf(BPF_MAP_LOOKUP_ELEM)", e))
    }
}

impl Steering for EbpfSteering {
    fn insert(&self, flow: &Flow, to: &Target) -> Result<()> {
        let key = Key::of(flow);
        let val = Value {
            dmac: to.mac,
            smac: self.smac,
            ifindex: self.ifindex,
            packets: 0,
        };
        match self.map.update(&key, &val, BPF_NOEXIST) {
            Ok(()) => {
                self.inserted.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => self
                .map
                .update(&key, &val, BPF_ANY)
                .map_err(|e| HandoffError::io("bpf(BPF_MAP_UPDATE_ELEM)", e)),
            Err(e) => Err(HandoffError::io("bpf(BPF_MAP_UPDATE_ELEM)", e)),
        }
    }

    fn remove(&self, flow: &Flow) -> Result<bool> {
        let r = self
            .map
            .delete(&Key::of(flow))
            .map_err(|e| HandoffError::io("bpf(BPF_MAP_DELETE_ELEM)", e))?;
        if r {
            self.inserted.fetch_sub(1, Ordering::Relaxed);
        }
        debug!(?flow, removed = r, "steering entry removed");
        Ok(r)
    }

    fn remove_many(&self, flows: &[Flow]) -> Result<usize> {
        let keys: Vec<Key> = flows.iter().map(Key::of).collect();
        let n = self
            .map
            .delete_batch(&keys)
            .map_err(|e| HandoffError::io("bpf(BPF_MAP_DELETE_BATCH)", e))?;
        self.inserted.fetch_sub(n as i64, Ordering::Relaxed);
        debug!(
            entries = flows.len(),
            removed = n,
            "steering entries removed"
        );
        Ok(n)
    }

    fn live(&self) -> usize {
        (self.inserted.load(Ordering::Relaxed) - self.stat(1) as i64).max(0) as usize
    }

    fn kind(&self) -> &'static str {
        "ebpf"
    }
}

fn remove_pins(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_structs() {
        assert_eq!(size_of::<Key>(), 12);
        assert_eq!(size_of::<Value>(), 24);
    }

    #[test]
    fn key_is_network_order() {
        let f = Flow {
            client: "10.0.0.1:258".parse().unwrap(),
            vip: "10.0.0.100:80".parse().unwrap(),
        };
        let k = Key::of(&f);
        assert_eq!(k.saddr, [10, 0, 0, 1]);
        assert_eq!(k.sport, [1, 2]);
        assert_eq!(k.dport, [0, 80]);
    }

    #[test]
    fn source_declares_the_pinned_maps() {
        assert!(SOURCE.contains(&format!("}} {MAP_NAME} SEC(\".maps\")")));
        assert!(SOURCE.contains(&format!("}} {STATS_NAME} SEC(\".maps\")")));
    }
}
