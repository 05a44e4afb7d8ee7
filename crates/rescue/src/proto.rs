//! The rescue protocol's messages and their text form (seed 001 §4.4.2, Fig. 7). No I/O.
//!
//! Every message is one line of printable ASCII ending in `\n` (a `\r` right before it is
//! ignored). The first token is the sender's sequence number; a *request* continues with a
//! command (first character a letter, case-insensitive) and its parameters, a *response* with a
//! three-digit code, one reason word and, for an accepted SOS, its parameters. Tokens are
//! separated by exactly one space; numbers are decimal without sign or leading zeros.
//!
//! ```text
//! <seq> SOS <origin FQDN> <origin IP> <web port> <MaxIdle s> [<wanted D_alloc kB/s>]
//! <seq> RATE <D_redi kB/s>
//! <seq> SHUTDOWN
//! <seq> 200 OK                                   answer to RATE and SHUTDOWN
//! <seq> 200 OK <alias> <IP> <web port> <D_redi kB/s>   SOS accepted
//! <seq> 403 Reject                               SOS refused
//! <seq> 400 BadRequest | 404 NoRelationship | 501 Unknown
//! ```
//!
//! The paper fixes SOS, RATE, SHUTDOWN, `200 OK` and `403 Reject`. The other codes, the optional
//! fifth SOS parameter (the allocation the origin asks for; without it the rescue server grants
//! what it can) and the limits below are this implementation's choices. Rates are whole kB/s
//! (1 kB = 1000 B, Table 1) as in the paper's example.
//!
//! Parsing is written by hand: the grammar is a handful of space-separated tokens, and the
//! limits (line length, name syntax, number ranges) are the point of the parser.

use std::fmt::Write as _;
use std::net::IpAddr;

/// Longest line accepted or produced, counting the final `\n`.
pub const MAX_LINE: usize = 512;
/// Longest host name (RFC 1035).
pub const MAX_NAME: usize = 253;
/// Longest reason word of a response.
pub const MAX_REASON: usize = 32;
/// Largest rate on the wire, in kB/s (a petabyte per second).
pub const MAX_RATE_KBPS: u64 = 1_000_000_000_000;

/// A sequence number: each side numbers its own requests; a response carries the number of the
/// request it answers.
pub type Seq = u32;

/// Response codes (§4.4.2 defines 200 and 403; the others are this implementation's).
pub mod code {
    /// Request done; for SOS: accepted, with the grant's parameters.
    pub const OK: u16 = 200;
    /// The request was malformed.
    pub const BAD_REQUEST: u16 = 400;
    /// SOS refused.
    pub const REJECT: u16 = 403;
    /// RATE from a peer that is not one of this server's rescue servers.
    pub const NO_RELATIONSHIP: u16 = 404;
    /// Unknown command.
    pub const UNKNOWN_COMMAND: u16 = 501;

    /// The reason word sent with a code.
    pub fn reason(code: u16) -> &'static str {
        match code {
            OK => "OK",
            BAD_REQUEST => "BadRequest",
            REJECT => "Reject",
            NO_RELATIONSHIP => "NoRelationship",
            UNKNOWN_COMMAND => "Unknown",
            _ => "Error",
        }
    }
}

/// Why a line is not a valid message (or a message cannot be written as one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// No `\n` within [`MAX_LINE`] bytes, or an encoded message would exceed it.
    #[error("line longer than {limit} bytes")]
    LineTooLong {
        /// The limit.
        limit: usize,
    },
    /// The line is empty.
    #[error("empty line")]
    Empty,
    /// A byte that is not printable ASCII.
    #[error("byte {byte:#04x} at offset {at} is not printable ASCII")]
    BadByte {
        /// The byte.
        byte: u8,
        /// Its offset in the line.
        at: usize,
    },
    /// A leading, trailing or doubled space.
    #[error("tokens must be separated by exactly one space")]
    BadSpacing,
    /// The first token is not a sequence number.
    #[error("bad sequence number `{0}`")]
    BadSeq(String),
    /// The second token is neither a command nor a three-digit code.
    #[error("`{0}` is neither a command nor a response code")]
    NotAMessage(String),
    /// A command this implementation does not know.
    #[error("unknown command `{0}`")]
    UnknownCommand(String),
    /// A parameter is missing.
    #[error("{command}: missing parameter {param}")]
    MissingParam {
        /// The command or response.
        command: &'static str,
        /// The parameter.
        param: &'static str,
    },
    /// More parameters than the message takes.
    #[error("{command}: unexpected parameter `{extra}`")]
    ExtraParam {
        /// The command or response.
        command: &'static str,
        /// The first surplus token.
        extra: String,
    },
    /// A parameter is out of range or malformed.
    #[error("bad {param} `{value}`")]
    BadParam {
        /// The parameter.
        param: &'static str,
        /// Its text (shortened).
        value: String,
    },
    /// A response code outside 100..=599, or a 1xx/2xx code other than 200.
    #[error("unexpected response code {0}")]
    BadCode(u16),
    /// The reason word is not what the code requires.
    #[error("bad reason `{0}`")]
    BadReason(String),
}

