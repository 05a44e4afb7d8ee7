//! Parsing Common and Combined Log Format lines.
//!
//! The accepted line is
//!
//! ```text
//! client ident user [dd/Mon/yyyy:HH:MM:SS ±hhmm] "request" status bytes ["referer" "user-agent"]
//! ```
//!
//! where `request` is `METHOD target PROTOCOL` or, for HTTP/0.9-style
//! requests, `METHOD target` with no version. Every line ends in exactly
//! one of three outcomes, and [`ParseReport`] counts them by reason:
//!
//! * a **record**, possibly with [`RepairReason`]s noting something that was
//!   tolerated (an unterminated user agent, extra trailing fields, …);
//! * **skipped** ([`SkipReason`]): a well-formed line that is not a usable
//!   request (blank, `#` comment, request logged as `-`, garbage request line);
//! * **invalid** ([`InvalidReason`]): the line is not a log entry.
//!
//! Quoted fields end at the first `"` that is not escaped by `\` and is
//! followed by a space or the end of the line; `\"` and `\\` are unescaped,
//! other backslash sequences (Apache's `\x16`) are kept as they are.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::record::{LogRecord, RecordRef};
use crate::time::parse_log_time;
use crate::TraceError;

/// Lines longer than this (bytes, without terminator) are counted as
/// [`InvalidReason::TooLong`] and not kept in memory.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// How many example lines a [`ParseReport`] keeps.
pub const MAX_EXAMPLES: usize = 20;

/// Why a well-formed line yields no record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Empty or only spaces.
    Blank,
    /// Starts with `#` (a header or comment line).
    Comment,
    /// The request was logged as `"-"` or `""` (the client sent nothing, e.g. a 408).
    NoRequest,
    /// The request line has no target or its method is not an HTTP token
    /// (binary garbage, TLS handshakes sent to a plain-text port, …).
    MalformedRequest,
}

/// Why a line is not a log entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidReason {
    /// Longer than [`MAX_LINE_BYTES`].
    TooLong,
    /// The line starts with a space: no client field.
    MissingClient,
    /// No `[…]` timestamp after the client, ident and user fields.
    MissingTimestamp,
    /// The timestamp does not parse or is out of range.
    BadTimestamp,
    /// No quoted request after the timestamp.
    MissingRequest,
    /// The request's quote is never closed.
    UnterminatedRequest,
    /// The line ends after the request.
    MissingStatus,
    /// The status is not `-` or a number of at most three digits.
    BadStatus,
    /// The line ends after the status.
    MissingBytes,
    /// The byte count is not `-` or a decimal number that fits in 64 bits.
    BadBytes,
}

/// Something unusual that was tolerated in a line that still gave a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairReason {
    /// The line was not valid UTF-8; invalid bytes were replaced by U+FFFD.
    InvalidUtf8,
    /// The timestamp had no zone offset; UTC was assumed.
    NoZone,
    /// The referer or user agent quote is never closed (a truncated line);
    /// the field runs to the end of the line.
    UnterminatedQuote,
    /// A referer without a user agent.
    MissingUserAgent,
    /// Fields after the last one known (bytes, or user agent) were ignored.
    TrailingFields,
}

impl SkipReason {
    /// The reason's name, as in JSON output.
    pub fn name(self) -> &'static str {
        match self {
            SkipReason::Blank => "blank",
            SkipReason::Comment => "comment",
            SkipReason::NoRequest => "no_request",
            SkipReason::MalformedRequest => "malformed_request",
        }
    }
}

impl InvalidReason {
    /// The reason's name, as in JSON output.
    pub fn name(self) -> &'static str {
        match self {
            InvalidReason::TooLong => "too_long",
            InvalidReason::MissingClient => "missing_client",
            InvalidReason::MissingTimestamp => "missing_timestamp",
            InvalidReason::BadTimestamp => "bad_timestamp",
            InvalidReason::MissingRequest => "missing_request",
            InvalidReason::UnterminatedRequest => "unterminated_request",
            InvalidReason::MissingStatus => "missing_status",
            InvalidReason::BadStatus => "bad_status",
            InvalidReason::MissingBytes => "missing_bytes",
            InvalidReason::BadBytes => "bad_bytes",
        }
    }
}

