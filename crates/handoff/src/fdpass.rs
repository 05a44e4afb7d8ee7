//! Control frames with an attached descriptor over a Unix stream socket
//! (same-host handoff: the switch passes the accepted client socket itself,
//! `SCM_RIGHTS`, together with the `Create` frame and the bytes it already
//! read).
//!
//! The descriptor of a frame always travels with the frame's first byte.
//! A Unix stream socket never merges data that carries descriptors with data
//! after it in one `recvmsg`, but it may return bytes of earlier frames in the
//! same read; received descriptors therefore wait in a FIFO and are given to
//! frames that need one ([`Message::needs_fd`]) in order. A frame that needs
//! one and finds none, or descriptors left over when a frame that needs none
//! is complete and nothing else is buffered, is a protocol error. Partial
//! reads and writes are handled; both halves are async (tokio `try_io`) and
//! can be used from different tasks.
//!
//! For control connections over TCP (across hosts), [`MsgReader`] and
//! [`MsgWriter`] speak the same frames over any `AsyncRead`/`AsyncWrite`.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use crate::error::{HandoffError, Result};
use crate::proto::{FrameBuffer, Message, ProtoError};

/// Most descriptors accepted in one `recvmsg` (more are closed and are an error).
const MAX_FDS_PER_READ: usize = 8;
/// Receive chunk.
const READ_CHUNK: usize = 64 * 1024;

/// One `sendmsg` of `data`, with `fd` attached when given. Returns the bytes
/// the kernel took (the descriptor went with them if at least one was).
pub fn send_with_fd(sock: RawFd, data: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<usize> {
    let iov = [IoSlice::new(data)];
    let raw;
    let cmsg_storage;
    let cmsgs: &[ControlMessage<'_>] = match fd {
        Some(fd) => {
            raw = [fd.as_raw_fd()];
            cmsg_storage = [ControlMessage::ScmRights(&raw)];
            &cmsg_storage
        }
        None => &[],
    };
    sendmsg::<()>(sock, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
}

/// One `recvmsg` into `buf`; received descriptors are appended to `fds`
/// (close-on-exec). Returns the bytes read (0 at end of stream).
pub fn recv_with_fds(
    sock: RawFd,
    buf: &mut [u8],
    fds: &mut VecDeque<OwnedFd>,
) -> io::Result<usize> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS_PER_READ]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    let n = msg.bytes;
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(list) = c {
            for raw in list {
                // SAFETY: the kernel just installed this descriptor for us.
                fds.push_back(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
    }
    if truncated {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control data truncated (too many descriptors in one message)",
        ));
    }
    Ok(n)
}

/// A control connection over a Unix stream socket that can carry
/// descriptors. Clone-free halves come from [`FdConn::split`].
#[derive(Debug)]
pub struct FdConn {
    io: Arc<UnixStream>,
}

impl FdConn {
    /// Wraps a connected tokio Unix stream.
    pub fn new(io: UnixStream) -> Self {
        Self { io: Arc::new(io) }
    }

    /// A connected pair (tests, or a node process started by the switch).
    pub fn pair() -> io::Result<(FdConn, FdConn)> {
        let (a, b) = UnixStream::pair()?;
        Ok((FdConn::new(a), FdConn::new(b)))
    }

    /// The receiving and sending halves; each can live in its own task. The
    /// socket closes when both are dropped.
    pub fn split(self) -> (FdReceiver, FdSender) {
        (
            FdReceiver {
                io: self.io.clone(),
                rx: FrameBuffer::new(),
                fds: VecDeque::new(),
            },
            FdSender {
                io: self.io,
                buf: Vec::with_capacity(256),
            },
        )
    }
}

/// Sending half of an [`FdConn`].
#[derive(Debug)]
pub struct FdSender {
    io: Arc<UnixStream>,
    buf: Vec<u8>,
}

impl FdSender {
    /// Sends one message; `fd` must be given exactly when
    /// [`Message::needs_fd`] is true. The descriptor is duplicated into the
    /// receiver; the caller still owns (and should close) its own.
    pub async fn send(&mut self, msg: &Message, fd: Option<BorrowedFd<'_>>) -> Result<()> {
        if msg.needs_fd() != fd.is_some() {
            return Err(ProtoError::Fd(if fd.is_some() {
                "descriptor given for a message that carries none"
            } else {
                "message needs a descriptor"
            })
            .into());
        }
        self.buf.clear();
        msg.encode(&mut self.buf)?;
        self.write_buf(fd).await
    }

