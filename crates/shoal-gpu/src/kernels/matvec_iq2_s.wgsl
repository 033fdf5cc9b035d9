// IQ2_S weights, repacked at upload: per 256-value super-block 20 u32: 32 grid index bytes (one
// per 8 values), 32 sign bytes (one bit per value), 8 `qh` bytes (2 high index bits per 8
// values), 8 scale bytes as IQ2_XS's; f16 d per super-block in an array of f16 pairs.
// Value = d · (0.5 + ls) / 4 · iq2s_grid byte · sign.
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    let sb = unit / 8u;
    return half_at(ws[sb / 2u], sb) * 0.25;
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    let ib = unit % 8u;
    let g8 = j / 2u; // 8 values of the unit's four
    let w = 20u * (unit / 8u);
    let lo = (wq[w + ib] >> (8u * g8)) & 255u;
    let hi = (wq[w + 16u + ib / 4u] >> (8u * (ib % 4u) + 2u * g8)) & 3u;
    let g = tables[T_IQ2S + 2u * (lo | (hi << 8u)) + j % 2u];
    let signs = wq[w + 8u + ib] >> (8u * g8 + 4u * (j % 2u));
    let ls = (wq[w + 18u + ib / 4u] >> (8u * (ib % 4u) + 4u * (j / 4u))) & 15u;
    return (0.5 + f32(ls)) * grid4(g) * sign4(signs);
}
