//! `switchyard switch`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use switchyard_switch::{SwitchArgs, SwitchConfig};

use crate::config::FileConfig;
use crate::runtime;

fn config(args: &SwitchArgs, file: &FileConfig) -> SwitchConfig {
    args.merge(file.switch.clone().unwrap_or_default())
}

/// Run the switch until SIGINT/SIGTERM; SIGHUP re-reads the config file
/// and reloads it without dropping a connection.
pub fn run(args: SwitchArgs, file: &FileConfig, path: Option<&Path>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let cfg = config(&args, file);
    // The switch runs its own worker threads; this runtime carries only
    // health checks, load reports, the admin listener and signals.
    runtime::build(1)?.block_on(async {
        let sw = switchyard_switch::start(cfg)
            .await
            .context("switch failed to start")?;
        eprintln!("switchyard switch: serving http://{}/", sw.addr());
        if let Some(a) = sw.admin_addr() {
            eprintln!("switchyard switch: metrics at http://{a}/metrics");
        }
        let mut hup = signal(SignalKind::hangup())?;
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
                        Ok(f) => match sw.reload(config(&args, &f)).await {
                            Ok(()) => tracing::info!("configuration reloaded"),
                            Err(e) => tracing::error!(error = %e, "reload refused"),
                        },
                        Err(e) => tracing::error!(error = %format!("{e:#}"), "reload refused"),
                    }
                }
            }
        }
        sw.shutdown(Duration::from_secs(args.drain_secs)).await;
        Ok(())
    })
}
