//! Request heads, chunked bodies and target normalization on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_http::chunked::ChunkedDecoder;
use switchyard_http::path::normalize;
use switchyard_http::request::{parse, BodyFraming, Limits, ParseOutcome};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    match parse(data, &limits) {
        Ok(ParseOutcome::Complete(head)) => {
            assert!(head.head_len <= data.len());
            assert!(head.head_len <= limits.max_head_bytes + 2);
            if let Ok(clean) = normalize(&head.target) {
                assert!(clean.path.starts_with('/'));
                assert!(!clean.path.split('/').any(|s| s == ".."));
            }
            if head.framing == BodyFraming::Chunked {
                let mut d = ChunkedDecoder::new();
                if let Ok(used) = d.decode(&data[head.head_len..], |_| {}) {
                    assert!(used <= data.len() - head.head_len);
                }
            }
        }
        Ok(ParseOutcome::Partial) => assert!(data.len() <= limits.max_head_bytes),
        Err(e) => assert!((400..=505).contains(&e.status())),
    }
});
