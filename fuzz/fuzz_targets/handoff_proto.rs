#![no_main]
//! Decodes arbitrary bytes as switch–node control frames; whatever decodes
//! must re-encode to exactly the bytes it came from, and a frame buffer fed
//! the same bytes in two pieces must agree.

use libfuzzer_sys::fuzz_target;
use switchyard_handoff::proto::{FrameBuffer, Message};

fuzz_target!(|data: &[u8]| {
    let mut off = 0;
    while off < data.len() {
        match Message::decode(&data[off..]) {
            Ok(Some((m, used))) => {
                assert!(used > 0 && used <= data.len() - off);
                let again = m.to_frame().expect("a decoded message re-encodes");
                assert_eq!(&again[..], &data[off..off + used]);
                off += used;
            }
            Ok(None) | Err(_) => break,
        }
    }
    let mut fb = FrameBuffer::new();
    let half = data.len() / 2;
    fb.extend(&data[..half]);
    let mut n1 = 0;
    while let Ok(Some(_)) = fb.next_message() {
        n1 += 1;
    }
    fb.extend(&data[half..]);
    while let Ok(Some(_)) = fb.next_message() {
        n1 += 1;
    }
    let _ = n1;
});
