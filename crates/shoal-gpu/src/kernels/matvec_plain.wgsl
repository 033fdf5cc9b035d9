// The row loop of the plain formats (F32, F16, BF16; appended after matvec.wgsl or matmat.wgsl,
// before one format's file): a row is k / 4 vec4s, which the format's `w4(row, i)` decodes; its
// dot product is with x's vec4s from `xo`.
fn row_dot(row: u32, xo: u32, t: u32, tpr: u32) -> f32 {
    let n4 = params.k / 4u;
    var acc = 0.0;
    for (var i = t; i < n4; i += tpr) {
        acc += dot(w4(row, i), x[xo + i]);
    }
    return acc;
}
