//! The compute probe: how fast this machine's kernels run, measured instead of guessed.
//!
//! [`probe`] times, on the caller's pool and backend, the two shapes a model's time goes into:
//! - **decode** — for each weight format of [`ProbeConfig::types`], one activation row times a
//!   matrix of [`ProbeConfig::matrix_bytes`] (64 MiB by default: larger than the last-level cache of
//!   the CPUs shoal runs on, so the weights stream from memory as a model's layers do), in the layout
//!   [`PackedMatrix`] gives that format on this backend: **weight bytes streamed per second**
//!   ([`TypeRate`]);
//! - **prefill** — [`ProbeConfig::batch_type`] times [`ProbeConfig::batch_rows`] activation rows
//!   (the engine multiplies prompt chunks that way): **floating-point operations per second**,
//!   counting `2 · rows · cols · batch` per product.
//! - **attention** — one decode token's attention ([`crate::attn::attend_f16`], as the engine runs
//!   it) of [`ProbeConfig::attention_group`] query heads of [`ProbeConfig::attention_head_dim`] over
//!   [`ProbeConfig::attention_positions`] cached f16 positions, for KV heads filling
//!   [`ProbeConfig::attention_bytes`] (more than the caches hold: a layer's KV comes from memory after
//!   the weights streamed through), split over the pool: **floating-point operations per second**,
//!   counting `4 · head_dim` per query head and position (the `q·k` product and the weighted value).
//! - **sampling** — the passes the sampler makes over a row of [`ProbeConfig::vocab`] logits for a
//!   greedy pick (its log-normalizer's max, exponentials and f64 sum, then the arg-max), on one
//!   thread as the engine samples one row: **entries per second**.
//!
//! Each figure is the fastest of up to [`ProbeConfig::rounds`] timed rounds (another process on a
//! shared machine only ever slows a round down, so the fastest is the machine's capability; the
//! median swung 2× between runs on a busy 2-core VM), after one untimed
//! warm-up round before the first (threads woken, pages touched; a matrix far larger than the caches
//! has nothing else to warm). The probe keeps to [`ProbeConfig::budget`]: every product gets a
//! share of it, and once its share is spent it stops at the rounds it has (one at least), so a slow
//! or busy machine measures less often rather than for longer. The weights are random bytes (a 1 MiB
//! random block repeated) made valid for their format (finite, normal f16 scales; plain values of
//! magnitude in [0.5, 1)): the kernels' speed depends on the bytes they read, not on the values. One
//! buffer is filled once and reinterpreted per format. The activations are quantized once per
//! product, outside the timed part (a decode step quantizes one row per input, negligible next to
//! streaming the matrix).
//!
//! Nothing is cached or published here: `shoal serve` keeps a [`ProbeReport`] per binary, CPU and
//! thread count and publishes it in its node facts, where the cluster turns it into the planner's
//! per-model speeds.

use std::time::{Duration, Instant};

use crate::acts::Activations;
use crate::backend::Backend;
use crate::error::KernelError;
use crate::format::{Layout, QType};
use crate::matmul::{QMatrix, matmul_quantized_with};
use crate::packed::{PackedMatrix, layout_for};
use crate::pool::Parallel;
use crate::rng::SplitMix64;

/// What to measure and how long.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// Formats whose decode rate is measured.
    pub types: Vec<QType>,
    /// Bytes of the decode matrix (each format gets as many whole rows as fit).
    pub matrix_bytes: usize,
    /// Input features of every matrix (a multiple of 256, so every format takes it).
    pub cols: usize,
    /// Timed rounds per figure at most; the fastest is kept.
    pub rounds: usize,
    /// Time the whole probe should take at most (give or take one round per product).
    pub budget: Duration,
    /// Format of the batched (prefill) product.
    pub batch_type: QType,
    /// Activation rows of the batched product.
    pub batch_rows: usize,
    /// Bytes of the batched product's matrix (its speed is compute-bound: it may sit in cache).
    pub batch_matrix_bytes: usize,
    /// Query heads sharing one KV head in the attention probe.
    pub attention_group: usize,
    /// Values per head in the attention probe.
    pub attention_head_dim: usize,
    /// Cached positions each attention of the probe reads.
    pub attention_positions: usize,
    /// Bytes of f16 keys and values the attention probe reads per round (one KV head per
    /// `attention_positions · attention_head_dim · 4` bytes).
    pub attention_bytes: usize,
    /// Entries of the logit row the sampling probe passes over.
    pub vocab: usize,
}

