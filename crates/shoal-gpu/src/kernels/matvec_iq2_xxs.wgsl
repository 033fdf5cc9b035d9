// IQ2_XXS weights, repacked at upload: per 256-value super-block its 64 `qs` bytes, two u32 per
// 32 values (unit u is vec2 u): four grid indices (one byte per 8 values), then four 7-bit sign
// indices and the 4-bit scale ls in the top bits; f16 d per super-block in an array of f16 pairs.
// Value = d · (0.5 + ls) / 4 · iq2xxs_grid byte · sign.
@group(0) @binding(3) var<storage, read> wq: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    let sb = unit / 8u;
    return half_at(ws[sb / 2u], sb) * (0.5 + f32(wq[unit].y >> 28u)) * 0.25;
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    let q = wq[unit];
    let l = j / 2u;
    let h = j % 2u;
    let g = tables[T_IQ2XXS + 2u * ((q.x >> (8u * l)) & 255u) + h];
    return grid4(g) * sign4(ksigns(q.y >> (7u * l)) >> (4u * h));
}
