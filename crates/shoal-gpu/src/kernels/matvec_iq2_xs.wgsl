// IQ2_XS weights, repacked at upload: per 256-value super-block 18 u32: the 64 `qs` bytes, a u16
// per 8 values (9-bit grid index, 7-bit sign index; words 2i, 2i + 1 for unit i), then the 8
// scale bytes (byte i: 4-bit ls of values 32i .. 32i + 15 low, of the next 16 high); f16 d per
// super-block in an array of f16 pairs. Value = d · (0.5 + ls) / 4 · iq2xs_grid byte · sign.
@group(0) @binding(3) var<storage, read> wq: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    let sb = unit / 8u;
    return half_at(ws[sb / 2u], sb) * 0.25;
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    let w = 18u * (unit / 8u);
    let ib = unit % 8u;
    let q = (wq[w + 2u * ib + j / 4u] >> (16u * ((j / 2u) % 2u))) & 65535u;
    let g = tables[T_IQ2XS + 2u * (q & 511u) + j % 2u];
    let ls = (wq[w + 16u + ib / 4u] >> (8u * (ib % 4u) + 4u * (j / 4u))) & 15u;
    return (0.5 + f32(ls)) * grid4(g) * sign4(ksigns(q >> 9u) >> (4u * (j % 2u)));
}
