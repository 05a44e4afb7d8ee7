//! Load reports from nodes, as the switch decodes them from UDP datagrams:
//! decoding never panics, and a decoded report encodes to text that decodes
//! to the same report.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_node::report::Report;

fuzz_target!(|data: &[u8]| {
    if let Some(r) = Report::decode(data) {
        let text = r.encode();
        assert_eq!(Report::decode(text.as_bytes()), Some(r));
    }
});
