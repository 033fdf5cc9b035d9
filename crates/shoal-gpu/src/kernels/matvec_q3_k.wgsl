// Q3_K weights, repacked at upload: per 256-value super-block its 64 `qs` bytes then its 32
// `hmask` bytes (24 u32), and a 5-u32 scale entry: the sixteen scales (one per 16 values, decoded
// from 6 bits at upload, minus 32, as i8), then f16 d. Value 128h + 32t + l has low bits
// (qs[32h + l] >> 2t) & 3 and high bit (hmask[l] >> (4h + t)) & 1; value = d · sc · (q - 4)
// with q including the high bit. One unit of 32 values is one (h, t).
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn dequant4(unit: u32, j: u32) -> vec4<f32> {
    let u = sb_half_quarter(unit); // (super-block, h, t)
    let lo = bytes4(wq[24u * u.x + 8u * u.y + j], 2u * u.z, 3u);
    let hi = bytes4(wq[24u * u.x + 16u + j], 4u * u.y + u.z, 1u);
    let e = 5u * u.x;
    let d = unpack2x16float(ws[e + 4u]).x;
    return (d * sbyte(e, 8u * u.y + 2u * u.z + j / 4u)) * (vec4<f32>(lo | (hi << vec4<u32>(2u))) - vec4<f32>(4.0));
}

fn block_dot(unit: u32, xb: u32) -> f32 {
    return dequant_dot(unit, xb);
}
