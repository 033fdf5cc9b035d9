// The gated product of a decoder layer's MLP, elementwise over n values (a: the gate
// projection, b: the up projection): y = silu(a) · b = a / (1 + e^-a) · b, or with GELU = 1
// y = gelu(a) · b, GELU's tanh approximation with ggml's CPU numerics (shoal-model's `geglu`):
// the input and the result rounded to f16 as its f16 table does, exact outside ±10 (WGSL lets
// quantizeToF16 flush f16 subnormals: results below 6.1e-5 in magnitude may become 0).
override GELU: u32 = 0u;

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
        } else if (g <= -10.0) {
            y[i] = 0.0;
        } else if (g >= 10.0) {
            y[i] = g * b[i];
        } else {
            y[i] = gelu_f16(g) * b[i];
        }
    }
}
