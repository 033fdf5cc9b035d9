// IQ2_XS weights, repacked at upload: per 256-value super-block its 64 `qs` bytes, a u16 per 8
// values (9-bit grid index, 7-bit sign index), two u32 per 32 values (unit u is vec2 u); a 3-u32
// scale entry: f16 d, then the 8 scale bytes as in the file (byte i: 4-bit ls of values
// 32i .. 32i + 15 low, of the next 16 high). Value = d · (0.5 + ls) / 4 · iq2xs_grid byte · sign.
@group(0) @binding(3) var<storage, read> wq: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    return unpack2x16float(ws[3u * (unit / 8u)]).x * 0.25;
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    let q = (wq[unit][j / 4u] >> (16u * ((j / 2u) % 2u))) & 65535u;
    let g = tables[T_IQ2XS + 2u * (q & 511u) + j % 2u];
    let ls = (ubyte(3u * (unit / 8u) + 1u, unit % 8u) >> (4u * (j / 4u))) & 15u;
    return (0.5 + f32(ls)) * grid4(g) * sign4(ksigns(q >> 9u) >> (4u * (j % 2u)));
}
