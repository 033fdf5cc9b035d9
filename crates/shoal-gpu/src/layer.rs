//! The rest of a decoder layer's step on the device: rotary embedding ([`Commands::rope`]), the
//! f16 KV cache ([`GpuKvCache`], [`Commands::kv_write`], [`Commands::kv_write_rows`] for a
//! chunk), decode attention over it ([`Commands::attention`]), causal attention of a prefill
//! chunk ([`Commands::attention_rows`]) and the embedding-row lookup ([`Commands::embed`]).

use crate::ops::same_len;
use crate::pipelines::Kernel;
use crate::{Commands, Gpu, GpuError, GpuMatrix, GpuVec};

/// Threads per workgroup of the elementwise kernels here (RoPE, KV write, embedding) and of
/// attention (one workgroup per query head).
const WG: u32 = 64;

/// Which values of a head a rotary embedding pairs: shoal-model's `RopeStyle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])` (ggml's "normal" mode: Llama, Mistral).
    Interleaved,
    /// The halves `(x[i], x[i + dims/2])` (ggml's NEOX mode: Qwen 2/3, Gemma 3, Phi-3).
    Neox,
}

/// One rotary embedding, as shoal-model's `RopeSpec` describes it. The frequency factors
/// (Llama 3's `rope_freqs`, Phi-3's) are a device vector of `dims / 2` divisors.
#[derive(Debug, Clone, Copy)]
pub struct Rope<'a> {
    pub mode: RopeMode,
    /// Values per head (the vector holds whole heads).
    pub head_dim: usize,
    /// Rotated values per head (even, at most `head_dim`; the rest pass through).
    pub dims: usize,
    /// The frequency base (`rope.freq_base`).
    pub theta: f32,
    /// Linear position scale (1 without scaling).
    pub freq_scale: f32,
    pub factors: Option<&'a GpuVec>,
    /// YaRN scaling (gpt-oss), when the model has it.
    pub yarn: Option<RopeYarn>,
}

/// YaRN's part of a [`Rope`] (ggml's `rope_yarn`, shoal-model's `Yarn`), what the kernel needs
/// once the host has worked it out: pairs below the correction range `corr` (pair indices) keep
/// their unscaled angle, those above it take `freq_scale ·` it, the range between ramps linearly
/// by `ext_factor` (0: every pair scaled); cos and sin are multiplied by `mscale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeYarn {
    pub ext_factor: f32,
    pub mscale: f32,
    pub corr: [f32; 2],
}

/// The shape of a [`GpuKvCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub layers: usize,
    /// Positions per layer.
    pub capacity: usize,
    /// Query heads (sizes the attention's score scratch).
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Values per head: even, at most 576 (a latent-attention key: DeepSeek V3's 512 + 64).
    pub head_dim: usize,
    /// Latent attention: the keys are their own values, so no value buffer is kept (attention
    /// reads the keys as values, a KV write stores the keys alone).
    pub keys_only: bool,
}

/// A KV cache on the device: keys and values as f16, two per u32, laid out
/// `[layer][pos][kv_head][head_dim]`, each in one storage buffer (the keys alone when
/// [`KvShape::keys_only`]); plus the attention's score scratch (`n_heads × capacity` f32).
#[derive(Debug)]
pub struct GpuKvCache {
    shape: KvShape,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    scores: wgpu::Buffer,
}

impl GpuKvCache {
    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// u32 words per position of one layer.
    fn row_words(&self) -> usize {
        self.shape.n_kv_heads * self.shape.head_dim / 2
    }

    fn base(&self, layer: usize, pos: usize) -> u32 {
        ((layer * self.shape.capacity + pos) * self.row_words()) as u32
    }
}

/// How [`Commands::attention`] attends: shoal-model's `AttnSpec` plus the layer and position.
#[derive(Debug, Clone, Copy)]
pub struct Attend {
    pub layer: usize,
    /// The query's position; keys `0..=pos` (or the window's last ones) are attended.
    pub pos: usize,
    /// Keys a query sees, counting itself (0: all earlier positions).
    pub window: usize,
    /// Queries are multiplied by this before the `q·k` products and the scores are not scaled;
    /// `None`: scores are scaled by `1 / sqrt(head_dim)`.
    pub query_scale: Option<f32>,
}

