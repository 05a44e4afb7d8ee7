//! The control protocol between the switch and its nodes (seed 004 §4.3's
//! THOP, over a persistent stream instead of raw IP datagrams).
//!
//! Every message is one frame:
//!
//! ```text
//! 0      2        3        4                8
//! +------+--------+--------+----------------+----------------------+
//! | "SY" | version| opcode | body length u32| body (length bytes)  |
//! +------+--------+--------+----------------+----------------------+
//! ```
//!
//! Integers are big-endian. Byte strings are a `u32` length and the bytes,
//! strings the same in UTF-8, socket addresses a family byte (4 or 6), the
//! address, the port (and for IPv6 the flow info and scope id). The decoder is
//! strict: a wrong magic or version, an unknown opcode or tag, a length over
//! its bound, trailing bytes in a body or a malformed field are errors; it
//! never panics and never allocates more than the bounds allow.
//!
//! A `Create` or `HandBack` whose transfer is [`Transfer::Fd`] carries no
//! connection state in the frame: the descriptor itself travels alongside
//! the frame's first byte as `SCM_RIGHTS` (see [`crate::fdpass`]). Over TCP
//! only [`Transfer::Repair`] can be used.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::repair::{RepairState, RepairWindow};

/// Frame magic.
pub const MAGIC: [u8; 2] = *b"SY";
/// Protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 8;
/// Largest body accepted.
pub const MAX_BODY: usize = 20 << 20;
/// Largest pre-read request bytes in a `Create` or `HandBack`.
pub const MAX_PREREAD: usize = 1 << 20;
/// Largest send or receive queue carried in a [`RepairState`].
pub const MAX_QUEUE: usize = 8 << 20;
/// Largest string (reasons, names).
pub const MAX_STRING: usize = 1024;
/// Largest request target or host in a `Route` query.
pub const MAX_TARGET: usize = 16 * 1024;
/// Largest object body in a [`Message::Replica`].
pub const MAX_REPLICA: usize = 16 << 20;

/// Why a frame could not be decoded or encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The frame does not start with `SY`.
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 2]),
    /// A version this side does not speak.
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// An opcode nobody defined.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    /// A frame or field longer than its bound.
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLong {
        /// The field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The body ended inside a field.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// Bytes left over after the last field of a body.
    #[error("{0} trailing bytes in body")]
    Trailing(usize),
    /// A field with an impossible value.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// A message that needs a descriptor arrived without one, or the other
    /// way round, or was sent on a stream that cannot carry one.
    #[error("descriptor mismatch: {0}")]
    Fd(&'static str),
}

/// How the connection itself travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transfer {
    /// Same host: the socket's descriptor travels as `SCM_RIGHTS`.
    Fd,
    /// Across hosts: the state dumped with `TCP_REPAIR`.
    Repair(Box<RepairState>),
}

/// Why a node refused or lost a connection (notify-drop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DropReason {
    /// The node is at its connection limit.
    Busy = 1,
    /// Restoring the TCP state failed.
    RestoreFailed = 2,
    /// The node lacks CAP_NET_ADMIN.
    NoPrivilege = 3,
    /// The node is shutting down.
    ShuttingDown = 4,
    /// The connection broke after it was accepted.
    Aborted = 5,
    /// The switch cancelled the `Create` (`Cancel`) before the node answered
    /// it: the node does not serve it.
    Cancelled = 6,
    /// Anything else.
    Other = 255,
}

impl DropReason {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Busy,
            2 => Self::RestoreFailed,
            3 => Self::NoPrivilege,
            4 => Self::ShuttingDown,
            5 => Self::Aborted,
            6 => Self::Cancelled,
            255 => Self::Other,
            _ => return None,
        })
    }
}

/// Who decides, after the first request of a `Create`, how the connection's
/// further requests are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Routing {
    /// The taker serves the whole connection itself (single handoff).
    #[default]
    Own = 0,
    /// The taker asks the sender (`Route`) before serving each further
    /// request (multiple handoff, back-end forwarding).
    Ask = 1,
    /// A clone (cooperative mode, seed 000 §3.1): the taker serves exactly
    /// the first request and, once its response is written (across hosts:
    /// acknowledged), gives the connection back (`HandBack`) with whatever
    /// the client sent meanwhile. A clone never moves the connection on.
    Once = 2,
}

impl Routing {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Own,
            1 => Self::Ask,
            2 => Self::Once,
            _ => return None,
        })
    }
}

