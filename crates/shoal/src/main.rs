//! The `shoal` binary: CLI, configuration, wiring and tracing setup.
//!
//! - `shoal serve` (`serve`): join the cluster, bring the model here (peers first), place it, serve the API.
//!   At start it measures this machine's compute, or reads it from the cache (`compute`), and finds its
//!   GPUs (`gpus`).
//! - `shoal chat "prompt"`: stream an answer in the terminal (in-process, or from a server with `--url`).
//! - `shoal bench`: prefill / decode throughput, TTFT and inter-token latency (run by `shoal-bench`).
//! - `shoal pull` / `shoal models` / `shoal rm`: fetch, list and delete models (`models`).
//! - `shoal invite` / `shoal remove`: let a machine join, take one out (`membership`).
//! - `shoal doctor`: this machine and its links to every peer, with the problems found (`doctor`).
//!
//! Logs (`logs`): `--log FILTER` / `RUST_LOG` (per-module levels), `--log-format text|json`, to stderr,
//! coloured only on a terminal.

mod chat;
mod cli;
mod compute;
mod doctor;
mod gpus;
mod logs;
mod membership;
mod models;
mod serve;

use clap::Parser;

use cli::{Cli, Command};

pub use models::resolve_model;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    logs::init(cli.log.as_deref(), cli.log_format)?;
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Chat(args) => chat::run(args),
        Command::Bench(args) => bench(args),
        Command::Pull(args) => models::pull(&args),
        Command::Models(args) => models::models(&args),
        Command::Rm(args) => models::rm(&args),
        Command::Invite(args) => membership::invite(&args),
        Command::Remove(args) => membership::remove(&args),
        Command::Doctor(args) => std::process::exit(doctor::run(&args)?),
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
    let mut bench = args.bench;
    if bench.device == shoal_bench::DeviceChoice::Auto {
        // Measured at the largest thread count benchmarked.
        let threads = (bench.threads.split(','))
            .filter_map(|t| t.trim().parse::<usize>().ok())
            .max()
            .unwrap_or(1);
        bench.device = match gpus::resolve_for_model(bench.device, &path, threads) {
            shoal_engine::engine::Device::Cpu => shoal_bench::DeviceChoice::Cpu,
            shoal_engine::engine::Device::Gpu(i) => shoal_bench::DeviceChoice::Gpu(i),
        };
    }
    Ok(shoal_bench::run_in_process(&bench, &id, &path)?)
}