impl Default for ProbeConfig {
    /// Every format ([`QType::ALL`], then [`QType::IQ`]), a 64 MiB decode matrix, three rounds, `Q4_0` × 32 rows on 2 MiB for prefill,
    /// attention of 4 query heads of 64 over 1024 positions through 32 MiB of KV, sampling over
    /// 128 Ki logits, 1.5 s.
    fn default() -> Self {
        Self {
            types: QType::ALL.into_iter().chain(QType::IQ).collect(),
            matrix_bytes: 64 << 20,
            cols: 4096,
            rounds: 3,
            budget: Duration::from_millis(1500),
            batch_type: QType::Q4_0,
            batch_rows: 32,
            batch_matrix_bytes: 2 << 20,
            attention_group: 4,
            attention_head_dim: 64,
            attention_positions: 1024,
            attention_bytes: 32 << 20,
            vocab: 128 << 10,
        }
    }
}

/// Decode rate of one weight format.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TypeRate {
    pub qtype: QType,
    /// Weight bytes one matrix × vector product streams per second (fastest round).
    pub bytes_per_s: f64,
}

/// What [`probe`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeReport {
    /// The backend the kernels ran on.
    pub backend: Backend,
    /// Threads of the pool it ran on.
    pub threads: usize,
    /// Decode rate per format, in [`ProbeConfig::types`] order.
    pub rates: Vec<TypeRate>,
    /// Batched rate: floating-point operations per second of the prefill-shaped product.
    pub flops_per_s: f64,
    /// Decode attention: floating-point operations per second (`4 · head_dim` per query head and
    /// cached position).
    pub attention_flops_per_s: f64,
    /// Sampling: logit entries per second of the sampler's passes over a row.
    pub sample_entries_per_s: f64,
    /// Wall time of the whole probe, buffer filling included.
    pub elapsed: Duration,
}

impl ProbeReport {
    /// The decode rate of `qtype`, if it was measured.
    pub fn bytes_per_s(&self, qtype: QType) -> Option<f64> {
        self.rates
            .iter()
            .find(|r| r.qtype == qtype)
            .map(|r| r.bytes_per_s)
    }
}

/// Runs the probe on `pool` with the detected backend (see the module docs).
///
/// Errors when `cols` is not a multiple of a format's block size, or a matrix size holds fewer
/// than 16 rows of a format.
pub fn probe<P: Parallel + ?Sized>(
    pool: &P,
    cfg: &ProbeConfig,
) -> Result<ProbeReport, KernelError> {
    let start = Instant::now();
    let backend = Backend::detect();
    let mut rng = SplitMix64::new(0x5EED_C0DE);
    let mut buf = random_bytes(&mut rng, cfg.matrix_bytes.max(cfg.batch_matrix_bytes));
    let batch = cfg.batch_rows.max(1);
    let x: Vec<f32> = (0..cfg.cols * batch)
        .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
        .collect();
    // Product i (the batched one, attention, then sampling last) may run rounds until `share(i)`
    // after the start.
    let products = cfg.types.len() + 3;
    let share = |i: usize| start + cfg.budget.mul_f64((i + 1) as f64 / products as f64);
    let rounds = |i: usize| Rounds {
        max: cfg.rounds.max(1),
        until: share(i),
        warm_up: i == 0,
    };
    let mut rates = Vec::with_capacity(cfg.types.len());
    for (i, &qtype) in cfg.types.iter().enumerate() {
        let t = Product::new(qtype, cfg.matrix_bytes, cfg.cols, 1)?;
        let secs = t.fastest_secs(backend, &mut buf, &x[..cfg.cols], rounds(i), pool)?;
        rates.push(TypeRate {
            qtype,
            bytes_per_s: t.weight_bytes() as f64 / secs,
        });
    }
    let t = Product::new(cfg.batch_type, cfg.batch_matrix_bytes, cfg.cols, batch)?;
    let warm = Rounds {
        warm_up: cfg.types.is_empty(),
        ..rounds(products - 3)
    };
    let secs = t.fastest_secs(backend, &mut buf, &x, warm, pool)?;
    let flops = 2.0 * t.rows as f64 * t.cols as f64 * batch as f64;
    drop(buf);
    let attention_flops_per_s = attention_rate(cfg, &mut rng, rounds(products - 2), pool)?;
    let sample_entries_per_s = sample_rate(cfg.vocab, &mut rng, rounds(products - 1))?;
    Ok(ProbeReport {
        backend,
        threads: pool.n_threads().max(1),
        rates,
        flops_per_s: flops / secs,
        attention_flops_per_s,
        sample_entries_per_s,
        elapsed: start.elapsed(),
    })
}

