//! Turns the cluster's instance table into what runs on this node.
//!
//! For each instance that uses this node, every stage's layers load where its record says (its first
//! `gpu.layers` on this node's GPU and the rest on the CPU, one `HybridStage`; all on the CPU when the
//! record has no `gpu`): stage 0 → load its layers, wait until every other stage
//! reports `ready`, connect a [`RemoteChain`], start an engine serving the model and warm it up (one
//! short internal request through every stage, [`EngineHandle::warm_up`]) before it is registered in
//! [`Engines`] for the API and reported ready; any other stage → load its layers and host them ([`Hosts`]). Load state is
//! published in this node's facts, and so is what each engine driven here is doing
//! ([`InstanceLoad`]: its queue and measured figures, refreshed every [`LOAD_REFRESH`]). An instance
//! that leaves the table is torn down (its engine's requests end, its memory is freed, its load is no
//! longer published).

use shoal_ids::{InstanceId, ModelId, NodeId};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use libp2p::PeerId;
use shoal_engine::draft_model::DraftModel;
use shoal_engine::engine::{
    EngineConfig, HybridStage, LoadedModel, Placement, load_hybrid_stage, load_local_share, spawn,
};
use shoal_engine::kvpool::{KvPool, KvShare};
use shoal_engine::{EngineHandle, Engines, Speculation};
use shoal_kernels::ThreadPool;
use shoal_model::LayerRange;
use shoal_placement::ModelCard;
use shoal_wire::DType;
use tokio::sync::watch;

mod group;
mod mend;
mod stages;

use stages::{check_stages_loaded, least_kv_capacity};

use crate::dataplane::{HostedStage, Hosts, Lanes, RemoteChain, StageKv, serve_stages};
use crate::error::PipelineError;
use shoal_cluster::InstanceRecord;
use shoal_cluster::facts::{InstanceLoad, InstanceStatus};
use shoal_cluster::{ClusterHandle, Snapshot};

/// How long a driver waits for other stages that load (from disk) without a sign of progress.
const LOAD_STALL: Duration = Duration::from_secs(600);
/// How long a driver waits for other stages whose download makes no progress.
const DOWNLOAD_STALL: Duration = Duration::from_secs(120);
/// How often a waiting driver looks at the other stages' progress.
const WAIT_TICK: Duration = Duration::from_secs(2);
/// How often the load of the engines driven here is refreshed in this node's facts.
const LOAD_REFRESH: Duration = Duration::from_millis(500);

/// Finds the local GGUF file of a model id.
pub type ModelLocator = Arc<dyn Fn(&str) -> Option<PathBuf> + Send + Sync>;

/// Fetches a model this node lacks (from peers, else the internet); resolves to the file to load from
/// (the whole model, or a sparse file holding the stage's tensors).
pub type ModelFetcher = Arc<
    dyn Fn(
            FetchRequest,
        ) -> BoxFuture<'static, Result<PathBuf, Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + Sync,
>;

/// What one stage needs fetched.
pub struct FetchRequest {
    pub model: ModelId,
    /// The stage's layers `start..end` of `n_layers`: only the bytes they need are required.
    pub start: usize,
    pub end: usize,
    pub n_layers: usize,
    /// Bytes fetched and verified so far, of those needed (the runtime publishes it as the stage's status).
    pub progress: watch::Sender<FetchState>,
}

/// Progress of one stage's fetch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchState {
    pub done: u64,
    pub needed: u64,
}

/// What the runtime needs from the rest of the node.
#[derive(Clone)]
pub struct RuntimeConfig {
    pub engine: EngineConfig,
    /// Dtype of activations on the wire (f16 halves the bytes).
    pub wire_dtype: DType,
    /// The local GGUF file of a model id, if present.
    pub model_path: ModelLocator,
    /// Fetches a model that is not present (`None`: a missing model fails the stage).
    pub fetch: Option<ModelFetcher>,
    /// Where this node listens for lanes, the data plane's direct connections (`None`: every
    /// data-plane stream carries its frames through the cluster connection).
    pub lanes: Option<LaneConfig>,
    /// A small model's GGUF file that drafts for speculative decoding (`Speculation::Draft`) on
    /// every instance this node drives whose model has the same token list; loaded once at start.
    pub draft_model: Option<PathBuf>,
}

