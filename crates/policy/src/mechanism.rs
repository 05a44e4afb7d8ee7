//! How responses reach clients: the switch's delivery mechanism, also what
//! the lab asks of the switch it starts.

use serde::{Deserialize, Serialize};

/// How responses reach clients (config key and CLI value `relay`, `handoff` or `redirect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// Two-way: the switch relays requests and responses over pooled node connections.
    #[default]
    Relay,
    /// One-way: the switch hands the client's connection to the node, which answers the client
    /// directly (nodes with a `control` address; others are relayed).
    Handoff,
    /// HTTP redirect: the switch answers each request with a 302 to the chosen node's address
    /// (`http://<node addr><target>`), and the client fetches it from the node itself. For
    /// nodes clients can reach; costs the client a round trip per redirected request.
    Redirect,
}

impl Mechanism {
    /// The name used in configuration, on the command line and in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Relay => "relay",
            Mechanism::Handoff => "handoff",
            Mechanism::Redirect => "redirect",
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Mechanism;

    #[test]
    fn names_match_the_serde_names() {
        #[derive(serde::Deserialize)]
        struct C {
            m: Mechanism,
        }
        for m in [Mechanism::Relay, Mechanism::Handoff, Mechanism::Redirect] {
            let c: C = toml::from_str(&format!("m = \"{m}\"")).unwrap();
            assert_eq!(c.m, m);
        }
    }
}
