//! Waiting for the other stages (and group members) of an instance a node drives: until each is ready or
//! one failed, as long as they make progress; and what their published facts say (a failed load, the KV
//! capacity each set aside).

use std::sync::Arc;

use shoal_cluster::facts::InstanceStatus;
use shoal_cluster::{InstanceRecord, Snapshot};
use shoal_ids::NodeId;

use super::{DOWNLOAD_STALL, LOAD_STALL, Node, WAIT_TICK};
use crate::error::PipelineError;

impl Node {
    /// Waits until `rec` is gone, all `others` are ready, or one failed — as long as the others make
    /// progress: a download that stops for [`DOWNLOAD_STALL`] (or a load for [`LOAD_STALL`]) fails.
    pub(super) async fn wait_for_stages(
        &self,
        rec: &InstanceRecord,
        others: &[NodeId],
    ) -> Result<Arc<Snapshot>, PipelineError> {
        let id = rec.id;
        let statuses = |s: &Snapshot| -> Vec<Option<InstanceStatus>> {
            others
                .iter()
                .map(|n| {
                    s.state
                        .facts_of(n)
                        .and_then(|f| f.instances.get(&id))
                        .cloned()
                })
                .collect()
        };
        let settled = |s: &Snapshot| {
            let st = statuses(s);
            !s.state.table().instances.iter().any(|i| i.id == id)
                || st.iter().all(|x| x == &Some(InstanceStatus::Ready))
                || st
                    .iter()
                    .any(|x| matches!(x, Some(InstanceStatus::Failed { .. })))
        };
        let mut seen = statuses(&self.cluster.snapshot());
        let mut since = tokio::time::Instant::now();
        loop {
            let snap = self
                .cluster
                .wait_for(WAIT_TICK, |s| settled(s) || statuses(s) != seen)
                .await;
            if settled(&snap) {
                return Ok(snap);
            }
            let now = statuses(&snap);
            if now != seen {
                seen = now;
                since = tokio::time::Instant::now();
                continue;
            }
            let downloading = seen
                .iter()
                .any(|x| matches!(x, Some(InstanceStatus::Downloading { .. })));
            let limit = if downloading {
                DOWNLOAD_STALL
            } else {
                LOAD_STALL
            };
            if since.elapsed() >= limit {
                let stuck: Vec<&str> = others
                    .iter()
                    .zip(&seen)
                    .filter(|(_, x)| x.as_ref() != Some(&InstanceStatus::Ready))
                    .map(|(n, _)| n.as_str())
                    .collect();
                return Err(PipelineError::StagesStalled {
                    nodes: stuck.join(", "),
                    seconds: limit.as_secs(),
                    state: if downloading {
                        "downloading"
                    } else {
                        "loading"
                    }
                    .into(),
                });
            }
        }
    }
}

/// A stage that failed to load (no memory, no model file) fails the instance now, not at the timeout.
pub(super) fn check_stages_loaded(
    snap: &Snapshot,
    rec: &InstanceRecord,
    others: &[NodeId],
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
pub(super) fn least_kv_capacity(
    snap: &Snapshot,
    rec: &InstanceRecord,
    others: &[NodeId],
) -> Option<usize> {
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
