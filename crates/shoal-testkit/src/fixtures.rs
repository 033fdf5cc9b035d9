//! The real test model and the golden reference files, for the tests of every crate.
//!
//! Missing files are a test failure with instructions, never a silent skip.

use std::path::PathBuf;

/// The default model's GGUF: `SHOAL_TEST_MODEL`, else the default models dir under `$HOME`.
pub fn model_path() -> PathBuf {
    let path = match std::env::var_os("SHOAL_TEST_MODEL") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(
                ".cache/shoal/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf",
            )
        }
    };
    assert!(
        path.is_file(),
        "test model not found at {}: run `scripts/test` (or `shoal pull`) first, or set SHOAL_TEST_MODEL",
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
