// F16 weights: rows of k4 = ceil(k / 4) groups of four halves (two u32, low half first), zero-padded.
// Converted with unpack2x16float, so no shader-f16 feature is needed.
@group(0) @binding(3) var<storage, read> w: array<vec2<u32>>;

fn w4(row: u32, i: u32) -> vec4<f32> {
    let p = w[row * (params.k / 4u) + i];
    return vec4<f32>(unpack2x16float(p.x), unpack2x16float(p.y));
}