/// Floating-point operations per second of decode attention (see the module docs): every KV head of
/// the buffer attended once per round, the heads split over the pool's threads.
fn attention_rate<P: Parallel + ?Sized>(
    cfg: &ProbeConfig,
    rng: &mut SplitMix64,
    rounds: Rounds,
    pool: &P,
) -> Result<f64, KernelError> {
    let (group, hd, len) = (
        cfg.attention_group.max(1),
        cfg.attention_head_dim.max(1),
        cfg.attention_positions.max(1),
    );
    let per_head = len * hd; // f16 values of the keys (and as many of the values)
    let heads = (cfg.attention_bytes / (4 * per_head)).max(1);
    let kv: Vec<half::f16> = (0..2 * heads * per_head)
        .map(|_| half::f16::from_f64(rng.next_f64() * 2.0 - 1.0))
        .collect();
    let mut q: Vec<f32> = (0..group * hd)
        .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
        .collect();
    crate::math::round_to_f16(&mut q);
    let scale = 1.0 / (hd as f32).sqrt();
    let n = pool.n_threads().max(1);
    let outs: Vec<std::sync::Mutex<(Vec<f32>, Vec<f32>)>> = (0..n)
        .map(|_| std::sync::Mutex::new((Vec::new(), vec![0f32; group * hd])))
        .collect();
    let run = || {
        pool.run_parts(&|t, parts| {
            let Some(Ok(mut slot)) = outs.get(t).map(|m| m.lock()) else {
                return;
            };
            let (scratch, out) = &mut *slot;
            for h in (t..heads).step_by(parts.max(1)) {
                let keys = &kv[2 * h * per_head..(2 * h + 1) * per_head];
                let values = &kv[(2 * h + 1) * per_head..(2 * h + 2) * per_head];
                crate::attn::attend_f16(&q, group, keys, values, hd, scale, scratch, out);
            }
        });
        Ok(())
    };
    let secs = rounds.time(run)?.into_iter().fold(f64::INFINITY, f64::min);
    let flops = 4.0 * (heads * group * hd * len) as f64;
    Ok(flops / secs)
}

/// Logit entries per second of a greedy pick's passes over a row of `vocab` (see the module docs).
fn sample_rate(vocab: usize, rng: &mut SplitMix64, rounds: Rounds) -> Result<f64, KernelError> {
    let row: Vec<f32> = (0..vocab.max(1))
        .map(|_| (rng.next_f64() * 20.0 - 10.0) as f32)
        .collect();
    // Repeated so that one timed call lasts long enough to time (a pass takes ~0.1 ms).
    const PASSES: usize = 8;
    let mut picked = 0usize;
    let secs = rounds
        .time(|| {
            for _ in 0..PASSES {
                picked = picked.wrapping_add(greedy_pass(&row));
            }
            Ok(())
        })?
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    std::hint::black_box(picked);
    Ok((PASSES * row.len()) as f64 / secs)
}