/// The options of [`Commands::attention_rows_with`] beyond [`Attend`].
#[derive(Debug, Clone, Copy, Default)]
pub struct AttendWith<'a> {
    /// Attention sinks (gpt-oss): one logit per query head, which joins each head's softmax
    /// maximum and denominator but weights no value (shoal-kernels' `attend_f16_sinks`).
    pub sinks: Option<&'a GpuVec>,
    /// The scores' scale, over [`Attend::query_scale`] and `1 / sqrt(head_dim)` (latent attention's
    /// `kq_scale`: queries unscaled).
    pub score_scale: Option<f32>,
}

/// The positions a RoPE dispatch rotates for: one, or one per row.
#[derive(Clone, Copy)]
enum Positions<'a> {
    One(usize),
    Rows(&'a [u32]),
}

fn shape_err(msg: String) -> GpuError {
    GpuError::Shape(msg)
}

fn u32_of(what: &str, v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| shape_err(format!("{what} {v} does not fit a u32")))
}

impl Gpu {
    /// A zeroed KV cache of `shape`; refused when one of its buffers exceeds a storage binding.
    pub fn kv_cache(&self, shape: KvShape) -> Result<GpuKvCache, GpuError> {
        let KvShape {
            layers,
            capacity,
            n_heads,
            n_kv_heads,
            head_dim,
            keys_only,
        } = shape;
        if head_dim == 0 || head_dim % 2 == 1 || head_dim > 576 {
            return Err(shape_err(format!(
                "head_dim {head_dim}: need even, 1..=576"
            )));
        }
        if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(shape_err(format!(
                "{n_heads} query heads are not a multiple of {n_kv_heads} KV heads"
            )));
        }
        let kv_bytes = (layers * capacity * n_kv_heads * head_dim * 2).max(4) as u64;
        let score_bytes = (n_heads * capacity * 4).max(4) as u64;
        for (what, bytes) in [("KV cache", kv_bytes), ("attention scores", score_bytes)] {
            if bytes > self.max_binding {
                return Err(GpuError::TooLarge {
                    what,
                    bytes,
                    limit: self.max_binding,
                });
            }
        }
        let buffer = |label, size| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        };
        self.checked(|| GpuKvCache {
            shape,
            k: buffer("shoal k cache", kv_bytes),
            v: buffer("shoal v cache", if keys_only { 4 } else { kv_bytes }),
            scores: buffer("shoal attention scores", score_bytes),
        })
    }
}

impl Gpu {
    /// Copies the keys and values of positions `0..len` of every layer from `src` to `dst` (a
    /// bigger cache a sequence grows into, a prefix kept, a fork), on the device, ordered before
    /// any later submission.
    pub fn kv_copy(&self, src: &GpuKvCache, dst: &GpuKvCache, len: usize) -> Result<(), GpuError> {
        let (a, b) = (src.shape, dst.shape);
        let same = a.layers == b.layers
            && a.n_kv_heads == b.n_kv_heads
            && a.head_dim == b.head_dim
            && a.keys_only == b.keys_only;
        if !same || len > a.capacity || len > b.capacity {
            return Err(shape_err(format!(
                "KV copy of {len} positions from {a:?} into {b:?}"
            )));
        }
        if len == 0 {
            return Ok(());
        }
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("shoal kv copy"),
            });
        let bytes = (len * src.row_words() * 4) as u64;
        for layer in 0..a.layers {
            let from = u64::from(src.base(layer, 0)) * 4;
            let to = u64::from(dst.base(layer, 0)) * 4;
            encoder.copy_buffer_to_buffer(&src.k, from, &dst.k, to, bytes);
            if !a.keys_only {
                encoder.copy_buffer_to_buffer(&src.v, from, &dst.v, to, bytes);
            }
        }
        self.checked(|| self.queue.submit([encoder.finish()]))?;
        Ok(())
    }
}

