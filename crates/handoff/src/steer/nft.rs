//! The nftables steering backend (fallback when eBPF is unavailable), and
//! the helpers that run nftables scripts.
//!
//! ```text
//! table netdev sy_steer_<tag> {
//!   map flows { type ipv4_addr . inet_service . ipv4_addr . inet_service : ipv4_addr; }
//!   set fresh { type ipv4_addr . inet_service . ipv4_addr . inet_service; flags dynamic,timeout; timeout 2m; }
//!   chain ingress {
//!     type filter hook ingress device "<if>" priority -500;
//!     tcp flags & (syn|ack) == syn  add @fresh { 4-tuple }  accept
//!     4-tuple @fresh accept
//!     fwd ip to 4-tuple map @flows device "<if>"
//!   }
//! }
//! ```
//!
//! A map element cannot be deleted from the packet path, so a SYN that
//! reuses a 4-tuple is remembered in `fresh`: packets of that 4-tuple then go
//! to the switch's own stack even though an old `flows` entry exists. When the
//! switch hands the new connection off, [`NftSteering::insert`] removes the
//! tuple from `fresh` and writes the map element in one transaction.
//!
//! Element updates go through libnftables (loaded at run time with
//! `dlopen`, so nothing links against it), about 100 µs each; when the
//! library is missing the `nft` command is used. Calls act on the calling
//! thread's network namespace.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use super::{Flow, Steering, Target};
use crate::error::{HandoffError, Result};
use crate::netns::{self, NetNs};

