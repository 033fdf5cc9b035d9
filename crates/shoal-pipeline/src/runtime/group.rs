//! Tensor-parallel stages in the runtime (issue 31, decision 024): a stage whose record names a group
//! ([`shoal_placement::TensorGroup`]) is loaded as one share per member, cut the same way on every
//! member from the model file and the record's weights ([`share_of`]). A member of rank ≥ 1 loads its
//! share, sets its KV aside (published as the stage's capacity), waits in
//! [`Members`](crate::dataplane::Members) and reports ready; rank 0 — the stage's own node, which
//! receives the stage's input — waits for every member to be ready, opens the group's lanes
//! ([`connect_group`]) and joins its share to them. A member that fails or leaves takes the stage with
//! it: its node leaving the cluster has the instance placed again, like any stage's.

use std::path::Path;

use libp2p::PeerId;
use shoal_cluster::InstanceRecord;
use shoal_engine::engine::load_local_share;
use shoal_engine::kvpool::KvShare;
use shoal_engine::stage::{LocalStage, Stage};
use shoal_ids::NodeId;
use shoal_model::LayerRange;
use shoal_model::gguf::GgufFile;
use shoal_model::split::{Share, shares};

use super::{Node, RuntimeConfig, check_stages_loaded, least_kv_capacity};
use crate::dataplane::connect_group;
use crate::error::PipelineError;

/// `rank`'s share of stage `index` of `rec` (`None` when the stage is no group): the cut
/// [`shares`] makes of the stage's layers for the record's weights — the same on every member —
/// with the whole model's config it was cut from.
pub(super) fn share_of(
    path: &Path,
    rec: &InstanceRecord,
    index: usize,
    range: LayerRange,
    rank: usize,
) -> Result<Option<(Share, shoal_model::ModelConfig)>, PipelineError> {
    let Some(group) = &rec.stages[index].group else {
        return Ok(None);
    };
    let weights: Vec<f64> = group.weights.iter().map(|&w| f64::from(w)).collect();
    if weights.len() != group.members.len() + 1 {
        return Err(PipelineError::Group {
            why: format!(
                "{} weights for {} members",
                weights.len(),
                group.members.len() + 1
            ),
        });
    }
    let mut gguf = GgufFile::open(path)?;
    let cfg = shoal_model::ModelConfig::from_gguf(&gguf)?;
    let mut all = shares(&mut gguf, &cfg, range, &weights)?;
    if rank >= all.len() {
        return Err(PipelineError::Group {
            why: format!("rank {rank} of {} members", all.len()),
        });
    }
    Ok(Some((all.swap_remove(rank), cfg)))
}

/// The most members (up to the planner's [`shoal_placement::MAX_GROUP`]) the layers of `gguf` split
/// over evenly (what the model card offers the planner; 1: none — a refused split logs why).
pub(super) fn max_group(gguf: &mut GgufFile) -> usize {
    let Ok(cfg) = shoal_model::ModelConfig::from_gguf(gguf) else {
        return 1;
    };
    let range = LayerRange::full(cfg.n_layers);
    let mut most = 1;
    for n in 2..=shoal_placement::MAX_GROUP {
        match shares(gguf, &cfg, range, &vec![1.0; n]) {
            Ok(_) => most = n,
            Err(e) => {
                tracing::debug!(model = %cfg.architecture, "no tensor-parallel split over {n}: {e}");
                break;
            }
        }
    }
    most
}

/// Every node of stage `index` of `rec` by rank, as peer ids.
fn peers_of(rec: &InstanceRecord, index: usize) -> Result<Vec<PeerId>, PipelineError> {
    rec.stages[index]
        .nodes()
        .map(|n| {
            n.parse().map_err(|source| PipelineError::BadNodeId {
                node: n.clone(),
                source,
            })
        })
        .collect()
}

/// Where this node computes in `rec`: the stage's index and this node's rank in it (0: the stage's
/// own node).
pub(super) fn place_of(rec: &InstanceRecord, me: &str) -> Option<(usize, usize)> {
    rec.stages
        .iter()
        .enumerate()
        .find_map(|(i, s)| s.nodes().position(|n| n == me).map(|r| (i, r)))
}

impl Node {
    /// Loads rank `rank` (≥ 1) of the group computing stage `index` of `rec`, sets its KV aside
    /// (published as its capacity) and hosts it until rank 0 forms the group.
    pub(super) async fn host_member(
        &self,
        rec: &InstanceRecord,
        (index, rank): (usize, usize),
        path: std::path::PathBuf,
        range: LayerRange,
    ) -> Result<(), PipelineError> {
        let (share, whole) =
            share_of(&path, rec, index, range, rank)?.ok_or(PipelineError::Group {
                why: "this node is no member of the stage's group".into(),
            })?;
        let pool = self.pool.clone();
        let local =
            tokio::task::spawn_blocking(move || load_local_share(&path, range, &share, &pool))
                .await??;
        let (kv, tokens) = reserve_share_kv(&self.config, &local, &whole)?;
        self.cluster.set_kv_capacity(rec.id, tokens as u64).await;
        let peers = peers_of(rec, index)?;
        self.hosts
            .members
            .insert(&rec.id, index, rank, peers, local, kv);
        Ok(())
    }

    /// Rank 0 of the group computing stage `index` of `rec`: waits until every other member is
    /// ready, opens the group's lanes and joins `stage` (its share) to them. Returns the least KV
    /// (tokens) the other members set aside: the stage holds no more.
    pub(super) async fn form_group(
        &self,
        rec: &InstanceRecord,
        index: usize,
        stage: &mut dyn Stage,
        dim: usize,
    ) -> Result<Option<usize>, PipelineError> {
        let peers = peers_of(rec, index)?;
        let others: Vec<NodeId> = rec.stages[index].nodes().skip(1).cloned().collect();
        let snap = self.wait_for_stages(rec, &others).await?;
        if !snap.state.table().instances.iter().any(|i| i.id == rec.id) {
            return Err(PipelineError::RemovedWhileLoading);
        }
        check_stages_loaded(&snap, rec, &others)?;
        if self.config.lanes.is_none() {
            return Err(PipelineError::Group {
                why: "a tensor-parallel group needs lanes (this node serves with --no-lanes)"
                    .into(),
            });
        }
        let capacity = least_kv_capacity(&snap, rec, &others);
        let link = connect_group(&self.cluster, &rec.id, index, &peers, dim, capacity)
            .await
            .map_err(|e| PipelineError::Connect(Box::new(e)))?;
        stage.join_group(Box::new(link))?;
        Ok(capacity)
    }
}

/// Sets aside this node's KV for a member's share (its heads' KV of its layers) — as many tokens as
/// the budget holds of the whole model (`whole`'s config) — and says how many tokens it holds. A member
/// without heads keeps no KV: nothing is set aside, and it bounds nothing.
fn reserve_share_kv(
    config: &RuntimeConfig,
    local: &LocalStage,
    whole: &shoal_model::ModelConfig,
) -> Result<(Option<KvShare>, usize), PipelineError> {
    let kv_pool = config
        .engine
        .kv_pool
        .clone()
        .ok_or(PipelineError::NoKvPool)?;
    let model_bytes = whole.kv_bytes_per_token(whole.n_layers, local.model().kv_value_bytes());
    if local.kv_bytes_per_token() == 0 {
        return Ok((None, kv_pool.budget() / model_bytes.max(1)));
    }
    let share = KvShare::reserve(&kv_pool, local.kv_bytes_per_token(), model_bytes)?;
    let tokens = share.tokens();
    Ok((Some(share), tokens))
}
