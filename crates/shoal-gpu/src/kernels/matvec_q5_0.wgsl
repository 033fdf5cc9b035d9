// Q5_0 weights, repacked at upload: per block 5 u32, the 16 nibble bytes (as Q4_0) then the u32
// `qh` whose bit j is the fifth bit of value j; the f16 scales in a separate array of f16 pairs.
// Values are d · (q - 16).
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn block_dot(blk: u32, xb: u32) -> f32 {
    let w = 5u * blk;
    let q = vec4<u32>(wq[w], wq[w + 1u], wq[w + 2u], wq[w + 3u]);
    return half_at(ws[blk / 2u], blk) * (q5_dot(q, wq[w + 4u], xb) - 16.0 * xsum(xb));
}

fn dequant4(blk: u32, j: u32) -> vec4<f32> {
    let w = 5u * blk;
    return half_at(ws[blk / 2u], blk) * (q5x4(wq[w + j % 4u], wq[w + 4u], j) - vec4<f32>(16.0));
}
