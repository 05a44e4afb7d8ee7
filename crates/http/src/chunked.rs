//! Incremental decoder for `Transfer-Encoding: chunked` bodies.
//!
//! Written by hand because it must be strict in exactly the ways a
//! smuggling-safe server needs (bare LF, oversize or non-hex chunk sizes,
//! unbounded extensions and trailers are all errors) and it must work on
//! whatever slice the socket returned, without copying the data.

use thiserror::Error;

/// Longest chunk-size line (size, extensions) accepted.
const MAX_LINE: usize = 4096;
/// Largest trailer section accepted.
const MAX_TRAILERS: usize = 16 * 1024;

/// A chunked body that cannot be decoded.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum ChunkedError {
    #[error("invalid chunk size")]
    InvalidSize,
    #[error("chunk size line too long")]
    LineTooLong,
    #[error("missing CRLF after chunk data")]
    MissingCrlf,
    #[error("trailer section too large")]
    TrailersTooLarge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Size { digits: u8 },
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerLineStart,
    TrailerLine,
    TrailerLf { empty: bool },
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
    body_len: u64,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a chunked body.
    pub fn new() -> Self {
        ChunkedDecoder {
            state: State::Size { digits: 0 },
            size: 0,
            remaining: 0,
            line_len: 0,
            trailer_len: 0,
            body_len: 0,
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
                State::Size { digits } => {
                    self.bump_line()?;
                    if let Some(v) = hex(b) {
                        if digits >= 15 {
                            return Err(ChunkedError::InvalidSize);
                        }
                        self.size = (self.size << 4) | u64::from(v);
                        self.state = State::Size { digits: digits + 1 };
                    } else if digits == 0 {
                        return Err(ChunkedError::InvalidSize);
                    } else if b == b'\r' {
                        self.state = State::SizeLf;
                    } else if b == b';' || b == b' ' || b == b'\t' {
                        self.state = State::Extension;
                    } else {
                        return Err(ChunkedError::InvalidSize);
                    }
                    i += 1;
                }
                State::Extension => {
                    self.bump_line()?;
                    if b == b'\r' {
                        self.state = State::SizeLf;
                    } else if b == b'\n' || (b < 0x20 && b != b'\t') || b == 0x7f {
                        return Err(ChunkedError::InvalidSize);
                    }
                    i += 1;
                }
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkedError::InvalidSize);
                    }
                    i += 1;
                    self.line_len = 0;
                    if self.size == 0 {
                        self.state = State::TrailerLineStart;
                    } else {
                        self.remaining = self.size;
                        self.state = State::Data;
                    }
                    self.size = 0;
                }
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
                }
                State::DataCr => {
                    if b != b'\r' {
                        return Err(ChunkedError::MissingCrlf);
                    }
                    self.state = State::DataLf;
                    i += 1;
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err(ChunkedError::MissingCrlf);
                    }
                    self.state = State::Size { digits: 0 };
                    i += 1;
                }
                State::TrailerLineStart | State::TrailerLine => {
                    self.trailer_len += 1;
                    if self.trailer_len > MAX_TRAILERS {
                        return Err(ChunkedError::TrailersTooLarge);
                    }
                    let empty = self.state == State::TrailerLineStart;
                    if b == b'\r' {
                        self.state = State::TrailerLf { empty };
                    } else if b == b'\n' {
                        return Err(ChunkedError::MissingCrlf);
                    } else {
                        self.state = State::TrailerLine;
                    }
                    i += 1;
                }
                State::TrailerLf { empty } => {
                    if b != b'\n' {
                        return Err(ChunkedError::MissingCrlf);
                    }
                    i += 1;
                    if empty {
                        self.state = State::Done;
                        return Ok(i);
                    }
                    self.state = State::TrailerLineStart;
                }
            }
        }
        Ok(i)
    }

    fn bump_line(&mut self) -> Result<(), ChunkedError> {
        self.line_len += 1;
        if self.line_len > MAX_LINE {
            Err(ChunkedError::LineTooLong)
        } else {
            Ok(())
        }
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
