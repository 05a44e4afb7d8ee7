//! `switchyard sim` as a standalone program: the same subcommands as the `switchyard` binary.
//!
//! ```text
//! cargo run --release -p switchyard-sim --example sim -- paper --out bench/sim/out
//! ```

use clap::Parser;

/// switchyard's cluster simulator.
#[derive(Parser, Debug)]
#[command(name = "switchyard-sim")]
struct Cli {
    #[command(subcommand)]
    command: switchyard_sim::cli::SimCommand,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mut out = std::io::stdout().lock();
    match switchyard_sim::cli::run(&cli.command, &mut out) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard-sim: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
