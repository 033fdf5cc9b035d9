// IQ1_M weights, repacked at upload: per 256-value super-block 12 u32: 32 grid index bytes (one
// per 8 values), 16 `qh` bytes (a nibble per 8 values: three high index bits, the shift's sign in
// bit 3); its four u16 scale words as a 2-u32 scale entry (3-bit ls per 16 values, and f16 d in
// their top nibbles). Value = d · (2 ls + 1) · (iq1s_grid value ± 1/8).
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    let e = 2u * (unit / 8u);
    let a = ws[e];
    let b = ws[e + 1u];
    let bits = ((a >> 12u) & 0xFu) | ((a >> 24u) & 0xF0u) | ((b >> 4u) & 0xF00u) | ((b >> 16u) & 0xF000u);
    return unpack2x16float(bits).x;
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
    // Scale word ib / 2 (u16), its 3-bit field 2 (ib % 2) + g / 2.
    let sc = (ws[2u * sb + ib / 4u] >> (16u * ((ib / 2u) % 2u))) & 65535u;
    let ls = (sc >> (3u * (2u * (ib % 2u) + g / 2u))) & 7u;
    return f32(2u * ls + 1u) * (i8x4(tables[T_IQ1S + 2u * idx + j % 2u]) + vec4<f32>(delta));
}
