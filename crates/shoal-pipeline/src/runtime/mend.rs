//! A driver whose pipeline broke while its instance stays in the table is brought up again.
//!
//! A stage's node that dies or goes silent leaves the cluster and the coordinator places the instance
//! again under a new id: this driver's instance leaves the table and the new one is brought up as any
//! other. But a pipeline can also break with every member still there — a stream that could not open
//! on a connection found gone, a stage that answered an error, a path that kept failing — and the
//! driver's chain, once broken, fails every later batch the same way: the instance would stay listed,
//! ready and useless. So when the chain breaks ([`RemoteChain::on_break`](crate::dataplane::RemoteChain::on_break)),
//! this waits a moment for a re-placement and, if the same record still lists this node as its driver
//! with the same engine, retires that engine and loads the stage again (`loading`, then `ready`): a
//! fresh chain and engine, which the streams that broke continue on (`shoal_engine::resume`) and new
//! requests wait for.

use std::time::Duration;

use shoal_cluster::InstanceRecord;
use shoal_engine::EngineHandle;
use shoal_engine::handle::WeakEngine;
use tokio::sync::watch;

use super::Node;

/// How long a broken driver waits for the cluster to place its instance again before it brings the
/// instance's driver up again itself (more than a silent peer takes to be dropped: 1.6 s).
const SETTLE: Duration = Duration::from_secs(2);
/// Attempts at bringing the driver up again, a second apart, before the instance is reported failed.
const TRIES: usize = 5;

impl Node {
    /// Waits for `engine`'s pipeline to break (`broke` turns true), then brings `rec`'s driver up again
    /// if the instance and this engine still stand; see the module doc. The engine is held weakly, so
    /// the wait never keeps a retired engine (its stage, its KV) alive.
    pub(super) async fn mend(
        self,
        rec: InstanceRecord,
        engine: WeakEngine,
        mut broke: watch::Receiver<bool>,
    ) {
        // The chain gone without breaking: the engine was retired.
        if broke.wait_for(|b| *b).await.is_err() {
            return;
        }
        tokio::time::sleep(SETTLE).await;
        // Weakly held until now: an engine retired meanwhile is gone, its memory and KV freed.
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if !self.still_drives(&rec, &engine) {
            return;
        }
        tracing::warn!(instance = %rec.id, model = %rec.model, "the pipeline broke while the instance stays: bringing its driver up again");
        metrics::counter!("shoal_driver_rebuilds_total", "model" => rec.model.to_string())
            .increment(1);
        self.driven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&rec.id);
        self.engines.remove_engine(&rec.model, &engine);
        drop(engine);
        // Publishes `loading`, then `ready` (registering the new engine, watched the same way) or,
        // after TRIES attempts (the other stages may be coming back themselves), `failed`.
        self.load(rec, 0, TRIES).await;
    }

    /// Whether the table still holds `rec` as it was, not draining (an instance on its way out is not
    /// brought back), and this node still drives it with `engine`.
    fn still_drives(&self, rec: &InstanceRecord, engine: &EngineHandle) -> bool {
        let snap = self.cluster.snapshot();
        let table = snap.state.table();
        let same_record =
            table.instances.iter().any(|i| i == rec) && !table.draining.contains(&rec.id);
        let ours = self
            .driven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&rec.id)
            .is_some_and(|e| e.same_engine(engine));
        same_record && ours
    }
}
