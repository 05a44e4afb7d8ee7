//! Request-head parsing with strict limits and one interpretation of length.
//!
//! The tokenizer is `httparse`; on top of it this module enforces the
//! limits a public-facing server needs (request line, header section,
//! header count, body size) and the message-length rules of RFC 9112 §6
//! in their strictest reading, so that a front end and the node behind it
//! can never disagree about where one request ends and the next begins.

use thiserror::Error;

/// Most headers a request may carry before it is answered 431.
pub const MAX_HEADERS: usize = 100;

/// Size limits applied while parsing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest request line (method, target, version) in bytes; longer is 414.
    pub max_request_line: usize,
    /// Longest header section including the request line; longer is 431.
    pub max_head_bytes: usize,
    /// Largest request body announced by `Content-Length`; larger is 413.
    pub max_body_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_line: 8 * 1024,
            max_head_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
        }
    }
}

/// Request methods this project distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Patch,
    Trace,
    Connect,
    /// A syntactically valid method token this project does not know.
    Other,
}

/// The methods this project names, with their tokens.
const STANDARD: [(Method, &str); 9] = [
    (Method::Get, "GET"),
    (Method::Head, "HEAD"),
    (Method::Post, "POST"),
    (Method::Put, "PUT"),
    (Method::Delete, "DELETE"),
    (Method::Options, "OPTIONS"),
    (Method::Patch, "PATCH"),
    (Method::Trace, "TRACE"),
    (Method::Connect, "CONNECT"),
];

impl Method {
    fn from_token(token: &str) -> Method {
        STANDARD
            .iter()
            .find(|&&(_, t)| t == token)
            .map_or(Method::Other, |&(m, _)| m)
    }

    /// The token of a standard method; `None` for [`Method::Other`].
    pub fn token(self) -> Option<&'static str> {
        STANDARD.iter().find(|&&(m, _)| m == self).map(|&(_, t)| t)
    }

    /// Safe and idempotent methods may be retried on another node.
    pub fn is_idempotent(self) -> bool {
        matches!(
            self,
            Method::Get
                | Method::Head
                | Method::Options
                | Method::Trace
                | Method::Put
                | Method::Delete
        )
    }
}

/// Protocol version of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

impl Version {
    /// The version as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// How the request body is delimited (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body.
    None,
    /// Exactly this many bytes follow the head.
    Length(u64),
    /// A chunked body follows the head.
    Chunked,
}

/// A parsed request head: the fields every component acts on.
///
/// The raw bytes of the head are `buf[..head_len]` of the buffer that was
/// parsed; a relaying switch forwards those.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    pub method: Method,
    /// The method token as sent (one of the standard ones borrowed, not allocated).
    pub method_token: std::borrow::Cow<'static, str>,
    /// The request target as sent (not decoded).
    pub target: String,
    pub version: Version,
    pub host: Option<String>,
    /// Whether the connection may carry another request after this one.
    pub keep_alive: bool,
    pub framing: BodyFraming,
    /// `Expect: 100-continue` was sent.
    pub expect_continue: bool,
    pub if_none_match: Option<String>,
    pub if_modified_since: Option<String>,
    pub range: Option<String>,
    pub if_range: Option<String>,
    pub cookie: Option<String>,
    /// The request came through a relaying switch that asks whether the response came from
    /// the node's memory cache ([`crate::upstream::RELAY_HEADER`]); the node answers in
    /// [`crate::upstream::CACHE_HEADER`], which the switch removes.
    pub cache_report: bool,
    /// The value of [`crate::upstream::COPY_HEADER`]: a cooperative peer fetching this request
    /// asks for the response as its copy of a hot object ([`crate::upstream::CopyAsk`]).
    pub copy_ask: Option<String>,
    /// Length in bytes of the head, including the blank line ending it.
    pub head_len: usize,
    /// The head starts with its request line and holds no hop-by-hop field and no
    /// `X-Forwarded-For`: a relay forwards it as it came, plus its own fields
    /// ([`crate::upstream::forward_request_head`]).
    pub plain: bool,
}

/// Result of feeding a buffer to [`parse`].
// Returned by value once per request and consumed at once; boxing the head
// would only add an allocation to every request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseOutcome {
    /// A whole head was parsed.
    Complete(RequestHead),
    /// More bytes are needed; none of the limits is exceeded yet.
    Partial,
}

