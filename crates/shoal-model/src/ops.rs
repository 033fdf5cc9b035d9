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
/// position scale and optional per-frequency divisors (Llama 3's `rope_freqs`, Phi-3's short factors).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub style: RopeStyle,
    /// Rotated values per head (even; the rest pass through).
    pub dims: usize,
    pub theta: f32,
    pub freq_scale: f32,
    pub factors: Option<Vec<f32>>,
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
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in positions {
            let mut angle = p as f32;
            for i in 0..half {
                let ff = spec.factors.as_ref().and_then(|f| f.get(i)).copied();
                let theta = spec.freq_scale * (angle / ff.unwrap_or(1.0));
                cos.push(theta.cos());
                sin.push(theta.sin());
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

/// The gated activation over rows of `[gate | up]`, rows split over `pool`'s threads (every row
/// computed exactly as alone).
pub fn gated_par(act: Activation, gate_up: &[f32], n: usize, out: &mut [f32], pool: &ThreadPool) {
    let f = match act {
        Activation::Silu => swiglu,
        Activation::GeluTanh => geglu,
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
}
