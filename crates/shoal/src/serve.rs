//! `shoal serve`: join (or start) the cluster, bring the served model here, place it on this node and
//! serve the HTTP API.
//!
//! Order: the served model is looked up locally (a path, the models dir, the hub cache) without the
//! network → this node's compute is measured (or read from the cache, [`crate::compute`]) → its GPUs
//! are found, and those `--device` may use measured, on the runtime's blocking pool
//! ([`crate::gpus`]; `--device auto` then picks the faster of CPU and GPU for the engine) while the
//! cluster node starts, publishing those figures and the GPUs, offering every complete local model → this node's
//! [`shoal_transfer::Downloads`] and blob server start (peers may fetch from us at once; the complete
//! models' chunk manifests are made in the background, once per file) → a missing
//! served model comes from a peer that has it (waiting a few seconds for peers to show up), else from
//! the internet with a progress bar → the model is placed here and the API serves. The Prometheus
//! recorder is installed before anything else (`shoal_api::metrics::install`), so every metric handle
//! the engine, pipeline and cluster register records into it; `GET /metrics` renders it. The soft
//! open-files limit is raised to the hard one, and the API serves at most a number of connections
//! below it (`serve_config`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use shoal_placement::ModelCard;
use shoal_store::{ModelRef, Store};
use shoal_transfer::{Downloads, Want};

use crate::cli::ServeArgs;

/// How long a node whose model is missing waits for a peer that has it: with `--peer`, and with mDNS only.
const HOLDER_WAIT_STATIC: Duration = Duration::from_secs(15);
const HOLDER_WAIT_MDNS: Duration = Duration::from_secs(3);
/// How long the start waits for the GPUs to be found and measured (a driver that hangs must not
/// hang the node: it then serves on CPU and publishes no GPU).
const GPU_WAIT: Duration = Duration::from_secs(120);
/// How often a download the node waits on is reported on stderr.
const REPORT_EVERY: Duration = Duration::from_secs(2);

/// The served model when it is complete here (or a path), as (id, file); `None` when it must be fetched.
fn local_model(store: &Store, model: &str) -> anyhow::Result<Option<(String, PathBuf)>> {
    Ok(crate::models::pull_local(store, model)
        .with_context(|| format!("getting model '{model}'"))?
        .map(|p| (p.id, p.path)))
}