impl RepairReason {
    /// The reason's name, as in JSON output.
    pub fn name(self) -> &'static str {
        match self {
            RepairReason::InvalidUtf8 => "invalid_utf8",
            RepairReason::NoZone => "no_zone",
            RepairReason::UnterminatedQuote => "unterminated_quote",
            RepairReason::MissingUserAgent => "missing_user_agent",
            RepairReason::TrailingFields => "trailing_fields",
        }
    }
}

impl ExampleKind {
    /// `skipped`, `invalid` or `repaired`, and the reason's name.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            ExampleKind::Skipped(r) => ("skipped", r.name()),
            ExampleKind::Invalid(r) => ("invalid", r.name()),
            ExampleKind::Repaired(r) => ("repaired", r.name()),
        }
    }
}

impl RepairReason {
    const ALL: [RepairReason; 5] = [
        RepairReason::InvalidUtf8,
        RepairReason::NoZone,
        RepairReason::UnterminatedQuote,
        RepairReason::MissingUserAgent,
        RepairReason::TrailingFields,
    ];

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of [`RepairReason`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Repairs(u8);

impl Repairs {
    /// No repairs.
    pub const NONE: Repairs = Repairs(0);

    /// Whether nothing was repaired.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether `r` is in the set.
    pub fn contains(self, r: RepairReason) -> bool {
        self.0 & r.bit() != 0
    }

    /// Adds `r`.
    pub fn insert(&mut self, r: RepairReason) {
        self.0 |= r.bit();
    }

    /// The reasons in the set, in declaration order.
    pub fn iter(self) -> impl Iterator<Item = RepairReason> {
        RepairReason::ALL
            .into_iter()
            .filter(move |r| self.contains(*r))
    }
}

/// What one line gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineOutcome<'a> {
    /// A request, with what had to be tolerated to read it.
    Record(RecordRef<'a>, Repairs),
    /// A well-formed line that is not a usable request.
    Skipped(SkipReason),
    /// Not a log entry.
    Invalid(InvalidReason),
}

/// Parses one line (without its terminator; a trailing `\r` is ignored).
///
/// Pure and total: any input gives an outcome, never a panic.
pub fn parse_line(line: &str) -> LineOutcome<'_> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.bytes().all(|b| b == b' ' || b == b'\t') {
        return LineOutcome::Skipped(SkipReason::Blank);
    }
    if line.starts_with('#') {
        return LineOutcome::Skipped(SkipReason::Comment);
    }
    match parse_entry(line) {
        Ok(o) => o,
        Err(reason) => LineOutcome::Invalid(reason),
    }
}

