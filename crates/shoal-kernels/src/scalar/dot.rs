//! Scalar dot products of one weight row with one activation row, for every format, and the
//! `Scalar` backend's matmul rows.
//!
//! Activation rows are read through [`Q8Blocks`] / [`Q8KBlocks`], so the same dot serves ggml
//! bytes ([`vec_dot`]) and the packed [`crate::Activations`] layout ([`gemm_rows`]):
//! - legacy formats: `Σ_b (d_w·d_x)·Σ q_w q_x (+ m_w·s_x)` per 32-value block;
//! - K-quants (`Q8_K` activations): per 256-value block `(d·d_x)·Σ_g sc_g Σ q_w q_x` minus
//!   `(dmin·d_x)·Σ_g m_g·bsum_g` over its 16-value groups `g` (integer sums, exact);
//! - plain formats: `Σ w·x` in order.

use crate::format::{ActType, Q8_K_BYTES, QK, QK_K, QType, f16_at};
use crate::gemm::Gemm;

use super::dequant::{decode_k, decode32};
use super::{check, check_blocks};
use crate::iq;

/// One activation row as 32-value Q8 blocks.
trait Q8Blocks {
    /// Block `b`: its 32 quants (i8 as bytes), `d` and `s` (`s` meaningful for `Q8_1` only).
    fn block(&self, b: usize) -> (&[u8], f32, f32);
}

/// A row of ggml `Q8_0` or `Q8_1` blocks.
struct GgmlQ8<'a> {
    bytes: &'a [u8],
    act: ActType,
}

impl Q8Blocks for GgmlQ8<'_> {
    fn block(&self, b: usize) -> (&[u8], f32, f32) {
        let size = self.act.type_size();
        let xb = &self.bytes[b * size..(b + 1) * size];
        match self.act {
            ActType::Q8_1 => (&xb[4..], f16_at(xb, 0), f16_at(xb, 2)),
            _ => (&xb[2..], f16_at(xb, 0), 0.0),
        }
    }
}

/// A row of the packed layout: quants, and `[d, s]` of its lane in its group's scales.
struct PackedQ8<'a> {
    qs: &'a [u8],
    sc: &'a [f32],
    lane: usize,
}

impl Q8Blocks for PackedQ8<'_> {
    fn block(&self, b: usize) -> (&[u8], f32, f32) {
        let at = b * 8 + 2 * self.lane;
        (&self.qs[b * QK..(b + 1) * QK], self.sc[at], self.sc[at + 1])
    }
}

/// One activation row as 256-value `Q8_K` blocks.
trait Q8KBlocks {
    /// Block `b`: its 256 quants, `d`, and the sums of each 16 quants.
    fn block(&self, b: usize) -> (&[u8], f32, [i32; 16]);
}

/// A row of ggml `Q8_K` blocks.
struct GgmlQ8K<'a>(&'a [u8]);

impl Q8KBlocks for GgmlQ8K<'_> {
    fn block(&self, b: usize) -> (&[u8], f32, [i32; 16]) {
        let xb = &self.0[b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES];
        let d = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
        let sums = std::array::from_fn(|g| {
            let at = 4 + QK_K + 2 * g;
            i32::from(i16::from_le_bytes([xb[at], xb[at + 1]]))
        });
        (&xb[4..4 + QK_K], d, sums)
    }
}

/// A `Q8_K` row of the packed layout.
struct PackedQ8K<'a> {
    qs: &'a [u8],
    sc: &'a [f32],
    sums: &'a [i16],
    lane: usize,
}

impl Q8KBlocks for PackedQ8K<'_> {
    fn block(&self, b: usize) -> (&[u8], f32, [i32; 16]) {
        let sums = std::array::from_fn(|g| i32::from(self.sums[16 * b + g]));
        let qs = &self.qs[b * QK_K..(b + 1) * QK_K];
        (qs, self.sc[b * 8 + 2 * self.lane], sums)
    }
}

/// A legacy-format weight row (`nb` blocks) · an activation row.
fn dot32(qtype: QType, nb: usize, w: &[u8], x: &impl Q8Blocks) -> f32 {
    let size = qtype.type_size();
    assert!(
        w.len() == nb * size,
        "dot32: {} bytes for {nb} blocks",
        w.len()
    );
    let mut sum = 0.0f32;
    for (b, wb) in w.chunks_exact(size).enumerate() {
        let (xq, dx, sx) = x.block(b);
        let blk = decode32(qtype, wb);
        let sumi: i32 = blk
            .q
            .iter()
            .zip(xq)
            .map(|(&q, &v)| q * i32::from(v as i8))
            .sum();
        sum += match blk.m {
            Some(m) => blk.d * dx * sumi as f32 + m * sx,
            None => blk.d * dx * sumi as f32,
        };
    }
    sum
}

/// A K-quant weight row (`nb` super-blocks) · a `Q8_K` activation row.
fn dot_k(qtype: QType, nb: usize, w: &[u8], x: &impl Q8KBlocks) -> f32 {
    let size = qtype.type_size();
    assert!(
        w.len() == nb * size,
        "dot_k: {} bytes for {nb} blocks",
        w.len()
    );
    let mut sum = 0.0f32;
    for (b, wb) in w.chunks_exact(size).enumerate() {
        let (xq, dx, sums) = x.block(b);
        let blk = decode_k(qtype, wb);
        let mut sumi = 0i32;
        for g in 0..16 {
            let group: i32 = (16 * g..16 * (g + 1))
                .map(|i| blk.q[i] * i32::from(xq[i] as i8))
                .sum();
            sumi += blk.sc[g] * group;
        }
        sum += blk.d * dx * sumi as f32;
        if let Some(dmin) = blk.dmin {
            let summ: i32 = blk.m.iter().zip(&sums).map(|(m, s)| m * s).sum();
            sum -= dmin * dx * summ as f32;
        }
    }
    sum
}