fn bad(param: &'static str, value: &str) -> ProtoError {
    let mut v: String = value.chars().take(40).collect();
    if value.len() > 40 {
        v.push('…');
    }
    ProtoError::BadParam { param, value: v }
}

/// An SOS request: an origin asks for rescue (§4.4.3).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Sos {
    /// The origin's fully qualified domain name.
    pub fqdn: String,
    /// The origin's IP address (rescue servers fetch from it, bypassing DNS round robin).
    pub ip: IpAddr,
    /// The origin's web port.
    pub port: u16,
    /// Seconds without rescue traffic after which the rescue server ends the relationship.
    pub max_idle_secs: u32,
    /// The allocation the origin asks for, kB/s; `None`: as much as the rescue server can give.
    pub want_kbps: Option<u64>,
}

/// The parameters of an accepted SOS (`200 OK <alias> <IP> <port> <D_redi>`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Grant {
    /// The virtual host name the rescue server assigned to the origin.
    pub alias: String,
    /// The rescue server's IP address.
    pub ip: IpAddr,
    /// The rescue server's web port.
    pub port: u16,
    /// The initial D_redi(S_o, S_r): the most the origin may redirect to it, kB/s.
    pub d_redi_kbps: u64,
}

/// A request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Request {
    /// Origin → rescue server: start a rescue relationship.
    Sos(Sos),
    /// Rescue server → origin: the new D_redi, kB/s.
    Rate {
        /// D_redi in kB/s.
        kbps: u64,
    },
    /// Either side: end the relationship.
    Shutdown,
}

/// Which request a [`Request`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum RequestKind {
    /// SOS.
    Sos,
    /// RATE.
    Rate,
    /// SHUTDOWN.
    Shutdown,
}

impl RequestKind {
    /// The command word.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::Sos => "SOS",
            RequestKind::Rate => "RATE",
            RequestKind::Shutdown => "SHUTDOWN",
        }
    }
}

impl Request {
    /// Its kind.
    pub fn kind(&self) -> RequestKind {
        match self {
            Request::Sos(_) => RequestKind::Sos,
            Request::Rate { .. } => RequestKind::Rate,
            Request::Shutdown => RequestKind::Shutdown,
        }
    }
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Response {
    /// `200 OK` without parameters: RATE or SHUTDOWN done.
    Ok,
    /// `200 OK` with a grant: SOS accepted.
    Granted(Grant),
    /// Any code from 300 to 599 (`403 Reject`, `400 BadRequest`, ...).
    Refused {
        /// The code.
        code: u16,
        /// The reason word.
        reason: String,
    },
}

impl Response {
    /// A refusal with `code` and its usual reason word.
    pub fn refused(code: u16) -> Response {
        Response::Refused {
            code,
            reason: code::reason(code).to_string(),
        }
    }

    /// `403 Reject`.
    pub fn reject() -> Response {
        Response::refused(code::REJECT)
    }

    /// The response code.
    pub fn code(&self) -> u16 {
        match self {
            Response::Ok | Response::Granted(_) => code::OK,
            Response::Refused { code, .. } => *code,
        }
    }

