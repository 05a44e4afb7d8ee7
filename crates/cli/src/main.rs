//! The `switchyard` binary: every component behind one command.
//!
//! `switchyard node` runs a back-end web server, `switchyard switch` the
//! layer-7 switch in front of nodes, `switchyard demo` starts a
//! local cluster on a generated site with no setup, `switchyard status`
//! shows a running switch's nodes in the terminal, `switchyard trace`
//! reads, summarizes and synthesizes access-log workloads, `switchyard load`
//! drives a server with them. Configuration comes
//! from one TOML file (`--config`, see `switchyard.example.toml`), and
//! flags override it.

mod config;
mod demo;
mod node_cmd;
mod runtime;
mod status_cmd;
mod switch_cmd;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::FileConfig;

/// Every component allocates per connection and per request (request heads, handoff records,
/// relay buffers) from several worker threads at once; mimalloc's thread-local free lists serve
/// those small, short-lived blocks with less work than glibc's malloc, whose arenas showed as
/// 6-7 % of the switch's CPU in profiles of handoffs and relaying. Built without transparent
/// huge pages (the workspace's `no_thp`): with them, the node's idle connections cost four times
/// the memory (bench/RESULTS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Run by every worker thread once a second ([`switchyard_runtime::workers::tidy_with`]).
/// mimalloc gives the pages a thread freed back to the system only after its purge delay
/// (1 s), and only when some thread calls into it again after that. A burst of connections
/// holds a task each until they park; freed on a worker that then has nothing to do, that
/// memory stayed resident: 10,000 idle connections cost the node 9-17 MB, against 5-6 MB with
/// the pages given back (bench/RESULTS.md).
fn tidy_allocator() {
    // SAFETY: `mi_collect` takes no pointers and may be called on any thread at any time;
    // without `force` it only frees what is already free and purges what has expired.
    unsafe { libmimalloc_sys::mi_collect(false) }
}

/// switchyard: many ordinary machines acting as one fast web site.
#[derive(Parser, Debug)]
#[command(name = "switchyard", version, about, propagate_version = true)]
struct Cli {
    /// TOML configuration file (see switchyard.example.toml).
    #[arg(long, global = true, env = "SWITCHYARD_CONFIG")]
    config: Option<PathBuf>,
    /// Log output format: text or json (overrides [log] format).
    #[arg(long, global = true, value_parser = ["text", "json"])]
    log_format: Option<String>,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process; boxing variants would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run a back-end web server node.
    Node(node_cmd::NodeArgs),
    /// Run the layer-7 web switch in front of nodes.
    Switch(switchyard_switch::SwitchArgs),
    /// Start a local cluster on a generated sample site (no setup, no privileges).
    Demo(demo::DemoArgs),
    /// A running switch's state per node, from its admin listener (like `haproxy show stat`).
    Status(status_cmd::StatusArgs),
    /// Access-log traces: statistics, HTTP/1.1 sessions, synthetic workloads.
    #[command(subcommand)]
    Trace(switchyard_trace::cli::TraceCommand),
    /// Load generator: closed loop, open-loop rate profiles, trace and session replay.
    Load(switchyard_load::cli::LoadArgs),
    /// Discrete-event cluster simulator running the real policies and caches.
    #[command(subcommand)]
    Sim(switchyard_sim::cli::SimCommand),
    /// Multi-host lab in network namespaces (clients, switch, nodes; needs root).
    #[command(subcommand)]
    Lab(switchyard_lab::cli::LabCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    switchyard_runtime::workers::tidy_with(tidy_allocator);
    let file = match &cli.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let format = cli.log_format.clone().unwrap_or(file.log.format.clone());
    runtime::init_tracing(&file.log.level, &format);
    match cli.command {
        Command::Node(args) => node_cmd::run(args, &file, cli.config.as_deref()),
        Command::Switch(args) => switch_cmd::run(args, &file, cli.config.as_deref()),
        Command::Demo(args) => demo::run(args),
        Command::Status(args) => status_cmd::run(
            args,
            file.switch
                .as_ref()
                .and_then(|s| s.admin)
                .or(file.node.as_ref().and_then(|n| n.admin)),
        ),
        Command::Trace(cmd) => {
            let mut out = std::io::stdout().lock();
            switchyard_trace::cli::run(&cmd, &mut out)?;
            Ok(())
        }
        Command::Sim(cmd) => {
            let mut out = std::io::stdout().lock();
            switchyard_sim::cli::run(&cmd, &mut out)?;
            Ok(())
        }
        Command::Lab(cmd) => {
            let mut out = std::io::stdout().lock();
            switchyard_lab::cli::run(&cmd, &mut out)?;
            Ok(())
        }
        Command::Load(args) => {
            // Builds its own runtimes: called outside any.
            let mut out = std::io::stdout().lock();
            switchyard_load::cli::run(&args, &mut out)?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
