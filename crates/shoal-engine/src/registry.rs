//! [`Engines`]: every model this node serves, by id — what the API talks to.
//!
//! One [`EngineHandle`] per model instance driven from this node. The cluster adds and removes them as
//! instances are placed and torn down; API handlers only read. Cheap to clone. A request's model id is
//! looked up here, once: the handle found serves it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::error::EngineError;
use crate::handle::{ChatMessage, EngineHandle, ModelInfo, RequestStream};
use crate::request::{EmbedRequest, Embeddings, GenerateRequest};
use crate::resume::{Lookup, Resume};
use crate::stats::EngineStats;

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
    /// Adds (or replaces) the engine serving `engine`'s model.
    pub fn insert(&self, engine: EngineHandle) {
        if let Ok(mut map) = self.inner.write() {
            map.insert(engine.info().id.clone(), engine);
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
        // Keyed by model id: sorted, without duplicates.
        self.inner
            .read()
            .map(|m| m.values().map(|e| e.info().clone()).collect())
            .unwrap_or_default()
    }

    /// Renders `messages` with `model`'s chat template ([`EngineHandle::render_chat`]).
    pub fn render_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
    ) -> Result<String, EngineError> {
        self.get(model)?.render_chat(messages)
    }

    /// Renders `messages` and `tools` with `model`'s chat template ([`EngineHandle::render_chat_tools`]).
    pub fn render_chat_tools(
        &self,
        model: &str,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<String, EngineError> {
        self.get(model)?.render_chat_tools(messages, tools)
    }

    /// How many tokens `text` is as a prompt of `model` ([`EngineHandle::count_tokens`]).
    pub fn count_tokens(
        &self,
        model: &str,
        text: &str,
        add_bos: bool,
    ) -> Result<usize, EngineError> {
        Ok(self.get(model)?.count_tokens(text, add_bos))
    }

    /// Queues `request` on the engine serving `request.model` (what [`EngineHandle::submit`] does, without
    /// checking the model id again); its stream continues on the model's next engine when a stage dies, as
    /// [`Engines::submit_n`]'s do.
    pub fn submit(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        self.submit_n(request, 1)?
            .pop()
            .ok_or_else(|| EngineError::Internal("no stream for a request".into()))
    }

    /// `n` choices of `request` on the engine serving `request.model` ([`EngineHandle::submit_n`]).
    pub fn submit_n(
        &self,
        request: GenerateRequest,
        n: usize,
    ) -> Result<Vec<RequestStream>, EngineError> {
        let engine = self.get(&request.model)?;
        let mut request = request;
        engine.give_default_seed(&mut request);
        Resume::pin_seed(&mut request);
        // Each choice's stream continues on the model's next engine when a stage of this one dies, from
        // a copy of the request as it was submitted (its constraint's state at the start).
        let continued = request.clone();
        let (mut streams, prompt) = engine.enqueue_keeping_prompt(request, n)?;
        let engines = self.clone();
        let lookup: Lookup = Arc::new(move |model: &str| engines.get(model).ok());
        // One copy of the request and prompt per choice (`vec!` clones n − 1 times and moves the last).
        let copies = vec![continued; streams.len()]
            .into_iter()
            .zip(vec![prompt; streams.len()]);
        for (i, (stream, (request, prompt))) in streams.iter_mut().zip(copies).enumerate() {
            stream.set_continuation(Resume::of(lookup.clone(), &engine, request, i, prompt));
        }
        Ok(streams)
    }

    /// One L2-normalized vector per input of `request`, from the engine serving `request.model`
    /// ([`EngineHandle::embed`]).
    pub async fn embed(&self, request: EmbedRequest) -> Result<Embeddings, EngineError> {
        self.get(&request.model)?.embed(request).await
    }

    /// Cancels request `id` on whichever engine runs it (ids are unique per process).
    pub fn cancel(&self, id: u64) -> bool {
        crate::handle::cancel_request(id)
    }

    /// Counters summed over all engines.
    pub fn stats(&self) -> EngineStats {
        self.all()
            .iter()
            .map(|e| e.stats())
            .fold(EngineStats::default(), EngineStats::plus)
    }
}
