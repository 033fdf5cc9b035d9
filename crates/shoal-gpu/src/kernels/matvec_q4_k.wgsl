// Q4_K weights, repacked at upload: per 256-value super-block its 128 nibble bytes (32 u32:
// sub-block 2i in the low nibbles of words 8i..8i+7, sub-block 2i + 1 in their high nibbles), and
// a 5-u32 scale entry: f16 d and dmin, then the eight 6-bit scales and the eight 6-bit mins
// (decoded at upload), one byte each. Values are d·sc·q - dmin·m per 32-value sub-block.
@group(0) @binding(3) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn block_dot(unit: u32, xb: u32) -> f32 {
    let sb = unit / 8u;
    let sub = unit % 8u;
    let shift = 4u * (sub % 2u);
    let w = 8u * sb + 2u * (sub / 2u);
    let lo = wq[w] >> vec4<u32>(shift);
    let hi = wq[w + 1u] >> vec4<u32>(shift);
    var s = dot(nib4(lo.x), x[xb]) + dot(nib4(lo.y), x[xb + 1u]);
    s += dot(nib4(lo.z), x[xb + 2u]) + dot(nib4(lo.w), x[xb + 3u]);
    s += dot(nib4(hi.x), x[xb + 4u]) + dot(nib4(hi.y), x[xb + 5u]);
    s += dot(nib4(hi.z), x[xb + 6u]) + dot(nib4(hi.w), x[xb + 7u]);
    let e = 5u * sb;
    let dm = unpack2x16float(ws[e]);
    let byte = 8u * (sub % 4u);
    let sc = f32((ws[e + 1u + sub / 4u] >> byte) & 255u);
    let m = f32((ws[e + 3u + sub / 4u] >> byte) & 255u);
    return (dm.x * sc) * s - (dm.y * m) * xsum(xb);
}

fn dequant4(unit: u32, j: u32) -> vec4<f32> {
    let sb = unit / 8u;
    let sub = unit % 8u;
    let q = nib4(wq[8u * sb + 2u * (sub / 2u) + j / 4u][j % 4u] >> (4u * (sub % 2u)));
    let dm = k4_dm(5u * sb, sub);
    return dm.x * q - vec4<f32>(dm.y);
}