/// The switch's answer to a `Route` query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteAction {
    /// Serve the request from this node's own cache or disk.
    Serve,
    /// Back-end forwarding (seed 003 §3.3): fetch the response from the
    /// node whose HTTP listener is at this address and send it on the
    /// client connection.
    Forward(SocketAddr),
    /// Multiple handoff: once everything sent is acknowledged, give the
    /// connection back (`HandBack`) with this request unread; the switch
    /// hands it to the node that serves it.
    HandBack,
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// First message on a new control connection, both ways.
    Hello {
        /// The sender's name (a node's id, or "switch").
        name: String,
    },
    /// Switch → node: take this connection (THOP_CREATE).
    Create {
        /// Connection id chosen by the switch, echoed in every reply.
        id: u64,
        /// The client's address.
        client: SocketAddr,
        /// The address the client connected to (the VIP).
        local: SocketAddr,
        /// The connection itself.
        transfer: Transfer,
        /// Request bytes the switch already read from the socket.
        preread: Vec<u8>,
        /// Who decides how the connection's further requests are served.
        route: Routing,
    },
    /// Node → switch: the connection is restored and served.
    Accepted {
        /// Connection id.
        id: u64,
    },
    /// Node → switch: the connection could not be taken (THOP_NOTIFYDROP).
    Drop {
        /// Connection id.
        id: u64,
        /// Why.
        reason: DropReason,
        /// Human-readable detail.
        detail: String,
    },
    /// Node → switch: the connection closed (THOP_NOTIFYCLS).
    Closed {
        /// Connection id.
        id: u64,
        /// Requests served on it.
        requests: u64,
        /// Response bytes sent on it.
        bytes: u64,
    },
    /// Node → switch: the connection comes back (multiple handoff), once the
    /// node's responses are fully acknowledged.
    HandBack {
        /// Connection id.
        id: u64,
        /// The connection itself.
        transfer: Transfer,
        /// Bytes of the next request the node already read.
        preread: Vec<u8>,
        /// Requests the node served on it.
        requests: u64,
        /// Response bytes the node sent on it.
        bytes: u64,
    },
    /// Node → switch: the next request on a connection created with
    /// `route`; the node waits for the `Routed` answer before serving it.
    Route {
        /// Connection id.
        id: u64,
        /// Request number on the connection, echoed in the answer.
        seq: u64,
        /// Request method.
        method: String,
        /// Host header, if any.
        host: Option<String>,
        /// Request target.
        target: String,
    },
    /// Switch → node: how to serve the request of a `Route`.
    Routed {
        /// Connection id.
        id: u64,
        /// The `Route`'s request number.
        seq: u64,
        /// What to do.
        action: RouteAction,
    },
    /// Node → switch: a request the switch dispatched (the first one of a
    /// `Create`, and each one answered by `Routed`) has been answered; the
    /// switch's policy counts it finished.
    Served {
        /// Connection id.
        id: u64,
        /// Response status.
        status: u16,
        /// Response bytes sent.
        bytes: u64,
        /// The response's body came from the node's memory cache (a hit): the policy learns
        /// what the node holds.
        from_cache: bool,
    },
    /// Switch → node: the switch gave up waiting for the answer to the
    /// `Create` with this id. A node that has not answered it yet answers
    /// `Drop` with [`DropReason::Cancelled`] and never serves it; a node that
    /// already answered ignores it (its answer is on the way). Either way the
    /// switch learns from the one answer whether the node serves the
    /// connection (see [`crate::mover`]).
    Cancel {
        /// Connection id of the `Create`.
        id: u64,
    },
    /// Liveness probe.
    Ping {
        /// Echoed in the `Pong`.
        nonce: u64,
    },
    /// Answer to `Ping`.
    Pong {
        /// The `Ping`'s nonce.
        nonce: u64,
    },
    /// Owner → peer, cooperative mode: a copy of a hot object for the peer's replica cache
    /// (seed 000 §3.2.1), sent on the control connection the peer's `Create` came in on,
    /// before the connection's `HandBack`.
    Replica(Box<ReplicaObject>),
    /// Peer → owner, cooperative mode: the peer holds a copy of `target` whose freshness ran
    /// out, with entity tag `etag`, and moves the owner a request for it next (sent just before
    /// that `Create`). An owner that then finds its object unchanged and still hot answers
    /// [`Message::ReplicaValid`] instead of sending the object again.
    ReplicaCheck {
        /// The object's key.
        target: String,
        /// The entity tag of the peer's copy.
        etag: String,
    },
    /// Owner → peer, cooperative mode: the copy of `target` with entity tag `etag` is still the
    /// owner's object; the peer may serve it for another revalidation interval, less `age_ms`.
    /// Sent where a [`Message::Replica`] would be.
    ReplicaValid {
        /// The object's key.
        target: String,
        /// The entity tag the owner checked.
        etag: String,
        /// Copies in the cluster with the peer's.
        copies: u32,
        /// How long ago the owner last checked the object against its disk, in milliseconds.
        age_ms: u64,
    },
}

/// A hot object's copy and what a holder needs to answer for it exactly as its owner does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaObject {
    /// The object's key: its clean path beneath the document root.
    pub target: String,
    /// The entity tag the owner sends for it.
    pub etag: String,
    /// The `Last-Modified` value the owner sends for it.
    pub last_modified: String,
    /// Modification time, nanoseconds since the Unix epoch (conditional requests).
    pub mtime_ns: u64,
    /// The file's inode on the owner (part of its identity there).
    pub inode: u64,
    /// Copies in the cluster with this one: each hit on it counts as that many references.
    pub copies: u32,
    /// How long ago the owner last checked the object against its disk, in milliseconds.
    pub age_ms: u64,
    /// The object's bytes.
    pub body: Vec<u8>,
}

