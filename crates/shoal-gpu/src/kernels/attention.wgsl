// Causal attention of a chunk of query rows (row r at position pos0 + r; one row for decode) over
// the f16 KV cache, one workgroup per (query head, row): workgroup (h, r) of a (n_heads, rows) grid
// (after reduce.wgsl). Query head h reads KV head h / group (grouped-query attention). Every row is
// computed as a decode query at its own position would be, so a chunk gives bitwise the rows of
// one-at-a-time decode (shoal-model's CPU attention does the same per row).
//
// Numerics follow shoal-kernels' attend_f16 (llama.cpp's CPU path): the query is multiplied by
// q_scale and rounded to f16; scores are q·k · score_scale over keys first ..= pos (first =
// max(0, pos + 1 - window) for a sliding window); softmax subtracts the max, exponentiates,
// multiplies by 1 / sum and rounds the weights to f16; each output value is a chain of fused
// multiply-adds over the keys in order.
// With attention sinks (has_sinks: gpt-oss) query head h's sink logit sinks[h] joins the softmax's
// maximum and denominator but weights no value (shoal-kernels' attend_f16_sinks).
// The scores go through a scratch buffer of [rows][n_heads][stride] f32, indexed from `first`.
override WG: u32 = 64u;

struct Params {
    head_dim: u32,
    group: u32,      // query heads per KV head
    n_kv: u32,
    pos0: u32,       // row r's position is pos0 + r: keys first ..= pos0 + r are attended
    window: u32,     // keys a query sees, counting itself (0: all)
    layer_base: u32, // word index of this layer in the caches
    stride: u32,     // scores per (row, head) in the scratch
    q_off: u32,      // index of row 0's first query value in q
    q_scale: f32,
    score_scale: f32,
    q_stride: u32,   // values from one row's query to the next's in q
    out_stride: u32, // values from one row's output to the next's (n_heads × head_dim)
    has_sinks: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<u32>;
@group(0) @binding(3) var<storage, read> vc: array<u32>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read> sinks: array<f32>;

// head_dim ≤ 576 (checked by the host: a latent-attention key).
var<workgroup> qh: array<f32, 576>;

fn round_f16(v: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let h = wid.x;
    let r = wid.y;
    let hd = params.head_dim;
    let hw = hd / 2u;
    let g = h / params.group;
    for (var d = lid; d < hd; d += WG) {
        qh[d] = round_f16(q[params.q_off + r * params.q_stride + h * hd + d] * params.q_scale);
    }
    workgroupBarrier();
    let len = params.pos0 + r + 1u;
    var first = 0u;
    if (params.window != 0u && len > params.window) {
        first = len - params.window;
    }
    // Score of key j at scores[sbase + j - first].
    let sbase = (r * nwg.x + h) * params.stride;
    let row = params.n_kv * hw;
    let kvbase = params.layer_base + g * hw;
    var m = -3.0e38;
    for (var j = first + lid; j < len; j += WG) {
        let kb = kvbase + j * row;
        var s = 0.0;
        for (var i = 0u; i < hw; i++) {
            let kv = unpack2x16float(kc[kb + i]);
            s = fma(qh[2u * i], kv.x, s);
            s = fma(qh[2u * i + 1u], kv.y, s);
        }
        s *= params.score_scale;
        scores[sbase + j - first] = s;
        m = max(m, s);
    }
    m = group_max(lid, WG, m);
    var sink_e = 0.0;
    if (params.has_sinks != 0u) {
        m = max(m, sinks[h]);
        sink_e = exp(sinks[h] - m);
    }
    var l = 0.0;
    for (var j = first + lid; j < len; j += WG) {
        let e = exp(scores[sbase + j - first] - m);
        scores[sbase + j - first] = e;
        l += e;
    }
    let inv = 1.0 / (group_sum(lid, WG, l) + sink_e);
    for (var j = first + lid; j < len; j += WG) {
        scores[sbase + j - first] = round_f16(scores[sbase + j - first] * inv);
    }
    storageBarrier();
    for (var d = lid; d < hd; d += WG) {
        var acc = 0.0;
        let vb = kvbase + d / 2u;
        let hi = (d & 1u) == 1u;
        for (var j = first; j < len; j++) {
            let p = unpack2x16float(vc[vb + j * row]);
            acc = fma(scores[sbase + j - first], select(p.x, p.y, hi), acc);
        }
        out[r * params.out_stride + h * hd + d] = acc;
    }
}
