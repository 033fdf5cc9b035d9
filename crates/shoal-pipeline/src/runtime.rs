//! Turns the cluster's instance table into what runs on this node.
//!
//! For each instance that uses this node: stage 0 → load its layers, wait until every other stage
//! reports `ready`, connect a [`RemoteChain`] and start an engine serving the model (registered in
//! [`Engines`] for the API); any other stage → load its layers and host them ([`Hosts`]). Load state is
//! published in this node's facts. An instance that leaves the table is torn down (its engine's
//! requests end, its memory is freed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use libp2p::PeerId;
use shoal_engine::engine::{EngineConfig, LoadedModel, load_local_stage, spawn};
use shoal_engine::kvpool::{KvPool, KvShare};
use shoal_engine::stage::LocalStage;
use shoal_engine::{EngineHandle, Engines};
use shoal_kernels::ThreadPool;
use shoal_model::LayerRange;
use shoal_placement::ModelCard;
use shoal_wire::DType;

use crate::dataplane::{HostedStage, Hosts, RemoteChain, serve_stages};
use crate::error::PipelineError;
use shoal_cluster::InstanceRecord;
use shoal_cluster::facts::InstanceStatus;
use shoal_cluster::{ClusterHandle, Snapshot};

/// How long a driver waits for the other stages of its instance to load.
const STAGES_READY_TIMEOUT: Duration = Duration::from_secs(600);

/// Finds the local GGUF file of a model id.
pub type ModelLocator = Arc<dyn Fn(&str) -> Option<PathBuf> + Send + Sync>;

/// What the runtime needs from the rest of the node.
#[derive(Clone)]
pub struct RuntimeConfig {
    pub engine: EngineConfig,
    /// Dtype of activations on the wire (f16 halves the bytes).
    pub wire_dtype: DType,
    /// The local GGUF file of a model id, if present.
    pub model_path: ModelLocator,
}

