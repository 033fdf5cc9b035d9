//! Host (CPU) elementwise operations of the Llama family, computed the way ggml's CPU backend computes
//! them (sums of squares in f64, rotary angles advanced by repeated multiplication, `x / (1 + e^-x)`), so
//! our logits track llama.cpp's as closely as the quantized matrix products allow.

use std::sync::Mutex;

use shoal_kernels::ThreadPool;

use crate::arch::{Activation, RopeStyle};

/// `out[r] = x[r] / rms(x[r]) * w` for every row of width `w.len()`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    debug_assert_eq!(x.len(), out.len());
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean = (sum_of_squares(xr) / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &wv) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * wv;
        }
    }
}

/// `Σ v²` in f64, in 8 independent lanes (element `i` into lane `i % 8`, so the compiler vectorizes it)
/// summed pairwise at the end; a row's result never depends on the other rows.
fn sum_of_squares(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f64::from(v * v);
        }
    }
    let pairs = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    let head = (pairs[0] + pairs[2]) + (pairs[1] + pairs[3]);
    tail.iter().fold(head, |s, &v| s + f64::from(v * v))
}

/// SwiGLU over rows of `[gate (n) | up (n)]`: `out = silu(gate) * up`, `n = out row width`.
pub fn swiglu(gate_up: &[f32], n: usize, out: &mut [f32]) {
    for (gu, o) in gate_up.chunks_exact(2 * n).zip(out.chunks_exact_mut(n)) {
        let (g, u) = gu.split_at(n);
        for (o, &g) in o.iter_mut().zip(g) {
            *o = -g;
        }
        shoal_kernels::math::exp_in_place(o);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + *o) * u;
        }
    }
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// What a rotary embedding needs: which values pair up, how many are rotated, the base, a linear
/// position scale, optional per-frequency divisors (Llama 3's `rope_freqs`, Phi-3's short factors) and
/// YaRN's mix of scaled and unscaled frequencies.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub style: RopeStyle,
    /// Rotated values per head (even; the rest pass through).
    pub dims: usize,
    pub theta: f32,
    pub freq_scale: f32,
    pub factors: Option<Vec<f32>>,
    pub yarn: Option<Yarn>,
}

/// YaRN (ggml's `rope_yarn`): frequency pairs below the correction range keep their unscaled angle
/// (extrapolate), those above it take the scaled one (`freq_scale ·`, interpolate), the range between
/// ramps linearly; with `ext_factor ≠ 0` cos and sin are scaled by
/// `attn_factor · (1 + 0.1 · ln(1 / freq_scale))`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Yarn {
    /// The context the model was trained on before scaling (`rope.scaling.original_context_length`).
    pub orig_ctx: usize,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

impl Yarn {
    /// The correction range `[low, high]` in pair indices (ggml's `ggml_rope_yarn_corr_dims`).
    pub(crate) fn corr_dims(&self, dims: usize, base: f32) -> [f32; 2] {
        let n = dims as f32;
        let corr = |rot: f32| {
            n * (self.orig_ctx as f32 / (rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
        };
        [
            corr(self.beta_fast).floor().max(0.0),
            corr(self.beta_slow).ceil().min(n - 1.0),
        ]
    }

    /// `(angle, cos/sin scale)` of pair `i` whose unscaled angle is `extrap`.
    pub(crate) fn angle(
        &self,
        extrap: f32,
        freq_scale: f32,
        corr: [f32; 2],
        i: usize,
    ) -> (f32, f32) {
        let interp = freq_scale * extrap;
        if self.ext_factor == 0.0 {
            return (interp, self.attn_factor);
        }
        let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
        let ramp = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
        let theta = interp * (1.0 - ramp) + extrap * ramp;
        (
            theta,
            self.attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln()),
        )
    }
}

/// `cos` and `sin` of every rotated pair for the rows of one batch (`rows × dims/2`), computed the way
/// ggml's rope cache is: the angle advanced by repeated multiplication, divided by the frequency
/// factor, then scaled.
pub struct RopeRows {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    style: RopeStyle,
}

impl RopeRows {
    /// The tables for rows at `positions` (one per batch row, in order).
    pub fn new(spec: &RopeSpec, positions: impl Iterator<Item = usize>) -> Self {
        let half = spec.dims / 2;
        let theta_scale = spec.theta.powf(-2.0 / spec.dims as f32);
        let corr = spec.yarn.map(|y| y.corr_dims(spec.dims, spec.theta));
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in positions {
            let mut angle = p as f32;
            for i in 0..half {
                let ff = spec.factors.as_ref().and_then(|f| f.get(i)).copied();
                let extrap = angle / ff.unwrap_or(1.0);
                match (&spec.yarn, corr) {
                    (Some(y), Some(corr)) => {
                        let (theta, m) = y.angle(extrap, spec.freq_scale, corr, i);
                        cos.push(theta.cos() * m);
                        sin.push(theta.sin() * m);
                    }
                    _ => {
                        let theta = spec.freq_scale * extrap;
                        cos.push(theta.cos());
                        sin.push(theta.sin());
                    }
                }
                angle *= theta_scale;
            }
        }
        Self {
            cos,
            sin,
            half,
            style: spec.style,
        }
    }

