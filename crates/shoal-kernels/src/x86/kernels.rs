//! AVX2 kernels of the 32-value formats, generic over the 8-bit multiply-accumulate instruction
//! ([`MulSum`]), over the weight format's small decode ([`MinBlock`]: `value = d·q + m` with
//! unsigned quants — `Q4_1`, `Q5_1`; [`SymBlock`]: `value = d·q` with signed quants — `Q8_0`,
//! `Q4_0`, `Q5_0`) and over where activation blocks come from ([`ActRow`]: ggml bytes or the
//! packed layout of [`crate::Activations`]). Also the helpers the other kernel modules share.
//!
//! Every function here is `#[inline(always)]` and is only called from the `#[target_feature]`
//! entry points in `super`, where it is compiled with AVX2/FMA/F16C (and AVX-VNNI) enabled.
//! Pointer arguments must point at complete rows of `nb` blocks; the entry points check lengths.
//!
//! `*_dot4` computes one weight row against four activation rows, decoding the weights once. It
//! performs exactly the same floating-point operations per output as `*_dot1`, so results do not
//! depend on how activation rows are grouped (a sequence's logits do not depend on its batch).
//!
//! Port budget (Intel, 256-bit): float and integer multiplies run on ports 0/1 only, shuffles on
//! port 5. The kernels therefore load scales with memory-operand conversions (`vcvtph2ps m64`,
//! no shuffle), decode nibbles with a 128-bit broadcast load plus a variable shift or mask
//! instead of an insert, and leave one broadcast per block and row on port 5.

use std::arch::x86_64::*;

use crate::format::{Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES, Q8_1_BYTES};

/// The 8-bit dot product instruction and the `Q4_1` nibble decoding that suits it.
pub(crate) trait MulSum {
    /// Factor applied to lanes 4..8 of the `Q4_1` accumulators before the final sum, undoing
    /// a scaling of the high nibbles by [`MulSum::q4_1_quants`] (a power of two: exact).
    const HI_SCALE: f32;
    /// Sums of four adjacent `u8 × i8` products per 32-bit lane; `a ≤ 240`, `|b| ≤ 128`.
    unsafe fn mul_sum(a: __m256i, b: __m256i) -> __m256i;
    /// The 32 unsigned quants of a `Q4_1` block from its 16 nibble bytes: lanes 0..16 the low
    /// nibbles, lanes 16..32 the high nibbles times `1 / HI_SCALE`.
    unsafe fn q4_1_quants(p: *const u8) -> __m256i;
    /// `acc + ` the sums of adjacent `i16` products (`vpmaddwd`), exact.
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
}

/// AVX2: `vpmaddubsw` (16-bit pair sums, which must not saturate) then `vpmaddwd` with ones.
pub(crate) struct Madd;

impl MulSum for Madd {
    const HI_SCALE: f32 = 1.0;

    #[inline(always)]
    unsafe fn mul_sum(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)) }
    }

    #[inline(always)]
    unsafe fn q4_1_quants(p: *const u8) -> __m256i {
        unsafe { nibbles(p) }
    }

    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
    }
}

/// AVX-VNNI: one `vpdpbusd` with 32-bit sums, so high nibbles can stay in place (×16).
pub(crate) struct Vnni;

impl MulSum for Vnni {
    const HI_SCALE: f32 = 1.0 / 16.0;

    #[inline(always)]
    unsafe fn mul_sum(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b) }
    }

    #[inline(always)]
    unsafe fn q4_1_quants(p: *const u8) -> __m256i {
        unsafe {
            let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
            let (lo, hi) = (0x0F0F_0F0F_0F0F_0F0F_i64, 0xF0F0_F0F0_F0F0_F0F0_u64 as i64);
            let mask = _mm256_setr_epi64x(lo, lo, hi, hi);
            _mm256_and_si256(q, mask)
        }
    }

    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_dpwssd_avx_epi32(acc, a, b) }
    }
}

/// The 32 quants of 16 nibble bytes at `p`: low nibbles in lanes 0..16, high nibbles in 16..32.
#[inline(always)]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    unsafe {
        let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        // Shift the upper copy by 4 (across bytes; the mask drops what crossed over).
        let q = _mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        _mm256_and_si256(q, _mm256_set1_epi8(0x0F))
    }
}

