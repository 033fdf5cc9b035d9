// Q4_0 weights, repacked at upload: the 16 quant bytes of each block as one vec4<u32> (ggml's
// order: byte j holds element j in its low nibble and element j + 16 in its high nibble, so the
// low nibbles of word j are elements 4j..4j+3 and its high nibbles 16+4j..16+4j+3), and the
// blocks' f16 scales in a separate array of f16 pairs. Values are d · (q - 8).
@group(0) @binding(3) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn block_dot(blk: u32, xb: u32) -> f32 {
    let q = wq[blk];
    let m8 = vec4<f32>(8.0);
    var s = dot(nib4(q.x) - m8, x[xb]) + dot(nib4(q.y) - m8, x[xb + 1u]);
    s += dot(nib4(q.z) - m8, x[xb + 2u]) + dot(nib4(q.w) - m8, x[xb + 3u]);
    s += dot(nib4(q.x >> 4u) - m8, x[xb + 4u]) + dot(nib4(q.y >> 4u) - m8, x[xb + 5u]);
    s += dot(nib4(q.z >> 4u) - m8, x[xb + 6u]) + dot(nib4(q.w >> 4u) - m8, x[xb + 7u]);
    return half_at(ws[blk / 2u], blk) * s;
}

fn dequant4(blk: u32, j: u32) -> vec4<f32> {
    let q = nib4(wq[blk][j % 4u] >> (4u * (j / 4u)));
    return half_at(ws[blk / 2u], blk) * (q - vec4<f32>(8.0));
}
