// F16 weights: rows of k4 = ceil(k / 4) groups of four halves (two u32, low half first), zero-padded.
// Converted with unpack2x16float, so no shader-f16 feature is needed.
@group(0) @binding(3) var<storage, read> w: array<vec2<u32>>;

fn row_dot(row: u32, t: u32, tpr: u32) -> f32 {
    let n4 = params.k / 4u;
    let base = row * n4;
    var acc = 0.0;
    for (var i = t; i < n4; i += tpr) {
        let p = w[base + i];
        acc += dot(vec4<f32>(unpack2x16float(p.x), unpack2x16float(p.y)), x[i]);
    }
    return acc;
}