/// The sampler's work for a greedy pick: the row's log-normalizer and the index of its largest entry.
fn greedy_pass(row: &[f32]) -> usize {
    std::hint::black_box(crate::math::log_normalizer(row));
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &l) in row.iter().enumerate() {
        if l > best.1 {
            best = (i, l);
        }
    }
    best.0
}

/// `len` bytes of valid weights of `qtype` (random quants, sane scales: see the module docs), as
/// this probe streams them; shoal-gpu's probe times its kernels on the same bytes. Whole blocks
/// (rows) of `qtype` are made valid; a tail shorter than a block is left random.
pub fn probe_weights(qtype: QType, len: usize, seed: u64) -> Vec<u8> {
    let mut buf = random_bytes(&mut SplitMix64::new(seed), len);
    make_valid(qtype, &mut buf);
    buf
}

/// `len` random bytes: a 1 MiB random block, repeated (the kernels do not care, and copying is far
/// faster than drawing).
fn random_bytes(rng: &mut SplitMix64, len: usize) -> Vec<u8> {
    let block: Vec<u8> = (0..(1 << 20) / 8)
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect();
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let n = block.len().min(len - buf.len());
        buf.extend_from_slice(&block[..n]);
    }
    buf
}

/// How long to time one product: at most `max` rounds, more than one only until `until`, after an
/// untimed warm-up round when `warm_up`.
#[derive(Debug, Clone, Copy)]
struct Rounds {
    max: usize,
    until: Instant,
    warm_up: bool,
}

/// One timed product: a `rows × cols` matrix of `qtype` times `m` activation rows.
struct Product {
    qtype: QType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    m: usize,
}

impl Product {
    /// As many whole rows as `bytes` holds (at least 16).
    fn new(qtype: QType, bytes: usize, cols: usize, m: usize) -> Result<Self, KernelError> {
        let row_bytes = qtype.try_row_bytes(cols)?;
        let rows = bytes / row_bytes.max(1);
        if rows < 16 || cols == 0 {
            return Err(KernelError::BadSliceLength {
                what: "probe matrix (bytes)",
                expected: 16 * row_bytes.max(1),
                actual: bytes,
            });
        }
        Ok(Self {
            qtype,
            rows,
            cols,
            row_bytes,
            m,
        })
    }

    fn weight_bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// Makes the first [`Product::weight_bytes`] of `buf` valid weights, then times the product as
    /// `rounds` says, returning the fastest round in seconds.
    fn fastest_secs<P: Parallel + ?Sized>(
        &self,
        backend: Backend,
        buf: &mut [u8],
        x: &[f32],
        rounds: Rounds,
        pool: &P,
    ) -> Result<f64, KernelError> {
        let data = &mut buf[..self.weight_bytes()];
        make_valid(self.qtype, data);
        let w = QMatrix::new(self.qtype, self.rows, self.cols, data)?;
        let mut acts = Activations::default();
        acts.quantize_into_par(self.qtype.act_type(), x, self.m, self.cols, pool)?;
        let mut out = vec![0f32; self.m * self.rows];
        // The layout the engine's matrices of this format get (repacked rows cost one copy here).
        let packed = match layout_for(self.qtype, self.cols, backend.usable()) {
            Layout::Rows16 => Some(PackedMatrix::with_backend(&w, backend)?),
            Layout::Rows => None,
        };
        let run = || match &packed {
            Some(p) => p.matmul_quantized(&acts, &mut out, pool),
            None => matmul_quantized_with(backend, &w, &acts, &mut out, pool),
        };
        let secs = rounds.time(run)?;
        Ok(secs.into_iter().fold(f64::INFINITY, f64::min))
    }
}

