//! What the tokenizer test files share: reading a GGUF header, golden id lists, and the round-trip and
//! long-input checks every vocabulary must pass.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use candle_core::quantized::gguf_file::{Content, Value};
use shoal_model::tokenizer::Tokenizer;

/// The metadata and tensor index of a GGUF, read through a buffer (a vocabulary is ~10^5 strings).
pub fn read_header(path: &Path) -> Content {
    let file =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    Content::read(&mut reader).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A GGUF's header and the tokenizer built from it, loaded once per test binary.
pub struct Loaded {
    pub content: Content,
    pub tok: Tokenizer,
}

/// Loads the GGUF at `path()` into `cell` on first use (`path` fails the test if the file is missing).
pub fn load_once(cell: &'static OnceLock<Loaded>, path: fn() -> PathBuf) -> &'static Loaded {
    cell.get_or_init(|| {
        let content = read_header(&path());
        let tok = Tokenizer::from_gguf(&content).expect("tokenizer from GGUF");
        Loaded { content, tok }
    })
}

/// A copy of `base`'s metadata (no tensors) changed by `edit`, to build tokenizers from bad or
/// altered metadata.
pub fn with_metadata(base: &Content, edit: impl FnOnce(&mut HashMap<String, Value>)) -> Content {
    let mut metadata = base.metadata.clone();
    edit(&mut metadata);
    Content {
        magic: base.magic,
        metadata,
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    }
}

/// A JSON array of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// `decode(encode(text))` gives `text` back for each text (no special tokens parsed).
pub fn assert_roundtrips(tok: &Tokenizer, texts: &[&str]) {
    for &text in texts {
        assert_eq!(tok.decode(&tok.encode(text, false)), text);
    }
}

/// Encodes 112 KB of prose and one 50,000-letter word, checks both decode back, and returns the time
/// the prose took. Generous bound: it guards against quadratic blowups, it is not a benchmark.
pub fn assert_long_input_fast(tok: &Tokenizer) -> Duration {
    let text = "The quick brown fox jumps over the lazy dog 0123456789. ".repeat(2000);
    let start = std::time::Instant::now();
    let ids = tok.encode(&text, true);
    let elapsed = start.elapsed();
    assert_eq!(tok.decode(&ids), text);
    assert!(elapsed.as_secs() < 10, "encoding 112 KB took {elapsed:?}");
    let word = "a".repeat(50_000);
    assert_eq!(tok.decode(&tok.encode(&word, false)), word);
    elapsed
}