/// The served model's card first (when it is here), then one for every other complete model in the
/// store, so the cluster can place any of them on this node; a file that cannot be read is logged and
/// left out. `nextn`: this node loads a file's multi-token-prediction block (`--speculative mtp`).
fn model_cards(store: &Store, served: Option<&(String, PathBuf)>, nextn: bool) -> Vec<ModelCard> {
    let mut cards = Vec::new();
    let mut add = |id: &str, path: &std::path::Path| {
        if cards.iter().any(|c: &ModelCard| c.id == id) {
            return;
        }
        let card = shoal_ids::ModelId::parse(id)
            .map_err(|e| e.to_string())
            .and_then(|m| shoal_pipeline::model_card(path, &m, nextn).map_err(|e| e.to_string()));
        match card {
            Ok(card) => cards.push(card),
            Err(e) => tracing::warn!(model = %id, "not offered to the cluster: {e}"),
        }
    };
    if let Some((id, path)) = served {
        add(id, path);
    }
    for id in store.present() {
        match store.model_file(&id) {
            Ok(path) => add(&id, &path),
            Err(e) => tracing::warn!(model = %id, "not offered to the cluster: {e}"),
        }
    }
    cards
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    // First: metric handles registered before the recorder exists would record nothing.
    let metrics = shoal_api::metrics::install();
    let store = Store::new(args.model.models_dir());
    let local = local_model(&store, &args.model.model)?;
    if local.is_none() && args.model.offline {
        // Says what is missing and where it looked.
        crate::resolve_model(&args.model)?;
    }
    let engine_config = shoal_engine::engine::EngineConfig {
        seed: args.seed,
        ..args.engine.config()?
    };
    anyhow::ensure!(
        args.draft_model.is_some()
            || !matches!(
                engine_config.speculative,
                shoal_engine::Speculation::Draft { .. }
            ),
        "--speculative draft needs --draft-model (a small model with the served model's token list)"
    );
    // Before the model loads and the cluster starts: a quiet machine measures what it is worth.
    let compute = match &args.compute {
        Some(file) => crate::compute::from_file(file)?,
        None => crate::compute::measure_or_load(engine_config.threads),
    };
    let api_keys = shoal_api::auth::ApiKeys::new(args.api_keys()?);
    let origins = shoal_api::guard::origin::OriginPolicy::new(&args.cors_origins)
        .map_err(|e| anyhow::anyhow!("--cors-origin / SHOAL_ORIGINS: {e}"))?;
    let serve_config = serve_config(&args);
    let cargs = args.cluster.clone();
    let listen = shoal_cluster::parse_peer(&cargs.cluster_listen)?;
    let lanes = (!cargs.no_lanes).then(|| lane_config(&listen, cargs.data_port));
    let wire_dtype = match cargs.wire_dtype.as_str() {
        "f32" => shoal_wire::DType::F32,
        _ => shoal_wire::DType::F16,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Off the async workers: the Vulkan loader and every driver are asked, and the GPUs `--device`
    // may use are measured (or read from the cache): it can take a moment.
    let device_choice = args.engine.device;
    let gpus = {
        let cpu = compute.clone();
        rt.spawn_blocking(move || crate::gpus::discover_probe_and_log(device_choice, &cpu))
    };
    let cpu_compute = compute.clone();
    let nextn = matches!(
        engine_config.speculative,
        shoal_engine::Speculation::Mtp { .. }
    );
    let cards = model_cards(&store, local.as_ref(), nextn);
    // The served model's main weight type (its card comes first): what `--device auto` compares.
    let served_card = local
        .as_ref()
        .and_then(|(id, _)| cards.iter().find(|c| &c.id == id));
    let weight_type = served_card.map_or_else(String::new, |c| c.weight_type.clone());
    // A GPU stage runs mixture-of-experts layers (`--device gpu:N`), but its prefill is not grouped by
    // expert yet and no GPU rate of an MoE model is measured: `auto` keeps such a model on the CPU.
    let experts = served_card.is_some_and(|c| c.has_experts());
    rt.block_on(async move {
        let (cluster_key, peers) = crate::membership::cluster_key_and_peers(&cargs).await?;
        let peers = peers
            .iter()
            .map(|p| shoal_cluster::parse_peer(p))
            .collect::<Result<Vec<_>, _>>()?;
        let holder_wait = if peers.is_empty() {
            HOLDER_WAIT_MDNS
        } else {
            HOLDER_WAIT_STATIC
        };
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
            models: cards,
            backend: format!("cpu-{}", shoal_kernels::Backend::detect().name()),
            machine: cargs.machine.clone(),
        })
        .await
        .context("starting the cluster node")?;
        cluster.set_compute(compute).await;
        // Which GPU this node offers the planner: the layers placed here, driven or hosted, run
        // where their instance's record says.
        cluster.set_device(device_policy(args.engine.device)).await;
        let gpus = match tokio::time::timeout(GPU_WAIT, gpus).await {
            Ok(found) => found.unwrap_or_default(),
            Err(_) => {
                tracing::warn!(
                    "finding and measuring the GPUs took over {} s: none published, serving on CPU",
                    GPU_WAIT.as_secs()
                );
                Vec::new()
            }
        };
        // A GPU named with `--device gpu:N` that this machine does not have stops the start, naming the
        // adapters found (serving on the CPU instead would hide the mistake).
        if let shoal_bench::DeviceChoice::Gpu(i) = device_choice
            && i >= gpus.len()
        {
            shoal_engine::gpu_stage::open_gpu(i)?;
        }
        let mut engine_config = engine_config;
        if device_choice == shoal_bench::DeviceChoice::Auto {
            engine_config.device = if experts {
                tracing::info!(
                    "--device auto: a mixture-of-experts model runs on the CPU (--device gpu:N puts it on a GPU, whose prefill is not grouped by expert yet)"
                );
                shoal_engine::gpu_stage::Device::Cpu
            } else {
                crate::gpus::resolve(device_choice, &weight_type, &cpu_compute, &gpus)
            };
        }
        cluster.set_gpus(gpus).await;
        println!("shoal: node {}", cluster.id());
        for a in &cluster.snapshot().listen_addrs {
            println!("shoal: cluster listening on {a}");
        }

        // A served model given as a path is found by id like the store's models.
        let served = Arc::new(std::sync::Mutex::new(local.clone()));
        let locate: shoal_transfer::Locate = {
            let (store, served) = (store.clone(), served.clone());
            Arc::new(move |m: &str| {
                if let Some((id, path)) = served.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
                    && id == m
                {
                    return Some(path.clone());
                }
                store.model_file(m).ok()
            })
        };
        let upload_limit = cargs.upload_limit.map(|mb| (mb * 1e6) as u64);
        shoal_transfer::serve_blobs(&cluster, locate.clone(), upload_limit)
            .map_err(|e| anyhow::anyhow!("starting the blob server: {e}"))?;
        // Manifests of the complete models, made now (once per file; cached beside it) so a peer's
        // first fetch does not wait for the hashing.
        tokio::task::spawn_blocking({
            let store = store.clone();
            move || {
                for id in store.present() {
                    if let Ok(path) = store.model_file(&id)
                        && let Err(e) = shoal_transfer::Manifest::load_or_compute(&path)
                    {
                        tracing::warn!(model = %id, "no manifest: {e}");
                    }
                }
            }
        });
        let downloads = Downloads::new(store.clone(), cluster.clone());
        {
            // A model that finished downloading is offered to the cluster (placeable here, a source).
            let (store, served, cluster) = (store.clone(), served.clone(), cluster.clone());
            downloads.on_complete(Arc::new(move |_, _| {
                let s = served.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let cards = model_cards(&store, s.as_ref(), nextn);
                let cluster = cluster.clone();
                tokio::spawn(async move { cluster.set_models(cards).await });
            }));
        }

        let draft_model = match &args.draft_model {
            None => None,
            Some(m) if std::path::Path::new(m).is_file() => Some(std::path::PathBuf::from(m)),
            Some(m) => Some(store.model_file(m).map_err(|e| {
                anyhow::anyhow!(
                    "--draft-model {m}: neither a file nor a model in the store ({e}); `shoal pull {m}` first"
                )
            })?),
        };
        let engines = shoal_engine::Engines::default();
        shoal_pipeline::start(
            cluster.clone(),
            engines.clone(),
            shoal_pipeline::RuntimeConfig {
                engine: engine_config.clone(),
                wire_dtype,
                model_path: locate,
                fetch: Some(stage_fetcher(downloads.clone())),
                lanes,
                draft_model,
            },
        )
        .map_err(|e| anyhow::anyhow!("starting the data plane: {e}"))?;

        let (id, path) = match local {
            Some(found) => found,
            None => {
                let found =
                    bring_served_model(&args.model, &cluster, &downloads, holder_wait).await?;
                *served.lock().unwrap_or_else(|e| e.into_inner()) = Some(found.clone());
                cluster.set_models(model_cards(&store, Some(&found), nextn)).await;
                found
            }
        };
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
        state.downloads = Some(downloads);
        state.api_keys = api_keys;
        state.metrics = Some(metrics);
        state.origins = origins;
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        shoal_api::serve(listener, state, serve_config, shutdown)
            .await
            .context("serving HTTP")
    })
}