    /// Rows the tables cover.
    pub fn rows(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates one head vector `x` as batch row `row`: adjacent pairs (interleaved) or the two halves of
    /// the rotated part (NEOX).
    pub fn rotate(&self, x: &mut [f32], row: usize) {
        let h = self.half;
        let c = &self.cos[row * h..][..h];
        let s = &self.sin[row * h..][..h];
        let (stride, offset) = match self.style {
            RopeStyle::Interleaved => (2, 1),
            RopeStyle::Neox => (1, h),
        };
        for i in 0..h {
            let (j0, j1) = (stride * i, stride * i + offset);
            let (a, b) = (x[j0], x[j1]);
            x[j0] = a * c[i] - b * s[i];
            x[j1] = a * s[i] + b * c[i];
        }
    }
}

/// RMS-normalises every `w.len()`-wide piece of `x` in place (per-head Q/K norms).
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for xr in x.chunks_exact_mut(n) {
        let mean = (sum_of_squares(xr) / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, &wv) in xr.iter_mut().zip(w) {
            *v = (*v * scale) * wv;
        }
    }
}

/// GeGLU over rows of `[gate (n) | up (n)]`: `out = gelu(gate) * up`, GELU with the tanh approximation
/// evaluated as ggml's CPU backend does: through a table of every f16 input (the input and the result
/// rounded to f16), exact outside ±10.
pub fn geglu(gate_up: &[f32], n: usize, out: &mut [f32]) {
    let table = gelu_f16_table();
    for (gu, o) in gate_up.chunks_exact(2 * n).zip(out.chunks_exact_mut(n)) {
        let (g, u) = gu.split_at(n);
        for ((o, &x), &u) in o.iter_mut().zip(g).zip(u) {
            *o = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x * u
            } else {
                table[usize::from(half::f16::from_f32(x).to_bits())] * u
            };
        }
    }
}

/// `gelu(x)` rounded to f16 for every f16 bit pattern `x` (256 KiB, built once).
fn gelu_f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        const A: f32 = 0.044715;
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        (0..=u16::MAX)
            .map(|bits| {
                let x = half::f16::from_bits(bits).to_f32();
                let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + A * x * x)).tanh());
                half::f16::from_f32(y).to_f32()
            })
            .collect()
    })
}

/// gpt-oss's clamped SwiGLU over rows of `[gate (n) | up (n)]` (ggml's `swiglu_oai`):
/// `out = g · sigmoid(1.702 · g) · (u + 1)` with `g = min(gate, 7)`, `u = clamp(up, -7, 7)`.
pub fn swiglu_oai(gate_up: &[f32], n: usize, out: &mut [f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (gu, o) in gate_up.chunks_exact(2 * n).zip(out.chunks_exact_mut(n)) {
        let (g, u) = gu.split_at(n);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            let x = g.min(LIMIT);
            let y = u.clamp(-LIMIT, LIMIT);
            *o = x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0);
        }
    }
}

