// Q4_0 weights, repacked at upload: the 16 quant bytes of each block as one vec4<u32> (ggml's
// order: byte j holds element j in its low nibble and element j + 16 in its high nibble, so the
// low nibbles of word j are elements 4j..4j+3 and its high nibbles 16+4j..16+4j+3), and the
// blocks' f16 scales in a separate array of f16 pairs. Values are d · (q - 8).
@group(0) @binding(3) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

// The low nibbles of the four bytes of `v`, minus 8.
fn q4x4(v: u32) -> vec4<f32> {
    let q = vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u);
    return vec4<f32>(q) - vec4<f32>(8.0);
}

fn row_dot(row: u32, t: u32, tpr: u32) -> f32 {
    let nb = params.k / 32u;
    var acc = 0.0;
    for (var b = t; b < nb; b += tpr) {
        let blk = row * nb + b;
        let q = wq[blk];
        let xb = 8u * b;
        var s = dot(q4x4(q.x), x[xb]) + dot(q4x4(q.y), x[xb + 1u]);
        s += dot(q4x4(q.z), x[xb + 2u]) + dot(q4x4(q.w), x[xb + 3u]);
        s += dot(q4x4(q.x >> 4u), x[xb + 4u]) + dot(q4x4(q.y >> 4u), x[xb + 5u]);
        s += dot(q4x4(q.z >> 4u), x[xb + 6u]) + dot(q4x4(q.w >> 4u), x[xb + 7u]);
        acc += half_at(ws[blk / 2u], blk) * s;
    }
    return acc;
}
