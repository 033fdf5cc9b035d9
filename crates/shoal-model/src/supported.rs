//! What shoal runs, by name: the lists error messages and the README quote. The bottom of the crate: it
//! uses nothing, so `error` can name them without depending on the modules that implement them.

/// `general.architecture` values [`crate::arch::Arch`] loads.
pub const ARCHITECTURES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3",
    "phi3",
    "qwen2moe",
    "qwen3moe",
    "gpt-oss",
    "glm4moe",
    "deepseek2",
];

/// Tensor types the kernels multiply (ggml's names).
pub const TENSOR_TYPES: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, \
     IQ4_NL, IQ4_XS, MXFP4, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M";
