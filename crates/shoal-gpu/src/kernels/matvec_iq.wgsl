// The IQ formats and MXFP4 (appended after matvec_blocks.wgsl and the generated table offsets
// `T_*`, before one format's file). Their lookup tables (src/iq.rs) are one buffer of u32 words:
// table values as i32, 8-value grid rows as two words, 4-value grid rows as one word, each value
// a byte. A format defines `iq_scale(unit)` (the factor common to a 32-value unit) and
// `iq4(unit, j)` (the unit's values 4j .. 4j + 3 without it); `block_dot` and `dequant4` follow.
@group(0) @binding(7) var<storage, read> tables: array<u32>;

fn block_dot(unit: u32, xb: u32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < 8u; j++) {
        s += dot(iq4(unit, j), x[xb + j]);
    }
    return iq_scale(unit) * s;
}

fn dequant4(unit: u32, j: u32) -> vec4<f32> {
    return iq_scale(unit) * iq4(unit, j);
}

// The table values (table `base`, i32 per word) of the low nibbles of the four bytes of `v`.
fn kv4(base: u32, v: u32) -> vec4<f32> {
    let n = bytes4(v, 0u, 15u) + vec4<u32>(base);
    return vec4<f32>(vec4<i32>(
        bitcast<i32>(tables[n.x]),
        bitcast<i32>(tables[n.y]),
        bitcast<i32>(tables[n.z]),
        bitcast<i32>(tables[n.w]),
    ));
}

// The four unsigned byte values of grid word `w`.
fn grid4(w: u32) -> vec4<f32> {
    return vec4<f32>(bytes4(w, 0u, 255u));
}

// ±1 for bits 0 .. 3 of `s` (a set bit negates).
fn sign4(s: u32) -> vec4<f32> {
    return vec4<f32>(1.0) - 2.0 * vec4<f32>((vec4<u32>(s) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
}

// The eight sign bits of 7-bit index `i` of `ksigns` (the 8th the parity of the seven).
fn ksigns(i: u32) -> u32 {
    return tables[T_KSIGNS + (i & 127u)];
}
