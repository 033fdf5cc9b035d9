// The id-indexed matrix-vector product's row locator (after matvec.wgsl; mixture-of-experts layers):
// the weight matrix is `experts` stacked `per × k` matrices, chunked at expert boundaries. Pair p
// (a token's slot) multiplies the expert ids[p] names with x row p / x_div (x_div = the slots per
// token when every slot reads its token's row, 1 when each pair has its own row), into
// y[p · per + r], plus that expert's bias row when has_bias. Workgroups run over (pair, row group):
// `groups` row groups per pair; a pair whose expert lies in another chunk writes nothing here.

struct Params {
    rows: u32,      // rows in this chunk (whole experts)
    k: u32,         // values per row (padded as for matvec_direct.wgsl)
    first: u32,     // the chunk's first row in the stacked matrix
    per: u32,       // rows per expert
    groups: u32,    // workgroups per pair: ceil(per / ROWS)
    pairs: u32,     // (token, slot) pairs: the ids
    x_div: u32,     // pairs per x row
    has_bias: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read> ids: array<u32>;
@group(0) @binding(6) var<storage, read> bias: array<f32>;

fn locate(group: u32, r: u32) -> Row {
    let p = group / params.groups;
    let rr = (group % params.groups) * ROWS + r;
    var at = Row(false, 0u, 0u, 0u, 0.0);
    if (p >= params.pairs || rr >= params.per) {
        return at;
    }
    let g = ids[p] * params.per + rr;
    if (g < params.first || g >= params.first + params.rows) {
        return at;
    }
    at.ok = true;
    at.row = g - params.first;
    at.x = (p / params.x_div) * (params.k / 4u);
    at.out = p * params.per + rr;
    if (params.has_bias != 0u) {
        at.add = bias[g];
    }
    return at;
}
