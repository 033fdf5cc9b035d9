// Tiled matrix-matrix product for prefill and batches: Y[n][row_offset + r] = X[n, :] · W[r, :]
// for one chunk of a weight matrix, X holding `batch.n` rows of `batch.kx` values.
//
// This file is the frame; matvec_plain.wgsl or matvec_blocks.wgsl and one format's
// matvec_<type>.wgsl are appended to it, as for matvec.wgsl, and give `w4(row, i)`: vec4 `i` of
// weight row `row`, dequantized. A workgroup of WG = TM · TN / 4 threads computes a tile of TM
// weight rows × TN rows of X. For every 32 values of k it dequantizes the tile's weights once
// into workgroup memory (and copies the X rows there), then each thread adds 4 X rows × 1 weight
// row from it. No subgroup operations, so no subgroup width is assumed.

override TM: u32 = 32u;  // weight rows per tile
override TN: u32 = 16u;  // rows of X per tile (a multiple of 4)
override WG: u32 = 128u; // TM * TN / 4, set by the host

const TK: u32 = 8u;          // vec4s of k per step: 32 values, one block unit
const MAX_TILE: u32 = 512u;  // vec4s of each tile in workgroup memory (TM, TN ≤ 64)

struct Params {
    rows: u32,        // rows in this chunk
    k: u32,           // values per weight row (padded to 4 for the plain formats)
    row_offset: u32,  // this chunk's first row among Y's columns
    _pad: u32,
}

struct Batch {
    n: u32,   // rows of X and Y
    m: u32,   // values per row of Y (the whole matrix's rows)
    kx: u32,  // values per row of X (the matrix's columns, unpadded)
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> batch: Batch;
// The matrix-vector kernels' input, which their `row_dot`/`block_dot` name; never used here.
@group(0) @binding(6) var<storage, read> x: array<vec4<f32>>;

var<workgroup> wt: array<vec4<f32>, MAX_TILE>;
var<workgroup> xt: array<vec4<f32>, MAX_TILE>;

// Values 4c .. 4c + 3 of row `n` of X (zero past its end).
fn x4(n: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) {
        let i = 4u * c + e;
        if (i < batch.kx) {
            v[e] = xs[n * batch.kx + i];
        }
    }
    return v;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r0 = wid.x * TM;
    let n0 = wid.y * TN;
    let tm = lid % TM;
    let tq = lid / TM;
    let k4 = params.k / 4u;
    var acc = vec4<f32>(0.0);
    for (var kk = 0u; kk < k4; kk += TK) {
        for (var i = lid; i < TM * TK; i += WG) {
            let r = r0 + i / TK;
            let c = kk + i % TK;
            var v = vec4<f32>(0.0);
            if (r < params.rows && c < k4) {
                v = w4(r, c);
            }
            wt[i] = v;
        }
        for (var i = lid; i < TN * TK; i += WG) {
            let n = n0 + i / TK;
            var v = vec4<f32>(0.0);
            if (n < batch.n) {
                v = x4(n, kk + i % TK);
            }
            xt[i] = v;
        }
        workgroupBarrier();
        let xb = 4u * tq * TK;
        for (var c = 0u; c < TK; c++) {
            let wv = wt[tm * TK + c];
            acc += vec4<f32>(
                dot(wv, xt[xb + c]),
                dot(wv, xt[xb + TK + c]),
                dot(wv, xt[xb + 2u * TK + c]),
                dot(wv, xt[xb + 3u * TK + c]),
            );
        }
        workgroupBarrier();
    }
    let r = r0 + tm;
    if (r < params.rows) {
        for (var e = 0u; e < 4u; e++) {
            let n = n0 + 4u * tq + e;
            if (n < batch.n) {
                y[n * batch.m + params.row_offset + r] = acc[e];
            }
        }
    }
}
