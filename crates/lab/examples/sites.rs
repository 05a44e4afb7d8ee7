//! The sites lab (`switchyard_lab::sites`) from the command line, for bench/rescue:
//!
//! ```text
//! sites up PREFIX CLIENTS REGISTRY NAME:KBPS...   # prints the lab as JSON
//! sites down PREFIX
//! ```
//!
//! A site's rate `-` leaves its uplink unshaped.

use switchyard_lab::sites::{SiteSpec, SitesLab, SitesSpec};

fn usage() -> std::process::ExitCode {
    eprintln!("usage: sites up PREFIX CLIENTS REGISTRY NAME:KBPS... | sites down PREFIX");
    std::process::ExitCode::from(2)
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["down", prefix] => {
            SitesLab::teardown(prefix);
            std::process::ExitCode::SUCCESS
        }
        ["up", prefix, clients, registry, sites @ ..] if !sites.is_empty() => {
            let (Ok(clients), Ok(registry)) = (clients.parse(), registry.parse()) else {
                return usage();
            };
            let mut specs = Vec::new();
            for s in sites {
                let Some((name, rate)) = s.split_once(':') else {
                    return usage();
                };
                let out_kbps = match rate {
                    "-" => None,
                    r => match r.parse() {
                        Ok(v) => Some(v),
                        Err(_) => return usage(),
                    },
                };
                specs.push(SiteSpec {
                    name: name.into(),
                    out_kbps,
                });
            }
            let spec = SitesSpec {
                prefix: prefix.to_string(),
                sites: specs,
                clients,
                registry,
            };
            match SitesLab::build(&spec) {
                Ok(lab) => {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&lab).expect("serializes")
                    );
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sites: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
        _ => usage(),
    }
}
