// The plain matrix-vector product's row locator (after matvec.wgsl): workgroup `group`'s rows
// group · ROWS .. + ROWS of the chunk, each the dot product with all of x, into y[row_offset + r].

struct Params {
    rows: u32,        // rows in this chunk
    k: u32,           // values per row (a multiple of 4 after padding for F32/F16, of 32 for quants)
    row_offset: u32,  // index in y of this chunk's first row
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;

fn locate(group: u32, r: u32) -> Row {
    let row = group * ROWS + r;
    return Row(row < params.rows, row, 0u, params.row_offset + row, 0.0);
}
