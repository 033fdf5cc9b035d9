//! [`Engines`]: every model this node serves, by id — what the API talks to.
//!
//! One [`EngineHandle`] per model instance driven from this node. The cluster adds and removes them as
//! instances are placed and torn down; API handlers only read. Cheap to clone.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::error::EngineError;
use crate::handle::{ChatMessage, EngineHandle, EngineStats, ModelInfo, RequestStream};
use crate::request::GenerateRequest;

/// The engines of this node, by model id.
#[derive(Clone, Default)]
pub struct Engines {
    inner: Arc<RwLock<BTreeMap<String, EngineHandle>>>,
}

impl From<EngineHandle> for Engines {
    fn from(engine: EngineHandle) -> Self {
        let engines = Engines::default();
        engines.insert(engine);
        engines
    }
}

impl Engines {
    /// Adds (or replaces) the engine serving each of `engine`'s models.
    pub fn insert(&self, engine: EngineHandle) {
        if let Ok(mut map) = self.inner.write() {
            for m in engine.models() {
                map.insert(m.id, engine.clone());
            }
        }
    }

    /// Removes the engine serving `model`; its queued and running requests end when the last handle
    /// of that engine is dropped.
    pub fn remove(&self, model: &str) -> Option<EngineHandle> {
        self.inner.write().ok()?.remove(model)
    }

    /// Stops `engine` serving `model` if it is the one serving it (a newer instance of the same model may
    /// have taken over); true when it was.
    pub fn remove_engine(&self, model: &str, engine: &EngineHandle) -> bool {
        let Ok(mut map) = self.inner.write() else {
            return false;
        };
        if map.get(model).is_some_and(|e| e.same_engine(engine)) {
            map.remove(model);
            true
        } else {
            false
        }
    }

    /// The engine serving `model`.
    pub fn get(&self, model: &str) -> Result<EngineHandle, EngineError> {
        self.inner
            .read()
            .ok()
            .and_then(|m| m.get(model).cloned())
            .ok_or_else(|| EngineError::ModelNotFound {
                model: model.to_string(),
            })
    }

    fn all(&self) -> Vec<EngineHandle> {
        self.inner
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every model served, sorted by id.
    pub fn models(&self) -> Vec<ModelInfo> {
        let mut v: Vec<ModelInfo> = self.all().iter().flat_map(|e| e.models()).collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v.dedup_by(|a, b| a.id == b.id);
        v
    }

    pub fn render_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
    ) -> Result<String, EngineError> {
        self.get(model)?.render_chat(model, messages)
    }

    pub fn submit(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        self.get(&request.model)?.submit(request)
    }

    /// Cancels request `id` on whichever engine runs it (ids are unique per process).
    pub fn cancel(&self, id: u64) -> bool {
        self.all().iter().any(|e| e.cancel(id))
    }

    /// Counters summed over all engines.
    pub fn stats(&self) -> EngineStats {
        self.all()
            .iter()
            .map(|e| e.stats())
            .fold(EngineStats::default(), |a, b| EngineStats {
                active_sequences: a.active_sequences + b.active_sequences,
                waiting: a.waiting + b.waiting,
                steps: a.steps + b.steps,
                generated_tokens: a.generated_tokens + b.generated_tokens,
                prefilled_tokens: a.prefilled_tokens + b.prefilled_tokens,
                kv_tokens: a.kv_tokens + b.kv_tokens,
                stage_sequences: a.stage_sequences + b.stage_sequences,
            })
    }
}
