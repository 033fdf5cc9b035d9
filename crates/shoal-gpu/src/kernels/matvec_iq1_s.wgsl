// IQ1_S weights, repacked at upload: per 256-value super-block 12 u32: 32 grid index bytes (one
// per 8 values, word i for unit i), then per 32 values a u16 `qh`: three high index bits per 8
// values, the 3-bit scale ls, and the sign of the shift in bit 15; f16 d per super-block in an
// array of f16 pairs. Value = d · (2 ls + 1) · (iq1s_grid value ± 1/8), grid values in -1..=1.
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

// The `qh` word of a unit.
fn iq1s_qh(unit: u32) -> u32 {
    return (wq[12u * (unit / 8u) + 8u + (unit % 8u) / 2u] >> (16u * (unit % 2u))) & 65535u;
}

fn iq_scale(unit: u32) -> f32 {
    let sb = unit / 8u;
    return half_at(ws[sb / 2u], sb) * f32(2u * ((iq1s_qh(unit) >> 12u) & 7u) + 1u);
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    let qh = iq1s_qh(unit);
    let l = j / 2u;
    let lo = (wq[12u * (unit / 8u) + unit % 8u] >> (8u * l)) & 255u;
    let idx = lo | (((qh >> (3u * l)) & 7u) << 8u);
    let delta = select(0.125, -0.125, (qh & 0x8000u) != 0u);
    return i8x4(tables[T_IQ1S + 2u * idx + j % 2u]) + vec4<f32>(delta);
}
