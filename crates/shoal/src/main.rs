//! The `shoal` binary: CLI, configuration, wiring and tracing setup.
//!
//! - `shoal serve`: fetch the model if needed, load it, serve the HTTP API.
//! - `shoal chat "prompt"`: stream an answer in the terminal (in-process, or from a server with `--url`).
//! - `shoal bench`: prefill / decode throughput, TTFT and inter-token latency.
//! - `shoal pull` / `shoal models`: fetch and list models.

mod bench;
mod chat;
mod cli;

use anyhow::Context;
use clap::Parser;

use cli::{Cli, Command, ModelArgs};

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Resolves the model argument to (id, path): a `.gguf` path is used as is, an id is fetched if missing.
pub fn resolve_model(args: &ModelArgs) -> anyhow::Result<(String, std::path::PathBuf)> {
    let as_path = std::path::Path::new(&args.model);
    if args.model.ends_with(".gguf") {
        anyhow::ensure!(
            as_path.is_file(),
            "model file {} does not exist",
            as_path.display()
        );
        let id = as_path
            .file_stem()
            .map(|s| s.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        return Ok((id, as_path.to_path_buf()));
    }
    let store = shoal_store::Store::new(args.models_dir());
    let path = store
        .ensure(&args.model, &|msg| eprintln!("shoal: {msg}"))
        .with_context(|| format!("getting model '{}'", args.model))?;
    Ok((args.model.clone(), path))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Chat(args) => chat::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Pull(args) => {
            let (id, path) = resolve_model(&args)?;
            println!("{id}: {}", path.display());
            Ok(())
        }
        Command::Models(args) => {
            let store = shoal_store::Store::new(args.models_dir());
            for e in shoal_store::catalog() {
                let state = if store.is_present(e.id) {
                    "present"
                } else {
                    "not downloaded"
                };
                println!("{:<32} {:>10} bytes  {state}", e.id, e.size);
            }
            Ok(())
        }
    }
}

fn serve(args: cli::ServeArgs) -> anyhow::Result<()> {
    let (id, path) = resolve_model(&args.model)?;
    let engine = shoal_engine::engine::spawn_from_gguf(&path, &id, args.engine.config()?)
        .with_context(|| format!("loading {}", path.display()))?;
    tracing::info!(model = %id, path = %path.display(), "model loaded");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.api_host.as_str(), args.api_port))
            .await
            .with_context(|| format!("binding {}:{}", args.api_host, args.api_port))?;
        let addr = listener.local_addr()?;
        // Tests and scripts wait for exactly this line.
        println!("shoal: listening on http://{addr}");
        let state = shoal_api::ApiState::new(engine);
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        shoal_api::serve(listener, state, shutdown)
            .await
            .context("serving HTTP")
    })
}
