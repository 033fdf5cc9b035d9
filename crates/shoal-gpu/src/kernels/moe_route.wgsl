// Mixture-of-experts routing on the device (after grid.wgsl), one thread per token, as shoal-model's
// `ffn::route` computes it on the host: the token's `n` router logits become softmax probabilities
// (GATING 0) or sigmoid scores (GATING 2) in place (GATING 1, gpt-oss: left as they are); the `k`
// largest of score + bias (the selection bias, when has_bias) are chosen one after another, the
// first index winning a tie; their weights are the chosen scores (GATING 1: the softmax of the
// chosen logits), renormalised to sum to 1 when `norm` (the sum clamped below at f16's smallest
// normal), times `scale`. The k (id, weight) pairs are written sorted by expert id, so that the
// combination adds the experts in the host's order.

struct Params {
    n: u32,         // experts
    k: u32,         // experts per token
    rows: u32,      // tokens
    gating: u32,    // 0 softmax then top-k, 1 top-k then softmax, 2 sigmoid
    norm: u32,
    scale: f32,
    has_bias: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> sel_bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

const NONE: u32 = 0xffffffffu;

fn run(t: u32) {
    if (t >= params.rows) {
        return;
    }
    let n = params.n;
    let k = params.k;
    let lb = t * n;
    let ob = t * k;
    if (params.gating == 0u) {
        var m = logits[lb];
        for (var e = 1u; e < n; e++) {
            m = max(m, logits[lb + e]);
        }
        var sum = 0.0;
        for (var e = 0u; e < n; e++) {
            let v = exp(logits[lb + e] - m);
            logits[lb + e] = v;
            sum += v;
        }
        for (var e = 0u; e < n; e++) {
            logits[lb + e] = logits[lb + e] / sum;
        }
    } else if (params.gating == 2u) {
        for (var e = 0u; e < n; e++) {
            logits[lb + e] = 1.0 / (1.0 + exp(-logits[lb + e]));
        }
    }
    for (var i = 0u; i < k; i++) {
        var best = NONE;
        var best_score = 0.0;
        for (var e = 0u; e < n; e++) {
            var taken = false;
            for (var j = 0u; j < i; j++) {
                taken = taken || ids[ob + j] == e;
            }
            var s = logits[lb + e];
            if (params.has_bias != 0u) {
                s += sel_bias[e];
            }
            if (!taken && (best == NONE || s > best_score)) {
                best = e;
                best_score = s;
            }
        }
        ids[ob + i] = best;
        weights[ob + i] = logits[lb + best];
    }
    if (params.gating == 1u) {
        var m = weights[ob];
        for (var i = 1u; i < k; i++) {
            m = max(m, weights[ob + i]);
        }
        var sum = 0.0;
        for (var i = 0u; i < k; i++) {
            let v = exp(weights[ob + i] - m);
            weights[ob + i] = v;
            sum += v;
        }
        for (var i = 0u; i < k; i++) {
            weights[ob + i] = weights[ob + i] / sum;
        }
    }
    var total = 0.0;
    for (var i = 0u; i < k; i++) {
        total += weights[ob + i];
    }
    var scale = params.scale;
    if (params.norm != 0u) {
        scale = params.scale / max(total, 6.1035156e-5);
    }
    for (var i = 0u; i < k; i++) {
        weights[ob + i] = weights[ob + i] * scale;
    }
    // Insertion sort of the k pairs by id.
    for (var i = 1u; i < k; i++) {
        let id = ids[ob + i];
        let w = weights[ob + i];
        var j = i;
        while (j > 0u && ids[ob + j - 1u] > id) {
            ids[ob + j] = ids[ob + j - 1u];
            weights[ob + j] = weights[ob + j - 1u];
            j--;
        }
        ids[ob + j] = id;
        weights[ob + j] = w;
    }
}
