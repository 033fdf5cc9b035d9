// Matrix-vector product y[row_offset + r] = W[r, :] · x for one chunk of a weight matrix (decode).
//
// This file is the shared frame (after reduce.wgsl); matvec_plain.wgsl or matvec_blocks.wgsl (the row
// loop) and one format's matvec_<type>.wgsl are appended to it. A workgroup of WG threads computes
// ROWS rows: each row gets WG / ROWS threads (a power of two) that stride over its vec4s or
// 32-value blocks, and their partial sums are added with `group_sum`.
//
// x is read as vec4s: the host pads every vector and every weight row to a multiple of 4 values
// with zeros. Rows past the chunk's end still take part in the barriers and write nothing.

override WG: u32 = 64u;
override ROWS: u32 = 4u;

struct Params {
    rows: u32,        // rows in this chunk
    k: u32,           // values per row (a multiple of 4 after padding for F32/F16, of 32 for quants)
    row_offset: u32,  // index in y of this chunk's first row
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let tpr = WG / ROWS;
    let t = lid % tpr;
    let row = (wid.x + wid.y * nwg.x) * ROWS + lid / tpr;
    var acc = 0.0;
    if (row < params.rows) {
        acc = row_dot(row, t, tpr);
    }
    let sum = group_sum(lid, tpr, acc);
    if (t == 0u && row < params.rows) {
        y[params.row_offset + row] = sum;
    }
}
