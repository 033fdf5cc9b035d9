// One row of an embedding table (a weight matrix repacked as for the matrix-vector kernels)
// dequantized to f32: y[i] = scale · W[row, i]. FORMAT picks the layout: 0 F32, 1 F16, 2 Q8_0,
// 3 Q4_0 (see matrix.rs). `ws` is the scale array (for F32/F16 the weights are bound again).
override FORMAT: u32 = 0u;

struct Params {
    row: u32,   // row within the chunk
    k: u32,     // values per row (padded to 4 for F32/F16)
    n: u32,     // values to write
    scale: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> ws: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

fn value(i: u32) -> f32 {
    let e = params.row * params.k + i;
    if (FORMAT == 0u) {
        return bitcast<f32>(w[e]);
    }
    if (FORMAT == 1u) {
        let p = unpack2x16float(w[e / 2u]);
        return select(p.x, p.y, (e & 1u) == 1u);
    }
    let blk = e / 32u;
    let j = e % 32u;
    let sp = unpack2x16float(ws[blk / 2u]);
    let d = select(sp.x, sp.y, (blk & 1u) == 1u);
    if (FORMAT == 2u) {
        let b = (w[8u * blk + j / 4u] >> (8u * (j % 4u))) & 255u;
        return d * f32(bitcast<i32>(b << 24u) >> 24u);
    }
    let byte = (w[4u * blk + (j % 16u) / 4u] >> (8u * (j % 4u))) & 255u;
    let q = select(byte & 15u, byte >> 4u, j >= 16u);
    return d * (f32(q) - 8.0);
}

fn run(i: u32) {
    if (i < params.n) {
        y[i] = params.scale * value(i);
    }
}
