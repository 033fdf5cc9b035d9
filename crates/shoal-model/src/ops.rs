//! Host (CPU) elementwise operations of the Llama family, computed the way ggml's CPU backend computes
//! them (sums of squares in f64, rotary angles advanced by repeated multiplication, `x / (1 + e^-x)`), so
//! our logits track llama.cpp's as closely as the quantized matrix products allow.

use std::sync::Mutex;

use shoal_kernels::ThreadPool;

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

/// [`swiglu`] with the rows split over `pool`'s threads (every row computed exactly as alone).
pub fn swiglu_par(gate_up: &[f32], n: usize, out: &mut [f32], pool: &ThreadPool) {
    let rows = out.len() / n.max(1);
    let nt = pool.n_threads();
    if rows < 2 || nt < 2 {
        return swiglu(gate_up, n, out);
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
            swiglu(g, n, o);
        }
    });
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Rotary embedding tables, `cos[pos * half + i]` and `sin[...]`.
pub struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    positions: usize,
}

impl RopeTable {
    pub fn new(head_dim: usize, theta: f32, positions: usize) -> Self {
        let half = head_dim / 2;
        let theta_scale = theta.powf(-2.0 / head_dim as f32);
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            let mut angle = p as f32;
            for _ in 0..half {
                cos.push(angle.cos());
                sin.push(angle.sin());
                angle *= theta_scale;
            }
        }
        Self {
            cos,
            sin,
            half,
            positions,
        }
    }

    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Rotates adjacent pairs `(x[2i], x[2i+1])` of one head vector at position `pos` (GGML's normal
    /// mode, which GGUF Llama checkpoints are permuted for).
    pub fn rotate(&self, x: &mut [f32], pos: usize) {
        let c = &self.cos[pos * self.half..][..self.half];
        let s = &self.sin[pos * self.half..][..self.half];
        for i in 0..self.half {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = a * c[i] - b * s[i];
            x[2 * i + 1] = a * s[i] + b * c[i];
        }
    }
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
            swiglu_par(&gu, n, &mut split, &ThreadPool::new(2));
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

    #[test]
    fn rope_is_a_rotation_by_position_times_frequency() {
        let t = RopeTable::new(4, 10_000.0, 8);
        let mut x = [1.0f32, 0.0, 1.0, 0.0];
        t.rotate(&mut x, 0);
        assert_eq!(x, [1.0, 0.0, 1.0, 0.0]);
        t.rotate(&mut x, 3);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[1] - 3f32.sin()).abs() < 1e-6);
        let f = 10_000f32.powf(-0.5) * 3.0;
        assert!((x[2] - f.cos()).abs() < 1e-6 && (x[3] - f.sin()).abs() < 1e-6);
        // Norm is preserved.
        assert!(((x[0] * x[0] + x[1] * x[1]) - 1.0).abs() < 1e-6);
    }
}