    /// Whether this is a possible answer to a request of `kind`: SOS gets a grant or a refusal,
    /// RATE and SHUTDOWN get `200 OK` or a refusal.
    pub fn answers(&self, kind: RequestKind) -> bool {
        match self {
            Response::Refused { .. } => true,
            Response::Granted(_) => kind == RequestKind::Sos,
            Response::Ok => kind != RequestKind::Sos,
        }
    }
}

/// One protocol line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A request numbered by its sender.
    Request {
        /// The sender's sequence number.
        seq: Seq,
        /// The request.
        request: Request,
    },
    /// A response to the peer's request `seq`.
    Response {
        /// The number of the request answered.
        seq: Seq,
        /// The response.
        response: Response,
    },
}

/// Whether `s` is a host name: 1 to 253 characters, dot-separated labels of 1 to 63 letters,
/// digits, `-` or `_`, no label starting or ending with `-`.
pub fn valid_name(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_NAME {
        return false;
    }
    s.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

fn valid_reason(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_REASON && s.bytes().all(|b| b.is_ascii_graphic())
}

/// A decimal number: digits only, no leading zero (except `0` itself), at most `max`.
fn parse_num(tok: &str, max: u64) -> Option<u64> {
    let b = tok.as_bytes();
    if b.is_empty() || b.len() > 20 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if b.len() > 1 && b[0] == b'0' {
        return None;
    }
    let v = tok.parse::<u64>().ok()?;
    (v <= max).then_some(v)
}

fn parse_port(tok: &str) -> Result<u16, ProtoError> {
    match parse_num(tok, u16::MAX as u64) {
        Some(p) if p > 0 => Ok(p as u16),
        _ => Err(bad("port", tok)),
    }
}

fn parse_ip(tok: &str) -> Result<IpAddr, ProtoError> {
    // Only the plain dotted-quad and RFC 5952 text forms; no zone identifiers.
    if tok.len() > 45
        || !tok
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'.' || b == b':')
    {
        return Err(bad("IP address", tok));
    }
    tok.parse().map_err(|_| bad("IP address", tok))
}

fn parse_rate(tok: &str) -> Result<u64, ProtoError> {
    parse_num(tok, MAX_RATE_KBPS).ok_or_else(|| bad("rate", tok))
}

fn parse_name(tok: &str, param: &'static str) -> Result<String, ProtoError> {
    if valid_name(tok) {
        Ok(tok.to_string())
    } else {
        Err(bad(param, tok))
    }
}

/// Checks the bytes of a line (without its terminator) and splits it into tokens.
fn tokens(line: &[u8]) -> Result<Vec<&str>, ProtoError> {
    if line.is_empty() {
        return Err(ProtoError::Empty);
    }
    if line.len() >= MAX_LINE {
        return Err(ProtoError::LineTooLong { limit: MAX_LINE });
    }
    if let Some(at) = line
        .iter()
        .position(|&b| !(b == b' ' || b.is_ascii_graphic()))
    {
        return Err(ProtoError::BadByte { byte: line[at], at });
    }
    // Printable ASCII is UTF-8.
    let s = std::str::from_utf8(line).map_err(|_| ProtoError::BadByte { byte: 0, at: 0 })?;
    let toks: Vec<&str> = s.split(' ').collect();
    if toks.iter().any(|t| t.is_empty()) {
        return Err(ProtoError::BadSpacing);
    }
    Ok(toks)
}

fn parse_seq(tok: &str) -> Result<Seq, ProtoError> {
    parse_num(tok, Seq::MAX as u64)
        .map(|v| v as Seq)
        .ok_or_else(|| ProtoError::BadSeq(tok.chars().take(20).collect()))
}

struct Params<'a> {
    command: &'static str,
    toks: std::slice::Iter<'a, &'a str>,
}

impl<'a> Params<'a> {
    fn next(&mut self, param: &'static str) -> Result<&'a str, ProtoError> {
        self.toks.next().copied().ok_or(ProtoError::MissingParam {
            command: self.command,
            param,
        })
    }

    fn end(mut self) -> Result<(), ProtoError> {
        match self.toks.next() {
            None => Ok(()),
            Some(t) => Err(ProtoError::ExtraParam {
                command: self.command,
                extra: t.chars().take(40).collect(),
            }),
        }
    }
}

impl Message {
    /// The message's sequence number.
    pub fn seq(&self) -> Seq {
        match self {
            Message::Request { seq, .. } | Message::Response { seq, .. } => *seq,
        }
    }

