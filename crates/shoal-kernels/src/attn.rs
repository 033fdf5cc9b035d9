//! Attention of a few query heads against one KV head's f16 cache: scores, softmax, weighted sum of
//! values, in one pass that converts each cached key and value to f32 once for all the heads.
//!
//! Numerics follow llama.cpp's CPU path: the caller passes queries already rounded to f16 precision,
//! keys and values are f16, and the attention weights are rounded to f16 before weighting the values.
//! Like [`crate::math`], the AVX-512, AVX2, NEON and portable paths perform the same IEEE operations in the
//! same order (8-lane partial sums, fused multiply-adds, a fixed reduction tree; with AVX-512 a register
//! carries the same chunk of two keys, or 16 outputs' independent chains), so results are bitwise the
//! same whichever runs, and one head's output never depends on the other heads passed with it.

use half::f16;

use crate::math::{exp_in_place, round_to_f16};

/// Lanes of the partial sums (one 256-bit register of f32).
const L: usize = 8;

/// Attention of `n_q` query heads sharing one KV head, over its first `len` cached positions.
///
/// `q` holds the heads one after another (`n_q · hd`), `keys` and `values` hold `len` rows of `hd`
/// f16 each, `out` receives `n_q · hd` values. Scores are `q·k · scale`; `scratch` is reused between
/// calls to avoid allocating.
///
/// # Panics
/// If a slice length does not match `n_q`, `len` and `hd`, or `len` is 0.
#[allow(clippy::too_many_arguments)] // the operands of one attention
pub fn attend_f16(
    q: &[f32],
    n_q: usize,
    keys: &[f16],
    values: &[f16],
    hd: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_f16_sinks(q, n_q, keys, values, hd, scale, None, scratch, out);
}

/// [`attend_f16`] with optional attention sinks (gpt-oss): one logit per query head that joins the
/// softmax's denominator (and its maximum) but weights no value, so a head may attend to "nothing".
/// `sinks` holds `n_q` logits, in the heads' order; `None` is [`attend_f16`].
///
/// # Panics
/// As [`attend_f16`], and if `sinks` does not hold `n_q` values.
#[allow(clippy::too_many_arguments)] // the operands of one attention
pub fn attend_f16_sinks(
    q: &[f32],
    n_q: usize,
    keys: &[f16],
    values: &[f16],
    hd: usize,
    scale: f32,
    sinks: Option<&[f32]>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    assert!(hd > 0, "attend_f16: head_dim is 0");
    let len = keys.len() / hd;
    assert!(
        len > 0
            && keys.len() == len * hd
            && values.len() == keys.len()
            && q.len() == n_q * hd
            && out.len() == n_q * hd
            && sinks.is_none_or(|s| s.len() == n_q),
        "attend_f16: slice lengths do not match the heads"
    );
    scratch.clear();
    scratch.resize(n_q * len + L * hd, 0.0);
    let (w, kf) = scratch.split_at_mut(n_q * len);
    let fast = simd_available();
    scores(fast, q, keys, hd, scale, w, kf);
    for (h, w) in w.chunks_exact_mut(len).enumerate() {
        softmax_to_f16(fast, w, sinks.map(|s| s[h]));
    }
    weighted_sum(fast, w, values, hd, out);
}

#[cfg(target_arch = "x86_64")]
fn simd_available() -> bool {
    crate::x86::has_avx2()
}

#[cfg(target_arch = "aarch64")]
fn simd_available() -> bool {
    crate::arm::has_neon()
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn simd_available() -> bool {
    false
}

/// `s[h·len + j] = dot(q_h, k_j) · scale`; `kf` (8 · hd values) is room for 8 keys in f32.
fn scores(
    fast: bool,
    q: &[f32],
    keys: &[f16],
    hd: usize,
    scale: f32,
    s: &mut [f32],
    kf: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if fast && hd.is_multiple_of(L) && crate::x86::avx512::has_avx512dq() {
        // SAFETY: the features were just checked; lengths are consistent (checked above).
        return unsafe { x86::scores_512(q, keys, hd, scale, s, kf) };
    }
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: the features were checked by the caller; lengths are consistent (checked above).
        return unsafe { x86::scores(q, keys, hd, scale, s, kf) };
    }
    #[cfg(target_arch = "aarch64")]
    if fast {
        // SAFETY: NEON was checked by the caller; lengths are consistent (checked above).
        return unsafe { crate::arm::attn::scores(q, keys, hd, scale, s, kf) };
    }
    let _ = (fast, kf);
    let len = keys.len() / hd;
    for (j, k) in keys.chunks_exact(hd).enumerate() {
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            s[h * len + j] = dot(qh, k) * scale;
        }
    }
}

