// One row of an embedding table (a weight matrix repacked as for the matrix-vector kernels)
// dequantized to f32: y[i] = scale · W[row, i], for every weight format. This frame (after
// grid.wgsl) is followed, as matvec.wgsl is, by matvec_plain.wgsl or matvec_blocks.wgsl and the
// format's file, whose `w4(row, i)` gives vec4 i of a row; one thread per vec4.

struct Params {
    row: u32,   // row within the chunk
    k: u32,     // values per row (padded to 4 for F32/F16/BF16)
    n: u32,     // values to write
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
// The matrix-vector kernels' input, which their `row_dot`/`block_dot` name; never used here.
@group(0) @binding(6) var<storage, read> x: array<vec4<f32>>;

fn run(i: u32) {
    if (4u * i >= params.n) {
        return;
    }
    let v = w4(params.row, i);
    for (var e = 0u; e < 4u; e++) {
        if (4u * i + e < params.n) {
            y[4u * i + e] = params.scale * v[e];
        }
    }
}
