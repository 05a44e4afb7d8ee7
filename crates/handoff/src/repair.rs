//! Moving an established TCP connection between hosts with `TCP_REPAIR`.
//!
//! [`dump`] runs on the side that gives the connection away (the switch, or a
//! node handing it back), [`restore`] on the side that takes it. The order of
//! the calls is the one that was found to work on this kernel
//! (`shared/notes/tcp-handoff.md`):
//!
//! * dump: the steering entry for the 4-tuple is installed by the caller
//!   *before* [`dump`]; then a socket filter that drops every arriving
//!   segment (a socket in repair mode would still acknowledge data the dump
//!   no longer sees), `TCP_REPAIR = 1`, `TCP_INFO` (state, options, window
//!   scales and whether the send queue is empty: see `Info::parse`),
//!   `SIOCOUTQ` and `SIOCOUTQNSD` only when the send queue holds bytes,
//!   `TCP_MAXSEG` (the peer's MSS in repair mode), `TCP_TIMESTAMP` only when
//!   timestamps are on,
//!   `TCP_REPAIR_WINDOW`, then per queue (send, then receive)
//!   `TCP_REPAIR_QUEUE`, `TCP_QUEUE_SEQ` and the bytes with `MSG_PEEK` (the
//!   receive queue's length, `SIOCINQ`, only when a first peek fills a small
//!   buffer: it is almost always empty). Closing
//!   the socket while it is still in repair mode sends neither FIN nor RST.
//! * restore: `socket` → `SO_REUSEADDR` → `TCP_REPAIR = 1` → `TCP_MAXSEG`
//!   (before `connect`, else the socket keeps the 536-byte default) → `bind`
//!   (VIP:port) → send-queue sequence = `snd_seq − outq` → receive-queue
//!   sequence = `rcv_seq − inq` → `connect` (sends nothing) →
//!   `TCP_REPAIR_OPTIONS` → `TCP_TIMESTAMP` → refill the queues →
//!   `TCP_REPAIR_WINDOW` (only after the refill, else `EINVAL`) →
//!   `TCP_REPAIR = 0` (the kernel sends a window probe) → `SO_REUSEADDR` again
//!   (leaving repair mode clears it, and a later restore of the same VIP:port
//!   while this one sits in TIME_WAIT would fail with `EADDRINUSE`).
//!
//! One deviation from the notes' order: `SO_REUSEADDR` is set *before*
//! `TCP_REPAIR = 1`. Entering repair mode forces address reuse for the
//! socket; setting `SO_REUSEADDR` afterwards lowers that to ordinary reuse,
//! and `bind(VIP:port)` then fails with `EADDRINUSE` next to a node's
//! wildcard listener on the same port (a real node listens on 0.0.0.0:80).
//!
//! Timestamps stay monotone for the client (seed 004 §4.4): the restored
//! socket's clock is set with `TCP_TIMESTAMP` to the dumped value plus one, so
//! the kernel keeps the offset δ of seed 004's equations (2)–(4) for us.
//! The peer's last timestamp (TSecr) is not restorable; the first window probe
//! echoes 0, which clients accept.
//!
//! Every call needs CAP_NET_ADMIN; without it [`dump`] and [`restore`] return
//! [`HandoffError::NoPrivilege`] and the caller relays instead.

use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::error::{HandoffError, Result};

const TCP_MAXSEG: libc::c_int = 2;
const TCP_INFO: libc::c_int = 11;
const TCP_REPAIR: libc::c_int = 19;
const TCP_REPAIR_QUEUE: libc::c_int = 20;
const TCP_QUEUE_SEQ: libc::c_int = 21;
const TCP_REPAIR_OPTIONS: libc::c_int = 22;
const TCP_TIMESTAMP: libc::c_int = 24;
const TCP_REPAIR_WINDOW: libc::c_int = 29;

const TCP_REPAIR_OFF_NO_WP: libc::c_int = -1;
const TCP_RECV_QUEUE: libc::c_int = 1;
const TCP_SEND_QUEUE: libc::c_int = 2;

const TCPOPT_MSS: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;

const SIOCINQ: libc::c_ulong = 0x541B;
const SIOCOUTQ: libc::c_ulong = 0x5411;
const SIOCOUTQNSD: libc::c_ulong = 0x894B;

const TCP_ESTABLISHED: u8 = 1;

/// `tcpi_options` bit: timestamps negotiated.
pub const OPT_TIMESTAMPS: u8 = 1;
/// `tcpi_options` bit: SACK permitted.
pub const OPT_SACK: u8 = 2;
/// `tcpi_options` bit: window scaling negotiated.
pub const OPT_WSCALE: u8 = 4;

