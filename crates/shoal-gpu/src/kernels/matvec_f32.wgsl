// F32 weights: rows of k4 = ceil(k / 4) vec4s, zero-padded.
@group(0) @binding(3) var<storage, read> w: array<vec4<f32>>;

fn w4(row: u32, i: u32) -> vec4<f32> {
    return w[row * (params.k / 4u) + i];
}