/// A 256-value IQ weight row (`nb` super-blocks) · a `Q8_K` activation row: per super-block the
/// exact integer `Σ_g sc_g Σ q_w q_x`, then `acc += (d·d_x) · sumi` — the float operations of the
/// SIMD kernels (`x86::iq`), so those are bitwise equal to this.
fn dot_iq(qtype: QType, nb: usize, w: &[u8], x: &impl Q8KBlocks) -> f32 {
    let size = qtype.type_size();
    assert!(
        w.len() == nb * size,
        "dot_iq: {} bytes for {nb} blocks",
        w.len()
    );
    let mut sum = 0.0f32;
    for (b, wb) in w.chunks_exact(size).enumerate() {
        let (xq, dx, _) = x.block(b);
        let blk = iq::decode(qtype, wb);
        let mut sumi = 0i32;
        for g in 0..16 {
            let group: i32 = (16 * g..16 * (g + 1))
                .map(|i| i32::from(blk.q[i]) * i32::from(xq[i] as i8))
                .sum();
            sumi += i32::from(blk.sc[g]) * group;
        }
        sum += (blk.d * dx) * sumi as f32;
    }
    sum
}

/// A K-quant or 256-value IQ row · a `Q8_K` row.
fn dot_q8k(qtype: QType, nb: usize, w: &[u8], x: &impl Q8KBlocks) -> f32 {
    if qtype.is_iq() {
        dot_iq(qtype, nb, w, x)
    } else {
        dot_k(qtype, nb, w, x)
    }
}

/// A plain-format weight row (`F32`, `F16`, `BF16` bytes) · `f32` activations, in order.
fn dot_plain(qtype: QType, w: &[u8], x: &[f32]) -> f32 {
    let size = qtype.type_size();
    assert!(
        w.len() == size * x.len(),
        "dot_plain: {} bytes for {} values",
        w.len(),
        x.len()
    );
    let value = |b: &[u8]| match qtype {
        QType::F16 => f16_at(b, 0),
        QType::BF16 => f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16),
        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    };
    w.chunks_exact(size)
        .zip(x)
        .map(|(b, &xv)| value(b) * xv)
        .sum()
}

/// One weight row of `qtype` · one activation row in ggml bytes of `qtype.act_type()`, `k`
/// values: the portable reference of [`crate::vec_dot`].
///
/// # Panics
/// If the lengths do not match `k`.
pub fn vec_dot(qtype: QType, k: usize, w: &[u8], x: &[u8]) -> f32 {
    let act = qtype.act_type();
    let what = "vec_dot";
    let nb = check_blocks(what, k, qtype.block_size(), qtype.type_size(), w.len());
    check_blocks(what, k, act.block_size(), act.type_size(), x.len());
    match act {
        ActType::F32 => {
            let xf: Vec<f32> = x
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            dot_plain(qtype, w, &xf)
        }
        ActType::Q8_K => dot_q8k(qtype, nb, w, &GgmlQ8K(x)),
        ActType::Q8_0 | ActType::Q8_1 => dot32(qtype, nb, w, &GgmlQ8 { bytes: x, act }),
    }
}

/// `Q4_1` weight row · `Q8_1` activation row, `k` values.
///
/// # Panics
/// If the lengths do not match `k`.
pub fn vec_dot_q4_1_q8_1(k: usize, w: &[u8], x: &[u8]) -> f32 {
    check(
        "vec_dot_q4_1_q8_1 (weights)",
        k,
        QType::Q4_1.type_size(),
        w.len(),
    );
    vec_dot(QType::Q4_1, k, w, x)
}

/// `Q8_0` weight row · `Q8_0` activation row, `k` values.
///
/// # Panics
/// If the lengths do not match `k`.
pub fn vec_dot_q8_0_q8_0(k: usize, w: &[u8], x: &[u8]) -> f32 {
    check(
        "vec_dot_q8_0_q8_0 (weights)",
        k,
        QType::Q8_0.type_size(),
        w.len(),
    );
    vec_dot(QType::Q8_0, k, w, x)
}

/// `F32` weight row · `F32` activation row (both little-endian bytes), `k` values.
///
/// # Panics
/// If the lengths do not match `k`.
pub fn vec_dot_f32(k: usize, w: &[u8], x: &[u8]) -> f32 {
    assert!(
        w.len() == 4 * k && x.len() == 4 * k,
        "vec_dot_f32: {} and {} bytes for k = {k}",
        w.len(),
        x.len()
    );
    vec_dot(QType::F32, k, w, x)
}

/// Weight rows `rows` of `g` against all its activation rows: the portable row loop over the
/// packed activations (the `Scalar` backend's matmul).
///
/// # Panics
/// If `rows` lies outside the matrix.
pub(crate) fn gemm_rows(g: &Gemm<'_>, rows: std::ops::Range<usize>) {
    g.check_rows(&rows);
    let nb = g.x.nb();
    for j in rows {
        let w = g.weight_row(j);
        for r in 0..g.m {
            let act = g.qtype.act_type();
            if act == ActType::F32 {
                g.store(r, j, dot_plain(g.qtype, w, g.x.f_row(r)));
                continue;
            }
            let (qs, sc, lane) = (g.x.q_row(r), g.x.sc_group(r / 4), r % 4);
            let v = if act == ActType::Q8_K {
                let sums = g.x.bsums_row(r);
                dot_q8k(g.qtype, nb, w, &PackedQ8K { qs, sc, sums, lane })
            } else {
                dot32(g.qtype, nb, w, &PackedQ8 { qs, sc, lane })
            };
            g.store(r, j, v);
        }
    }
}
