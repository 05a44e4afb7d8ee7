//! Target URLs and pre-rendered request bytes.

use crate::LoadError;

/// HTTP version spoken by the generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum HttpVersion {
    /// HTTP/1.0: one request per connection.
    #[serde(rename = "HTTP/1.0")]
    Http10,
    /// HTTP/1.1: persistent connections and pipelining.
    #[default]
    #[serde(rename = "HTTP/1.1")]
    Http11,
}

impl HttpVersion {
    /// The protocol token of the request line.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpVersion::Http10 => "HTTP/1.0",
            HttpVersion::Http11 => "HTTP/1.1",
        }
    }
}

/// Scheme-less authority of an `http://` URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Origin {
    /// The value of a `Host` header for this origin (port omitted when 80).
    pub fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == 80 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    /// `host:port` in a form accepted by name resolution.
    pub fn socket_string(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// An absolute `http://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// Where to connect.
    pub origin: Origin,
    /// Path and query, always starting with `/`.
    pub path: String,
}

impl Url {
    /// Parses `http://host[:port][/path]`; `host[:port][/path]` without a scheme is accepted too.
    pub fn parse(s: &str) -> Result<Url, LoadError> {
        let bad = |why: &str| LoadError::BadUrl(format!("{s}: {why}"));
        let rest = if let Some(r) = strip_prefix_ci(s, "http://") {
            r
        } else if strip_prefix_ci(s, "https://").is_some() {
            return Err(bad("https is not supported"));
        } else if s.contains("://") {
            return Err(bad("only http:// URLs are supported"));
        } else {
            s
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_owned()
        };
        let path = match path.find('#') {
            Some(i) => path[..i].to_owned(),
            None => path,
        };
        if authority.contains('@') {
            return Err(bad("user information is not supported"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6
                .find(']')
                .ok_or_else(|| bad("unterminated IPv6 address"))?;
            let host = &v6[..end];
            let after = &v6[end + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(bad("junk after IPv6 address")),
            };
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("missing host"));
        }
        let port = match port {
            None | Some("") => 80,
            Some(p) => p.parse::<u16>().map_err(|_| bad("invalid port"))?,
        };
        Ok(Url {
            origin: Origin {
                host: host.to_owned(),
                port,
            },
            path,
        })
    }

    /// Resolves a `Location` header value against this URL.
    pub fn join(&self, location: &str) -> Result<Url, LoadError> {
        let location = location.trim();
        if location.contains("://") {
            return Url::parse(location);
        }
        if let Some(rest) = location.strip_prefix("//") {
            return Url::parse(&format!("http://{rest}"));
        }
        if location.starts_with('/') {
            return Ok(Url {
                origin: self.origin.clone(),
                path: location.to_owned(),
            });
        }
        if location.is_empty() {
            return Ok(self.clone());
        }
        let base = self.path.split(['?', '#']).next().unwrap_or("/");
        let dir = match base.rfind('/') {
            Some(i) => &base[..=i],
            None => "/",
        };
        let path = if location.starts_with('?') {
            format!("{base}{location}")
        } else {
            format!("{dir}{location}")
        };
        Ok(Url {
            origin: self.origin.clone(),
            path,
        })
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    if s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix) {
        Some(&s[prefix.len()..])
    } else {
        None
    }
}

/// Everything needed to render request heads, shared by all requests of a run.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    /// Protocol version of the request line.
    pub version: HttpVersion,
    /// Whether to ask for a persistent connection.
    pub keep_alive: bool,
    /// `Host` header value used when a request carries none of its own.
    pub host: String,
    /// Extra header fields, sent in order.
    pub headers: Vec<(String, String)>,
}

