//! Incremental HTTP/1.x response parser.
//!
//! The parser is fed the unconsumed bytes of a connection's read buffer and reports how many
//! bytes it consumed and whether the response is complete. It never copies body data: the load
//! generator only counts it. Heads are parsed with `httparse`; bodies are framed by
//! `Content-Length`, by the chunked transfer coding (decoded with `httparse::parse_chunk_size`)
//! or by the connection closing (RFC 9112 §6.3). Responses to `HEAD` and `1xx`/`204`/`304`
//! responses have no body. Interim `1xx` responses (other than `101`) are skipped.

/// Largest response head (status line and headers) accepted, in bytes.
pub const MAX_HEAD_SIZE: usize = 64 * 1024;
/// Largest chunk-size line accepted, in bytes.
const MAX_CHUNK_LINE: usize = 4096;
/// Most header fields accepted in one response head.
const MAX_HEADERS: usize = 64;

/// How the body of a response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body at all (HEAD, 1xx, 204, 304).
    None,
    /// Exactly this many bytes (`Content-Length`).
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// The body runs until the server closes the connection.
    Close,
}

/// Why a response could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The status line or a header field is malformed.
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    /// The head did not end within [`MAX_HEAD_SIZE`] bytes.
    #[error("response head larger than {MAX_HEAD_SIZE} bytes")]
    HeadTooLarge,
    /// `Content-Length` is not a number, or several disagree.
    #[error("invalid Content-Length")]
    BadContentLength,
    /// A chunk-size line is malformed or too long.
    #[error("invalid chunk size line")]
    BadChunkSize,
    /// Chunk data is not followed by a line break.
    #[error("chunk data not followed by CRLF")]
    BadChunkEnd,
    /// The trailer section did not end within [`MAX_HEAD_SIZE`] bytes.
    #[error("trailer section too large")]
    TrailerTooLarge,
    /// The connection closed before the response was complete.
    #[error("connection closed before the response was complete")]
    Incomplete,
}

/// What is known about the response being parsed (or the one just completed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseInfo {
    /// Status code of the final (non-interim) response; 0 until the head is parsed.
    pub status: u16,
    /// Minor HTTP version of the response (0 or 1).
    pub minor_version: u8,
    /// How the body is delimited.
    pub framing: Framing,
    /// Whether the connection may carry another request after this response.
    pub keep_alive: bool,
    /// Decoded body bytes (chunk framing excluded).
    pub body_bytes: u64,
    /// All bytes consumed for this response, interim responses and framing included.
    pub wire_bytes: u64,
    /// Whether a `Location` header was captured (see [`ResponseParser::location`]).
    pub has_location: bool,
}

impl ResponseInfo {
    const EMPTY: ResponseInfo = ResponseInfo {
        status: 0,
        minor_version: 1,
        framing: Framing::None,
        keep_alive: false,
        body_bytes: 0,
        wire_bytes: 0,
        has_location: false,
    };
}

/// Result of one [`ResponseParser::parse`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Bytes consumed from the front of the buffer; the caller drops them.
    pub consumed: usize,
    /// Whether the response is now complete. When false, every consumable byte was consumed
    /// and more input is needed.
    pub complete: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Body { remaining: u64 },
    ChunkSize,
    ChunkData { remaining: u64 },
    ChunkDataEnd,
    Trailers { seen: usize },
    CloseBody,
    Done,
}

/// Incremental parser for a sequence of responses on one connection.
///
/// Call [`start`](Self::start) before each response, then [`parse`](Self::parse) with the
/// buffered input until it reports completion; at end of input call
/// [`finish_eof`](Self::finish_eof).
#[derive(Debug, Clone)]
pub struct ResponseParser {
    state: State,
    head_request: bool,
    capture_location: bool,
    location: String,
    info: ResponseInfo,
}

