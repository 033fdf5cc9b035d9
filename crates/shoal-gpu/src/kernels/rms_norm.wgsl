// RMS norm of `rows` rows of width n: y = a / sqrt(mean(a²) + eps) · b (b: the norm's weights).
// One workgroup per row; the sum of squares is taken in f32 (the CPU path sums in f64) with
// `group_sum` (reduce.wgsl).
fn run(row: u32, lid: u32) {
    if (row >= params.rows) {
        return;
    }
    let base = row * params.n;
    var acc = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = a[base + i];
        acc += v * v;
    }
    let scale = 1.0 / sqrt(group_sum(lid, WG, acc) / f32(params.n) + params.eps);
    for (var i = lid; i < params.n; i += WG) {
        y[base + i] = (a[base + i] * scale) * b[i];
    }
}