/// The 32 bits of the little-endian `u32` at `wb + OFF` as bytes: `0xFF` in lane `j` where bit
/// `j` is set (`OFF + 4 ≤ 16`).
///
/// One 16-byte broadcast load from the block start and one `vpshufb` that hands lane `j` byte
/// `OFF + j / 8`: no transfer from a general register (which a 4-byte broadcast becomes once the
/// compiler merges it with the load of `d`).
#[inline(always)]
unsafe fn bit_mask32<const OFF: i64>(wb: *const u8) -> __m256i {
    unsafe {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(wb.cast()));
        let b = 0x0101_0101_0101_0101 * OFF;
        let pick = _mm256_setr_epi64x(
            b,
            b + 0x0101_0101_0101_0101,
            b + 0x0202_0202_0202_0202,
            b + 0x0303_0303_0303_0303,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, pick), bit), bit)
    }
}

/// A 32-value format with unsigned quants and a minimum, `value = d·q + m`: f16 `d` and `m` at
/// the start of each block.
pub(crate) trait MinBlock {
    const BYTES: usize;
    /// The block's 32 quants; lanes 16..32 may be scaled by `1 / hi_scale::<M>()`.
    unsafe fn quants<M: MulSum>(wb: *const u8) -> __m256i;
    /// The factor undoing that scaling (a power of two).
    fn hi_scale<M: MulSum>() -> f32;
}

/// `Q4_1`: 16 nibble bytes after `d`, `m`.
pub(crate) struct Q41;

impl MinBlock for Q41 {
    const BYTES: usize = Q4_1_BYTES;
    #[inline(always)]
    unsafe fn quants<M: MulSum>(wb: *const u8) -> __m256i {
        unsafe { M::q4_1_quants(wb.add(4)) }
    }
    #[inline(always)]
    fn hi_scale<M: MulSum>() -> f32 {
        M::HI_SCALE
    }
}

/// `Q5_1`: `qh` (32 fifth bits) then 16 nibble bytes after `d`, `m`.
pub(crate) struct Q51;

impl MinBlock for Q51 {
    const BYTES: usize = Q5_1_BYTES;
    #[inline(always)]
    unsafe fn quants<M: MulSum>(wb: *const u8) -> __m256i {
        unsafe {
            let high = _mm256_and_si256(bit_mask32::<4>(wb), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles(wb.add(8)), high)
        }
    }
    #[inline(always)]
    fn hi_scale<M: MulSum>() -> f32 {
        1.0
    }
}

/// A 32-value format with signed quants, `value = d·q`: f16 `d` at the start of each block
/// unless the format says otherwise (`MXFP4`).
pub(crate) trait SymBlock {
    const BYTES: usize;
    /// The block's 32 signed quants.
    unsafe fn quants(wb: *const u8) -> __m256i;
    /// The block's `d` in lane 0.
    #[inline(always)]
    unsafe fn d1(wb: *const u8) -> __m128 {
        unsafe { weight_scales(wb) }
    }
    /// The block's `d` in every lane.
    #[inline(always)]
    unsafe fn d8(wb: *const u8) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_set1_epi16(wb.cast::<i16>().read_unaligned())) }
    }
}

/// `Q8_0`: 32 × i8 after `d`.
pub(crate) struct Q80;

impl SymBlock for Q80 {
    const BYTES: usize = Q8_0_BYTES;
    #[inline(always)]
    unsafe fn quants(wb: *const u8) -> __m256i {
        unsafe { load256(wb.add(2)) }
    }
}

/// `Q4_0`: 16 nibble bytes after `d`, offset 8.
pub(crate) struct Q40;

impl SymBlock for Q40 {
    const BYTES: usize = Q4_0_BYTES;
    #[inline(always)]
    unsafe fn quants(wb: *const u8) -> __m256i {
        unsafe { _mm256_sub_epi8(nibbles(wb.add(2)), _mm256_set1_epi8(8)) }
    }
}

/// `Q5_0`: `qh` (32 fifth bits) then 16 nibble bytes after `d`, offset 16.
pub(crate) struct Q50;

impl SymBlock for Q50 {
    const BYTES: usize = Q5_0_BYTES;
    #[inline(always)]
    unsafe fn quants(wb: *const u8) -> __m256i {
        unsafe {
            // q - 16 = the nibble with its top four bits set unless the fifth bit is.
            let sign = _mm256_andnot_si256(bit_mask32::<2>(wb), _mm256_set1_epi8(-16));
            _mm256_or_si256(nibbles(wb.add(6)), sign)
        }
    }
}

