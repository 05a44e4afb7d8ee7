//! Incremental decoder for `Transfer-Encoding: chunked` bodies.
//!
//! Written by hand because it must be strict in exactly the ways a
//! smuggling-safe server needs and it must work on whatever slice the socket
//! returned, without copying the data. It accepts only the grammar of
//! RFC 9112 §7.1:
//!
//! ```text
//! chunk          = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
//! chunk-size     = 1*HEXDIG
//! chunk-ext      = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )
//! chunk-ext-val  = token / quoted-string
//! trailer-section = *( field-line CRLF )
//! field-line     = field-name ":" OWS field-value OWS
//! ```
//!
//! so whitespace is taken only around `;` and `=` of an extension (`2 3`,
//! `0 5` and `2 junk` are errors), every line ends in CRLF (a bare LF is an
//! error), and a trailer line must be a header field: a token, a colon and
//! visible characters, spaces or tabs (a request line, a NUL or a line
//! starting with whitespace is refused). Extensions are read and ignored;
//! trailers are read and dropped. Limits: a chunk-size line of at most
//! [`MAX_LINE`] bytes, at most 15 hex digits, a trailer section of at most
//! [`MAX_TRAILERS`] bytes and [`MAX_TRAILER_FIELDS`] fields (the limits of a
//! request head), and optionally a body limit that a declared chunk size is
//! checked against as soon as its digits arrive, so an oversize chunk is
//! refused before any of its data is awaited.

use thiserror::Error;

/// Longest chunk-size line (size, extensions) accepted.
pub const MAX_LINE: usize = 4096;
/// Largest trailer section accepted, in bytes (the default head limit).
pub const MAX_TRAILERS: usize = 16 * 1024;
/// Most trailer fields accepted (the header-count limit of a request).
pub const MAX_TRAILER_FIELDS: usize = crate::request::MAX_HEADERS;

/// A chunked body that cannot be decoded.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum ChunkedError {
    #[error("invalid chunk size")]
    InvalidSize,
    #[error("invalid chunk extension")]
    InvalidExtension,
    #[error("chunk size line too long")]
    LineTooLong,
    #[error("missing CRLF after a chunk or trailer line")]
    MissingCrlf,
    #[error("invalid trailer field")]
    InvalidTrailer,
    #[error("trailer section too large")]
    TrailersTooLarge,
    #[error("chunked body larger than the limit")]
    TooLarge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Reading the hex digits of a chunk size.
    Size {
        digits: u8,
    },
    /// Whitespace after the size: only `;` may follow.
    SizeWs,
    /// After `;`: whitespace, then an extension name.
    ExtPreName,
    ExtName,
    /// Whitespace after an extension name: `=` or `;` may follow.
    ExtPostName,
    /// After `=`: whitespace, then a token or a quoted string.
    ExtPreValue,
    ExtToken,
    ExtQuoted,
    /// After a backslash inside a quoted string.
    ExtQuotedPair,
    /// Right after a quoted string's closing quote.
    ExtQuotedEnd,
    /// Whitespace after a value: only `;` may follow.
    ExtPostValue,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerLineStart,
    TrailerName,
    TrailerValue,
    TrailerLf {
        empty: bool,
    },
    Done,
}

