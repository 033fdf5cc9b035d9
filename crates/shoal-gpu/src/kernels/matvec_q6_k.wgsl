// Q6_K weights, repacked at upload: per 256-value super-block its 128 `ql` bytes then 64 `qh`
// bytes (48 u32), and a 5-u32 scale entry: the 16 i8 scales (one per 16 values), then f16 d.
// Value 128h + 32t + l (h < 2, t < 4, l < 32) has low bits from nibble t / 2 of
// ql[64h + 32(t % 2) + l], high bits (qh[32h + l] >> 2t) & 3; value = d · sc · (q - 32), with
// scale 8h + 2t + l / 16. One unit of 32 values is one (h, t).
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

// Four 6-bit quants minus 32 from a `ql` word (nibble at `ls`) and a `qh` word (bits at `hs`).
fn q6x4(ql: u32, ls: u32, qh: u32, hs: u32) -> vec4<f32> {
    let sh = vec4<u32>(0u, 8u, 16u, 24u);
    let lo = (vec4<u32>(ql >> ls) >> sh) & vec4<u32>(15u);
    let hi = (vec4<u32>(qh >> hs) >> sh) & vec4<u32>(3u);
    return vec4<f32>(lo | (hi << vec4<u32>(4u))) - vec4<f32>(32.0);
}

fn block_dot(unit: u32, xb: u32) -> f32 {
    let sb = unit / 8u;
    let h = (unit % 8u) / 4u;
    let t = unit % 4u;
    let ql = 48u * sb + 16u * h + 8u * (t % 2u);
    let qh = 48u * sb + 32u + 8u * h;
    let ls = 4u * (t / 2u);
    let hs = 2u * t;
    var s0 = 0.0;
    var s1 = 0.0;
    for (var j = 0u; j < 4u; j++) {
        s0 += dot(q6x4(wq[ql + j], ls, wq[qh + j], hs), x[xb + j]);
        s1 += dot(q6x4(wq[ql + 4u + j], ls, wq[qh + 4u + j], hs), x[xb + 4u + j]);
    }
    let e = 5u * sb;
    let g = 8u * h + 2u * t;
    let sc = ws[e + g / 4u];
    let byte = 8u * (g % 4u);
    let sc0 = f32(bitcast<i32>(sc << (24u - byte)) >> 24u);
    let sc1 = f32(bitcast<i32>(sc << (16u - byte)) >> 24u);
    let d = unpack2x16float(ws[e + 4u]).x;
    return d * (sc0 * s0 + sc1 * s1);
}

fn dequant4(unit: u32, j: u32) -> vec4<f32> {
    let u = sb_half_quarter(unit);
    let sb = u.x;
    let h = u.y;
    let t = u.z;
    let ql = 48u * sb + 16u * h + 8u * (t % 2u);
    let qh = 48u * sb + 32u + 8u * h;
    let q = q6x4(wq[ql + j], 4u * (t / 2u), wq[qh + j], 2u * t);
    let e = 5u * sb;
    let d = unpack2x16float(ws[e + 4u]).x;
    return (d * sbyte(e, 8u * h + 2u * t + j / 4u)) * q;
}