/// What placement needs to know about the GGUF model at `path` (read from its header only).
pub fn model_card(path: &Path, id: &str) -> Result<ModelCard, shoal_model::ModelError> {
    let gguf = shoal_model::gguf::GgufFile::open(path)?;
    let f = shoal_model::Footprint::from_gguf(&gguf)?;
    Ok(ModelCard {
        id: id.to_string(),
        n_layers: f.n_layers,
        layer_bytes: f.layer_bytes,
        embed_bytes: f.embed_bytes,
        head_bytes: f.head_bytes,
        kv_bytes_per_token_per_layer: f.kv_bytes_per_token_per_layer,
        context_length: f.context_length,
        hidden_bytes_per_token: f.hidden_bytes_per_token,
        tied_embeddings: f.tied_embeddings,
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
    serve_stages(cluster.clone(), hosts.clone())?;
    let pool = Arc::new(ThreadPool::new(config.engine.threads.max(1)));
    tokio::spawn(follow_table(cluster, engines, hosts, config, pool));
    Ok(())
}

/// Engines registered by the instances this node drives, by instance id.
type Driven = Arc<std::sync::Mutex<HashMap<String, EngineHandle>>>;

/// What this node runs for one instance.
enum Running {
    /// Stage 0: the engine is registered under this model id.
    Driver {
        model: String,
    },
    Host,
}

/// The instances this node runs, by instance id, with what it runs for each.
type RunningHere = HashMap<String, (InstanceRecord, Running)>;

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
    loop {
        let snap: Arc<Snapshot> = rx.borrow_and_update().clone();
        let mine = instances_using(&snap, &me);
        node.tear_down_stale(&mut running, &mine).await;
        for rec in mine {
            node.start_new(&mut running, rec, &me);
        }
        if rx.changed().await.is_err() {
            return;
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
fn listed(cluster: &ClusterHandle, id: &str) -> bool {
    cluster
        .snapshot()
        .state
        .table()
        .instances
        .iter()
        .any(|i| i.id == id)
}

impl Node {
    /// Tears down what left the table (or changed shape).
    async fn tear_down_stale(&self, running: &mut RunningHere, mine: &[InstanceRecord]) {
        let stale: Vec<String> = running
            .iter()
            .filter(|(id, (rec, _))| !mine.iter().any(|m| m.id == **id && m == rec))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if let Some((rec, what)) = running.remove(&id) {
                tracing::info!(instance = %id, model = %rec.model, "instance removed here");
                match what {
                    Running::Driver { model } => self.retire_driver(running, &id, &model),
                    Running::Host => self.hosts.remove(&id),
                }
                self.cluster.set_status(id, None).await;
            }
        }
    }

    /// Unregisters the engine instance `id` drove for `model`; another instance of the model driven
    /// here serves it again.
    fn retire_driver(&self, running: &RunningHere, id: &str, model: &str) {
        let mut map = self.driven.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(engine) = map.remove(id)
            && self.engines.remove_engine(model, &engine)
        {
            // Another instance of the model driven here serves it again.
            if let Some(other) = running.iter().find_map(|(other, (r, _))| {
                (r.model == model)
                    .then(|| map.get(other).cloned())
                    .flatten()
            }) {
                self.engines.insert(other);
            }
        }
    }

    /// Starts bringing up `rec` (on its own task) if it is new here and one of its stages is on `me`.
    fn start_new(&self, running: &mut RunningHere, rec: InstanceRecord, me: &str) {
        if running.contains_key(&rec.id) {
            return;
        }
        let Some(index) = rec.stages.iter().position(|s| s.node == me) else {
            return;
        };
        let what = if index == 0 {
            Running::Driver {
                model: rec.model.clone(),
            }
        } else {
            Running::Host
        };
        running.insert(rec.id.clone(), (rec.clone(), what));
        tokio::spawn(self.clone().load(rec, index));
    }

    /// Brings up stage `index` of `rec`, publishing `loading`, then `ready` or `failed`.
    async fn load(self, rec: InstanceRecord, index: usize) {
        let id = rec.id.clone();
        self.cluster
            .set_status(id.clone(), Some(InstanceStatus::Loading))
            .await;
        let result = self
            .bring_up(&rec, index)
            .await
            .map(|engine| self.register(&id, engine));
        let status = match result {
            Ok(()) => {
                tracing::info!(instance = %id, model = %rec.model, stage = index, "stage ready");
                InstanceStatus::Ready
            }
            Err(error) => {
                tracing::error!(instance = %id, model = %rec.model, stage = index, kind = error.error_type(), "stage failed: {error}");
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

    /// Registers the engine a driver started for instance `id`, if any and if the instance is still listed.
    fn register(&self, id: &str, engine: Option<EngineHandle>) {
        // Removed while loading: the engine is dropped here and its thread ends.
        if let Some(engine) = engine
            && listed(&self.cluster, id)
        {
            self.driven
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.to_string(), engine.clone());
            self.engines.insert(engine);
        }
    }

    /// Loads this node's part of `rec`; for stage 0 returns the started engine (to register).
    async fn bring_up(
        &self,
        rec: &InstanceRecord,
        index: usize,
    ) -> Result<Option<EngineHandle>, PipelineError> {
        let path =
            (self.config.model_path)(&rec.model).ok_or_else(|| PipelineError::ModelMissing {
                model: rec.model.clone(),
            })?;
        let stage = &rec.stages[index];
        let n_layers = rec.stages.last().map_or(0, |s| s.end);
        let range = LayerRange::new(stage.start, stage.end, n_layers)?;
        if index > 0 {
            self.host_stage(rec, index, path, range).await?;
            return Ok(None);
        }
        self.drive(rec, path, range).await.map(Some)
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
        let local =
            tokio::task::spawn_blocking(move || load_local_stage(&path, range, &pool)).await??;
        let kv = reserve_kv(&self.config, &local)?;
        self.cluster
            .set_kv_capacity(rec.id.clone(), kv.tokens() as u64)
            .await;
        let next = next_node(rec, index)?;
        self.hosts.insert(HostedStage::new(
            rec.id.clone(),
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
    ) -> Result<EngineHandle, PipelineError> {
        let (pool2, model) = (self.pool.clone(), rec.model.clone());
        let mut loaded = tokio::task::spawn_blocking(move || {
            LoadedModel::from_gguf(&path, &model, Some(&[range]), &pool2)
        })
        .await??;
        if rec.stages.len() > 1 {
            let chain = self.connect_chain(rec).await?;
            loaded.stages.push(Box::new(chain));
        }
        Ok(spawn(loaded, self.config.engine.clone())?)
    }

    /// Waits until the other stages of `rec` are ready and connects to them.
    async fn connect_chain(&self, rec: &InstanceRecord) -> Result<RemoteChain, PipelineError> {
        let others: Vec<String> = rec.stages[1..].iter().map(|s| s.node.clone()).collect();
        let snap = self.wait_for_stages(rec, &others).await;
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
        )
        .await
        .map_err(|e| PipelineError::Connect(Box::new(e)))?
        .with_kv_capacity(capacity);
        Ok(chain)
    }

    /// Waits (at most [`STAGES_READY_TIMEOUT`]) until `rec` is gone, all `others` are ready, or one failed.
    async fn wait_for_stages(&self, rec: &InstanceRecord, others: &[String]) -> Arc<Snapshot> {
        let id = rec.id.clone();
        self.cluster
            .wait_for(STAGES_READY_TIMEOUT, |s| {
                let gone = !s.state.table().instances.iter().any(|i| i.id == id);
                let status = |n: &String| s.state.facts_of(n).and_then(|f| f.instances.get(&id));
                gone || others
                    .iter()
                    .all(|n| status(n) == Some(&InstanceStatus::Ready))
                    || others
                        .iter()
                        .any(|n| matches!(status(n), Some(InstanceStatus::Failed { .. })))
            })
            .await
    }
}

/// Sets aside this node's KV share for a hosted stage: the driver cannot draw on this node's pool as
/// its sequences grow (as many tokens as the budget holds for the whole model, or what is left).
fn reserve_kv(config: &RuntimeConfig, local: &LocalStage) -> Result<KvShare, PipelineError> {
    let kv_pool = config
        .engine
        .kv_pool
        .clone()
        .ok_or(PipelineError::NoKvPool)?;
    let m = local.model();
    let model_token_bytes = m
        .config()
        .kv_bytes_per_token(m.config().n_layers, m.kv_value_bytes());
    Ok(KvShare::reserve(
        &kv_pool,
        local.kv_bytes_per_token(),
        model_token_bytes,
    )?)
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

/// A stage that failed to load (no memory, no model file) fails the instance now, not at the timeout.
fn check_stages_loaded(
    snap: &Snapshot,
    rec: &InstanceRecord,
    others: &[String],
) -> Result<(), PipelineError> {
    for n in others {
        if let Some(InstanceStatus::Failed { error }) = snap
            .state
            .facts_of(n)
            .and_then(|f| f.instances.get(&rec.id))
        {
            return Err(PipelineError::StageLoadFailed {
                node: n.clone(),
                error: error.clone(),
            });
        }
    }
    Ok(())
}

/// The least KV capacity `others` published for `rec` (with, before, each stage's `ready`): it bounds
/// the engine's KV; `None` if one has not published it.
fn least_kv_capacity(snap: &Snapshot, rec: &InstanceRecord, others: &[String]) -> Option<usize> {
    others
        .iter()
        .map(|n| {
            snap.state
                .facts_of(n)
                .and_then(|f| f.kv_capacity.get(&rec.id))
                .map(|&t| t as usize)
        })
        .collect::<Option<Vec<_>>>()
        .and_then(|c| c.into_iter().min())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_card_matches_the_gguf() {
        let path = shoal_testkit::fixtures::model_path();
        let card = model_card(&path, "m").unwrap();
        assert_eq!(card.n_layers, 30);
        assert_eq!(card.hidden_bytes_per_token, 2 * 576);
        // 3 KV heads × 64 dims × K and V × f16.
        assert_eq!(card.kv_bytes_per_token_per_layer, 3 * 64 * 2 * 2);
        let total = card.embed_bytes + 30 * card.layer_bytes;
        let file = std::fs::metadata(&path).unwrap().len();
        assert!(total < file && total > file / 2, "{total} vs file {file}");
    }
}
