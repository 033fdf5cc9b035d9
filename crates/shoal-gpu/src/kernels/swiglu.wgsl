// SwiGLU's elementwise half: y = silu(a) · b = a / (1 + e^-a) · b over n values (a: the gate
// projection, b: the up projection).
fn run(group: u32, lid: u32) {
    let i = group * WG + lid;
    if (i < params.n) {
        let g = a[i];
        y[i] = g / (1.0 + exp(-g)) * b[i];
    }
}