/// The data plane's lane listener: `ip` as the cluster listens, and a port (0: a free one).
#[derive(Clone, Copy, Debug)]
pub struct LaneConfig {
    pub ip: std::net::IpAddr,
    pub port: u16,
    /// Whether another free port may be taken when `port` is in use (a port derived from the
    /// cluster's, not one the user named).
    pub fallback: bool,
}

/// What placement needs to know about the GGUF model at `path` (read from its header only), on a
/// node that loads the file's multi-token-prediction block (when it has one) only when `nextn`.
pub fn model_card(
    path: &Path,
    id: &ModelId,
    nextn: bool,
) -> Result<ModelCard, shoal_model::ModelError> {
    let mut gguf = shoal_model::gguf::GgufFile::open(path)?;
    let f = shoal_model::Footprint::from_gguf(&gguf)?;
    let f = if nextn { f } else { f.without_nextn() };
    let max_group = group::max_group(&mut gguf);
    Ok(ModelCard {
        id: id.clone(),
        n_layers: f.n_layers,
        layer_bytes: f.layer_bytes,
        embed_bytes: f.embed_bytes,
        head_bytes: f.head_bytes,
        active_head_bytes: f.active_head_bytes,
        kv_bytes_per_token_per_layer: f.kv_bytes_per_token_per_layer,
        context_length: f.context_length,
        hidden_bytes_per_token: f.hidden_bytes_per_token,
        tied_embeddings: f.tied_embeddings,
        weight_type: f.weight_type.to_ascii_lowercase(),
        layer_params: f.layer_params,
        active_layer_bytes: f.active_layer_bytes,
        active_layer_params: f.active_layer_params,
        head_type: f.head_type.to_ascii_lowercase(),
        head_params: f.head_params,
        vocab_size: f.vocab_size as u64,
        attention_flops_per_position: f.attention_flops_per_position,
        max_group,
    })
}

/// Starts the data-plane listener and the task that follows the instance table.
pub fn start(
    cluster: ClusterHandle,
    engines: Engines,
    mut config: RuntimeConfig,
) -> Result<(), PipelineError> {
    // Every engine on this node draws KV memory from one pool of the configured size, so several models
    // share the budget instead of each getting all of it.
    if config.engine.kv_pool.is_none() {
        config.engine.kv_pool = Some(Arc::new(KvPool::new(config.engine.kv_budget_bytes)));
    }
    let hosts = Hosts::default();
    let lanes = match config.lanes {
        Some(c) => Some(match Lanes::bind(c.ip, c.port, cluster.traffic()) {
            Ok(l) => l,
            Err(e) if c.fallback => {
                tracing::warn!(
                    port = c.port,
                    "data port in use ({e}): lanes take a free port"
                );
                Lanes::bind(c.ip, 0, cluster.traffic())?
            }
            Err(e) => return Err(e.into()),
        }),
        None => None,
    };
    serve_stages(cluster.clone(), hosts.clone(), lanes)?;
    let pool = Arc::new(ThreadPool::new(config.engine.threads.max(1)));
    if let Some(path) = &config.draft_model {
        let draft = DraftModel::load(path, &pool)?;
        tracing::info!(draft_model = draft.name(), "draft model loaded");
        config.engine.draft_model = Some(Arc::new(draft));
    }
    tokio::spawn(follow_table(cluster, engines, hosts, config, pool));
    Ok(())
}

/// A driver's started engine, and what turns `true` when its pipeline to the other stages breaks.
struct Driver {
    engine: EngineHandle,
    broke: Option<watch::Receiver<bool>>,
}

