//! `cap`: the Client-Aware Policy (seed 004 §3): requests are sorted into service classes by URL
//! and each class has its own round-robin pointer over the nodes, so that requests of one kind
//! (CPU-bound CGI, disk-bound large files, ...) are spread evenly on their own rather than piling
//! up on whichever node plain round robin happens to give them.

use std::time::Duration;

use crate::config::PolicyConfig;
use crate::core::{Core, Pick, Strategy};
use crate::error::PolicyError;
use crate::rr::rotate;
use crate::types::{Reject, Request, RequestClass};

/// A URL pattern of a service class, matched against the path (query string excluded). The
/// same grammar selects the node's dynamic paths (`[dynamic] paths`), so that a switch running
/// `cap` can put exactly those requests in a class of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `/cgi-bin/` or `/cgi-bin/*`.
    Prefix(Box<str>),
    /// `*.cgi`.
    Suffix(Box<str>),
    /// `*search*`.
    Contains(Box<str>),
    /// `=/exact`.
    Exact(Box<str>),
}

impl Pattern {
    /// Parses a pattern of class `class` (named in the error).
    pub fn parse(class: &str, p: &str) -> Result<Pattern, PolicyError> {
        let bad = |reason| PolicyError::InvalidPattern {
            class: class.to_string(),
            pattern: p.to_string(),
            reason,
        };
        if p.is_empty() {
            return Err(bad("empty pattern"));
        }
        if let Some(exact) = p.strip_prefix('=') {
            return Ok(Pattern::Exact(exact.into()));
        }
        let lead = p.starts_with('*');
        let trail = p.len() > 1 && p.ends_with('*');
        let inner = &p[lead as usize..p.len() - trail as usize];
        if inner.contains('*') {
            return Err(bad("`*` is only allowed at the start or the end"));
        }
        Ok(match (lead, trail) {
            (true, true) => Pattern::Contains(inner.into()),
            (true, false) => Pattern::Suffix(inner.into()),
            (false, _) => Pattern::Prefix(inner.into()),
        })
    }

    /// Whether `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            Pattern::Prefix(s) => path.starts_with(&**s),
            Pattern::Suffix(s) => path.ends_with(&**s),
            Pattern::Contains(s) => path.contains(&**s),
            Pattern::Exact(s) => path == &**s,
        }
    }
}

/// Client-aware policy.
#[derive(Debug)]
pub(crate) struct Cap {
    names: Vec<String>,
    rules: Vec<(Pattern, RequestClass)>,
    next: Vec<usize>,
}

impl Cap {
    pub fn new(cfg: &PolicyConfig) -> Result<Self, PolicyError> {
        let mut names = vec![cfg.default_class.clone()];
        let mut rules = Vec::with_capacity(cfg.classes.len());
        for c in &cfg.classes {
            let idx = match names.iter().position(|n| *n == c.name) {
                Some(i) => i,
                None => {
                    names.push(c.name.clone());
                    names.len() - 1
                }
            };
            rules.push((
                Pattern::parse(&c.name, &c.pattern)?,
                RequestClass(idx as u16),
            ));
        }
        let next = vec![0; names.len()];
        Ok(Cap { names, rules, next })
    }
}

impl Strategy for Cap {
    fn name(&self) -> &'static str {
        "cap"
    }

    fn reset(&mut self) {
        self.next.iter_mut().for_each(|n| *n = 0);
    }

    fn classify(&self, req: &Request<'_>) -> RequestClass {
        let path = req.path();
        self.rules
            .iter()
            .find(|(p, _)| p.matches(path))
            .map_or(RequestClass::DEFAULT, |&(_, c)| c)
    }

    fn class_name(&self, class: RequestClass) -> Option<&str> {
        self.names.get(class.0 as usize).map(String::as_str)
    }

    fn select(
        &mut self,
        core: &mut Core,
        req: &Request<'_>,
        _now: Duration,
    ) -> Result<Pick, Reject> {
        let class = self.classify(req).0 as usize;
        rotate(core, &mut self.next[class])
            .map(Pick::serve)
            .ok_or_else(|| core.reject())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClassSpec, PolicyKind};
    use crate::testutil::*;
    use crate::types::ConnId;
    use crate::Policy;

    fn cap(n: u32) -> Box<dyn Policy> {
        let mut cfg = PolicyConfig::new(PolicyKind::Cap);
        for (name, pattern) in [("cgi", "*.cgi"), ("cgi", "/cgi-bin/"), ("img", "/img/*")] {
            cfg.classes.push(ClassSpec {
                name: name.into(),
                pattern: pattern.into(),
            });
        }
        let mut p = crate::build(&cfg).unwrap();
        p.init(&nodes(n), T0).unwrap();
        p
    }

    #[test]
    fn patterns() {
        let m = |p: &str, path: &str| Pattern::parse("c", p).unwrap().matches(path);
        assert!(m("*.cgi", "/a/b.cgi"));
        assert!(!m("*.cgi", "/a/b.cgi.txt"));
        assert!(m("/cgi-bin/", "/cgi-bin/x"));
        assert!(m("/img/*", "/img/a.png"));
        assert!(m("*search*", "/x/search/y"));
        assert!(m("=/", "/"));
        assert!(!m("=/", "/a"));
        assert!(m("*", "/anything"));
        assert!(Pattern::parse("c", "/a*b").is_err());
        assert!(Pattern::parse("c", "").is_err());
    }

    #[test]
    fn classifies_ignoring_the_query() {
        let p = cap(2);
        let class = |t: &str| {
            let c = p.parse(&Request::get(ConnId(0), t));
            p.class_name(c).to_string()
        };
        assert_eq!(class("/x.cgi?a=b"), "cgi");
        assert_eq!(class("/cgi-bin/run"), "cgi");
        assert_eq!(class("/img/a.png"), "img");
        assert_eq!(class("/index.html?x=.cgi"), "default");
    }

    #[test]
    fn each_class_rotates_on_its_own() {
        let mut p = cap(3);
        // Interleave classes: each class still walks 0, 1, 2.
        let mut cgi = vec![];
        let mut other = vec![];
        for _ in 0..3 {
            cgi.push(pick(&mut *p, "/a.cgi").0);
            other.push(pick(&mut *p, "/a.html").0);
            other.push(pick(&mut *p, "/b.html").0);
        }
        assert_eq!(cgi, [0, 1, 2]);
        assert_eq!(other, [0, 1, 2, 0, 1, 2]);
    }
}
