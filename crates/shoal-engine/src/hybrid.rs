//! One stage's layers in this process, wherever they run: [`HybridStage`] holds the first `k` of
//! them on a GPU (a [`GpuStage`]) and the rest on the CPU (a [`LocalStage`]) — llama.cpp's `-ngl`,
//! per stage — or all of them on one of the two. It is one [`Stage`] behind the seam: a batch runs
//! through the GPU part, its hidden states go on to the CPU part (which holds the head when the stage
//! is the model's last and the GPU does not hold every layer), and every KV operation, rewind and
//! count applies to both parts, which always hold the same sequences at the same lengths. The CPU
//! part's KV is paid from the node's host budget ([`StageInfo::local_kv_layers`]); the GPU part's
//! from its device budget ([`StageInfo::kv_token_capacity`]).

use crate::error::EngineError;
use crate::gpu_stage::GpuStage;
use crate::stage::{ChunkSpec, KvOp, Launched, LocalStage, SampleRef, Stage, StageData, StageInfo};

/// A stage's layers: the first on a GPU, the rest on the CPU (at least one part).
pub struct HybridStage {
    gpu: Option<GpuStage>,
    cpu: Option<LocalStage>,
}

impl From<LocalStage> for HybridStage {
    fn from(cpu: LocalStage) -> Self {
        Self {
            gpu: None,
            cpu: Some(cpu),
        }
    }
}

impl From<GpuStage> for HybridStage {
    fn from(gpu: GpuStage) -> Self {
        Self {
            gpu: Some(gpu),
            cpu: None,
        }
    }
}

impl HybridStage {
    /// The first layers on the GPU (`gpu`), the rest on the CPU (`cpu`): `cpu` must start where
    /// `gpu` ends.
    pub fn split(gpu: GpuStage, cpu: LocalStage) -> Result<Self, EngineError> {
        let (g, c) = (gpu.model().range(), cpu.model().range());
        if g.end != c.start {
            return Err(EngineError::Internal(format!(
                "a split stage's GPU layers {}..{} and CPU layers {}..{} are not contiguous",
                g.start, g.end, c.start, c.end
            )));
        }
        Ok(Self {
            gpu: Some(gpu),
            cpu: Some(cpu),
        })
    }

    /// Layers on the GPU (the stage's first ones).
    pub fn gpu_layers(&self) -> usize {
        self.gpu.as_ref().map_or(0, |g| g.model().range().len())
    }

    /// Layers on the CPU (the stage's last ones).
    pub fn cpu_layers(&self) -> usize {
        self.cpu.as_ref().map_or(0, |c| c.model().range().len())
    }

    /// The stage's layers `(start, end)`, both parts together.
    pub fn layers(&self) -> (usize, usize) {
        let g = self.gpu.as_ref().map(|g| g.model().range());
        let c = self.cpu.as_ref().map(|c| c.model().range());
        match (g, c) {
            (Some(g), Some(c)) => (g.start, c.end),
            (Some(r), None) | (None, Some(r)) => (r.start, r.end),
            (None, None) => (0, 0),
        }
    }

    /// Bytes one token of KV takes in the CPU part's layers (host memory; 0 without a CPU part).
    pub fn host_kv_bytes_per_token(&self) -> usize {
        self.cpu.as_ref().map_or(0, LocalStage::kv_bytes_per_token)
    }

    /// Bytes one token of KV takes in every layer of the model (the unit a node's share is reserved
    /// in).
    pub fn model_kv_bytes_per_token(&self) -> usize {
        match (&self.cpu, &self.gpu) {
            (Some(c), _) => {
                let m = c.model();
                m.config()
                    .kv_bytes_per_token(m.config().n_layers, m.kv_value_bytes())
            }
            (None, Some(g)) => {
                let m = g.model();
                m.config()
                    .kv_bytes_per_token(m.config().n_layers, m.kv_value_bytes())
            }
            (None, None) => 0,
        }
    }