/// Runs an nftables script (`nft -f -`) in `ns` or the current namespace.
pub fn run_nft_script(ns: Option<&NetNs>, script: &str) -> Result<()> {
    let nft = netns::which("nft").ok_or_else(|| {
        HandoffError::Missing("nft (scripts/install-lab-deps installs nftables)".into())
    })?;
    let nft = nft.to_string_lossy().into_owned();
    let mut cmd = match ns {
        Some(ns) => ns.command(&nft),
        None => Command::new(&nft),
    };
    cmd.args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| HandoffError::io("spawn nft", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| HandoffError::io("write nft script", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| HandoffError::io("wait nft", e))?;
    if !out.status.success() {
        return Err(HandoffError::Command {
            cmd: format!("nft -f - <<'EOF'\n{script}EOF"),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

type CtxNew = unsafe extern "C" fn(u32) -> *mut libc::c_void;
type CtxFree = unsafe extern "C" fn(*mut libc::c_void);
type RunCmd = unsafe extern "C" fn(*mut libc::c_void, *const libc::c_char) -> libc::c_int;
type BufferErr = unsafe extern "C" fn(*mut libc::c_void) -> libc::c_int;
type GetErr = unsafe extern "C" fn(*mut libc::c_void) -> *const libc::c_char;

/// A libnftables context, loaded with `dlopen`.
struct Libnft {
    ctx: *mut libc::c_void,
    free: CtxFree,
    run: RunCmd,
    get_err: GetErr,
}

// SAFETY: the context is only used behind a Mutex.
unsafe impl Send for Libnft {}

impl Libnft {
    fn load() -> Option<Libnft> {
        // SAFETY: dlopen/dlsym with static names; symbols have the documented
        // libnftables signatures.
        unsafe {
            let h = libc::dlopen(
                c"libnftables.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            );
            if h.is_null() {
                return None;
            }
            let sym = |n: &CStr| {
                let p = libc::dlsym(h, n.as_ptr());
                (!p.is_null()).then_some(p)
            };
            let new: CtxNew = std::mem::transmute(sym(c"nft_ctx_new")?);
            let free: CtxFree = std::mem::transmute(sym(c"nft_ctx_free")?);
            let run: RunCmd = std::mem::transmute(sym(c"nft_run_cmd_from_buffer")?);
            let buf_err: BufferErr = std::mem::transmute(sym(c"nft_ctx_buffer_error")?);
            let buf_out: BufferErr = std::mem::transmute(sym(c"nft_ctx_buffer_output")?);
            let get_err: GetErr = std::mem::transmute(sym(c"nft_ctx_get_error_buffer")?);
            let ctx = new(0);
            if ctx.is_null() {
                return None;
            }
            buf_err(ctx);
            buf_out(ctx);
            Some(Libnft {
                ctx,
                free,
                run,
                get_err,
            })
        }
    }

    fn run(&mut self, cmd: &str) -> Result<()> {
        let c =
            CString::new(cmd).map_err(|_| HandoffError::Other("nft command with NUL".into()))?;
        // SAFETY: ctx is live; c is a valid C string.
        let r = unsafe { (self.run)(self.ctx, c.as_ptr()) };
        if r != 0 {
            // SAFETY: the error buffer is a C string owned by ctx.
            let err = unsafe {
                let p = (self.get_err)(self.ctx);
                if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().trim().to_string()
                }
            };
            return Err(HandoffError::Command {
                cmd: format!("libnftables: {cmd}"),
                status: format!("{r}"),
                stderr: err,
            });
        }
        Ok(())
    }
}

impl Drop for Libnft {
    fn drop(&mut self) {
        // SAFETY: ctx came from nft_ctx_new.
        unsafe { (self.free)(self.ctx) }
    }
}

/// The nftables steering table.
pub struct NftSteering {
    table: String,
    iface: String,
    lib: Mutex<Option<Libnft>>,
    flows: Mutex<HashSet<Flow>>,
}

impl std::fmt::Debug for NftSteering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftSteering")
            .field("table", &self.table)
            .field("iface", &self.iface)
            .finish()
    }
}

fn tuple_expr() -> &'static str {
    "ip saddr . tcp sport . ip daddr . tcp dport"
}

fn elem(flow: &Flow) -> String {
    format!(
        "{} . {} . {} . {}",
        flow.client.ip(),
        flow.client.port(),
        flow.vip.ip(),
        flow.vip.port()
    )
}

impl NftSteering {
    /// Creates the table on `iface` in `ns` (or the current namespace),
    /// replacing an earlier one with the same tag. Later element updates act
    /// on the calling thread's namespace.
    pub fn setup(ns: Option<&NetNs>, iface: &str, tag: &str) -> Result<NftSteering> {
        let table = format!("sy_steer_{tag}");
        let _ = run_nft_script(ns, &format!("delete table netdev {table}\n"));
        let t = tuple_expr();
        let script = format!(
            "table netdev {table} {{\n\
             \tmap flows {{ type ipv4_addr . inet_service . ipv4_addr . inet_service : ipv4_addr; size 262144; }}\n\
             \tset fresh {{ type ipv4_addr . inet_service . ipv4_addr . inet_service; flags dynamic,timeout; timeout 2m; size 262144; }}\n\
             \tchain ingress {{\n\
             \t\ttype filter hook ingress device \"{iface}\" priority -500; policy accept;\n\
             \t\tmeta protocol ip meta l4proto tcp tcp flags & (syn | ack) == syn add @fresh {{ {t} }} accept\n\
             \t\tmeta protocol ip meta l4proto tcp {t} @fresh accept\n\
             \t\tmeta protocol ip meta l4proto tcp fwd ip to {t} map @flows device \"{iface}\"\n\
             \t}}\n\
             }}\n"
        );
        run_nft_script(ns, &script)?;
        Ok(NftSteering {
            table,
            iface: iface.to_string(),
            lib: Mutex::new(None),
            flows: Mutex::new(HashSet::new()),
        })
    }

    /// Removes the table.
    pub fn teardown(ns: Option<&NetNs>, tag: &str) {
        let _ = run_nft_script(ns, &format!("delete table netdev sy_steer_{tag}\n"));
    }

    fn exec(&self, cmd: &str) -> Result<()> {
        let mut g = self.lib.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Libnft::load();
        }
        match g.as_mut() {
            Some(lib) => lib.run(cmd),
            None => run_nft_script(None, cmd),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Node address of a flow's entry, if any.
    pub fn get(&self, flow: &Flow) -> Result<Option<Ipv4Addr>> {
        let out = netns::run(
            Command::new(netns::which("nft").unwrap_or("nft".into())).args([
                "get",
                "element",
                "netdev",
                &self.table,
                "flows",
                &format!("{{ {} }}", elem(flow)),
            ]),
        );
        match out {
            Ok(text) => Ok(text
                .split(':')
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.trim_end_matches(['}', ',']).parse().ok())),
            Err(_) => Ok(None),
        }
    }
}

impl Steering for NftSteering {
    fn insert(&self, flow: &Flow, to: &Target) -> Result<()> {
        let e = elem(flow);
        let t = &self.table;
        let mut flows = self.flows.lock().unwrap_or_else(|p| p.into_inner());
        // Replacing an element's data needs delete + add (`add` of an
        // existing key is refused), in one transaction.
        let map_ops = if flows.contains(flow) {
            format!(
                "delete element netdev {t} flows {{ {e} }}\n\
                 add element netdev {t} flows {{ {e} : {ip} }}\n",
                ip = to.ip
            )
        } else {
            format!(
                "add element netdev {t} flows {{ {e} : {ip} }}\n",
                ip = to.ip
            )
        };
        // The tuple is normally in `fresh` (its SYN put it there): take it out
        // in the same transaction; if it was not there, redo without.
        let with_fresh = format!("delete element netdev {t} fresh {{ {e} }}\n{map_ops}");
        if self.exec(&with_fresh).is_err() {
            self.exec(&map_ops)?;
        }
        flows.insert(*flow);
        Ok(())
    }

    fn remove(&self, flow: &Flow) -> Result<bool> {
        let mut flows = self.flows.lock().unwrap_or_else(|p| p.into_inner());
        let cmd = format!(
            "delete element netdev {} flows {{ {} }}\n",
            self.table,
            elem(flow)
        );
        match self.exec(&cmd) {
            Ok(()) => {
                flows.remove(flow);
                Ok(true)
            }
            Err(HandoffError::Command { .. }) => {
                flows.remove(flow);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn live(&self) -> usize {
        self.flows.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn kind(&self) -> &'static str {
        "nftables"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_syntax() {
        let f = Flow {
            client: "10.0.0.1:40000".parse().unwrap(),
            vip: "10.0.0.100:80".parse().unwrap(),
        };
        assert_eq!(elem(&f), "10.0.0.1 . 40000 . 10.0.0.100 . 80");
    }
}
