//! A stand-alone switch, the same as `switchyard switch`: flags over an optional TOML file with a
//! `[switch]` table; SIGHUP reloads the file, SIGINT/SIGTERM drain and stop.
//!
//! ```sh
//! cargo run --release -p switchyard-switch --example switch -- \
//!     --listen 127.0.0.1:8000 --node 127.0.0.1:8081 --node 127.0.0.1:8082 --policy lard
//! ```

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use switchyard_switch::{SwitchArgs, SwitchConfig};

#[derive(Parser, Debug)]
struct Cli {
    /// TOML file with a `[switch]` table.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    args: SwitchArgs,
}

#[derive(serde::Deserialize, Default)]
struct File {
    #[serde(default)]
    switch: Option<SwitchConfig>,
}

fn load(cli: &Cli) -> Result<SwitchConfig, String> {
    let file = match &cli.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            toml::from_str::<File>(&text).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => File::default(),
    };
    Ok(cli.args.merge(file.switch.unwrap_or_default()))
}

fn main() -> Result<(), String> {
    let cli = Cli::parse();
    let cfg = load(&cli)?;
    // Client connections run on the switch's own worker threads; this runtime only carries
    // health checks, load reports, the admin listener and signals.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let sw = switchyard_switch::start(cfg)
            .await
            .map_err(|e| e.to_string())?;
        eprintln!("switchyard switch: serving http://{}/", sw.addr());
        if let Some(a) = sw.admin_addr() {
            eprintln!("switchyard switch: metrics at http://{a}/metrics");
        }
        let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = hup.recv() => match load(&cli) {
                    Ok(new) => match sw.reload(new).await {
                        Ok(()) => eprintln!("switchyard switch: configuration reloaded"),
                        Err(e) => eprintln!("switchyard switch: reload refused: {e}"),
                    },
                    Err(e) => eprintln!("switchyard switch: reload refused: {e}"),
                },
            }
        }
        sw.shutdown(Duration::from_secs(cli.args.drain_secs)).await;
        Ok(())
    })
}
