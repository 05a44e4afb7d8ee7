//! Fuzzes the access-log line parser of `switchyard-trace`.
//!
//! Checks, for any input: parsing never panics; the streaming reader
//! accounts for every line; a parsed record, written back as a log line,
//! parses to the same record.

#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_trace::{parse_line, parse_reader, LineOutcome};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.split('\n') {
        if let LineOutcome::Record(record, _) = parse_line(line) {
            let record = record.to_owned_record();
            for formatted in [record.to_combined_line(), record.to_string()] {
                match parse_line(&formatted) {
                    LineOutcome::Record(back, _) => {
                        assert_eq!(back.to_owned_record(), record, "{formatted}")
                    }
                    other => panic!("{formatted:?} gave {other:?}"),
                }
            }
        }
    }

    let mut reader = parse_reader(data);
    let records = reader
        .by_ref()
        .map(|r| r.expect("reading a slice cannot fail"))
        .count() as u64;
    let report = reader.into_report();
    assert_eq!(report.records, records);
    assert_eq!(
        report.lines,
        report.records + report.skipped_total() + report.invalid_total()
    );
});
