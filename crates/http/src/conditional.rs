//! Validators and conditional requests (RFC 9110 §8.8, §13).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A strong entity tag built from a file's identity: inode, size and
/// modification time (nanoseconds), like common static servers do.
pub fn make_etag(inode: u64, len: u64, mtime: SystemTime) -> String {
    let nanos = mtime
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos();
    format!("\"{inode:x}-{len:x}-{nanos:x}\"")
}

/// Format a time as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

/// Whether `If-None-Match` matches `etag` (weak comparison; `*` matches).
/// A match means: answer 304 to GET/HEAD.
pub fn none_match(header: &str, etag: &str) -> bool {
    let header = header.trim();
    if header == "*" {
        return true;
    }
    let ours = opaque(etag);
    header.split(',').any(|tag| opaque(tag.trim()) == ours)
}

/// Whether the resource is unmodified since the `If-Modified-Since` date.
/// An unparseable date makes the condition false (serve the resource).
pub fn not_modified_since(header: &str, last_modified: SystemTime) -> bool {
    match httpdate::parse_http_date(header.trim()) {
        Ok(since) => whole_seconds(last_modified) <= whole_seconds(since),
        Err(_) => false,
    }
}

/// Whether `If-Range` lets a range request be honoured: a strong ETag that
/// equals ours, or a date equal to our Last-Modified (RFC 9110 §13.1.5).
pub fn if_range_allows(header: &str, etag: &str, last_modified: SystemTime) -> bool {
    let header = header.trim();
    if header.starts_with("W/") {
        return false;
    }
    if header.starts_with('"') {
        return header == etag;
    }
    match httpdate::parse_http_date(header) {
        Ok(date) => whole_seconds(date) == whole_seconds(last_modified),
        Err(_) => false,
    }
}

fn opaque(tag: &str) -> &str {
    tag.strip_prefix("W/").unwrap_or(tag)
}

fn whole_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags() {
        let t = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let e = make_etag(7, 100, t);
        assert!(e.starts_with('"') && e.ends_with('"'));
        assert!(none_match(&e, &e));
        assert!(none_match(&format!("\"x\", W/{e}"), &e));
        assert!(none_match("*", &e));
        assert!(!none_match("\"x\"", &e));
    }

    #[test]
    fn dates() {
        let t = UNIX_EPOCH + Duration::from_millis(1_000_000_500);
        let d = http_date(t);
        assert!(not_modified_since(&d, t));
        assert!(!not_modified_since(
            &http_date(t - Duration::from_secs(5)),
            t
        ));
        assert!(!not_modified_since("yesterday", t));
        assert!(if_range_allows(&d, "\"e\"", t));
        assert!(if_range_allows("\"e\"", "\"e\"", t));
        assert!(!if_range_allows("W/\"e\"", "\"e\"", t));
        assert!(!if_range_allows("\"f\"", "\"e\"", t));
    }
}
