//! The BPE pre-tokenizers against llama.cpp's own splitter.
//!
//! `tests/fixtures/tokenize/pretok.json` was recorded by `scripts/reference/tokenize_reference.py pretok`:
//! for each pre-tokenizer shoal knows (`llama-bpe`, `qwen2`, `smollm`, `gpt-2`, `default`), the regex list
//! llama.cpp's `llm_tokenizer_bpe` uses and the pieces llama.cpp's `unicode_regex_split` cuts each text
//! into (digit groups, contractions in both cases, whitespace and newline runs, unicode letters and
//! numbers, unassigned and private-use characters). Both must match exactly.

use shoal_model::tokenizer::{PreTokenizer, PreTokenizerKind};

fn fixture() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tokenize/pretok.json"
    );
    let text = std::fs::read_to_string(path).expect("read pretok.json");
    serde_json::from_str(&text).expect("parse pretok.json")
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}

#[test]
fn every_pre_tokenizer_splits_like_llama_cpp() {
    let json = fixture();
    let kinds = json["pre_tokenizers"].as_object().expect("pre_tokenizers");
    assert_eq!(kinds.len(), 5, "llama-bpe, qwen2, smollm, gpt-2, default");
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, entry) in kinds {
        let kind = PreTokenizerKind::from_gguf_name(name)
            .unwrap_or_else(|| panic!("`{name}` is a pre-tokenizer name shoal should know"));
        assert_eq!(
            kind.patterns(),
            strings(&entry["regexes"]),
            "{name}: regex list differs from llama.cpp's"
        );
        let pre = PreTokenizer::new(kind).expect("patterns compile");
        for case in entry["cases"].as_array().expect("cases") {
            let text = case["text"].as_str().expect("text");
            let want = strings(&case["pieces"]);
            let got: Vec<&str> = pre.split(text);
            checked += 1;
            if got != want {
                failures.push(format!(
                    "{name} {text:?}:\n  llama.cpp {want:?}\n  shoal     {got:?}"
                ));
            }
        }
    }
    assert!(checked >= 100, "only {checked} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