fn parse_entry(line: &str) -> Result<LineOutcome<'_>, InvalidReason> {
    let mut repairs = Repairs::NONE;
    let sp = line.find(' ').ok_or(InvalidReason::MissingTimestamp)?;
    let client = &line[..sp];
    if client.is_empty() {
        return Err(InvalidReason::MissingClient);
    }
    let rest = &line[sp + 1..];
    let open = rest.find('[').ok_or(InvalidReason::MissingTimestamp)?;
    let rest = &rest[open + 1..];
    let close = rest.find(']').ok_or(InvalidReason::BadTimestamp)?;
    let time = parse_log_time(&rest[..close]).ok_or(InvalidReason::BadTimestamp)?;
    if !time.had_zone {
        repairs.insert(RepairReason::NoZone);
    }
    let rest = &rest[close + 1..];
    let rest = rest
        .strip_prefix(" \"")
        .ok_or(InvalidReason::MissingRequest)?;
    let (request, rest) = match quoted(rest) {
        Quoted::Closed(v, rest) => (v, rest),
        Quoted::Open(_) => return Err(InvalidReason::UnterminatedRequest),
    };
    let rest = rest.strip_prefix(' ').ok_or(InvalidReason::MissingStatus)?;
    let (status_tok, rest) = split_token(rest);
    let status = match status_tok {
        "-" => None,
        t if !t.is_empty() && t.len() <= 3 && t.bytes().all(|b| b.is_ascii_digit()) => {
            Some(t.parse::<u16>().map_err(|_| InvalidReason::BadStatus)?)
        }
        _ => return Err(InvalidReason::BadStatus),
    };
    let rest = rest.ok_or(InvalidReason::MissingBytes)?;
    let (bytes_tok, rest) = split_token(rest);
    let bytes = match bytes_tok {
        "-" => None,
        t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
            Some(t.parse::<u64>().map_err(|_| InvalidReason::BadBytes)?)
        }
        _ => return Err(InvalidReason::BadBytes),
    };

    let (mut referer, mut user_agent) = (None, None);
    if let Some(rest) = rest {
        match rest.strip_prefix('"') {
            None => repairs.insert(RepairReason::TrailingFields),
            Some(r) => match quoted(r) {
                Quoted::Open(v) => {
                    repairs.insert(RepairReason::UnterminatedQuote);
                    referer = dash_none(v);
                }
                Quoted::Closed(v, r) => {
                    referer = dash_none(v);
                    match r.strip_prefix(" \"") {
                        Some(r) => match quoted(r) {
                            Quoted::Open(v) => {
                                repairs.insert(RepairReason::UnterminatedQuote);
                                user_agent = dash_none(v);
                            }
                            Quoted::Closed(v, r) => {
                                user_agent = dash_none(v);
                                if !r.is_empty() {
                                    repairs.insert(RepairReason::TrailingFields);
                                }
                            }
                        },
                        None if r.is_empty() => repairs.insert(RepairReason::MissingUserAgent),
                        None => repairs.insert(RepairReason::TrailingFields),
                    }
                }
            },
        }
    }

    let (method, target, protocol) = match split_request(request) {
        Ok(parts) => parts,
        Err(reason) => return Ok(LineOutcome::Skipped(reason)),
    };
    Ok(LineOutcome::Record(
        RecordRef {
            client,
            time: time.unix,
            method,
            target,
            protocol,
            status,
            bytes,
            referer,
            user_agent,
        },
        repairs,
    ))
}

