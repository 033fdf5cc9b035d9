// Writes the keys and values of `rows` consecutive positions into the f16 KV cache: per row r,
// `words` u32 (two halves each, low half first) from k[k_off + r·stride ..] and
// v[v_off + r·stride ..] to the caches at word `base + r·words` (the cache is
// [layer][pos][kv_head][head_dim] halves, so a layer's positions are consecutive; the host
// computes base for a layer and the first position). A keys-only cache (latent attention: the
// keys are their own values) writes no values (keys_only).

struct Params {
    words: u32,
    base: u32,
    k_off: u32,
    v_off: u32,
    rows: u32,
    stride: u32, // values from one row's k (and v) to the next's
    keys_only: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<u32>;
@group(0) @binding(4) var<storage, read_write> vc: array<u32>;

fn run(i: u32) {
    if (i < params.words * params.rows) {
        let r = i / params.words;
        let w = i % params.words;
        let ki = params.k_off + r * params.stride + 2u * w;
        let vi = params.v_off + r * params.stride + 2u * w;
        kc[params.base + i] = pack2x16float(vec2<f32>(k[ki], k[ki + 1u]));
        if (params.keys_only == 0u) {
            vc[params.base + i] = pack2x16float(vec2<f32>(v[vi], v[vi + 1u]));
        }
    }
}
