// Residual add: y = a + b over n values.
fn run(group: u32, lid: u32) {
    let i = group * WG + lid;
    if (i < params.n) {
        y[i] = a[i] + b[i];
    }
}
