// y = a + b over n values (the residual add), or with BCAST = 1 y = a + b[i % rows]: a bias of
// `rows` values (the Params field) added to every row of a.
override BCAST: u32 = 0u;

fn run(group: u32, lid: u32) {
    let i = group * WG + lid;
    if (i < params.n) {
        y[i] = a[i] + b[select(i, i % params.rows, BCAST != 0u)];
    }
}
