// IQ4_XS weights, repacked at upload: per 256-value super-block its 128 nibble bytes (16 per 32
// values, as IQ4_NL's blocks: unit u is vec4 u), and its first 8 bytes as a 2-u32 scale entry:
// f16 d and u16 scales_h (2 high bits per 32 values), then scales_l (a low nibble per 32 values).
// Value = d · (ls - 32) · kvalues_iq4nl[nibble], ls the 6-bit scale of the 32 values.
@group(0) @binding(3) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    let e = 2u * (unit / 8u);
    let ib = unit % 8u;
    let lo = (ws[e + 1u] >> (4u * ib)) & 15u;
    let hi = (ws[e] >> (16u + 2u * ib)) & 3u;
    return unpack2x16float(ws[e]).x * f32(i32(lo | (hi << 4u)) - 32);
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    return kv4(T_IQ4NL, wq[unit][j % 4u] >> (4u * (j / 4u)));
}
