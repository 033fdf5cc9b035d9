// Rotary embedding in place over `n_heads` heads of `head_dim` values at x[offset + r·stride ..]
// for each of `rows` rows, row r at position `positions[r]` (or `pos` when has_positions is 0). The first `dims` values of a head are rotated in dims / 2 pairs: adjacent pairs
// (2i, 2i + 1) ("normal", Llama) or the halves (i, i + dims / 2) (NEOX: Qwen, Gemma, Phi-3).
//
// The angle of pair i is computed as shoal-model's RopeRows (ggml's rope cache) computes it, with
// the same f32 operations: pos multiplied i times by theta_scale = theta^(-2 / dims), divided by
// the pair's frequency factor (when given), times freq_scale. It is then reduced to [-π, π] with
// 2π in three parts (exact products for |angle| up to ~5·10⁴) before sin and cos, whose
// accuracy the WGSL spec only promises in that range. With YaRN (has_yarn; ggml's `rope_yarn`, as
// shoal-model's `Yarn::angle`): the angle is the scaled one ramped towards the unscaled one by
// ext_factor over the correction range [corr0, corr1] of pair indices, and cos and sin are
// multiplied by mscale (computed by the host).

struct Params {
    n_heads: u32,
    head_dim: u32,
    dims: u32,
    pos: u32,
    theta_scale: f32,
    freq_scale: f32,
    neox: u32,
    has_factors: u32,
    offset: u32,
    rows: u32,
    stride: u32,
    has_positions: u32,
    has_yarn: u32,
    ext_factor: f32,
    mscale: f32,
    corr0: f32,
    corr1: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> factors: array<f32>;
@group(0) @binding(3) var<storage, read> positions: array<u32>;

const INV_TWO_PI: f32 = 0.15915494309189535;
// 2π = C1 + C2 + C3, C1 and C2 with 11 significant bits each.
const C1: f32 = 6.28125;
const C2: f32 = 0.0019350051879882812;
const C3: f32 = 3.019916050561733e-07;

fn run(id: u32) {
    let half = params.dims / 2u;
    let per_row = params.n_heads * half;
    if (id >= per_row * params.rows) {
        return;
    }
    let row = id / per_row;
    let head = (id % per_row) / half;
    let i = id % half;
    var p = params.pos;
    if (params.has_positions != 0u) {
        p = positions[row];
    }
    var angle = f32(p);
    for (var j = 0u; j < i; j++) {
        angle *= params.theta_scale;
    }
    if (params.has_factors != 0u) {
        angle = angle / factors[i];
    }
    var theta = params.freq_scale * angle;
    var m = 1.0;
    if (params.has_yarn != 0u) {
        m = params.mscale;
        if (params.ext_factor != 0.0) {
            let y = (f32(i) - params.corr0) / max(params.corr1 - params.corr0, 0.001);
            let ramp = (1.0 - clamp(y, 0.0, 1.0)) * params.ext_factor;
            theta = theta * (1.0 - ramp) + angle * ramp;
        }
    }
    let k = round(theta * INV_TWO_PI);
    let r = ((theta - k * C1) - k * C2) - k * C3;
    let c = cos(r) * m;
    let s = sin(r) * m;
    let base = params.offset + row * params.stride + head * params.head_dim;
    var j0 = base + 2u * i;
    var j1 = j0 + 1u;
    if (params.neox != 0u) {
        j0 = base + i;
        j1 = j0 + half;
    }
    let a = x[j0];
    let b = x[j1];
    x[j0] = a * c - b * s;
    x[j1] = a * s + b * c;
}