/// Engines registered by the instances this node drives, by instance id.
type Driven = Arc<std::sync::Mutex<HashMap<InstanceId, EngineHandle>>>;

/// What this node runs for one instance.
enum Running {
    /// Stage 0: the engine is registered under this model id.
    Driver {
        model: ModelId,
    },
    Host,
}

/// The instances this node runs, by instance id, with what it runs for each.
type RunningHere = HashMap<InstanceId, (InstanceRecord, Running)>;

/// What the table follower shares with every instance it brings up or tears down.
#[derive(Clone)]
struct Node {
    cluster: ClusterHandle,
    engines: Engines,
    hosts: Hosts,
    config: RuntimeConfig,
    pool: Arc<ThreadPool>,
    /// The engine each instance driven here registered, by instance id (set once it is loaded).
    driven: Driven,
}

/// Follows the instance table: on every change, tears down what left it and brings up what is new here.
async fn follow_table(
    cluster: ClusterHandle,
    engines: Engines,
    hosts: Hosts,
    config: RuntimeConfig,
    pool: Arc<ThreadPool>,
) {
    let me = cluster.id().to_string();
    let mut rx = cluster.subscribe();
    let mut running: RunningHere = HashMap::new();
    let node = Node {
        cluster,
        engines,
        hosts,
        config,
        pool,
        driven: Arc::default(),
    };
    // The loads published so far, by instance id (only changes are sent).
    let mut loads: HashMap<InstanceId, InstanceLoad> = HashMap::new();
    let mut tick = tokio::time::interval(LOAD_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let snap: Arc<Snapshot> = rx.borrow_and_update().clone();
        let mine = instances_using(&snap, &me);
        node.tear_down_stale(&mut running, &mine).await;
        node.stop_draining(&snap, &running);
        for rec in mine {
            node.start_new(&mut running, rec, &me);
        }
        // Until the table changes, refresh the loads now and then.
        loop {
            tokio::select! {
                changed = rx.changed() => match changed {
                    Ok(()) => break,
                    Err(_) => return,
                },
                _ = tick.tick() => node.publish_loads(&mut loads).await,
            }
        }
    }
}

/// The instances in `snap`'s table that use node `me`.
fn instances_using(snap: &Snapshot, me: &str) -> Vec<InstanceRecord> {
    snap.state
        .table()
        .instances
        .iter()
        .filter(|i| i.uses(me))
        .cloned()
        .collect()
}

/// Whether instance `id` is in the cluster's current table.
fn listed(cluster: &ClusterHandle, id: &InstanceId) -> bool {
    cluster
        .snapshot()
        .state
        .table()
        .instances
        .iter()
        .any(|i| i.id == *id)
}

