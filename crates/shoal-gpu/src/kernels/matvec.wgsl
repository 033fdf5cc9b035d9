// Matrix-vector product for one chunk of a weight matrix (decode): each output is one weight row's
// dot product with a row of x.
//
// This file is the shared frame (after reduce.wgsl); one row locator (matvec_direct.wgsl: y[row_offset
// + r] = W[r, :] · x; or matvec_id.wgsl: per (token, slot) the rows of the expert an id buffer names),
// matvec_plain.wgsl or matvec_blocks.wgsl (the row loop) and one format's matvec_<type>.wgsl are
// appended to it. A workgroup of WG threads computes ROWS rows: each row gets WG / ROWS threads (a
// power of two) that stride over its vec4s or 32-value blocks, and their partial sums are added
// with `group_sum`.
//
// x is read as vec4s: the host pads every vector and every weight row to a multiple of 4 values
// with zeros. Rows the locator rejects (past the chunk's end, another chunk's expert) still take
// part in the barriers and write nothing.

override WG: u32 = 64u;
override ROWS: u32 = 4u;

// One output of a workgroup's thread group, from `locate`: whether it is computed here, the weight
// row (in the chunk), the first vec4 of its x row, its index in y, and a value added to it (a bias).
struct Row {
    ok: bool,
    row: u32,
    x: u32,
    out: u32,
    add: f32,
}

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
    let at = locate(wid.x + wid.y * nwg.x, lid / tpr);
    var acc = 0.0;
    if (at.ok) {
        acc = row_dot(at.row, at.x, t, tpr);
    }
    let sum = group_sum(lid, tpr, acc);
    if (t == 0u && at.ok) {
        y[at.out] = sum + at.add;
    }
}