/// Why a request was refused, each with exactly one status code.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("malformed request: {0}")]
    BadRequest(&'static str),
    #[error("request line longer than the limit")]
    UriTooLong,
    #[error("header section larger than the limit")]
    HeaderFieldsTooLarge,
    #[error("request body larger than the limit")]
    ContentTooLarge,
    #[error("not implemented: {0}")]
    NotImplemented(&'static str),
    #[error("HTTP version not supported")]
    VersionNotSupported,
    #[error("unsupported expectation")]
    ExpectationFailed,
}

impl RequestError {
    /// The status code that answers this error.
    pub fn status(&self) -> u16 {
        match self {
            RequestError::BadRequest(_) => 400,
            RequestError::UriTooLong => 414,
            RequestError::HeaderFieldsTooLarge => 431,
            RequestError::ContentTooLarge => 413,
            RequestError::NotImplemented(_) => 501,
            RequestError::VersionNotSupported => 505,
            RequestError::ExpectationFailed => 417,
        }
    }
}

/// Parse one request head from the start of `buf`.
///
/// Leading empty lines are skipped (RFC 9112 §2.2). On success the head's
/// `head_len` says where the body (or the next request) starts.
///
/// Every line of the head must end in CRLF: a bare LF is refused (400).
/// RFC 9112 §2.2 lets a recipient accept it, and httparse does, but a front
/// end that does not would frame the message differently; httparse has no
/// option to refuse it. A head it parsed whole is checked after it
/// (`parsed_head_has_bare_lf`: one SIMD pass over its byte pairs); any
/// other buffer is scanned line by line up to the blank line (`bare_lf`),
/// so a bare LF is refused before the head is complete, too.
///
/// A request line of `HTTP/1.x` with a minor version above 1 is served as
/// HTTP/1.1 (RFC 9112 §2.3: a recipient answers in the highest minor
/// version it supports); httparse knows only 1.0 and 1.1, so such a head is
/// parsed from a copy whose version reads `HTTP/1.1`.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<ParseOutcome, RequestError> {
    // Left uninitialised: httparse writes the ones it fills (zeroing 100 headers first was
    // 3.2 KB of stores per request).
    let mut headers =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    const BARE_LF: RequestError = RequestError::BadRequest("bare LF in the request head");
    let status = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) if parsed_head_has_bare_lf(&buf[..n]) => {
            return Err(BARE_LF)
        }
        // A head not parsed whole is scanned line by line: a bare LF is refused as soon as
        // it arrives, and before any other fault httparse found.
        Ok(httparse::Status::Partial) | Err(_) if bare_lf(buf) => return Err(BARE_LF),
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::HeaderFieldsTooLarge),
        Err(httparse::Error::Version) => {
            return match later_minor_version(buf) {
                Some(copy) => parse(&copy, limits),
                None => Err(version_error(buf)),
            }
        }
        Err(httparse::Error::Token) if looks_like_http09(buf) => {
            return Err(RequestError::VersionNotSupported)
        }
        Err(_) => {
            return Err(check_sizes(buf, limits).unwrap_or(RequestError::BadRequest("syntax")))
        }
    };
    let head_len = match status {
        httparse::Status::Partial => {
            return match check_sizes(buf, limits) {
                Some(e) => Err(e),
                None => Ok(ParseOutcome::Partial),
            }
        }
        httparse::Status::Complete(n) => n,
    };
    if let Some(e) = check_sizes(&buf[..head_len], limits) {
        return Err(e);
    }
    let version = match req.version {
        Some(0) => Version::Http10,
        Some(1) => Version::Http11,
        _ => return Err(RequestError::VersionNotSupported),
    };
    let method_token = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let method = Method::from_token(method_token);
    let mut head = RequestHead {
        method,
        method_token: match method.token() {
            Some(t) => t.into(),
            None => method_token.to_owned().into(),
        },
        target: target.to_owned(),
        version,
        host: None,
        keep_alive: version == Version::Http11,
        framing: BodyFraming::None,
        expect_continue: false,
        if_none_match: None,
        if_modified_since: None,
        range: None,
        if_range: None,
        cookie: None,
        cache_report: false,
        copy_ask: None,
        head_len,
        plain: !matches!(buf.first(), Some(b'\r' | b'\n')),
    };
    validate_target(head.method, target)?;

    let mut content_length: Option<u64> = None;
    let mut transfer_codings: Vec<String> = Vec::new();
    let mut saw_te = false;
    let mut host_count = 0;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    for h in req.headers.iter() {
        let name = h.name;
        let value = trim_ows(h.value);
        head.plain &= !crate::upstream::hop_by_hop(name.as_bytes())
            && !name.eq_ignore_ascii_case("x-forwarded-for");
        if name.eq_ignore_ascii_case("host") {
            host_count += 1;
            let v = text(value)?;
            if !valid_host(v) {
                return Err(RequestError::BadRequest("invalid Host"));
            }
            head.host = Some(v.to_owned());
        } else if name.eq_ignore_ascii_case("content-length") {
            if content_length.is_some() {
                return Err(RequestError::BadRequest("duplicate Content-Length"));
            }
            content_length = Some(parse_content_length(value)?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            saw_te = true;
            for coding in text(value)?.split(',') {
                let c = coding.trim_matches([' ', '\t']);
                if c.is_empty() {
                    continue;
                }
                transfer_codings.push(c.to_ascii_lowercase());
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in text(value)?.split(',') {
                let t = token.trim_matches([' ', '\t']);
                if t.eq_ignore_ascii_case("close") {
                    conn_close = true;
                } else if t.eq_ignore_ascii_case("keep-alive") {
                    conn_keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case("expect") {
            if text(value)?.eq_ignore_ascii_case("100-continue") {
                head.expect_continue = true;
            } else {
                return Err(RequestError::ExpectationFailed);
            }
        } else if name.eq_ignore_ascii_case(crate::upstream::RELAY_HEADER) {
            head.cache_report = true;
        } else if name.eq_ignore_ascii_case(crate::upstream::COPY_HEADER) {
            head.copy_ask.get_or_insert(text(value)?.to_owned());
        } else if name.eq_ignore_ascii_case("if-none-match") {
            head.if_none_match.get_or_insert(text(value)?.to_owned());
        } else if name.eq_ignore_ascii_case("if-modified-since") {
            head.if_modified_since
                .get_or_insert(text(value)?.to_owned());
        } else if name.eq_ignore_ascii_case("range") {
            if head.range.is_some() {
                return Err(RequestError::BadRequest("duplicate Range"));
            }
            head.range = Some(text(value)?.to_owned());
        } else if name.eq_ignore_ascii_case("if-range") {
            head.if_range.get_or_insert(text(value)?.to_owned());
        } else if name.eq_ignore_ascii_case("cookie") {
            let v = text(value)?;
            match &mut head.cookie {
                Some(c) => {
                    c.push_str("; ");
                    c.push_str(v);
                }
                None => head.cookie = Some(v.to_owned()),
            }
        }
    }

    if host_count > 1 {
        return Err(RequestError::BadRequest("duplicate Host"));
    }
    if version == Version::Http11 && host_count == 0 {
        return Err(RequestError::BadRequest("missing Host"));
    }
    head.keep_alive = match version {
        Version::Http11 => !conn_close,
        Version::Http10 => conn_keep_alive && !conn_close,
    };

    head.framing = match (saw_te, content_length) {
        (true, Some(_)) => {
            return Err(RequestError::BadRequest(
                "both Content-Length and Transfer-Encoding",
            ))
        }
        (true, None) => {
            if version == Version::Http10 {
                return Err(RequestError::BadRequest("Transfer-Encoding in HTTP/1.0"));
            }
            transfer_framing(&transfer_codings)?
        }
        (false, Some(n)) => {
            if n > limits.max_body_bytes {
                return Err(RequestError::ContentTooLarge);
            }
            if n == 0 {
                BodyFraming::None
            } else {
                BodyFraming::Length(n)
            }
        }
        (false, None) => BodyFraming::None,
    };
    Ok(ParseOutcome::Complete(head))
}

fn transfer_framing(codings: &[String]) -> Result<BodyFraming, RequestError> {
    const KNOWN: [&str; 5] = ["chunked", "gzip", "x-gzip", "deflate", "compress"];
    if codings.is_empty() {
        return Err(RequestError::BadRequest("empty Transfer-Encoding"));
    }
    // RFC 9112 §6.3: without chunked as the final coding the length cannot be
    // determined, which is a 400 whatever the other codings are.
    if codings.last().map(String::as_str) != Some("chunked") {
        return Err(RequestError::BadRequest(
            "chunked is not the final transfer coding",
        ));
    }
    if codings[..codings.len() - 1].iter().any(|c| c == "chunked") {
        return Err(RequestError::BadRequest("chunked applied twice"));
    }
    if codings.iter().any(|c| !KNOWN.contains(&c.as_str())) {
        return Err(RequestError::NotImplemented("unknown transfer coding"));
    }
    if codings.len() > 1 {
        return Err(RequestError::NotImplemented("compressed transfer coding"));
    }
    Ok(BodyFraming::Chunked)
}

/// When no complete head fits, decide between "wait" and 414/431.
fn check_sizes(buf: &[u8], limits: &Limits) -> Option<RequestError> {
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let rest = &buf[start..];
    match rest.iter().position(|&b| b == b'\n') {
        None if rest.len() > limits.max_request_line => Some(RequestError::UriTooLong),
        Some(line) if line > limits.max_request_line => Some(RequestError::UriTooLong),
        _ if buf.len() > limits.max_head_bytes => Some(RequestError::HeaderFieldsTooLarge),
        _ => None,
    }
}

/// httparse reports any unknown version as `Version`, and also a request
/// line whose target holds a space or tab or that has a double space (it
/// then takes the rest for the version). Only a well-formed
/// `method SP target SP HTTP/x.y` line of another version is a 505; any
/// other line is a malformed request, 400.
fn version_error(buf: &[u8]) -> RequestError {
    match request_line_version(first_line(buf)) {
        Some(_) => RequestError::VersionNotSupported,
        None => RequestError::BadRequest("malformed request line"),
    }
}

/// The `(major, minor)` version of a request line made of exactly a method
/// token, one space, a target without spaces or controls, one space and
/// `HTTP/DIGIT.DIGIT`.
fn request_line_version(line: &[u8]) -> Option<(u8, u8)> {
    let mut parts = line.split(|&b| b == b' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || method.is_empty()
        || !method.iter().all(|&b| crate::chunked::is_tchar(b))
        || target.is_empty()
        || target.iter().any(|&b| b <= b' ' || b == 0x7f)
    {
        return None;
    }
    let well_formed = version.len() == 8
        && version.starts_with(b"HTTP/")
        && version[5].is_ascii_digit()
        && version[6] == b'.'
        && version[7].is_ascii_digit();
    well_formed.then(|| (version[5] - b'0', version[7] - b'0'))
}

/// For a head whose request line is well formed with version `HTTP/1.x`,
/// x > 1: a copy of the head (up to its blank line, or all of `buf` while
/// it is incomplete) with the version rewritten to `HTTP/1.1`. The copy has
/// the same length, so its `head_len` holds for `buf`.
fn later_minor_version(buf: &[u8]) -> Option<Vec<u8>> {
    let line = first_line(buf);
    match request_line_version(line)? {
        (1, minor) if minor > 1 => {}
        _ => return None,
    }
    let line_start = line.as_ptr() as usize - buf.as_ptr() as usize;
    let end = buf[line_start..]
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(buf.len(), |p| line_start + p + 4);
    let mut copy = buf[..end].to_vec();
    copy[line_start + line.len() - 1] = b'1';
    Some(copy)
}

/// Whether `head`, a head httparse parsed whole (its bytes up to and
/// including the blank line that ends it), has a LF that no CR precedes.
///
/// One pass over byte pairs with no early exit, which the compiler turns into
/// SIMD compares: a head is a few hundred bytes, and the scan line by line
/// (one search per line) cost about 1,300 instructions per relayed request.
/// A proptest holds this to that scan over heads httparse completes.
pub(crate) fn parsed_head_has_bare_lf(head: &[u8]) -> bool {
    let Some((&first, rest)) = head.split_first() else {
        return false;
    };
    first == b'\n'
        || head.iter().zip(rest).fold(false, |bare, (&before, &b)| {
            bare | ((b == b'\n') & (before != b'\r'))
        })
}

/// Whether a line of the head at the start of `buf` (leading empty lines
/// included, up to and including the blank line that ends it) ends in a LF
/// that no CR precedes: for a buffer httparse did not parse whole.
pub(crate) fn bare_lf(buf: &[u8]) -> bool {
    let mut start = 0;
    let mut in_head = false;
    for nl in memchr::memchr_iter(b'\n', buf) {
        if nl == 0 || buf[nl - 1] != b'\r' {
            return true;
        }
        let empty = nl - start == 1;
        if empty && in_head {
            return false;
        }
        in_head |= !empty;
        start = nl + 1;
    }
    false
}

/// A complete `GET /path` line with no version is an HTTP/0.9 request.
fn looks_like_http09(buf: &[u8]) -> bool {
    let line = first_line(buf);
    if line.len() == buf.len() {
        return false;
    }
    let mut parts = line.split(|&b| b == b' ');
    matches!((parts.next(), parts.next(), parts.next()), (Some(b"GET"), Some(p), None) if p.first() == Some(&b'/'))
}

fn first_line(buf: &[u8]) -> &[u8] {
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let rest = &buf[start..];
    let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let line = &rest[..end];
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn validate_target(method: Method, target: &str) -> Result<(), RequestError> {
    let ok = match method {
        Method::Connect => !target.is_empty() && !target.starts_with('/'),
        Method::Options if target == "*" => true,
        _ => {
            target.starts_with('/')
                || target.starts_with("http://")
                || target.starts_with("https://")
        }
    };
    if ok {
        Ok(())
    } else {
        Err(RequestError::BadRequest("invalid request target"))
    }
}

fn parse_content_length(value: &[u8]) -> Result<u64, RequestError> {
    if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
        return Err(RequestError::BadRequest("invalid Content-Length"));
    }
    let mut n: u64 = 0;
    for &d in value {
        n = n * 10 + u64::from(d - b'0');
    }
    Ok(n)
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |p| p + 1);
    &v[start..end]
}

fn text(v: &[u8]) -> Result<&str, RequestError> {
    std::str::from_utf8(v).map_err(|_| RequestError::BadRequest("non-UTF-8 header value"))
}

fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']' | b'_' | b'%')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A standard method's token is borrowed and names its method; any other is kept as sent.
    #[test]
    fn method_tokens_are_kept_as_sent() {
        use std::borrow::Cow;
        use Method::*;
        for m in [Get, Head, Post, Put, Delete, Options, Patch, Trace, Connect] {
            assert_eq!(Method::from_token(m.token().unwrap()), m);
        }
        assert_eq!(Other.token(), None);
        let head = |b: &[u8]| match parse(b, &Limits::default()) {
            Ok(ParseOutcome::Complete(h)) => h,
            r => panic!("{r:?}"),
        };
        let get = head(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        assert!(matches!(get.method_token, Cow::Borrowed("GET")));
        let other = head(b"PROPFIND / HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(
            (other.method, other.method_token.as_ref()),
            (Other, "PROPFIND")
        );
        // Methods are case-sensitive: a lower-case token is another method.
        let lower = head(b"get / HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!((lower.method, lower.method_token.as_ref()), (Other, "get"));
    }

    /// A head of request (or status) line, fields and blank line, each line ending in CRLF,
    /// LF or a lone CR as `ends` says, values holding CRs, LFs, tabs and spaces as `values`
    /// say, then `rest` (the next message's bytes).
    fn built_head(
        response: bool,
        lead: &[&str],
        ends: &[&str],
        values: &[Vec<u8>],
        rest: &[u8],
    ) -> Vec<u8> {
        let mut b = Vec::new();
        for l in lead {
            b.extend_from_slice(l.as_bytes());
        }
        b.extend_from_slice(if response {
            b"HTTP/1.1 200 OK"
        } else {
            b"GET /a HTTP/1.1"
        });
        let mut ends = ends.iter().cycle();
        b.extend_from_slice(ends.next().unwrap().as_bytes());
        for (i, v) in values.iter().enumerate() {
            b.extend_from_slice(format!("X-{i}:").as_bytes());
            b.extend_from_slice(v);
            b.extend_from_slice(ends.next().unwrap().as_bytes());
        }
        b.extend_from_slice(ends.next().unwrap().as_bytes());
        b.extend_from_slice(rest);
        b
    }

    fn line_end() -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(vec!["\r\n", "\r\n", "\r\n", "\n", "\r", "\r\r\n"])
    }

    fn some_bytes(max: usize) -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            proptest::sample::select(vec![b'a', b'a', b' ', b'\t', b'\r', b'\n']),
            0..max,
        )
    }

    proptest::proptest! {
        // About one generated head in six parses whole: enough cases for a few hundred.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        /// Over any head httparse parses whole, request or response, the pass over byte
        /// pairs finds a bare LF exactly when the scan line by line does.
        #[test]
        fn the_pair_scan_agrees_with_the_line_scan_on_parsed_heads(
            response in proptest::bool::ANY,
            lead in proptest::collection::vec(line_end(), 0..3),
            ends in proptest::collection::vec(line_end(), 1..8),
            values in proptest::collection::vec(some_bytes(6), 0..5),
            rest in some_bytes(8),
        ) {
            let buf = built_head(response, &lead, &ends, &values, &rest);
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let parsed = if response {
                httparse::Response::new(&mut headers).parse(&buf)
            } else {
                httparse::Request::new(&mut headers).parse(&buf)
            };
            if let Ok(httparse::Status::Complete(n)) = parsed {
                proptest::prop_assert_eq!(parsed_head_has_bare_lf(&buf[..n]), bare_lf(&buf));
            }
        }
    }

    #[test]
    fn bare_lf_is_refused_wherever_it_ends_a_line() {
        let ok = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        assert!(matches!(p(ok), Ok(ParseOutcome::Complete(_))));
        // Pipelined bytes after the head are the next request's business.
        assert!(matches!(
            p(&format!("{ok}GET /\n")),
            Ok(ParseOutcome::Complete(_))
        ));
        for bad in [
            "GET / HTTP/1.1\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n\n",
            "\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a \n\r\n",
        ] {
            assert!(
                matches!(p(bad), Err(RequestError::BadRequest(_))),
                "{bad:?}: {:?}",
                p(bad)
            );
        }
    }

    fn p(s: &str) -> Result<ParseOutcome, RequestError> {
        parse(s.as_bytes(), &Limits::default())
    }

    fn head(s: &str) -> RequestHead {
        match p(s) {
            Ok(ParseOutcome::Complete(h)) => h,
            other => panic!("expected a complete head, got {other:?}"),
        }
    }

    #[test]
    fn simple_get() {
        let h = head("GET /a/b?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
        assert_eq!(h.method, Method::Get);
        assert_eq!(h.target, "/a/b?x=1");
        assert_eq!(h.host.as_deref(), Some("example.com"));
        assert!(h.keep_alive);
        assert_eq!(h.framing, BodyFraming::None);
        assert_eq!(h.head_len, 44);
    }

    #[test]
    fn partial_until_blank_line() {
        assert_eq!(
            p("GET / HTTP/1.1\r\nHost: a\r\n").unwrap(),
            ParseOutcome::Partial
        );
        assert_eq!(p("GE").unwrap(), ParseOutcome::Partial);
    }

    #[test]
    fn keep_alive_rules() {
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").keep_alive);
        assert!(
            !head("GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n").keep_alive
        );
    }

    #[test]
    fn host_rules() {
        assert_eq!(
            p("GET / HTTP/1.1\r\n\r\n"),
            Err(RequestError::BadRequest("missing Host"))
        );
        assert_eq!(
            p("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            Err(RequestError::BadRequest("duplicate Host"))
        );
        assert!(p("GET / HTTP/1.1\r\nHost: a b\r\n\r\n").is_err());
    }

    #[test]
    fn smuggling_rules() {
        let both =
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(p(both).unwrap_err().status(), 400);
        let dup = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n";
        assert_eq!(p(dup).unwrap_err().status(), 400);
        let list = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n";
        assert_eq!(p(list).unwrap_err().status(), 400);
        let signed = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n";
        assert_eq!(p(signed).unwrap_err().status(), 400);
        let fold = "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n";
        assert_eq!(p(fold).unwrap_err().status(), 400);
        let te10 = "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(p(te10).unwrap_err().status(), 400);
        let notlast = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n";
        assert_eq!(p(notlast).unwrap_err().status(), 400);
        let twice = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(p(twice).unwrap_err().status(), 400);
        // Without chunked last the length is unknown: 400 (RFC 9112 §6.3), not 501.
        let unknown = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: foo\r\n\r\n";
        assert_eq!(p(unknown).unwrap_err().status(), 400);
        let unknown = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: foo, chunked\r\n\r\n";
        assert_eq!(p(unknown).unwrap_err().status(), 501);
        let gz = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert_eq!(p(gz).unwrap_err().status(), 501);
    }

    #[test]
    fn framing() {
        let h = head("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n");
        assert_eq!(h.framing, BodyFraming::Length(12));
        let h = head("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n");
        assert_eq!(h.framing, BodyFraming::Chunked);
        let big = format!(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            2 << 20
        );
        assert_eq!(p(&big).unwrap_err().status(), 413);
    }

    #[test]
    fn versions() {
        assert_eq!(p("GET / HTTP/2.0\r\n\r\n").unwrap_err().status(), 505);
        assert_eq!(p("GET / HTTP/0.9\r\n\r\n").unwrap_err().status(), 505);
        // A later HTTP/1 minor version is served as HTTP/1.1.
        let h = head("\r\nGET /x HTTP/1.2\r\nHost: a\r\nConnection: close\r\n\r\nGET");
        assert_eq!(h.version, Version::Http11);
        assert_eq!(h.head_len, 49);
        assert!(!h.keep_alive);
        assert_eq!(
            head("GET / HTTP/1.9\r\nHost: a\r\n\r\n").version,
            Version::Http11
        );
        assert_eq!(
            p("GET / HTTP/1.2\r\nHost: a\r\n").unwrap(),
            ParseOutcome::Partial
        );
        assert_eq!(p("GET / HTTP/1.2\r\n\r\n").unwrap_err().status(), 400);
        assert_eq!(p("GET / HTTX/1.1\r\n\r\n").unwrap_err().status(), 400);
        assert_eq!(p("GET /index.html\r\n").unwrap_err().status(), 505);
        assert_eq!(p("GET /index.html\r\n\r\n").unwrap_err().status(), 505);
    }

    #[test]
    fn limits() {
        let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(9000));
        assert_eq!(p(&long).unwrap_err().status(), 414);
        // An unfinished but already over-long request line is refused early.
        let unfinished = format!("GET /{}", "a".repeat(9000));
        assert_eq!(p(&unfinished).unwrap_err().status(), 414);
        let many: String = (0..120).map(|i| format!("X-{i}: v\r\n")).collect();
        let req = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        assert_eq!(p(&req).unwrap_err().status(), 431);
        let fat = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n",
            "b".repeat(17000)
        );
        assert_eq!(p(&fat).unwrap_err().status(), 431);
    }

    #[test]
    fn bad_syntax_and_targets() {
        assert_eq!(
            p("GET  / HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            p("GET foo HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            p("G(T / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap_err().status(),
            400
        );
        assert!(head("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n").target == "*");
        assert_eq!(
            head("BREW / HTTP/1.1\r\nHost: a\r\n\r\n").method,
            Method::Other
        );
    }

    #[test]
    fn expect_and_conditionals() {
        let h =
            head("PUT /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n");
        assert!(h.expect_continue);
        assert_eq!(
            p("GET / HTTP/1.1\r\nHost: a\r\nExpect: tea\r\n\r\n")
                .unwrap_err()
                .status(),
            417
        );
        let h = head("GET / HTTP/1.1\r\nHost: a\r\nIf-None-Match: \"x\"\r\nRange: bytes=0-1\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n");
        assert_eq!(h.if_none_match.as_deref(), Some("\"x\""));
        assert_eq!(h.range.as_deref(), Some("bytes=0-1"));
        assert_eq!(h.cookie.as_deref(), Some("a=1; b=2"));
    }

    /// Malformed request lines are 400, never 505.
    #[test]
    fn malformed_request_lines_are_400() {
        for bad in [
            "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a HTTP/1.1 \r\nHost: a\r\n\r\n",
            "GET /  HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a\nb HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a HTTP/1.1\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n\n",
            "\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a b HTTP/1.2\r\nHost: a\r\n\r\n",
        ] {
            assert_eq!(p(bad).map_err(|e| e.status()), Err(400), "{bad:?}");
        }
        // Bare LF is refused before the head is complete, too.
        assert_eq!(p("GET / HTTP/1.1\nHost").unwrap_err().status(), 400);
        // What follows the head is not scanned: a body may hold bare LFs.
        let h = head("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n\n\n");
        assert_eq!(h.framing, BodyFraming::Length(2));
    }

    #[test]
    fn chunked_not_final_is_400_even_with_unknown_codings() {
        for te in [
            "chunked, identity",
            "chunked, foo",
            "foo, chunked, gzip",
            "identity",
        ] {
            let r = format!("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {te}\r\n\r\n");
            assert_eq!(p(&r).unwrap_err().status(), 400, "{te}");
        }
        let r = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: foo, chunked\r\n\r\n";
        assert_eq!(p(r).unwrap_err().status(), 501);
    }

    #[test]
    fn leading_empty_lines_are_skipped() {
        let h = head("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(h.head_len, 29);
    }
}
