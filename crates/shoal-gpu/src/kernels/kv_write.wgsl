// Writes one position's keys and values into the f16 KV cache: `words` u32 (two halves each,
// low half first) from k[k_off ..] and v[v_off ..] to the caches at word `base` (the cache is
// [layer][pos][kv_head][head_dim] halves; the host computes base for a layer and position).

struct Params {
    words: u32,
    base: u32,
    k_off: u32,
    v_off: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<u32>;
@group(0) @binding(4) var<storage, read_write> vc: array<u32>;

fn run(i: u32) {
    if (i < params.words) {
        let ki = params.k_off + 2u * i;
        let vi = params.v_off + 2u * i;
        kc[params.base + i] = pack2x16float(vec2<f32>(k[ki], k[ki + 1u]));
        vc[params.base + i] = pack2x16float(vec2<f32>(v[vi], v[vi + 1u]));
    }
}