/// `struct tcp_repair_window`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RepairWindow {
    /// Sequence of the segment that last updated the send window.
    pub snd_wl1: u32,
    /// Send window.
    pub snd_wnd: u32,
    /// Largest window the peer ever offered.
    pub max_window: u32,
    /// Receive window.
    pub rcv_wnd: u32,
    /// `rcv_nxt` when the receive window was last advertised.
    pub rcv_wup: u32,
}

/// The state of an established TCP connection, as dumped by [`dump`] and
/// carried in [`crate::proto::Message::Create`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairState {
    /// Sequence number after the last byte queued for sending (`write_seq`).
    pub snd_seq: u32,
    /// Sequence number after the last byte received (`rcv_nxt`).
    pub rcv_seq: u32,
    /// The peer's MSS.
    pub mss: u32,
    /// Our send window scale.
    pub snd_wscale: u8,
    /// Our receive window scale.
    pub rcv_wscale: u8,
    /// Negotiated options: [`OPT_TIMESTAMPS`], [`OPT_SACK`], [`OPT_WSCALE`].
    pub options: u8,
    /// The socket's TCP timestamp clock when dumped.
    pub timestamp: u32,
    /// Window state.
    pub window: RepairWindow,
    /// Bytes sent but not acknowledged, then bytes not yet sent.
    pub send_queue: Vec<u8>,
    /// How many bytes at the end of `send_queue` were never sent.
    pub send_unsent: u32,
    /// Bytes received and not yet read by the application.
    pub recv_queue: Vec<u8>,
}

impl RepairState {
    /// Puts `bytes` back in front of the receive queue: the application had
    /// read them last, just before the dump, and the taker should read them
    /// again from the socket.
    pub fn unread(&mut self, bytes: &[u8]) {
        let mut q = Vec::with_capacity(bytes.len() + self.recv_queue.len());
        q.extend_from_slice(bytes);
        q.extend_from_slice(&self.recv_queue);
        self.recv_queue = q;
    }
}

