// The row loop of the block formats (appended after matvec.wgsl or matmat.wgsl, before one
// format's file): a row is k / 32 units of 32 values (a legacy block, or one eighth of a K-quant
// super-block); the row's threads stride over its units and the format's `block_dot(unit, xb)`
// gives one unit's dot product with x[xb .. xb + 8] (vec4s). `unit` counts from the chunk's
// first row, so a K-quant super-block is units 8s .. 8s + 7; `row_dot` takes x's vec4s from `xo`.
// Each format also defines `dequant4(unit, j)`: the unit's values 4j .. 4j + 3 dequantized (what
// matmat.wgsl tiles).
fn row_dot(row: u32, xo: u32, t: u32, tpr: u32) -> f32 {
    let nb = params.k / 32u;
    var acc = 0.0;
    for (var b = t; b < nb; b += tpr) {
        acc += block_dot(row * nb + b, xo + 8u * b);
    }
    return acc;
}

// The low nibbles of the four bytes of `v`.
fn nib4(v: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u));
}

// The sum of the 32 values of x from vec4 `xb`.
fn xsum(xb: u32) -> f32 {
    let one = vec4<f32>(1.0);
    var s = dot(x[xb] + x[xb + 1u], one) + dot(x[xb + 2u] + x[xb + 3u], one);
    s += dot(x[xb + 4u] + x[xb + 5u], one) + dot(x[xb + 6u] + x[xb + 7u], one);
    return s;
}

// Σ q·x over a legacy 4-bit block's 32 values (no offset): words q.x..q.w hold values 0..15 in
// their low nibbles and 16..31 in their high nibbles (ggml's order), each word four values.
fn nib_dot(q: vec4<u32>, xb: u32) -> f32 {
    var s = dot(nib4(q.x), x[xb]) + dot(nib4(q.y), x[xb + 1u]);
    s += dot(nib4(q.z), x[xb + 2u]) + dot(nib4(q.w), x[xb + 3u]);
    s += dot(nib4(q.x >> 4u), x[xb + 4u]) + dot(nib4(q.y >> 4u), x[xb + 5u]);
    s += dot(nib4(q.z >> 4u), x[xb + 6u]) + dot(nib4(q.w >> 4u), x[xb + 7u]);
    return s;
}

// Bits `e .. e + 3` of `qh` as the fifth bit (0 or 16) of four values.
fn bit4(qh: u32, e: u32) -> vec4<f32> {
    let b = (vec4<u32>(qh) >> (vec4<u32>(e) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
    return vec4<f32>(b * 16u);
}

// Σ q·x over a 5-bit block: `nib_dot` plus the fifth bits from `qh` (bit j for value j).
fn q5_dot(q: vec4<u32>, qh: u32, xb: u32) -> f32 {
    var s = nib_dot(q, xb);
    for (var j = 0u; j < 8u; j++) {
        s += dot(bit4(qh, 4u * j), x[xb + j]);
    }
    return s;
}

// Values 4j .. 4j + 3 of a 5-bit block: nibbles from quant word `lo` (word j % 4), fifth bits
// from `qh`.
fn q5x4(lo: u32, qh: u32, j: u32) -> vec4<f32> {
    return nib4(lo >> (4u * (j / 4u))) + bit4(qh, 4u * j);
}

// Vec4 `i` of weight row `row`, dequantized (the plain formats define their own `w4`).
fn w4(row: u32, i: u32) -> vec4<f32> {
    return dequant4(row * (params.k / 32u) + i / 8u, i % 8u);
}

// One unit's dot product with x through `dequant4` (for the formats with no faster `block_dot`).
fn dequant_dot(unit: u32, xb: u32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < 8u; j++) {
        s += dot(dequant4(unit, j), x[xb + j]);
    }
    return s;
}

// The f16 scale of block `i`, from an array of f16 pairs (low half first).
fn half_at(pairs: u32, i: u32) -> f32 {
    let p = unpack2x16float(pairs);
    return select(p.x, p.y, (i & 1u) == 1u);
}

// Byte `b` of the four u32 from scale entry word `e`, unsigned.
fn ubyte(e: u32, b: u32) -> u32 {
    return (ws[e + b / 4u] >> (8u * (b % 4u))) & 255u;
}

// Byte `b` of the four u32 from scale entry word `e`, as an i8.
fn sbyte(e: u32, b: u32) -> f32 {
    return f32(bitcast<i32>(ubyte(e, b) << 24u) >> 24u);
}

// (d · sc, dmin · m) of sub-block `sub` of a Q4_K / Q5_K super-block's 5-u32 scale entry `e`.
fn k4_dm(e: u32, sub: u32) -> vec2<f32> {
    let dm = unpack2x16float(ws[e]);
    return vec2<f32>(dm.x * f32(ubyte(e + 1u, sub)), dm.y * f32(ubyte(e + 3u, sub)));
}

// (super-block, half h, quarter t) of a 32-value unit of the 16-value-scale K-quants (Q2_K, Q3_K,
// Q6_K), whose unit 4h + t of a super-block holds values 128h + 32t .. 128h + 32t + 31.
fn sb_half_quarter(unit: u32) -> vec3<u32> {
    return vec3<u32>(unit / 8u, (unit % 8u) / 4u, unit % 4u);
}

// The bytes of `v`, each shifted right by `s`, masked to `mask`.
fn bytes4(v: u32, s: u32, mask: u32) -> vec4<u32> {
    return ((vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) >> vec4<u32>(s)) & vec4<u32>(mask);
}

// The four signed bytes of `v`, low byte first.
fn i8x4(v: u32) -> vec4<f32> {
    let s = vec4<i32>(bitcast<i32>(v << 24u), bitcast<i32>(v << 16u), bitcast<i32>(v << 8u), bitcast<i32>(v));
    return vec4<f32>(s >> vec4<u32>(24u));
}
