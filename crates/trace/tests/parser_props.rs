//! Property tests of the log parser: it never panics, every line is
//! accounted for, and formatted records parse back to themselves.

use proptest::prelude::*;
use switchyard_trace::time::{MAX_TIME, MIN_TIME};
use switchyard_trace::{parse_line, parse_reader, LineOutcome, LogRecord};

fn record() -> impl Strategy<Value = LogRecord> {
    let text = "[^\"\\\\\\x00-\\x1f]{0,12}|[ -~]{0,30}|\\PC{0,10}";
    (
        "[A-Za-z0-9.:_-]{1,40}",
        MIN_TIME..=MAX_TIME,
        "[A-Z]{1,7}|[!#$%&'*+.^_`|~0-9a-z-]{1,5}",
        "/[!-~]{0,40}|\\*|/\\PC{0,10}",
        proptest::option::of("HTTP/[0-9]\\.[0-9]|HTTP/2"),
        proptest::option::of(0u16..1000),
        proptest::option::of(any::<u64>()),
        proptest::option::of(text.prop_filter("not a dash", |s| s != "-")),
        proptest::option::of(text.prop_filter("not a dash", |s| s != "-")),
    )
        .prop_map(
            |(client, time, method, target, protocol, status, bytes, referer, user_agent)| {
                LogRecord {
                    client,
                    time,
                    method,
                    // The target of a record has no spaces at its ends and,
                    // without a protocol, cannot end in an `HTTP/` word.
                    target: target.trim_matches(' ').replace(' ', "_"),
                    protocol,
                    status,
                    bytes,
                    referer,
                    user_agent,
                }
            },
        )
}

fn parses_back(line: &str, want: &LogRecord) {
    match parse_line(line) {
        LineOutcome::Record(r, repairs) => {
            assert_eq!(&r.to_owned_record(), want, "{line}");
            assert!(repairs.is_empty(), "{line}: {repairs:?}");
        }
        other => panic!("{line}: {other:?}"),
    }
}

/// A record parsed from `line`, written back, parses to itself.
fn fixed_point(line: &str) -> Result<(), TestCaseError> {
    if let LineOutcome::Record(r, _) = parse_line(line) {
        let r = r.to_owned_record();
        for formatted in [r.to_string(), r.to_combined_line()] {
            match parse_line(&formatted) {
                LineOutcome::Record(back, _) => prop_assert_eq!(back.to_owned_record(), r.clone()),
                other => prop_assert!(false, "{:?} from {:?}", other, formatted),
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_on_any_text(line in "\\PC{0,200}") {
        let _ = parse_line(&line);
    }

    #[test]
    fn log_like_text_never_panics_and_records_are_fixed_points(
        line in "[a-z0-9.]{0,5} [-a-z]{0,2} [-a-z]{0,2} \\[[0-9]{1,2}/(Jun|Feb|x)/[0-9]{4}:[0-9]{2}:[0-9]{2}:[0-9]{2}( [+-][0-9]{4})?\\]? ?\"[A-Z /.a-z\"\\\\]{0,20}\"? ?[0-9-]{0,4} ?[0-9-]{0,6}( \"[^\"]{0,5}\"?)?( \"[\\\\a-z\" ]{0,8}\"?)?( [a-z0-9\"]{0,4})?"
    ) {
        fixed_point(&line)?;
    }

    #[test]
    fn parsed_records_are_fixed_points(line in "\\PC{0,200}") {
        fixed_point(&line)?;
    }

    #[test]
    fn every_line_is_accounted_for(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut reader = parse_reader(&bytes[..]);
        let records = reader.by_ref().count() as u64;
        let r = reader.into_report();
        prop_assert_eq!(r.records, records);
        prop_assert_eq!(r.lines, r.records + r.skipped_total() + r.invalid_total());
        let newlines = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
        let last_unterminated = u64::from(!bytes.is_empty() && bytes.last() != Some(&b'\n'));
        prop_assert_eq!(r.lines, newlines + last_unterminated);
    }

    #[test]
    fn formatted_records_round_trip(r in record()) {
        parses_back(&r.to_combined_line(), &r);
        let common = LogRecord { referer: None, user_agent: None, ..r.clone() };
        parses_back(&common.to_common_line(), &common);
        parses_back(&r.to_string(), &r);
    }
}
