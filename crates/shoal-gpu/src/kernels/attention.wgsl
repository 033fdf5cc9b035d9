// Decode attention of one query (at position `pos`) over the f16 KV cache, one workgroup per
// query head (after reduce.wgsl). Query head h reads KV head h / group (grouped-query attention).
//
// Numerics follow shoal-kernels' attend_f16 (llama.cpp's CPU path): the query is multiplied by
// q_scale and rounded to f16; scores are q·k · score_scale over keys first .. pos (first > 0 for
// a sliding window); softmax subtracts the max, exponentiates, multiplies by 1 / sum and rounds
// the weights to f16; each output value is a chain of fused multiply-adds over the keys in order.
// The scores go through a scratch buffer of [n_heads][capacity] f32.
override WG: u32 = 64u;

struct Params {
    head_dim: u32,
    group: u32,      // query heads per KV head
    n_kv: u32,
    pos: u32,        // the query's position: keys first ..= pos are attended
    first: u32,
    layer_base: u32, // word index of this layer in the caches
    capacity: u32,   // positions per layer (row length of the scratch)
    q_off: u32,      // index of the first query value in q
    q_scale: f32,
    score_scale: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<u32>;
@group(0) @binding(3) var<storage, read> vc: array<u32>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

// head_dim ≤ 256 (checked by the host).
var<workgroup> qh: array<f32, 256>;

fn round_f16(v: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let hd = params.head_dim;
    let hw = hd / 2u;
    let g = h / params.group;
    for (var d = lid; d < hd; d += WG) {
        qh[d] = round_f16(q[params.q_off + h * hd + d] * params.q_scale);
    }
    workgroupBarrier();
    let len = params.pos + 1u;
    let sbase = h * params.capacity;
    let row = params.n_kv * hw;
    let kvbase = params.layer_base + g * hw;
    var m = -3.0e38;
    for (var j = params.first + lid; j < len; j += WG) {
        let kb = kvbase + j * row;
        var s = 0.0;
        for (var i = 0u; i < hw; i++) {
            let kv = unpack2x16float(kc[kb + i]);
            s = fma(qh[2u * i], kv.x, s);
            s = fma(qh[2u * i + 1u], kv.y, s);
        }
        s *= params.score_scale;
        scores[sbase + j] = s;
        m = max(m, s);
    }
    m = group_max(lid, WG, m);
    var l = 0.0;
    for (var j = params.first + lid; j < len; j += WG) {
        let e = exp(scores[sbase + j] - m);
        scores[sbase + j] = e;
        l += e;
    }
    let inv = 1.0 / group_sum(lid, WG, l);
    for (var j = params.first + lid; j < len; j += WG) {
        scores[sbase + j] = round_f16(scores[sbase + j] * inv);
    }
    storageBarrier();
    for (var d = lid; d < hd; d += WG) {
        var acc = 0.0;
        let vb = kvbase + d / 2u;
        let hi = (d & 1u) == 1u;
        for (var j = params.first; j < len; j++) {
            let p = unpack2x16float(vc[vb + j * row]);
            acc = fma(scores[sbase + j], select(p.x, p.y, hi), acc);
        }
        out[h * hd + d] = acc;
    }
}