impl RequestTemplate {
    /// Appends one request head to `out`.
    pub fn render_into(&self, out: &mut Vec<u8>, method: &str, path: &str, host: Option<&str>) {
        out.extend_from_slice(method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(path.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.version.as_str().as_bytes());
        out.extend_from_slice(b"\r\nHost: ");
        out.extend_from_slice(host.unwrap_or(&self.host).as_bytes());
        out.extend_from_slice(b"\r\n");
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        match (self.version, self.keep_alive) {
            (HttpVersion::Http11, false) => out.extend_from_slice(b"Connection: close\r\n"),
            (HttpVersion::Http10, true) => out.extend_from_slice(b"Connection: keep-alive\r\n"),
            _ => {}
        }
        if needs_empty_body(method) {
            out.extend_from_slice(b"Content-Length: 0\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }

    /// Renders one request head.
    pub fn render(&self, method: &str, path: &str, host: Option<&str>) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + path.len() + self.host.len());
        self.render_into(&mut out, method, path, host);
        out
    }
}

/// Methods that normally carry a body get an explicit empty one.
fn needs_empty_body(method: &str) -> bool {
    ["POST", "PUT", "PATCH"]
        .iter()
        .any(|m| m.eq_ignore_ascii_case(method))
}

/// Whether `method` is `HEAD` (its responses carry no body).
pub fn is_head(method: &str) -> bool {
    method.eq_ignore_ascii_case("HEAD")
}

/// Checks a method token, a request target or a header field for characters that would
/// break the request framing.
pub fn validate_token(what: &str, s: &str) -> Result<(), LoadError> {
    if s.is_empty() || s.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(LoadError::Config(format!("invalid {what}: {s:?}")));
    }
    Ok(())
}

/// Parses a `Name: value` header argument.
pub fn parse_header(s: &str) -> Result<(String, String), LoadError> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| LoadError::Config(format!("header {s:?} is not 'Name: value'")))?;
    let name = name.trim();
    let value = value.trim();
    validate_token("header name", name)?;
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(LoadError::Config(format!("invalid header value in {s:?}")));
    }
    Ok((name.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_urls() {
        let u = Url::parse("http://127.0.0.1:8080/a/b?c=1#frag").unwrap();
        assert_eq!(u.origin.host, "127.0.0.1");
        assert_eq!(u.origin.port, 8080);
        assert_eq!(u.path, "/a/b?c=1");
        let u = Url::parse("example.com").unwrap();
        assert_eq!((u.origin.port, u.path.as_str()), (80, "/"));
        let u = Url::parse("http://[::1]:81?x").unwrap();
        assert_eq!(u.origin.host, "::1");
        assert_eq!(u.path, "/?x");
        assert_eq!(u.origin.host_header(), "[::1]:81");
        assert!(Url::parse("https://x/").is_err());
        assert!(Url::parse("http://:80/").is_err());
        assert!(Url::parse("http://h:99999/").is_err());
    }

    #[test]
    fn join_locations() {
        let base = Url::parse("http://h:1/dir/page?q").unwrap();
        assert_eq!(base.join("/x").unwrap().path, "/x");
        assert_eq!(base.join("y").unwrap().path, "/dir/y");
        assert_eq!(base.join("?z").unwrap().path, "/dir/page?z");
        let other = base.join("http://other:2/p").unwrap();
        assert_eq!(other.origin.host, "other");
        assert_eq!(other.origin.port, 2);
        assert_eq!(base.join("//o/q").unwrap().origin.host, "o");
    }

    #[test]
    fn render_requests() {
        let t = RequestTemplate {
            version: HttpVersion::Http11,
            keep_alive: true,
            host: "h:8".into(),
            headers: vec![("X-A".into(), "1".into())],
        };
        assert_eq!(
            t.render("GET", "/p", None),
            b"GET /p HTTP/1.1\r\nHost: h:8\r\nX-A: 1\r\n\r\n"
        );
        let t = RequestTemplate {
            version: HttpVersion::Http10,
            keep_alive: false,
            host: "h".into(),
            headers: vec![],
        };
        assert_eq!(
            t.render("HEAD", "/", Some("v")),
            b"HEAD / HTTP/1.0\r\nHost: v\r\n\r\n"
        );
        let t = RequestTemplate {
            version: HttpVersion::Http11,
            keep_alive: false,
            ..t
        };
        assert!(t
            .render("POST", "/", None)
            .ends_with(b"Connection: close\r\nContent-Length: 0\r\n\r\n"));
    }

    #[test]
    fn headers() {
        assert_eq!(
            parse_header("X-Y:  z w ").unwrap(),
            ("X-Y".into(), "z w".into())
        );
        assert!(parse_header("nocolon").is_err());
        assert!(parse_header("Bad Name: v").is_err());
    }
}
