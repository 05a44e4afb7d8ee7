//! Writing response heads into a caller-owned buffer.

use std::fmt::Write as _;
use std::time::SystemTime;

/// Writes one response head into `out`. Call [`ResponseHead::finish`] last.
pub struct ResponseHead<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> ResponseHead<'a> {
    /// Start a response with its status line (always `HTTP/1.1`, the
    /// highest version this server speaks, as RFC 9110 §6.2 asks).
    pub fn new(out: &'a mut Vec<u8>, status: u16) -> Self {
        out.extend_from_slice(b"HTTP/1.1 ");
        push_u64(out, u64::from(status));
        out.push(b' ');
        out.extend_from_slice(crate::status::reason(status).as_bytes());
        out.extend_from_slice(b"\r\n");
        ResponseHead { out }
    }

    /// Add a header.
    pub fn header(self, name: &str, value: &str) -> Self {
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b": ");
        self.out.extend_from_slice(value.as_bytes());
        self.out.extend_from_slice(b"\r\n");
        self
    }

    /// Add header lines rendered beforehand, each ending in CRLF (or none).
    pub fn lines(self, lines: &str) -> Self {
        debug_assert!(lines.is_empty() || lines.ends_with("\r\n"));
        self.out.extend_from_slice(lines.as_bytes());
        self
    }

    /// Add a header whose value is a number.
    pub fn header_u64(self, name: &str, value: u64) -> Self {
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b": ");
        push_u64(self.out, value);
        self.out.extend_from_slice(b"\r\n");
        self
    }

    /// `Content-Length`.
    pub fn content_length(self, n: u64) -> Self {
        self.header_u64("Content-Length", n)
    }

    /// `Connection: close` or, for an HTTP/1.0 client that asked for it,
    /// `Connection: keep-alive`.
    pub fn connection(self, keep_alive: bool, http10: bool) -> Self {
        match (keep_alive, http10) {
            (false, _) => self.header("Connection", "close"),
            (true, true) => self.header("Connection", "keep-alive"),
            (true, false) => self,
        }
    }

    /// End the head with the blank line.
    pub fn finish(self) {
        self.out.extend_from_slice(b"\r\n");
    }
}

fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// The `Server` header's value in every answer this project writes.
pub const SERVER: &str = "switchyard";

/// The `Date` and `Server` header lines that begin every answer, formatted once per second.
#[derive(Debug, Default)]
pub struct DateCache {
    second: u64,
    lines: String,
}

impl DateCache {
    /// `Date: <the IMF-fixdate of now>` and `Server: <`[`SERVER`]`>`, each ending in CRLF,
    /// reformatted only when the second changes (for [`ResponseHead::lines`]).
    pub fn lines(&mut self, now: SystemTime) -> &str {
        let s = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if s != self.second || self.lines.is_empty() {
            self.second = s;
            self.lines.clear();
            let _ = write!(
                self.lines,
                "Date: {}\r\nServer: {SERVER}\r\n",
                httpdate::HttpDate::from(now)
            );
        }
        &self.lines
    }
}

/// The content type for a file name, by its extension.
pub fn content_type(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    match ext.to_ascii_lowercase().as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "txt" => "text/plain; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "" => "application/octet-stream",
        other => mime_guess::from_ext(other)
            .first_raw()
            .unwrap_or("application/octet-stream"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_head() {
        let mut out = Vec::new();
        ResponseHead::new(&mut out, 404)
            .content_length(0)
            .connection(false, false)
            .finish();
        assert_eq!(
            out,
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn date_cache_changes_each_second() {
        let mut d = DateCache::default();
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(784_111_777);
        let line = |d: &str| format!("Date: {d}\r\nServer: switchyard\r\n");
        assert_eq!(d.lines(t), line("Sun, 06 Nov 1994 08:49:37 GMT"));
        let t2 = t + std::time::Duration::from_millis(999);
        assert_eq!(d.lines(t2), line("Sun, 06 Nov 1994 08:49:37 GMT"));
        let t3 = t + std::time::Duration::from_secs(1);
        assert_eq!(d.lines(t3), line("Sun, 06 Nov 1994 08:49:38 GMT"));
    }

    #[test]
    fn types() {
        assert_eq!(content_type("a/b.HTML"), "text/html; charset=utf-8");
        assert_eq!(content_type("x.png"), "image/png");
        assert_eq!(content_type("x.unknownext"), "application/octet-stream");
        assert_eq!(content_type("noext"), "application/octet-stream");
    }
}
