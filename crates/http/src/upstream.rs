//! Strict parsing of the response heads nodes send, and the rewriting of heads in both
//! directions. Used by the switch (relaying) and by nodes forwarding for each other.
//!
//! The switch reads a node's response with one interpretation of its length (RFC 9112 §6.3) and
//! refuses anything ambiguous instead of guessing: `Content-Length` together with
//! `Transfer-Encoding`, duplicate or non-numeric `Content-Length`, a transfer coding other than a
//! single final `chunked`, obs-fold, more than [`MAX_HEADERS`] headers or a head larger than the
//! limit are all errors (the client then gets a 502 and the node connection is dropped), and so
//! is a line ended by a bare LF (httparse accepts one; the head is scanned for it first, as
//! requests are). A
//! response to `HEAD`, and every 1xx, 204 and 304, has no body whatever its headers say.

use thiserror::Error;

/// Most headers a node response may carry.
pub const MAX_HEADERS: usize = 100;

/// Request field a relaying switch adds to ask the node whether its response comes from the
/// memory cache. Never forwarded as a client sent it.
pub const RELAY_HEADER: &str = "X-Switchyard-Relay";

/// Response field in which a node answers [`RELAY_HEADER`]: `hit` (the body came from the
/// memory cache) or `miss`. Never passed on to a client.
pub const CACHE_HEADER: &str = "X-Switchyard-Cache";

/// Field of a cooperative node's fetch from a target's owner, on the request and on the
/// response (cache forwarding with hot-object replication, seed 000 §3.2).
///
/// On the request ([`ask_copy`]): `<max bytes> <member>`, the fetching member's name and the
/// largest body it will hold whole; the owner may then keep the fetched response as that
/// member's copy of a hot object. On the response ([`CopyOffer`]): `copies=N age-ms=A
/// mtime-ns=M inode=I`, the terms of the copy (the count the holder's references grow by, how
/// long ago the owner checked its file, and the file's identity); the body is the copy.
/// Never forwarded as a client sent it, never passed on to a client.
pub const COPY_HEADER: &str = "X-Switchyard-Copy";

/// How a response body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyLength {
    /// No body (HEAD, 1xx, 204, 304, or `Content-Length: 0`).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// A chunked body.
    Chunked,
    /// The body runs until the node closes the connection.
    UntilClose,
}

/// A parsed response head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseMeta {
    /// Status code, 100..=599.
    pub status: u16,
    /// Minor version: 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    /// Length of the head including its blank line.
    pub head_len: usize,
    /// Body framing.
    pub body: BodyLength,
    /// Whether the node keeps the connection open after this response.
    pub keep_alive: bool,
    /// What its [`CACHE_HEADER`] says (see [`cache_status`]), read in the same pass.
    pub cache: Option<bool>,
    /// Whether a `Connection` header lists options other than `close` and `keep-alive`
    /// (headers that [`client_response_head`] must then drop too).
    pub connection_options: bool,
    /// Whether the head holds a hop-by-hop field other than [`CACHE_HEADER`] (which
    /// [`client_response_head`] drops): without one, the head crosses as it came.
    pub hop_by_hop: bool,
    /// Where the first [`CACHE_HEADER`] line is in the head, terminator included: the one line
    /// a head that crosses as it came loses.
    pub cache_line: Option<(usize, usize)>,
}

impl ResponseMeta {
    /// An interim (1xx) response; the final one follows on the same connection.
    pub fn is_interim(&self) -> bool {
        self.status < 200
    }
}

/// Why a response head is refused.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum ResponseError {
    /// Not a valid HTTP/1.x response head.
    #[error("malformed response: {0}")]
    Malformed(&'static str),
    /// The head is larger than the limit or has too many headers.
    #[error("response head too large")]
    TooLarge,
}