impl Default for ResponseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ResponseParser {
    /// A parser expecting the response to a `GET`-like request.
    pub fn new() -> Self {
        ResponseParser {
            state: State::Head,
            head_request: false,
            capture_location: false,
            location: String::new(),
            info: ResponseInfo::EMPTY,
        }
    }

    /// Whether to keep the `Location` header of 3xx responses (off by default).
    pub fn set_capture_location(&mut self, on: bool) {
        self.capture_location = on;
    }

    /// Prepares for the next response; `head_request` says whether it answers a `HEAD`.
    pub fn start(&mut self, head_request: bool) {
        self.state = State::Head;
        self.head_request = head_request;
        self.info = ResponseInfo::EMPTY;
    }

    /// Information about the current or just-completed response.
    pub fn info(&self) -> &ResponseInfo {
        &self.info
    }

    /// The `Location` header of the last 3xx response, when captured.
    pub fn location(&self) -> Option<&str> {
        self.info.has_location.then_some(self.location.as_str())
    }

    /// Whether any byte of the current response has been consumed.
    pub fn started(&self) -> bool {
        self.info.wire_bytes > 0
    }

    /// Whether the current response is complete.
    pub fn is_complete(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes as much of `buf` as belongs to the current response.
    pub fn parse(&mut self, buf: &[u8]) -> Result<Step, ParseError> {
        let mut pos = 0usize;
        loop {
            let avail = &buf[pos..];
            match self.state {
                State::Done => return Ok(self.step(pos, true)),
                State::Head => {
                    if avail.is_empty() {
                        return Ok(self.step(pos, false));
                    }
                    match self.parse_head(avail)? {
                        Some(n) => pos += n,
                        None => {
                            if avail.len() >= MAX_HEAD_SIZE {
                                return Err(ParseError::HeadTooLarge);
                            }
                            return Ok(self.step(pos, false));
                        }
                    }
                }
                State::Body { remaining } => {
                    let take = remaining.min(avail.len() as u64);
                    pos += take as usize;
                    self.info.body_bytes += take;
                    let remaining = remaining - take;
                    if remaining == 0 {
                        self.state = State::Done;
                    } else {
                        self.state = State::Body { remaining };
                        return Ok(self.step(pos, false));
                    }
                }
                State::ChunkSize => match httparse::parse_chunk_size(avail) {
                    Ok(httparse::Status::Complete((n, size))) => {
                        if n > MAX_CHUNK_LINE {
                            return Err(ParseError::BadChunkSize);
                        }
                        pos += n;
                        self.state = if size == 0 {
                            State::Trailers { seen: 0 }
                        } else {
                            State::ChunkData { remaining: size }
                        };
                    }
                    Ok(httparse::Status::Partial) => {
                        if avail.len() >= MAX_CHUNK_LINE {
                            return Err(ParseError::BadChunkSize);
                        }
                        return Ok(self.step(pos, false));
                    }
                    Err(_) => return Err(ParseError::BadChunkSize),
                },
                State::ChunkData { remaining } => {
                    let take = remaining.min(avail.len() as u64);
                    pos += take as usize;
                    self.info.body_bytes += take;
                    let remaining = remaining - take;
                    if remaining == 0 {
                        self.state = State::ChunkDataEnd;
                    } else {
                        self.state = State::ChunkData { remaining };
                        return Ok(self.step(pos, false));
                    }
                }
                State::ChunkDataEnd => match avail {
                    [b'\r', b'\n', ..] => {
                        pos += 2;
                        self.state = State::ChunkSize;
                    }
                    [b'\n', ..] => {
                        pos += 1;
                        self.state = State::ChunkSize;
                    }
                    [] | [b'\r'] => return Ok(self.step(pos, false)),
                    _ => return Err(ParseError::BadChunkEnd),
                },
                State::Trailers { seen } => match memchr_nl(avail) {
                    Some(i) => {
                        let line = &avail[..i];
                        pos += i + 1;
                        if line.is_empty() || line == b"\r" {
                            self.state = State::Done;
                        } else {
                            let seen = seen + i + 1;
                            if seen > MAX_HEAD_SIZE {
                                return Err(ParseError::TrailerTooLarge);
                            }
                            self.state = State::Trailers { seen };
                        }
                    }
                    None => {
                        if seen + avail.len() > MAX_HEAD_SIZE {
                            return Err(ParseError::TrailerTooLarge);
                        }
                        return Ok(self.step(pos, false));
                    }
                },
                State::CloseBody => {
                    pos += avail.len();
                    self.info.body_bytes += avail.len() as u64;
                    return Ok(self.step(pos, false));
                }
            }
        }
    }

    /// Signals that the peer closed the connection. Completes a close-delimited body;
    /// any other unfinished response is an error.
    pub fn finish_eof(&mut self) -> Result<(), ParseError> {
        match self.state {
            State::Done => Ok(()),
            State::CloseBody => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(ParseError::Incomplete),
        }
    }

    fn step(&mut self, consumed: usize, complete: bool) -> Step {
        self.info.wire_bytes += consumed as u64;
        Step { consumed, complete }
    }

    /// Parses a head at the start of `buf`; returns its length, or `None` if incomplete.
    fn parse_head(&mut self, buf: &[u8]) -> Result<Option<usize>, ParseError> {
        // Left uninitialised: httparse writes the ones it fills (zeroing all 64 first, 2 KiB,
        // was about 200 of the generator's 6,000 instructions per response).
        let mut headers =
            [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let n = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut resp,
            buf,
            &mut headers,
        ) {
            Ok(httparse::Status::Complete(n)) if n > MAX_HEAD_SIZE => {
                return Err(ParseError::HeadTooLarge)
            }
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(ParseError::Head(e)),
        };
        let status = resp.code.unwrap_or(0);
        let minor = resp.version.unwrap_or(1);
        if (100..200).contains(&status) && status != 101 {
            // Interim response: consume it and parse the next head.
            return Ok(Some(n));
        }
        let mut content_length: Option<u64> = None;
        let mut transfer_encoding = false;
        let mut chunked_last = false;
        let mut conn_close = false;
        let mut conn_keep_alive = false;
        let mut has_location = false;
        for h in resp.headers.iter() {
            let name = h.name.as_bytes();
            if name.eq_ignore_ascii_case(b"content-length") {
                let v = parse_content_length(h.value)?;
                if content_length.is_some_and(|c| c != v) {
                    return Err(ParseError::BadContentLength);
                }
                content_length = Some(v);
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                transfer_encoding = true;
                chunked_last = last_token(h.value)
                    .map(|t| t.eq_ignore_ascii_case(b"chunked"))
                    .unwrap_or(false);
            } else if name.eq_ignore_ascii_case(b"connection") {
                for token in h.value.split(|&b| b == b',') {
                    let token = trim(token);
                    if token.eq_ignore_ascii_case(b"close") {
                        conn_close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        conn_keep_alive = true;
                    }
                }
            } else if self.capture_location
                && (300..400).contains(&status)
                && name.eq_ignore_ascii_case(b"location")
            {
                if let Ok(v) = std::str::from_utf8(trim(h.value)) {
                    self.location.clear();
                    self.location.push_str(v);
                    has_location = true;
                }
            }
        }
        let framing = if self.head_request || status == 101 || status == 204 || status == 304 {
            Framing::None
        } else if transfer_encoding {
            if chunked_last {
                Framing::Chunked
            } else {
                Framing::Close
            }
        } else if let Some(len) = content_length {
            Framing::Length(len)
        } else {
            Framing::Close
        };
        let keep_alive = framing != Framing::Close
            && status != 101
            && if minor >= 1 {
                !conn_close
            } else {
                conn_keep_alive && !conn_close
            };
        self.info.status = status;
        self.info.minor_version = minor;
        self.info.framing = framing;
        self.info.keep_alive = keep_alive;
        self.info.has_location = has_location;
        self.state = match framing {
            Framing::None | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Body { remaining: n },
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::CloseBody,
        };
        Ok(Some(n))
    }
}

fn parse_content_length(v: &[u8]) -> Result<u64, ParseError> {
    // A list of identical values ("5, 5") is accepted, as RFC 9110 §8.6 allows.
    let mut out: Option<u64> = None;
    for part in v.split(|&b| b == b',') {
        let part = trim(part);
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return Err(ParseError::BadContentLength);
        }
        let n = part
            .iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0'));
        if out.is_some_and(|o| o != n) {
            return Err(ParseError::BadContentLength);
        }
        out = Some(n);
    }
    out.ok_or(ParseError::BadContentLength)
}

