//! One request of an access log, owned ([`LogRecord`]) or borrowed ([`RecordRef`]),
//! and how to write it back as a Common or Combined Log Format line.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::time::ClfTime;

/// One request from an access log.
///
/// `target` is the request target exactly as logged (path, query string and
/// all, with the log's `\"` and `\\` escapes undone). The key used to tell
/// targets apart in statistics is chosen with [`TargetKey`]; by default it is
/// [`LogRecord::path`], the target without its query string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LogRecord {
    /// Remote host: an address or a host name.
    pub client: String,
    /// Unix seconds (UTC), from the log's timestamp and its zone offset.
    pub time: i64,
    /// Request method (`GET`, `HEAD`, …).
    pub method: String,
    /// Request target as logged.
    pub target: String,
    /// Protocol (`HTTP/1.0`, `HTTP/1.1`); `None` for HTTP/0.9-style request
    /// lines that carry no version.
    pub protocol: Option<String>,
    /// Response status; `None` when logged as `-`.
    pub status: Option<u16>,
    /// Response body bytes; `None` when logged as `-`.
    pub bytes: Option<u64>,
    /// `Referer` of the Combined format; `None` when absent or `-`.
    pub referer: Option<String>,
    /// `User-Agent` of the Combined format; `None` when absent or `-`.
    pub user_agent: Option<String>,
}

/// A request borrowed from the line it was parsed from.
///
/// Produced by [`parse_line`](crate::parse_line) and
/// [`LogReader::next_outcome`](crate::LogReader::next_outcome) without
/// allocating (quoted fields are only copied when an escape had to be undone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// See [`LogRecord::client`].
    pub client: &'a str,
    /// See [`LogRecord::time`].
    pub time: i64,
    /// See [`LogRecord::method`].
    pub method: Cow<'a, str>,
    /// See [`LogRecord::target`].
    pub target: Cow<'a, str>,
    /// See [`LogRecord::protocol`].
    pub protocol: Option<Cow<'a, str>>,
    /// See [`LogRecord::status`].
    pub status: Option<u16>,
    /// See [`LogRecord::bytes`].
    pub bytes: Option<u64>,
    /// See [`LogRecord::referer`].
    pub referer: Option<Cow<'a, str>>,
    /// See [`LogRecord::user_agent`].
    pub user_agent: Option<Cow<'a, str>>,
}

/// Which part of a request target identifies a target in statistics and workloads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKey {
    /// The path only: scheme and authority of an absolute-form target, the
    /// query string and the fragment are removed (see [`target_path`]).
    /// This is the default: a static file is named by its path.
    #[default]
    Path,
    /// The target exactly as logged, query string included.
    Full,
}

impl TargetKey {
    /// The key of `target` under this choice.
    pub fn key(self, target: &str) -> &str {
        match self {
            TargetKey::Path => target_path(target),
            TargetKey::Full => target,
        }
    }
}

/// The path of a request target: an absolute-form target
/// (`http://host/a?b`) loses its scheme and authority, then everything from
/// the first `?` or `#` is removed. No percent-decoding is done.
///
/// ```
/// use switchyard_trace::target_path;
/// assert_eq!(target_path("/a/b.html?x=1"), "/a/b.html");
/// assert_eq!(target_path("http://example.com/a#top"), "/a");
/// assert_eq!(target_path("https://example.com"), "/");
/// ```
pub fn target_path(target: &str) -> &str {
    let mut t = target;
    for scheme in ["http://", "https://"] {
        if t.len() >= scheme.len() && t[..scheme.len()].eq_ignore_ascii_case(scheme) {
            let after = &t[scheme.len()..];
            t = match after.find(['/', '?', '#']) {
                Some(i) if after.as_bytes()[i] == b'/' => &after[i..],
                _ => return "/",
            };
            break;
        }
    }
    match t.find(['?', '#']) {
        Some(i) => &t[..i],
        None => t,
    }
}

impl LogRecord {
    /// The target's path (see [`target_path`]).
    pub fn path(&self) -> &str {
        target_path(&self.target)
    }

    /// A borrowed view of this record.
    pub fn as_ref(&self) -> RecordRef<'_> {
        RecordRef {
            client: &self.client,
            time: self.time,
            method: Cow::Borrowed(&self.method),
            target: Cow::Borrowed(&self.target),
            protocol: self.protocol.as_deref().map(Cow::Borrowed),
            status: self.status,
            bytes: self.bytes,
            referer: self.referer.as_deref().map(Cow::Borrowed),
            user_agent: self.user_agent.as_deref().map(Cow::Borrowed),
        }
    }

    /// This record as a Common Log Format line (no line terminator).
    pub fn to_common_line(&self) -> String {
        self.as_ref().to_common_line()
    }

    /// This record as a Combined Log Format line (no line terminator).
    pub fn to_combined_line(&self) -> String {
        self.as_ref().to_combined_line()
    }
}

/// Writes the Combined format when the record has a referer or user agent,
/// the Common format otherwise.
impl fmt::Display for LogRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

