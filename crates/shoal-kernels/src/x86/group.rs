//! The loop every 16-row-group kernel of the AVX-512 VNNI backend shares (`avx512`: `Q4_1`,
//! `Q8_0`; `k512`: `Q4_K`, `Q5_K`; `k6512`: `Q6_K`): each weight group against the activation
//! rows in tiles, and the prefetch of the weight stream ahead of a group block.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::format::GROUP;
use crate::gemm::Gemm;

/// How far ahead in the weight stream to prefetch (bytes); as in the 256-bit kernels.
const PREFETCH_BYTES: usize = 4096;

/// Runs `tile(w, grp, r, t)` for every 16-row weight group `grp` of `rows` (`w` its first block
/// of `group_bytes`) and every tile of `t` ≤ `max` activation rows from row `r`.
#[inline(always)]
pub(super) fn for_each_tile(
    g: &Gemm<'_>,
    rows: Range<usize>,
    group_bytes: usize,
    max: usize,
    mut tile: impl FnMut(*const u8, usize, usize, usize),
) {
    let nb = g.x.nb();
    for grp in rows.start / GROUP..rows.end.div_ceil(GROUP) {
        let w = g.w[grp * nb * group_bytes..].as_ptr();
        let mut r = 0;
        while r < g.m {
            let t = (g.m - r).min(max);
            tile(w, grp, r, t);
            r += t;
        }
    }
}

/// Prefetches the `bytes` of a group block [`PREFETCH_BYTES`] past `wb` (touches no memory).
#[inline(always)]
pub(super) unsafe fn prefetch_group(wb: *const u8, bytes: usize) {
    let mut o = 0;
    while o < bytes {
        // SAFETY: prefetching touches no memory.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH_BYTES + o).cast()) };
        o += 64;
    }
}
