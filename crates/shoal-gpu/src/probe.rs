//! The GPU compute probe: how fast shoal's own kernels run on one device, measured instead of
//! guessed — the figures shoal-kernels' CPU probe gives, for a GPU ([`probe`]).
//!
//! It times the kernels a [`crate::Commands`] chain of shoal-model's `GpuDecoderStage` runs:
//! - **decode** — for each format of [`GpuProbeConfig::types`] (by default all 13 the GPU reads),
//!   [`crate::Commands::matvec`] ([`GPU_TYPES`]) over a matrix of [`GpuProbeConfig::matrix_bytes`] GGUF bytes
//!   (repacked at upload as a model's are; split by rows above the largest storage binding):
//!   **GGUF weight bytes per second** — the bytes of the file, as the CPU probe and the planner
//!   count them, not the repacked ones;
//! - **prefill** — [`crate::Commands::matmat`] (the tiled product) of
//!   [`GpuProbeConfig::batch_type`] (`Q4_0`, as the CPU probe) times
//!   [`GpuProbeConfig::batch_rows`] (32) activation rows: **flop/s**, `2 · rows · cols · batch`;
//! - **attention** — [`crate::Commands::attention`] (decode attention of one query) over an f16
//!   KV cache of [`GpuProbeConfig::attention_positions`] positions and as many KV heads of
//!   [`GpuProbeConfig::attention_group`] query heads as fill [`GpuProbeConfig::attention_bytes`]:
//!   **flop/s**, `4 · head_dim` per query head and position. The cache is zeros (the kernel's
//!   work does not depend on the values).
//!
//! Timing: each product is recorded `reps` times into **one command buffer**, submitted, and
//! waited for (`device.poll`); the wall time from submission to completion over `reps` is one
//! round. Submission and the wait are inside the time and nothing is subtracted, so on a real
//! GPU, where one dispatch takes tens of microseconds, `reps` is chosen (after an untimed
//! warm-up that compiles the pipeline and touches the buffers, and one timed single dispatch)
//! so that a round lasts about [`GpuProbeConfig::round_time`], up to [`MAX_REPS`]. Each figure
//! is the fastest of [`GpuProbeConfig::rounds`] rounds. Timestamp queries are not used: not
//! every adapter has them, and the round's wall time is what a decode step waits for anyway.
//!
//! Sizes: [`GpuProbeConfig::for_device`] gives a real GPU a 256 MiB decode matrix (beyond the
//! last-level caches of today's GPUs; capped at a quarter of the device's memory where known)
//! and a software driver (`device_type == "cpu"`, Mesa's lavapipe) matrices of a few MiB, so the
//! probe takes ~1–2 s there. Sampling is not measured: it stays on the host. The weights are
//! shoal-kernels' probe bytes ([`shoal_kernels::probe_weights`]: random quants, sane scales).

use std::time::{Duration, Instant};

use shoal_kernels::{QMatrix, QType, TypeRate, probe_weights};

use crate::{Attend, Commands, Gpu, GpuError, GpuInfo, KvShape};

/// The formats shoal's GPU kernels read (every one [`Gpu::upload_matrix`] takes), in ggml type id
/// order: the probe's default [`GpuProbeConfig::types`].
pub const GPU_TYPES: [QType; 23] = [
    QType::F32,
    QType::F16,
    QType::Q4_0,
    QType::Q4_1,
    QType::Q5_0,
    QType::Q5_1,
    QType::Q8_0,
    QType::Q2_K,
    QType::Q3_K,
    QType::Q4_K,
    QType::Q5_K,
    QType::Q6_K,
    QType::IQ2_XXS,
    QType::IQ2_XS,
    QType::IQ3_XXS,
    QType::IQ1_S,
    QType::IQ4_NL,
    QType::IQ3_S,
    QType::IQ2_S,
    QType::IQ4_XS,
    QType::IQ1_M,
    QType::BF16,
    QType::MXFP4,
];

/// The most dispatches one timed command buffer holds.
pub const MAX_REPS: usize = 256;

