// IQ1_M weights, repacked at upload: per 256-value super-block 12 u32: 32 grid index bytes (one
// per 8 values), 16 `qh` bytes (a nibble per 8 values: three high index bits, the shift's sign in
// bit 3); a 3-u32 scale entry: f16 d (gathered at upload), then the four u16 scale words (3-bit
// ls per 16 values). Value = d · (2 ls + 1) · (iq1s_grid value ± 1/8).
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    return unpack2x16float(ws[3u * (unit / 8u)]).x;
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    let sb = unit / 8u;
    let ib = unit % 8u;
    let g = j / 2u; // 8 values of the unit's four
    let w = 12u * sb;
    let lo = (wq[w + ib] >> (8u * g)) & 255u;
    let nib = (wq[w + 8u + ib / 2u] >> (16u * (ib % 2u) + 4u * g)) & 15u;
    let idx = lo | ((nib & 7u) << 8u);
    let delta = select(0.125, -0.125, (nib & 8u) != 0u);
    // Scale word ib / 2 (u16), its 3-bit field (2 (ib % 2) + g / 2).
    let sc = (ws[3u * sb + 1u + ib / 4u] >> (16u * ((ib / 2u) % 2u))) & 65535u;
    let ls = (sc >> (3u * (2u * (ib % 2u) + g / 2u))) & 7u;
    return f32(2u * ls + 1u) * (i8x4(tables[T_IQ1S + 2u * idx + j % 2u]) + vec4<f32>(delta));
}