/// The gated activation over rows of `[gate | up]`, rows split over `pool`'s threads (every row
/// computed exactly as alone).
pub fn gated_par(act: Activation, gate_up: &[f32], n: usize, out: &mut [f32], pool: &ThreadPool) {
    let f = match act {
        Activation::Silu => swiglu,
        Activation::GeluTanh => geglu,
        Activation::SwigluOai => swiglu_oai,
    };
    let rows = out.len() / n.max(1);
    let nt = pool.n_threads();
    if rows < 2 || nt < 2 {
        return f(gate_up, n, out);
    }
    let per = rows.div_ceil(nt);
    type Part<'a> = Mutex<Option<(&'a [f32], &'a mut [f32])>>;
    let parts: Vec<Part<'_>> = gate_up
        .chunks(per * 2 * n)
        .zip(out.chunks_mut(per * n))
        .map(|p| Mutex::new(Some(p)))
        .collect();
    pool.run(|t, _| {
        let taken = parts.get(t).and_then(|p| p.lock().ok()?.take());
        if let Some((g, o)) = taken {
            f(g, n, o);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_normalises_each_row() {
        let x = [3.0f32, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let mut out = [0f32; 8];
        rms_norm(&x, &[1.0, 1.0, 1.0, 2.0], 0.0, &mut out);
        // Row 0: rms = sqrt(25/4) = 2.5.
        assert_eq!(&out[..4], &[1.2, 1.6, 0.0, 0.0]);
        assert_eq!(&out[4..], &[1.0, 1.0, 1.0, 2.0]);
    }

    #[test]
    fn swiglu_matches_definition() {
        let mut out = [0f32; 2];
        swiglu(&[0.0, 2.0, 3.0, 5.0], 2, &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 2.0 / (1.0 + (-2.0f32).exp()) * 5.0).abs() < 1e-6);
    }

    #[test]
    fn swiglu_split_over_threads_equals_the_serial_form() {
        let n = 37;
        for rows in [1, 2, 3, 16, 17] {
            let gu: Vec<f32> = (0..rows * 2 * n)
                .map(|i| (i as f32 * 0.37).sin() * 4.0)
                .collect();
            let (mut serial, mut split) = (vec![0f32; rows * n], vec![0f32; rows * n]);
            swiglu(&gu, n, &mut serial);
            gated_par(Activation::Silu, &gu, n, &mut split, &ThreadPool::new(2));
            assert_eq!(serial, split, "{rows} rows");
        }
    }

    #[test]
    fn sum_of_squares_is_close_to_the_sequential_sum_for_any_length() {
        for len in [0, 1, 7, 8, 9, 576, 1003] {
            let x: Vec<f32> = (0..len).map(|i| (i as f32 * 0.731).cos() * 3.0).collect();
            let want: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
            let got = sum_of_squares(&x);
            assert!(
                (got - want).abs() <= 1e-12 * want.max(1.0),
                "{len}: {got} vs {want}"
            );
        }
    }

    fn spec(style: RopeStyle) -> RopeSpec {
        RopeSpec {
            style,
            dims: 4,
            theta: 10_000.0,
            freq_scale: 1.0,
            factors: None,
            yarn: None,
        }
    }

    #[test]
    fn rope_is_a_rotation_by_position_times_frequency() {
        let t = RopeRows::new(&spec(RopeStyle::Interleaved), [0, 3].into_iter());
        let mut x = [1.0f32, 0.0, 1.0, 0.0];
        t.rotate(&mut x, 0);
        assert_eq!(x, [1.0, 0.0, 1.0, 0.0]);
        t.rotate(&mut x, 1);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[1] - 3f32.sin()).abs() < 1e-6);
        let f = 10_000f32.powf(-0.5) * 3.0;
        assert!((x[2] - f.cos()).abs() < 1e-6 && (x[3] - f.sin()).abs() < 1e-6);
        // Norm is preserved.
        assert!(((x[0] * x[0] + x[1] * x[1]) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn neox_rope_pairs_the_halves_and_factors_divide_the_angle() {
        let mut s = spec(RopeStyle::Neox);
        let t = RopeRows::new(&s, [3].into_iter());
        let mut x = [1.0f32, 1.0, 0.0, 0.0];
        t.rotate(&mut x, 0);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[2] - 3f32.sin()).abs() < 1e-6);
        s.factors = Some(vec![2.0, 1.0]);
        let t = RopeRows::new(&s, [3].into_iter());
        let mut y = [1.0f32, 1.0, 0.0, 0.0];
        t.rotate(&mut y, 0);
        assert!((y[0] - 1.5f32.cos()).abs() < 1e-6 && (y[2] - 1.5f32.sin()).abs() < 1e-6);
        assert_eq!(x[1], y[1]);
    }

    #[test]
    fn geglu_is_gelu_of_the_gate_times_up() {
        let mut out = [0f32; 3];
        geglu(&[-20.0, 1.0, 12.0, 2.0, 3.0, 0.5], 3, &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 0.841_192 * 3.0).abs() < 3e-3, "{}", out[1]);
        assert_eq!(out[2], 6.0);
    }

    #[test]
    fn swiglu_oai_clamps_the_gate_above_and_the_up_both_ways() {
        let mut out = [0f32; 3];
        swiglu_oai(&[1.0, 9.0, -2.0, 0.5, -12.0, 20.0], 3, &mut out);
        let f = |g: f32, u: f32| g / (1.0 + (-1.702 * g).exp()) * (u + 1.0);
        assert!((out[0] - f(1.0, 0.5)).abs() < 1e-6);
        assert!((out[1] - f(7.0, -7.0)).abs() < 1e-5, "{}", out[1]);
        assert!((out[2] - f(-2.0, 7.0)).abs() < 1e-6, "{}", out[2]);
    }

    #[test]
    fn yarn_keeps_fast_pairs_scales_slow_ones_and_scales_the_magnitude() {
        let yarn = Yarn {
            orig_ctx: 4096,
            ext_factor: 1.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let s = RopeSpec {
            style: RopeStyle::Neox,
            dims: 64,
            theta: 150_000.0,
            freq_scale: 1.0 / 32.0,
            factors: None,
            yarn: Some(yarn),
        };
        // ggml's correction range for these numbers: pairs 8 to 18.
        assert_eq!(yarn.corr_dims(64, 150_000.0), [8.0, 18.0]);
        let t = RopeRows::new(&s, [5].into_iter());
        let m = 1.0 + 0.1 * 32f32.ln();
        let freq = |i: usize| 150_000f32.powf(-2.0 * i as f32 / 64.0);
        for (i, scale) in [(0, 1.0), (5, 1.0), (20, 1.0 / 32.0), (31, 1.0 / 32.0)] {
            let theta = 5.0 * freq(i) * scale;
            assert!((t.cos[i] - theta.cos() * m).abs() < 1e-4, "pair {i}");
            assert!((t.sin[i] - theta.sin() * m).abs() < 1e-4, "pair {i}");
        }
        // Halfway through the ramp, half of each.
        let mid = 5.0 * freq(13) * (0.5 + 0.5 / 32.0);
        assert!((t.cos[13] - mid.cos() * m).abs() < 1e-4);
    }
}