fn dash_none(v: Cow<'_, str>) -> Option<Cow<'_, str>> {
    if v == "-" {
        None
    } else {
        Some(v)
    }
}

/// The text up to the next space, and what follows that space (if any).
fn split_token(s: &str) -> (&str, Option<&str>) {
    match s.find(' ') {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

enum Quoted<'a> {
    /// The unescaped field, and the rest of the line after the closing quote.
    Closed(Cow<'a, str>, &'a str),
    /// No closing quote: the unescaped rest of the line.
    Open(Cow<'a, str>),
}

/// Reads a quoted field whose opening quote has been consumed.
fn quoted(s: &str) -> Quoted<'_> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut escaped = false;
    while i < b.len() {
        match b[i] {
            b'\\' if i + 1 < b.len() => {
                escaped |= b[i + 1] == b'"' || b[i + 1] == b'\\';
                i += 2;
            }
            b'"' if i + 1 == b.len() || b[i + 1] == b' ' => {
                return Quoted::Closed(unescape(&s[..i], escaped), &s[i + 1..]);
            }
            _ => i += 1,
        }
    }
    Quoted::Open(unescape(s, escaped))
}

fn unescape(s: &str, needed: bool) -> Cow<'_, str> {
    if !needed {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.clone().next() {
                Some(n @ ('"' | '\\')) => {
                    out.push(n);
                    chars.next();
                }
                _ => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

type RequestParts<'a> = (Cow<'a, str>, Cow<'a, str>, Option<Cow<'a, str>>);

/// Splits `METHOD target [PROTOCOL]`. The target may contain spaces (some
/// servers log it decoded); the last word is the protocol only if it starts
/// with `HTTP/`.
fn split_request(request: Cow<'_, str>) -> Result<RequestParts<'_>, SkipReason> {
    let text: &str = &request;
    let trimmed = text.trim_matches(' ');
    if trimmed.is_empty() || trimmed == "-" {
        return Err(SkipReason::NoRequest);
    }
    let (method, rest) = match trimmed.split_once(' ') {
        Some((m, r)) => (m, r.trim_start_matches(' ')),
        None => return Err(SkipReason::MalformedRequest),
    };
    if !method.bytes().all(is_token_byte) || rest.is_empty() {
        return Err(SkipReason::MalformedRequest);
    }
    let (target, protocol) = match rest.rsplit_once(' ') {
        Some((t, p)) if p.starts_with("HTTP/") => (t.trim_end_matches(' '), Some(p)),
        _ => (rest, None),
    };
    // Offsets into `text`, so that borrowed requests stay borrowed.
    let range = |part: &str| {
        let start = part.as_ptr() as usize - text.as_ptr() as usize;
        start..start + part.len()
    };
    let (mr, tr, pr) = (range(method), range(target), protocol.map(range));
    Ok(match request {
        Cow::Borrowed(s) => (
            Cow::Borrowed(&s[mr]),
            Cow::Borrowed(&s[tr]),
            pr.map(|r| Cow::Borrowed(&s[r])),
        ),
        Cow::Owned(s) => (
            Cow::Owned(s[mr].to_owned()),
            Cow::Owned(s[tr].to_owned()),
            pr.map(|r| Cow::Owned(s[r].to_owned())),
        ),
    })
}

/// The kind of a line kept as an example in a [`ParseReport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "reason", rename_all = "snake_case")]
pub enum ExampleKind {
    /// A skipped line.
    Skipped(SkipReason),
    /// An invalid line.
    Invalid(InvalidReason),
    /// A record that needed a repair.
    Repaired(RepairReason),
}

/// One line kept as an example of something skipped, invalid or repaired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineExample {
    /// 1-based line number.
    pub line: u64,
    /// What happened to it.
    #[serde(flatten)]
    pub kind: ExampleKind,
    /// The line's first 200 characters.
    pub text: String,
}

/// Counts of what every line of a log gave. Nothing is dropped silently:
/// `lines == records + skipped + invalid` (totals of the maps).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParseReport {
    /// Lines read.
    pub lines: u64,
    /// Lines that gave a record (including repaired ones).
    pub records: u64,
    /// Well-formed lines that gave no record, by reason.
    pub skipped: BTreeMap<SkipReason, u64>,
    /// Lines that are not log entries, by reason.
    pub invalid: BTreeMap<InvalidReason, u64>,
    /// Records that needed a repair, by reason (one line may count under several).
    pub repaired: BTreeMap<RepairReason, u64>,
    /// The first few lines of each kind, for a human to look at.
    pub examples: Vec<LineExample>,
}

impl ParseReport {
    /// Total skipped lines.
    pub fn skipped_total(&self) -> u64 {
        self.skipped.values().sum()
    }

    /// Total invalid lines.
    pub fn invalid_total(&self) -> u64 {
        self.invalid.values().sum()
    }

    /// Records with at least one repair are counted once per reason; this is
    /// the sum over reasons.
    pub fn repaired_total(&self) -> u64 {
        self.repaired.values().sum()
    }

    /// Counts the outcome of line number `line_no` (1-based) whose text is `text`.
    pub fn record_outcome(&mut self, line_no: u64, text: &str, outcome: &LineOutcome<'_>) {
        self.lines += 1;
        match outcome {
            LineOutcome::Record(_, repairs) => {
                self.records += 1;
                for r in repairs.iter() {
                    *self.repaired.entry(r).or_insert(0) += 1;
                    self.example(line_no, ExampleKind::Repaired(r), text);
                }
            }
            LineOutcome::Skipped(r) => {
                *self.skipped.entry(*r).or_insert(0) += 1;
                if *r != SkipReason::Blank {
                    self.example(line_no, ExampleKind::Skipped(*r), text);
                }
            }
            LineOutcome::Invalid(r) => {
                *self.invalid.entry(*r).or_insert(0) += 1;
                self.example(line_no, ExampleKind::Invalid(*r), text);
            }
        }
    }

    fn example(&mut self, line: u64, kind: ExampleKind, text: &str) {
        // Keep at most three examples of any one kind.
        if self.examples.len() < MAX_EXAMPLES
            && self.examples.iter().filter(|e| e.kind == kind).count() < 3
        {
            self.examples.push(LineExample {
                line,
                kind,
                text: text.chars().take(200).collect(),
            });
        }
    }

    /// Adds the counts of `other` (examples are appended up to the limit).
    pub fn merge(&mut self, other: &ParseReport) {
        self.lines += other.lines;
        self.records += other.records;
        for (k, v) in &other.skipped {
            *self.skipped.entry(*k).or_insert(0) += v;
        }
        for (k, v) in &other.invalid {
            *self.invalid.entry(*k).or_insert(0) += v;
        }
        for (k, v) in &other.repaired {
            *self.repaired.entry(*k).or_insert(0) += v;
        }
        for e in &other.examples {
            if self.examples.len() < MAX_EXAMPLES {
                self.examples.push(e.clone());
            }
        }
    }
}

/// Streams the lines of a log, parsing each and counting outcomes in a
/// [`ParseReport`].
///
/// Use it as an [`Iterator`] of owned [`LogRecord`]s (I/O errors are yielded
/// as `Err`, after which the iterator ends), or call
/// [`next_outcome`](LogReader::next_outcome) to see every line's outcome
/// without allocating. Lines may end in `\n` or `\r\n`; invalid UTF-8 is
/// replaced and noted; lines longer than [`MAX_LINE_BYTES`] are counted as
/// invalid without being held in memory.
pub struct LogReader<R> {
    inner: R,
    raw: Vec<u8>,
    lossy: String,
    report: ParseReport,
    failed: bool,
}

/// Parses a log from any buffered reader.
///
/// ```
/// let log = "1.2.3.4 - - [01/Jun/1995:00:00:59 -0600] \"GET /a.html\" 200 271\n\n";
/// let mut reader = switchyard_trace::parse_reader(log.as_bytes());
/// let records: Vec<_> = reader.by_ref().collect::<Result<_, _>>().unwrap();
/// assert_eq!(records[0].protocol, None);
/// assert_eq!(reader.report().lines, 2);
/// assert_eq!(reader.report().skipped_total(), 1);
/// ```
pub fn parse_reader<R: BufRead>(reader: R) -> LogReader<R> {
    LogReader {
        inner: reader,
        raw: Vec::with_capacity(512),
        lossy: String::new(),
        report: ParseReport::default(),
        failed: false,
    }
}

/// Opens a log file for [`parse_reader`].
pub fn open_log(path: &Path) -> Result<LogReader<BufReader<File>>, TraceError> {
    let file = File::open(path).map_err(|source| TraceError::Read {
        path: path.to_owned(),
        source,
    })?;
    Ok(parse_reader(BufReader::with_capacity(256 * 1024, file)))
}

impl<R: BufRead> LogReader<R> {
    /// The counts so far.
    pub fn report(&self) -> &ParseReport {
        &self.report
    }

    /// The final counts.
    pub fn into_report(self) -> ParseReport {
        self.report
    }

    /// Reads one raw line into `self.raw`. Returns `None` at the end of input,
    /// otherwise whether the line was too long.
    fn read_raw(&mut self) -> io::Result<Option<bool>> {
        self.raw.clear();
        let mut too_long = false;
        let mut any = false;
        loop {
            let buf = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                break;
            }
            any = true;
            let (chunk, used, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], i + 1, true),
                None => (buf, buf.len(), false),
            };
            if !too_long {
                let room = MAX_LINE_BYTES - self.raw.len();
                if chunk.len() > room {
                    self.raw.extend_from_slice(&chunk[..room]);
                    too_long = true;
                } else {
                    self.raw.extend_from_slice(chunk);
                }
            }
            self.inner.consume(used);
            if done {
                break;
            }
        }
        if !any {
            return Ok(None);
        }
        if !too_long && self.raw.last() == Some(&b'\r') {
            self.raw.pop();
        }
        Ok(Some(too_long))
    }

    /// Reads and parses the next line, counting its outcome in the report.
    /// Returns `None` at the end of input (or after an I/O error was returned).
    pub fn next_outcome(&mut self) -> Option<io::Result<LineOutcome<'_>>> {
        if self.failed {
            return None;
        }
        let too_long = match self.read_raw() {
            Ok(Some(t)) => t,
            Ok(None) => return None,
            Err(e) => {
                self.failed = true;
                return Some(Err(e));
            }
        };
        let line_no = self.report.lines + 1;
        let (text, lossy): (&str, bool) = match std::str::from_utf8(&self.raw) {
            Ok(s) => (s, false),
            Err(_) => {
                self.lossy = String::from_utf8_lossy(&self.raw).into_owned();
                (&self.lossy, true)
            }
        };
        let mut outcome = if too_long {
            LineOutcome::Invalid(InvalidReason::TooLong)
        } else {
            parse_line(text)
        };
        if lossy {
            if let LineOutcome::Record(_, repairs) = &mut outcome {
                repairs.insert(RepairReason::InvalidUtf8);
            }
        }
        self.report.record_outcome(line_no, text, &outcome);
        Some(Ok(outcome))
    }

    /// Calls `f` with every record, borrowed; stops at the first I/O error.
    pub fn for_each_record(&mut self, mut f: impl FnMut(&RecordRef<'_>)) -> io::Result<()> {
        while let Some(outcome) = self.next_outcome() {
            if let LineOutcome::Record(r, _) = outcome? {
                f(&r);
            }
        }
        Ok(())
    }
}