impl Rounds {
    /// Seconds of each timed call of `run` (one at least), after the warm-up call if any.
    fn time(
        &self,
        mut run: impl FnMut() -> Result<(), KernelError>,
    ) -> Result<Vec<f64>, KernelError> {
        if self.warm_up {
            run()?;
        }
        let mut secs = Vec::with_capacity(self.max);
        while secs.is_empty() || (secs.len() < self.max && Instant::now() < self.until) {
            let t = Instant::now();
            run()?;
            secs.push(t.elapsed().as_secs_f64().max(1e-9));
        }
        Ok(secs)
    }
}

/// Rewrites random bytes into valid weights of `qtype`: plain values get an exponent for a
/// magnitude in [0.5, 1) (keeping the random sign and mantissa), block formats get a normal f16
/// scale (and minimum) in every block; quant bits stay random (every pattern is valid).
fn make_valid(qtype: QType, data: &mut [u8]) {
    match qtype {
        // Plain values, two or four per little-endian u64 (rows are whole u64s: cols % 256 == 0).
        QType::F32 => set_bits(data, 0x807F_FFFF_807F_FFFF, 0x3F00_0000_3F00_0000),
        QType::F16 => set_bits(data, 0x83FF_83FF_83FF_83FF, 0x3800_3800_3800_3800),
        QType::BF16 => set_bits(data, 0x807F_807F_807F_807F, 0x3F00_3F00_3F00_3F00),
        // An E8M0 exponent byte: scale 2^-1.
        QType::MXFP4 => data
            .chunks_exact_mut(qtype.type_size())
            .for_each(|b| b[0] = 127),
        // The f16 `d` spread over the top nibbles of the four scale words at 48.
        QType::IQ1_M => {
            let d = half::f16::from_f32(0.01).to_bits();
            for b in data.chunks_exact_mut(qtype.type_size()) {
                for i in 0..4 {
                    let w = u16::from_le_bytes([b[48 + 2 * i], b[49 + 2 * i]]) & 0x0FFF;
                    let w = w | (((d >> (4 * i)) & 0xF) << 12);
                    b[48 + 2 * i..50 + 2 * i].copy_from_slice(&w.to_le_bytes());
                }
            }
        }
        _ => {
            let (d_at, m_at) = scale_offsets(qtype);
            let d = half::f16::from_f32(0.01).to_le_bytes();
            let m = half::f16::from_f32(-0.02).to_le_bytes();
            for b in data.chunks_exact_mut(qtype.type_size()) {
                b[d_at..d_at + 2].copy_from_slice(&d);
                if let Some(at) = m_at {
                    b[at..at + 2].copy_from_slice(&m);
                }
            }
        }
    }
}

/// `v = (v & keep) | set` for every little-endian u64 of `data`.
fn set_bits(data: &mut [u8], keep: u64, set: u64) {
    for c in data.chunks_exact_mut(8) {
        let v = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        c.copy_from_slice(&((v & keep) | set).to_le_bytes());
    }
}