impl Commands<'_> {
    /// Rotates, in place, the heads of `x` from value `offset` on (a `[heads × head_dim]` query
    /// or key vector, or the `[q | k]` front of a fused QKV row) for position `pos`.
    pub fn rope(
        &mut self,
        x: &GpuVec,
        offset: usize,
        heads: usize,
        rope: Rope<'_>,
        pos: usize,
    ) -> Result<(), GpuError> {
        self.rope_at(x, (offset, 0), heads, rope, Positions::One(pos))
    }

    /// [`Commands::rope`] of `positions.len()` rows in one dispatch: row `r`'s heads from
    /// `x[offset + r·stride..]`, rotated for position `positions[r]`.
    pub fn rope_rows(
        &mut self,
        x: &GpuVec,
        (offset, stride): (usize, usize),
        heads: usize,
        rope: Rope<'_>,
        positions: &[u32],
    ) -> Result<(), GpuError> {
        self.rope_at(x, (offset, stride), heads, rope, Positions::Rows(positions))
    }

    fn rope_at(
        &mut self,
        x: &GpuVec,
        (offset, stride): (usize, usize),
        heads: usize,
        rope: Rope<'_>,
        positions: Positions<'_>,
    ) -> Result<(), GpuError> {
        let Rope {
            mode,
            head_dim,
            dims,
            theta,
            freq_scale,
            factors,
            yarn,
        } = rope;
        if dims == 0 || dims % 2 == 1 || dims > head_dim {
            return Err(shape_err(format!(
                "rope over {dims} of {head_dim} values: need even, 1..=head_dim"
            )));
        }
        let rows = match positions {
            Positions::One(_) => 1,
            Positions::Rows(p) => p.len(),
        };
        if rows == 0 {
            return Ok(());
        }
        if offset + (rows - 1) * stride + heads * head_dim > x.len() {
            return Err(shape_err(format!(
                "rope: {rows} rows of {heads} heads of {head_dim} from {offset} (stride {stride}) \
                 exceed {} values",
                x.len()
            )));
        }
        if let Some(f) = factors {
            same_len("rope factors", f.len(), dims / 2)?;
        }
        let theta_scale = theta.powf(-2.0 / dims as f32);
        let (pos, list) = match positions {
            Positions::One(p) => (u32_of("position", p)?, None),
            Positions::Rows(p) => (0, Some(p)),
        };
        let params = self.gpu().uniform(&[
            u32_of("heads", heads)?,
            u32_of("head_dim", head_dim)?,
            dims as u32,
            pos,
            theta_scale.to_bits(),
            freq_scale.to_bits(),
            u32::from(mode == RopeMode::Neox),
            u32::from(factors.is_some()),
            u32_of("offset", offset)?,
            rows as u32,
            u32_of("stride", stride)?,
            u32::from(list.is_some()),
            u32::from(yarn.is_some()),
            yarn.map_or(0.0, |y| y.ext_factor).to_bits(),
            yarn.map_or(1.0, |y| y.mscale).to_bits(),
            yarn.map_or(0.0, |y| y.corr[0]).to_bits(),
            yarn.map_or(0.0, |y| y.corr[1]).to_bits(),
        ]);
        let positions = self.gpu().storage_u32(list.unwrap_or(&[0]));
        let factors = self.gpu().buffer_or_dummy(factors)?;
        let pairs = u32_of("pairs", rows * heads * dims / 2)?;
        self.dispatch(
            Kernel::Rope,
            WG,
            &[&params, &x.buffer, &factors, &positions],
            pairs.div_ceil(WG),
        )
    }

    /// Stores one position's keys and values (`n_kv_heads × head_dim` values each, from
    /// `k[k_off..]` and `v[v_off..]`) in `cache` at `layer`, `pos`, rounded to f16.
    #[allow(clippy::too_many_arguments)] // two sources with offsets, and where they go
    pub fn kv_write(
        &mut self,
        cache: &GpuKvCache,
        layer: usize,
        pos: usize,
        k: &GpuVec,
        k_off: usize,
        v: &GpuVec,
        v_off: usize,
    ) -> Result<(), GpuError> {
        self.kv_write_rows(cache, layer, pos, 1, k, k_off, v, v_off, 0)
    }

    /// [`Commands::kv_write`] of `rows` consecutive positions from `pos` in one dispatch: row `r`'s
    /// keys from `k[k_off + r·stride..]`, its values from `v[v_off + r·stride..]` (a prefill
    /// chunk's fused QKV rows: `stride` the row length).
    #[allow(clippy::too_many_arguments)] // two sources with offsets, and where they go
    pub fn kv_write_rows(
        &mut self,
        cache: &GpuKvCache,
        layer: usize,
        pos: usize,
        rows: usize,
        k: &GpuVec,
        k_off: usize,
        v: &GpuVec,
        v_off: usize,
        stride: usize,
    ) -> Result<(), GpuError> {
        let s = cache.shape;
        if layer >= s.layers || pos + rows > s.capacity {
            return Err(shape_err(format!(
                "KV write at layer {layer}, positions {pos}..{}: the cache holds {} × {}",
                pos + rows,
                s.layers,
                s.capacity
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        let n = 2 * cache.row_words();
        let last = (rows - 1) * stride;
        if k_off + last + n > k.len() || v_off + last + n > v.len() {
            return Err(shape_err(format!(
                "KV write of {rows} rows of {n} values from {k_off} / {v_off}, stride {stride}: \
                 vectors of {} / {}",
                k.len(),
                v.len()
            )));
        }
        let words = cache.row_words() as u32;
        let total = u32_of("KV words", rows * cache.row_words())?;
        let params = self.gpu().uniform(&[
            words,
            cache.base(layer, pos),
            u32_of("k offset", k_off)?,
            u32_of("v offset", v_off)?,
            rows as u32,
            u32_of("stride", stride)?,
            u32::from(s.keys_only),
        ]);
        let buffers = [&params, &k.buffer, &v.buffer, &cache.k, &cache.v];
        self.dispatch(Kernel::KvWrite, WG, &buffers, total.div_ceil(WG))
    }

    /// Decode attention of one query (`n_heads × head_dim` values from `q[q_off..]`) over
    /// `cache`'s keys and values of `at.layer` up to `at.pos`, into `out` (`n_heads × head_dim`).
    pub fn attention(
        &mut self,
        cache: &GpuKvCache,
        q: &GpuVec,
        q_off: usize,
        at: Attend,
        out: &GpuVec,
    ) -> Result<(), GpuError> {
        let qd = cache.shape.n_heads * cache.shape.head_dim;
        self.attention_rows(cache, q, q_off, qd, 1, at, out)
    }

    /// Causal attention of a prefill chunk: `rows` queries, row `r` at position `at.pos + r`
    /// (`n_heads × head_dim` values from `q[q_off + r·q_stride..]`: `q_stride` is the row length
    /// of a fused QKV chunk, or `n_heads × head_dim`), each over `cache`'s keys and values of
    /// `at.layer` at positions up to its own (the window's last ones when `at.window > 0`); those
    /// must be written already ([`Commands::kv_write_rows`] for the chunk). `out` receives
    /// `rows × n_heads × head_dim` values. Each row is computed exactly as [`Commands::attention`]
    /// at its position. The scores use the cache's scratch when they fit it, else a scratch
    /// buffer of `rows × n_heads × min(at.pos + rows, window)` f32 made for this call (refused
    /// with [`GpuError::TooLarge`] above a storage binding: split the chunk).
    #[allow(clippy::too_many_arguments)] // the query rows, where they attend, and the output
    pub fn attention_rows(
        &mut self,
        cache: &GpuKvCache,
        q: &GpuVec,
        q_off: usize,
        q_stride: usize,
        rows: usize,
        at: Attend,
        out: &GpuVec,
    ) -> Result<(), GpuError> {
        let with = AttendWith::default();
        self.attention_rows_with(cache, (q, q_off, q_stride), rows, at, with, out)
    }

    /// [`Commands::attention_rows`] with attention sinks and a score scale ([`AttendWith`]); the
    /// query rows are `(q, q_off, q_stride)`.
    pub fn attention_rows_with(
        &mut self,
        cache: &GpuKvCache,
        (q, q_off, q_stride): (&GpuVec, usize, usize),
        rows: usize,
        at: Attend,
        with: AttendWith<'_>,
        out: &GpuVec,
    ) -> Result<(), GpuError> {
        let sinks = with.sinks;
        let s = cache.shape;
        if let Some(sk) = sinks {
            same_len("attention sinks", sk.len(), s.n_heads)?;
        }
        let qd = s.n_heads * s.head_dim;
        let end = at.pos + rows;
        let q_need = match rows {
            0 => 0,
            _ => q_off + (rows - 1) * q_stride + qd,
        };
        if at.layer >= s.layers || end > s.capacity || q_need > q.len() {
            return Err(shape_err(format!(
                "attention at layer {}, positions {}..{end} from q[{q_off}..] (stride \
                 {q_stride}) of {}: the cache holds {} × {}, {qd} query values a row",
                at.layer,
                at.pos,
                q.len(),
                s.layers,
                s.capacity
            )));
        }
        same_len("attention output", out.len(), rows * qd)?;
        if rows == 0 {
            return Ok(());
        }
        // Scores per (row, head): the longest row's keys.
        let stride = match at.window {
            0 => end,
            w => w.min(end),
        };
        let score_words = rows * s.n_heads * stride;
        let scratch;
        let scores = if score_words <= s.n_heads * s.capacity {
            &cache.scores
        } else {
            let bytes = (score_words * 4) as u64;
            if bytes > self.gpu().max_binding {
                return Err(GpuError::TooLarge {
                    what: "attention scores",
                    bytes,
                    limit: self.gpu().max_binding,
                });
            }
            scratch = self.gpu().checked(|| {
                self.gpu().device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("shoal prefill attention scores"),
                    size: bytes,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                })
            })?;
            &scratch
        };
        let (q_scale, score_scale) = match (with.score_scale, at.query_scale) {
            (Some(sc), _) => (1.0, sc),
            (None, Some(sc)) => (sc, 1.0),
            (None, None) => (1.0, 1.0 / (s.head_dim as f32).sqrt()),
        };
        let params = self.gpu().uniform(&[
            s.head_dim as u32,
            (s.n_heads / s.n_kv_heads) as u32,
            s.n_kv_heads as u32,
            at.pos as u32,
            u32_of("window", at.window)?,
            cache.base(at.layer, 0),
            stride as u32,
            u32_of("q offset", q_off)?,
            q_scale.to_bits(),
            score_scale.to_bits(),
            u32_of("q stride", q_stride)?,
            qd as u32,
            u32::from(sinks.is_some()),
        ]);
        let wg = WG.min(self.gpu().row_workgroup());
        let sinks = self.gpu().buffer_or_dummy(sinks)?;
        let values = if s.keys_only { &cache.k } else { &cache.v };
        let buffers = [
            &params,
            &q.buffer,
            &cache.k,
            values,
            scores,
            &out.buffer,
            &sinks,
        ];
        let numbered: Vec<_> = (0u32..).zip(buffers).collect();
        let grid = (s.n_heads as u32, u32_of("rows", rows)?);
        self.dispatch_grid(Kernel::Attention, &[("WG", wg)], &numbered, grid)
    }

    /// Row `row` of an embedding table (any format [`Gpu::upload_matrix`] takes), dequantized and
    /// multiplied by `scale` (Gemma's `sqrt(dim)`, else 1), into `y` (`table.cols()` values).
    pub fn embed(
        &mut self,
        table: &GpuMatrix,
        row: usize,
        scale: f32,
        y: &GpuVec,
    ) -> Result<(), GpuError> {
        same_len("embedding output", y.len(), table.cols())?;
        let mut first = 0;
        let Some(chunk) = table.chunks.iter().find(|c| {
            first += c.rows as usize;
            row < first
        }) else {
            return Err(shape_err(format!(
                "embedding row {row} of a table of {} rows",
                table.rows()
            )));
        };
        let in_chunk = row - (first - chunk.rows as usize);
        let k = match table.qtype().block_size() {
            1 => table.cols().div_ceil(4) * 4,
            _ => table.cols(),
        };
        let n = table.cols() as u32;
        let params = self
            .gpu()
            .uniform(&[in_chunk as u32, k as u32, n, scale.to_bits()]);
        let mut buffers = vec![(0, &params), (1, &y.buffer), (3, &chunk.weights)];
        if let Some(s) = &chunk.scales {
            buffers.push((4, s));
        }
        if table.qtype().is_iq() {
            buffers.push((7, self.gpu().iq_tables()?));
        }
        let grid = self.gpu().grid(n.div_ceil(4).div_ceil(WG))?;
        self.dispatch_grid(Kernel::Embed(table.qtype()), &[("WG", WG)], &buffers, grid)
    }
}
