// A mixture-of-experts layer's output (after grid.wgsl), one thread per value: for token t,
// out[t] = Σ_s weights[t·k + s] · y[t·k + s] over its k slots (sorted by expert id by the routing,
// so added in the host's order), plus the shared expert's row scaled by sigmoid(gate[t])
// (mode 2), by 1 (mode 1: GLM-4.5's ungated one) or absent (mode 0).

struct Params {
    dim: u32,
    k: u32,
    rows: u32,
    mode: u32,      // 0 no shared expert, 1 ungated, 2 gated
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read> shared_y: array<f32>;
@group(0) @binding(4) var<storage, read> gate: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

fn run(i: u32) {
    if (i >= params.rows * params.dim) {
        return;
    }
    let t = i / params.dim;
    let d = i % params.dim;
    var acc = 0.0;
    for (var s = 0u; s < params.k; s++) {
        let p = t * params.k + s;
        acc += weights[p] * y[p * params.dim + d];
    }
    if (params.mode == 2u) {
        acc += 1.0 / (1.0 + exp(-gate[t])) * shared_y[i];
    } else if (params.mode == 1u) {
        acc += shared_y[i];
    }
    out[i] = acc;
}
