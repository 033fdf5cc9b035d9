//! Loading a model and starting its engine: [`LoadedModel`] (config, tokenizer, template and pipeline
//! stages), [`spawn`] (one engine thread per model instance, see `crate::worker`, and the
//! [`EngineHandle`] that talks to it through a bounded queue) and [`spawn_from_gguf`] for both at once.
//! [`spawn`] binds the model's [`KvSource`] to the node's KV pool (the one the engine's budget is paid
//! from), so its local stages' caches reuse freed KV buffers, and pre-touches the KV a first request
//! uses (`crate::warmup`).

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use shoal_gpu::Gpu;
use shoal_kernels::ThreadPool;
use shoal_model::chat::ChatTemplate;
use shoal_model::gguf::GgufFile;
use shoal_model::gpu::GpuDecoderStage;
use shoal_model::split::Share;
use shoal_model::tokenizer::Tokenizer;
use shoal_model::{DecoderStage, KvSource, LayerRange, ModelConfig, ModelError};

pub use crate::config::{EngineConfig, default_threads};
use crate::error::EngineError;
pub use crate::gpu_stage::Device;
use crate::gpu_stage::{GpuStage, open_gpu};
use crate::handle::{EngineHandle, ModelInfo};
pub use crate::hybrid::HybridStage;
use crate::kvpool::KvPool;
use crate::request::Speculation;
use crate::stage::{LocalStage, Stage};
use crate::stats::Counters;
use crate::worker::Worker;

/// A model loaded and ready to be driven by an engine thread.
pub struct LoadedModel {
    pub id: String,
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub stages: Vec<Box<dyn Stage>>,
    /// Where the local stages' KV caches take their buffers, bound by [`spawn`].
    pub kv_source: KvSource,
    /// The file's token list fingerprint (`GgufFile::token_list_fingerprint`): which draft model
    /// may draft for it ([`EngineConfig::draft_model`]).
    pub token_list: Option<u64>,
}

/// Where a model's local stages run and what they hold: the device, on a GPU the device memory their
/// KV may take, how many of each stage's layers go on it, and whether a whole last stage on the CPU
/// loads the model's multi-token-prediction block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    pub device: Device,
    pub device_kv_budget_bytes: usize,
    /// On [`Device::Gpu`]: the first this many layers of each stage on the GPU, the rest on the CPU
    /// (a [`HybridStage`]); `None`: all of them.
    pub gpu_layers: Option<usize>,
    /// Whether a whole last stage on the CPU loads the file's multi-token-prediction block (for
    /// `Speculation::Mtp`); without it the block's memory is never taken.
    pub nextn: bool,
}

impl Placement {
    /// The placement `config` asks for (every layer on its device; the multi-token-prediction block
    /// when its default speculation drafts with it).
    pub fn of(config: &EngineConfig) -> Self {
        Self {
            device: config.device,
            device_kv_budget_bytes: config.device_kv_budget_bytes,
            gpu_layers: None,
            nextn: matches!(config.speculative, Speculation::Mtp { .. }),
        }
    }

    /// This placement, loading the multi-token-prediction block when `nextn`.
    pub fn with_nextn(self, nextn: bool) -> Self {
        Self { nextn, ..self }
    }

    /// All layers on the CPU.
    pub fn cpu() -> Self {
        Self::default()
    }

    /// The first `layers` layers of each stage on GPU `index` (all of them when the stage has no
    /// more), their KV taking at most `device_kv_budget_bytes` of its memory.
    pub fn gpu(index: usize, layers: usize, device_kv_budget_bytes: usize) -> Self {
        Self {
            device: Device::Gpu(index),
            device_kv_budget_bytes,
            gpu_layers: Some(layers),
            nextn: false,
        }
    }

    /// How `range` splits: the GPU's part (possibly empty) and the CPU's (possibly empty).
    fn split(&self, range: LayerRange) -> (LayerRange, LayerRange) {
        let on_gpu = match (self.device, self.gpu_layers) {
            (Device::Cpu, _) => 0,
            (Device::Gpu(_), None) => range.len(),
            (Device::Gpu(_), Some(k)) => k.min(range.len()),
        };
        let cut = range.start + on_gpu;
        (
            LayerRange {
                start: range.start,
                end: cut,
            },
            LayerRange {
                start: cut,
                end: range.end,
            },
        )
    }
}

