//! Fuzzes what the admin listener does with an operator action: the strict request parser, the
//! guard that reads the token and `Origin` headers from the raw head, and the switch's action
//! path (`nodes/ID/VERB?g=GEN`).
//!
//! Nothing may panic; the guard lets a request through only when its token header holds the
//! exact token and any `Origin` names the Host; an action that parses is written back to a
//! path that parses to the same action.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use switchyard_admin::actions::{header, Actions, Verdict, TOKEN_HEADER};
use switchyard_admin::Page;
use switchyard_http::request::{parse, Limits, ParseOutcome};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fuzz_target!(|data: &[u8]| {
    if let Ok(rest) = std::str::from_utf8(data) {
        if let Ok(a) = switchyard_switch::actions::parse(rest) {
            let again = format!("nodes/{}/{}?g={}", a.node, a.verb.as_str(), a.generation);
            assert_eq!(switchyard_switch::actions::parse(&again), Ok(a));
        }
    }
    let Ok(ParseOutcome::Complete(head)) = parse(data, &Limits::default()) else {
        return;
    };
    let raw = &data[..head.head_len];
    let actions = Actions::with_token(
        Arc::new(|| true),
        Arc::new(|_| {
            (
                200,
                Page {
                    content_type: "text/plain",
                    body: Vec::new(),
                },
            )
        }),
        TOKEN.to_owned(),
    );
    if actions.judge(raw, head.host.as_deref()) == Verdict::Run {
        assert_eq!(header(raw, TOKEN_HEADER), Some(TOKEN));
        if let Some(origin) = header(raw, "origin") {
            assert_eq!(
                origin.split_once("://").map(|(_, h)| h),
                head.host.as_deref()
            );
        }
    }
});
