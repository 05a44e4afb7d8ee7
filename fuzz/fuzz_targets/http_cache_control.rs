//! Fuzzes the `Cache-Control` reader: any text gives directives whose names are trimmed
//! lower case and non-empty, and a freshness lifetime within the delta-seconds bound that
//! agrees with the directives it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_http::cache_control::{directives, shared_max_age, MAX_DELTA_SECONDS};

fuzz_target!(|data: &[u8]| {
    let Ok(field) = std::str::from_utf8(data) else {
        return;
    };
    let d = directives(field);
    for (name, _) in &d {
        assert!(!name.is_empty());
        assert_eq!(name, &name.to_ascii_lowercase());
        assert_eq!(name.trim(), name);
    }
    let has = |n: &str| d.iter().any(|(name, _)| name == n);
    match shared_max_age(field) {
        Some(v) => {
            assert!(v <= MAX_DELTA_SECONDS);
            assert!(has("s-maxage") || has("max-age"));
        }
        None => assert!(!has("s-maxage") && !has("max-age")),
    }
});