fn setsockopt_raw<T>(fd: RawFd, level: libc::c_int, opt: libc::c_int, val: &T) -> io::Result<()> {
    // SAFETY: `val` points to a live T of the given size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            val as *const T as *const libc::c_void,
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn setsockopt_bytes(fd: RawFd, level: libc::c_int, opt: libc::c_int, val: &[u8]) -> io::Result<()> {
    // SAFETY: the slice is valid for its length.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            val.as_ptr() as *const libc::c_void,
            val.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt_raw<T: Default>(fd: RawFd, level: libc::c_int, opt: libc::c_int) -> io::Result<T> {
    let mut v = T::default();
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` is a valid buffer of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            opt,
            &mut v as *mut T as *mut libc::c_void,
            &mut len,
        )
    };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    setsockopt_raw(fd, level, opt, &v)
}

fn ioctl_int(fd: RawFd, req: libc::c_ulong) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: these ioctls write one int.
    let r = unsafe { libc::ioctl(fd, req as _, &mut v) };
    if r == 0 {
        Ok(v as u32)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn step<T>(what: &'static str, r: io::Result<T>) -> Result<T> {
    r.map_err(|e| HandoffError::io(what, e))
}

/// Switches repair mode on or off on a TCP socket.
pub fn set_repair(fd: BorrowedFd<'_>, on: bool) -> Result<()> {
    step(
        "setsockopt(TCP_REPAIR)",
        set_int(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            TCP_REPAIR,
            on as libc::c_int,
        ),
    )
}

/// Checks that this process may use `TCP_REPAIR` (CAP_NET_ADMIN in its
/// network namespace). Cheap: one throw-away socket.
pub fn check_capability() -> Result<()> {
    let fd = new_socket(libc::AF_INET)?;
    set_repair(fd.as_fd(), true)
}

fn new_socket(family: libc::c_int) -> Result<OwnedFd> {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(HandoffError::last_os("socket"));
    }
    // SAFETY: fd is a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Bytes the peer has not acknowledged yet (`SIOCOUTQ`).
pub fn unacked(fd: BorrowedFd<'_>) -> io::Result<u32> {
    ioctl_int(fd.as_raw_fd(), SIOCOUTQ)
}

/// Bytes queued on `fd` and not yet sent (`SIOCOUTQNSD`).
pub fn unsent(fd: BorrowedFd<'_>) -> io::Result<u32> {
    ioctl_int(fd.as_raw_fd(), SIOCOUTQNSD)
}

/// Waits (polling every 200 µs) until everything sent on `fd` is
/// acknowledged, as multiple handoff requires before a node hands a
/// connection on (seed 003 §7.2). Returns false on timeout.
pub fn wait_acked(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    // Why a bounded poll: the kernel has no readiness event for "the send
    // queue is fully acknowledged" on a socket whose data is already written.
    // POLLOUT/EPOLLOUT fire on free send-buffer space (or, with
    // TCP_NOTSENT_LOWAT, on *unsent* bytes), not on unacknowledged ones;
    // SO_SNDLOWAT cannot be set on Linux; acknowledgement notices
    // (SO_TIMESTAMPING with SOF_TIMESTAMPING_TX_ACK, MSG_ZEROCOPY completions)
    // only cover data sent after they were enabled, by the writer itself.
    // So the queue is read with SIOCOUTQ until it is empty; the ACK comes
    // about one round trip after the last write (tens of microseconds on a
    // LAN), so a 200 µs step adds little, and `timeout` bounds the wait.
    let deadline = Instant::now() + timeout;
    loop {
        if unacked(fd)? == 0 {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Selects `queue`, reads its sequence number and peeks its bytes. `len`
/// is the queue's length when known; `None` peeks into a small buffer first
/// and asks the kernel for the length only when that buffer fills up (the
/// receive queue is almost always empty: the switch has read the request).
fn peek_queue(
    fd: RawFd,
    queue: libc::c_int,
    len: Option<usize>,
    what: &'static str,
) -> Result<(u32, Vec<u8>)> {
    step(
        "setsockopt(TCP_REPAIR_QUEUE)",
        set_int(fd, libc::IPPROTO_TCP, TCP_REPAIR_QUEUE, queue),
    )?;
    let seq: u32 = step(
        "getsockopt(TCP_QUEUE_SEQ)",
        getsockopt_raw(fd, libc::IPPROTO_TCP, TCP_QUEUE_SEQ),
    )?;
    let peek = |buf: &mut [u8]| -> Result<usize> {
        // SAFETY: buf is valid for its length.
        let n = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(0);
            }
            return Err(HandoffError::io(what, e));
        }
        Ok(n as usize)
    };
    const PROBE: usize = 2048;
    let exact = match len {
        Some(0) => return Ok((seq, Vec::new())),
        Some(n) => n,
        None => {
            // On the stack: the queue is usually empty (the switch read the request).
            let mut probe = [0u8; PROBE];
            let n = peek(&mut probe)?;
            if n < PROBE {
                return Ok((seq, probe[..n].to_vec()));
            }
            let n = step("ioctl(SIOCINQ)", ioctl_int(fd, SIOCINQ))? as usize;
            if n > crate::proto::MAX_QUEUE {
                return Err(HandoffError::NotMovable(format!(
                    "receive queue of {n} bytes too large to move"
                )));
            }
            n
        }
    };
    let mut buf = vec![0u8; exact];
    let n = peek(&mut buf)?;
    if n != exact {
        return Err(HandoffError::NotMovable(format!(
            "{what}: peeked {n} of {exact} bytes"
        )));
    }
    Ok((seq, buf))
}

/// Dumps an established connection (switch side, or a node handing it back).
///
/// The caller must already have installed the steering entry that sends the
/// client's packets to the taker, so that nothing reaches this socket while
/// it is being dumped; and whatever still arrives from the start of the dump
/// on is dropped unacknowledged (see `deafen`), for the peer to retransmit
/// to the taker. On success the socket is left deaf and in repair mode: drop it
/// (closing it sends nothing) once the taker has accepted, or call
/// [`leave_repair`] to serve it here after all. On error repair mode is left
/// again (best effort) and the socket is usable as before.
pub fn dump(fd: BorrowedFd<'_>) -> Result<RepairState> {
    deafen(fd)?;
    if let Err(e) = set_repair(fd, true) {
        let _ = undeafen(fd);
        return Err(e);
    }
    let r = dump_in_repair(fd.as_raw_fd());
    if r.is_err() {
        let _ = leave_repair(fd);
    }
    r
}

/// Leaves repair mode after a [`dump`] whose connection stays here after
/// all (the taker refused): the socket hears its peer again and works as
/// before (segments dropped meanwhile are retransmitted by the peer).
pub fn leave_repair(fd: BorrowedFd<'_>) -> Result<()> {
    let _ = set_int(fd.as_raw_fd(), libc::IPPROTO_TCP, TCP_REPAIR_QUEUE, 0);
    set_repair(fd, false)?;
    undeafen(fd)
}

/// Makes the socket drop every segment that arrives from now on, before TCP
/// sees it (a socket filter that accepts nothing: the kernel runs
/// it in `tcp_v4_rcv`/`tcp_v6_rcv` ahead of ACK and data processing).
///
/// A socket in repair mode still takes in what arrives: it queues the data
/// and *acknowledges* it, although the dump has already been read and the
/// socket is about to be closed. The client then counts those bytes as
/// delivered and never sends them again, and the taker never gets them (a
/// request lost: the connection stalls). Deaf, the socket leaves such
/// segments unacknowledged and the peer retransmits them to the taker. The
/// switch's steering entry keeps packets from its socket during its dump,
/// but a node handing a connection back dumps while the flow still points at
/// it, and segments already past the switch's hook can land on either.
///
/// The filter is one eBPF program that drops everything, loaded once per
/// process ([`drop_all_program`]) and attached by descriptor: attaching a
/// classic filter (`SO_ATTACH_FILTER`) makes the kernel allocate, translate and
/// JIT-compile a new program for every socket, which cost an eighth of the
/// switch's CPU per handoff. Where no eBPF program can be loaded the classic
/// filter is attached instead.
fn deafen(fd: BorrowedFd<'_>) -> Result<()> {
    if let Some(prog) = drop_all_program() {
        let prog: libc::c_int = prog.as_raw_fd();
        match setsockopt_raw(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ATTACH_BPF, &prog) {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::debug!(error = %e, "SO_ATTACH_BPF failed; attaching a classic filter")
            }
        }
    }
    deafen_classic(fd)
}

/// The eBPF socket filter that drops every packet (`r0 = 0; exit`: keep 0
/// bytes), loaded on first use and kept for the life of the process; `None`
/// when the kernel refuses to load it (no `CAP_BPF` and unprivileged BPF off).
fn drop_all_program() -> Option<BorrowedFd<'static>> {
    static PROGRAM: std::sync::OnceLock<Option<OwnedFd>> = std::sync::OnceLock::new();
    PROGRAM
        .get_or_init(|| match load_drop_all() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::debug!(error = %e, "cannot load the eBPF drop filter; classic filters instead");
                None
            }
        })
        .as_ref()
        .map(|fd| fd.as_fd())
}

/// `BPF_PROG_LOAD` of a `BPF_PROG_TYPE_SOCKET_FILTER` program returning 0.
fn load_drop_all() -> io::Result<OwnedFd> {
    /// The head of `union bpf_attr` for `BPF_PROG_LOAD`, up to `prog_name`.
    #[repr(C)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
    }
    const BPF_PROG_LOAD: libc::c_int = 5;
    const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
    // struct bpf_insn { u8 code; u8 dst:4, src:4; s16 off; s32 imm }, little-endian bit fields.
    // BPF_ALU64 | BPF_MOV | BPF_K (0xb7), r0, imm 0; then BPF_JMP | BPF_EXIT (0x95).
    let insns: [u64; 2] = [0xb7, 0x95];
    let license = b"GPL\0";
    let mut name = [0u8; 16];
    name[..8].copy_from_slice(b"sy_deaf\0");
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_SOCKET_FILTER,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
    };
    // SAFETY: `attr` is a valid, zero-padded prefix of `bpf_attr` for BPF_PROG_LOAD whose
    // pointers stay live for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &mut attr as *mut ProgLoad as *mut libc::c_void,
            size_of::<ProgLoad>() as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// [`deafen`] with a classic BPF filter of its own.
fn deafen_classic(fd: BorrowedFd<'_>) -> Result<()> {
    // One instruction: BPF_RET | BPF_K with k = 0, "keep 0 bytes": drop.
    let mut drop_all = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let prog = libc::sock_fprog {
        len: drop_all.len() as u16,
        filter: drop_all.as_mut_ptr(),
    };
    step(
        "setsockopt(SO_ATTACH_FILTER)",
        setsockopt_raw(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &prog,
        ),
    )
}

/// Removes the filter of [`deafen`] (`SO_DETACH_FILTER` detaches either kind).
fn undeafen(fd: BorrowedFd<'_>) -> Result<()> {
    let none: libc::c_int = 0;
    match setsockopt_raw(
        fd.as_raw_fd(),
        libc::SOL_SOCKET,
        libc::SO_DETACH_FILTER,
        &none,
    ) {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
            Err(HandoffError::io("setsockopt(SO_DETACH_FILTER)", e))
        }
        _ => Ok(()),
    }
}

/// What a dump takes from `TCP_INFO` (`struct tcp_info`, `linux/tcp.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Info {
    state: u8,
    options: u8,
    snd_wscale: u8,
    rcv_wscale: u8,
    /// `Some(true)` when `TCP_INFO` shows the send queue empty (nothing in flight and nothing
    /// unsent), `Some(false)` when it holds bytes, `None` when the kernel's `tcp_info` is too
    /// short to tell (then `SIOCOUTQ` decides).
    send_queue_empty: Option<bool>,
}

/// Length of `struct tcp_info` up to and including `tcpi_notsent_bytes` (Linux 4.6).
const INFO_NOTSENT_END: usize = 148;

impl Info {
    /// Reads the fields a dump needs from the first `len` bytes of a `tcp_info`.
    ///
    /// The MSS is not taken from here: `tcpi_snd_mss` is the current segment size, which the
    /// kernel also bounds by half the largest window the peer offered (on loopback half of the
    /// clamp), so it can be below the clamp `TCP_MAXSEG` answers in repair mode, and a restored
    /// socket would keep the smaller size for good.
    ///
    /// The send queue: `tcpi_unacked` counts segments sent and not acknowledged and
    /// `tcpi_notsent_bytes` the bytes written but not sent; both zero means `SIOCOUTQ` would
    /// say 0, and the common dump (the switch has sent nothing on the connection) needs no
    /// `ioctl` for it.
    fn parse(info: &[u8], len: usize) -> Option<Info> {
        let len = len.min(info.len());
        if len < 8 {
            return None;
        }
        let u32_at =
            |o: usize| u32::from_ne_bytes([info[o], info[o + 1], info[o + 2], info[o + 3]]);
        let options = info[5] & (OPT_TIMESTAMPS | OPT_SACK | OPT_WSCALE);
        let (snd_wscale, rcv_wscale) = if options & OPT_WSCALE != 0 {
            (info[6] & 0x0f, info[6] >> 4)
        } else {
            (0, 0)
        };
        let send_queue_empty =
            (len >= INFO_NOTSENT_END).then(|| u32_at(24) == 0 && u32_at(INFO_NOTSENT_END - 4) == 0);
        Some(Info {
            state: info[0],
            options,
            snd_wscale,
            rcv_wscale,
            send_queue_empty,
        })
    }
}

/// The socket's `TCP_INFO`.
fn tcp_info(fd: RawFd) -> Result<Info> {
    let mut raw = [0u8; 256];
    let mut len = raw.len() as libc::socklen_t;
    // SAFETY: raw is valid for len bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            TCP_INFO,
            raw.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(HandoffError::last_os("getsockopt(TCP_INFO)"));
    }
    Info::parse(&raw, len as usize)
        .ok_or_else(|| HandoffError::NotMovable(format!("TCP_INFO of {len} bytes is too short")))
}

fn dump_in_repair(fd: RawFd) -> Result<RepairState> {
    let info = tcp_info(fd)?;
    if info.state != TCP_ESTABLISHED {
        return Err(HandoffError::NotMovable(format!(
            "TCP state {} is not ESTABLISHED",
            info.state
        )));
    }
    let Info {
        options,
        snd_wscale,
        rcv_wscale,
        ..
    } = info;
    let outq = match info.send_queue_empty {
        Some(true) => 0,
        _ => step("ioctl(SIOCOUTQ)", ioctl_int(fd, SIOCOUTQ))? as usize,
    };
    if outq > crate::proto::MAX_QUEUE {
        return Err(HandoffError::NotMovable(format!(
            "send queue of {outq} bytes too large to move"
        )));
    }
    let notsent = if outq > 0 {
        step("ioctl(SIOCOUTQNSD)", ioctl_int(fd, SIOCOUTQNSD))?
    } else {
        0
    };
    let mss: libc::c_int = step(
        "getsockopt(TCP_MAXSEG)",
        getsockopt_raw(fd, libc::IPPROTO_TCP, TCP_MAXSEG),
    )?;
    let mss = mss.max(0) as u32;
    // The restore sets the clock only when timestamps are on.
    let timestamp: u32 = if options & OPT_TIMESTAMPS != 0 {
        step(
            "getsockopt(TCP_TIMESTAMP)",
            getsockopt_raw(fd, libc::IPPROTO_TCP, TCP_TIMESTAMP),
        )?
    } else {
        0
    };
    let window: RepairWindow = step(
        "getsockopt(TCP_REPAIR_WINDOW)",
        getsockopt_raw(fd, libc::IPPROTO_TCP, TCP_REPAIR_WINDOW),
    )?;
    let (snd_seq, send_queue) = peek_queue(fd, TCP_SEND_QUEUE, Some(outq), "peek send queue")?;
    let (rcv_seq, recv_queue) = peek_queue(fd, TCP_RECV_QUEUE, None, "peek receive queue")?;
    Ok(RepairState {
        snd_seq,
        rcv_seq,
        mss,
        snd_wscale,
        rcv_wscale,
        options,
        timestamp,
        window,
        send_unsent: notsent.min(outq as u32),
        send_queue,
        recv_queue,
    })
}

fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn send_all_repair(fd: RawFd, mut data: &[u8], what: &'static str) -> Result<()> {
    while !data.is_empty() {
        // The kernel copies a receive-queue refill into one buffer: keep each
        // call within a modest size.
        let chunk = data.len().min(256 * 1024);
        // SAFETY: data is valid for chunk bytes.
        let n = unsafe { libc::send(fd, data.as_ptr() as *const libc::c_void, chunk, 0) };
        if n < 0 {
            return Err(HandoffError::last_os(what));
        }
        if n == 0 {
            return Err(HandoffError::Other(format!("{what}: kernel took 0 bytes")));
        }
        data = &data[n as usize..];
    }
    Ok(())
}

/// Restores a dumped connection as a new socket bound to `local` (the VIP and
/// the port the client connected to) and connected to `peer` (the client).
///
/// This host must hold `local` (the VIP on `lo`, with `arp_ignore=1` and
/// `arp_announce=2`), and packets of the 4-tuple that arrive before the
/// restore completes must be dropped, not reset (see
/// [`crate::steer::NoSocketDrop`]). Returns a blocking socket, out of repair
/// mode, with `SO_REUSEADDR` set, and the bytes the dumped socket had queued
/// but not yet sent, which the caller writes before anything else.
pub fn restore(state: &RepairState, local: SocketAddr, peer: SocketAddr) -> Result<Restored> {
    restore_with(state, local, peer, RestoreOptions::default())
}

/// A restored connection.
#[derive(Debug)]
pub struct Restored {
    /// The socket: blocking, out of repair mode.
    pub fd: OwnedFd,
    /// Bytes the dumped socket had queued but never sent (a response the
    /// dumping side was still writing). They are the first bytes the caller
    /// must write. They are not written here: the client may not be reading,
    /// and a blocking write would hold whatever thread restores (an async
    /// worker, with every other connection on it) for as long as it waits.
    pub unsent: Vec<u8>,
}

/// Choices of [`restore_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreOptions {
    /// Leave repair mode with `TCP_REPAIR = 0`, which makes the kernel send
    /// a window probe at once (the notes' behaviour, and the default); with
    /// `false` it leaves with `TCP_REPAIR_OFF_NO_WP` and the first segment
    /// out is the response itself. The probe costs about 15 µs of the
    /// restore on a veth lab (the peer's receive path runs inline) and is
    /// not needed when the taker answers at once. A connection restored with
    /// bytes in its send queue always gets the probe: bytes restored as sent
    /// are in no retransmission timer's care until an acknowledgement
    /// arrives, and acknowledgements the client sent while the connection
    /// moved were dropped, so without the probe's answer the connection could
    /// wait for ever on a window it believes full.
    pub window_probe: bool,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions { window_probe: true }
    }
}

