// F32 weights: rows of k4 = ceil(k / 4) vec4s, zero-padded.
@group(0) @binding(3) var<storage, read> w: array<vec4<f32>>;

fn row_dot(row: u32, t: u32, tpr: u32) -> f32 {
    let n4 = params.k / 4u;
    let base = row * n4;
    var acc = 0.0;
    for (var i = t; i < n4; i += tpr) {
        acc += dot(w[base + i], x[i]);
    }
    return acc;
}