mod op {
    pub const HELLO: u8 = 1;
    pub const CREATE: u8 = 2;
    pub const ACCEPTED: u8 = 3;
    pub const DROP: u8 = 4;
    pub const CLOSED: u8 = 5;
    pub const HANDBACK: u8 = 6;
    // 7 was a load report; load reports travel as UDP datagrams. Not reused.
    pub const PING: u8 = 8;
    pub const PONG: u8 = 9;
    pub const ROUTE: u8 = 10;
    pub const ROUTED: u8 = 11;
    pub const SERVED: u8 = 12;
    pub const CANCEL: u8 = 13;
    pub const REPLICA: u8 = 14;
    pub const REPLICA_CHECK: u8 = 15;
    pub const REPLICA_VALID: u8 = 16;
    /// The highest opcode defined.
    pub const LAST: u8 = REPLICA_VALID;
}

const ACTION_SERVE: u8 = 1;
const ACTION_FORWARD: u8 = 2;
const ACTION_HANDBACK: u8 = 3;

const TRANSFER_FD: u8 = 1;
const TRANSFER_REPAIR: u8 = 2;

impl Message {
    fn opcode(&self) -> u8 {
        match self {
            Message::Hello { .. } => op::HELLO,
            Message::Create { .. } => op::CREATE,
            Message::Accepted { .. } => op::ACCEPTED,
            Message::Drop { .. } => op::DROP,
            Message::Closed { .. } => op::CLOSED,
            Message::HandBack { .. } => op::HANDBACK,
            Message::Ping { .. } => op::PING,
            Message::Pong { .. } => op::PONG,
            Message::Route { .. } => op::ROUTE,
            Message::Routed { .. } => op::ROUTED,
            Message::Served { .. } => op::SERVED,
            Message::Cancel { .. } => op::CANCEL,
            Message::Replica(_) => op::REPLICA,
            Message::ReplicaCheck { .. } => op::REPLICA_CHECK,
            Message::ReplicaValid { .. } => op::REPLICA_VALID,
        }
    }

    /// True when the frame must travel with exactly one descriptor.
    pub fn needs_fd(&self) -> bool {
        matches!(
            self,
            Message::Create {
                transfer: Transfer::Fd,
                ..
            } | Message::HandBack {
                transfer: Transfer::Fd,
                ..
            }
        )
    }

    /// Connection id the message is about, if any.
    pub fn id(&self) -> Option<u64> {
        match self {
            Message::Create { id, .. }
            | Message::Accepted { id }
            | Message::Drop { id, .. }
            | Message::Closed { id, .. }
            | Message::HandBack { id, .. }
            | Message::Route { id, .. }
            | Message::Routed { id, .. }
            | Message::Served { id, .. }
            | Message::Cancel { id } => Some(*id),
            _ => None,
        }
    }

