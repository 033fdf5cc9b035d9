//! Files shoal cannot run fail at load with an error that names the problem.

use std::sync::Arc;

use crate::gguf_writer::{TempDir, tiny, v_str};
use shoal_kernels::ThreadPool;
use shoal_model::gguf::GgufFile;
use shoal_model::{DecoderStage, LayerRange, ModelConfig};

#[test]
fn an_unknown_architecture_is_named_with_the_supported_ones() {
    let mut g = tiny();
    g.metadata[0] = ("general.architecture".into(), v_str("mamba"));
    let dir = TempDir::new();
    let path = dir.write("mamba.gguf", &g.build().bytes);
    let file = GgufFile::open(&path).expect("a valid GGUF");
    let err = ModelConfig::from_gguf(&file)
        .expect_err("mamba")
        .to_string();
    assert!(err.contains("'mamba'"), "{err}");
    for name in [
        "llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "qwen2moe", "qwen3moe",
    ] {
        assert!(err.contains(name), "{err} lists {name}");
    }
    let mut file = GgufFile::open(&path).expect("a valid GGUF");
    let pool = Arc::new(ThreadPool::new(1));
    let load = DecoderStage::load(&mut file, LayerRange { start: 0, end: 1 }, &pool);
    assert!(load.is_err());
}

/// The mixture-of-experts architectures shoal does not run yet fail by name, not as a wrong shape.
#[test]
fn an_unsupported_mixture_of_experts_architecture_is_named() {
    for arch in ["deepseek2", "llama4"] {
        let mut g = tiny();
        g.metadata[0] = ("general.architecture".into(), v_str(arch));
        let dir = TempDir::new();
        let path = dir.write("moe.gguf", &g.build().bytes);
        let file = GgufFile::open(&path).expect("a valid GGUF");
        let err = ModelConfig::from_gguf(&file).expect_err(arch).to_string();
        assert!(
            err.contains(&format!("unsupported architecture '{arch}'"))
                && err.contains("qwen3moe")
                && err.contains("gpt-oss")
                && err.contains("glm4moe"),
            "{err}"
        );
    }
}

#[test]
fn a_llama_file_without_its_shape_keys_names_the_missing_key() {
    let dir = TempDir::new();
    let path = dir.write("tiny.gguf", &tiny().build().bytes);
    let file = GgufFile::open(&path).expect("a valid GGUF");
    let err = ModelConfig::from_gguf(&file)
        .expect_err("no llama.* keys")
        .to_string();
    assert!(err.contains("llama.embedding_length"), "{err}");
}
