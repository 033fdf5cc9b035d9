// Q2_K weights, repacked at upload: per 256-value super-block its 64 `qs` bytes (16 u32, laid
// out as Q3_K's low bits), and a 5-u32 scale entry: f16 d and dmin, then the 16 bytes of 4-bit
// scale (low nibble) and 4-bit min (high nibble), one per 16 values. Value 128h + 32t + l is
// q = (qs[32h + l] >> 2t) & 3, d · sc · q - dmin · m.
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn dequant4(unit: u32, j: u32) -> vec4<f32> {
    let u = sb_half_quarter(unit); // (super-block, h, t)
    let q = bytes4(wq[16u * u.x + 8u * u.y + j], 2u * u.z, 3u);
    let e = 5u * u.x;
    let dm = unpack2x16float(ws[e]);
    let sm = ubyte(e + 1u, 8u * u.y + 2u * u.z + j / 4u);
    return (dm.x * f32(sm & 15u)) * vec4<f32>(q) - vec4<f32>(dm.y * f32(sm >> 4u));
}

fn block_dot(unit: u32, xb: u32) -> f32 {
    return dequant_dot(unit, xb);
}