/// How the API serves connections: the header timeout given (else the default) and the connection cap
/// given, else one below the open-files limit, raised first to the hard limit.
fn serve_config(args: &ServeArgs) -> shoal_api::ServeConfig {
    let fd_limit = raise_open_files_limit();
    let config = shoal_api::ServeConfig {
        header_timeout: args
            .header_timeout_ms
            .map_or(shoal_api::server::DEFAULT_HEADER_TIMEOUT, |ms| {
                Duration::from_millis(ms.max(1))
            }),
        max_connections: args
            .max_connections
            .unwrap_or_else(|| shoal_api::server::max_connections_for(fd_limit))
            .max(1),
    };
    tracing::debug!(fd_limit, ?config, "serving connections");
    config
}

/// Raises this process's soft limit on open files to its hard limit (a node serving many connections,
/// model files and a cluster's sockets needs more than the usual 1,024); the soft limit in force after.
fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    // macOS refuses an unlimited soft limit for open files: try the hard limit, then 10,240 (OPEN_MAX).
    for want in [limit.rlim_max, limit.rlim_max.min(10_240)] {
        if want <= limit.rlim_cur {
            break;
        }
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = want;
            break;
        }
    }
    limit.rlim_cur
}

/// Where the data plane's lanes listen: the cluster's host, on `port` or else the cluster port + 1
/// (another free one when that is taken; a free one when the cluster port is 0 or not TCP).
fn lane_config(
    cluster: &shoal_cluster::Multiaddr,
    port: Option<u16>,
) -> shoal_pipeline::LaneConfig {
    let sock = shoal_cluster::tcp_socket(cluster);
    let ip = sock.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |s| s.ip());
    match port {
        Some(port) => shoal_pipeline::LaneConfig {
            ip,
            port,
            fallback: false,
        },
        None => shoal_pipeline::LaneConfig {
            ip,
            port: sock
                .map(|s| s.port())
                .filter(|&p| p != 0)
                .and_then(|p| p.checked_add(1))
                .unwrap_or(0),
            fallback: true,
        },
    }
}