    /// Decodes one line, without its `\n` (and without the `\r` before it, if any).
    pub fn decode(line: &[u8]) -> Result<Message, ProtoError> {
        let toks = tokens(line)?;
        let seq = parse_seq(toks[0])?;
        let Some(&word) = toks.get(1) else {
            return Err(ProtoError::NotAMessage(String::new()));
        };
        let first = word.as_bytes()[0];
        if first.is_ascii_alphabetic() {
            let request = decode_request(word, &toks[2..])?;
            Ok(Message::Request { seq, request })
        } else if first.is_ascii_digit() {
            let response = decode_response(word, &toks[2..])?;
            Ok(Message::Response { seq, response })
        } else {
            Err(ProtoError::NotAMessage(word.chars().take(20).collect()))
        }
    }

    /// For a line that does not decode: its sequence number if it reads as a request (a valid
    /// number, then a word starting with a letter), so that the receiver can answer it.
    pub fn request_seq(line: &[u8]) -> Option<Seq> {
        let toks = tokens(line).ok()?;
        let seq = parse_seq(toks[0]).ok()?;
        toks.get(1)
            .filter(|w| w.as_bytes()[0].is_ascii_alphabetic())
            .map(|_| seq)
    }

    /// Appends the message's line, `\n` included, to `out`. Fails (leaving `out` as it was) if a
    /// parameter cannot be written: a bad host name or reason, port 0, MaxIdle 0, a rate above
    /// [`MAX_RATE_KBPS`], or a line over [`MAX_LINE`].
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        let mut s = String::with_capacity(64);
        let _ = write!(s, "{}", self.seq());
        match self {
            Message::Request { request, .. } => match request {
                Request::Sos(sos) => {
                    if !valid_name(&sos.fqdn) {
                        return Err(bad("FQDN", &sos.fqdn));
                    }
                    if sos.port == 0 {
                        return Err(bad("port", "0"));
                    }
                    if sos.max_idle_secs == 0 {
                        return Err(bad("MaxIdle", "0"));
                    }
                    let _ = write!(
                        s,
                        " SOS {} {} {} {}",
                        sos.fqdn, sos.ip, sos.port, sos.max_idle_secs
                    );
                    if let Some(w) = sos.want_kbps {
                        check_rate(w)?;
                        let _ = write!(s, " {w}");
                    }
                }
                Request::Rate { kbps } => {
                    check_rate(*kbps)?;
                    let _ = write!(s, " RATE {kbps}");
                }
                Request::Shutdown => s.push_str(" SHUTDOWN"),
            },
            Message::Response { response, .. } => match response {
                Response::Ok => s.push_str(" 200 OK"),
                Response::Granted(g) => {
                    if !valid_name(&g.alias) {
                        return Err(bad("alias", &g.alias));
                    }
                    if g.port == 0 {
                        return Err(bad("port", "0"));
                    }
                    check_rate(g.d_redi_kbps)?;
                    let _ = write!(
                        s,
                        " 200 OK {} {} {} {}",
                        g.alias, g.ip, g.port, g.d_redi_kbps
                    );
                }
                Response::Refused { code, reason } => {
                    if !(300..=599).contains(code) {
                        return Err(ProtoError::BadCode(*code));
                    }
                    if !valid_reason(reason) {
                        return Err(ProtoError::BadReason(reason.chars().take(40).collect()));
                    }
                    let _ = write!(s, " {code} {reason}");
                }
            },
        }
        if s.len() + 1 > MAX_LINE {
            return Err(ProtoError::LineTooLong { limit: MAX_LINE });
        }
        out.extend_from_slice(s.as_bytes());
        out.push(b'\n');
        Ok(())
    }

    /// The message's line, `\n` included.
    pub fn to_line(&self) -> Result<Vec<u8>, ProtoError> {
        let mut v = Vec::new();
        self.encode(&mut v)?;
        Ok(v)
    }
}

fn check_rate(kbps: u64) -> Result<(), ProtoError> {
    if kbps > MAX_RATE_KBPS {
        return Err(bad("rate", &kbps.to_string()));
    }
    Ok(())
}

