// Q8_0 weights, repacked at upload: the 32 signed quants of each block as two vec4<u32> (four
// quants per u32, element 4j + b in byte b of word j), and the blocks' f16 scales in a separate
// array of f16 pairs. Block index = row · (k / 32) + block.
@group(0) @binding(3) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn block_dot(blk: u32, xb: u32) -> f32 {
    let lo = wq[2u * blk];
    let hi = wq[2u * blk + 1u];
    var s = dot(i8x4(lo.x), x[xb]) + dot(i8x4(lo.y), x[xb + 1u]);
    s += dot(i8x4(lo.z), x[xb + 2u]) + dot(i8x4(lo.w), x[xb + 3u]);
    s += dot(i8x4(hi.x), x[xb + 4u]) + dot(i8x4(hi.y), x[xb + 5u]);
    s += dot(i8x4(hi.z), x[xb + 6u]) + dot(i8x4(hi.w), x[xb + 7u]);
    return half_at(ws[blk / 2u], blk) * s;
}

fn dequant4(blk: u32, j: u32) -> vec4<f32> {
    return half_at(ws[blk / 2u], blk) * i8x4(wq[2u * blk + j / 4u][j % 4u]);
}
