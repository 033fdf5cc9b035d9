// IQ4_XS weights, repacked at upload: per 256-value super-block its 128 nibble bytes (16 per 32
// values, as IQ4_NL's blocks: unit u is vec4 u), and a 3-u32 scale entry: f16 d, then the eight
// 6-bit scales minus 32 as i8 (decoded at upload). Value = d · (ls - 32) · kvalues_iq4nl[nibble].
@group(0) @binding(3) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(unit: u32) -> f32 {
    let e = 3u * (unit / 8u);
    return unpack2x16float(ws[e]).x * sbyte(e + 1u, unit % 8u);
}

fn iq4(unit: u32, j: u32) -> vec4<f32> {
    return kv4(T_IQ4NL, wq[unit][j % 4u] >> (4u * (j / 4u)));
}