impl LoadedModel {
    /// Loads a GGUF model as one local stage per range in `ranges` (all layers when `None`), on
    /// the CPU.
    pub fn from_gguf(
        path: &Path,
        id: &str,
        ranges: Option<&[LayerRange]>,
        pool: &Arc<ThreadPool>,
    ) -> Result<Self, EngineError> {
        Self::from_gguf_on(path, id, ranges, pool, Placement::default())
    }

    /// [`LoadedModel::from_gguf`] with the stages on `placement`'s device (a GPU stage per range
    /// on [`Device::Gpu`]).
    pub fn from_gguf_on(
        path: &Path,
        id: &str,
        ranges: Option<&[LayerRange]>,
        pool: &Arc<ThreadPool>,
        placement: Placement,
    ) -> Result<Self, EngineError> {
        Self::load(path, id, ranges, pool, placement, None)
    }

    /// One member's `share` of layers `range` of a tensor-parallel group, on the CPU: the stage
    /// loads only its slices ([`DecoderStage::load_share`]) and computes once it joins its group
    /// ([`Stage::join_group`]).
    pub fn from_gguf_share(
        path: &Path,
        id: &str,
        range: LayerRange,
        share: &Share,
        pool: &Arc<ThreadPool>,
    ) -> Result<Self, EngineError> {
        Self::load(
            path,
            id,
            Some(&[range]),
            pool,
            Placement::cpu(),
            Some(share),
        )
    }

    fn load(
        path: &Path,
        id: &str,
        ranges: Option<&[LayerRange]>,
        pool: &Arc<ThreadPool>,
        placement: Placement,
        share: Option<&Share>,
    ) -> Result<Self, EngineError> {
        let err = |e: &dyn std::fmt::Display| {
            EngineError::Internal(format!("loading {}: {e}", path.display()))
        };
        let mut gguf = GgufFile::open(path).map_err(|e| err(&e))?;
        let config = ModelConfig::from_gguf(&gguf).map_err(|e| err(&e))?;
        let token_list = gguf.token_list_fingerprint();
        let tokenizer = Tokenizer::from_gguf(gguf.content()).map_err(|e| err(&e))?;
        let template = match ChatTemplate::from_gguf(gguf.content()) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!("{}: no usable chat template: {e}", path.display());
                None
            }
        };
        let full = [LayerRange::full(config.n_layers)];
        let ranges = ranges.unwrap_or(&full);
        let mut stages: Vec<Box<dyn Stage>> = Vec::with_capacity(ranges.len());
        let kv_source = KvSource::default();
        let gpu = match placement.device {
            Device::Cpu => None,
            Device::Gpu(i) => Some(open_gpu(i)?),
        };
        for r in ranges {
            stages.push(match &gpu {
                None => {
                    let mut stage = match share {
                        Some(share) => DecoderStage::load_share(&mut gguf, *r, share, pool),
                        None => DecoderStage::load(&mut gguf, *r, pool),
                    }
                    .map_err(|e| err(&e))?;
                    if placement.nextn {
                        stage.load_nextn(&mut gguf).map_err(|e| err(&e))?;
                    }
                    Box::new(LocalStage::with_kv_source(stage, kv_source.clone()))
                }
                Some(_) if share.is_some() => {
                    return Err(EngineError::Internal(
                        "a tensor-parallel share runs on the CPU only".into(),
                    ));
                }
                Some(gpu) => {
                    let parts = (gpu, pool, &kv_source);
                    Box::new(load_hybrid(&mut gguf, *r, parts, placement, path)?)
                }
            });
        }
        drop(gguf);
        release_freed_heap();
        Ok(Self {
            id: id.to_string(),
            config,
            tokenizer: Arc::new(tokenizer),
            template,
            stages,
            kv_source,
            token_list,
        })
    }
}

