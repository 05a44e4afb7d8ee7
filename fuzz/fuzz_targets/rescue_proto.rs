#![no_main]
//! Feeds arbitrary bytes to the rescue protocol: line splitting, decoding and a session.
//! Whatever decodes must re-encode to a line of at most `MAX_LINE` bytes that decodes to the
//! same message; a session fed the same bytes whole or in two pieces must agree on the
//! outcome; nothing may panic.

use libfuzzer_sys::fuzz_target;
use std::time::Duration;
use switchyard_rescue::proto::{LineReader, Message, Request, MAX_LINE};
use switchyard_rescue::{Received, Session};

fn session_run(pieces: &[&[u8]]) -> (Vec<Received>, bool) {
    let mut s = Session::new(Duration::from_secs(1));
    // Two requests of ours outstanding, so that responses 1 and 2 can match.
    s.send_request(Duration::ZERO, Request::Rate { kbps: 1 }).unwrap();
    s.send_request(Duration::ZERO, Request::Shutdown).unwrap();
    let mut out = Vec::new();
    for p in pieces {
        match s.receive(p) {
            Ok(v) => out.extend(v),
            Err(_) => return (out, true),
        }
    }
    (out, false)
}

fuzz_target!(|data: &[u8]| {
    let mut r = LineReader::new();
    r.push(data);
    while let Ok(Some(line)) = r.next_line() {
        assert!(line.len() < MAX_LINE);
        if let Ok(m) = Message::decode(&line) {
            let again = m.to_line().expect("a decoded message re-encodes");
            assert!(again.len() <= MAX_LINE);
            assert_eq!(Message::decode(&again[..again.len() - 1]), Ok(m));
        }
    }
    let half = data.len() / 2;
    let (whole, whole_failed) = session_run(&[data]);
    let (split, split_failed) = session_run(&[&data[..half], &data[half..]]);
    assert_eq!(whole_failed, split_failed);
    if !whole_failed {
        assert_eq!(whole, split);
    }
});
