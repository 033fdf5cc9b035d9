//! Layers on a GPU behind the same seam as [`crate::stage::LocalStage`]: [`GpuStage`] runs a
//! [`GpuDecoderStage`] with its sequences' KV on the device (the same [`SeqKvs`] bookkeeping
//! over [`GpuKv`]), so the scheduler never cares where a layer runs. Its KV is not paid from the
//! node's host KV budget: [`StageInfo::kv_token_capacity`] is what its device KV budget holds.
//! [`Device`] is the engine config's choice of where local stages run; [`open_gpu`] turns a GPU
//! index into an opened device or a clear [`EngineError::Device`].

use std::sync::Arc;

use shoal_gpu::Gpu;
use shoal_model::ModelError;
use shoal_model::gpu::{GpuDecoderStage, GpuKv};

use crate::error::EngineError;
use crate::seqkv::{SeqKvs, internal};
use crate::stage::{
    ChunkSpec, KvOp, Launched, SampleRef, Stage, StageData, StageInfo, logit_rows, stage_data,
};

/// Where an engine's local stages run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU cores (shoal-kernels).
    #[default]
    Cpu,
    /// The GPU adapter of this index in [`Gpu::discover`]'s list.
    Gpu(usize),
}

/// Opens GPU adapter `index`: no adapter (no GPU, no driver, no Vulkan loader) is an
/// [`EngineError::Device`] naming what was found, never a panic.
pub fn open_gpu(index: usize) -> Result<Arc<Gpu>, EngineError> {
    Gpu::open(index).map(Arc::new).map_err(|e| {
        let found: Vec<String> = Gpu::discover()
            .iter()
            .map(|g| format!("{} ({})", g.name, g.backend))
            .collect();
        EngineError::Device(format!(
            "cannot use GPU {index}: {e}; adapters found: {}",
            if found.is_empty() {
                "none".to_string()
            } else {
                found.join(", ")
            }
        ))
    })
}

/// A model error of a GPU stage: the device's own failures as [`EngineError::Device`].
pub(crate) fn gpu_error(e: ModelError) -> EngineError {
    match e {
        ModelError::Gpu(g) => EngineError::Device(g.to_string()),
        other => internal(other),
    }
}

/// Layers running on a GPU in this process.
pub struct GpuStage {
    model: GpuDecoderStage,
    kvs: SeqKvs<GpuKv>,
    /// Device bytes this stage's KV may take, all sequences and prefixes together.
    kv_budget_bytes: usize,
}

impl GpuStage {
    /// A stage whose KV may take `kv_budget_bytes` of device memory.
    pub fn new(model: GpuDecoderStage, kv_budget_bytes: usize) -> Self {
        Self {
            model,
            kvs: SeqKvs::default(),
            kv_budget_bytes,
        }
    }

    pub fn model(&self) -> &GpuDecoderStage {
        &self.model
    }

    /// Bytes one token of KV takes in this stage's layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        let m = &self.model;
        m.config()
            .kv_bytes_per_token(m.range().len(), m.kv_value_bytes())
    }

    /// Tokens of KV held: every sequence's and every kept prefix's.
    pub fn held_tokens(&self) -> usize {
        self.kvs.held_tokens()
    }

    /// Device bytes of KV allocated across all sequences and kept prefixes.
    pub fn kv_bytes(&self) -> usize {
        self.kvs.kv_bytes()
    }

    /// Frees every sequence and prefix.
    pub fn clear(&mut self) {
        self.kvs.clear();
    }

    /// Runs `batch` on the device now.
    pub fn forward(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<StageData, EngineError> {
        let model = &self.model;
        let rows = logit_rows(batch, sampling);
        let result = self.kvs.run_batch(
            batch,
            input,
            || model.new_kv_cache(),
            |input, chunks| match &rows {
                Some(rows) => model.run_rows(input, chunks, rows),
                None => model.run(input, chunks),
            },
        );
        let out = result.map_err(gpu_error)?;
        stage_data(self.model.is_last(), out, sampling, None)
    }

    /// Tokens held in this stage's KV cache for `seq_id`.
    pub fn cached_len(&self, seq_id: u64) -> usize {
        self.kvs.cached_len(seq_id)
    }

    /// Whether this stage keeps the prefix `prefix_id`.
    pub fn has_prefix(&self, prefix_id: u64) -> bool {
        self.kvs.has_prefix(prefix_id)
    }

    /// Whether `seq_id`'s cache is a placeholder (see [`crate::stage::LocalStage::rewind`]).
    pub fn is_placeholder(&self, seq_id: u64) -> bool {
        self.kvs.is_placeholder(seq_id)
    }

    /// [`crate::stage::LocalStage::rewind`] on the device caches.
    pub fn rewind(&mut self, seq_id: u64, len: usize) -> Result<(), EngineError> {
        let model = &self.model;
        self.kvs.rewind(seq_id, len, || model.new_kv_cache())
    }
}

impl Stage for GpuStage {
    fn info(&self) -> StageInfo {
        StageInfo {
            concurrent_stages: 0,
            kv_value_bytes: self.model.kv_value_bytes(),
            // Device memory: not paid from the node's host KV budget.
            local_kv_layers: 0,
            kv_token_capacity: Some(self.kv_budget_bytes / self.kv_bytes_per_token().max(1)),
        }
    }

    fn launch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, EngineError> {
        self.forward(batch, input, sampling).map(Launched::Ready)
    }

    fn complete(&mut self, ticket: u64) -> Result<StageData, EngineError> {
        crate::stage::never_pending(ticket)
    }

    fn kv(&mut self, op: KvOp) -> Result<(), EngineError> {
        self.kvs.apply(op)
    }

    fn held_sequences(&self) -> usize {
        self.kvs.sequences()
    }
}