/// Hands heap memory freed while loading back to the OS. Reading a GGUF header allocates one small
/// value per vocabulary entry (262k for Gemma 3) and loading stacks some matrices through temporary
/// buffers; glibc keeps such freed chunks in its arena, which measured +50 MB of resident memory after
/// loading Gemma 3 270M (20 % of its file) until trimmed.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only walks glibc's own free lists; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Loads layers `range` of a GGUF model as a stage (what a node hosting one stage of a pipeline runs).
pub fn load_local_stage(
    path: &Path,
    range: LayerRange,
    pool: &Arc<ThreadPool>,
) -> Result<LocalStage, EngineError> {
    let err = |e: &dyn std::fmt::Display| {
        EngineError::Internal(format!("loading {}: {e}", path.display()))
    };
    let mut gguf = GgufFile::open(path).map_err(|e| err(&e))?;
    let stage = DecoderStage::load(&mut gguf, range, pool).map_err(|e| err(&e))?;
    drop(gguf);
    release_freed_heap();
    Ok(LocalStage::new(stage))
}

/// Loads `share` of layers `range` (one member's slices of a tensor-parallel group's layers) as a
/// stage that computes once it joins its group ([`LocalStage::join`]).
pub fn load_local_share(
    path: &Path,
    range: LayerRange,
    share: &Share,
    pool: &Arc<ThreadPool>,
) -> Result<LocalStage, EngineError> {
    let err = |e: &dyn std::fmt::Display| {
        EngineError::Internal(format!("loading {}: {e}", path.display()))
    };
    let mut gguf = GgufFile::open(path).map_err(|e| err(&e))?;
    let stage = DecoderStage::load_share(&mut gguf, range, share, pool).map_err(|e| err(&e))?;
    drop(gguf);
    release_freed_heap();
    Ok(LocalStage::new(stage))
}

/// Loads layers `range` of `gguf` onto `gpu` as a [`GpuStage`].
fn load_gpu_stage(
    gguf: &mut GgufFile,
    range: LayerRange,
    gpu: &Arc<Gpu>,
    placement: Placement,
    path: &Path,
) -> Result<GpuStage, EngineError> {
    let stage = GpuDecoderStage::load(gguf, range, gpu).map_err(|e| match e {
        ModelError::Gpu(g) => EngineError::Device(format!("loading {}: {g}", path.display())),
        other => EngineError::Internal(format!("loading {}: {other}", path.display())),
    })?;
    Ok(GpuStage::new(stage, placement.device_kv_budget_bytes))
}

/// Loads layers `range` of `gguf` as a [`HybridStage`]: the GPU's part on `gpu`, the rest on the
/// CPU (its caches taking buffers from `kv_source`), as `placement` splits it.
fn load_hybrid(
    gguf: &mut GgufFile,
    range: LayerRange,
    (gpu, pool, kv_source): (&Arc<Gpu>, &Arc<ThreadPool>, &KvSource),
    placement: Placement,
    path: &Path,
) -> Result<HybridStage, EngineError> {
    let (on_gpu, on_cpu) = placement.split(range);
    let cpu = |gguf: &mut GgufFile| -> Result<LocalStage, EngineError> {
        let stage = DecoderStage::load(gguf, on_cpu, pool)
            .map_err(|e| EngineError::Internal(format!("loading {}: {e}", path.display())))?;
        Ok(LocalStage::with_kv_source(stage, kv_source.clone()))
    };
    Ok(match (on_gpu.len(), on_cpu.len()) {
        (0, _) => cpu(gguf)?.into(),
        (_, 0) => load_gpu_stage(gguf, on_gpu, gpu, placement, path)?.into(),
        _ => {
            let g = load_gpu_stage(gguf, on_gpu, gpu, placement, path)?;
            HybridStage::split(g, cpu(gguf)?)?
        }
    })
}