fn decode_request(word: &str, rest: &[&str]) -> Result<Request, ProtoError> {
    if word.eq_ignore_ascii_case("SOS") {
        let mut p = Params {
            command: "SOS",
            toks: rest.iter(),
        };
        let fqdn = parse_name(p.next("FQDN")?, "FQDN")?;
        let ip = parse_ip(p.next("IP address")?)?;
        let port = parse_port(p.next("port")?)?;
        let idle = p.next("MaxIdle")?;
        let max_idle_secs = match parse_num(idle, u32::MAX as u64) {
            Some(v) if v > 0 => v as u32,
            _ => return Err(bad("MaxIdle", idle)),
        };
        let want_kbps = match p.toks.next() {
            Some(t) => Some(parse_rate(t)?),
            None => None,
        };
        p.end()?;
        Ok(Request::Sos(Sos {
            fqdn,
            ip,
            port,
            max_idle_secs,
            want_kbps,
        }))
    } else if word.eq_ignore_ascii_case("RATE") {
        let mut p = Params {
            command: "RATE",
            toks: rest.iter(),
        };
        let kbps = parse_rate(p.next("rate")?)?;
        p.end()?;
        Ok(Request::Rate { kbps })
    } else if word.eq_ignore_ascii_case("SHUTDOWN") {
        Params {
            command: "SHUTDOWN",
            toks: rest.iter(),
        }
        .end()?;
        Ok(Request::Shutdown)
    } else {
        Err(ProtoError::UnknownCommand(word.chars().take(20).collect()))
    }
}

fn decode_response(word: &str, rest: &[&str]) -> Result<Response, ProtoError> {
    if word.len() != 3 || !word.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ProtoError::NotAMessage(word.chars().take(20).collect()));
    }
    let code: u16 = word.parse().map_err(|_| ProtoError::BadCode(0))?;
    let mut p = Params {
        command: "response",
        toks: rest.iter(),
    };
    let reason = p.next("reason")?;
    if !valid_reason(reason) {
        return Err(ProtoError::BadReason(reason.chars().take(40).collect()));
    }
    match code {
        code::OK => {
            if !reason.eq_ignore_ascii_case("OK") {
                return Err(ProtoError::BadReason(reason.to_string()));
            }
            if rest.len() == 1 {
                return Ok(Response::Ok);
            }
            p.command = "200 OK";
            let alias = parse_name(p.next("alias")?, "alias")?;
            let ip = parse_ip(p.next("IP address")?)?;
            let port = parse_port(p.next("port")?)?;
            let d_redi_kbps = parse_rate(p.next("rate")?)?;
            p.end()?;
            Ok(Response::Granted(Grant {
                alias,
                ip,
                port,
                d_redi_kbps,
            }))
        }
        300..=599 => {
            p.end()?;
            Ok(Response::Refused {
                code,
                reason: reason.to_string(),
            })
        }
        other => Err(ProtoError::BadCode(other)),
    }
}

/// Splits a byte stream into lines, refusing any line longer than [`MAX_LINE`].
///
/// Feed it what the connection delivers with [`LineReader::push`] and take complete lines with
/// [`LineReader::next_line`]. After an error the reader stays failed: the stream can no longer
/// be trusted to be in step, and the connection should close.
#[derive(Debug, Default, Clone)]
pub struct LineReader {
    buf: Vec<u8>,
    start: usize,
    failed: bool,
}

