//! Network namespaces: create and delete them (`ip netns`), run commands in
//! them, and move the current thread into one so that sockets created there
//! belong to it (a socket keeps the namespace it was created in).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use crate::error::{HandoffError, Result};

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// A named network namespace.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    file: File,
}

impl NetNs {
    /// Creates `name` with `ip netns add` and brings its loopback up.
    pub fn create(name: &str) -> Result<NetNs> {
        run(Command::new("ip").args(["netns", "add", name]))?;
        let ns = Self::open(name)?;
        ns.run(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Opens an existing namespace.
    pub fn open(name: &str) -> Result<NetNs> {
        let path = Self::path_of(name);
        let file = File::open(&path)
            .map_err(|e| HandoffError::io(format!("open {}", path.display()), e))?;
        Ok(NetNs {
            name: name.to_string(),
            file,
        })
    }

    /// True when a namespace of that name exists.
    pub fn exists(name: &str) -> bool {
        Self::path_of(name).exists()
    }

    /// Path of a named namespace.
    pub fn path_of(name: &str) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(name)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs in this namespace (only the network namespace
    /// changes: the mount namespace, and so `/sys`, stay the caller's; use
    /// `ip netns exec` for programs that read `/sys/class/net`).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        let fd = self.file.as_raw_fd();
        // SAFETY: setns(2) is async-signal-safe; `fd` stays open while `self` lives,
        // and the command is spawned from a borrow of `self`'s namespace handle.
        unsafe {
            c.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c
    }

    /// Runs `argv` in this namespace and returns its standard output; a
    /// non-zero exit is an error carrying standard error.
    pub fn run(&self, argv: &[&str]) -> Result<String> {
        let (prog, rest) = argv
            .split_first()
            .ok_or_else(|| HandoffError::Other("empty command".into()))?;
        run(self.command(prog).args(rest))
    }

    /// Moves the calling thread into this namespace until the guard drops.
    pub fn enter(&self) -> Result<NsGuard> {
        let orig = File::open("/proc/thread-self/ns/net")
            .map_err(|e| HandoffError::io("open /proc/thread-self/ns/net", e))?;
        // SAFETY: plain setns(2) on a namespace descriptor.
        if unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(HandoffError::last_os(format!("setns({})", self.name)));
        }
        Ok(NsGuard { orig })
    }

    /// Deletes the namespace (`ip netns delete`); processes still inside
    /// keep it alive until they exit.
    pub fn delete(name: &str) -> Result<()> {
        if !Self::exists(name) {
            return Ok(());
        }
        run(Command::new("ip").args(["netns", "delete", name])).map(|_| ())
    }

    /// Names of all namespaces starting with `prefix`.
    pub fn list_prefixed(prefix: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(NETNS_DIR)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.starts_with(prefix))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// Returns the thread to its original namespace when dropped.
#[derive(Debug)]
pub struct NsGuard {
    orig: File,
}

impl Drop for NsGuard {
    fn drop(&mut self) {
        // SAFETY: plain setns(2) back to the namespace the thread came from.
        unsafe {
            libc::setns(self.orig.as_raw_fd(), libc::CLONE_NEWNET);
        }
    }
}

/// Runs a command to completion; its standard output, or an error with its
/// standard error.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = output(cmd)?;
    if !out.status.success() {
        return Err(HandoffError::Command {
            cmd: describe(cmd),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command and ignores its result (teardown steps).
pub fn run_quiet(cmd: &mut Command) {
    let _ = output(cmd);
}

fn output(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => HandoffError::Missing(format!(
                "{} (scripts/install-lab-deps installs it)",
                cmd.get_program().to_string_lossy()
            )),
            _ => HandoffError::io(describe(cmd), e),
        })
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// True when this process has CAP_NET_ADMIN and CAP_SYS_ADMIN (creating
/// namespaces, mounting bpffs, loading BPF programs).
pub fn has_admin_caps() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_NET_ADMIN: u64 = 1 << 12;
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    eff & CAP_NET_ADMIN != 0 && eff & CAP_SYS_ADMIN != 0
}

/// Locates a program on `PATH`, also looking in the sbin directories that
/// are not on a normal user's `PATH` (Debian keeps `bpftool`, `tc`, `nft`
/// there).
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_reports_failures_with_stderr() {
        let e = run(Command::new("sh").args(["-c", "echo oops >&2; exit 3"])).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("oops") && s.contains("sh -c"), "{s}");
        assert_eq!(
            run(Command::new("sh").args(["-c", "echo hi"])).unwrap(),
            "hi\n"
        );
    }

    #[test]
    fn missing_program_is_reported_as_missing() {
        let e = run(&mut Command::new("switchyard-no-such-program")).unwrap_err();
        assert!(matches!(e, HandoffError::Missing(_)), "{e}");
    }

    #[test]
    fn which_finds_sh() {
        assert!(which("sh").is_some());
    }
}
