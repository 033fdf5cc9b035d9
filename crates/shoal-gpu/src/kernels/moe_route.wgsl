// Mixture-of-experts routing on the device (after grid.wgsl), one thread per token, as shoal-model's
// `ffn::route` computes it on the host: the token's `n` router logits become softmax probabilities
// (GATING 0) or sigmoid scores (GATING 2) in place (GATING 1, gpt-oss: left as they are); the `k`
// largest of score + bias (the selection bias, when has_bias) are chosen one after another, the
// first index winning a tie; their weights are the chosen scores (GATING 1: the softmax of the
// chosen logits), renormalised to sum to 1 when `norm` (the sum clamped below at f16's smallest
// normal), times `scale`. Group-limited routing (groups > 1, groups_used < groups: DeepSeek V3): the
// experts form `groups` groups of n / groups, and only those of the groups_used groups whose two best
// selection scores sum highest (first group on a tie) may be chosen (the host allows groups ≤ 32). The k (id, weight) pairs are written sorted by expert id, so that the
// combination adds the experts in the host's order.

struct Params {
    n: u32,         // experts
    k: u32,         // experts per token
    rows: u32,      // tokens
    gating: u32,    // 0 softmax then top-k, 1 top-k then softmax, 2 sigmoid
    norm: u32,
    scale: f32,
    has_bias: u32,
    groups: u32,
    groups_used: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> sel_bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

const NONE: u32 = 0xffffffffu;

// Expert e's selection score for the token whose logits start at lb.
fn score(lb: u32, e: u32) -> f32 {
    var s = logits[lb + e];
    if (params.has_bias != 0u) {
        s += sel_bias[e];
    }
    return s;
}

// The groups experts may be chosen from, as a bit mask; with `per` experts a group.
fn allowed_groups(lb: u32, per: u32) -> u32 {
    let groups = params.groups;
    var allowed = 0u;
    for (var u = 0u; u < params.groups_used; u++) {
        var best = NONE;
        var best_score = 0.0;
        for (var g = 0u; g < groups; g++) {
            if (((allowed >> g) & 1u) == 1u) {
                continue;
            }
            var a = -3.4e38;
            var b = -3.4e38;
            for (var e = g * per; e < (g + 1u) * per; e++) {
                let s = score(lb, e);
                if (s > a) {
                    b = a;
                    a = s;
                } else if (s > b) {
                    b = s;
                }
            }
            var sc = a;
            if (per >= 2u) {
                sc = a + b;
            }
            if (best == NONE || sc > best_score) {
                best = g;
                best_score = sc;
            }
        }
        allowed |= 1u << best;
    }
    return allowed;
}

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
    var per = n;
    var allowed = 1u;
    if (params.groups > 1u && params.groups_used < params.groups) {
        per = n / params.groups;
        allowed = allowed_groups(lb, per);
    }
    for (var i = 0u; i < k; i++) {
        var best = NONE;
        var best_score = 0.0;
        for (var e = 0u; e < n; e++) {
            var taken = e / per >= 32u || ((allowed >> (e / per)) & 1u) == 0u;
            for (var j = 0u; j < i; j++) {
                taken = taken || ids[ob + j] == e;
            }
            let s = score(lb, e);
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