impl LineReader {
    /// An empty reader.
    pub fn new() -> Self {
        LineReader::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed {
            return;
        }
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as a line.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete line, without `\n` and without a `\r` before it; `Ok(None)` until one
    /// is complete. A line of [`MAX_LINE`] bytes or more (terminator included) is an error.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, ProtoError> {
        if self.failed {
            return Err(ProtoError::LineTooLong { limit: MAX_LINE });
        }
        let avail = &self.buf[self.start..];
        let window = &avail[..avail.len().min(MAX_LINE)];
        match window.iter().position(|&b| b == b'\n') {
            Some(i) => {
                let mut line = &avail[..i];
                if line.last() == Some(&b'\r') {
                    line = &line[..line.len() - 1];
                }
                let out = line.to_vec();
                self.start += i + 1;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                } else if self.start > 4096 {
                    self.buf.drain(..self.start);
                    self.start = 0;
                }
                Ok(Some(out))
            }
            None if avail.len() >= MAX_LINE => {
                self.failed = true;
                self.buf = Vec::new();
                self.start = 0;
                Err(ProtoError::LineTooLong { limit: MAX_LINE })
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Result<Message, ProtoError> {
        Message::decode(s.as_bytes())
    }

    fn roundtrip(s: &str) {
        let m = dec(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(m.to_line().unwrap(), format!("{s}\n").into_bytes(), "{s}");
    }

    #[test]
    fn figure_7_lines_round_trip() {
        for s in [
            "1 SOS www.origin.com 1.2.3.4 8080 600",
            "1 200 OK www-vh1.rescue.com 5.6.7.8 8080 100",
            "1 RATE 60",
            "1 200 OK",
            "2 RATE 50",
            "3 RATE 100",
            "2 SHUTDOWN",
            "2 200 OK",
            "1 403 Reject",
        ] {
            roundtrip(s);
        }
    }

    #[test]
    fn decodes_typed_values() {
        assert_eq!(
            dec("7 sos a.example 2001:db8::1 80 300 5000").unwrap(),
            Message::Request {
                seq: 7,
                request: Request::Sos(Sos {
                    fqdn: "a.example".into(),
                    ip: "2001:db8::1".parse().unwrap(),
                    port: 80,
                    max_idle_secs: 300,
                    want_kbps: Some(5000),
                })
            }
        );
        assert_eq!(
            dec("9 Rate 0").unwrap(),
            Message::Request {
                seq: 9,
                request: Request::Rate { kbps: 0 }
            }
        );
        assert_eq!(
            dec("4294967295 404 NoRelationship").unwrap(),
            Message::Response {
                seq: u32::MAX,
                response: Response::refused(code::NO_RELATIONSHIP)
            }
        );
        assert_eq!(
            dec("3 200 ok").unwrap(),
            Message::Response {
                seq: 3,
                response: Response::Ok
            }
        );
    }

    #[test]
    fn rejects_malformed_lines() {
        use ProtoError::*;
        type Expect = fn(&ProtoError) -> bool;
        let cases: &[(&str, Expect)] = &[
            ("", |e| *e == Empty),
            (" 1 SHUTDOWN", |e| *e == BadSpacing),
            ("1  SHUTDOWN", |e| *e == BadSpacing),
            ("1 SHUTDOWN ", |e| *e == BadSpacing),
            ("01 SHUTDOWN", |e| matches!(e, BadSeq(_))),
            ("4294967296 SHUTDOWN", |e| matches!(e, BadSeq(_))),
            ("-1 SHUTDOWN", |e| matches!(e, BadSeq(_))),
            ("1", |e| matches!(e, NotAMessage(_))),
            ("1 _X", |e| matches!(e, NotAMessage(_))),
            ("1 HELLO", |e| matches!(e, UnknownCommand(_))),
            ("1 SHUTDOWN now", |e| matches!(e, ExtraParam { .. })),
            ("1 RATE", |e| matches!(e, MissingParam { .. })),
            ("1 RATE 1.5", |e| {
                matches!(e, BadParam { param: "rate", .. })
            }),
            ("1 RATE 1000000000001", |e| matches!(e, BadParam { .. })),
            ("1 SOS bad..name 1.2.3.4 80 1", |e| {
                matches!(e, BadParam { param: "FQDN", .. })
            }),
            ("1 SOS -a.b 1.2.3.4 80 1", |e| matches!(e, BadParam { .. })),
            ("1 SOS a.b 1.2.3 80 1", |e| matches!(e, BadParam { .. })),
            ("1 SOS a.b fe80::1%eth0 80 1", |e| {
                matches!(e, BadParam { .. })
            }),
            ("1 SOS a.b 1.2.3.4 0 1", |e| {
                matches!(e, BadParam { param: "port", .. })
            }),
            ("1 SOS a.b 1.2.3.4 65536 1", |e| {
                matches!(e, BadParam { .. })
            }),
            ("1 SOS a.b 1.2.3.4 80 0", |e| {
                matches!(
                    e,
                    BadParam {
                        param: "MaxIdle",
                        ..
                    }
                )
            }),
            ("1 SOS a.b 1.2.3.4 80 1 2 3", |e| {
                matches!(e, ExtraParam { .. })
            }),
            ("1 200 OK a.b 1.2.3.4 80", |e| {
                matches!(e, MissingParam { .. })
            }),
            ("1 200 Fine", |e| matches!(e, BadReason(_))),
            ("1 201 OK", |e| *e == BadCode(201)),
            ("1 099 X", |e| *e == BadCode(99)),
            ("1 20 OK", |e| matches!(e, NotAMessage(_))),
            ("1 403 Reject now", |e| matches!(e, ExtraParam { .. })),
            ("1 403", |e| matches!(e, MissingParam { .. })),
            ("1 RATE\t5", |e| matches!(e, BadByte { byte: b'\t', at: 6 })),
            ("1 SOS é.b 1.2.3.4 80 1", |e| matches!(e, BadByte { .. })),
        ];
        for (line, ok) in cases {
            let e = dec(line).expect_err(line);
            assert!(ok(&e), "{line:?}: {e:?}");
        }
        let long = format!("1 SOS {} 1.2.3.4 80 1", "a".repeat(600));
        assert_eq!(dec(&long), Err(ProtoError::LineTooLong { limit: MAX_LINE }));
    }

    #[test]
    fn request_seq_of_bad_requests() {
        assert_eq!(Message::request_seq(b"12 HELLO"), Some(12));
        assert_eq!(Message::request_seq(b"12 RATE x"), Some(12));
        assert_eq!(Message::request_seq(b"12 200 x"), None);
        assert_eq!(Message::request_seq(b"x RATE 1"), None);
    }

    #[test]
    fn encode_refuses_what_cannot_be_read_back() {
        let sos = |fqdn: &str, port, idle| Message::Request {
            seq: 1,
            request: Request::Sos(Sos {
                fqdn: fqdn.into(),
                ip: [1, 2, 3, 4].into(),
                port,
                max_idle_secs: idle,
                want_kbps: None,
            }),
        };
        assert!(sos("a b", 80, 1).to_line().is_err());
        assert!(sos("a.b", 0, 1).to_line().is_err());
        assert!(sos("a.b", 80, 0).to_line().is_err());
        assert!(sos("a.b", 80, 1).to_line().is_ok());
        let refused = |code, reason: &str| Message::Response {
            seq: 1,
            response: Response::Refused {
                code,
                reason: reason.into(),
            },
        };
        assert!(refused(200, "OK").to_line().is_err());
        assert!(refused(403, "two words").to_line().is_err());
        assert!(refused(403, "").to_line().is_err());
        let rate = Message::Request {
            seq: 1,
            request: Request::Rate {
                kbps: MAX_RATE_KBPS + 1,
            },
        };
        assert!(rate.to_line().is_err());
        let mut out = b"keep".to_vec();
        assert!(refused(700, "x").encode(&mut out).is_err());
        assert_eq!(out, b"keep");
    }

    #[test]
    fn line_reader_splits_and_limits() {
        let mut r = LineReader::new();
        r.push(b"1 RATE 5\r\n2 SHUT");
        assert_eq!(r.next_line().unwrap().unwrap(), b"1 RATE 5");
        assert_eq!(r.next_line().unwrap(), None);
        assert_eq!(r.pending(), 6);
        r.push(b"DOWN\n");
        assert_eq!(r.next_line().unwrap().unwrap(), b"2 SHUTDOWN");
        assert_eq!(r.next_line().unwrap(), None);
        assert_eq!(r.pending(), 0);

        let mut r = LineReader::new();
        r.push(&[b'a'; MAX_LINE - 1]);
        assert_eq!(r.next_line().unwrap(), None);
        r.push(b"\n");
        assert_eq!(r.next_line().unwrap().unwrap().len(), MAX_LINE - 1);

        let mut r = LineReader::new();
        r.push(&[b'a'; MAX_LINE]);
        assert!(r.next_line().is_err());
        r.push(b"\n1 SHUTDOWN\n");
        assert!(r.next_line().is_err(), "a failed reader stays failed");
    }
}
