// IQ3_S weights, repacked at upload: per 256-value super-block 27 u32: 64 grid index bytes (one
// per 4 values), 8 `qh` bytes (the 9th index bit, one byte per 32 values), 32 sign bytes (one bit
// per value), 4 scale bytes (4-bit ls per 32 values, low nibble first); f16 d per super-block in
// an array of f16 pairs. Value = d · (1 + 2 ls) · iq3s_grid byte · sign.
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    let sb = unit / 8u;
    let ls = (wq[27u * sb + 26u] >> (4u * (unit % 8u))) & 15u;
    return half_at(ws[sb / 2u], sb) * f32(1u + 2u * ls);
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    let w = 27u * (unit / 8u);
    let ib = unit % 8u;
    let lo = (wq[w + 2u * ib + j / 4u] >> (8u * (j % 4u))) & 255u;
    let hi = (wq[w + 16u + ib / 4u] >> (8u * (ib % 4u) + j)) & 1u;
    let signs = wq[w + 18u + ib] >> (4u * j);
    return grid4(tables[T_IQ3S + (lo | (hi << 8u))]) * sign4(signs);
}
