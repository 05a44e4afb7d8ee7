//! `Cache-Control` of a response as a shared cache reads it (RFC 9111 §5.2): its directives,
//! and the freshness lifetime they give (§4.2.1).
//!
//! The field is a comma-separated list of `name` or `name=value` directives, a value being a
//! token or a quoted string (which may contain commas). Names are case-insensitive.

/// The largest delta-seconds value a cache keeps (RFC 9111 §1.2.2): larger ones mean "this".
pub const MAX_DELTA_SECONDS: u64 = 1 << 31;

/// The directives of a `Cache-Control` value (several field lines joined with `,`), in order:
/// (name, value without quotes and escapes). Empty members are skipped; a directive whose
/// quoted value never ends takes the rest of the field.
pub fn directives(field: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut chars = field.chars().peekable();
    loop {
        // A name up to `=`, `,` or the end.
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ',' {
                break;
            }
            name.push(c);
            chars.next();
        }
        let name = name.trim().to_ascii_lowercase();
        let mut value = None;
        if chars.peek() == Some(&'=') {
            chars.next();
            while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
                chars.next();
            }
            let mut v = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(e) = chars.next() {
                                v.push(e);
                            }
                        }
                        c => v.push(c),
                    }
                }
                // Whatever follows the closing quote up to the next comma is not part of it.
                while chars.peek().is_some_and(|c| *c != ',') {
                    chars.next();
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ',' {
                        break;
                    }
                    v.push(c);
                    chars.next();
                }
                v = v.trim().to_string();
            }
            value = Some(v);
        }
        if !name.is_empty() {
            out.push((name, value));
        }
        if chars.next().is_none() {
            return out;
        }
    }
}

/// A delta-seconds value: digits only, clamped to [`MAX_DELTA_SECONDS`]; `None` if invalid.
fn delta_seconds(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digits only: the parse fails only by overflow.
    Some(
        v.parse::<u64>()
            .map_or(MAX_DELTA_SECONDS, |n| n.min(MAX_DELTA_SECONDS)),
    )
}

/// The freshness lifetime in seconds a shared cache gives a response with this
/// `Cache-Control` value: `s-maxage` when present, else `max-age` (RFC 9111 §4.2.1); the first
/// occurrence of each counts. `None` when neither is present (the cache uses its own
/// heuristic). A present directive with a missing or invalid value gives 0: the response is
/// stale at once and must be revalidated (§4.2.1: "consider the response to be stale").
pub fn shared_max_age(field: &str) -> Option<u64> {
    let d = directives(field);
    let first = |name: &str| {
        d.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_deref().and_then(delta_seconds).unwrap_or(0))
    };
    first("s-maxage").or_else(|| first("max-age"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_with_tokens_and_quoted_strings() {
        assert_eq!(
            directives("public, Max-Age=60 ,private=\"a, b\", no-cache, x=\"q\\\"\"z"),
            vec![
                ("public".into(), None),
                ("max-age".into(), Some("60".into())),
                ("private".into(), Some("a, b".into())),
                ("no-cache".into(), None),
                ("x".into(), Some("q\"".into())),
            ]
        );
        assert_eq!(directives(""), vec![]);
        assert_eq!(directives(" , ,"), vec![]);
        assert_eq!(
            directives("a=\"open"),
            vec![("a".into(), Some("open".into()))]
        );
    }

    #[test]
    fn freshness_for_a_shared_cache() {
        assert_eq!(shared_max_age("public"), None);
        assert_eq!(shared_max_age("max-age=60"), Some(60));
        assert_eq!(shared_max_age("max-age=\"60\""), Some(60));
        assert_eq!(shared_max_age("max-age=60, s-maxage=5"), Some(5));
        assert_eq!(
            shared_max_age("max-age=60, max-age=1"),
            Some(60),
            "the first counts"
        );
        assert_eq!(shared_max_age("max-age=0"), Some(0));
        assert_eq!(shared_max_age("max-age"), Some(0), "invalid: stale");
        assert_eq!(shared_max_age("max-age=-1"), Some(0));
        assert_eq!(shared_max_age("max-age=1.5"), Some(0));
        assert_eq!(
            shared_max_age("max-age=99999999999999999999999"),
            Some(MAX_DELTA_SECONDS)
        );
        assert_eq!(shared_max_age("private=\"max-age=5\""), None);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_keeps_to_the_bound(s in ".{0,200}") {
            let _ = directives(&s);
            if let Some(v) = shared_max_age(&s) {
                proptest::prop_assert!(v <= MAX_DELTA_SECONDS);
            }
        }
    }
}
