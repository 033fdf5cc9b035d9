// MXFP4 weights, repacked at upload: the 16 nibble bytes of each block as for IQ4_NL, and each
// block's E8M0 exponent byte, four blocks per u32. Value = 2^(e - 128) · (doubled E2M1 value),
// the scale built from bits as ggml's `ggml_e8m0_to_fp32_half` (subnormal below e = 2).
@group(0) @binding(3) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(blk: u32) -> f32 {
    let e = (ws[blk / 4u] >> (8u * (blk % 4u))) & 255u;
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}

fn iq4(blk: u32, j: u32) -> vec4<f32> {
    return kv4(T_MXFP4, wq[blk][j % 4u] >> (4u * (j / 4u)));
}
