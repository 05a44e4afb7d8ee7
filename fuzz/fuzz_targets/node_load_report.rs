//! Load reports from nodes, as the switch decodes them from UDP datagrams:
//! decoding never panics, and a decoded report encodes to text that decodes
//! to the same report.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_runtime::report::Datagram;

fuzz_target!(|data: &[u8]| {
    if let Some(d) = Datagram::decode(data) {
        let text = d.encode();
        assert_eq!(Datagram::decode(text.as_bytes()), Some(d));
    }
});
