//! The real test model and the golden reference files, for the tests of every crate.
//!
//! Missing files are a test failure with instructions, never a silent skip.

use std::path::PathBuf;

/// The default model's GGUF: `SHOAL_TEST_MODEL`, else the default models dir under `$HOME`.
pub fn model_path() -> PathBuf {
    catalog_model(
        "SHOAL_TEST_MODEL",
        "smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-instruct-q4_1",
    )
}

/// Gemma 3 270M Q4_K_M: `SHOAL_GEMMA_MODEL`, else the default models dir under `$HOME`.
pub fn gemma_path() -> PathBuf {
    catalog_model(
        "SHOAL_GEMMA_MODEL",
        "gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf",
        "gemma3-270m-q4_k_m",
    )
}

/// A catalog model's file: the path in env var `var`, else `<models dir>/<rel>`, where the models dir is
/// `SHOAL_MODELS_DIR` or `~/.cache/shoal/models`. Missing is a failure saying how to fetch it.
fn catalog_model(var: &str, rel: &str, id: &str) -> PathBuf {
    let path = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => {
            let dir = match std::env::var_os("SHOAL_MODELS_DIR") {
                Some(d) => PathBuf::from(d),
                None => std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_default()
                    .join(".cache/shoal/models"),
            };
            dir.join(rel)
        }
    };
    assert!(
        path.is_file(),
        "test model not found at {}: run `scripts/test` (or `shoal pull {id}`) first, or set {var}",
        path.display()
    );
    path
}

/// The golden reference folder: `SHOAL_GOLDEN_DIR`, else `shared/golden` beside the repository.
pub fn golden_dir() -> PathBuf {
    let dir = match std::env::var_os("SHOAL_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"),
    };
    assert!(
        dir.join("smollm2-135m-q4_1.greedy.json").is_file(),
        "golden files not found in {}: they live in shared/golden beside the repository, or set SHOAL_GOLDEN_DIR",
        dir.display()
    );
    dir
}

/// Parsed JSON of a golden file.
pub fn golden(name: &str) -> serde_json::Value {
    let path = golden_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// One input of llama.cpp's embedding reference: its text, the tokens llama.cpp embedded and its
/// L2-normalized vector.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingCase {
    pub text: String,
    pub tokens: Vec<u32>,
    pub embedding: Vec<f32>,
}

/// llama.cpp's embeddings of model `name` (`smollm2`, `gemma3`), recorded by
/// `scripts/reference/embeddings_reference.py` into shoal-engine's test fixtures.
pub fn embedding_reference(name: &str) -> Vec<EmbeddingCase> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shoal-engine/tests/fixtures/embeddings")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let json: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    let numbers = |v: &serde_json::Value| -> Vec<f64> {
        let a = v.as_array().expect("an array of numbers");
        a.iter().map(|x| x.as_f64().expect("a number")).collect()
    };
    json["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .map(|i| EmbeddingCase {
            text: i["text"].as_str().expect("text").to_string(),
            tokens: numbers(&i["tokens"])
                .into_iter()
                .map(|t| t as u32)
                .collect(),
            embedding: numbers(&i["embedding"])
                .into_iter()
                .map(|v| v as f32)
                .collect(),
        })
        .collect()
}

/// Cosine similarity of two vectors (in f64).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}