/// One activation row as a sequence of Q8 blocks.
pub(crate) trait ActRow: Copy {
    /// The 32 signed quants of block `b`.
    unsafe fn qs(self, b: usize) -> *const u8;
    /// `[d, s, 0, 0]` of block `b` (`s` meaningful for `Q8_1` only).
    unsafe fn scales(self, b: usize) -> __m128;
}

/// A row of ggml `Q8_1` blocks.
#[derive(Clone, Copy)]
pub(crate) struct GgmlQ81(pub(crate) *const u8);

impl ActRow for GgmlQ81 {
    #[inline(always)]
    unsafe fn qs(self, b: usize) -> *const u8 {
        unsafe { self.0.add(b * Q8_1_BYTES + 4) }
    }
    #[inline(always)]
    unsafe fn scales(self, b: usize) -> __m128 {
        unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(self.0.add(b * Q8_1_BYTES)))) }
    }
}

/// A row of ggml `Q8_0` blocks.
#[derive(Clone, Copy)]
pub(crate) struct GgmlQ80(pub(crate) *const u8);

impl ActRow for GgmlQ80 {
    #[inline(always)]
    unsafe fn qs(self, b: usize) -> *const u8 {
        unsafe { self.0.add(b * Q8_0_BYTES + 2) }
    }
    #[inline(always)]
    unsafe fn scales(self, b: usize) -> __m128 {
        unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(self.0.add(b * Q8_0_BYTES)) & 0xFFFF)) }
    }
}

/// A row of the packed layout: quants at `qs + 32 b`, `[d, s]` as f32 at `sc + 8 b`.
#[derive(Clone, Copy)]
pub(crate) struct Packed {
    pub(crate) qs: *const u8,
    pub(crate) sc: *const f32,
}

impl ActRow for Packed {
    #[inline(always)]
    unsafe fn qs(self, b: usize) -> *const u8 {
        unsafe { self.qs.add(b * 32) }
    }
    #[inline(always)]
    unsafe fn scales(self, b: usize) -> __m128 {
        unsafe { _mm_castpd_ps(_mm_load_sd(self.sc.add(b * 8).cast())) }
    }
}

/// How far ahead of the current weight block to prefetch, in bytes. Weight rows are contiguous,
/// so this runs into the following rows. Without it one thread streams only ~6.5 GB/s from L3
/// here (too few misses in flight for the hardware prefetchers to cover the latency); with it
/// ~13 GB/s, as fast as from L2. Measured on the dev VM: 1 KB ahead gives 10.5 GB/s, 2–4 KB
/// 12–14 GB/s, 8 KB 11 GB/s.
const PREFETCH_BYTES: usize = 4096;

/// Prefetches the weight bytes `PREFETCH_BYTES` after `p` (no access: any address is fine).
#[inline(always)]
pub(crate) unsafe fn prefetch_weights(p: *const u8) {
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES).cast()) }
}

/// Prefetches the first `PREFETCH_BYTES` from `p`, where a chunk of weight rows starts, so the
/// first rows do not wait for the in-loop prefetches to get ahead.
#[inline(always)]
pub(crate) unsafe fn prefetch_start(p: *const u8) {
    let mut o = 0;
    while o < PREFETCH_BYTES {
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o).cast()) };
        o += 64;
    }
}

#[inline(always)]
pub(crate) unsafe fn rd32(p: *const u8) -> i32 {
    unsafe { p.cast::<i32>().read_unaligned() }
}

#[inline(always)]
pub(crate) unsafe fn load256(p: *const u8) -> __m256i {
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// `[d, m or first quants, …]` of a weight block, converted straight from memory.
#[inline(always)]
unsafe fn weight_scales(p: *const u8) -> __m128 {
    unsafe { _mm_cvtph_ps(_mm_loadl_epi64(p.cast())) }
}

#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// The final sum of a row's two accumulators, with lanes 4..8 scaled by `hi`.
#[inline(always)]
pub(crate) unsafe fn finish(a0: __m256, a1: __m256, hi: f32) -> f32 {
    unsafe {
        let scale = _mm256_setr_ps(1.0, 1.0, 1.0, 1.0, hi, hi, hi, hi);
        hsum(_mm256_mul_ps(_mm256_add_ps(a0, a1), scale))
    }
}

#[inline(always)]
pub(crate) unsafe fn splat(v: __m256, i: i32) -> __m256 {
    unsafe { _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(i)) }
}

/// Lane `i` of `v`.
#[inline(always)]
unsafe fn lane(v: __m256, i: i32) -> f32 {
    unsafe { _mm256_cvtss_f32(splat(v, i)) }
}