impl<R: BufRead> Iterator for LogReader<R> {
    type Item = io::Result<LogRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.next_outcome()? {
                Err(e) => return Some(Err(e)),
                Ok(LineOutcome::Record(r, _)) => return Some(Ok(r.to_owned_record())),
                Ok(_) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(line: &str) -> (LogRecord, Repairs) {
        match parse_line(line) {
            LineOutcome::Record(r, rep) => (r.to_owned_record(), rep),
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn common_line() {
        let (r, rep) = record(
            "127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] \"GET /apache_pb.gif HTTP/1.0\" 200 2326",
        );
        assert!(rep.is_empty());
        assert_eq!(
            r,
            LogRecord {
                client: "127.0.0.1".into(),
                time: 971_211_336,
                method: "GET".into(),
                target: "/apache_pb.gif".into(),
                protocol: Some("HTTP/1.0".into()),
                status: Some(200),
                bytes: Some(2326),
                referer: None,
                user_agent: None,
            }
        );
    }

    #[test]
    fn combined_line() {
        let (r, rep) = record(
            r#"83.149.9.216 - - [17/May/2015:10:05:03 +0000] "GET /a.png?x=1 HTTP/1.1" 200 203023 "http://semicomplete.com/" "Mozilla/5.0 (X11) \"q\"""#,
        );
        assert!(rep.is_empty());
        assert_eq!(r.target, "/a.png?x=1");
        assert_eq!(r.path(), "/a.png");
        assert_eq!(r.referer.as_deref(), Some("http://semicomplete.com/"));
        assert_eq!(r.user_agent.as_deref(), Some("Mozilla/5.0 (X11) \"q\""));
    }

    #[test]
    fn http09_and_dashes() {
        let (r, _) = record("a.b.c - - [01/Jun/1995:00:00:59 -0600] \"GET /~lowey/\" 302 -");
        assert_eq!(r.protocol, None);
        assert_eq!(r.target, "/~lowey/");
        assert_eq!(r.bytes, None);
        let (r, _) =
            record("h - - [01/Jun/1995:00:00:59 -0600] \"GET /a b HTTP/1.0\" - 5 \"-\" \"-\"");
        assert_eq!(r.target, "/a b");
        assert_eq!(r.status, None);
        assert_eq!(r.referer, None);
        assert_eq!(r.user_agent, None);
        let (r, _) = record("h - - [01/Jun/1995:00:00:59 -0600] \"GET /a b\" 200 5");
        assert_eq!((r.target.as_str(), r.protocol), ("/a b", None));
    }

    #[test]
    fn repairs() {
        let (r, rep) = record(
            "h - - [01/Jun/1995:00:00:59 -0600] \"GET / HTTP/1.1\" 200 5 \"-\" \"Mozilla (compat",
        );
        assert!(rep.contains(RepairReason::UnterminatedQuote));
        assert_eq!(r.user_agent.as_deref(), Some("Mozilla (compat"));
        let (_, rep) = record("h - - [01/Jun/1995:00:00:59] \"GET / HTTP/1.1\" 200 5 0.003");
        assert_eq!(
            rep.iter().collect::<Vec<_>>(),
            [RepairReason::NoZone, RepairReason::TrailingFields]
        );
        let (r, rep) =
            record("h - - [01/Jun/1995:00:00:59 +0000] \"GET / HTTP/1.1\" 200 5 \"ref\"");
        assert!(rep.contains(RepairReason::MissingUserAgent));
        assert_eq!(r.referer.as_deref(), Some("ref"));
        let (_, rep) = record(
            "h - - [01/Jun/1995:00:00:59 +0000] \"GET / HTTP/1.1\" 200 5 \"r\" \"u\" vhost 12",
        );
        assert!(rep.contains(RepairReason::TrailingFields));
    }

    #[test]
    fn skipped_and_invalid() {
        let cases: &[(&str, LineOutcome<'_>)] = &[
            ("", LineOutcome::Skipped(SkipReason::Blank)),
            ("  \t", LineOutcome::Skipped(SkipReason::Blank)),
            ("#Fields: date", LineOutcome::Skipped(SkipReason::Comment)),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"-\" 408 -",
                LineOutcome::Skipped(SkipReason::NoRequest),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"\" 400 0",
                LineOutcome::Skipped(SkipReason::NoRequest),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"\\x16\\x03\\x01\" 400 0",
                LineOutcome::Skipped(SkipReason::MalformedRequest),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"GET\" 400 0",
                LineOutcome::Skipped(SkipReason::MalformedRequest),
            ),
            (
                " h - - [x]",
                LineOutcome::Invalid(InvalidReason::MissingClient),
            ),
            (
                "garbage",
                LineOutcome::Invalid(InvalidReason::MissingTimestamp),
            ),
            (
                "h - - 01/Jun/1995",
                LineOutcome::Invalid(InvalidReason::MissingTimestamp),
            ),
            (
                "h - - [01/Jun/1995",
                LineOutcome::Invalid(InvalidReason::BadTimestamp),
            ),
            (
                "h - - [99/Jun/1995:00:00:59 -0600] \"GET /\" 200 1",
                LineOutcome::Invalid(InvalidReason::BadTimestamp),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] GET / 200 1",
                LineOutcome::Invalid(InvalidReason::MissingRequest),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"GET / HTTP/1.0",
                LineOutcome::Invalid(InvalidReason::UnterminatedRequest),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"GET /\"",
                LineOutcome::Invalid(InvalidReason::MissingStatus),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"GET /\" 2000 1",
                LineOutcome::Invalid(InvalidReason::BadStatus),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"GET /\" OK 1",
                LineOutcome::Invalid(InvalidReason::BadStatus),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"GET /\" 200",
                LineOutcome::Invalid(InvalidReason::MissingBytes),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"GET /\" 200 12k",
                LineOutcome::Invalid(InvalidReason::BadBytes),
            ),
            (
                "h - - [01/Jun/1995:00:00:59 -0600] \"GET /\" 200 99999999999999999999",
                LineOutcome::Invalid(InvalidReason::BadBytes),
            ),
        ];
        for (line, want) in cases {
            assert_eq!(&parse_line(line), want, "{line}");
        }
    }

    #[test]
    fn escapes_stay_borrowed_when_possible() {
        let line = "h - - [01/Jun/1995:00:00:59 -0600] \"GET /a\\x41 HTTP/1.0\" 200 1";
        match parse_line(line) {
            LineOutcome::Record(r, _) => {
                assert!(matches!(r.target, Cow::Borrowed("/a\\x41")));
            }
            o => panic!("{o:?}"),
        }
        let line = "h - - [01/Jun/1995:00:00:59 -0600] \"GET /a\\\"b\\\\ HTTP/1.0\" 200 1";
        let (r, _) = record(line);
        assert_eq!(r.target, "/a\"b\\");
        assert_eq!(r.protocol.as_deref(), Some("HTTP/1.0"));
    }

    #[test]
    fn reader_counts_everything() {
        let mut log = Vec::new();
        log.extend_from_slice(b"h - - [01/Jun/1995:00:00:59 -0600] \"GET /a\" 200 1\r\n");
        log.extend_from_slice(b"\n#comment\n");
        log.extend_from_slice(b"h - - [01/Jun/1995:00:00:59 -0600] \"GET /\xff HTTP/1.0\" 200 1\n");
        log.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        log.extend_from_slice(b"\nbroken line\n");
        log.extend_from_slice(b"h - - [01/Jun/1995:00:00:59 -0600] \"GET /z\" 200 1");
        let mut reader = parse_reader(&log[..]);
        let records: Vec<LogRecord> = reader.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(records[1].target, "/\u{fffd}");
        let rep = reader.into_report();
        assert_eq!(rep.lines, 7);
        assert_eq!(rep.records, 3);
        assert_eq!(rep.skipped[&SkipReason::Blank], 1);
        assert_eq!(rep.skipped[&SkipReason::Comment], 1);
        assert_eq!(rep.invalid[&InvalidReason::TooLong], 1);
        assert_eq!(rep.invalid[&InvalidReason::MissingTimestamp], 1);
        assert_eq!(rep.repaired[&RepairReason::InvalidUtf8], 1);
        assert_eq!(
            rep.lines,
            rep.records + rep.skipped_total() + rep.invalid_total()
        );
        assert!(rep.examples.iter().any(|e| e.line == 5
            && e.kind == ExampleKind::Invalid(InvalidReason::TooLong)
            && e.text.len() == 200));
    }

    #[test]
    fn reader_surfaces_io_errors_once() {
        struct Failing;
        impl io::Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("boom"))
            }
        }
        let mut reader = parse_reader(BufReader::new(Failing));
        assert!(reader.next().unwrap().is_err());
        assert!(reader.next().is_none());
    }

    #[test]
    fn names_match_json() {
        for r in [
            SkipReason::Blank,
            SkipReason::Comment,
            SkipReason::NoRequest,
            SkipReason::MalformedRequest,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
        }
        for r in [
            InvalidReason::TooLong,
            InvalidReason::MissingClient,
            InvalidReason::MissingTimestamp,
            InvalidReason::BadTimestamp,
            InvalidReason::MissingRequest,
            InvalidReason::UnterminatedRequest,
            InvalidReason::MissingStatus,
            InvalidReason::BadStatus,
            InvalidReason::MissingBytes,
            InvalidReason::BadBytes,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
        }
        for r in RepairReason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
        }
    }

    #[test]
    fn report_serializes_reasons_as_names() {
        let mut reader = parse_reader(&b"\nx\n"[..]);
        reader.by_ref().for_each(drop);
        let json = serde_json::to_value(reader.report()).unwrap();
        assert_eq!(json["skipped"]["blank"], 1);
        assert_eq!(json["invalid"]["missing_timestamp"], 1);
        assert_eq!(json["examples"][0]["kind"], "invalid");
        assert_eq!(json["examples"][0]["reason"], "missing_timestamp");
    }
}
