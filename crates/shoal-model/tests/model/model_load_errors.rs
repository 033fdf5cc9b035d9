//! Files shoal cannot run fail at load with an error that names the problem.

use std::sync::Arc;

use crate::gguf_writer::{T_U32, TempDir, tiny, v_array, v_str, v_u32};
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
    for arch in ["llama4", "deepseek32"] {
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
                && err.contains("glm4moe")
                && err.contains("deepseek2"),
            "{err}"
        );
    }
}

/// The shape keys of a one-layer model, 2 heads over 64 values (`<arch>.` before each).
const SHAPE: [(&str, u32); 5] = [
    ("embedding_length", 64),
    ("block_count", 1),
    ("feed_forward_length", 128),
    ("attention.head_count", 2),
    ("attention.head_count_kv", 2),
];

/// A deepseek2 file whose latent-attention keys disagree (`key_length_mla` given, but several KV heads and
/// a key length that is not `kv_lora_rank + rope`) is refused by name rather than read as a cache of the
/// wrong width.
#[test]
fn a_deepseek2_file_whose_latent_shape_disagrees_is_refused_by_name() {
    let mut g = tiny();
    g.metadata[0] = ("general.architecture".into(), v_str("deepseek2"));
    let shape = SHAPE.map(|(k, v)| (format!("deepseek2.{k}"), v_u32(v)));
    g.metadata.extend(shape);
    for (key, v) in [
        ("attention.key_length", 48),
        ("attention.value_length", 32),
        ("attention.key_length_mla", 48),
        ("attention.value_length_mla", 32),
        ("attention.kv_lora_rank", 32),
        ("rope.dimension_count", 16),
        ("expert_count", 4),
        ("expert_used_count", 2),
    ] {
        g.metadata.push((format!("deepseek2.{key}"), v_u32(v)));
    }
    let dir = TempDir::new();
    let path = dir.write("ds-bad.gguf", &g.build().bytes);
    let file = GgufFile::open(&path).expect("a valid GGUF");
    let err = ModelConfig::from_gguf(&file)
        .expect_err("disagreeing shape")
        .to_string();
    assert!(
        err.contains("latent attention") && err.contains("2 KV heads of key 48"),
        "{err}"
    );
}

/// Multi-section rope (GLM-4.5V's `rope.dimension_sections`) is refused by name, not rotated as one
/// section; all-zero sections (no multi-section rope, as llama.cpp reads them) load.
#[test]
fn multi_section_rope_is_refused_by_name() {
    for (sections, refused) in [([8u32, 8, 0, 0], true), ([0, 0, 0, 0], false)] {
        let mut g = tiny();
        g.metadata
            .extend(SHAPE.map(|(k, v)| (format!("llama.{k}"), v_u32(v))));
        let elems: Vec<Vec<u8>> = sections.iter().map(|s| s.to_le_bytes().to_vec()).collect();
        g.metadata.push((
            "llama.rope.dimension_sections".into(),
            v_array(T_U32, &elems),
        ));
        let dir = TempDir::new();
        let path = dir.write("mrope.gguf", &g.build().bytes);
        let file = GgufFile::open(&path).expect("a valid GGUF");
        let got = ModelConfig::from_gguf(&file).map(|_| ());
        if refused {
            let err = got.expect_err("refused").to_string();
            assert!(
                err.contains("multi-section rope") && err.contains("llama.rope.dimension_sections"),
                "{err}"
            );
        } else {
            got.expect("no sections in use");
        }
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

/// A vector tensor (a norm, a bias) in F16 or BF16 reads as the same f32 values as in F32 (widening is
/// exact); a quantized one is refused by name.
#[test]
fn a_half_precision_vector_reads_as_its_f32_values() {
    use crate::gguf_writer::{F32, Q8_0, Tensor};
    let values = [1.0f32, -0.5, 3.25, 0.0, -1024.0, 0.109375];
    let vector = |name: &str, type_id: u32, data: Vec<u8>| Tensor {
        name: name.into(),
        dims: vec![values.len() as u64],
        type_id,
        data,
        offset: None,
    };
    let mut g = tiny();
    g.tensors = vec![
        vector(
            "v.f32",
            F32,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        vector(
            "v.f16",
            1,
            values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        vector(
            "v.bf16",
            30,
            values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        Tensor {
            name: "v.q8_0".into(),
            dims: vec![32],
            type_id: Q8_0,
            data: vec![0; 34],
            offset: None,
        },
    ];
    let dir = TempDir::new();
    let path = dir.write("vectors.gguf", &g.build().bytes);
    let mut file = GgufFile::open(&path).expect("a valid GGUF");
    for name in ["v.f32", "v.f16", "v.bf16"] {
        assert_eq!(file.read_f32_vec(name).expect(name), values, "{name}");
    }
    let err = file
        .read_f32_vec("v.q8_0")
        .expect_err("quantized")
        .to_string();
    assert!(err.contains("v.q8_0"), "{err}");
}
