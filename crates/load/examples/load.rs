//! Stand-alone front end for the load generator, with the options of `switchyard load`.
//!
//! ```text
//! cargo run --release -p switchyard-load --example load -- http://127.0.0.1:8080/ -c 64 -d 10 --json
//! ```

use clap::Parser;
use switchyard_load::cli::{run, LoadArgs};

#[derive(Parser)]
#[command(
    name = "switchyard-load",
    about = "HTTP/1.x load generator (switchyard load)"
)]
struct Cmd {
    #[command(flatten)]
    load: LoadArgs,
}

fn main() {
    let cmd = Cmd::parse();
    if let Err(e) = run(&cmd.load, &mut std::io::stdout().lock()) {
        eprintln!("switchyard load: {e}");
        std::process::exit(1);
    }
}
