//! Single byte ranges (RFC 9110 §14).
//!
//! One range is served as 206. A range set with more than one range is
//! answered with the whole representation (200), which RFC 9110 §14.2
//! allows and which avoids multipart bodies. Syntactically invalid range
//! headers are ignored, as the RFC requires.

/// What to send for a `Range` header against a representation of `len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeDecision {
    /// Send the whole representation (200).
    Full,
    /// Send bytes `start..=end` (206).
    Partial { start: u64, end: u64 },
    /// Nothing satisfiable (416 with `Content-Range: bytes */len`).
    Unsatisfiable,
}

/// Evaluate a `Range` header value.
pub fn evaluate(header: &str, len: u64) -> RangeDecision {
    let Some((unit, set)) = header.split_once('=') else {
        return RangeDecision::Full;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return RangeDecision::Full;
    }
    let mut specs = set.split(',').map(str::trim).filter(|s| !s.is_empty());
    let (Some(spec), None) = (specs.next(), specs.next()) else {
        return RangeDecision::Full;
    };
    let Some((first, last)) = spec.split_once('-') else {
        return RangeDecision::Full;
    };
    let first = first.trim();
    let last = last.trim();
    if first.is_empty() {
        let Some(suffix) = digits(last) else {
            return RangeDecision::Full;
        };
        if suffix == 0 || len == 0 {
            return RangeDecision::Unsatisfiable;
        }
        return RangeDecision::Partial {
            start: len.saturating_sub(suffix),
            end: len - 1,
        };
    }
    let Some(start) = digits(first) else {
        return RangeDecision::Full;
    };
    let end = if last.is_empty() {
        u64::MAX
    } else {
        match digits(last) {
            Some(e) if e >= start => e,
            _ => return RangeDecision::Full,
        }
    };
    if start >= len {
        return RangeDecision::Unsatisfiable;
    }
    RangeDecision::Partial {
        start,
        end: end.min(len - 1),
    }
}

fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::RangeDecision::*;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn forms() {
        assert_eq!(evaluate("bytes=0-9", 100), Partial { start: 0, end: 9 });
        assert_eq!(evaluate("bytes=90-", 100), Partial { start: 90, end: 99 });
        assert_eq!(evaluate("bytes=-10", 100), Partial { start: 90, end: 99 });
        assert_eq!(evaluate("bytes=-500", 100), Partial { start: 0, end: 99 });
        assert_eq!(
            evaluate("bytes=50-500", 100),
            Partial { start: 50, end: 99 }
        );
        assert_eq!(evaluate("Bytes = 1-1", 100), Partial { start: 1, end: 1 });
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(evaluate("bytes=100-", 100), Unsatisfiable);
        assert_eq!(evaluate("bytes=100-200", 100), Unsatisfiable);
        assert_eq!(evaluate("bytes=-0", 100), Unsatisfiable);
        assert_eq!(evaluate("bytes=0-", 0), Unsatisfiable);
    }

    #[test]
    fn ignored() {
        assert_eq!(evaluate("bytes=5-1", 100), Full);
        assert_eq!(evaluate("items=0-1", 100), Full);
        assert_eq!(evaluate("bytes=0-1,5-6", 100), Full);
        assert_eq!(evaluate("bytes=a-b", 100), Full);
        assert_eq!(evaluate("bytes", 100), Full);
        assert_eq!(evaluate("bytes=+1-2", 100), Full);
    }

    proptest! {
        #[test]
        fn partial_is_inside(h in "bytes=[0-9]{0,4}-[0-9]{0,4}", len in 0u64..5000) {
            if let Partial { start, end } = evaluate(&h, len) {
                prop_assert!(start <= end && end < len);
            }
        }
    }
}
