//! From request target to a path that cannot leave the document root.
//!
//! The target is percent-decoded once, then its dot segments are resolved
//! (RFC 3986 §5.2.4). A `..` that would climb above the root is an error,
//! not something to clamp: such a request is an attack or a bug, and it is
//! answered 400. NUL bytes, malformed escapes and non-UTF-8 names are
//! refused. The result is still only a *name*; the node opens it beneath the
//! root with `openat2(RESOLVE_BENEATH)` so symlinks cannot escape either.

use thiserror::Error;

/// Why a target cannot be mapped to a path.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum PathError {
    #[error("target is not an absolute path")]
    NotAbsolute,
    #[error("malformed percent-encoding")]
    BadEscape,
    #[error("NUL byte in path")]
    Nul,
    #[error("path is not valid UTF-8")]
    NotUtf8,
    #[error("path climbs above the root")]
    Traversal,
}

/// A normalized path: starts with `/`, no empty, `.` or `..` segments.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CleanPath {
    /// `/a/b/c`, or `/` for the root.
    pub path: String,
    /// Whether the target ended with a slash (a directory was asked for).
    pub trailing_slash: bool,
}

impl CleanPath {
    /// The path relative to the root (`a/b/c`, or empty for the root).
    pub fn relative(&self) -> &str {
        &self.path[1..]
    }
}

/// Normalize a request target (origin-form or absolute-form).
pub fn normalize(target: &str) -> Result<CleanPath, PathError> {
    let path = strip_authority(target);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if is_clean(path) {
        // Most targets are clean already: one pass and one allocation, where the general way
        // below decodes into a copy, splits into a list and joins it again.
        let trailing_slash = path.len() > 1 && path.ends_with('/');
        let path = if trailing_slash {
            &path[..path.len() - 1]
        } else {
            path
        };
        return Ok(CleanPath {
            path: path.to_owned(),
            trailing_slash,
        });
    }
    normalize_general(path)
}

/// Whether `path` (beginning with `/`) is its own normal form, bar one trailing slash: no
/// escape, no NUL, and no empty, `.` or `..` segment other than the empty one a trailing slash
/// leaves.
fn is_clean(path: &str) -> bool {
    if path.bytes().any(|b| b == b'%' || b == 0) {
        return false;
    }
    let mut segments = path[1..].split('/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        if (seg.is_empty() && !last) || seg == "." || seg == ".." {
            return false;
        }
    }
    true
}

/// [`normalize`] of any absolute path: decoded, then its dot segments resolved.
fn normalize_general(path: &str) -> Result<CleanPath, PathError> {
    let decoded = percent_decode_strict(path.as_bytes())?;
    if decoded.contains(&0) {
        return Err(PathError::Nul);
    }
    let decoded = String::from_utf8(decoded).map_err(|_| PathError::NotUtf8)?;
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if segments.pop().is_none() {
                    return Err(PathError::Traversal);
                }
            }
            s => segments.push(s),
        }
    }
    let last = decoded.rsplit('/').next().unwrap_or_default();
    let trailing_slash = decoded.ends_with('/') || last == "." || last == "..";
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(CleanPath {
        path: out,
        trailing_slash: trailing_slash && !segments.is_empty(),
    })
}

/// `http://host:port/p?q` → `/p?q`; origin-form is returned unchanged.
fn strip_authority(target: &str) -> &str {
    for scheme in ["http://", "https://"] {
        if let Some(rest) = target.get(..scheme.len()) {
            if rest.eq_ignore_ascii_case(scheme) {
                let after = &target[scheme.len()..];
                return match after.find('/') {
                    Some(i) => &after[i..],
                    None => "/",
                };
            }
        }
    }
    target
}

/// Decode `%XX` escapes, refusing malformed ones (which lenient decoders
/// pass through unchanged, letting two components see two different paths).
fn percent_decode_strict(input: &[u8]) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%' {
            let hi = input.get(i + 1).and_then(|&b| (b as char).to_digit(16));
            let lo = input.get(i + 2).and_then(|&b| (b as char).to_digit(16));
            match (hi, lo) {
                (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                _ => return Err(PathError::BadEscape),
            }
            i += 3;
        } else {
            out.push(input[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn n(t: &str) -> Result<String, PathError> {
        normalize(t).map(|c| c.path)
    }

    #[test]
    fn plain_paths() {
        assert_eq!(n("/").unwrap(), "/");
        assert_eq!(n("/a/b.html?x=../..").unwrap(), "/a/b.html");
        assert_eq!(n("//a///b/").unwrap(), "/a/b");
        assert!(normalize("/a/").unwrap().trailing_slash);
        assert!(!normalize("/").unwrap().trailing_slash);
        assert_eq!(n("http://example.com/x/y").unwrap(), "/x/y");
        assert_eq!(n("HTTP://example.com").unwrap(), "/");
        assert_eq!(n("/with%20space").unwrap(), "/with space");
    }

    #[test]
    fn dot_segments() {
        assert_eq!(n("/a/./b/../c").unwrap(), "/a/c");
        assert_eq!(n("/a/..").unwrap(), "/");
        assert_eq!(n("/a/%2e%2e/b").unwrap(), "/b");
    }

    #[test]
    fn traversal_refused() {
        for t in [
            "/..",
            "/../etc/passwd",
            "/a/../../etc/passwd",
            "/%2e%2e/etc/passwd",
            "/%2E%2E%2Fetc%2Fpasswd",
            "/a%2f..%2f..%2fetc",
            "/.%2e/x",
        ] {
            assert_eq!(n(t), Err(PathError::Traversal), "{t}");
        }
    }

    #[test]
    fn bad_bytes_refused() {
        assert_eq!(n("/a%00b"), Err(PathError::Nul));
        assert_eq!(n("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(n("/a%2"), Err(PathError::BadEscape));
        assert_eq!(n("/%ff%fe"), Err(PathError::NotUtf8));
        assert_eq!(n("a/b"), Err(PathError::NotAbsolute));
        assert_eq!(n("*"), Err(PathError::NotAbsolute));
    }

    #[test]
    fn clean_paths_take_the_short_way_with_the_same_result() {
        for p in ["/", "/a", "/a/", "/a/b.html", "/a.b/c..d/.e/", "/x./..y"] {
            assert!(is_clean(p), "{p}");
            assert_eq!(normalize(p), normalize_general(p), "{p}");
        }
        for p in [
            "//", "/a//b", "/./a", "/a/.", "/a/..", "/a/../b", "/%41", "/a\0",
        ] {
            assert!(!is_clean(p), "{p}");
        }
    }

    proptest! {
        /// The short way for clean paths gives what the general way gives, on any path.
        #[test]
        fn the_short_way_agrees(t in "(/|%2[eEfF]|%41|\\.|\\.\\.|[a-z]|\\?){0,24}") {
            let target = format!("/{t}");
            let path = target.split(['?', '#']).next().unwrap_or_default();
            prop_assert_eq!(normalize(&target), normalize_general(path));
        }

        #[test]
        fn output_never_escapes(t in "(/|%2[eEfF]|\\.|\\.\\.|[a-z]|%00|%){0,40}") {
            if let Ok(c) = normalize(&format!("/{t}")) {
                prop_assert!(c.path.starts_with('/'));
                for seg in c.path.split('/').skip(1) {
                    prop_assert!(seg != ".." && seg != ".");
                }
                prop_assert!(!c.path.contains('\0'));
                prop_assert!(c.path == "/" || !c.path.ends_with('/'));
            }
        }
    }
}
