//! GGUF tensor names (llama.cpp's `LLM_TENSOR_*`): the loader (`decoder.rs`), the footprint and a
//! stage's byte ranges (`ranges.rs`) name tensors from here.

pub const TOKEN_EMBD: &str = "token_embd.weight";
pub const OUTPUT_NORM: &str = "output_norm.weight";
pub const OUTPUT: &str = "output.weight";
/// Llama 3's rope frequency divisors.
pub const ROPE_FREQS: &str = "rope_freqs.weight";
/// Phi-3's rope factors for the original context.
pub const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";
/// How the names of the routed experts' 3-D tensors end (`ffn_gate_exps.weight`, `ffn_up_exps.weight`,
/// `ffn_down_exps.weight`).
pub const EXPERTS_SUFFIX: &str = "_exps.weight";
/// The prefix every layer tensor's name starts with.
pub const BLK: &str = "blk.";
/// The prefix every tensor name of layer `i` starts with.
pub fn blk_prefix(i: usize) -> String {
    format!("{BLK}{i}.")
}
pub fn blk(i: usize, part: &str) -> String {
    format!("{}{part}.weight", blk_prefix(i))
}
pub fn blk_bias(i: usize, part: &str) -> String {
    format!("{}{part}.bias", blk_prefix(i))
}
