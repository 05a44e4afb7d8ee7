//! `switchyard lab` on its own, without building the main binary:
//!
//! ```text
//! cargo run -p switchyard-lab --example lab -- up --nodes 2 --binary target/release/switchyard
//! cargo run -p switchyard-lab --example lab -- status --json
//! cargo run -p switchyard-lab --example lab -- down
//! ```

use clap::Parser;
use switchyard_lab::cli::{run, LabCommand};

#[derive(Parser, Debug)]
#[command(name = "lab")]
struct Args {
    #[command(subcommand)]
    cmd: LabCommand,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut out = std::io::stdout().lock();
    match run(&args.cmd, &mut out) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lab: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