/// The runtime's fetcher: a stage's bytes (the whole model for a stage holding every layer), with the
/// download's progress mirrored into the stage's published status.
fn stage_fetcher(downloads: Downloads) -> shoal_pipeline::ModelFetcher {
    Arc::new(move |req: shoal_pipeline::FetchRequest| {
        let downloads = downloads.clone();
        Box::pin(async move {
            let want = if req.start == 0 && req.end == req.n_layers {
                Want::Whole
            } else {
                Want::Stage {
                    start: req.start,
                    end: req.end,
                    n_layers: req.n_layers,
                }
            };
            let mirror = {
                let (downloads, model, tx) =
                    (downloads.clone(), req.model.clone(), req.progress.clone());
                tokio::spawn(async move {
                    loop {
                        if let Some(p) = downloads.progress(&model) {
                            tx.send_replace(shoal_pipeline::FetchState {
                                done: p.done,
                                needed: p.needed,
                            });
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                })
            };
            let result = downloads.fetch(&req.model, want).await;
            mirror.abort();
            result.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })
    })
}

/// The served model, which is not here: from a peer that has it (waiting up to `wait` for one to show
/// up), else from the internet with a progress bar.
async fn bring_served_model(
    model: &crate::cli::ModelArgs,
    cluster: &shoal_cluster::ClusterHandle,
    downloads: &Downloads,
    wait: Duration,
) -> anyhow::Result<(String, PathBuf)> {
    let id = ModelRef::parse(&model.model)
        .with_context(|| format!("getting model '{}'", crate::models::shown(&model.model)))?
        .id();
    let me = cluster.id().to_string();
    let snap = cluster
        .wait_for(wait, |s| {
            !shoal_transfer::downloads::holders(s, &me, &id).is_empty()
        })
        .await;
    let peer_has_it = !shoal_transfer::downloads::holders(&snap, &me, &id).is_empty();
    if !peer_has_it {
        let args = model.clone();
        return tokio::task::spawn_blocking(move || crate::resolve_model(&args))
            .await
            .context("fetching the model")?;
    }
    eprintln!("shoal: fetching {id} from the peers that have it");
    let report = {
        let (downloads, id) = (downloads.clone(), id.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REPORT_EVERY).await;
                if let Some(p) = downloads.progress(&id) {
                    let pct = 100.0 * p.done as f64 / p.needed.max(1) as f64;
                    eprintln!(
                        "shoal: {id}: {pct:.0}% of {:.1} MB, {:.1} MB/s",
                        p.needed as f64 / 1e6,
                        p.bytes_per_s / 1e6
                    );
                }
            }
        })
    };
    let path = downloads.fetch(&id, Want::Whole).await;
    report.abort();
    let path = path.with_context(|| format!("fetching {id}"))?;
    Ok((id, path))
}

/// Places the served model on this node (pinned: every node serves its own replica by default) and
/// waits until it is loaded. Joining a cluster meanwhile keeps the instance (tables merge without losing
/// one: `shoal_cluster::state::merge`); only a removal (`DELETE /instance`) takes it away.
async fn place_here(
    cluster: &shoal_cluster::ClusterHandle,
    engines: &shoal_engine::Engines,
    model: &str,
) -> anyhow::Result<()> {
    let request = shoal_cluster::PlaceRequest {
        nodes: Some(vec![shoal_cluster::node_id(&cluster.id())]),
        ..shoal_cluster::PlaceRequest::of(shoal_ids::ModelId::parse(model)?)
    };
    let record = cluster
        .place(request)
        .await
        .map_err(|e| anyhow::anyhow!("placing {model} on this node: {e}"))?;
    let id = record.id;
    let snap = cluster
        .wait_for(std::time::Duration::from_secs(600), |s| {
            let view = s.state.view();
            let mine = view.instances.iter().find(|i| i.record.id == id);
            mine.is_none_or(|i| !i.is_loading())
        })
        .await;
    let view = snap.state.view();
    match view.instances.iter().find(|i| i.record.id == id) {
        Some(i) if i.is_ready() && engines.get(model).is_ok() => Ok(()),
        Some(i) => anyhow::bail!(
            "loading {model} failed: {}",
            i.failure().unwrap_or_else(|| match i.status {
                shoal_cluster::state::InstanceState::Loading =>
                    "it was still loading after 10 minutes".to_string(),
                _ => "its instance is ready, but no engine for it started on this node".to_string(),
            })
        ),
        None => anyhow::bail!("the instance of {model} (id {id}) was removed while it loaded"),
    }
}

/// `--device` as the policy this node publishes for the planner.
fn device_policy(choice: shoal_bench::DeviceChoice) -> shoal_cluster::facts::DevicePolicy {
    use shoal_bench::DeviceChoice;
    use shoal_cluster::facts::DevicePolicy;
    match choice {
        DeviceChoice::Cpu => DevicePolicy::Cpu,
        DeviceChoice::Gpu(i) => DevicePolicy::Gpu(i),
        DeviceChoice::Auto => DevicePolicy::Auto,
    }
}