impl RecordRef<'_> {
    /// The target's path (see [`target_path`]).
    pub fn path(&self) -> &str {
        target_path(&self.target)
    }

    /// An owned copy.
    pub fn to_owned_record(&self) -> LogRecord {
        LogRecord {
            client: self.client.to_owned(),
            time: self.time,
            method: self.method.clone().into_owned(),
            target: self.target.clone().into_owned(),
            protocol: self.protocol.as_ref().map(|p| p.clone().into_owned()),
            status: self.status,
            bytes: self.bytes,
            referer: self.referer.as_ref().map(|p| p.clone().into_owned()),
            user_agent: self.user_agent.as_ref().map(|p| p.clone().into_owned()),
        }
    }

    /// Writes the Common Log Format line (no terminator) into `out`.
    ///
    /// The timestamp is written in UTC (`+0000`); ident and user are `-`.
    /// `"` and `\` inside the request are escaped as `\"` and `\\`, which is
    /// what the parser undoes, so parsing the line gives this record back.
    pub fn write_common(&self, out: &mut impl fmt::Write) -> fmt::Result {
        write!(out, "{} - - [{}] \"", self.client, ClfTime(self.time))?;
        write_escaped(out, &self.method)?;
        out.write_char(' ')?;
        write_escaped(out, &self.target)?;
        if let Some(p) = &self.protocol {
            out.write_char(' ')?;
            write_escaped(out, p)?;
        }
        out.write_str("\" ")?;
        match self.status {
            Some(s) => write!(out, "{s}")?,
            None => out.write_char('-')?,
        }
        out.write_char(' ')?;
        match self.bytes {
            Some(b) => write!(out, "{b}"),
            None => out.write_char('-'),
        }
    }

    /// Writes the Combined Log Format line (no terminator) into `out`:
    /// the Common line followed by the quoted referer and user agent
    /// (`"-"` when absent).
    pub fn write_combined(&self, out: &mut impl fmt::Write) -> fmt::Result {
        self.write_common(out)?;
        for field in [&self.referer, &self.user_agent] {
            out.write_str(" \"")?;
            match field {
                Some(v) => write_escaped(out, v)?,
                None => out.write_char('-')?,
            }
            out.write_char('"')?;
        }
        Ok(())
    }

    /// The Common Log Format line (no terminator).
    pub fn to_common_line(&self) -> String {
        let mut s = String::with_capacity(96);
        self.write_common(&mut s)
            .expect("writing to a String cannot fail");
        s
    }

    /// The Combined Log Format line (no terminator).
    pub fn to_combined_line(&self) -> String {
        let mut s = String::with_capacity(192);
        self.write_combined(&mut s)
            .expect("writing to a String cannot fail");
        s
    }
}

/// Writes the Combined format when the record has a referer or user agent,
/// the Common format otherwise.
impl fmt::Display for RecordRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.referer.is_some() || self.user_agent.is_some() {
            self.write_combined(f)
        } else {
            self.write_common(f)
        }
    }
}

fn write_escaped(out: &mut impl fmt::Write, s: &str) -> fmt::Result {
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if c == '"' || c == '\\' {
            out.write_str(&s[start..i])?;
            out.write_char('\\')?;
            out.write_char(c)?;
            start = i + 1;
        }
    }
    out.write_str(&s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LogRecord {
        LogRecord {
            client: "10.0.0.1".into(),
            time: 971_211_336,
            method: "GET".into(),
            target: "/a \"b\\c?x=1".into(),
            protocol: Some("HTTP/1.0".into()),
            status: Some(200),
            bytes: Some(2326),
            referer: None,
            user_agent: Some("Mozilla/4.08 [en]".into()),
        }
    }

    #[test]
    fn formats_common_and_combined() {
        let mut r = sample();
        assert_eq!(
            r.to_common_line(),
            r#"10.0.0.1 - - [10/Oct/2000:20:55:36 +0000] "GET /a \"b\\c?x=1 HTTP/1.0" 200 2326"#
        );
        assert_eq!(
            r.to_string(),
            r#"10.0.0.1 - - [10/Oct/2000:20:55:36 +0000] "GET /a \"b\\c?x=1 HTTP/1.0" 200 2326 "-" "Mozilla/4.08 [en]""#
        );
        r.user_agent = None;
        r.protocol = None;
        r.status = None;
        r.bytes = None;
        assert_eq!(
            r.to_string(),
            r#"10.0.0.1 - - [10/Oct/2000:20:55:36 +0000] "GET /a \"b\\c?x=1" - -"#
        );
    }

    #[test]
    fn paths() {
        assert_eq!(target_path("/"), "/");
        assert_eq!(target_path("/a?b?c"), "/a");
        assert_eq!(target_path("?q"), "");
        assert_eq!(target_path("*"), "*");
        assert_eq!(target_path("HTTP://Host:80/x/y?z"), "/x/y");
        assert_eq!(target_path("http://host?z"), "/");
        assert_eq!(TargetKey::Full.key("/a?b"), "/a?b");
        assert_eq!(TargetKey::Path.key("/a?b"), "/a");
        assert_eq!(sample().path(), "/a \"b\\c");
    }
}