/// Byte offsets in a block of its f16 scale `d` and, where the format has one, its second f16
/// (`m` or `dmin`); see `format` for the layouts.
fn scale_offsets(qtype: QType) -> (usize, Option<usize>) {
    match qtype {
        QType::Q4_1 | QType::Q5_1 | QType::Q4_K | QType::Q5_K => (0, Some(2)),
        QType::Q2_K => (80, Some(82)),
        QType::Q3_K => (108, None),
        QType::Q6_K => (208, None),
        // Q4_0, Q5_0, Q8_0, the IQ formats (and the plain formats, MXFP4 and IQ1_M, never asked:
        // handled by `make_valid`).
        _ => (0, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::ThreadPool;

    fn small() -> ProbeConfig {
        ProbeConfig {
            matrix_bytes: 1 << 20,
            cols: 1024,
            rounds: 2,
            budget: Duration::from_secs(5),
            batch_rows: 8,
            batch_matrix_bytes: 256 << 10,
            attention_bytes: 2 << 20,
            vocab: 4096,
            ..ProbeConfig::default()
        }
    }

    #[test]
    fn every_format_gets_a_rate_and_the_batch_a_flop_rate() {
        let pool = ThreadPool::new(2);
        let report = probe(&pool, &small()).expect("probe");
        assert_eq!(report.threads, 2);
        assert_eq!(report.backend, Backend::detect());
        let types: Vec<QType> = report.rates.iter().map(|r| r.qtype).collect();
        assert_eq!(
            types,
            QType::ALL.into_iter().chain(QType::IQ).collect::<Vec<_>>()
        );
        for r in &report.rates {
            assert!(
                r.bytes_per_s.is_finite() && r.bytes_per_s > 1e6,
                "{:?}: {} bytes/s",
                r.qtype,
                r.bytes_per_s
            );
        }
        assert_eq!(
            report.bytes_per_s(QType::Q8_0),
            Some(report.rates[6].bytes_per_s)
        );
        assert!(report.flops_per_s.is_finite() && report.flops_per_s > 1e6);
        assert!(
            report.attention_flops_per_s.is_finite() && report.attention_flops_per_s > 1e6,
            "{}",
            report.attention_flops_per_s
        );
        // Even a slow machine passes over more than 10 M logits a second (~1 ns each here), an
        // emulated one (the aarch64 tests under qemu-user, ~10× slower, on a busy CI core) 1 M.
        assert!(
            report.sample_entries_per_s.is_finite() && report.sample_entries_per_s > 1e6,
            "{}",
            report.sample_entries_per_s
        );
        assert!(report.elapsed > Duration::ZERO);
    }

    #[test]
    fn a_matrix_of_fewer_than_16_rows_is_refused() {
        let cfg = ProbeConfig {
            types: vec![QType::F32],
            matrix_bytes: 15 * 4 * 1024,
            ..small()
        };
        let err = probe(&ThreadPool::new(1), &cfg).expect_err("too small");
        assert!(
            matches!(err, KernelError::BadSliceLength { what, .. } if what == "probe matrix (bytes)"),
            "{err}"
        );
        let cfg = ProbeConfig {
            cols: 1000,
            ..small()
        };
        assert!(matches!(
            probe(&ThreadPool::new(1), &cfg),
            Err(KernelError::BadRowLength { .. })
        ));
    }

    /// Rounds stop at `max`, or at one once the share of the budget is spent; the warm-up call is
    /// extra.
    #[test]
    fn rounds_keep_to_the_budget() {
        let count = |r: Rounds| {
            let mut calls = 0;
            let secs = r
                .time(|| {
                    calls += 1;
                    Ok(())
                })
                .expect("rounds");
            (calls, secs.len())
        };
        let later = Instant::now() + Duration::from_secs(60);
        let past = Instant::now();
        let r = |max, until, warm_up| Rounds {
            max,
            until,
            warm_up,
        };
        assert_eq!(count(r(3, later, false)), (3, 3));
        assert_eq!(count(r(3, later, true)), (4, 3));
        assert_eq!(count(r(3, past, false)), (1, 1));
        assert_eq!(count(r(3, past, true)), (2, 1));
    }

    /// The random bytes become finite weights of sane magnitude in every format.
    #[test]
    fn the_weights_are_valid() {
        let mut rng = SplitMix64::new(9);
        let cols = 256;
        for qtype in QType::ALL.into_iter().chain(QType::IQ) {
            let rb = qtype.try_row_bytes(cols).expect("row");
            let mut data: Vec<u8> = (0..4 * rb).map(|_| rng.next_u64() as u8).collect();
            make_valid(qtype, &mut data);
            let mut row = vec![0f32; cols];
            for r in data.chunks_exact(rb) {
                crate::quant::dequantize_row(qtype, r, &mut row).expect("decode");
                assert!(
                    row.iter().all(|v| v.is_finite() && v.abs() < 100.0),
                    "{qtype:?}: {:?}",
                    &row[..8]
                );
                assert!(row.iter().any(|v| *v != 0.0), "{qtype:?}: all zero");
            }
        }
    }
}