    /// Appends this message's frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(self.opcode());
        out.extend_from_slice(&[0; 4]);
        let body = out.len();
        let r = self.encode_body(out);
        if let Err(e) = r {
            out.truncate(start);
            return Err(e);
        }
        let len = out.len() - body;
        if len > MAX_BODY {
            out.truncate(start);
            return Err(ProtoError::TooLong {
                what: "body",
                len,
                max: MAX_BODY,
            });
        }
        out[start + 4..start + 8].copy_from_slice(&(len as u32).to_be_bytes());
        Ok(())
    }

    /// This message's frame as a new vector.
    pub fn to_frame(&self) -> Result<Vec<u8>, ProtoError> {
        let mut v = Vec::with_capacity(64);
        self.encode(&mut v)?;
        Ok(v)
    }

    fn encode_body(&self, o: &mut Vec<u8>) -> Result<(), ProtoError> {
        match self {
            Message::Hello { name } => put_str(o, name, "name")?,
            Message::Create {
                id,
                client,
                local,
                transfer,
                preread,
                route,
            } => {
                put_u64(o, *id);
                put_addr(o, client);
                put_addr(o, local);
                put_transfer(o, transfer)?;
                put_bytes(o, preread, "preread", MAX_PREREAD)?;
                o.push(*route as u8);
            }
            Message::Accepted { id } | Message::Cancel { id } => put_u64(o, *id),
            Message::Drop { id, reason, detail } => {
                put_u64(o, *id);
                o.push(*reason as u8);
                put_str(o, detail, "detail")?;
            }
            Message::Closed {
                id,
                requests,
                bytes,
            } => {
                put_u64(o, *id);
                put_u64(o, *requests);
                put_u64(o, *bytes);
            }
            Message::HandBack {
                id,
                transfer,
                preread,
                requests,
                bytes,
            } => {
                put_u64(o, *id);
                put_transfer(o, transfer)?;
                put_bytes(o, preread, "preread", MAX_PREREAD)?;
                put_u64(o, *requests);
                put_u64(o, *bytes);
            }
            Message::Ping { nonce } | Message::Pong { nonce } => put_u64(o, *nonce),
            Message::Route {
                id,
                seq,
                method,
                host,
                target,
            } => {
                put_u64(o, *id);
                put_u64(o, *seq);
                put_str(o, method, "method")?;
                match host {
                    None => o.push(0),
                    Some(h) => {
                        o.push(1);
                        put_bytes(o, h.as_bytes(), "host", MAX_TARGET)?;
                    }
                }
                put_bytes(o, target.as_bytes(), "target", MAX_TARGET)?;
            }
            Message::Routed { id, seq, action } => {
                put_u64(o, *id);
                put_u64(o, *seq);
                match action {
                    RouteAction::Serve => o.push(ACTION_SERVE),
                    RouteAction::Forward(a) => {
                        o.push(ACTION_FORWARD);
                        put_addr(o, a);
                    }
                    RouteAction::HandBack => o.push(ACTION_HANDBACK),
                }
            }
            Message::Served {
                id,
                status,
                bytes,
                from_cache,
            } => {
                put_u64(o, *id);
                put_u16(o, *status);
                put_u64(o, *bytes);
                o.push(u8::from(*from_cache));
            }
            Message::Replica(r) => {
                put_bytes(o, r.target.as_bytes(), "target", MAX_TARGET)?;
                put_str(o, &r.etag, "etag")?;
                put_str(o, &r.last_modified, "last_modified")?;
                put_u64(o, r.mtime_ns);
                put_u64(o, r.inode);
                put_u32(o, r.copies);
                put_u64(o, r.age_ms);
                put_bytes(o, &r.body, "replica body", MAX_REPLICA)?;
            }
            Message::ReplicaCheck { target, etag } => {
                put_bytes(o, target.as_bytes(), "target", MAX_TARGET)?;
                put_str(o, etag, "etag")?;
            }
            Message::ReplicaValid {
                target,
                etag,
                copies,
                age_ms,
            } => {
                put_bytes(o, target.as_bytes(), "target", MAX_TARGET)?;
                put_str(o, etag, "etag")?;
                put_u32(o, *copies);
                put_u64(o, *age_ms);
            }
        }
        Ok(())
    }

    /// Decodes one frame from the front of `buf`.
    ///
    /// `Ok(None)`: not a whole frame yet (the header is checked as soon as it
    /// is complete, so garbage is refused without waiting for its body).
    /// `Ok(Some((message, used)))`: a message and the bytes it took.
    pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>, ProtoError> {
        let Some(len) = check_header(buf)? else {
            return Ok(None);
        };
        if buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let body = &buf[HEADER_LEN..HEADER_LEN + len];
        let mut r = Reader { b: body };
        let msg = match buf[3] {
            op::HELLO => Message::Hello {
                name: r.string("name")?,
            },
            op::CREATE => Message::Create {
                id: r.u64("id")?,
                client: r.addr()?,
                local: r.addr()?,
                transfer: r.transfer()?,
                preread: r.bytes("preread", MAX_PREREAD)?,
                route: Routing::from_u8(r.u8("route")?).ok_or(ProtoError::Invalid("route"))?,
            },
            op::ACCEPTED => Message::Accepted { id: r.u64("id")? },
            op::DROP => Message::Drop {
                id: r.u64("id")?,
                reason: DropReason::from_u8(r.u8("reason")?)
                    .ok_or(ProtoError::Invalid("drop reason"))?,
                detail: r.string("detail")?,
            },
            op::CLOSED => Message::Closed {
                id: r.u64("id")?,
                requests: r.u64("requests")?,
                bytes: r.u64("bytes")?,
            },
            op::HANDBACK => Message::HandBack {
                id: r.u64("id")?,
                transfer: r.transfer()?,
                preread: r.bytes("preread", MAX_PREREAD)?,
                requests: r.u64("requests")?,
                bytes: r.u64("bytes")?,
            },
            op::PING => Message::Ping {
                nonce: r.u64("nonce")?,
            },
            op::PONG => Message::Pong {
                nonce: r.u64("nonce")?,
            },
            op::ROUTE => Message::Route {
                id: r.u64("id")?,
                seq: r.u64("seq")?,
                method: r.string("method")?,
                host: if r.flag("host")? {
                    Some(r.text("host", MAX_TARGET)?)
                } else {
                    None
                },
                target: r.text("target", MAX_TARGET)?,
            },
            op::ROUTED => Message::Routed {
                id: r.u64("id")?,
                seq: r.u64("seq")?,
                action: match r.u8("action")? {
                    ACTION_SERVE => RouteAction::Serve,
                    ACTION_FORWARD => RouteAction::Forward(r.addr()?),
                    ACTION_HANDBACK => RouteAction::HandBack,
                    _ => return Err(ProtoError::Invalid("route action")),
                },
            },
            op::SERVED => Message::Served {
                id: r.u64("id")?,
                status: r.u16("status")?,
                bytes: r.u64("bytes")?,
                from_cache: match r.u8("from_cache")? {
                    0 => false,
                    1 => true,
                    _ => return Err(ProtoError::Invalid("from_cache")),
                },
            },
            op::CANCEL => Message::Cancel { id: r.u64("id")? },
            op::REPLICA => Message::Replica(Box::new(ReplicaObject {
                target: r.text("target", MAX_TARGET)?,
                etag: r.string("etag")?,
                last_modified: r.string("last_modified")?,
                mtime_ns: r.u64("mtime")?,
                inode: r.u64("inode")?,
                copies: r.u32("copies")?,
                age_ms: r.u64("age")?,
                body: r.bytes("replica body", MAX_REPLICA)?,
            })),
            op::REPLICA_CHECK => Message::ReplicaCheck {
                target: r.text("target", MAX_TARGET)?,
                etag: r.string("etag")?,
            },
            op::REPLICA_VALID => Message::ReplicaValid {
                target: r.text("target", MAX_TARGET)?,
                etag: r.string("etag")?,
                copies: r.u32("copies")?,
                age_ms: r.u64("age")?,
            },
            other => return Err(ProtoError::UnknownOpcode(other)),
        };
        if !r.b.is_empty() {
            return Err(ProtoError::Trailing(r.b.len()));
        }
        Ok(Some((msg, HEADER_LEN + len)))
    }
}