fn last_token(v: &[u8]) -> Option<&[u8]> {
    v.split(|&b| b == b',')
        .map(trim)
        .rfind(|t| !t.is_empty())
        .map(|t| {
            // Drop transfer-coding parameters ("chunked;foo=bar" is not valid, but be lenient).
            let end = t.iter().position(|&b| b == b';').unwrap_or(t.len());
            trim(&t[..end])
        })
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &v[start..end.max(start)]
}

fn memchr_nl(v: &[u8]) -> Option<usize> {
    v.iter().position(|&b| b == b'\n')
}

/// One response decoded by [`parse_stream`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedResponse {
    /// Status code.
    pub status: u16,
    /// How the body was delimited.
    pub framing: Framing,
    /// Decoded body length.
    pub body_bytes: u64,
    /// Bytes on the wire, head and framing included.
    pub wire_bytes: u64,
    /// Whether the connection could be reused afterwards.
    pub keep_alive: bool,
    /// The `Location` header, for 3xx responses that carry one.
    pub location: Option<String>,
}

/// Parses a whole byte stream of responses (as received on one connection, then closed),
/// feeding it in pieces of `piece` bytes the way a socket would deliver it.
///
/// `head_requests[i]` says whether response `i` answers a `HEAD` (missing entries: no).
/// Returns the responses decoded and the error that stopped parsing, if any. Used by the
/// fuzz target and the property tests; it must never panic.
pub fn parse_stream(
    data: &[u8],
    head_requests: &[bool],
    piece: usize,
) -> (Vec<ParsedResponse>, Option<ParseError>) {
    let piece = piece.max(1);
    let mut out = Vec::new();
    let mut parser = ResponseParser::new();
    parser.set_capture_location(true);
    parser.start(head_requests.first().copied().unwrap_or(false));
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0usize;
    let finish = |parser: &mut ResponseParser, out: &mut Vec<ParsedResponse>| {
        let info = *parser.info();
        out.push(ParsedResponse {
            status: info.status,
            framing: info.framing,
            body_bytes: info.body_bytes,
            wire_bytes: info.wire_bytes,
            keep_alive: info.keep_alive,
            location: parser.location().map(str::to_owned),
        });
        let next = head_requests.get(out.len()).copied().unwrap_or(false);
        parser.start(next);
    };
    loop {
        // Parse everything buffered.
        loop {
            match parser.parse(&buf) {
                Ok(step) => {
                    buf.drain(..step.consumed);
                    if step.complete {
                        let keep = parser.info().keep_alive;
                        finish(&mut parser, &mut out);
                        if !keep {
                            // Nothing more may follow on this connection.
                            return (out, None);
                        }
                    } else {
                        break;
                    }
                }
                Err(e) => return (out, Some(e)),
            }
        }
        if fed >= data.len() {
            break;
        }
        let end = (fed + piece).min(data.len());
        buf.extend_from_slice(&data[fed..end]);
        fed = end;
    }
    // End of input: the connection closes.
    if !parser.started() && buf.is_empty() {
        return (out, None);
    }
    match parser.finish_eof() {
        Ok(()) => {
            finish(&mut parser, &mut out);
            (out, None)
        }
        Err(e) => (out, Some(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(data: &[u8]) -> (Vec<ParsedResponse>, Option<ParseError>) {
        parse_stream(data, &[], 7)
    }

    #[test]
    fn content_length_and_keep_alive() {
        let (r, e) = one(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(e, None);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].status, 200);
        assert_eq!(r[0].body_bytes, 5);
        assert!(r[0].keep_alive);
        assert_eq!(r[1].status, 404);
        assert_eq!(r[1].body_bytes, 0);
    }

    #[test]
    fn chunked_with_extensions_and_trailers() {
        let data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5;x=y\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n";
        for piece in [1, 2, 3, 100] {
            let (r, e) = parse_stream(data, &[], piece);
            assert_eq!(e, None, "piece {piece}");
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].framing, Framing::Chunked);
            assert_eq!(r[0].body_bytes, 15);
            assert_eq!(r[0].wire_bytes, data.len() as u64);
        }
    }

    #[test]
    fn close_delimited_and_http10() {
        let (r, e) = one(b"HTTP/1.0 200 OK\r\n\r\nabcdef");
        assert_eq!(e, None);
        assert_eq!(r[0].framing, Framing::Close);
        assert_eq!(r[0].body_bytes, 6);
        assert!(!r[0].keep_alive);
        let (r, _) =
            one(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx");
        assert!(r[0].keep_alive);
        let (r, _) = one(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx");
        assert!(!r[0].keep_alive);
        let (r, _) = one(b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 1\r\n\r\nx");
        assert!(!r[0].keep_alive);
    }

    #[test]
    fn no_body_cases() {
        let data = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        let (r, e) = parse_stream(data, &[true, false, false], 5);
        assert_eq!(e, None);
        assert_eq!(r.len(), 3);
        assert!(r
            .iter()
            .all(|r| r.body_bytes == 0 && r.framing == Framing::None));
    }

    #[test]
    fn interim_responses_are_skipped() {
        let data = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let (r, e) = one(data);
        assert_eq!(e, None);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].status, 200);
        assert_eq!(r[0].wire_bytes, data.len() as u64);
    }

    #[test]
    fn errors() {
        assert!(matches!(
            one(b"garbage\r\n\r\n").1,
            Some(ParseError::Head(_))
        ));
        assert_eq!(
            one(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").1,
            Some(ParseError::BadContentLength)
        );
        assert_eq!(
            one(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").1,
            Some(ParseError::BadContentLength)
        );
        assert_eq!(
            one(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc").1,
            Some(ParseError::Incomplete)
        );
        assert_eq!(
            one(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").1,
            Some(ParseError::BadChunkSize)
        );
        assert_eq!(
            one(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc").1,
            Some(ParseError::BadChunkEnd)
        );
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        while big.len() <= MAX_HEAD_SIZE {
            big.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        let (_, e) = parse_stream(&big, &[], 4096);
        assert!(matches!(
            e,
            Some(ParseError::HeadTooLarge) | Some(ParseError::Head(_))
        ));
    }

    #[test]
    fn location_captured_for_redirects() {
        let (r, _) = one(b"HTTP/1.1 302 Found\r\nLocation:  /next \r\nContent-Length: 0\r\n\r\n");
        assert_eq!(r[0].location.as_deref(), Some("/next"));
        let (r, _) = one(b"HTTP/1.1 200 OK\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(r[0].location, None);
    }

    #[test]
    fn empty_stream_is_no_response() {
        assert_eq!(one(b""), (vec![], None));
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        struct Gen {
            status: u16,
            chunked: Option<usize>,
            body: usize,
            head: bool,
            pad_headers: usize,
        }

        fn gen() -> impl Strategy<Value = Gen> {
            (
                prop::sample::select(vec![200u16, 204, 206, 301, 302, 304, 404, 500]),
                prop::option::of(1usize..700),
                0usize..3000,
                any::<bool>(),
                0usize..4,
            )
                .prop_map(|(status, chunked, body, head, pad_headers)| Gen {
                    status,
                    chunked,
                    body,
                    head,
                    pad_headers,
                })
        }

        /// Encodes a response; returns the bytes and the body length a client decodes.
        fn encode(g: &Gen, close_delimited: bool) -> (Vec<u8>, u64, Framing) {
            let no_body = g.head || g.status == 204 || g.status == 304;
            let mut v = format!("HTTP/1.1 {} Reason Phrase\r\n", g.status).into_bytes();
            for i in 0..g.pad_headers {
                v.extend_from_slice(format!("X-Pad-{i}: {}\r\n", "v".repeat(i * 7)).as_bytes());
            }
            if g.status / 100 == 3 && g.status != 304 {
                v.extend_from_slice(b"Location: /elsewhere\r\n");
            }
            let body = vec![b'b'; g.body];
            let framing;
            if close_delimited && !no_body {
                v.extend_from_slice(b"Connection: close\r\n\r\n");
                v.extend_from_slice(&body);
                framing = Framing::Close;
            } else if let Some(c) = g.chunked {
                v.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                if no_body {
                    return (v, 0, Framing::None);
                }
                for part in body.chunks(c) {
                    v.extend_from_slice(format!("{:X};ext=1\r\n", part.len()).as_bytes());
                    v.extend_from_slice(part);
                    v.extend_from_slice(b"\r\n");
                }
                v.extend_from_slice(b"0\r\nTrailer: x\r\n\r\n");
                framing = Framing::Chunked;
            } else {
                v.extend_from_slice(format!("Content-Length: {}\r\n\r\n", g.body).as_bytes());
                if no_body {
                    return (v, 0, Framing::None);
                }
                v.extend_from_slice(&body);
                framing = Framing::Length(g.body as u64);
            }
            (v, if no_body { 0 } else { g.body as u64 }, framing)
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

            #[test]
            fn arbitrary_bytes_never_panic(
                data in prop::collection::vec(any::<u8>(), 0..2048),
                piece in 1usize..64,
                heads in prop::collection::vec(any::<bool>(), 0..4),
            ) {
                let whole = parse_stream(&data, &heads, data.len().max(1));
                let cut = parse_stream(&data, &heads, piece);
                prop_assert_eq!(&whole.0, &cut.0);
                prop_assert_eq!(whole.1.is_some(), cut.1.is_some());
            }

            #[test]
            fn mutated_responses_never_panic(
                g in gen(),
                flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                piece in 1usize..50,
            ) {
                let (mut bytes, _, _) = encode(&g, false);
                for (i, b) in flips {
                    let i = i.index(bytes.len());
                    bytes[i] = b;
                }
                let whole = parse_stream(&bytes, &[g.head], bytes.len());
                let cut = parse_stream(&bytes, &[g.head], piece);
                prop_assert_eq!(&whole.0, &cut.0);
                prop_assert_eq!(whole.1.is_some(), cut.1.is_some());
            }

            #[test]
            fn encoded_responses_round_trip(
                gens in prop::collection::vec(gen(), 1..6),
                last_close in any::<bool>(),
                piece in 1usize..1500,
            ) {
                let mut stream = Vec::new();
                let mut want = Vec::new();
                let heads: Vec<bool> = gens.iter().map(|g| g.head).collect();
                for (i, g) in gens.iter().enumerate() {
                    let close = last_close && i + 1 == gens.len();
                    let (bytes, body, framing) = encode(g, close);
                    want.push((g.status, body, bytes.len() as u64, framing));
                    stream.extend_from_slice(&bytes);
                }
                let (got, err) = parse_stream(&stream, &heads, piece);
                prop_assert_eq!(err, None);
                let got: Vec<(u16, u64, u64, Framing)> = got
                    .iter()
                    .map(|r| (r.status, r.body_bytes, r.wire_bytes, r.framing))
                    .collect();
                prop_assert_eq!(got, want);
            }
        }
    }
}
