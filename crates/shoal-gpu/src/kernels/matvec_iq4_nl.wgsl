// IQ4_NL weights, repacked at upload as Q4_0's: the 16 nibble bytes of each block as one
// vec4<u32> (low nibbles of word j: values 4j .. 4j + 3, high nibbles: 16 + 4j ..), f16 scales in
// an array of f16 pairs. Value = d · kvalues_iq4nl[nibble].
@group(0) @binding(3) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ws: array<u32>;

fn iq_scale(blk: u32) -> f32 {
    return half_at(ws[blk / 2u], blk);
}

fn iq4(blk: u32, j: u32) -> vec4<f32> {
    return kv4(T_IQ4NL, wq[blk][j % 4u] >> (4u * (j / 4u)));
}
