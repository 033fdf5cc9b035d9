// Q4_1 weights, repacked at upload: nibbles as for Q4_0 (one vec4<u32> per block), and per block
// one u32 holding f16 d (low half) and f16 m. Values are d · q + m.
@group(0) @binding(3) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn block_dot(blk: u32, xb: u32) -> f32 {
    let dm = unpack2x16float(ws[blk]);
    return dm.x * nib_dot(wq[blk], xb) + dm.y * xsum(xb);
}

fn dequant4(blk: u32, j: u32) -> vec4<f32> {
    let dm = unpack2x16float(ws[blk]);
    return dm.x * nib4(wq[blk][j % 4u] >> (4u * (j / 4u))) + vec4<f32>(dm.y);
}
