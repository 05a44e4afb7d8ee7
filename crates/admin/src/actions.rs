//! Operator actions on the admin listener (drain a node, mark it down or up): POST only, off
//! unless the process's configuration turns them on, and guarded against cross-site requests.
//!
//! - `GET /actions.json` says whether actions are on and, when they are, gives the page the
//!   token it must send back: `{"enabled":true,"token":"…"}` (`{"enabled":false,"token":null}`
//!   when off).
//! - `POST /actions/<what>` runs an action when they are on and the request carries the token
//!   in the `X-Switchyard-Token` header; `403` otherwise (off, no token, a wrong token, or an
//!   `Origin` that is not the admin listener's own). `GET` and `HEAD` there are answered `405`.
//!
//! Why this stops cross-site request forgery: a page of another origin cannot read
//! `/actions.json` (the listener sends no CORS headers), and cannot add a custom header to a
//! cross-origin request without a preflight `OPTIONS`, which the listener refuses. The token
//! changes with every start of the process. A browser's `Origin` naming another host is
//! refused outright as well. This guards the operator's browser, not the listener: anyone who
//! can reach the admin listener can read the token and act, so it belongs on an operators'
//! address.

use std::sync::Arc;

use crate::Page;

/// The header that carries the token.
pub const TOKEN_HEADER: &str = "x-switchyard-token";

/// Runs one action: the path after `/actions/` (query included) to a status and a body.
pub type ActionFn = Arc<dyn Fn(&str) -> (u16, Page) + Send + Sync>;

/// Whether actions are on now (read at every request, so a configuration reload applies).
pub type EnabledFn = Arc<dyn Fn() -> bool + Send + Sync>;

/// The actions a process offers on its admin listener.
#[derive(Clone)]
pub struct Actions {
    enabled: EnabledFn,
    token: Arc<str>,
    run: ActionFn,
}

impl std::fmt::Debug for Actions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actions")
            .field("enabled", &(self.enabled)())
            .finish_non_exhaustive()
    }
}

/// A fresh token: 128 bits from the kernel's random source, in hex.
fn fresh_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// What an action request gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Run,
    /// Refuse it with 403 and this reason.
    Forbidden(&'static str),
}

impl Actions {
    /// Actions run by `run` while `enabled` says so, with a new random token.
    pub fn new(enabled: EnabledFn, run: ActionFn) -> Result<Self, crate::AdminError> {
        let token = fresh_token().map_err(crate::AdminError::Token)?;
        Ok(Self::with_token(enabled, run, token))
    }

    /// The same with a given token.
    pub fn with_token(enabled: EnabledFn, run: ActionFn, token: String) -> Self {
        Actions {
            enabled,
            token: token.into(),
            run,
        }
    }

    /// The token the page must send.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// `/actions.json`.
    pub(crate) fn info(&self) -> Page {
        let body = if (self.enabled)() {
            serde_json::json!({ "enabled": true, "token": &*self.token })
        } else {
            serde_json::json!({ "enabled": false, "token": null })
        };
        Page {
            content_type: "application/json",
            body: body.to_string().into_bytes(),
        }
    }

    /// Judge a POST whose raw head (as the strict parser accepted it) is `head`, reached at
    /// `host` (its Host header).
    pub fn judge(&self, head: &[u8], host: Option<&str>) -> Verdict {
        if !(self.enabled)() {
            return Verdict::Forbidden(
                "actions are off: the admin setting (admin_actions = true) turns them on",
            );
        }
        if let Some(origin) = header(head, "origin") {
            // `Origin: scheme://host[:port]`; it must name this listener as the browser
            // reached it (the Host header).
            let origin_host = origin.split_once("://").map(|(_, h)| h);
            if origin_host.is_none() || origin_host != host {
                return Verdict::Forbidden("cross-origin action refused");
            }
        }
        match header(head, TOKEN_HEADER) {
            Some(t) if constant_time_eq(t.as_bytes(), self.token.as_bytes()) => Verdict::Run,
            Some(_) => Verdict::Forbidden("wrong action token: reload the page"),
            None => Verdict::Forbidden("the action token header is missing"),
        }
    }

    /// Run the action at `rest` (the target after `/actions/`).
    pub(crate) fn run(&self, rest: &str) -> (u16, Page) {
        (self.run)(rest)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The value of header `name` (lower case) in a request head the strict parser accepted. The
/// parser keeps only the headers the data path acts on; this reads the one or two others the
/// admin listener needs straight from the validated bytes.
pub fn header<'a>(head: &'a [u8], name: &str) -> Option<&'a str> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim_matches([' ', '\t']))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn actions(on: bool) -> (Actions, Arc<AtomicBool>) {
        let flag = Arc::new(AtomicBool::new(on));
        let f = flag.clone();
        let a = Actions::with_token(
            Arc::new(move || f.load(Ordering::Relaxed)),
            Arc::new(|rest| {
                (
                    200,
                    Page {
                        content_type: "text/plain",
                        body: rest.as_bytes().to_vec(),
                    },
                )
            }),
            "abc123".into(),
        );
        (a, flag)
    }

    #[test]
    fn headers_are_read_case_blind() {
        let h = b"POST /actions/x HTTP/1.1\r\nHost: a:1\r\nX-Switchyard-Token:  t1 \r\norigin: http://a:1\r\n\r\n";
        assert_eq!(header(h, TOKEN_HEADER), Some("t1"));
        assert_eq!(header(h, "origin"), Some("http://a:1"));
        assert_eq!(header(h, "cookie"), None);
    }

    #[test]
    fn only_the_token_on_the_same_origin_runs_and_only_when_on() {
        let (a, on) = actions(true);
        let with = |extra: &str| {
            format!("POST /actions/x HTTP/1.1\r\nHost: h:9\r\n{extra}\r\n").into_bytes()
        };
        let host = Some("h:9");
        assert_eq!(
            a.judge(&with("X-Switchyard-Token: abc123\r\n"), host),
            Verdict::Run
        );
        assert_eq!(
            a.judge(
                &with("Origin: http://h:9\r\nX-Switchyard-Token: abc123\r\n"),
                host
            ),
            Verdict::Run
        );
        assert!(matches!(
            a.judge(&with("X-Switchyard-Token: abc124\r\n"), host),
            Verdict::Forbidden(_)
        ));
        assert!(matches!(a.judge(&with(""), host), Verdict::Forbidden(_)));
        assert!(matches!(
            a.judge(
                &with("Origin: http://evil.example\r\nX-Switchyard-Token: abc123\r\n"),
                host
            ),
            Verdict::Forbidden(_)
        ));
        assert!(matches!(
            a.judge(
                &with("Origin: null\r\nX-Switchyard-Token: abc123\r\n"),
                host
            ),
            Verdict::Forbidden(_)
        ));
        assert!(String::from_utf8(a.info().body).unwrap().contains("abc123"));
        on.store(false, Ordering::Relaxed);
        assert!(matches!(
            a.judge(&with("X-Switchyard-Token: abc123\r\n"), host),
            Verdict::Forbidden(r) if r.contains("off")
        ));
        let info = String::from_utf8(a.info().body).unwrap();
        assert_eq!(info, r#"{"enabled":false,"token":null}"#);
    }

    #[test]
    fn tokens_are_fresh() {
        let (a, b) = (fresh_token().unwrap(), fresh_token().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