    /// Tokens of KV the GPU part's device budget holds (`None` without a GPU part).
    pub fn device_kv_tokens(&self) -> Option<usize> {
        self.gpu.as_ref().and_then(|g| g.info().kv_token_capacity)
    }

    /// Runs `batch` on both parts now: the GPU's layers, then the CPU's (sampling where the logits
    /// are, as `sampling` asks).
    pub fn forward(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<StageData, EngineError> {
        match (&mut self.gpu, &mut self.cpu) {
            (Some(g), Some(c)) => {
                let hidden = g.forward(batch, input, &[])?;
                c.forward(batch, hidden, sampling)
            }
            (Some(g), None) => g.forward(batch, input, sampling),
            (None, Some(c)) => c.forward(batch, input, sampling),
            (None, None) => Err(EngineError::Internal("a stage without layers".into())),
        }
    }

    /// Applies `op` to both parts' KV.
    pub fn apply(&mut self, op: KvOp) -> Result<(), EngineError> {
        if let Some(g) = &mut self.gpu {
            g.kv(op)?;
        }
        if let Some(c) = &mut self.cpu {
            c.kv(op)?;
        }
        Ok(())
    }

    /// [`LocalStage::rewind`] on both parts.
    pub fn rewind(&mut self, seq_id: u64, len: usize) -> Result<(), EngineError> {
        if let Some(g) = &mut self.gpu {
            g.rewind(seq_id, len)?;
        }
        if let Some(c) = &mut self.cpu {
            c.rewind(seq_id, len)?;
        }
        Ok(())
    }

    /// Frees every sequence and prefix of both parts.
    pub fn clear(&mut self) {
        if let Some(g) = &mut self.gpu {
            g.clear();
        }
        if let Some(c) = &mut self.cpu {
            c.clear();
        }
    }

    /// Tokens of KV held (every sequence's and kept prefix's; both parts hold the same).
    pub fn held_tokens(&self) -> usize {
        self.first(GpuStage::held_tokens, LocalStage::held_tokens)
    }

    /// Tokens held in the KV cache for `seq_id`.
    pub fn cached_len(&self, seq_id: u64) -> usize {
        self.first(|g| g.cached_len(seq_id), |c| c.cached_len(seq_id))
    }

    /// Whether this stage keeps the prefix `prefix_id`.
    pub fn has_prefix(&self, prefix_id: u64) -> bool {
        self.first(|g| g.has_prefix(prefix_id), |c| c.has_prefix(prefix_id))
    }

    /// Whether `seq_id`'s cache is a placeholder (see [`LocalStage::rewind`]).
    pub fn is_placeholder(&self, seq_id: u64) -> bool {
        self.first(|g| g.is_placeholder(seq_id), |c| c.is_placeholder(seq_id))
    }

    /// A figure both parts keep alike, read from the first part.
    fn first<T: Default>(
        &self,
        gpu: impl FnOnce(&GpuStage) -> T,
        cpu: impl FnOnce(&LocalStage) -> T,
    ) -> T {
        match (&self.gpu, &self.cpu) {
            (Some(g), _) => gpu(g),
            (None, Some(c)) => cpu(c),
            (None, None) => T::default(),
        }
    }
}

impl Stage for HybridStage {
    fn info(&self) -> StageInfo {
        let (g, c) = (self.gpu.as_ref(), self.cpu.as_ref());
        StageInfo {
            concurrent_stages: 0,
            kv_value_bytes: c
                .map(|c| c.info().kv_value_bytes)
                .or_else(|| g.map(|g| g.info().kv_value_bytes))
                .unwrap_or(2),
            local_kv_layers: self.cpu_layers(),
            kv_token_capacity: self.device_kv_tokens(),
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
        self.apply(op)
    }

    fn held_sequences(&self) -> usize {
        self.first(Stage::held_sequences, Stage::held_sequences)
    }
}