/// The portable dot product: one 8-lane accumulator taking the chunks of 8 in order by fused
/// multiply-adds, the lane reduction of [`hsum`], then the tail.
fn dot(q: &[f32], k: &[f16]) -> f32 {
    let mut acc = [0f32; L];
    let (qc, kc) = (q.chunks_exact(L), k.chunks_exact(L));
    let (qt, kt) = (qc.remainder(), kc.remainder());
    for (qv, kv) in qc.zip(kc) {
        for l in 0..L {
            acc[l] = qv[l].mul_add(kv[l].to_f32(), acc[l]);
        }
    }
    let mut r = hsum(acc);
    for (a, b) in qt.iter().zip(kt) {
        r = a.mul_add(b.to_f32(), r);
    }
    r
}

/// The lane reduction of the vector path (ggml's): `l + (l+4)`, then `((0+1) + (2+3))`.
fn hsum(v: [f32; L]) -> f32 {
    let a = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (a[0] + a[1]) + (a[2] + a[3])
}

/// `w = round_f16(softmax(w))`; a sink logit joins the maximum and the denominator (as llama.cpp's
/// `soft_max_ext` with sinks), so the weights then sum to less than 1.
fn softmax_to_f16(fast: bool, w: &mut [f32], sink: Option<f32>) {
    let max = w.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let max = sink.map_or(max, |s| max.max(s));
    w.iter_mut().for_each(|x| *x -= max);
    exp_in_place(w);
    let total = sum(fast, w) + sink.map_or(0.0, |s| (s - max).exp());
    let inv = 1.0 / total;
    w.iter_mut().for_each(|x| *x *= inv);
    round_to_f16(w);
}

/// Sum with 8 lane accumulators (element `j` into lane `j % 8`), the tree of [`hsum`], then the tail.
fn sum(fast: bool, w: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: the features were checked by the caller.
        return unsafe { x86::sum(w) };
    }
    #[cfg(target_arch = "aarch64")]
    if fast {
        // SAFETY: NEON was checked by the caller.
        return unsafe { crate::arm::attn::sum(w) };
    }
    let _ = fast;
    let chunks = w.chunks_exact(L);
    let tail = chunks.remainder();
    let mut acc = [0f32; L];
    for c in chunks {
        for l in 0..L {
            acc[l] += c[l];
        }
    }
    tail.iter().fold(hsum(acc), |r, &x| r + x)
}

