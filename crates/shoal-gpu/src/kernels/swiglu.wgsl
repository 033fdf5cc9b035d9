// The gated product of a decoder layer's MLP, elementwise over n values (a: the gate
// projection, b: the up projection): y = silu(a) · b = a / (1 + e^-a) · b, or with GELU = 1
// y = gelu(a) · b, GELU's tanh approximation with ggml's CPU numerics (shoal-model's `geglu`):
// the input and the result rounded to f16 as its f16 table does, exact outside ±10 (WGSL lets
// quantizeToF16 flush f16 subnormals: results below 6.1e-5 in magnitude may become 0); or with
// GELU = 2 gpt-oss's clamped SwiGLU (shoal-model's `swiglu_oai`, ggml's `swiglu_oai`):
// y = g / (1 + e^(-1.702·g)) · (u + 1) with g = min(a, 7), u = clamp(b, -7, 7).
override GELU: u32 = 0u;

const OAI_ALPHA: f32 = 1.702;
const OAI_LIMIT: f32 = 7.0;

const GELU_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.7978846;

fn gelu_f16(x: f32) -> f32 {
    let h = quantizeToF16(x);
    return quantizeToF16(0.5 * h * (1.0 + tanh(SQRT_2_OVER_PI * h * (1.0 + GELU_A * h * h))));
}

fn run(group: u32, lid: u32) {
    let i = group * WG + lid;
    if (i < params.n) {
        let g = a[i];
        if (GELU == 0u) {
            y[i] = g / (1.0 + exp(-g)) * b[i];
        } else if (GELU == 2u) {
            let x = min(g, OAI_LIMIT);
            let u = clamp(b[i], -OAI_LIMIT, OAI_LIMIT);
            y[i] = x / (1.0 + exp(OAI_ALPHA * -x)) * (u + 1.0);
        } else if (g <= -10.0) {
            y[i] = 0.0;
        } else if (g >= 10.0) {
            y[i] = g * b[i];
        } else {
            y[i] = gelu_f16(g) * b[i];
        }
    }
}
