//! Fuzzes the load generator's incremental HTTP/1.x response parser.
//!
//! The first byte chooses how the input is cut into reads and which responses answer a
//! HEAD request; the rest is the byte stream received on one connection. Parsing must never
//! panic, and feeding the stream in different read sizes must give the same responses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_load::response::parse_stream;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(ctl & 0x0f) + 1;
    let heads: Vec<bool> = (0..8).map(|i| ctl & (0x10 << (i % 4)) != 0).collect();
    let whole = parse_stream(stream, &heads, stream.len().max(1));
    let pieces = parse_stream(stream, &heads, piece);
    let bytes = parse_stream(stream, &heads, 1);
    // The responses decoded do not depend on how the stream was cut; the error that stopped
    // parsing may differ in kind (a size limit can be hit before a syntax error), not in
    // whether there is one.
    for other in [&pieces, &bytes] {
        assert_eq!(whole.0, other.0);
        assert_eq!(whole.1.is_some(), other.1.is_some());
    }
});
