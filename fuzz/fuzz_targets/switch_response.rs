//! Fuzzes the switch's strict response-head parser and the head rewriting in both directions.
//!
//! The first byte chooses whether the request was HEAD and the head-size limit; the rest is what
//! a node sent. Parsing must never panic; an accepted head lies inside the input, its framing is
//! consistent with its status, and the rewritten client head is itself accepted with the same
//! status and framing. The nodes' copy fields (`X-Switchyard-Copy`) are read from any head
//! without panicking, an offer read survives its own encoding, and neither side's field ever
//! crosses a rewrite.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_switch::response::{
    ask_cache_report, client_response_head, forward_request_head, from_cache, parse, BodyLength,
    CopyAsk, CopyOffer, ResponseError, MAX_HEADERS,
};

/// Header lines of a head (the lines between the status line and the blank line).
fn header_count(head: &[u8]) -> usize {
    head.split(|&b| b == b'\n')
        .skip(1)
        .filter(|l| !l.is_empty() && *l != b"\r")
        .count()
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, data)) = data.split_first() else {
        return;
    };
    let head_request = ctl & 1 == 1;
    let max_head = 256 + usize::from(ctl >> 1) * 64;
    match parse(data, head_request, max_head) {
        Ok(Some(m)) => {
            assert!(m.head_len <= data.len());
            assert!(m.head_len <= max_head);
            assert!((100..=599).contains(&m.status));
            if head_request || m.status < 200 || m.status == 204 || m.status == 304 {
                assert_eq!(m.body, BodyLength::None);
            }
            if m.body == BodyLength::UntilClose {
                assert!(!m.keep_alive);
            }
            // The node's cache answer and copy offer are read, and never reach the client.
            let _ = from_cache(&data[..m.head_len]);
            if let Some(offer) = CopyOffer::from_head(&data[..m.head_len]) {
                let again = format!(
                    "HTTP/1.1 200 OK\r\nETag: {}\r\nLast-Modified: {}\r\n{}: {}\r\n\r\n",
                    offer.etag,
                    offer.last_modified,
                    switchyard_switch::response::COPY_HEADER,
                    offer.header_value()
                );
                assert_eq!(CopyOffer::from_head(again.as_bytes()), Some(offer));
            }
            let mut out = Vec::new();
            client_response_head(&data[..m.head_len], &m, m.keep_alive, false, &mut out);
            assert!(!from_cache(&out));
            assert!(CopyOffer::from_head(&out).is_none());
            let again = match parse(&out, head_request, usize::MAX) {
                Ok(again) => again.expect("rewritten head is complete"),
                // The rewrite may add one header (`Connection: close`): a node head already at
                // the header limit then goes to the client with one header more than this
                // parser takes from a node. Nothing else may make it invalid.
                Err(ResponseError::TooLarge) if header_count(&out) == MAX_HEADERS + 1 => return,
                Err(e) => panic!("rewritten head is invalid: {e:?}"),
            };
            assert_eq!(again.status, m.status);
            assert_eq!(again.head_len, out.len());
            if m.body != BodyLength::UntilClose {
                assert_eq!(again.body, m.body);
            }
        }
        Ok(None) => assert!(data.len() <= max_head),
        Err(_) => {}
    }
    // The request side: any head the request parser accepts is rewritten into one it accepts
    // with the same message length.
    let limits = switchyard_http::request::Limits::default();
    if let Ok(switchyard_http::request::ParseOutcome::Complete(h)) =
        switchyard_http::request::parse(data, &limits)
    {
        let mut out = Vec::new();
        let http10 = h.version == switchyard_http::request::Version::Http10;
        forward_request_head(
            &data[..h.head_len],
            h.plain,
            http10,
            Some("192.0.2.1"),
            &mut out,
        );
        // A plain head copied whole is the head rewritten line by line.
        if h.plain {
            let mut by_line = Vec::new();
            forward_request_head(
                &data[..h.head_len],
                false,
                http10,
                Some("192.0.2.1"),
                &mut by_line,
            );
            assert_eq!(out, by_line);
        }
        // A client's own cache question never crosses; the switch's always does.
        let asked_by_client = matches!(
            switchyard_http::request::parse(&out, &limits),
            Ok(switchyard_http::request::ParseOutcome::Complete(f)) if f.cache_report
        );
        assert!(!asked_by_client);
        // Nor does a client's ask for a copy.
        assert!(!matches!(
            switchyard_http::request::parse(&out, &limits),
            Ok(switchyard_http::request::ParseOutcome::Complete(f)) if f.copy_ask.is_some()
        ));
        if let Some(v) = &h.copy_ask {
            if let Some(ask) = CopyAsk::parse(v) {
                assert!(!ask.member.is_empty() && !ask.member.contains(' '));
            }
        }
        ask_cache_report(&mut out);
        match switchyard_http::request::parse(&out, &limits) {
            Ok(switchyard_http::request::ParseOutcome::Complete(f)) => {
                assert_eq!(f.framing, h.framing);
                assert_eq!(f.target, h.target);
                assert_eq!(f.head_len, out.len());
                assert!(f.cache_report);
            }
            // Two more headers (X-Forwarded-For, X-Switchyard-Relay) may cross the header-count
            // or size limit: the node then refuses it with 431, which is safe.
            Err(e) if e.status() == 431 => {}
            other => panic!("forwarded head refused: {other:?}"),
        }
    }
});