/// What to measure on a GPU, and at what sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProbeConfig {
    /// Formats whose decode rate is measured.
    pub types: Vec<QType>,
    /// GGUF bytes of the decode matrix (each format gets as many whole rows as fit, 16 at least).
    pub matrix_bytes: usize,
    /// Input features of every matrix (a multiple of 256, so every format takes it).
    pub cols: usize,
    /// Timed rounds per figure; the fastest is kept.
    pub rounds: usize,
    /// How long one timed round should last (sets the dispatches per command buffer).
    pub round_time: Duration,
    /// Format of the batched (prefill) product.
    pub batch_type: QType,
    /// Activation rows of the batched product.
    pub batch_rows: usize,
    /// GGUF bytes of the batched product's matrix.
    pub batch_matrix_bytes: usize,
    /// Query heads sharing one KV head in the attention probe.
    pub attention_group: usize,
    /// Values per head in the attention probe (even, at most 256).
    pub attention_head_dim: usize,
    /// Cached positions the attention reads.
    pub attention_positions: usize,
    /// Bytes of f16 keys and values one attention reads (sets the KV heads).
    pub attention_bytes: usize,
}

impl GpuProbeConfig {
    /// A real GPU's sizes: every format over 256 MiB at 4096 columns, three rounds of ~20 ms,
    /// `Q4_0` × 32 rows on 32 MiB for prefill, attention of 4 query heads of 64 over 1024
    /// positions through 64 MiB of KV.
    pub fn hardware() -> Self {
        Self {
            types: GPU_TYPES.to_vec(),
            matrix_bytes: 256 << 20,
            cols: 4096,
            rounds: 3,
            round_time: Duration::from_millis(20),
            batch_type: QType::Q4_0,
            batch_rows: 32,
            batch_matrix_bytes: 32 << 20,
            attention_group: 4,
            attention_head_dim: 64,
            attention_positions: 1024,
            attention_bytes: 64 << 20,
        }
    }

    /// A software driver's sizes (lavapipe runs the kernels on the CPU): 2 MiB matrices at 1024
    /// columns, rounds of ~15 ms, 1 MiB for prefill, 2 MiB of KV over 512 positions.
    pub fn software() -> Self {
        Self {
            matrix_bytes: 2 << 20,
            cols: 1024,
            round_time: Duration::from_millis(15),
            batch_matrix_bytes: 1 << 20,
            attention_positions: 512,
            attention_bytes: 2 << 20,
            ..Self::hardware()
        }
    }

    /// [`GpuProbeConfig::software`] for a software driver (`device_type` `cpu`), else
    /// [`GpuProbeConfig::hardware`] with its matrices capped at a quarter of the device's memory
    /// where that is known.
    pub fn for_device(info: &GpuInfo) -> Self {
        if info.device_type == "cpu" {
            return Self::software();
        }
        let mut cfg = Self::hardware();
        if let Some(total) = info.memory.total {
            let cap = usize::try_from(total / 4)
                .unwrap_or(usize::MAX)
                .max(1 << 20);
            cfg.matrix_bytes = cfg.matrix_bytes.min(cap);
            cfg.batch_matrix_bytes = cfg.batch_matrix_bytes.min(cap);
            cfg.attention_bytes = cfg.attention_bytes.min(cap);
        }
        cfg
    }
}

/// What [`probe`] measured on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProbe {
    /// Decode rate per format (GGUF weight bytes per second), in [`GpuProbeConfig::types`] order.
    pub rates: Vec<TypeRate>,
    /// The batched product's floating-point operations per second.
    pub flops_per_s: f64,
    /// Decode attention's floating-point operations per second.
    pub attention_flops_per_s: f64,
    /// The GGUF bytes each format's decode matrix held, in [`GpuProbeConfig::types`] order.
    pub matrix_bytes: Vec<usize>,
    /// Wall time of the whole probe, uploads and pipeline compilation included.
    pub elapsed: Duration,
}

impl GpuProbe {
    /// The decode rate of `qtype`, if it was measured.
    pub fn bytes_per_s(&self, qtype: QType) -> Option<f64> {
        self.rates
            .iter()
            .find(|r| r.qtype == qtype)
            .map(|r| r.bytes_per_s)
    }
}