/// Checks a frame header: `Ok(None)` when fewer than [`HEADER_LEN`] bytes are
/// there, else the body length.
pub fn check_header(buf: &[u8]) -> Result<Option<usize>, ProtoError> {
    if buf.len() >= 2 && buf[..2] != MAGIC {
        return Err(ProtoError::BadMagic([buf[0], buf[1]]));
    }
    if buf.len() >= 3 && buf[2] != VERSION {
        return Err(ProtoError::BadVersion(buf[2]));
    }
    if buf.len() >= 4 && !(op::HELLO..=op::LAST).contains(&buf[3]) {
        return Err(ProtoError::UnknownOpcode(buf[3]));
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
    if len > MAX_BODY {
        return Err(ProtoError::TooLong {
            what: "body",
            len,
            max: MAX_BODY,
        });
    }
    Ok(Some(len))
}

/// Incremental decoder for a byte stream: feed it what arrives, take
/// messages out.
///
/// The buffer keeps its room between reads: [`FrameBuffer::spare`] zeroes
/// only room it has never had, not a whole read chunk each time.
#[derive(Debug, Default)]
pub struct FrameBuffer {
    buf: Vec<u8>,
    /// Undecoded bytes are `buf[start..end]`; `buf[end..]` is room.
    start: usize,
    end: usize,
}

impl FrameBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.spare(bytes.len())[..bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Spare room to receive into directly (at least `min` bytes); call
    /// [`FrameBuffer::commit`] with the count received.
    pub fn spare(&mut self, min: usize) -> &mut [u8] {
        self.compact();
        if self.buf.len() < self.end + min {
            self.buf.resize(self.end + min, 0);
        }
        &mut self.buf[self.end..]
    }

    /// Keeps the first `n` bytes of the last [`FrameBuffer::spare`].
    pub fn commit(&mut self, n: usize) {
        self.end += n;
    }

    /// Bytes buffered and not yet decoded.
    pub fn pending(&self) -> usize {
        self.end - self.start
    }

    /// Whether a whole frame is buffered (the next [`FrameBuffer::next_message`] returns a
    /// message or an error without more bytes).
    pub fn has_frame(&self) -> bool {
        match check_header(&self.buf[self.start..self.end]) {
            Ok(Some(len)) => self.pending() >= HEADER_LEN + len,
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// The next complete message, if any.
    pub fn next_message(&mut self) -> Result<Option<Message>, ProtoError> {
        match Message::decode(&self.buf[self.start..self.end])? {
            None => Ok(None),
            Some((m, used)) => {
                self.start += used;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                Ok(Some(m))
            }
        }
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }
}

fn put_u16(o: &mut Vec<u8>, v: u16) {
    o.extend_from_slice(&v.to_be_bytes());
}
fn put_u32(o: &mut Vec<u8>, v: u32) {
    o.extend_from_slice(&v.to_be_bytes());
}
fn put_u64(o: &mut Vec<u8>, v: u64) {
    o.extend_from_slice(&v.to_be_bytes());
}
fn put_bytes(o: &mut Vec<u8>, b: &[u8], what: &'static str, max: usize) -> Result<(), ProtoError> {
    if b.len() > max {
        return Err(ProtoError::TooLong {
            what,
            len: b.len(),
            max,
        });
    }
    put_u32(o, b.len() as u32);
    o.extend_from_slice(b);
    Ok(())
}
fn put_str(o: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), ProtoError> {
    put_bytes(o, s.as_bytes(), what, MAX_STRING)
}
fn put_addr(o: &mut Vec<u8>, a: &SocketAddr) {
    match a {
        SocketAddr::V4(a) => {
            o.push(4);
            o.extend_from_slice(&a.ip().octets());
            put_u16(o, a.port());
        }
        SocketAddr::V6(a) => {
            o.push(6);
            o.extend_from_slice(&a.ip().octets());
            put_u16(o, a.port());
            put_u32(o, a.flowinfo());
            put_u32(o, a.scope_id());
        }
    }
}
fn put_transfer(o: &mut Vec<u8>, t: &Transfer) -> Result<(), ProtoError> {
    match t {
        Transfer::Fd => o.push(TRANSFER_FD),
        Transfer::Repair(s) => {
            o.push(TRANSFER_REPAIR);
            put_repair(o, s)?;
        }
    }
    Ok(())
}
fn put_repair(o: &mut Vec<u8>, s: &RepairState) -> Result<(), ProtoError> {
    if s.send_unsent as usize > s.send_queue.len() {
        return Err(ProtoError::Invalid("unsent part longer than send queue"));
    }
    if s.snd_wscale > 14 || s.rcv_wscale > 14 {
        return Err(ProtoError::Invalid("window scale"));
    }
    if s.mss > u16::MAX as u32 {
        return Err(ProtoError::Invalid("mss"));
    }
    put_u32(o, s.snd_seq);
    put_u32(o, s.rcv_seq);
    put_u32(o, s.mss);
    o.push(s.snd_wscale);
    o.push(s.rcv_wscale);
    o.push(s.options);
    put_u32(o, s.timestamp);
    let w = &s.window;
    for v in [w.snd_wl1, w.snd_wnd, w.max_window, w.rcv_wnd, w.rcv_wup] {
        put_u32(o, v);
    }
    put_bytes(o, &s.send_queue, "send queue", MAX_QUEUE)?;
    put_u32(o, s.send_unsent);
    put_bytes(o, &s.recv_queue, "receive queue", MAX_QUEUE)?;
    Ok(())
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        if self.b.len() < n {
            return Err(ProtoError::Truncated(what));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn bytes(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>, ProtoError> {
        let len = self.u32(what)? as usize;
        if len > max {
            return Err(ProtoError::TooLong { what, len, max });
        }
        Ok(self.take(len, what)?.to_vec())
    }
    fn string(&mut self, what: &'static str) -> Result<String, ProtoError> {
        self.text(what, MAX_STRING)
    }
    fn text(&mut self, what: &'static str, max: usize) -> Result<String, ProtoError> {
        let b = self.bytes(what, max)?;
        String::from_utf8(b).map_err(|_| ProtoError::Invalid("UTF-8 string"))
    }
    /// A boolean: exactly 0 or 1 (so every decoded frame re-encodes to itself).
    fn flag(&mut self, what: &'static str) -> Result<bool, ProtoError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::Invalid(what)),
        }
    }
    fn addr(&mut self) -> Result<SocketAddr, ProtoError> {
        match self.u8("address family")? {
            4 => {
                let o = self.take(4, "IPv4 address")?;
                let ip = Ipv4Addr::new(o[0], o[1], o[2], o[3]);
                let port = self.u16("port")?;
                Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
            }
            6 => {
                let o = self.take(16, "IPv6 address")?;
                let mut a = [0u8; 16];
                a.copy_from_slice(o);
                let port = self.u16("port")?;
                let flow = self.u32("flow info")?;
                let scope = self.u32("scope id")?;
                Ok(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a),
                    port,
                    flow,
                    scope,
                )))
            }
            _ => Err(ProtoError::Invalid("address family")),
        }
    }
    fn transfer(&mut self) -> Result<Transfer, ProtoError> {
        match self.u8("transfer")? {
            TRANSFER_FD => Ok(Transfer::Fd),
            TRANSFER_REPAIR => Ok(Transfer::Repair(Box::new(self.repair()?))),
            _ => Err(ProtoError::Invalid("transfer kind")),
        }
    }
    fn repair(&mut self) -> Result<RepairState, ProtoError> {
        let snd_seq = self.u32("repair state")?;
        let rcv_seq = self.u32("repair state")?;
        let mss = self.u32("repair state")?;
        let snd_wscale = self.u8("repair state")?;
        let rcv_wscale = self.u8("repair state")?;
        let options = self.u8("repair state")?;
        let timestamp = self.u32("repair state")?;
        let window = RepairWindow {
            snd_wl1: self.u32("window")?,
            snd_wnd: self.u32("window")?,
            max_window: self.u32("window")?,
            rcv_wnd: self.u32("window")?,
            rcv_wup: self.u32("window")?,
        };
        let send_queue = self.bytes("send queue", MAX_QUEUE)?;
        let send_unsent = self.u32("send queue")?;
        if send_unsent as usize > send_queue.len() {
            return Err(ProtoError::Invalid("unsent part longer than send queue"));
        }
        let recv_queue = self.bytes("receive queue", MAX_QUEUE)?;
        if snd_wscale > 14 || rcv_wscale > 14 {
            return Err(ProtoError::Invalid("window scale"));
        }
        if mss > u16::MAX as u32 {
            return Err(ProtoError::Invalid("mss"));
        }
        Ok(RepairState {
            snd_seq,
            rcv_seq,
            mss,
            snd_wscale,
            rcv_wscale,
            options,
            timestamp,
            window,
            send_queue,
            send_unsent,
            recv_queue,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_state() -> RepairState {
        RepairState {
            snd_seq: 1000,
            rcv_seq: 2000,
            mss: 1448,
            snd_wscale: 7,
            rcv_wscale: 7,
            options: 7,
            timestamp: 123_456,
            window: RepairWindow {
                snd_wl1: 1,
                snd_wnd: 2,
                max_window: 3,
                rcv_wnd: 4,
                rcv_wup: 5,
            },
            send_queue: b"abc".to_vec(),
            send_unsent: 1,
            recv_queue: b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        }
    }

    #[test]
    fn route_messages_round_trip_and_refuse_bad_flags() {
        for m in [
            Message::Route {
                id: 3,
                seq: 2,
                method: "GET".into(),
                host: Some("example.org".into()),
                target: "/a/b?c".into(),
            },
            Message::Routed {
                id: 3,
                seq: 2,
                action: RouteAction::Forward("10.0.0.3:80".parse().unwrap()),
            },
            Message::Served {
                id: 3,
                status: 200,
                bytes: 1234,
                from_cache: true,
            },
        ] {
            let f = m.to_frame().unwrap();
            assert_eq!(Message::decode(&f).unwrap().unwrap(), (m, f.len()));
        }
        // A host flag other than 0 or 1 would not re-encode to the same bytes.
        let mut f = Message::Route {
            id: 1,
            seq: 1,
            method: "GET".into(),
            host: None,
            target: "/".into(),
        }
        .to_frame()
        .unwrap();
        let flag = HEADER_LEN + 8 + 8 + 4 + 3;
        assert_eq!(f[flag], 0);
        f[flag] = 2;
        assert_eq!(Message::decode(&f), Err(ProtoError::Invalid("host")));
        let mut f = Message::Routed {
            id: 1,
            seq: 1,
            action: RouteAction::Serve,
        }
        .to_frame()
        .unwrap();
        *f.last_mut().unwrap() = 9;
        assert_eq!(
            Message::decode(&f),
            Err(ProtoError::Invalid("route action"))
        );
    }

    #[test]
    fn replica_round_trips_and_refuses_an_oversized_body() {
        let m = Message::Replica(Box::new(ReplicaObject {
            target: "/hot/a.html".into(),
            etag: "\"1-2-3\"".into(),
            last_modified: "Tue, 24 Nov 2026 10:00:00 GMT".into(),
            mtime_ns: 1_795_000_000_123_456_789,
            inode: 99,
            copies: 3,
            age_ms: 250,
            body: vec![7; 5000],
        }));
        let f = m.to_frame().unwrap();
        assert_eq!(f[3], 14);
        assert_eq!(Message::decode(&f).unwrap().unwrap(), (m.clone(), f.len()));
        assert_eq!(m.id(), None);
        assert!(!m.needs_fd());
        for n in [0, 7, 8, 100, f.len() - 1] {
            assert_eq!(Message::decode(&f[..n]), Ok(None), "prefix {n}");
        }
        let Message::Replica(mut big) = m else {
            unreachable!()
        };
        big.body = vec![0; MAX_REPLICA + 1];
        assert!(matches!(
            Message::Replica(big).to_frame(),
            Err(ProtoError::TooLong { .. })
        ));
    }

    #[test]
    fn replica_checks_and_renewals_round_trip() {
        let check = Message::ReplicaCheck {
            target: "/hot/a.html".into(),
            etag: "\"1-2-3\"".into(),
        };
        let valid = Message::ReplicaValid {
            target: "/hot/a.html".into(),
            etag: "\"1-2-3\"".into(),
            copies: 4,
            age_ms: 120,
        };
        for (m, opcode) in [(check, 15), (valid, 16)] {
            let f = m.to_frame().unwrap();
            assert_eq!(f[3], opcode);
            assert_eq!(Message::decode(&f).unwrap().unwrap(), (m.clone(), f.len()));
            assert_eq!(m.id(), None);
            assert!(!m.needs_fd());
            for n in [0, 7, 8, f.len() - 1] {
                assert_eq!(Message::decode(&f[..n]), Ok(None), "prefix {n}");
            }
            let mut longer = f.clone();
            longer.push(0);
            let len = u32::try_from(f.len() - HEADER_LEN + 1).unwrap();
            longer[4..8].copy_from_slice(&len.to_be_bytes());
            assert_eq!(Message::decode(&longer), Err(ProtoError::Trailing(1)));
        }
    }

    #[test]
    fn create_round_trips() {
        let m = Message::Create {
            id: 7,
            client: "10.0.0.1:40000".parse().unwrap(),
            local: "[fe80::1%2]:80".parse().unwrap(),
            transfer: Transfer::Repair(Box::new(sample_state())),
            preread: b"GET /".to_vec(),
            route: Routing::Ask,
        };
        let f = m.to_frame().unwrap();
        let (d, used) = Message::decode(&f).unwrap().unwrap();
        assert_eq!(used, f.len());
        assert_eq!(d, m);
        // every proper prefix is incomplete, never an error
        for n in 0..f.len() {
            assert_eq!(Message::decode(&f[..n]), Ok(None), "prefix {n}");
        }
    }

    #[test]
    fn create_carries_each_routing_and_refuses_others() {
        for (routing, byte) in [(Routing::Own, 0), (Routing::Ask, 1), (Routing::Once, 2)] {
            let m = Message::Create {
                id: 1,
                client: "10.0.0.1:40000".parse().unwrap(),
                local: "10.0.0.2:80".parse().unwrap(),
                transfer: Transfer::Fd,
                preread: Vec::new(),
                route: routing,
            };
            let mut f = m.to_frame().unwrap();
            assert_eq!(*f.last().unwrap(), byte);
            assert_eq!(Message::decode(&f).unwrap().unwrap(), (m, f.len()));
            *f.last_mut().unwrap() = 3;
            assert_eq!(Message::decode(&f), Err(ProtoError::Invalid("route")));
        }
    }

    #[test]
    fn cancel_and_cancelled_round_trip_with_appended_numbers() {
        let m = Message::Cancel { id: 42 };
        let f = m.to_frame().unwrap();
        // Appended after Served (12): existing frame types keep their numbers.
        assert_eq!(f[3], 13);
        assert_eq!(&f[HEADER_LEN..], &42u64.to_be_bytes());
        assert_eq!(Message::decode(&f).unwrap().unwrap(), (m.clone(), f.len()));
        assert_eq!(m.id(), Some(42));
        assert!(!m.needs_fd());
        let d = Message::Drop {
            id: 42,
            reason: DropReason::Cancelled,
            detail: String::new(),
        };
        let f = d.to_frame().unwrap();
        assert_eq!(f[HEADER_LEN + 8], 6);
        assert_eq!(Message::decode(&f).unwrap().unwrap(), (d, f.len()));
        assert_eq!(
            Message::decode(b"SY\x01\x11"),
            Err(ProtoError::UnknownOpcode(17))
        );
    }

    #[test]
    fn header_errors_come_early() {
        assert!(matches!(
            Message::decode(b"XY"),
            Err(ProtoError::BadMagic(_))
        ));
        assert_eq!(Message::decode(b"SY\x02"), Err(ProtoError::BadVersion(2)));
        assert_eq!(
            Message::decode(b"SY\x01\x63"),
            Err(ProtoError::UnknownOpcode(0x63))
        );
        assert!(matches!(
            Message::decode(b"SY\x01\x01\xff\xff\xff\xff"),
            Err(ProtoError::TooLong { .. })
        ));
    }

    #[test]
    fn trailing_and_truncated_bodies_are_errors() {
        let mut f = Message::Accepted { id: 1 }.to_frame().unwrap();
        f.push(0);
        f[7] += 1;
        assert_eq!(Message::decode(&f), Err(ProtoError::Trailing(1)));
        let mut f = Message::Accepted { id: 1 }.to_frame().unwrap();
        f.pop();
        f[7] -= 1;
        assert_eq!(Message::decode(&f), Err(ProtoError::Truncated("id")));
    }

    #[test]
    fn oversize_fields_refused_on_encode() {
        let m = Message::Hello {
            name: "x".repeat(MAX_STRING + 1),
        };
        let mut out = b"keep".to_vec();
        assert!(m.encode(&mut out).is_err());
        assert_eq!(out, b"keep");
    }

    #[test]
    fn frame_buffer_splits_and_joins() {
        let a = Message::Ping { nonce: 1 }.to_frame().unwrap();
        let b = Message::Closed {
            id: 2,
            requests: 3,
            bytes: 4,
        }
        .to_frame()
        .unwrap();
        let all = [a, b].concat();
        let mut fb = FrameBuffer::new();
        let mut got = Vec::new();
        for byte in &all {
            fb.extend(std::slice::from_ref(byte));
            while let Some(m) = fb.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(fb.pending(), 0);
    }

    /// `has_frame` says whether the next frame is whole; received room is reused.
    #[test]
    fn frame_buffer_knows_a_whole_frame_and_reuses_its_room() {
        let a = Message::Ping { nonce: 1 }.to_frame().unwrap();
        let mut fb = FrameBuffer::new();
        assert!(!fb.has_frame());
        for round in 0..3 {
            let spare = fb.spare(1024);
            assert!(spare.len() >= 1024, "round {round}");
            spare[..a.len() - 1].copy_from_slice(&a[..a.len() - 1]);
            fb.commit(a.len() - 1);
            assert!(!fb.has_frame());
            assert_eq!(fb.next_message().unwrap(), None);
            fb.extend(&a[a.len() - 1..]);
            fb.extend(&a);
            assert!(fb.has_frame());
            assert_eq!(fb.next_message().unwrap(), Some(Message::Ping { nonce: 1 }));
            assert!(fb.has_frame());
            assert_eq!(fb.next_message().unwrap(), Some(Message::Ping { nonce: 1 }));
            assert!(!fb.has_frame());
            assert_eq!(fb.pending(), 0);
        }
        fb.extend(b"xx");
        // A bad header is a whole answer too: an error.
        assert!(fb.has_frame());
        assert!(fb.next_message().is_err());
    }

    #[test]
    fn needs_fd_only_for_fd_transfers() {
        let m = Message::Create {
            id: 1,
            client: "1.2.3.4:5".parse().unwrap(),
            local: "1.2.3.4:80".parse().unwrap(),
            transfer: Transfer::Fd,
            preread: vec![],
            route: Routing::Own,
        };
        assert!(m.needs_fd());
        assert!(!Message::Accepted { id: 1 }.needs_fd());
    }
}
