//! The `shoal` binary: CLI, configuration, wiring and tracing setup.
//!
//! - `shoal serve` (`serve`): join the cluster, bring the model here (peers first), place it, serve the API.
//! - `shoal chat "prompt"`: stream an answer in the terminal (in-process, or from a server with `--url`).
//! - `shoal bench`: prefill / decode throughput, TTFT and inter-token latency (run by `shoal-bench`).
//! - `shoal pull` / `shoal models` / `shoal rm`: fetch, list and delete models (`models`).

mod chat;
mod cli;
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
        Command::Invite(args) => invite(&args),
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

/// `shoal invite`: prints the join token (this node's cluster key and addresses) on stdout.
fn invite(args: &cli::InviteArgs) -> anyhow::Result<()> {
    let key = args.cluster.cluster_key()?;
    let mut addrs = args.addrs.clone();
    if addrs.is_empty() {
        let port = args
            .cluster
            .cluster_listen
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .filter(|p| *p != 0)
            .unwrap_or(52416);
        addrs = shoal_cluster::facts::reachable_ipv4s()
            .into_iter()
            .map(|ip| format!("{ip}:{port}"))
            .collect();
    }
    anyhow::ensure!(
        !addrs.is_empty(),
        "no address to put in the token: give one with --addr HOST:PORT"
    );
    let token = shoal_cluster::identity::JoinToken {
        cluster_key: key,
        addrs,
    };
    println!("{}", token.encode());
    eprintln!(
        "shoal: on the other machine: shoal serve --join <this token> (it carries the cluster key: keep it private)"
    );
    Ok(())
}