/// Runs `$step` for every block `$b`, even blocks with accumulator `$acc` starting at `$init`
/// and odd blocks with a second one (hiding the FMA latency); evaluates to `(even, odd)`.
/// A macro rather than a closure so the body is always inlined into the SIMD context.
macro_rules! blocks2 {
    ($nb:expr, $init:expr, |$b:ident, $acc:ident| $step:block) => {{
        let (mut even, mut odd) = ($init, $init);
        let mut blk = 0;
        while blk + 2 <= $nb {
            even = {
                let ($b, $acc) = (blk, even);
                $step
            };
            odd = {
                let ($b, $acc) = (blk + 1, odd);
                $step
            };
            blk += 2;
        }
        if blk < $nb {
            even = {
                let ($b, $acc) = (blk, even);
                $step
            };
        }
        (even, odd)
    }};
}

/// Weights with minimums (`Q4_1`, `Q5_1`) · one `Q8_1` row: Σ_b (dw·dx)·Σ q_w q_x + mw·sx.
#[inline(always)]
pub(crate) unsafe fn min_dot1<B: MinBlock, M: MulSum, A: ActRow>(
    nb: usize,
    w: *const u8,
    a: A,
) -> f32 {
    unsafe {
        let mut accm = _mm_setzero_ps();
        let (acc0, acc1) = blocks2!(nb, _mm256_setzero_ps(), |b, acc| {
            let wb = w.add(b * B::BYTES);
            prefetch_weights(wb);
            // [dw·dx, mw·sx, ·, ·]
            let prod = _mm_mul_ps(weight_scales(wb), a.scales(b));
            accm = _mm_add_ps(accm, prod);
            let s = _mm256_cvtepi32_ps(M::mul_sum(B::quants::<M>(wb), load256(a.qs(b))));
            _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), s, acc)
        });
        finish(acc0, acc1, B::hi_scale::<M>()) + _mm_cvtss_f32(_mm_movehdup_ps(accm))
    }
}

/// Weights with minimums · four packed rows (`qs[r]`, scales interleaved at `sc + 8 b`:
/// `[d0, s0, d1, s1, d2, s2, d3, s3]`). Bitwise equal to four `min_dot1` calls.
#[inline(always)]
pub(crate) unsafe fn min_dot4<B: MinBlock, M: MulSum>(
    nb: usize,
    w: *const u8,
    qs: [*const u8; 4],
    sc: *const f32,
) -> [f32; 4] {
    unsafe {
        let z = _mm256_setzero_ps();
        let mut accm = z;
        let (e, o) = blocks2!(nb, (z, z, z, z), |b, acc| {
            let wb = w.add(b * B::BYTES);
            prefetch_weights(wb);
            let ws = _mm256_cvtph_ps(_mm_set1_epi32(rd32(wb)));
            // [dw·d0, mw·s0, dw·d1, mw·s1, …]
            let prod = _mm256_mul_ps(ws, _mm256_loadu_ps(sc.add(b * 8)));
            accm = _mm256_add_ps(accm, prod);
            let qw = B::quants::<M>(wb);
            let o = b * 32;
            (
                _mm256_fmadd_ps(splat(prod, 0), dot_u8::<M>(qw, qs[0].add(o)), acc.0),
                _mm256_fmadd_ps(splat(prod, 2), dot_u8::<M>(qw, qs[1].add(o)), acc.1),
                _mm256_fmadd_ps(splat(prod, 4), dot_u8::<M>(qw, qs[2].add(o)), acc.2),
                _mm256_fmadd_ps(splat(prod, 6), dot_u8::<M>(qw, qs[3].add(o)), acc.3),
            )
        });
        let h = B::hi_scale::<M>();
        [
            finish(e.0, o.0, h) + lane(accm, 1),
            finish(e.1, o.1, h) + lane(accm, 3),
            finish(e.2, o.2, h) + lane(accm, 5),
            finish(e.3, o.3, h) + lane(accm, 7),
        ]
    }
}

/// `Σ w·x` of signed bytes: `|w|` times `x` with the sign of `w`.
#[inline(always)]
unsafe fn mul_sum_i8<M: MulSum>(aw: __m256i, w: __m256i, x: __m256i) -> __m256i {
    unsafe { M::mul_sum(aw, _mm256_sign_epi8(x, w)) }
}

/// Unsigned weight quants · 32 activation quants at `x`, as floats per 4-lane group.
#[inline(always)]
unsafe fn dot_u8<M: MulSum>(qw: __m256i, x: *const u8) -> __m256 {
    unsafe { _mm256_cvtepi32_ps(M::mul_sum(qw, load256(x))) }
}

