//! `switchyard switch`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use switchyard_policy::PolicyKind;
use switchyard_switch::{SwitchArgs, SwitchConfig};

use crate::config::FileConfig;
use crate::runtime;

/// The switch's configuration: `[switch]` with the flags over it. With `cap`, the paths of
/// `[dynamic]` form the service classes `heavy` (its `heavy` paths) and `dynamic` (its
/// `paths`), after the classes configured explicitly, which win where both match, so that
/// requests the nodes send to their application servers are spread on their own.
fn config(args: &SwitchArgs, file: &FileConfig) -> SwitchConfig {
    let mut cfg = args.merge(file.switch.clone().unwrap_or_default());
    if let (Some(d), PolicyKind::Cap) = (&file.dynamic, cfg.policy.name) {
        cfg.policy.classes.extend(d.cap_classes());
    }
    // The switch is the site's face in flash-crowd rescue (its `[rescue.peering]`).
    cfg.rescue = file.rescue.clone();
    cfg
}

/// Run the switch until SIGINT/SIGTERM; SIGHUP re-reads the config file
/// and reloads it without dropping a connection (`[rescue]` takes a restart: a changed table
/// is logged and the one in force kept).
pub fn run(args: SwitchArgs, file: &FileConfig, path: Option<&Path>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let cfg = config(&args, file);
    let rescue = cfg.rescue.clone();
    // The switch runs its own worker threads; this runtime carries only
    // health checks, load reports, the admin listener and signals.
    runtime::build(1)?.block_on(async {
        // Installed before the switch is reachable: a SIGHUP must never find the default
        // action (which ends the process).
        let mut hup = signal(SignalKind::hangup())?;
        let sw = switchyard_switch::start(cfg)
            .await
            .context("switch failed to start")?;
        eprintln!("switchyard switch: serving http://{}/", sw.addr());
        if let Some(a) = sw.admin_addr() {
            eprintln!("switchyard switch: metrics at http://{a}/metrics");
        }
        let stop = runtime::stop_signal(None);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                why = &mut stop => {
                    tracing::info!(reason = why, "draining");
                    break;
                }
                _ = hup.recv() => {
                    let file = match path {
                        Some(p) => FileConfig::load(p),
                        None => Ok(FileConfig::default()),
                    };
                    match file {
                        Ok(f) => {
                            f.note_rescue_change(rescue.as_ref());
                            match sw.reload(config(&args, &f)).await {
                                Ok(()) => tracing::info!("configuration reloaded"),
                                Err(e) => tracing::error!(error = %e, "reload refused"),
                            }
                        }
                        Err(e) => tracing::error!(error = %format!("{e:#}"), "reload refused"),
                    }
                }
            }
        }
        sw.shutdown(Duration::from_secs(args.drain_secs)).await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_policy::{ConnId, Request};

    /// With `cap`, requests for the paths of `[dynamic]` are in the classes `heavy` and
    /// `dynamic`, explicit classes first; other policies' settings are left alone.
    #[test]
    fn dynamic_paths_form_a_cap_class() {
        let text = r#"
            [switch]
            nodes = ["127.0.0.1:1", "127.0.0.1:2"]
            [switch.policy]
            name = "cap"
            classes = [{ name = "images", pattern = "/app/img/" }]
            [dynamic]
            upstream = "127.0.0.1:8000"
            paths = ["/app/", "*.php"]
            heavy = ["/app/report/"]
        "#;
        let file = FileConfig::parse(text).unwrap();
        let cfg = config(&SwitchArgs::default(), &file);
        cfg.validate().unwrap();
        let policy = switchyard_policy::build(&cfg.policy).unwrap();
        let class = |t: &str| {
            let c = policy.parse(&Request::get(ConnId(0), t));
            policy.class_name(c).to_owned()
        };
        assert_eq!(class("/app/cart?id=3"), "dynamic");
        assert_eq!(class("/x/index.php"), "dynamic");
        assert_eq!(class("/app/report/2026"), "heavy");
        assert_eq!(class("/app/img/a.png"), "images");
        assert_eq!(class("/index.html"), "default");
        let lard = FileConfig::parse(&text.replace("\"cap\"", "\"lard\"")).unwrap();
        let cfg = config(&SwitchArgs::default(), &lard);
        assert_eq!(cfg.policy.classes.len(), 1);
    }
}