/// `out_h = Σ_j w[h·len + j] · v_j`, each output a chain of fused multiply-adds in `j` order from 0.
fn weighted_sum(fast: bool, w: &[f32], values: &[f16], hd: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if fast && hd.is_multiple_of(2 * L) && crate::x86::avx512::has_avx512f() {
        // SAFETY: the features were just checked; lengths are consistent. Every output is the same
        // chain of FMAs as below, 16 of them per instruction.
        return unsafe { x86::weighted_sum_512(w, values, hd, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if fast && hd.is_multiple_of(L) {
        // SAFETY: the features were checked by the caller; lengths are consistent.
        return unsafe { x86::weighted_sum(w, values, hd, out) };
    }
    #[cfg(target_arch = "aarch64")]
    if fast && hd.is_multiple_of(4) {
        // SAFETY: NEON was checked by the caller; lengths are consistent.
        return unsafe { crate::arm::attn::weighted_sum(w, values, hd, out) };
    }
    let _ = fast;
    let len = values.len() / hd;
    out.fill(0.0);
    for (j, v) in values.chunks_exact(hd).enumerate() {
        for (h, o) in out.chunks_exact_mut(hd).enumerate() {
            let p = w[h * len + j];
            for (o, v) in o.iter_mut().zip(v) {
                *o = p.mul_add(v.to_f32(), *o);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::L;
    use crate::weighted::{Reg, weighted};

    /// Converts 8 f16 at `p` to f32.
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable values; f16 is a transparent u16.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// The reduction of [`super::hsum`] on a register.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: register arithmetic; the caller runs with AVX enabled.
        unsafe {
            let a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let b = _mm_hadd_ps(a, a); // a0+a1, a2+a3, ..
            _mm_cvtss_f32(_mm_hadd_ps(b, b))
        }
    }

    /// The reduction of [`super::hsum`] on eight registers at once: lane `i` of the result is
    /// `hsum(v[ORDER[i]])`.
    #[inline(always)]
    unsafe fn hsum8(v: &[__m256; L]) -> __m256 {
        // SAFETY: register arithmetic; the caller runs with AVX enabled.
        unsafe {
            // [lo(a) + hi(a) | lo(b) + hi(b)]: lanes l + (l+4) of two rows.
            let fold = |a: __m256, b: __m256| {
                _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(a, b),
                    _mm256_permute2f128_ps::<0x31>(a, b),
                )
            };
            let (a, b) = (fold(v[0], v[1]), fold(v[2], v[3]));
            let (c, d) = (fold(v[4], v[5]), fold(v[6], v[7]));
            let ab = _mm256_hadd_ps(a, b); // [0: 01 23, 2: 01 23 | 1: .., 3: ..]
            let cd = _mm256_hadd_ps(c, d);
            _mm256_hadd_ps(ab, cd) // [0, 2, 4, 6 | 1, 3, 5, 7]
        }
    }

    /// Row of each lane of [`hsum8`]'s result.
    const ORDER: [usize; L] = [0, 2, 4, 6, 1, 3, 5, 7];

    /// Lane of [`hsum8`]'s result holding row `r` (the inverse of [`ORDER`]).
    const ROW_LANE: [i32; L] = [0, 4, 1, 5, 2, 6, 3, 7];

    /// Stores the scaled sums of eight rows' `lanes` at `dst[0..8]`, in row order.
    #[inline(always)]
    unsafe fn store_scores(lanes: &[__m256; L], scale: f32, dst: *mut f32) {
        // SAFETY: register arithmetic; the caller guarantees 8 writable values at `dst`.
        unsafe {
            let v = _mm256_mul_ps(hsum8(lanes), _mm256_set1_ps(scale));
            let idx = _mm256_loadu_si256(ROW_LANE.as_ptr().cast());
            _mm256_storeu_ps(dst, _mm256_permutevar8x32_ps(v, idx));
        }
    }

    /// One row pair in [`super::dot`]'s order, before the lane reduction.
    #[inline(always)]
    unsafe fn dot_lanes(q: *const f32, k: *const f32, nc: usize) -> __m256 {
        // SAFETY: the caller guarantees `nc · 8` readable values behind both pointers.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for c in 0..nc {
                let (qv, kv) = (_mm256_loadu_ps(q.add(c * L)), _mm256_loadu_ps(k.add(c * L)));
                acc = _mm256_fmadd_ps(qv, kv, acc);
            }
            acc
        }
    }

    /// The vector form of [`super::scores`]: keys in blocks of 8, converted once to f32 (in L1) for
    /// all the heads, one accumulator chain per key, the eight reduced together.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores(
        q: &[f32],
        keys: &[f16],
        hd: usize,
        scale: f32,
        s: &mut [f32],
        kf: &mut [f32],
    ) {
        let len = keys.len() / hd;
        let n_q = q.len() / hd;
        let nc = hd / L;
        let tail = nc * L;
        let mut j0 = 0;
        while j0 + L <= len {
            let block = &keys[j0 * hd..(j0 + L) * hd];
            for (i, f) in kf[..L * hd].chunks_exact_mut(L).enumerate() {
                // SAFETY: 8 values of the block, 8 of `kf`.
                unsafe { _mm256_storeu_ps(f.as_mut_ptr(), load_f16(block.as_ptr().add(i * L))) };
            }
            for h in 0..n_q {
                let qh = &q[h * hd..(h + 1) * hd];
                // Eight independent chains, one per key; each query chunk is loaded once.
                let mut lanes = [_mm256_setzero_ps(); L];
                for c in 0..nc {
                    // SAFETY: `c · 8 + 8 ≤ hd` within each row.
                    unsafe {
                        let qv = _mm256_loadu_ps(qh.as_ptr().add(c * L));
                        for (r, a) in lanes.iter_mut().enumerate() {
                            let kv = _mm256_loadu_ps(kf.as_ptr().add(r * hd + c * L));
                            *a = _mm256_fmadd_ps(qv, kv, *a);
                        }
                    }
                }
                if tail == hd {
                    // SAFETY: register arithmetic and 8 values of `s` (keys `j0..j0 + 8` of head `h`).
                    unsafe { store_scores(&lanes, scale, s[h * len + j0..][..L].as_mut_ptr()) };
                    continue;
                }
                let mut sums = [0f32; L];
                // SAFETY: register arithmetic and an 8-value store.
                unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), hsum8(&lanes)) };
                for (i, &row) in ORDER.iter().enumerate() {
                    let kr = &kf[row * hd..(row + 1) * hd];
                    let mut r = sums[i];
                    for d in tail..hd {
                        r = qh[d].mul_add(kr[d], r);
                    }
                    s[h * len + j0 + row] = r * scale;
                }
            }
            j0 += L;
        }
        // SAFETY: features enabled here; the same operands.
        unsafe { last_keys(q, keys, hd, scale, s, kf, j0) };
    }

    /// Scores of keys `j0..` one at a time (those after the last whole block of 8).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn last_keys(
        q: &[f32],
        keys: &[f16],
        hd: usize,
        scale: f32,
        s: &mut [f32],
        kf: &mut [f32],
        j0: usize,
    ) {
        let (len, n_q, nc) = (keys.len() / hd, q.len() / hd, hd / L);
        for j in j0..len {
            crate::math::f16_to_f32(&keys[j * hd..(j + 1) * hd], &mut kf[..hd]);
            for h in 0..n_q {
                let qh = &q[h * hd..(h + 1) * hd];
                // SAFETY: rows of `hd ≥ nc · 8` values; register arithmetic.
                let mut r = unsafe { hsum(dot_lanes(qh.as_ptr(), kf.as_ptr(), nc)) };
                for d in nc * L..hd {
                    r = qh[d].mul_add(kf[d], r);
                }
                s[h * len + j] = r * scale;
            }
        }
    }

    /// [`scores`] on 512-bit registers for `hd` a multiple of 8: each register holds the same chunk of
    /// two keys (lanes 0–7 and 8–15), so every key's lanes go through exactly the FMA chain of the
    /// 256-bit path with half the instructions. The block is converted into that pairwise layout:
    /// chunk `c` of keys `2p, 2p+1` at `kf[(c·4 + p)·16..]`.
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn scores_512(
        q: &[f32],
        keys: &[f16],
        hd: usize,
        scale: f32,
        s: &mut [f32],
        kf: &mut [f32],
    ) {
        let len = keys.len() / hd;
        let n_q = q.len() / hd;
        let nc = hd / L;
        let mut j0 = 0;
        while j0 + L <= len {
            let block = keys[j0 * hd..(j0 + L) * hd].as_ptr();
            for c in 0..nc {
                for p in 0..L / 2 {
                    // SAFETY: chunk `c` of keys `2p` and `2p + 1` of the block (8 f16 each), and 16
                    // values of `kf` (`(c·4 + p)·16 + 16 ≤ 8·hd`).
                    unsafe {
                        let lo = _mm_loadu_si128(block.add(2 * p * hd + c * L).cast());
                        let hi = _mm_loadu_si128(block.add((2 * p + 1) * hd + c * L).cast());
                        let both = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
                        _mm512_storeu_ps(
                            kf.as_mut_ptr().add((c * 4 + p) * 2 * L),
                            _mm512_cvtph_ps(both),
                        );
                    }
                }
            }
            for h in 0..n_q {
                let qh = &q[h * hd..(h + 1) * hd];
                let mut acc = [_mm512_setzero_ps(); L / 2];
                for c in 0..nc {
                    // SAFETY: `c · 8 + 8 ≤ hd`; `kf` holds `nc · 4` registers of pairs.
                    unsafe {
                        let qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(qh.as_ptr().add(c * L)));
                        for (p, a) in acc.iter_mut().enumerate() {
                            let kv = _mm512_loadu_ps(kf.as_ptr().add((c * 4 + p) * 2 * L));
                            *a = _mm512_fmadd_ps(qv, kv, *a);
                        }
                    }
                }
                let lanes: [__m256; L] = std::array::from_fn(|r| {
                    let a = acc[r / 2];
                    if r % 2 == 0 {
                        _mm512_castps512_ps256(a)
                    } else {
                        _mm512_extractf32x8_ps::<1>(a)
                    }
                });
                // SAFETY: register arithmetic and 8 values of `s` (keys `j0..j0 + 8` of head `h`).
                unsafe { store_scores(&lanes, scale, s[h * len + j0..][..L].as_mut_ptr()) };
            }
            j0 += L;
        }
        // SAFETY: features enabled here; the same operands.
        unsafe { last_keys(q, keys, hd, scale, s, kf, j0) };
    }

    /// The vector form of [`super::sum`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum(w: &[f32]) -> f32 {
        let n8 = w.len() / L * L;
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < n8 {
            // SAFETY: `i + 8 ≤ len`.
            acc = _mm256_add_ps(acc, unsafe { _mm256_loadu_ps(w.as_ptr().add(i)) });
            i += L;
        }
        // SAFETY: plain register arithmetic.
        let r = unsafe { hsum(acc) };
        w[n8..].iter().fold(r, |r, &x| r + x)
    }

    impl Reg for __m256 {
        const WIDTH: usize = L;
        #[inline(always)]
        unsafe fn zero() -> Self {
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const f16) -> Self {
            unsafe { load_f16(p) }
        }
        #[inline(always)]
        unsafe fn splat(p: *const f32) -> Self {
            unsafe { _mm256_broadcast_ss(&*p) }
        }
        #[inline(always)]
        unsafe fn fma(self, a: Self, b: Self) -> Self {
            unsafe { _mm256_fmadd_ps(a, b, self) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm256_storeu_ps(p, self) }
        }
    }

    impl Reg for __m512 {
        const WIDTH: usize = 2 * L;
        #[inline(always)]
        unsafe fn zero() -> Self {
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const f16) -> Self {
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
        }
        #[inline(always)]
        unsafe fn splat(p: *const f32) -> Self {
            unsafe { _mm512_set1_ps(*p) }
        }
        #[inline(always)]
        unsafe fn fma(self, a: Self, b: Self) -> Self {
            unsafe { _mm512_fmadd_ps(a, b, self) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm512_storeu_ps(p, self) }
        }
    }

    /// The vector form of [`super::weighted_sum`]; `hd` is a multiple of 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weighted_sum(w: &[f32], values: &[f16], hd: usize, out: &mut [f32]) {
        // SAFETY: the features the 256-bit registers need are enabled here.
        unsafe { weighted::<__m256>(w, values, hd, out) }
    }

    /// [`weighted_sum`] on 512-bit registers (16 outputs each, the same FMA chains); `hd` is a multiple
    /// of 16.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn weighted_sum_512(w: &[f32], values: &[f16], hd: usize, out: &mut [f32]) {
        // SAFETY: the features the 512-bit registers need are enabled here.
        unsafe { weighted::<__m512>(w, values, hd, out) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(n_q: usize, len: usize, hd: usize, seed: u32) -> (Vec<f32>, Vec<f16>, Vec<f16>) {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let mut q: Vec<f32> = (0..n_q * hd).map(|_| next() * 3.0).collect();
        round_to_f16(&mut q);
        let k = (0..len * hd).map(|_| f16::from_f32(next() * 2.0)).collect();
        let v = (0..len * hd).map(|_| f16::from_f32(next())).collect();
        (q, k, v)
    }

    /// The same attention in f64, for the accuracy check.
    fn reference(q: &[f32], k: &[f16], v: &[f16], hd: usize, scale: f32) -> Vec<f32> {
        reference_sinks(q, k, v, hd, scale, None)
    }

    /// The f64 attention with an optional sink logit per head in the softmax's denominator.
    fn reference_sinks(
        q: &[f32],
        k: &[f16],
        v: &[f16],
        hd: usize,
        scale: f32,
        sinks: Option<&[f32]>,
    ) -> Vec<f32> {
        let len = k.len() / hd;
        let mut out = Vec::new();
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            let s: Vec<f64> = k
                .chunks_exact(hd)
                .map(|kj| {
                    let d: f64 = qh
                        .iter()
                        .zip(kj)
                        .map(|(a, b)| f64::from(*a) * f64::from(b.to_f32()))
                        .sum();
                    d * f64::from(scale)
                })
                .collect();
            let sink = sinks.map(|s| f64::from(s[h]));
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let max = sink.map_or(max, |z| max.max(z));
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |z| (z - max).exp());
            for d in 0..hd {
                let o: f64 = (0..len)
                    .map(|j| e[j] / total * f64::from(v[j * hd + d].to_f32()))
                    .sum();
                out.push(o as f32);
            }
        }
        out
    }

    fn run(fast: bool, q: &[f32], n_q: usize, k: &[f16], v: &[f16], hd: usize) -> Vec<f32> {
        let len = k.len() / hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut s = vec![0f32; n_q * len];
        scores(fast, q, k, hd, scale, &mut s, &mut vec![0f32; L * hd]);
        for w in s.chunks_exact_mut(len) {
            softmax_to_f16(fast, w, None);
        }
        let mut out = vec![0f32; n_q * hd];
        weighted_sum(fast, &s, v, hd, &mut out);
        out
    }

    #[test]
    fn vector_and_portable_paths_agree_bitwise_and_match_an_f64_reference() {
        for (n_q, hd) in [(1, 64), (3, 64), (4, 128), (5, 8), (2, 12), (7, 80), (1, 3)] {
            for len in [1, 2, 7, 8, 9, 33, 130] {
                let (q, k, v) = inputs(n_q, len, hd, (n_q * 1000 + len * 7 + hd) as u32);
                let portable = run(false, &q, n_q, &k, &v, hd);
                let fast = run(simd_available(), &q, n_q, &k, &v, hd);
                for (i, (a, b)) in portable.iter().zip(&fast).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "n_q {n_q} hd {hd} len {len} at {i}"
                    );
                }
                let mut via_api = vec![0f32; n_q * hd];
                let scale = 1.0 / (hd as f32).sqrt();
                attend_f16(&q, n_q, &k, &v, hd, scale, &mut Vec::new(), &mut via_api);
                assert_eq!(via_api, fast);
                let want = reference(&q, &k, &v, hd, scale);
                for (i, (g, w)) in fast.iter().zip(&want).enumerate() {
                    // Weights are rounded to f16 (11 significant bits) before the value sum.
                    assert!(
                        (g - w).abs() <= 2e-3 * (1.0 + w.abs()),
                        "n_q {n_q} hd {hd} len {len} at {i}: {g} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_head_gives_the_same_output_alone_or_with_others() {
        let (hd, len) = (64, 50);
        let (q, k, v) = inputs(4, len, hd, 9);
        let scale = 0.125;
        let mut all = vec![0f32; 4 * hd];
        attend_f16(&q, 4, &k, &v, hd, scale, &mut Vec::new(), &mut all);
        for h in 0..4 {
            let mut one = vec![0f32; hd];
            let qh = &q[h * hd..(h + 1) * hd];
            attend_f16(qh, 1, &k, &v, hd, scale, &mut Vec::new(), &mut one);
            assert_eq!(one, all[h * hd..(h + 1) * hd], "head {h}");
        }
    }

    #[test]
    #[should_panic(expected = "slice lengths")]
    fn mismatched_lengths_panic_with_a_clear_message() {
        let k = vec![f16::ZERO; 64];
        attend_f16(
            &[0.0; 64],
            1,
            &k,
            &k[..32],
            64,
            1.0,
            &mut Vec::new(),
            &mut [0.0; 64],
        );
    }

    #[test]
    fn sinks_join_the_softmax_denominator_as_the_f64_reference_does() {
        for (n_q, hd, len) in [(1, 64, 1), (4, 64, 9), (2, 8, 33), (3, 12, 130)] {
            let (q, k, v) = inputs(n_q, len, hd, (n_q * 31 + len) as u32);
            let scale = 1.0 / (hd as f32).sqrt();
            // Sinks below, near and far above the scores (the last makes every weight tiny).
            let sinks: Vec<f32> = (0..n_q).map(|h| [-4.0, 0.5, 2.0, 9.0][h % 4]).collect();
            let with = |sinks: Option<&[f32]>| {
                let mut out = vec![0f32; n_q * hd];
                attend_f16_sinks(&q, n_q, &k, &v, hd, scale, sinks, &mut Vec::new(), &mut out);
                out
            };
            let got = with(Some(&sinks));
            let want = reference_sinks(&q, &k, &v, hd, scale, Some(&sinks));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 2e-3 * (1.0 + w.abs()),
                    "n_q {n_q} hd {hd} len {len} at {i}: {g} vs {w}"
                );
            }
            // A sink shrinks the output: without it the result is plain attention, and differs.
            let mut plain = vec![0f32; n_q * hd];
            attend_f16(&q, n_q, &k, &v, hd, scale, &mut Vec::new(), &mut plain);
            assert_eq!(plain, with(None));
            assert_ne!(plain, got);
            // A very low sink is no sink at all.
            let low = with(Some(&vec![-1e4f32; n_q]));
            assert_eq!(low, plain);
        }
    }
}
