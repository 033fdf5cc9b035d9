//! The `shoal` binary: CLI, configuration, wiring and tracing setup.
//!
//! - `shoal serve`: fetch the model if needed, load it, serve the HTTP API.
//! - `shoal chat "prompt"`: stream an answer in the terminal (in-process, or from a server with `--url`).
//! - `shoal bench`: prefill / decode throughput, TTFT and inter-token latency (run by `shoal-bench`).
//! - `shoal pull` / `shoal models` / `shoal rm`: fetch, list and delete models (`models`).

mod chat;
mod cli;
mod models;

use anyhow::Context;
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
        Command::Serve(args) => serve(args),
        Command::Chat(args) => chat::run(args),
        Command::Bench(args) => bench(args),
        Command::Pull(args) => models::pull(&args),
        Command::Models(args) => models::models(&args),
        Command::Rm(args) => models::rm(&args),
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

/// The served model's card first, then one for every other model present in `models_dir`, so the cluster
/// can place any of them on this node; a file that cannot be read is logged and left out.
fn present_model_cards(
    served: shoal_placement::ModelCard,
    models_dir: &std::path::Path,
) -> Vec<shoal_placement::ModelCard> {
    let store = shoal_store::Store::new(models_dir);
    let mut cards = vec![served];
    for id in store.present() {
        if cards.iter().any(|c| c.id == id) {
            continue;
        }
        let card = store
            .model_file(&id)
            .map_err(|e| e.to_string())
            .and_then(|p| shoal_pipeline::model_card(&p, &id).map_err(|e| e.to_string()));
        match card {
            Ok(card) => cards.push(card),
            Err(e) => tracing::warn!(model = %id, "not offered to the cluster: {e}"),
        }
    }
    cards
}

fn serve(args: cli::ServeArgs) -> anyhow::Result<()> {
    let (id, path) = resolve_model(&args.model)?;
    let engine_config = args.engine.config()?;
    let card = shoal_pipeline::model_card(&path, &id)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let models = present_model_cards(card, &args.model.models_dir());
    let cargs = args.cluster.clone();
    let cluster_key = cargs.cluster_key()?;
    let listen = shoal_cluster::parse_peer(&cargs.cluster_listen)?;
    let peers = cargs
        .peers
        .iter()
        .map(|p| shoal_cluster::parse_peer(p))
        .collect::<Result<Vec<_>, _>>()?;
    let wire_dtype = match cargs.wire_dtype.as_str() {
        "f32" => shoal_wire::DType::F32,
        _ => shoal_wire::DType::F16,
    };
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
        let cluster = shoal_cluster::start(shoal_cluster::ClusterConfig {
            state_dir: cargs.state_dir(),
            cluster_key,
            listen: vec![listen],
            peers,
            mdns: !cargs.no_mdns,
            api_url: Some(format!("http://{addr}")),
            models,
            backend: format!("cpu-{}", shoal_kernels::Backend::detect().name()),
        })
        .await
        .context("starting the cluster node")?;
        println!("shoal: node {}", cluster.id());
        for a in &cluster.snapshot().listen_addrs {
            println!("shoal: cluster listening on {a}");
        }
        let engines = shoal_engine::Engines::default();
        let models_dir = args.model.models_dir();
        let (served_id, served_path) = (id.clone(), path.clone());
        let model_path = std::sync::Arc::new(move |m: &str| {
            if m == served_id {
                return Some(served_path.clone());
            }
            shoal_store::Store::new(models_dir.clone())
                .model_file(m)
                .ok()
        });
        shoal_pipeline::start(
            cluster.clone(),
            engines.clone(),
            shoal_pipeline::RuntimeConfig {
                engine: engine_config.clone(),
                wire_dtype,
                model_path,
            },
        )
        .map_err(|e| anyhow::anyhow!("starting the data plane: {e}"))?;
        if engine_config.stages.is_some() {
            // A pipeline of local stages in this process (for development and benchmarks).
            let engine = shoal_engine::engine::spawn_from_gguf(&path, &id, engine_config)
                .with_context(|| format!("loading {}", path.display()))?;
            engines.insert(engine);
        } else if !cargs.no_auto_instance {
            place_here(&cluster, &engines, &id).await?;
        }
        tracing::info!(model = %id, path = %path.display(), "serving");
        // Tests and scripts wait for exactly this line.
        println!("shoal: listening on http://{addr}");
        let mut state = shoal_api::ApiState::new(engines);
        state.cluster = Some(cluster);
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        shoal_api::serve(listener, state, shutdown)
            .await
            .context("serving HTTP")
    })
}

/// Places the served model on this node (pinned: every node serves its own replica by default) and
/// waits until it is loaded.
async fn place_here(
    cluster: &shoal_cluster::ClusterHandle,
    engines: &shoal_engine::Engines,
    model: &str,
) -> anyhow::Result<()> {
    let me = cluster.id().to_string();
    let request = shoal_cluster::PlaceRequest {
        model: model.to_string(),
        nodes: Some(vec![me]),
        ..Default::default()
    };
    let record = cluster
        .place(request)
        .await
        .map_err(|e| anyhow::anyhow!("placing {model} on this node: {e}"))?;
    let id = record.id.clone();
    let snap = cluster
        .wait_for(std::time::Duration::from_secs(600), |s| {
            s.state
                .view()
                .instances
                .iter()
                .any(|i| i.record.id == id && !i.is_loading())
        })
        .await;
    let view = snap.state.view();
    match view.instances.iter().find(|i| i.record.id == id) {
        Some(i) if i.is_ready() && engines.get(model).is_ok() => Ok(()),
        Some(i) => anyhow::bail!("loading {model} failed: {:?}", i.stage_status),
        None => anyhow::bail!("the instance of {model} was removed while loading"),
    }
}