/// Decoder state; feed it bytes with [`ChunkedDecoder::decode`].
#[derive(Clone, Debug)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    remaining: u64,
    line_len: usize,
    trailer_len: usize,
    trailer_fields: usize,
    body_len: u64,
    max_body: u64,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a chunked body, with no body limit.
    pub fn new() -> Self {
        Self::with_limit(u64::MAX)
    }

    /// A decoder whose body may carry at most `max_body` bytes of data: a
    /// chunk whose declared size would exceed it is refused with
    /// [`ChunkedError::TooLarge`] as soon as the size's digits are read.
    pub fn with_limit(max_body: u64) -> Self {
        ChunkedDecoder {
            state: State::Size { digits: 0 },
            size: 0,
            remaining: 0,
            line_len: 0,
            trailer_len: 0,
            trailer_fields: 0,
            body_len: 0,
            max_body,
        }
    }

    /// Whether the last chunk and the trailer section have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decoded body bytes seen so far.
    pub fn body_len(&self) -> u64 {
        self.body_len
    }

    /// Decode from `input`, calling `on_data` with each run of body bytes.
    /// Returns how many bytes of `input` were consumed; it stops right after
    /// the end of the body, so the rest of `input` belongs to the next message.
    pub fn decode(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<usize, ChunkedError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                State::Done => return Ok(i),
                State::Data => {
                    let avail = (input.len() - i) as u64;
                    let take = avail.min(self.remaining) as usize;
                    on_data(&input[i..i + take]);
                    self.body_len += take as u64;
                    self.remaining -= take as u64;
                    i += take;
                    if self.remaining == 0 {
                        self.state = State::DataCr;
                    }
                    continue;
                }
                State::Size { .. }
                | State::SizeWs
                | State::ExtPreName
                | State::ExtName
                | State::ExtPostName
                | State::ExtPreValue
                | State::ExtToken
                | State::ExtQuoted
                | State::ExtQuotedPair
                | State::ExtQuotedEnd
                | State::ExtPostValue => {
                    self.line_len += 1;
                    if self.line_len > MAX_LINE {
                        return Err(ChunkedError::LineTooLong);
                    }
                    self.size_line(b)?;
                }
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkedError::MissingCrlf);
                    }
                    self.line_len = 0;
                    if self.size == 0 {
                        self.state = State::TrailerLineStart;
                    } else {
                        self.remaining = self.size;
                        self.state = State::Data;
                    }
                    self.size = 0;
                }
                State::DataCr => {
                    if b != b'\r' {
                        return Err(ChunkedError::MissingCrlf);
                    }
                    self.state = State::DataLf;
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err(ChunkedError::MissingCrlf);
                    }
                    self.state = State::Size { digits: 0 };
                }
                State::TrailerLineStart
                | State::TrailerName
                | State::TrailerValue
                | State::TrailerLf { .. } => {
                    self.trailer_len += 1;
                    if self.trailer_len > MAX_TRAILERS {
                        return Err(ChunkedError::TrailersTooLarge);
                    }
                    if self.trailer(b)? {
                        return Ok(i + 1);
                    }
                }
            }
            i += 1;
        }
        Ok(i)
    }

    /// One byte of a chunk-size line (size and extensions, up to the CR).
    fn size_line(&mut self, b: u8) -> Result<(), ChunkedError> {
        let ext = ChunkedError::InvalidExtension;
        self.state = match (self.state, b) {
            (State::Size { digits }, _) if hex(b).is_some() => {
                if digits >= 15 {
                    return Err(ChunkedError::InvalidSize);
                }
                self.size = (self.size << 4) | u64::from(hex(b).unwrap_or(0));
                // More digits only make the size larger: refuse at once.
                if self.body_len.saturating_add(self.size) > self.max_body {
                    return Err(ChunkedError::TooLarge);
                }
                State::Size { digits: digits + 1 }
            }
            (State::Size { digits: 0 }, _) => return Err(ChunkedError::InvalidSize),
            (State::Size { .. }, b'\r') => State::SizeLf,
            (State::Size { .. }, b';') => State::ExtPreName,
            (State::Size { .. } | State::SizeWs, b' ' | b'\t') => State::SizeWs,
            (State::Size { .. }, _) => return Err(ChunkedError::InvalidSize),
            (State::SizeWs, b';') => State::ExtPreName,
            (State::SizeWs, _) => return Err(ext),

            (State::ExtPreName, b' ' | b'\t') => State::ExtPreName,
            (State::ExtPreName | State::ExtName, _) if is_tchar(b) => State::ExtName,
            (State::ExtPreName, _) => return Err(ext),
            (State::ExtName, b'\r') => State::SizeLf,
            (State::ExtName | State::ExtPostName, b';') => State::ExtPreName,
            (State::ExtName | State::ExtPostName, b'=') => State::ExtPreValue,
            (State::ExtName | State::ExtPostName, b' ' | b'\t') => State::ExtPostName,
            (State::ExtName | State::ExtPostName, _) => return Err(ext),

            (State::ExtPreValue, b' ' | b'\t') => State::ExtPreValue,
            (State::ExtPreValue, b'"') => State::ExtQuoted,
            (State::ExtPreValue | State::ExtToken, _) if is_tchar(b) => State::ExtToken,
            (State::ExtPreValue, _) => return Err(ext),
            (State::ExtToken | State::ExtQuotedEnd, b'\r') => State::SizeLf,
            (State::ExtToken | State::ExtQuotedEnd | State::ExtPostValue, b';') => {
                State::ExtPreName
            }
            (State::ExtToken | State::ExtQuotedEnd | State::ExtPostValue, b' ' | b'\t') => {
                State::ExtPostValue
            }
            (State::ExtToken | State::ExtQuotedEnd | State::ExtPostValue, _) => return Err(ext),

            (State::ExtQuoted, b'"') => State::ExtQuotedEnd,
            (State::ExtQuoted, b'\\') => State::ExtQuotedPair,
            // qdtext = HTAB / SP / %x21 / %x23-5B / %x5D-7E / obs-text
            (State::ExtQuoted, b'\t' | b' ' | 0x21..=0x7e | 0x80..=0xff) => State::ExtQuoted,
            (State::ExtQuoted, _) => return Err(ext),
            // quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
            (State::ExtQuotedPair, b'\t' | b' ' | 0x21..=0x7e | 0x80..=0xff) => State::ExtQuoted,
            (State::ExtQuotedPair, _) => return Err(ext),
            (s, _) => unreachable!("not a chunk-size line state: {s:?}"),
        };
        Ok(())
    }

    /// One byte of the trailer section; true once its final CRLF is read.
    fn trailer(&mut self, b: u8) -> Result<bool, ChunkedError> {
        self.state = match (self.state, b) {
            (State::TrailerLineStart, b'\r') => State::TrailerLf { empty: true },
            (State::TrailerLineStart, _) if is_tchar(b) => {
                self.trailer_fields += 1;
                if self.trailer_fields > MAX_TRAILER_FIELDS {
                    return Err(ChunkedError::TrailersTooLarge);
                }
                State::TrailerName
            }
            (State::TrailerName, _) if is_tchar(b) => State::TrailerName,
            (State::TrailerName, b':') => State::TrailerValue,
            // field-value: VCHAR, obs-text, SP, HTAB.
            (State::TrailerValue, b'\t' | b' ' | 0x21..=0x7e | 0x80..=0xff) => State::TrailerValue,
            (State::TrailerValue, b'\r') => State::TrailerLf { empty: false },
            (State::TrailerLf { empty: true }, b'\n') => {
                self.state = State::Done;
                return Ok(true);
            }
            (State::TrailerLf { empty: false }, b'\n') => State::TrailerLineStart,
            (_, b'\n') | (State::TrailerLf { .. }, _) => return Err(ChunkedError::MissingCrlf),
            _ => return Err(ChunkedError::InvalidTrailer),
        };
        Ok(false)
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `tchar` of RFC 9110 §5.6.2: the characters of a token.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(input: &[u8]) -> Result<(Vec<u8>, usize, bool), ChunkedError> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let n = d.decode(input, |b| out.extend_from_slice(b))?;
        Ok((out, n, d.is_done()))
    }

    #[test]
    fn decodes_and_stops_at_end() {
        let (out, n, done) =
            decode_all(b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nX-T: 1\r\n\r\nGET").unwrap();
        assert_eq!(out, b"hello world");
        assert!(done);
        assert_eq!(n, 38);
    }

    #[test]
    fn strictness() {
        assert_eq!(
            decode_all(b"5\nhello\r\n").unwrap_err(),
            ChunkedError::InvalidSize
        );
        assert_eq!(
            decode_all(b"zz\r\n").unwrap_err(),
            ChunkedError::InvalidSize
        );
        assert_eq!(
            decode_all(b"-1\r\n").unwrap_err(),
            ChunkedError::InvalidSize
        );
        assert_eq!(
            decode_all(b"1\r\nab\r\n").unwrap_err(),
            ChunkedError::MissingCrlf
        );
        assert_eq!(
            decode_all(b"fffffffffffffffff\r\n").unwrap_err(),
            ChunkedError::InvalidSize
        );
        assert_eq!(
            decode_all(b"0\r\n\n").unwrap_err(),
            ChunkedError::MissingCrlf
        );
    }

    /// The lenient cases an adversarial run found accepted, and their like.
    #[test]
    fn chunk_size_lines_follow_the_grammar() {
        for bad in [
            &b"2 erfrferferf\r\nab\r\n0\r\n\r\n"[..],
            b"2 3\r\nab\r\n0\r\n\r\n",
            b"0 5\r\n\r\n",
            b"2 \r\nab\r\n0\r\n\r\n",
            b"2\t\r\nab\r\n0\r\n\r\n",
            b"2;\r\nab\r\n0\r\n\r\n",
            b"2;a b\r\nab\r\n0\r\n\r\n",
            b"2;a=\r\nab\r\n0\r\n\r\n",
            b"2;a=b c\r\nab\r\n0\r\n\r\n",
            b"2;a=\"b\r\nab\r\n0\r\n\r\n",
            b"2;a=\"b\"c\r\nab\r\n0\r\n\r\n",
            b"2;a=b \r\nab\r\n0\r\n\r\n",
            b"2;a=\"\x00\"\r\nab\r\n0\r\n\r\n",
            b"2;a\x00\r\nab\r\n0\r\n\r\n",
            b"2;a=b\rX\nab\r\n0\r\n\r\n",
            b" 2\r\nab\r\n0\r\n\r\n",
            b"0x2\r\nab\r\n0\r\n\r\n",
            b"2\r\r\nab\r\n0\r\n\r\n",
        ] {
            assert!(
                decode_all(bad).is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(bad)
            );
        }
        for good in [
            &b"2;a\r\nab\r\n0\r\n\r\n"[..],
            b"2 ;a\r\nab\r\n0\r\n\r\n",
            b"2\t; a = b ;c\r\nab\r\n0\r\n\r\n",
            b"2;a=\"b c\\\"d\"\r\nab\r\n0;last\r\n\r\n",
            b"2;a=\"x\" ;b\r\nab\r\n0\r\n\r\n",
            b"002\r\nab\r\n000\r\n\r\n",
        ] {
            let (out, n, done) = decode_all(good)
                .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(good)));
            assert_eq!((out.as_slice(), n, done), (&b"ab"[..], good.len(), true));
        }
    }

    #[test]
    fn trailers_are_header_fields() {
        for bad in [
            &b"0\r\nGET / HTTP/1.1\r\n\r\n"[..],
            b"0\r\nX-A: \x00\r\n\r\n",
            b"0\r\n X-A: 1\r\n\r\n",
            b"0\r\n\tX-A: 1\r\n\r\n",
            b"0\r\nX-A : 1\r\n\r\n",
            b"0\r\n: 1\r\n\r\n",
            b"0\r\nX-A\r\n\r\n",
            b"0\r\nX-A: 1\n\r\n",
            b"0\r\nX-A: 1\r\r\n\r\n",
            b"0\r\nX-A: \x7f\r\n\r\n",
        ] {
            assert!(
                decode_all(bad).is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let good = b"0\r\nX-A: 1\r\nX-B:\r\nX-C:\t v \xff\r\n\r\n";
        assert_eq!(decode_all(good).unwrap(), (Vec::new(), good.len(), true));
        // As many trailer fields as a head may carry headers, and no more.
        let fields = |n: usize| {
            let mut w = b"0\r\n".to_vec();
            for i in 0..n {
                w.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
            }
            w.extend_from_slice(b"\r\n");
            w
        };
        assert!(decode_all(&fields(MAX_TRAILER_FIELDS)).unwrap().2);
        assert_eq!(
            decode_all(&fields(MAX_TRAILER_FIELDS + 1)).unwrap_err(),
            ChunkedError::TrailersTooLarge
        );
        let mut fat = b"0\r\nX-A: ".to_vec();
        fat.resize(MAX_TRAILERS + 10, b'a');
        assert_eq!(
            decode_all(&fat).unwrap_err(),
            ChunkedError::TrailersTooLarge
        );
    }

    #[test]
    fn a_declared_size_over_the_limit_is_refused_at_once() {
        let mut d = ChunkedDecoder::with_limit(1024);
        // 2 GiB declared: refused on its digits, before the line even ends.
        assert_eq!(d.decode(b"8000000", |_| {}), Err(ChunkedError::TooLarge));
        let mut d = ChunkedDecoder::with_limit(10);
        let n = d.decode(b"6\r\nhello \r\n", |_| {}).unwrap();
        assert_eq!(n, 11);
        assert_eq!(d.decode(b"5\r\n", |_| {}), Err(ChunkedError::TooLarge));
        let mut d = ChunkedDecoder::with_limit(10);
        d.decode(b"6\r\nhello \r\n4\r\nabcd\r\n0\r\n\r\n", |_| {})
            .unwrap();
        assert!(d.is_done());
        assert_eq!(d.body_len(), 10);
    }

    #[test]
    fn line_length_is_bounded() {
        let mut long = b"1;a=".to_vec();
        long.resize(MAX_LINE + 1, b'b');
        assert_eq!(decode_all(&long).unwrap_err(), ChunkedError::LineTooLong);
    }

    proptest! {
        #[test]
        fn round_trip_any_split(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..50), 0..8), split in 0usize..400) {
            let mut wire = Vec::new();
            let mut body = Vec::new();
            for c in &chunks {
                wire.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                wire.extend_from_slice(c);
                wire.extend_from_slice(b"\r\n");
                body.extend_from_slice(c);
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let split = split.min(wire.len());
            let mut d = ChunkedDecoder::new();
            let mut out = Vec::new();
            let a = d.decode(&wire[..split], |b| out.extend_from_slice(b)).unwrap();
            prop_assert_eq!(a, split);
            let b = d.decode(&wire[split..], |b| out.extend_from_slice(b)).unwrap();
            prop_assert_eq!(a + b, wire.len());
            prop_assert!(d.is_done());
            prop_assert_eq!(out, body);
        }

        #[test]
        fn never_panics(input in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut d = ChunkedDecoder::new();
            let _ = d.decode(&input, |_| {});
        }
    }
}
