// IQ3_XXS weights, repacked at upload: per 256-value super-block 24 u32: 64 grid index bytes (one
// per 4 values, words 2i, 2i + 1 for unit i), then per 32 values a u32 of four 7-bit sign indices
// and the 4-bit scale ls on top; f16 d per super-block in an array of f16 pairs.
// Value = d · (0.5 + ls) / 2 · iq3xxs_grid byte · sign.
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    let sb = unit / 8u;
    let aux = wq[24u * sb + 16u + unit % 8u];
    return half_at(ws[sb / 2u], sb) * (0.5 + f32(aux >> 28u)) * 0.5;
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    let w = 24u * (unit / 8u);
    let ib = unit % 8u;
    let idx = (wq[w + 2u * ib + j / 4u] >> (8u * (j % 4u))) & 255u;
    let aux = wq[w + 16u + ib];
    let signs = ksigns(aux >> (7u * (j / 2u))) >> (4u * (j % 2u));
    return grid4(tables[T_IQ3XXS + idx]) * sign4(signs);
}