/// Runs the probe on `gpu` (see the module docs). Errors when a size holds fewer than 16 rows of
/// a format, `cols` is not a multiple of a format's block, or the device refuses a buffer or a
/// dispatch.
pub fn probe(gpu: &Gpu, cfg: &GpuProbeConfig) -> Result<GpuProbe, GpuError> {
    let start = Instant::now();
    let x = gpu.upload(&activations(cfg.cols * cfg.batch_rows.max(1)))?;
    let mut rates = Vec::with_capacity(cfg.types.len());
    let mut matrix_bytes = Vec::with_capacity(cfg.types.len());
    for (i, &qtype) in cfg.types.iter().enumerate() {
        let (w, bytes) = upload(gpu, qtype, cfg.matrix_bytes, cfg.cols, i as u64)?;
        let x1 = gpu.upload(&activations(cfg.cols))?;
        let y = gpu.zeros(w.rows())?;
        let secs = fastest(gpu, cfg, |c| c.matvec(&w, &x1, &y))?;
        rates.push(TypeRate {
            qtype,
            bytes_per_s: bytes as f64 / secs,
        });
        matrix_bytes.push(bytes);
    }
    let batch = cfg.batch_rows.max(1);
    let (w, _) = upload(gpu, cfg.batch_type, cfg.batch_matrix_bytes, cfg.cols, 99)?;
    let y = gpu.zeros(w.rows() * batch)?;
    let secs = fastest(gpu, cfg, |c| c.matmat(&w, &x, &y))?;
    let flops_per_s = 2.0 * (w.rows() * w.cols() * batch) as f64 / secs;
    drop((w, y, x));
    let attention_flops_per_s = attention_rate(gpu, cfg)?;
    Ok(GpuProbe {
        rates,
        flops_per_s,
        attention_flops_per_s,
        matrix_bytes,
        elapsed: start.elapsed(),
    })
}

/// `n` activations in [-1, 1), deterministic.
fn activations(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i.wrapping_mul(2_654_435_761) % 2001) as f32 / 1000.0) - 1.0)
        .collect()
}

/// A matrix of `qtype` with as many whole rows of `cols` as `bytes` holds (16 at least),
/// uploaded; with its GGUF bytes.
fn upload(
    gpu: &Gpu,
    qtype: QType,
    bytes: usize,
    cols: usize,
    seed: u64,
) -> Result<(crate::GpuMatrix, usize), GpuError> {
    let row_bytes = qtype.try_row_bytes(cols)?;
    let rows = bytes / row_bytes.max(1);
    if rows < 16 {
        return Err(GpuError::Config(format!(
            "probe matrix of {bytes} bytes holds {rows} rows of {cols} {} values; 16 needed",
            qtype.name()
        )));
    }
    let data = probe_weights(qtype, rows * row_bytes, 0x5EED ^ seed);
    let w = gpu.upload_matrix(&QMatrix::new(qtype, rows, cols, &data)?)?;
    Ok((w, rows * row_bytes))
}

/// Decode attention's flop/s (see the module docs).
fn attention_rate(gpu: &Gpu, cfg: &GpuProbeConfig) -> Result<f64, GpuError> {
    let (group, hd, len) = (
        cfg.attention_group.max(1),
        cfg.attention_head_dim.max(2),
        cfg.attention_positions.max(1),
    );
    let kv_heads = (cfg.attention_bytes / (4 * len * hd)).max(1);
    let n_heads = kv_heads * group;
    let cache = gpu.kv_cache(KvShape {
        layers: 1,
        capacity: len,
        n_heads,
        n_kv_heads: kv_heads,
        head_dim: hd,
        keys_only: false,
    })?;
    let q = gpu.upload(&activations(n_heads * hd))?;
    let out = gpu.zeros(n_heads * hd)?;
    let at = Attend {
        layer: 0,
        pos: len - 1,
        window: 0,
        query_scale: None,
    };
    let secs = fastest(gpu, cfg, |c| c.attention(&cache, &q, 0, at, &out))?;
    Ok(4.0 * (n_heads * hd * len) as f64 / secs)
}

