// Copies `rows` rows of `cols` values: dst[dst_off + r·dst_stride + c] = src[src_off + r·src_stride + c]
// (splitting a fused QKV or gate|up product, picking the rows that want logits).

struct Params {
    rows: u32,
    cols: u32,
    src_off: u32,
    src_stride: u32,
    dst_off: u32,
    dst_stride: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

fn run(i: u32) {
    if (i < params.rows * params.cols) {
        let r = i / params.cols;
        let c = i % params.cols;
        dst[params.dst_off + r * params.dst_stride + c] = src[params.src_off + r * params.src_stride + c];
    }
}