/// Parse a response head at the start of `buf`. `None` means more bytes are needed.
/// `head_request` tells that the request was `HEAD` (no body follows whatever the headers say).
pub fn parse(
    buf: &[u8],
    head_request: bool,
    max_head: usize,
) -> Result<Option<ResponseMeta>, ResponseError> {
    // Left uninitialised, as in `request::parse`.
    let mut headers =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut []);
    // httparse takes a bare LF as a line end; a peer that does not would frame the response
    // differently, so it is refused: looked for in one pass over a head parsed whole, else
    // line by line (refused as soon as it arrives, before any other fault).
    const BARE_LF: ResponseError = ResponseError::Malformed("bare LF in the response head");
    let head_len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut r,
        buf,
        &mut headers,
    ) {
        Ok(httparse::Status::Complete(n)) if crate::request::parsed_head_has_bare_lf(&buf[..n]) => {
            return Err(BARE_LF)
        }
        Ok(httparse::Status::Partial) | Err(_) if crate::request::bare_lf(buf) => {
            return Err(BARE_LF)
        }
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return if buf.len() > max_head {
                Err(ResponseError::TooLarge)
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::TooLarge),
        Err(_) => return Err(ResponseError::Malformed("syntax")),
    };
    if head_len > max_head {
        return Err(ResponseError::TooLarge);
    }
    let status = r.code.unwrap_or(0);
    if !(100..=599).contains(&status) {
        return Err(ResponseError::Malformed("status code out of range"));
    }
    let minor = match r.version {
        Some(0) => 0,
        Some(1) => 1,
        _ => return Err(ResponseError::Malformed("version")),
    };
    let mut length: Option<u64> = None;
    let mut te = false;
    let mut te_chunked_last = false;
    let mut close = false;
    let mut keep = false;
    let mut cache = None;
    let mut cache_line = None;
    let mut options = false;
    let mut hop = false;
    for h in r.headers.iter() {
        let name = h.name.as_bytes();
        let is = |known: &str| name.eq_ignore_ascii_case(known.as_bytes());
        // Trimmed only for the few fields read here.
        let v = || trim(h.value);
        if is("content-length") {
            if length.is_some() {
                return Err(ResponseError::Malformed("duplicate Content-Length"));
            }
            length = Some(parse_length(v())?);
        } else if is("transfer-encoding") {
            if te {
                return Err(ResponseError::Malformed(
                    "several Transfer-Encoding headers",
                ));
            }
            te = true;
            let codings: Vec<&[u8]> = v()
                .split(|&b| b == b',')
                .map(trim)
                .filter(|c| !c.is_empty())
                .collect();
            if codings.len() != 1 || !codings[0].eq_ignore_ascii_case(b"chunked") {
                return Err(ResponseError::Malformed("unsupported transfer coding"));
            }
            te_chunked_last = true;
        } else if is("connection") {
            hop = true;
            for t in v().split(|&b| b == b',').map(trim) {
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    keep = true;
                } else if !t.is_empty() {
                    options = true;
                }
            }
        } else if is(CACHE_HEADER) {
            if cache.is_none() {
                cache = Some(v().eq_ignore_ascii_case(b"hit"));
                cache_line = line_of(buf, h.name.as_ptr(), head_len);
            } else {
                // A second one: the head is rewritten line by line.
                hop = true;
            }
        } else {
            // (Content-Length and Transfer-Encoding, above, are end-to-end.)
            hop |= hop_by_hop(name);
        }
    }
    // Without its line's place the head cannot cross as it came.
    hop |= cache.is_some() && cache_line.is_none();
    if te && length.is_some() {
        return Err(ResponseError::Malformed(
            "both Content-Length and Transfer-Encoding",
        ));
    }
    if te && minor == 0 {
        return Err(ResponseError::Malformed("Transfer-Encoding in HTTP/1.0"));
    }
    if status == 101 {
        return Err(ResponseError::Malformed("protocol upgrade"));
    }
    let no_body = head_request || status < 200 || status == 204 || status == 304;
    let body = if no_body {
        BodyLength::None
    } else if te_chunked_last {
        BodyLength::Chunked
    } else {
        match length {
            Some(0) => BodyLength::None,
            Some(n) => BodyLength::Length(n),
            None => BodyLength::UntilClose,
        }
    };
    let keep_alive = body != BodyLength::UntilClose && !close && (minor == 1 || keep);
    Ok(Some(ResponseMeta {
        status,
        minor,
        head_len,
        body,
        keep_alive,
        cache,
        connection_options: options,
        hop_by_hop: hop,
        cache_line,
    }))
}

/// The line of `buf`'s head (its first `head_len` bytes) that begins at `name`, a field name
/// httparse found in it: its start and the end of its CRLF.
fn line_of(buf: &[u8], name: *const u8, head_len: usize) -> Option<(usize, usize)> {
    let start = (name as usize).checked_sub(buf.as_ptr() as usize)?;
    if start >= head_len {
        return None;
    }
    let end = start + memchr::memchr(b'\n', &buf[start..head_len])? + 1;
    Some((start, end))
}

fn parse_length(v: &[u8]) -> Result<u64, ResponseError> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return Err(ResponseError::Malformed("invalid Content-Length"));
    }
    Ok(v.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(v.len());
    let e = v
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(s, |p| p + 1);
    &v[s..e]
}

/// Lines of an already validated head: the start line, then each header line, without line
/// terminators (CRLF or a bare LF).
fn lines(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    head.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
}

fn name_of(line: &[u8]) -> &[u8] {
    let end = line.iter().position(|&b| b == b':').unwrap_or(line.len());
    &line[..end]
}

fn value_of(line: &[u8]) -> &[u8] {
    match line.iter().position(|&b| b == b':') {
        Some(i) => trim(&line[i + 1..]),
        None => &[],
    }
}

/// Hop-by-hop fields (RFC 9110 §7.6.1) that never cross the switch: the switch keeps its own
/// connections on both sides.
/// `Expect` is answered by the switch itself (it reads the whole body before forwarding).
/// The switch's and the nodes' own fields ([`RELAY_HEADER`], [`CACHE_HEADER`],
/// [`COPY_HEADER`]) belong to one hop too.
pub(crate) fn hop_by_hop(name: &[u8]) -> bool {
    const HOP: [&[u8]; 10] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"upgrade",
        b"trailer",
        b"expect",
        b"x-switchyard-relay",
        b"x-switchyard-cache",
        b"x-switchyard-copy",
    ];
    /// Bit `n` is set when some name in `HOP` is `n` bytes long.
    const LENGTHS: u64 = {
        let mut mask = 0u64;
        let mut i = 0;
        while i < HOP.len() {
            mask |= 1 << HOP[i].len();
            i += 1;
        }
        mask
    };
    // Most names have none of these lengths: one test of a bit passes them, where the list
    // took ten comparisons for each field of every response relayed.
    name.len() < 64
        && LENGTHS & (1 << name.len()) != 0
        && HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// Fields that delimit or route a message: never removed, whatever `Connection` lists, so that