/// Seconds of one `record`ed dispatch: the fastest round over the dispatches of one command
/// buffer (see the module docs).
fn fastest(
    gpu: &Gpu,
    cfg: &GpuProbeConfig,
    record: impl Fn(&mut Commands<'_>) -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    let round = |reps: usize| -> Result<f64, GpuError> {
        let mut c = gpu.commands();
        for _ in 0..reps {
            record(&mut c)?;
        }
        let t = Instant::now();
        c.submit()?;
        gpu.wait()?;
        Ok(t.elapsed().as_secs_f64().max(1e-9))
    };
    round(1)?; // warm-up: the pipeline compiled, the buffers touched
    let one = round(1)?;
    let reps = (cfg.round_time.as_secs_f64() / one)
        .ceil()
        .clamp(1.0, MAX_REPS as f64) as usize;
    let mut best = one;
    for _ in 0..cfg.rounds.max(1) {
        best = best.min(round(reps)? / reps as f64);
    }
    Ok(best)
}

impl Gpu {
    /// Blocks until the work submitted so far has finished.
    pub(crate) fn wait(&self) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| GpuError::Wgpu(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lavapipe() -> Option<Gpu> {
        let skip = std::env::var("SHOAL_GPU_TESTS").is_ok_and(|v| v == "skip");
        match Gpu::open(0) {
            Ok(gpu) => Some(gpu),
            Err(GpuError::NoAdapter { .. }) if skip => None,
            Err(e) => panic!("no usable GPU adapter ({e}); set SHOAL_GPU_TESTS=skip to skip"),
        }
    }

    /// Every format gets a finite positive rate over a matrix of the configured size; the batched
    /// product and attention get flop rates.
    #[test]
    fn every_format_gets_a_rate_at_the_configured_size() {
        let Some(gpu) = lavapipe() else { return };
        let cfg = GpuProbeConfig {
            matrix_bytes: 1 << 20,
            rounds: 2,
            round_time: Duration::from_millis(5),
            ..GpuProbeConfig::software()
        };
        let report = probe(&gpu, &cfg).expect("probe");
        let types: Vec<QType> = report.rates.iter().map(|r| r.qtype).collect();
        assert_eq!(types, GPU_TYPES.to_vec());
        for (r, &bytes) in report.rates.iter().zip(&report.matrix_bytes) {
            assert!(
                r.bytes_per_s.is_finite() && r.bytes_per_s > 1e5,
                "{:?}: {} bytes/s",
                r.qtype,
                r.bytes_per_s
            );
            let row = r.qtype.try_row_bytes(cfg.cols).expect("row");
            // Whole rows, as many as fit: within one row of the configured size.
            assert!(
                bytes <= cfg.matrix_bytes && bytes + row > cfg.matrix_bytes,
                "{:?}: {bytes} bytes",
                r.qtype
            );
        }
        assert_eq!(
            report.bytes_per_s(QType::Q4_K),
            Some(report.rates[9].bytes_per_s)
        );
        for flops in [report.flops_per_s, report.attention_flops_per_s] {
            assert!(flops.is_finite() && flops > 1e6, "{flops}");
        }
        eprintln!("lavapipe probe: {report:?}");
    }

    #[test]
    fn a_matrix_of_fewer_than_16_rows_is_refused() {
        let Some(gpu) = lavapipe() else { return };
        let cfg = GpuProbeConfig {
            types: vec![QType::F32],
            matrix_bytes: 15 * 4 * 1024,
            ..GpuProbeConfig::software()
        };
        let err = probe(&gpu, &cfg).expect_err("too small");
        assert!(
            matches!(err, GpuError::Config(ref m) if m.contains("15 rows")),
            "{err}"
        );
    }

    #[test]
    fn a_software_driver_gets_small_sizes_and_a_gpu_is_capped_by_its_memory() {
        let Some(gpu) = lavapipe() else { return };
        let mut info = gpu.info().clone();
        info.device_type = "cpu";
        assert_eq!(
            GpuProbeConfig::for_device(&info),
            GpuProbeConfig::software()
        );
        info.device_type = "discrete";
        info.memory.total = None;
        assert_eq!(
            GpuProbeConfig::for_device(&info),
            GpuProbeConfig::hardware()
        );
        info.memory.total = Some(256 << 20);
        let cfg = GpuProbeConfig::for_device(&info);
        assert_eq!(
            (cfg.matrix_bytes, cfg.batch_matrix_bytes),
            (64 << 20, 32 << 20)
        );
    }
}
