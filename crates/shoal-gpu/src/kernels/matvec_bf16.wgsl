// BF16 weights: as F16 (four halves per vec2<u32>, low half first, zero-padded rows); a bf16 is
// the top half of an f32.
@group(0) @binding(3) var<storage, read> w: array<vec2<u32>>;

fn w4(row: u32, i: u32) -> vec4<f32> {
    let p = w[row * (params.k / 4u) + i];
    let lo = vec2<u32>(p.x << 16u, p.y << 16u);
    let hi = vec2<u32>(p.x, p.y) & vec2<u32>(0xffff0000u);
    return bitcast<vec4<f32>>(vec4<u32>(lo.x, hi.x, lo.y, hi.y));
}
