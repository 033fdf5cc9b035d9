// Q5_1 weights, repacked at upload: quants as for Q5_0 (5 u32 per block), and per block one u32
// holding f16 d (low half) and f16 m. Values are d · q + m.
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn block_dot(blk: u32, xb: u32) -> f32 {
    let w = 5u * blk;
    let q = vec4<u32>(wq[w], wq[w + 1u], wq[w + 2u], wq[w + 3u]);
    let dm = unpack2x16float(ws[blk]);
    return dm.x * q5_dot(q, wq[w + 4u], xb) + dm.y * xsum(xb);
}

fn dequant4(blk: u32, j: u32) -> vec4<f32> {
    let w = 5u * blk;
    let dm = unpack2x16float(ws[blk]);
    return dm.x * q5x4(wq[w + j % 4u], wq[w + 4u], j) + vec4<f32>(dm.y);
}