/// Signed weight quants (`aw = |qw|`) · 32 activation quants at `x`, as floats.
#[inline(always)]
unsafe fn dot_i8<M: MulSum>(aw: __m256i, qw: __m256i, x: *const u8) -> __m256 {
    unsafe { _mm256_cvtepi32_ps(mul_sum_i8::<M>(aw, qw, load256(x))) }
}

/// Symmetric weights (`Q8_0`, `Q4_0`, `Q5_0`) · one `Q8_0` row: Σ_b (dw·dx)·Σ q_w q_x.
#[inline(always)]
pub(crate) unsafe fn sym_dot1<B: SymBlock, M: MulSum, A: ActRow>(
    nb: usize,
    w: *const u8,
    a: A,
) -> f32 {
    unsafe {
        let (acc0, acc1) = blocks2!(nb, _mm256_setzero_ps(), |b, acc| {
            let wb = w.add(b * B::BYTES);
            prefetch_weights(wb);
            let prod = _mm_mul_ps(B::d1(wb), a.scales(b));
            let qw = B::quants(wb);
            let s = _mm256_cvtepi32_ps(mul_sum_i8::<M>(_mm256_abs_epi8(qw), qw, load256(a.qs(b))));
            _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), s, acc)
        });
        finish(acc0, acc1, 1.0)
    }
}

/// Symmetric weights · four packed rows. Bitwise equal to four `sym_dot1` calls.
#[inline(always)]
pub(crate) unsafe fn sym_dot4<B: SymBlock, M: MulSum>(
    nb: usize,
    w: *const u8,
    qs: [*const u8; 4],
    sc: *const f32,
) -> [f32; 4] {
    unsafe {
        let z = _mm256_setzero_ps();
        let (e, o) = blocks2!(nb, (z, z, z, z), |b, acc| {
            let wb = w.add(b * B::BYTES);
            prefetch_weights(wb);
            let dw = B::d8(wb);
            // Lane 2r: dw·d_r.
            let prod = _mm256_mul_ps(dw, _mm256_loadu_ps(sc.add(b * 8)));
            let qw = B::quants(wb);
            let aw = _mm256_abs_epi8(qw);
            let o = b * 32;
            (
                _mm256_fmadd_ps(splat(prod, 0), dot_i8::<M>(aw, qw, qs[0].add(o)), acc.0),
                _mm256_fmadd_ps(splat(prod, 2), dot_i8::<M>(aw, qw, qs[1].add(o)), acc.1),
                _mm256_fmadd_ps(splat(prod, 4), dot_i8::<M>(aw, qw, qs[2].add(o)), acc.2),
                _mm256_fmadd_ps(splat(prod, 6), dot_i8::<M>(aw, qw, qs[3].add(o)), acc.3),
            )
        });
        [
            finish(e.0, o.0, 1.0),
            finish(e.1, o.1, 1.0),
            finish(e.2, o.2, 1.0),
            finish(e.3, o.3, 1.0),
        ]
    }
}

/// `round_ties_even(a · id)` as i32 lanes.
#[inline(always)]
unsafe fn round_q8(a: __m256, id: __m256) -> __m256i {
    unsafe {
        _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(a, id)))
    }
}

/// Quantizes 32 floats at `x` to i8 at `qs` with the ggml Q8 rule; returns (d, Σq).
/// Bitwise equal to the scalar reference.
#[inline(always)]
pub(crate) unsafe fn quantize_block_q8(x: *const f32, qs: *mut u8) -> (f32, i32) {
    unsafe {
        let v = [
            _mm256_loadu_ps(x),
            _mm256_loadu_ps(x.add(8)),
            _mm256_loadu_ps(x.add(16)),
            _mm256_loadu_ps(x.add(24)),
        ];
        let sign = _mm256_set1_ps(-0.0);
        let m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
        let m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
        let m = _mm256_max_ps(m01, m23);
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        let (d, id) = crate::scalar::q8_scales(_mm_cvtss_f32(m));
        let idv = _mm256_set1_ps(id);
        let q = [
            round_q8(v[0], idv),
            round_q8(v[1], idv),
            round_q8(v[2], idv),
            round_q8(v[3], idv),
        ];
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let sum = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256::<1>(sum),
        );
        let sum = _mm_add_epi32(sum, _mm_unpackhi_epi64(sum, sum));
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01>(sum));
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.cast(), p);
        (d, _mm_cvtsi128_si32(sum))
    }
}
