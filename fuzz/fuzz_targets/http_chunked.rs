//! Fuzzes the chunked decoder's chunk-size lines, extensions and trailers against a reference.
//!
//! The first byte chooses the body limit and where the input is cut; the rest is a chunked body
//! as it arrives. The reference below reads the same grammar (RFC 9112 §7.1) a whole line at a
//! time, written independently of the decoder's byte-wise state machine: when it finds a
//! complete valid body the decoder must end exactly there with the same data; when it finds an
//! error the decoder must refuse; and the decoder's answer must not depend on how the input is
//! cut into reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_http::chunked::{
    is_tchar, ChunkedDecoder, ChunkedError, MAX_LINE, MAX_TRAILERS, MAX_TRAILER_FIELDS,
};

#[derive(Debug, PartialEq)]
enum Reference {
    /// A valid body of this many bytes carrying this data.
    Complete(usize, Vec<u8>),
    /// Valid so far; more bytes are needed.
    Incomplete,
    /// Not a valid chunked body.
    Invalid,
}

fn crlf_line(data: &[u8], from: usize) -> Option<usize> {
    data[from..]
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

fn ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    &s[n..]
}

fn token(s: &[u8]) -> Option<&[u8]> {
    let n = s.iter().take_while(|&&b| is_tchar(b)).count();
    (n > 0).then(|| &s[n..])
}

fn quoted(s: &[u8]) -> Option<&[u8]> {
    let mut i = 1;
    loop {
        match *s.get(i)? {
            b'"' => return Some(&s[i + 1..]),
            b'\\' => {
                let c = *s.get(i + 1)?;
                if !(c == b'\t' || c == b' ' || (0x21..=0x7e).contains(&c) || c >= 0x80) {
                    return None;
                }
                i += 2;
            }
            c if c == b'\t' || c == b' ' || c == 0x21 || (0x23..=0x7e).contains(&c) || c >= 0x80 => {
                i += 1
            }
            _ => return None,
        }
    }
}

/// `*( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )`
fn extensions(mut s: &[u8]) -> bool {
    while !s.is_empty() {
        let t = ws(s);
        let Some(rest) = t.strip_prefix(b";") else {
            return false;
        };
        let Some(rest) = token(ws(rest)) else {
            return false;
        };
        s = rest;
        if let Some(v) = ws(s).strip_prefix(b"=") {
            let v = ws(v);
            let after = if v.first() == Some(&b'"') {
                quoted(v)
            } else {
                token(v)
            };
            match after {
                Some(a) => s = a,
                None => return false,
            }
        }
    }
    true
}

fn field_line(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return false;
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    !name.is_empty()
        && name.iter().all(|&b| is_tchar(b))
        && value
            .iter()
            .all(|&b| b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b) || b >= 0x80)
}

fn reference(data: &[u8], max_body: u64) -> Reference {
    let mut pos = 0;
    let mut body = Vec::new();
    loop {
        let Some(eol) = crlf_line(data, pos) else {
            return Reference::Incomplete;
        };
        let line = &data[pos..eol];
        if line.len() + 1 > MAX_LINE {
            return Reference::Invalid;
        }
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 || digits > 15 || !extensions(&line[digits..]) {
            return Reference::Invalid;
        }
        let size = u64::from_str_radix(std::str::from_utf8(&line[..digits]).unwrap(), 16).unwrap();
        if body.len() as u64 + size > max_body {
            return Reference::Invalid;
        }
        pos = eol + 2;
        if size == 0 {
            break;
        }
        let size = size as usize;
        if data.len() < pos + size + 2 {
            // The data may be incomplete; a wrong byte where the CRLF goes is already an error.
            let have = data.len().saturating_sub(pos + size);
            if data.len() > pos + size && data[pos + size..] != b"\r\n"[..have] {
                return Reference::Invalid;
            }
            return Reference::Incomplete;
        }
        body.extend_from_slice(&data[pos..pos + size]);
        if &data[pos + size..pos + size + 2] != b"\r\n" {
            return Reference::Invalid;
        }
        pos += size + 2;
    }
    let (mut fields, start) = (0, pos);
    loop {
        let Some(eol) = crlf_line(data, pos) else {
            return Reference::Incomplete;
        };
        if eol + 2 - start > MAX_TRAILERS {
            return Reference::Invalid;
        }
        let line = &data[pos..eol];
        pos = eol + 2;
        if line.is_empty() {
            return Reference::Complete(pos, body);
        }
        fields += 1;
        if fields > MAX_TRAILER_FIELDS || !field_line(line) {
            return Reference::Invalid;
        }
    }
}

type Outcome = Result<(usize, bool, Vec<u8>), ChunkedError>;

fn decode(data: &[u8], max_body: u64, cuts: &[usize]) -> Outcome {
    let mut d = ChunkedDecoder::with_limit(max_body);
    let mut out = Vec::new();
    let mut used = 0;
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&data.len())) {
        let to = to.clamp(from, data.len());
        let n = d.decode(&data[from..to], |b| out.extend_from_slice(b))?;
        used += n;
        if d.is_done() {
            break;
        }
        assert_eq!(n, to - from, "stopped early without being done");
        from = to;
    }
    assert_eq!(d.body_len(), out.len() as u64);
    Ok((used, d.is_done(), out))
}

fuzz_target!(|input: &[u8]| {
    let Some((&ctl, data)) = input.split_first() else {
        return;
    };
    let max_body = if ctl & 0x80 != 0 {
        u64::MAX
    } else {
        u64::from(ctl & 0x1f) * 8
    };
    let whole = decode(data, max_body, &[]);
    let cut = usize::from(ctl & 0x60) * data.len() / 0x60;
    let pieces = decode(data, max_body, &[cut / 2, cut]);
    let bytes: Vec<usize> = (1..data.len()).collect();
    let single = decode(data, max_body, &bytes);
    assert_eq!(whole, pieces);
    assert_eq!(whole, single);
    match reference(data, max_body) {
        Reference::Complete(len, body) => assert_eq!(whole, Ok((len, true, body))),
        Reference::Invalid => assert!(whole.is_err(), "accepted: {whole:?}"),
        Reference::Incomplete => assert!(!matches!(whole, Ok((_, true, _)))),
    }
});