/// both sides always see the same message length and host.
fn protected(name: &[u8]) -> bool {
    const KEEP: [&[u8]; 3] = [b"content-length", b"transfer-encoding", b"host"];
    KEEP.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// Names listed in `Connection` headers (also hop-by-hop). Empty for the common case, so the
/// check costs nothing when there are none.
fn connection_options(head: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for l in lines(head).skip(1) {
        if name_of(l).eq_ignore_ascii_case(b"connection") {
            for t in value_of(l).split(|&b| b == b',').map(trim) {
                if !t.is_empty()
                    && !t.eq_ignore_ascii_case(b"close")
                    && !t.eq_ignore_ascii_case(b"keep-alive")
                {
                    out.push(t.to_ascii_lowercase());
                }
            }
        }
    }
    out
}

fn dropped(name: &[u8], options: &[Vec<u8>]) -> bool {
    hop_by_hop(name) || (!protected(name) && options.iter().any(|o| name.eq_ignore_ascii_case(o)))
}

/// Write the request head to forward to a node into `out`: the request line as sent, the
/// end-to-end headers as sent, the client's address appended to `X-Forwarded-For` (when
/// `forwarded_for` is given), and `Connection: keep-alive` for an HTTP/1.0 request so that the
/// node keeps the pooled connection open. `head` must be a head accepted by
/// `switchyard_http::request::parse`, and `plain` its [`RequestHead::plain`]: such a head is
/// copied whole, where any other is rewritten line by line.
///
/// [`RequestHead::plain`]: crate::request::RequestHead::plain
pub fn forward_request_head(
    head: &[u8],
    plain: bool,
    http10: bool,
    forwarded_for: Option<&str>,
    out: &mut Vec<u8>,
) {
    // One allocation for the whole head (what is added is at most a few dozen bytes), not a
    // growth step every few lines.
    out.reserve(head.len() + forwarded_for.map_or(0, |ip| ip.len() + 64) + 64);
    let mut xff: Option<Vec<u8>> = None;
    if plain {
        // Nothing to drop and no X-Forwarded-For to extend: the head up to its blank line
        // (which ends in CRLF: the parse refuses a bare LF).
        debug_assert!(head.ends_with(b"\r\n\r\n"));
        out.extend_from_slice(&head[..head.len() - 2]);
    } else {
        let options = connection_options(head);
        let mut it = lines(head);
        if let Some(first) = it.next() {
            out.extend_from_slice(first);
            out.extend_from_slice(b"\r\n");
        }
        for l in it {
            let name = name_of(l);
            if dropped(name, &options) {
                continue;
            }
            if forwarded_for.is_some() && name.eq_ignore_ascii_case(b"x-forwarded-for") {
                let v = value_of(l);
                match &mut xff {
                    Some(x) => {
                        x.extend_from_slice(b", ");
                        x.extend_from_slice(v);
                    }
                    None => xff = Some(v.to_vec()),
                }
                continue;
            }
            out.extend_from_slice(l);
            out.extend_from_slice(b"\r\n");
        }
    }
    if let Some(ip) = forwarded_for {
        out.extend_from_slice(b"X-Forwarded-For: ");
        if let Some(x) = xff.filter(|x| !x.is_empty()) {
            out.extend_from_slice(&x);
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(ip.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Add [`RELAY_HEADER`] to a head written by [`forward_request_head`]: the node is asked to
/// say in [`CACHE_HEADER`] whether its response came from its memory cache.
pub fn ask_cache_report(out: &mut Vec<u8>) {
    debug_assert!(out.ends_with(b"\r\n\r\n"));
    out.truncate(out.len() - 2);
    out.reserve(RELAY_HEADER.len() + 7);
    out.extend_from_slice(RELAY_HEADER.as_bytes());
    out.extend_from_slice(b": 1\r\n\r\n");
}

/// Add [`COPY_HEADER`] to a head written by [`forward_request_head`]: `member` fetches and
/// would keep the response, of at most `max_bytes` of body, as its copy of a hot object.
pub fn ask_copy(out: &mut Vec<u8>, member: &str, max_bytes: u64) {
    debug_assert!(out.ends_with(b"\r\n\r\n"));
    out.truncate(out.len() - 2);
    out.extend_from_slice(COPY_HEADER.as_bytes());
    out.extend_from_slice(format!(": {max_bytes} {member}\r\n\r\n").as_bytes());
}

/// A fetching member's ask for a copy ([`COPY_HEADER`] on a request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyAsk<'a> {
    /// The member's name.
    pub member: &'a str,
    /// The largest body it holds whole.
    pub max_bytes: u64,
}

impl<'a> CopyAsk<'a> {
    /// The ask in a request's [`COPY_HEADER`] value; `None` for anything but `<digits>
    /// <name>` with a name of visible ASCII.
    pub fn parse(value: &'a str) -> Option<CopyAsk<'a>> {
        let (max, member) = value.trim().split_once(' ')?;
        let max_bytes = digits(max)?;
        let member = member.trim();
        if member.is_empty() || !member.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        Some(CopyAsk { member, max_bytes })
    }
}

/// An owner's offer of a copy with a fetched response ([`COPY_HEADER`] on a response), with
/// the validators the copy answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyOffer {
    /// Copies in the cluster with this one.
    pub copies: u32,
    /// How long ago the owner last checked the object against its disk, in milliseconds.
    pub age_ms: u64,
    /// The file's modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: u64,
    /// The file's inode on the owner.
    pub inode: u64,
    /// The response's `ETag`.
    pub etag: String,
    /// The response's `Last-Modified`.
    pub last_modified: String,
}

impl CopyOffer {
    /// The value of the response's [`COPY_HEADER`] for these terms.
    pub fn header_value(&self) -> String {
        format!(
            "copies={} age-ms={} mtime-ns={} inode={}",
            self.copies, self.age_ms, self.mtime_ns, self.inode
        )
    }

    /// The offer in a response head accepted by [`parse`]: `None` unless it carries a
    /// well-formed [`COPY_HEADER`] (each of its four terms once), one `ETag` and one
    /// `Last-Modified`.
    pub fn from_head(head: &[u8]) -> Option<CopyOffer> {
        let field = |name: &str| -> Option<&str> {
            let mut found = lines(head)
                .skip(1)
                .filter(|l| name_of(l).eq_ignore_ascii_case(name.as_bytes()));
            let v = found.next()?;
            if found.next().is_some() {
                return None;
            }
            std::str::from_utf8(value_of(v)).ok()
        };
        let terms = field(COPY_HEADER)?;
        let (mut copies, mut age_ms, mut mtime_ns, mut inode) = (None, None, None, None);
        for term in terms.split(' ').filter(|t| !t.is_empty()) {
            let (k, v) = term.split_once('=')?;
            let slot = match k {
                "copies" => &mut copies,
                "age-ms" => &mut age_ms,
                "mtime-ns" => &mut mtime_ns,
                "inode" => &mut inode,
                _ => return None,
            };
            if slot.replace(digits(v)?).is_some() {
                return None;
            }
        }
        Some(CopyOffer {
            copies: u32::try_from(copies?).ok()?,
            age_ms: age_ms?,
            mtime_ns: mtime_ns?,
            inode: inode?,
            etag: field("etag")?.to_owned(),
            last_modified: field("last-modified")?.to_owned(),
        })
    }
}

/// A decimal number of ASCII digits only (no sign, no spaces) that fits in a `u64`.
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Whether a response head accepted by [`parse`] says, in [`CACHE_HEADER`], that its body came
/// from the node's memory cache.
pub fn from_cache(head: &[u8]) -> bool {
    cache_status(head) == Some(true)
}

/// What the node's cache header says: `Some(true)` a hit, `Some(false)` a miss, `None` when the
/// response carries no answer (not a file response, or a node that was not asked).
pub fn cache_status(head: &[u8]) -> Option<bool> {
    lines(head)
        .skip(1)
        .find(|l| name_of(l).eq_ignore_ascii_case(CACHE_HEADER.as_bytes()))
        .map(|l| value_of(l).eq_ignore_ascii_case(b"hit"))
}

/// Whether a head written by [`forward_request_head`] stays within `limits` and the header
/// count of `switchyard_http::request::parse`: the rewrite may add `X-Forwarded-For` and
/// `Connection: keep-alive`, so a head just under the limits when it arrived can be over them
/// when it leaves. A peer with the same limits would refuse such a head (431); the sender
/// answers 431 itself (or serves the request without forwarding) instead of forwarding it.
pub fn forwarded_head_fits(head: &[u8], limits: &crate::request::Limits) -> bool {
    // Request line and blank line end in CRLF too; every other line is one field.
    // (`memchr` finds each line end with vector compares; a bytewise count costs two
    // instructions a byte.)
    let lines = memchr::memchr_iter(b'\n', head).count();
    head.len() <= limits.max_head_bytes && lines.saturating_sub(2) <= crate::request::MAX_HEADERS
}

/// Write the response head to send to the client into `out`: the node's status line and
/// end-to-end headers, then the switch's own connection header: `Connection: close` when the
/// client connection ends after this response, `Connection: keep-alive` for an HTTP/1.0 client
/// that keeps it. `head` must be a head accepted by [`parse`], which gave `meta`: its scan of
/// the head tells whether a `Connection` header lists options, so that the common head (none)
/// is not scanned for them a second time.
///
/// A head with no hop-by-hop field but the cache answer (the common one) is copied as it came,
/// less that one line, rather than line by line.
pub fn client_response_head(
    head: &[u8],
    meta: &ResponseMeta,
    keep_alive: bool,
    http10: bool,
    out: &mut Vec<u8>,
) {
    // One allocation for the head (at most a `Connection` line is added).
    out.reserve(head.len() + 32);
    let whole = head.len() == meta.head_len && head.ends_with(b"\r\n\r\n");
    if whole && !meta.hop_by_hop && !meta.connection_options {
        // (Leading empty lines are skipped, as the line-by-line way skips them.)
        let start = head
            .iter()
            .position(|&b| b != b'\r' && b != b'\n')
            .unwrap_or(0);
        let body_end = head.len() - 2;
        match meta.cache_line {
            Some((a, b)) if start <= a && b <= body_end => {
                out.extend_from_slice(&head[start..a]);
                out.extend_from_slice(&head[b..body_end]);
            }
            None => out.extend_from_slice(&head[start..body_end]),
            Some(_) => return client_response_head_by_line(head, meta, keep_alive, http10, out),
        }
        connection_line(keep_alive, http10, out);
        out.extend_from_slice(b"\r\n");
        return;
    }
    client_response_head_by_line(head, meta, keep_alive, http10, out)
}

/// The switch's own `Connection` line for the client.
fn connection_line(keep_alive: bool, http10: bool, out: &mut Vec<u8>) {
    match (keep_alive, http10) {
        (false, _) => out.extend_from_slice(b"Connection: close\r\n"),
        (true, true) => out.extend_from_slice(b"Connection: keep-alive\r\n"),
        (true, false) => {}
    }
}

/// [`client_response_head`] for any head: line by line, each hop-by-hop field left out.
fn client_response_head_by_line(
    head: &[u8],
    meta: &ResponseMeta,
    keep_alive: bool,
    http10: bool,
    out: &mut Vec<u8>,
) {
    let options = if meta.connection_options {
        connection_options(head)
    } else {
        Vec::new()
    };
    let mut it = lines(head);
    if let Some(first) = it.next() {
        out.extend_from_slice(first);
        out.extend_from_slice(b"\r\n");
    }
    for l in it {
        if dropped(name_of(l), &options) {
            continue;
        }
        out.extend_from_slice(l);
        out.extend_from_slice(b"\r\n");
    }
    connection_line(keep_alive, http10, out);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The length gate passes every listed name, in any case, and only field names of the
    /// listed lengths reach the list.
    #[test]
    fn every_hop_by_hop_name_is_found_in_any_case() {
        for name in [
            "Connection",
            "KEEP-ALIVE",
            "proxy-connection",
            "TE",
            "Upgrade",
            "trailer",
            "Expect",
            "X-Switchyard-Relay",
            "x-switchyard-cache",
            "X-SWITCHYARD-COPY",
        ] {
            assert!(hop_by_hop(name.as_bytes()), "{name}");
        }
        for name in [
            "Date",
            "Server",
            "Content-Length",
            "ETag",
            "t",
            "Trailers",
            "Upgrades",
            "",
        ] {
            assert!(!hop_by_hop(name.as_bytes()), "{name}");
        }
        assert!(!hop_by_hop(&[b'a'; 100]));
    }

    fn p(s: &str) -> Result<Option<ResponseMeta>, ResponseError> {
        parse(s.as_bytes(), false, 16 * 1024)
    }

    fn meta(s: &str) -> ResponseMeta {
        p(s).unwrap().unwrap()
    }

    fn meta_of(head: &[u8]) -> ResponseMeta {
        parse(head, false, 16 * 1024).unwrap().unwrap()
    }

    #[test]
    fn framing() {
        let m = meta("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        assert_eq!(m.body, BodyLength::Length(5));
        assert!(m.keep_alive);
        assert_eq!(m.head_len, 38);
        let m = meta("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(m.body, BodyLength::Chunked);
        let m = meta("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(m.body, BodyLength::UntilClose);
        assert!(!m.keep_alive);
        let m = meta("HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n");
        assert_eq!(m.body, BodyLength::None);
        let m = meta("HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!((m.body, m.keep_alive), (BodyLength::None, true));
        let m = meta("HTTP/1.1 100 Continue\r\n\r\n");
        assert!(m.is_interim());
        let m = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true, 1024)
            .unwrap()
            .unwrap();
        assert_eq!(m.body, BodyLength::None);
    }

    #[test]
    fn keep_alive_rules() {
        assert!(!meta("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n").keep_alive);
        assert!(
            meta("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n")
                .keep_alive
        );
        assert!(
            !meta("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n").keep_alive
        );
    }

    #[test]
    fn ambiguous_lengths_are_refused() {
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\nContent-Length: 1\r\n\r\n",
            "HTTP/1.1 099 Odd\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "HTTP/2.0 200 OK\r\n\r\n",
            "NOT HTTP\r\n\r\n",
            "HTTP/1.1 200 OK\nContent-Length: 1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\nX: y\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX: a\n",
        ] {
            assert!(
                matches!(p(bad), Err(ResponseError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn partial_and_limits() {
        assert_eq!(p("HTTP/1.1 200 OK\r\nContent-Le").unwrap(), None);
        // The body is not scanned for bare LFs.
        let m = meta("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\n\n");
        assert_eq!(m.body, BodyLength::Length(2));
        let big = format!("HTTP/1.1 200 OK\r\nX: {}\r\n", "a".repeat(20_000));
        assert_eq!(p(&big), Err(ResponseError::TooLarge));
        let many: String = (0..120).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(
            p(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")),
            Err(ResponseError::TooLarge)
        );
    }

    #[test]
    fn request_head_rewrite() {
        let head = b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nX-Forwarded-For: 10.0.0.1\r\nKeep-Alive: 5\r\nAccept: */*\r\n\r\n";
        let mut out = Vec::new();
        forward_request_head(head, false, false, Some("127.0.0.9"), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET /a HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nX-Forwarded-For: 10.0.0.1, 127.0.0.9\r\n\r\n"
        );
        let mut out = Vec::new();
        forward_request_head(b"\r\nGET / HTTP/1.0\n\n", false, true, None, &mut out);
        assert_eq!(out, b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    }

    proptest::proptest! {
        /// Any head the parse accepts is forwarded the same whole (when the parse calls it
        /// plain) as line by line; heads are built of plain fields, hop-by-hop ones,
        /// X-Forwarded-For and leading empty lines.
        #[test]
        fn a_plain_request_head_forwards_as_rewritten_line_by_line(
            lead in proptest::bool::weighted(0.1),
            http10 in proptest::bool::ANY,
            fields in proptest::collection::vec(proptest::sample::select(vec![
                "Host: h", "Accept: */*", "User-Agent: x y", "X-A: 1", "Cookie: a=b",
                "Connection: keep-alive", "Connection: X-A", "Keep-Alive: 5", "TE: trailers",
                "X-Forwarded-For: 10.0.0.1", "x-forwarded-for: 10.0.0.2", "Upgrade: h2c",
                "X-Switchyard-Relay: 1", "Accept-Encoding: gzip,  br ",
            ]), 0..6),
            ip in proptest::option::of(proptest::sample::select(vec!["192.0.2.1", "2001:db8::1"])),
        ) {
            let version = if http10 { "1.0" } else { "1.1" };
            let mut head = String::new();
            if lead {
                head.push_str("\r\n");
            }
            head.push_str(&format!("GET /a?b HTTP/{version}\r\nHost: h\r\n"));
            for f in &fields {
                if !f.starts_with("Host") {
                    head.push_str(f);
                    head.push_str("\r\n");
                }
            }
            head.push_str("\r\n");
            let parsed = crate::request::parse(head.as_bytes(), &crate::request::Limits::default());
            let Ok(crate::request::ParseOutcome::Complete(h)) = parsed else {
                return Err(proptest::test_runner::TestCaseError::fail(format!("{head:?}: {parsed:?}")));
            };
            let expect_plain = !lead && fields.iter().all(|f| {
                let name = f.split(':').next().unwrap();
                !hop_by_hop(name.as_bytes()) && !name.eq_ignore_ascii_case("x-forwarded-for")
            });
            proptest::prop_assert_eq!(h.plain, expect_plain);
            let (mut whole, mut by_line) = (Vec::new(), Vec::new());
            forward_request_head(head.as_bytes(), h.plain, http10, ip, &mut whole);
            forward_request_head(head.as_bytes(), false, http10, ip, &mut by_line);
            proptest::prop_assert_eq!(String::from_utf8(whole).unwrap(), String::from_utf8(by_line).unwrap());
        }
    }

    /// A head at the limits when it arrives is over them once `X-Forwarded-For` is added.
    #[test]
    fn forwarded_heads_are_checked_against_the_limits() {
        use crate::request::{parse, Limits, ParseOutcome, MAX_HEADERS};
        let limits = Limits::default();
        let pad = |extra: usize| {
            let base = "GET / HTTP/1.1\r\nHost: a\r\nX-Pad: \r\n\r\n".len();
            format!(
                "GET / HTTP/1.1\r\nHost: a\r\nX-Pad: {}\r\n\r\n",
                "p".repeat(limits.max_head_bytes - base - extra)
            )
        };
        let full = pad(0);
        assert!(matches!(
            parse(full.as_bytes(), &limits),
            Ok(ParseOutcome::Complete(_))
        ));
        let mut out = Vec::new();
        forward_request_head(full.as_bytes(), true, false, Some("192.0.2.1"), &mut out);
        assert_eq!(parse(&out, &limits).unwrap_err().status(), 431);
        assert!(!forwarded_head_fits(&out, &limits));
        let roomy = pad(40);
        let mut out = Vec::new();
        forward_request_head(roomy.as_bytes(), true, false, Some("192.0.2.1"), &mut out);
        assert!(forwarded_head_fits(&out, &limits));
        assert!(matches!(
            parse(&out, &limits),
            Ok(ParseOutcome::Complete(_))
        ));
        // The header count: 100 fields arrive, 101 would leave.
        let many: String = (1..MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let head = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        assert!(matches!(
            parse(head.as_bytes(), &limits),
            Ok(ParseOutcome::Complete(_))
        ));
        let mut out = Vec::new();
        forward_request_head(head.as_bytes(), true, false, Some("192.0.2.1"), &mut out);
        assert_eq!(parse(&out, &limits).unwrap_err().status(), 431);
        assert!(!forwarded_head_fits(&out, &limits));
        let mut out = Vec::new();
        forward_request_head(head.as_bytes(), true, false, None, &mut out);
        assert!(forwarded_head_fits(&out, &limits));
    }

    /// The parse's own pass reads the cache header and whether `Connection` lists options as
    /// the separate scans of the head do, which `client_response_head` and the switch skip.
    #[test]
    fn the_parse_reads_cache_and_connection_options() {
        for (head, cache, options) in [
            ("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", None, false),
            ("HTTP/1.1 200 OK\r\nX-Switchyard-Cache: hit\r\nContent-Length: 0\r\n\r\n", Some(true), false),
            ("HTTP/1.1 200 OK\r\nx-switchyard-cache: MISS\r\nX-Switchyard-Cache: hit\r\n\r\n", Some(false), false),
            ("HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 0\r\n\r\n", None, false),
            ("HTTP/1.1 200 OK\r\nConnection: keep-alive, X-A\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n", None, true),
            ("HTTP/1.1 200 OK\r\nConnection: ,\r\nContent-Length: 0\r\n\r\n", None, false),
        ] {
            let m = meta(head);
            assert_eq!((m.cache, m.connection_options), (cache, options), "{head:?}");
            assert_eq!(m.cache, cache_status(head.as_bytes()));
            assert_eq!(options, !connection_options(head.as_bytes()).is_empty());
        }
        let head = b"HTTP/1.1 200 OK\r\nConnection: X-A\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n";
        let mut out = Vec::new();
        client_response_head(head, &meta_of(head), true, false, &mut out);
        assert_eq!(out, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    }

    #[test]
    fn connection_options_never_remove_framing_or_host() {
        let head = b"POST /a HTTP/1.1\r\nHost: x\r\nConnection: Content-Length, Host, Transfer-Encoding, X-A\r\nX-A: 1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n";
        let mut out = Vec::new();
        forward_request_head(head, false, false, None, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n"
        );
        let head = b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 3\r\n\r\n";
        let mut out = Vec::new();
        client_response_head(head, &meta_of(head), true, false, &mut out);
        assert_eq!(out, b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n");
    }

    #[test]
    fn response_head_rewrite() {
        let head = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\nKeep-Alive: timeout=5\r\n\r\n";
        let mut out = Vec::new();
        client_response_head(head, &meta_of(head), false, false, &mut out);
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\n"
        );
        let mut out = Vec::new();
        client_response_head(head, &meta_of(head), true, true, &mut out);
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\n"
        );
    }

    /// Header lines the head proptest draws from: plain fields, framing, hop-by-hop fields,
    /// `Connection` with and without options, the cache answer.
    const FIELDS: [&str; 12] = [
        "Date: Sun, 29 Nov 2026 00:00:00 GMT",
        "Server: switchyard",
        "Content-Length: 3",
        "Transfer-Encoding: chunked",
        "Keep-Alive: timeout=5",
        "Connection: keep-alive",
        "Connection: close, X-Extra",
        "X-Extra: 1",
        "X-Switchyard-Cache: hit",
        "x-switchyard-cache: miss",
        "TE: trailers",
        "ETag: \"a\"",
    ];

    proptest::proptest! {
        /// Whatever fields a head holds, the way it is copied does not change what the client
        /// gets.
        #[test]
        fn both_ways_write_the_same_head(
            lead in 0usize..2,
            fields in proptest::collection::vec(0usize..FIELDS.len(), 0..8),
            keep in proptest::bool::ANY,
            http10 in proptest::bool::ANY,
        ) {
            let mut head = "\r\n".repeat(lead) + "HTTP/1.1 200 OK\r\n";
            for f in fields {
                head += FIELDS[f];
                head += "\r\n";
            }
            head += "\r\n";
            if let Ok(Some(m)) = parse(head.as_bytes(), false, 16 * 1024) {
                let h = &head.as_bytes()[..m.head_len];
                let (mut fast, mut slow) = (Vec::new(), Vec::new());
                client_response_head(h, &m, keep, http10, &mut fast);
                client_response_head_by_line(h, &m, keep, http10, &mut slow);
                proptest::prop_assert_eq!(fast, slow);
            }
        }

        #[test]
        fn never_panics_and_head_len_is_inside(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512), head in proptest::bool::ANY) {
            if let Ok(Some(m)) = parse(&data, head, 1024) {
                proptest::prop_assert!(m.head_len <= data.len());
                let h = &data[..m.head_len];
                proptest::prop_assert_eq!(m.cache, cache_status(h));
                proptest::prop_assert_eq!(m.connection_options, !connection_options(h).is_empty());
                let mut out = Vec::new();
                client_response_head(&data[..m.head_len], &m, m.keep_alive, false, &mut out);
                proptest::prop_assert!(out.ends_with(b"\r\n\r\n"));
            }
        }
    }

    /// A head with no hop-by-hop field but the cache answer crosses as it came, less that
    /// line; any other hop-by-hop field sends it line by line; both ways write the same head.
    #[test]
    fn a_plain_head_crosses_as_it_came() {
        let plain =
            b"HTTP/1.1 200 OK\r\nDate: x\r\nX-Switchyard-Cache: hit\r\nContent-Length: 2\r\n\r\n";
        let m = meta_of(plain);
        assert!(!m.hop_by_hop);
        assert_eq!(m.cache_line, Some((26, 51)));
        let mut out = Vec::new();
        client_response_head(plain, &m, false, false, &mut out);
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\nDate: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );
        let hop = b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\n";
        assert!(meta_of(hop).hop_by_hop);
        let twice =
            b"HTTP/1.1 200 OK\r\nX-Switchyard-Cache: hit\r\nX-Switchyard-Cache: miss\r\n\r\n";
        assert!(meta_of(twice).hop_by_hop);
        for head in [&plain[..], hop, twice] {
            let m = meta_of(head);
            for (keep, http10) in [(true, false), (true, true), (false, false)] {
                let (mut fast, mut slow) = (Vec::new(), Vec::new());
                client_response_head(head, &m, keep, http10, &mut fast);
                client_response_head_by_line(head, &m, keep, http10, &mut slow);
                assert_eq!(fast, slow, "{head:?}");
            }
        }
    }

    /// The switch's own fields never cross it as someone else sent them; the node's cache
    /// answer is read, then removed from the client's head.
    #[test]
    fn cache_report_fields_stay_on_their_hop() {
        let mut out = Vec::new();
        forward_request_head(
            b"GET /a HTTP/1.1\r\nHost: h\r\nX-Switchyard-Relay: 1\r\n\r\n",
            false,
            false,
            None,
            &mut out,
        );
        assert_eq!(out, b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n");
        ask_cache_report(&mut out);
        assert_eq!(
            out,
            b"GET /a HTTP/1.1\r\nHost: h\r\nX-Switchyard-Relay: 1\r\n\r\n"
        );
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nx-switchyard-cache: HIT\r\n\r\n";
        assert!(from_cache(head));
        assert!(!from_cache(
            b"HTTP/1.1 200 OK\r\nX-Switchyard-Cache: miss\r\n\r\n"
        ));
        assert!(!from_cache(b"HTTP/1.1 200 OK\r\nX-Other: hit\r\n\r\n"));
        let mut client = Vec::new();
        client_response_head(head, &meta_of(head), true, false, &mut client);
        assert_eq!(client, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    }

    #[test]
    fn copy_fields_stay_on_their_hop() {
        // A client's own ask never reaches the owner; the fetching node's does.
        let mut out = Vec::new();
        forward_request_head(
            b"GET /a HTTP/1.1\r\nHost: h\r\nX-Switchyard-Copy: 99 n9\r\n\r\n",
            false,
            false,
            None,
            &mut out,
        );
        assert_eq!(out, b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n");
        ask_copy(&mut out, "n2", 1 << 20);
        assert_eq!(
            out,
            b"GET /a HTTP/1.1\r\nHost: h\r\nX-Switchyard-Copy: 1048576 n2\r\n\r\n"
        );
        // The offer is read by the fetching node and never reaches its client.
        let offer = CopyOffer {
            copies: 3,
            age_ms: 12,
            mtime_ns: 1_700_000_000_123_456_789,
            inode: 42,
            etag: "\"2a-1\"".into(),
            last_modified: "Tue, 14 Nov 2023 22:13:20 GMT".into(),
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nETag: {}\r\nLast-Modified: {}\r\nContent-Length: 5\r\n\
             x-switchyard-copy: {}\r\n\r\n",
            offer.etag,
            offer.last_modified,
            offer.header_value()
        );
        assert_eq!(CopyOffer::from_head(head.as_bytes()), Some(offer));
        let mut client = Vec::new();
        client_response_head(
            head.as_bytes(),
            &meta_of(head.as_bytes()),
            true,
            false,
            &mut client,
        );
        assert!(CopyOffer::from_head(&client).is_none());
        assert!(!String::from_utf8(client).unwrap().contains("copies="));
    }

    #[test]
    fn copy_asks_and_offers_are_read_strictly() {
        assert_eq!(
            CopyAsk::parse(" 4096 n0 "),
            Some(CopyAsk {
                member: "n0",
                max_bytes: 4096
            })
        );
        for bad in [
            "", "n0", "4096", "4096 ", "-1 n0", "+1 n0", "1x n0", "1 n 0", "1 \u{e9}",
        ] {
            assert_eq!(CopyAsk::parse(bad), None, "{bad:?}");
        }
        let head = |copy: &str| {
            format!(
                "HTTP/1.1 200 OK\r\nETag: \"e\"\r\nLast-Modified: x\r\n\
                 X-Switchyard-Copy: {copy}\r\n\r\n"
            )
        };
        let good = "copies=2 age-ms=0 mtime-ns=5 inode=7";
        assert!(CopyOffer::from_head(head(good).as_bytes()).is_some());
        for bad in [
            "copies=2 age-ms=0 mtime-ns=5",
            "copies=2 age-ms=0 mtime-ns=5 inode=7 inode=7",
            "copies=2 age-ms=0 mtime-ns=5 inode=-7",
            "copies=4294967296 age-ms=0 mtime-ns=5 inode=7",
            "copies=2 age-ms=0 mtime-ns=5 inode=7 extra=1",
            "copies=2,age-ms=0 mtime-ns=5 inode=7",
        ] {
            assert_eq!(CopyOffer::from_head(head(bad).as_bytes()), None, "{bad}");
        }
        // Without its validators a copy could not answer as the owner does.
        let no_etag =
            format!("HTTP/1.1 200 OK\r\nLast-Modified: x\r\nX-Switchyard-Copy: {good}\r\n\r\n");
        assert_eq!(CopyOffer::from_head(no_etag.as_bytes()), None);
    }
}