impl Node {
    /// Publishes what each engine driven here is doing where it changed since `published`, and stops
    /// publishing it for engines no longer driven here.
    async fn publish_loads(&self, published: &mut HashMap<InstanceId, InstanceLoad>) {
        let now: Vec<(InstanceId, InstanceLoad)> = self
            .driven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, engine)| (*id, load_of(&engine.stats())))
            .collect();
        let gone: Vec<InstanceId> = published
            .keys()
            .filter(|id| !now.iter().any(|(n, _)| n == *id))
            .cloned()
            .collect();
        for id in gone {
            published.remove(&id);
            self.cluster.set_load(id, None).await;
        }
        for (id, load) in now {
            if published.get(&id) != Some(&load) {
                published.insert(id, load.clone());
                self.cluster.set_load(id, Some(load)).await;
            }
        }
    }

    /// Tears down what left the table (or changed shape).
    async fn tear_down_stale(&self, running: &mut RunningHere, mine: &[InstanceRecord]) {
        let stale: Vec<InstanceId> = running
            .iter()
            .filter(|(id, (rec, _))| !mine.iter().any(|m| m.id == **id && m == rec))
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            if let Some((rec, what)) = running.remove(&id) {
                tracing::info!(instance = %id, model = %rec.model, "instance removed here");
                match what {
                    Running::Driver { model } => {
                        self.retire_driver(running, &id, &model);
                        self.cluster.set_load(id, None).await;
                    }
                    Running::Host => self.hosts.remove(&id),
                }
                self.cluster.set_status(id, None).await;
            }
        }
    }

    /// Unregisters the engine instance `id` drove for `model`; another instance of the model driven
    /// here (not draining) serves it again.
    fn retire_driver(&self, running: &RunningHere, id: &InstanceId, model: &str) {
        let mut map = self.driven.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(engine) = map.remove(id) {
            self.unregister(running, &map, model, &engine);
        }
    }

    /// Draining instances driven here take no new requests: their engines leave [`Engines`] (requests
    /// in flight finish; the coordinator removes the instance once its driver reports it idle). The
    /// engine stays in `driven` until then, so its load keeps being published.
    fn stop_draining(&self, snap: &Snapshot, running: &RunningHere) {
        let map = self.driven.lock().unwrap_or_else(|e| e.into_inner());
        for id in &snap.state.table().draining {
            if let (Some((_, Running::Driver { model })), Some(engine)) =
                (running.get(id), map.get(id))
                && self.unregister(running, &map, model, engine)
            {
                tracing::info!(instance = %id, %model, "draining: no new requests here");
            }
        }
    }

    /// Takes `engine` out of [`Engines`] if it serves `model`; another instance of the model driven here
    /// that is not draining takes over. True when it was registered.
    fn unregister(
        &self,
        running: &RunningHere,
        map: &HashMap<InstanceId, EngineHandle>,
        model: &str,
        engine: &EngineHandle,
    ) -> bool {
        if !self.engines.remove_engine(model, engine) {
            return false;
        }
        let draining = self.cluster.snapshot().state.table().draining.clone();
        let other = running.iter().find_map(|(other, (r, _))| {
            (r.model == model && !draining.contains(other))
                .then(|| map.get(other).filter(|e| !e.same_engine(engine)).cloned())
                .flatten()
        });
        if let Some(other) = other {
            self.engines.insert(other);
        }
        true
    }

    /// Starts bringing up `rec` (on its own task) if it is new here and one of its stages is on `me`.
    fn start_new(&self, running: &mut RunningHere, rec: InstanceRecord, me: &str) {
        if running.contains_key(&rec.id) {
            return;
        }
        let Some((index, rank)) = group::place_of(&rec, me) else {
            return;
        };
        let what = if (index, rank) == (0, 0) {
            Running::Driver {
                model: rec.model.clone(),
            }
        } else {
            Running::Host
        };
        running.insert(rec.id, (rec.clone(), what));
        tokio::spawn(self.clone().load(rec, index, 1));
    }

    /// Brings up stage `index` of `rec`, publishing `loading`, then `ready` or `failed`; a failure is
    /// tried again (a second apart, `tries` in all) while the instance stays listed.
    async fn load(self, rec: InstanceRecord, index: usize, tries: usize) {
        let id = rec.id;
        self.cluster
            .set_status(id, Some(InstanceStatus::Loading))
            .await;
        let mut left = tries.max(1);
        let result = loop {
            left -= 1;
            match self.bring_up(&rec, index).await {
                Err(e) if left > 0 && listed(&self.cluster, &id) => {
                    tracing::warn!(instance = %id, model = %rec.model, stage = index, kind = e.error_type(), "stage not up ({e}): trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                other => break other.map(|driver| self.register(&rec, driver)),
            }
        };
        let status = match result {
            Ok(()) => {
                tracing::info!(instance = %id, model = %rec.model, stage = index, "stage ready");
                InstanceStatus::Ready
            }
            Err(error) => {
                tracing::error!(instance = %id, model = %rec.model, stage = index, kind = error.error_type(), "stage failed: {error}");
                metrics::counter!(
                    "shoal_instance_failures_total",
                    "model" => rec.model.to_string(),
                    "kind" => error.error_type()
                )
                .increment(1);
                // Published with its message.
                InstanceStatus::Failed {
                    error: error.to_string(),
                }
            }
        };
        // Only if the instance is still ours (it may have been removed while loading).
        if listed(&self.cluster, &id) {
            self.cluster.set_status(id, Some(status)).await;
        }
    }

    /// Registers the engine a driver started for instance `rec`, if any and if the instance is still
    /// listed, and has it brought up again should its pipeline break while the instance stays
    /// (`mend`).
    fn register(&self, rec: &InstanceRecord, driver: Option<Driver>) {
        // Removed while loading: the engine is dropped here and its thread ends.
        if let Some(Driver { engine, broke }) = driver
            && listed(&self.cluster, &rec.id)
        {
            self.driven
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(rec.id, engine.clone());
            self.engines.insert(engine.clone());
            if let Some(broke) = broke {
                tokio::spawn(self.clone().mend(rec.clone(), engine.downgrade(), broke));
            }
        }
    }

    /// Loads this node's part of `rec`; for stage 0 returns the started engine (to register) and
    /// what tells when its pipeline breaks.
    async fn bring_up(
        &self,
        rec: &InstanceRecord,
        index: usize,
    ) -> Result<Option<Driver>, PipelineError> {
        let stage = &rec.stages[index];
        let n_layers = rec.stages.last().map_or(0, |s| s.end);
        let range = LayerRange::new(stage.start, stage.end, n_layers)?;
        let path = match (self.config.model_path)(&rec.model) {
            Some(path) => path,
            None => self.fetch(rec, range, n_layers).await?,
        };
        let me = self.cluster.id().to_string();
        let rank = group::place_of(rec, &me).map_or(0, |(i, r)| if i == index { r } else { 0 });
        if rank > 0 || index > 0 {
            if rank > 0 {
                self.host_member(rec, (index, rank), path, range).await?;
            } else {
                self.host_stage(rec, index, path, range).await?;
            }
            // Removed while it loaded: the table's follower may have torn the instance down before
            // it was hosted, so nothing else would free its layers and KV.
            if !listed(&self.cluster, &rec.id) {
                self.hosts.remove(&rec.id);
                return Err(PipelineError::RemovedWhileLoading);
            }
            return Ok(None);
        }
        self.drive(rec, path, range).await.map(Some)
    }

    /// Fetches the bytes of `range` of `rec`'s model, publishing `downloading` with its progress.
    async fn fetch(
        &self,
        rec: &InstanceRecord,
        range: LayerRange,
        n_layers: usize,
    ) -> Result<PathBuf, PipelineError> {
        let fetch = self
            .config
            .fetch
            .clone()
            .ok_or_else(|| PipelineError::ModelMissing {
                model: rec.model.clone(),
            })?;
        let (tx, mut rx) = watch::channel(FetchState::default());
        let request = FetchRequest {
            model: rec.model.clone(),
            start: range.start,
            end: range.end,
            n_layers,
            progress: tx,
        };
        let (cluster, id) = (self.cluster.clone(), rec.id);
        // Publishes the progress at most every half second until the fetch ends (its sender drops).
        let reporter = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let s = *rx.borrow_and_update();
                let status = InstanceStatus::Downloading {
                    done: s.done,
                    needed: s.needed,
                };
                cluster.set_status(id, Some(status)).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let result = fetch(request).await;
        let _ = reporter.await;
        let path = result.map_err(|source| PipelineError::Fetch {
            model: rec.model.clone(),
            source,
        })?;
        if listed(&self.cluster, &rec.id) {
            self.cluster
                .set_status(rec.id, Some(InstanceStatus::Loading))
                .await;
        }
        Ok(path)
    }

    /// Loads stage `index` (> 0) of `rec`, sets its KV share aside (published) and hosts it.
    async fn host_stage(
        &self,
        rec: &InstanceRecord,
        index: usize,
        path: PathBuf,
        range: LayerRange,
    ) -> Result<(), PipelineError> {
        let stage = &rec.stages[index];
        let pool = self.pool.clone();
        // Where its record says: its first layers on this node's GPU, or all on the CPU.
        let placement = stage_placement(stage, &self.config.engine);
        let mut members_capacity = None;
        let local = match group::share_of(&path, rec, index, range, 0)? {
            // Rank 0 of a group: its share, joined to the other members before it is hosted.
            Some((share, _)) => {
                let mut local = tokio::task::spawn_blocking(move || {
                    load_local_share(&path, range, &share, &pool)
                })
                .await??;
                let dim = local.model().config().dim;
                members_capacity = self.form_group(rec, index, &mut local, dim).await?;
                HybridStage::from(local)
            }
            None => {
                tokio::task::spawn_blocking(move || {
                    load_hybrid_stage(&path, range, &pool, placement)
                })
                .await??
            }
        };
        let kv = reserve_kv(&self.config, &local)?;
        let tokens = members_capacity.map_or(kv.tokens, |m| m.min(kv.tokens));
        self.cluster.set_kv_capacity(rec.id, tokens as u64).await;
        let next = next_node(rec, index)?;
        self.hosts.insert(HostedStage::new(
            rec.id,
            index,
            (stage.start, stage.end),
            next,
            local,
            kv,
        ));
        Ok(())
    }

    /// Loads stage 0 of `rec`, chains the other stages to it and starts the engine.
    async fn drive(
        &self,
        rec: &InstanceRecord,
        path: PathBuf,
        range: LayerRange,
    ) -> Result<Driver, PipelineError> {
        let (pool2, model) = (self.pool.clone(), rec.model.clone());
        // The driver's own layers run where the instance's record says (the planner followed the
        // node's `--device`).
        // The model's multi-token-prediction block drafts only where the whole model runs here.
        let mtp = matches!(self.config.engine.speculative, Speculation::Mtp { .. });
        let placement = stage_placement(&rec.stages[0], &self.config.engine)
            .with_nextn(mtp && rec.stages.len() == 1);
        let share = group::share_of(&path, rec, 0, range, 0)?.map(|(s, _)| s);
        let grouped = share.is_some();
        let mut loaded = tokio::task::spawn_blocking(move || match share {
            Some(share) => LoadedModel::from_gguf_share(&path, &model, range, &share, &pool2),
            None => LoadedModel::from_gguf_on(&path, &model, Some(&[range]), &pool2, placement),
        })
        .await??;
        if grouped {
            let dim = loaded.config.dim;
            self.form_group(rec, 0, loaded.stages[0].as_mut(), dim)
                .await?;
        }
        let mut broke = None;
        if rec.stages.len() > 1 {
            let (tx, rx) = watch::channel(false);
            let chain = self.connect_chain(rec).await?.on_break(tx);
            loaded.stages.push(Box::new(chain));
            broke = Some(rx);
        }
        let engine = spawn(loaded, self.config.engine.clone())?;
        // Before it serves (registered, reported ready): its first request is as fast as the rest.
        let warmed = engine.warm_up().await.map_err(PipelineError::WarmUp)?;
        tracing::info!(
            instance = %rec.id,
            model = %rec.model,
            prompt_tokens = warmed.prompt_tokens,
            took_ms = warmed.took.as_millis() as u64,
            "warmed up"
        );
        Ok(Driver { engine, broke })
    }

    /// Waits until the other stages of `rec` are ready and connects to them.
    async fn connect_chain(&self, rec: &InstanceRecord) -> Result<RemoteChain, PipelineError> {
        let others: Vec<NodeId> = rec.stages[1..].iter().map(|s| s.node.clone()).collect();
        let snap = self.wait_for_stages(rec, &others).await?;
        if !snap.state.table().instances.iter().any(|i| i.id == rec.id) {
            return Err(PipelineError::RemovedWhileLoading);
        }
        check_stages_loaded(&snap, rec, &others)?;
        let layers: Vec<(usize, usize)> = rec.stages.iter().map(|s| (s.start, s.end)).collect();
        let capacity = least_kv_capacity(&snap, rec, &others);
        let chain = RemoteChain::connect(
            &self.cluster,
            &rec.id,
            &layers,
            &others,
            self.config.wire_dtype,
            self.config.lanes.is_some(),
        )
        .await
        .map_err(|e| PipelineError::Connect(Box::new(e)))?
        .with_kv_capacity(capacity);
        Ok(chain)
    }
}

/// What an engine's counters say its instance is doing, as its facts publish it.
fn load_of(s: &shoal_engine::EngineStats) -> InstanceLoad {
    InstanceLoad {
        running: s.active_sequences as u32,
        queued: s.waiting as u32,
        decode_tok_s: s.decode_tok_s,
        ttft_ms: s.ttft_ms,
        finished: s.finished,
        generated_tokens: s.generated_tokens,
        spec_passes: s.spec_passes,
        drafted_tokens: s.drafted_tokens,
        accepted_tokens: s.accepted_tokens,
    }
}

/// Where a stage's layers run, as its record says: the first `gpu.layers` on GPU `gpu.index` (their
/// KV within the engine config's device budget) and the rest on the CPU, or all on the CPU.
fn stage_placement(stage: &shoal_placement::Stage, engine: &EngineConfig) -> Placement {
    match stage.gpu {
        Some(g) => Placement::gpu(g.index, g.layers, engine.device_kv_budget_bytes),
        None => Placement::cpu(),
    }
}

/// Sets aside this node's KV share for a hosted stage's CPU layers: the driver cannot draw on this
/// node's pool as its sequences grow (as many tokens as the budget holds for the whole model, or
/// what is left); a GPU part's device budget bounds the tokens too.
fn reserve_kv(config: &RuntimeConfig, local: &HybridStage) -> Result<StageKv, PipelineError> {
    let device = local.device_kv_tokens();
    let host_bytes = local.host_kv_bytes_per_token();
    if host_bytes == 0 {
        let tokens = device.unwrap_or(0);
        return Ok(StageKv {
            share: None,
            tokens,
        });
    }
    let kv_pool = config
        .engine
        .kv_pool
        .clone()
        .ok_or(PipelineError::NoKvPool)?;
    let share = KvShare::reserve(&kv_pool, host_bytes, local.model_kv_bytes_per_token())?;
    let tokens = device.map_or(share.tokens(), |d| d.min(share.tokens()));
    Ok(StageKv {
        share: Some(share),
        tokens,
    })
}

/// The node of the stage after `index` in `rec`; `None` for the last stage.
fn next_node(rec: &InstanceRecord, index: usize) -> Result<Option<PeerId>, PipelineError> {
    Ok(match rec.stages.get(index + 1) {
        Some(s) => Some(s.node.parse().map_err(|source| PipelineError::BadNodeId {
            node: s.node.clone(),
            source,
        })?),
        None => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_card_matches_the_gguf() {
        let path = shoal_testkit::fixtures::model_path();
        let card = model_card(&path, &"m".parse().unwrap(), false).unwrap();
        assert_eq!(card.n_layers, 30);
        assert_eq!(card.hidden_bytes_per_token, 2 * 576);
        // 3 KV heads × 64 dims × K and V × f16.
        assert_eq!(card.kv_bytes_per_token_per_layer, 3 * 64 * 2 * 2);
        assert_eq!(
            (card.weight_type.as_str(), card.layer_params),
            ("q4_1", 3_538_944)
        );
        let total = card.embed_bytes + 30 * card.layer_bytes;
        let file = std::fs::metadata(&path).unwrap().len();
        assert!(total < file && total > file / 2, "{total} vs file {file}");
        // 9 query heads in 3 KV groups, 64 dims each, Q4_1's 32-value blocks: a group of up to the
        // planner's most members can cut it.
        assert_eq!(card.max_group, shoal_placement::MAX_GROUP);
    }
}