/// Loads layers `range` of a GGUF model as one stage where `placement` says: all on the CPU, all
/// on a GPU, or the first layers on a GPU and the rest on the CPU (what a node runs for one stage
/// of a pipeline: its own, or one it hosts for another node's).
pub fn load_hybrid_stage(
    path: &Path,
    range: LayerRange,
    pool: &Arc<ThreadPool>,
    placement: Placement,
) -> Result<HybridStage, EngineError> {
    let Device::Gpu(i) = placement.device else {
        return Ok(load_local_stage(path, range, pool)?.into());
    };
    let gpu = open_gpu(i)?;
    let mut gguf = GgufFile::open(path)
        .map_err(|e| EngineError::Internal(format!("loading {}: {e}", path.display())))?;
    let parts = (&gpu, pool, &KvSource::default());
    let stage = load_hybrid(&mut gguf, range, parts, placement, path)?;
    drop(gguf);
    release_freed_heap();
    Ok(stage)
}

/// [`load_hybrid_stage`] behind the stage seam.
pub fn load_stage_on(
    path: &Path,
    range: LayerRange,
    pool: &Arc<ThreadPool>,
    placement: Placement,
) -> Result<Box<dyn Stage>, EngineError> {
    match placement.device {
        Device::Cpu => Ok(Box::new(load_local_stage(path, range, pool)?)),
        Device::Gpu(_) => Ok(Box::new(load_hybrid_stage(path, range, pool, placement)?)),
    }
}

/// Loads `path` and starts its engine thread.
pub fn spawn_from_gguf(
    path: &Path,
    id: &str,
    config: EngineConfig,
) -> Result<EngineHandle, EngineError> {
    let pool = Arc::new(ThreadPool::new(config.threads.max(1)));
    let placement = Placement::of(&config);
    let model = LoadedModel::from_gguf_on(path, id, config.stages.as_deref(), &pool, placement)?;
    spawn(model, config)
}

/// Starts the engine thread for a loaded model.
pub fn spawn(model: LoadedModel, mut config: EngineConfig) -> Result<EngineHandle, EngineError> {
    if let Some(draft) = &config.draft_model
        && !draft.fits(model.token_list)
    {
        tracing::warn!(
            model = %model.id,
            draft_model = draft.name(),
            "the draft model's token list is not this model's: no draft model for it"
        );
        config.draft_model = None;
    }
    // One pool pays for the engine's KV and keeps its freed buffers.
    let budget = config.kv_budget_bytes;
    let kv_pool = config
        .kv_pool
        .get_or_insert_with(|| Arc::new(KvPool::new(budget)))
        .clone();
    model.kv_source.bind(kv_pool.clone());
    let local_layers = model
        .stages
        .iter()
        .map(|s| s.info().local_kv_layers)
        .sum::<usize>();
    // Bounded: a full queue answers `Overloaded` (see `EngineConfig::queue_depth`).
    let (queue, rx) = std::sync::mpsc::sync_channel(config.queue_depth.max(1));
    let counters = Arc::new(Counters::default());
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let info = ModelInfo {
        id: model.id.clone(),
        context_length: model.config.context_length,
        created,
        owned_by: "shoal".into(),
    };
    let (tokenizer, vocab_size, pooling) = (
        model.tokenizer.clone(),
        model.config.vocab_size,
        model.config.arch.pooling,
    );
    let (drafts, seed) = (config.draft_model.is_some(), config.seed);
    let mut worker = Worker::new(
        model.stages,
        model.tokenizer,
        &model.config,
        config,
        counters.clone(),
        crate::meters::Meters::new(&model.id),
        created,
    );
    crate::warmup::touch_kv(
        &kv_pool,
        &model.config,
        local_layers,
        worker.kv_max_tokens(),
    );
    let handle = EngineHandle::new(
        info,
        tokenizer,
        model.template,
        (vocab_size, worker.kv_max_tokens()),
        (pooling, drafts, worker.has_mtp(), seed),
        queue,
        counters,
    );
    std::thread::Builder::new()
        .name(format!("engine-{}", model.id))
        .spawn(move || worker.run(rx))
        .map_err(|e| EngineError::Internal(format!("cannot start engine thread: {e}")))?;
    Ok(handle)
}