    /// Sends several messages that carry no descriptor with one `sendmsg` (as far as the
    /// socket takes them).
    pub async fn send_many<'m>(
        &mut self,
        msgs: impl IntoIterator<Item = &'m Message>,
    ) -> Result<()> {
        self.buf.clear();
        let bad = encode_all(msgs, &mut self.buf, "message needs a descriptor");
        self.write_buf(None).await?;
        bad.map_or(Ok(()), |e| Err(e.into()))
    }

    async fn write_buf(&mut self, fd: Option<BorrowedFd<'_>>) -> Result<()> {
        let mut off = 0;
        let mut fd = fd;
        while off < self.buf.len() {
            self.io
                .writable()
                .await
                .map_err(|e| HandoffError::io("control socket", e))?;
            let data = &self.buf[off..];
            let r = self.io.try_io(Interest::WRITABLE, || {
                send_with_fd(self.io.as_raw_fd(), data, fd)
            });
            match r {
                Ok(n) => {
                    off += n;
                    if n > 0 {
                        fd = None;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(HandoffError::io("sendmsg on control socket", e)),
            }
        }
        Ok(())
    }
}

/// Receiving half of an [`FdConn`].
#[derive(Debug)]
pub struct FdReceiver {
    io: Arc<UnixStream>,
    rx: FrameBuffer,
    fds: VecDeque<OwnedFd>,
}

impl FdReceiver {
    /// The next message and its descriptor, or `None` at a clean end of
    /// stream (one between frames).
    pub async fn recv(&mut self) -> Result<Option<(Message, Option<OwnedFd>)>> {
        loop {
            if let Some(m) = self.rx.next_message()? {
                let fd = if m.needs_fd() {
                    Some(self.fds.pop_front().ok_or(ProtoError::Fd(
                        "frame needs a descriptor and none arrived with it",
                    ))?)
                } else {
                    None
                };
                if !m.needs_fd() && self.rx.pending() == 0 && !self.fds.is_empty() {
                    return Err(
                        ProtoError::Fd("descriptor arrived with no frame to carry it").into(),
                    );
                }
                return Ok(Some((m, fd)));
            }
            self.io
                .readable()
                .await
                .map_err(|e| HandoffError::io("control socket", e))?;
            let spare = self.rx.spare(READ_CHUNK);
            let fds = &mut self.fds;
            let io = &self.io;
            let r = io.try_io(Interest::READABLE, || {
                recv_with_fds(io.as_raw_fd(), spare, fds)
            });
            match r {
                Ok(0) => {
                    if self.rx.pending() == 0 {
                        return Ok(None);
                    }
                    return Err(ProtoError::Truncated("frame at end of stream").into());
                }
                Ok(n) => self.rx.commit(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(HandoffError::io("recvmsg on control socket", e)),
            }
        }
    }
}

/// Reads control messages from any byte stream (TCP between hosts).
#[derive(Debug)]
pub struct MsgReader<R> {
    r: R,
    rx: FrameBuffer,
}

impl<R: AsyncRead + Unpin> MsgReader<R> {
    /// Wraps a reader.
    pub fn new(r: R) -> Self {
        Self {
            r,
            rx: FrameBuffer::new(),
        }
    }

    /// The next message, or `None` at a clean end of stream. Messages that
    /// need a descriptor cannot arrive this way and are errors.
    pub async fn recv(&mut self) -> Result<Option<Message>> {
        loop {
            if let Some(m) = self.rx.next_message()? {
                if m.needs_fd() {
                    return Err(ProtoError::Fd("descriptor transfer over a byte stream").into());
                }
                return Ok(Some(m));
            }
            let spare = self.rx.spare(READ_CHUNK);
            let n = self
                .r
                .read(spare)
                .await
                .map_err(|e| HandoffError::io("read control stream", e))?;
            self.rx.commit(n);
            if n == 0 {
                if self.rx.pending() == 0 {
                    return Ok(None);
                }
                return Err(ProtoError::Truncated("frame at end of stream").into());
            }
        }
    }
}

/// Writes control messages to any byte stream.
#[derive(Debug)]
pub struct MsgWriter<W> {
    w: W,
    buf: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> MsgWriter<W> {
    /// Wraps a writer.
    pub fn new(w: W) -> Self {
        Self {
            w,
            buf: Vec::with_capacity(256),
        }
    }

    /// Sends one message (no descriptor transfers).
    pub async fn send(&mut self, m: &Message) -> Result<()> {
        self.send_many(std::slice::from_ref(m)).await
    }

    /// Sends several messages with one write (no descriptor transfers).
    pub async fn send_many<'m>(
        &mut self,
        msgs: impl IntoIterator<Item = &'m Message>,
    ) -> Result<()> {
        self.buf.clear();
        let bad = encode_all(
            msgs,
            &mut self.buf,
            "descriptor transfer over a byte stream",
        );
        self.write_buf().await?;
        bad.map_or(Ok(()), |e| Err(e.into()))
    }

    async fn write_buf(&mut self) -> Result<()> {
        self.w
            .write_all(&self.buf)
            .await
            .map_err(|e| HandoffError::io("write control stream", e))?;
        self.w
            .flush()
            .await
            .map_err(|e| HandoffError::io("flush control stream", e))
    }
}

/// Encodes every message into `buf`; one that cannot be encoded (or would need a descriptor)
/// is left out, and the first such error is returned so the caller can report it after the
/// others went out.
fn encode_all<'m>(
    msgs: impl IntoIterator<Item = &'m Message>,
    buf: &mut Vec<u8>,
    fd_error: &'static str,
) -> Option<ProtoError> {
    let mut bad = None;
    for m in msgs {
        let r = if m.needs_fd() {
            Err(ProtoError::Fd(fd_error))
        } else {
            m.encode(buf)
        };
        if let Err(e) = r {
            bad.get_or_insert(e);
        }
    }
    bad
}

/// A frame to send on a control connection, with the descriptor it carries (same-host
/// `Create` and `HandBack` only).
#[derive(Debug)]
pub struct Outgoing {
    /// The frame.
    pub msg: Message,
    /// Its descriptor, if it needs one.
    pub fd: Option<OwnedFd>,
}

impl Outgoing {
    /// A frame without a descriptor.
    pub fn plain(msg: Message) -> Self {
        Outgoing { msg, fd: None }
    }
}

/// A frame a batch left out because it cannot be encoded (a field over its bound, or a
/// descriptor where none can travel); the frames around it were sent.
#[derive(Debug)]
pub struct Unsent {
    /// The connection the frame was about.
    pub id: Option<u64>,
    /// Why.
    pub error: ProtoError,
}

/// Most frames written with one system call.
pub const MAX_BATCH: usize = 64;

/// The receiving half of a control connection: descriptors and frames over a Unix socket
/// (same host) or frames alone over TCP (across hosts).
#[derive(Debug)]
pub enum ControlReader {
    /// Same host.
    Unix(FdReceiver),
    /// Across hosts.
    Tcp(MsgReader<tokio::net::tcp::OwnedReadHalf>),
}

impl ControlReader {
    /// Whether the next frame is already read (so [`ControlReader::recv`] returns at once):
    /// replies to frames that arrived together can be written together.
    pub fn has_frame(&self) -> bool {
        match self {
            ControlReader::Unix(r) => r.rx.has_frame(),
            ControlReader::Tcp(r) => r.rx.has_frame(),
        }
    }

    /// The next frame and its descriptor; `None` at a clean end of stream.
    pub async fn recv(&mut self) -> Result<Option<(Message, Option<OwnedFd>)>> {
        match self {
            ControlReader::Unix(r) => r.recv().await,
            ControlReader::Tcp(r) => Ok(r.recv().await?.map(|m| (m, None))),
        }
    }
}

/// The sending half of a control connection.
#[derive(Debug)]
pub enum ControlWriter {
    /// Same host.
    Unix(FdSender),
    /// Across hosts.
    Tcp(MsgWriter<tokio::net::tcp::OwnedWriteHalf>),
}

/// Both halves of a control connection over a Unix stream socket.
pub fn control_unix(s: UnixStream) -> (ControlReader, ControlWriter) {
    let (r, w) = FdConn::new(s).split();
    (ControlReader::Unix(r), ControlWriter::Unix(w))
}

/// Both halves of a control connection over TCP (Nagle off: frames are small and answered).
pub fn control_tcp(s: tokio::net::TcpStream) -> (ControlReader, ControlWriter) {
    let _ = s.set_nodelay(true);
    let (r, w) = s.into_split();
    (
        ControlReader::Tcp(MsgReader::new(r)),
        ControlWriter::Tcp(MsgWriter::new(w)),
    )
}

/// Takes the frames queued behind `first` into `batch`, up to [`MAX_BATCH`]; a frame that
/// carries a descriptor ends the batch (it travels last, on its own). Clear `batch` once it is
/// sent: a descriptor in it stays open until then.
pub fn next_batch(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Outgoing>,
    first: Outgoing,
    batch: &mut Vec<Outgoing>,
) {
    batch.clear();
    batch.push(first);
    while batch.len() < MAX_BATCH && batch[batch.len() - 1].fd.is_none() {
        match rx.try_recv() {
            Ok(o) => batch.push(o),
            Err(_) => break,
        }
    }
}

impl ControlWriter {
    /// Sends `batch` in order: the frames without a descriptor with one write, a frame with a
    /// descriptor (only ever the last one, see [`next_batch`]) on its own. Frames that cannot
    /// be encoded are left out and returned; an I/O error ends the connection.
    pub async fn send_batch(&mut self, batch: &[Outgoing]) -> Result<Vec<Unsent>> {
        let (plain, with_fd) = match batch.last() {
            Some(o) if o.fd.is_some() => (&batch[..batch.len() - 1], Some(o)),
            _ => (batch, None),
        };
        let mut unsent = Vec::new();
        let mut report = |m: &Message, r: Result<()>| -> Result<()> {
            match r {
                Err(HandoffError::Proto(error)) => {
                    unsent.push(Unsent { id: m.id(), error });
                    Ok(())
                }
                other => other,
            }
        };
        if !plain.is_empty() {
            let buf = match self {
                ControlWriter::Unix(w) => &mut w.buf,
                ControlWriter::Tcp(w) => &mut w.buf,
            };
            buf.clear();
            // Encode one by one so that a bad frame is known by its id.
            for o in plain {
                let r = if o.msg.needs_fd() {
                    Err(ProtoError::Fd("message needs a descriptor").into())
                } else {
                    o.msg.encode(buf).map_err(HandoffError::from)
                };
                report(&o.msg, r)?;
            }
            match self {
                ControlWriter::Unix(w) => w.write_buf(None).await?,
                ControlWriter::Tcp(w) => w.write_buf().await?,
            }
        }
        if let Some(o) = with_fd {
            let r = match self {
                ControlWriter::Unix(w) => w.send(&o.msg, o.fd.as_ref().map(|f| f.as_fd())).await,
                ControlWriter::Tcp(w) => w.send(&o.msg).await,
            };
            report(&o.msg, r)?;
        }
        Ok(unsent)
    }
}

/// The sending half of a control connection written to directly by the task that has a frame
/// to send, without a writer task in between: [`ControlSink::send`] encodes the frame behind
/// whatever still waits and writes as much as the socket takes at once, without waiting. What
/// the socket does not take waits in the sink (frames queued meanwhile join it, so a backlog is
/// written with one system call); [`ControlSink::try_flush`] writes it later, once
/// [`SinkReady::writable`] says the socket has room.
///
/// A frame's descriptor travels with the frame's first byte: a write that would start at a
/// frame carrying a descriptor attaches it, and a write never runs on into the next frame that
/// carries one.
#[derive(Debug)]
pub struct ControlSink {
    io: SinkIo,
    /// Bytes not written yet start at `off`.
    buf: Vec<u8>,
    off: usize,
    /// Frames that carry a descriptor: where they start in `buf`, in order.
    fds: VecDeque<(usize, OwnedFd)>,
}

#[derive(Debug, Clone)]
enum SinkIo {
    Unix(Arc<UnixStream>),
    Tcp(Arc<tokio::net::tcp::OwnedWriteHalf>),
}

/// Waits until a [`ControlSink`]'s socket has room, without holding the sink.
#[derive(Debug, Clone)]
pub struct SinkReady(SinkIo);

impl SinkReady {
    /// Resolves once the socket may take more bytes.
    pub async fn writable(&self) -> Result<()> {
        match &self.0 {
            SinkIo::Unix(s) => s.writable().await,
            SinkIo::Tcp(s) => s.writable().await,
        }
        .map_err(|e| HandoffError::io("control socket", e))
    }
}

impl ControlSink {
    /// Takes over the sending half of a control connection.
    pub fn new(w: ControlWriter) -> Self {
        let io = match w {
            ControlWriter::Unix(w) => SinkIo::Unix(w.io),
            ControlWriter::Tcp(w) => SinkIo::Tcp(Arc::new(w.w)),
        };
        ControlSink {
            io,
            buf: Vec::with_capacity(512),
            off: 0,
            fds: VecDeque::new(),
        }
    }

    /// A handle to wait for room on the socket.
    pub fn ready(&self) -> SinkReady {
        SinkReady(self.io.clone())
    }

    /// Whether every byte sent so far has been written to the socket.
    pub fn is_flushed(&self) -> bool {
        self.off == self.buf.len()
    }

    /// Sends `msg` with `fd` (given exactly when [`Message::needs_fd`]; over TCP none can
    /// travel), writing what the socket takes now. `Ok(true)`: all written; `Ok(false)`: some
    /// waits for [`ControlSink::try_flush`]. A frame that cannot be encoded is an error and
    /// leaves nothing behind; an I/O error ends the connection (any part of what waited may
    /// have been written).
    pub fn send(&mut self, msg: &Message, fd: Option<OwnedFd>) -> Result<bool> {
        self.queue(msg, fd)?;
        self.try_flush()
    }

    /// Adds `msg` with `fd` behind what waits, without writing (a later
    /// [`ControlSink::send`] or [`ControlSink::try_flush`] writes them together). The same
    /// rules and errors as for [`ControlSink::send`].
    pub fn queue(&mut self, msg: &Message, fd: Option<OwnedFd>) -> Result<()> {
        let tcp = matches!(self.io, SinkIo::Tcp(_));
        if msg.needs_fd() != fd.is_some() || (tcp && fd.is_some()) {
            return Err(ProtoError::Fd(if tcp {
                "descriptor transfer over a byte stream"
            } else if fd.is_some() {
                "descriptor given for a message that carries none"
            } else {
                "message needs a descriptor"
            })
            .into());
        }
        if self.is_flushed() {
            self.buf.clear();
            self.off = 0;
        }
        let start = self.buf.len();
        msg.encode(&mut self.buf)?;
        if let Some(fd) = fd {
            self.fds.push_back((start, fd));
        }
        Ok(())
    }

    /// Writes what waits, as far as the socket takes it now: `Ok(true)` when nothing waits any
    /// more.
    pub fn try_flush(&mut self) -> Result<bool> {
        while self.off < self.buf.len() {
            let attach = matches!(self.fds.front(), Some((at, _)) if *at == self.off);
            // Up to the next frame that carries a descriptor (after this one's).
            let end = self
                .fds
                .iter()
                .map(|(at, _)| *at)
                .find(|&at| at > self.off)
                .unwrap_or(self.buf.len());
            let data = &self.buf[self.off..end];
            let r = match &self.io {
                SinkIo::Unix(s) => {
                    let fd = if attach {
                        self.fds.front().map(|(_, f)| f.as_fd())
                    } else {
                        None
                    };
                    s.try_io(Interest::WRITABLE, || send_with_fd(s.as_raw_fd(), data, fd))
                }
                SinkIo::Tcp(s) => s.try_write(data),
            };
            match r {
                Ok(0) => {
                    return Err(HandoffError::io(
                        "write control stream",
                        io::ErrorKind::WriteZero.into(),
                    ))
                }
                Ok(n) => {
                    if attach {
                        // The descriptor went with the first byte; the copy here closes now.
                        self.fds.pop_front();
                    }
                    self.off += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(HandoffError::io("write control stream", e)),
            }
        }
        self.buf.clear();
        self.off = 0;
        Ok(true)
    }
}