/// [`restore`] with options.
pub fn restore_with(
    state: &RepairState,
    local: SocketAddr,
    peer: SocketAddr,
    ropts: RestoreOptions,
) -> Result<Restored> {
    let family = if local.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    if local.is_ipv4() != peer.is_ipv4() {
        return Err(HandoffError::Other(
            "restore: local and peer address families differ".into(),
        ));
    }
    let sock = new_socket(family)?;
    let fd = sock.as_raw_fd();
    let tcp = libc::IPPROTO_TCP;
    // SO_REUSEADDR before TCP_REPAIR, not after: entering repair mode sets
    // the socket's reuse to "forced", and a later SO_REUSEADDR would lower it
    // to plain reuse, with which bind(VIP:port) conflicts with a node's
    // wildcard listener on the same port (EADDRINUSE).
    step(
        "setsockopt(SO_REUSEADDR)",
        set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1),
    )?;
    set_repair(sock.as_fd(), true)?;
    if state.mss > 0 {
        step(
            "setsockopt(TCP_MAXSEG)",
            set_int(fd, tcp, TCP_MAXSEG, state.mss as libc::c_int),
        )?;
    }
    let (sa, sl) = sockaddr(&local);
    // SAFETY: sa/sl describe a valid address.
    if unsafe { libc::bind(fd, &sa as *const _ as *const libc::sockaddr, sl) } != 0 {
        return Err(HandoffError::last_os(format!("bind({local})")));
    }
    let rcv_start = state.rcv_seq.wrapping_sub(state.recv_queue.len() as u32);
    let snd_start = state.snd_seq.wrapping_sub(state.send_queue.len() as u32);
    // The send queue's sequence first and the receive queue's last: the receive queue stays
    // selected for its refill below, which then needs no selection of its own.
    step(
        "setsockopt(TCP_REPAIR_QUEUE)",
        set_int(fd, tcp, TCP_REPAIR_QUEUE, TCP_SEND_QUEUE),
    )?;
    step(
        "setsockopt(TCP_QUEUE_SEQ send)",
        set_int(fd, tcp, TCP_QUEUE_SEQ, snd_start as libc::c_int),
    )?;
    step(
        "setsockopt(TCP_REPAIR_QUEUE)",
        set_int(fd, tcp, TCP_REPAIR_QUEUE, TCP_RECV_QUEUE),
    )?;
    step(
        "setsockopt(TCP_QUEUE_SEQ recv)",
        set_int(fd, tcp, TCP_QUEUE_SEQ, rcv_start as libc::c_int),
    )?;
    let (pa, pl) = sockaddr(&peer);
    // SAFETY: pa/pl describe a valid address. In repair mode connect sends nothing.
    if unsafe { libc::connect(fd, &pa as *const _ as *const libc::sockaddr, pl) } != 0 {
        return Err(HandoffError::last_os(format!(
            "connect({peer}) in repair mode"
        )));
    }
    let mut opts: Vec<u8> = Vec::with_capacity(32);
    let mut push = |code: u32, val: u32| {
        opts.extend_from_slice(&code.to_ne_bytes());
        opts.extend_from_slice(&val.to_ne_bytes());
    };
    if state.options & OPT_SACK != 0 {
        push(TCPOPT_SACK_PERM, 0);
    }
    if state.options & OPT_WSCALE != 0 {
        push(
            TCPOPT_WINDOW,
            state.snd_wscale as u32 | ((state.rcv_wscale as u32) << 16),
        );
    }
    if state.options & OPT_TIMESTAMPS != 0 {
        push(TCPOPT_TIMESTAMP, 0);
    }
    if state.mss > 0 {
        push(TCPOPT_MSS, state.mss);
    }
    step(
        "setsockopt(TCP_REPAIR_OPTIONS)",
        setsockopt_bytes(fd, tcp, TCP_REPAIR_OPTIONS, &opts),
    )?;
    if state.options & OPT_TIMESTAMPS != 0 {
        // δ = max(0, T_sw − T_se + 1) of seed 004 (2): the kernel derives the
        // offset from the value we give it, which is never below the switch's.
        let ts = state.timestamp.wrapping_add(1);
        step(
            "setsockopt(TCP_TIMESTAMP)",
            setsockopt_raw(fd, tcp, TCP_TIMESTAMP, &ts),
        )?;
    }
    if !state.recv_queue.is_empty() {
        // The receive queue is still the selected one.
        send_all_repair(fd, &state.recv_queue, "refill receive queue")?;
    }
    let unsent = (state.send_unsent as usize).min(state.send_queue.len());
    let sent_part = &state.send_queue[..state.send_queue.len() - unsent];
    if !sent_part.is_empty() {
        step(
            "setsockopt(TCP_REPAIR_QUEUE)",
            set_int(fd, tcp, TCP_REPAIR_QUEUE, TCP_SEND_QUEUE),
        )?;
        send_all_repair(fd, sent_part, "refill send queue")?;
    }
    // No selection of "no queue" before leaving repair mode: the selection matters only in
    // repair mode, and entering it again (a later dump) resets it.
    step(
        "setsockopt(TCP_REPAIR_WINDOW)",
        setsockopt_raw(fd, tcp, TCP_REPAIR_WINDOW, &state.window),
    )?;
    let off: libc::c_int = if ropts.window_probe || !state.send_queue.is_empty() {
        0
    } else {
        TCP_REPAIR_OFF_NO_WP
    };
    step(
        "setsockopt(TCP_REPAIR off)",
        set_int(fd, tcp, TCP_REPAIR, off),
    )?;
    step(
        "setsockopt(SO_REUSEADDR) after repair",
        set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1),
    )?;
    Ok(Restored {
        fd: sock,
        unsent: state.send_queue[state.send_queue.len() - unsent..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unread_prepends() {
        let mut s = RepairState {
            recv_queue: b"def".to_vec(),
            ..Default::default()
        };
        s.unread(b"abc");
        assert_eq!(s.recv_queue, b"abcdef");
    }

    /// What `SO_GET_FILTER` says of `fd`'s socket filter: `Ok(0)` none, `Ok(n)` a classic
    /// filter of `n` instructions, `Err(EACCES)` an eBPF program (it has no classic form).
    fn attached_filter(fd: RawFd) -> io::Result<libc::socklen_t> {
        let mut len: libc::socklen_t = 0;
        // SAFETY: with a length of 0 the kernel writes nothing but the length.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                std::ptr::null_mut(),
                &mut len,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(len)
        }
    }

    /// A socket is made deaf with the process's one eBPF drop program when the kernel lets
    /// the process load it (the classic filter otherwise), and hears again once undeafened:
    /// the bytes its peer sent meanwhile arrive (retransmitted).
    #[test]
    fn deafen_attaches_the_shared_program_and_undeafen_removes_it() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut server, _) = l.accept().unwrap();
        let fd = server.as_raw_fd();
        assert_eq!(attached_filter(fd).unwrap(), 0);
        deafen(server.as_fd()).unwrap();
        match drop_all_program() {
            Some(_) => {
                let e = attached_filter(fd).unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
            }
            None => assert_eq!(attached_filter(fd).unwrap(), 1),
        }
        // A second socket gets the same program, not a new one.
        let l2 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c2 = std::net::TcpStream::connect(l2.local_addr().unwrap()).unwrap();
        let (s2, _) = l2.accept().unwrap();
        let before = drop_all_program().map(|p| p.as_raw_fd());
        deafen(s2.as_fd()).unwrap();
        assert_eq!(drop_all_program().map(|p| p.as_raw_fd()), before);
        client.write_all(b"ping").unwrap();
        undeafen(server.as_fd()).unwrap();
        assert_eq!(attached_filter(fd).unwrap(), 0);
        let mut got = [0u8; 4];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
    }

    /// A `tcp_info` as the kernel fills it, with the fields a dump reads.
    fn info_bytes(
        state: u8,
        options: u8,
        wscale: u8,
        snd_mss: u32,
        unacked: u32,
        notsent: u32,
    ) -> [u8; 256] {
        let mut b = [0u8; 256];
        b[0] = state;
        b[5] = options;
        b[6] = wscale;
        b[16..20].copy_from_slice(&snd_mss.to_ne_bytes());
        b[24..28].copy_from_slice(&unacked.to_ne_bytes());
        b[144..148].copy_from_slice(&notsent.to_ne_bytes());
        b
    }

    #[test]
    fn tcp_info_gives_options_scales_and_the_send_queue() {
        let all = OPT_TIMESTAMPS | OPT_SACK | OPT_WSCALE;
        let b = info_bytes(TCP_ESTABLISHED, all | 0x10, 0x97, 1448, 0, 0);
        let i = Info::parse(&b, 232).unwrap();
        assert_eq!(i.state, TCP_ESTABLISHED);
        assert_eq!(i.options, all, "bits beyond the three carried are dropped");
        assert_eq!((i.snd_wscale, i.rcv_wscale), (7, 9));
        assert_eq!(i.send_queue_empty, Some(true));
        // Without window scaling no scales.
        let i = Info::parse(&info_bytes(1, OPT_SACK, 0x97, 1460, 0, 0), 232).unwrap();
        assert_eq!((i.snd_wscale, i.rcv_wscale), (0, 0));
        // Segments in flight or bytes not sent: the queue is not empty.
        let i = Info::parse(&info_bytes(1, all, 0, 1448, 2, 0), 232).unwrap();
        assert_eq!(i.send_queue_empty, Some(false));
        let i = Info::parse(&info_bytes(1, all, 0, 1448, 0, 100), 232).unwrap();
        assert_eq!(i.send_queue_empty, Some(false));
        // An older kernel's shorter tcp_info cannot tell.
        let i = Info::parse(&info_bytes(1, all, 0, 0, 0, 0), 104).unwrap();
        assert_eq!(i.send_queue_empty, None);
        assert_eq!(Info::parse(&b, 7), None, "too short for the options");
    }

    /// On a real connection in repair mode, `TCP_INFO` shows an idle connection's send queue
    /// empty, as `SIOCOUTQ` does.
    /// Needs CAP_NET_ADMIN; without it the test checks that the dump says so.
    #[test]
    fn tcp_info_agrees_with_siocoutq_in_repair_mode() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let fd = server.as_raw_fd();
        if check_capability().is_err() {
            assert!(dump(server.as_fd()).is_err_and(|e| e.is_no_privilege()));
            return;
        }
        set_repair(server.as_fd(), true).unwrap();
        let info = tcp_info(fd).unwrap();
        assert_eq!(info.send_queue_empty, Some(true));
        assert_eq!(unacked(server.as_fd()).unwrap(), 0);
    }

    #[test]
    fn repair_window_is_five_u32() {
        assert_eq!(size_of::<RepairWindow>(), 20);
    }

    #[test]
    fn sockaddr_encodes_port_in_network_order() {
        let (ss, len) = sockaddr(&"10.1.2.3:8080".parse().unwrap());
        assert_eq!(len as usize, size_of::<libc::sockaddr_in>());
        // SAFETY: written as sockaddr_in above.
        let sin = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in) };
        assert_eq!(u16::from_be(sin.sin_port), 8080);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 1, 2, 3]);
    }
}
