//! The `shoal` binary: CLI, configuration, wiring and tracing setup.
//!
//! - `shoal serve` (`serve`): join the cluster, bring the model here (peers first), place it, serve the API.
//!   At start it measures this machine's compute, or reads it from the cache (`compute`).
//! - `shoal chat "prompt"`: stream an answer in the terminal (in-process, or from a server with `--url`).
//! - `shoal bench`: prefill / decode throughput, TTFT and inter-token latency (run by `shoal-bench`).
//! - `shoal pull` / `shoal models` / `shoal rm`: fetch, list and delete models (`models`).
//! - `shoal invite` / `shoal remove`: let a machine join, take one out (`membership`).

mod chat;
mod cli;
mod compute;
mod membership;
mod models;
mod serve;

use clap::Parser;

use cli::{Cli, Command};

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

pub use models::resolve_model;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Bench(args) => bench(args),
        Command::Pull(args) => models::pull(&args),
        Command::Models(args) => models::models(&args),
        Command::Rm(args) => models::rm(&args),
        Command::Invite(args) => membership::invite(&args),
        Command::Remove(args) => membership::remove(&args),
    }
}

/// `shoal bench`: the serving benchmark against `--url` (the model is only named there), else the
/// in-process benchmarks on the resolved model.
fn bench(args: cli::BenchCommand) -> anyhow::Result<()> {
    if args.bench.memory_bandwidth {
        return Ok(shoal_bench::run_memory_bandwidth(&args.bench)?);
    }
    if let Some(url) = &args.bench.url {
        return Ok(shoal_bench::run_serving(
            &args.bench,
            url,
            &args.model.model,
        )?);
    }
    let (id, path) = resolve_model(&args.model)?;
    Ok(shoal_bench::run_in_process(&args.bench, &id, &path)?)
}
