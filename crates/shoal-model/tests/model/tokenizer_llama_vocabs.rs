//! Opt-in: llama.cpp's own tokenizer test suites, run through shoal's tokenizer.
//!
//! llama.cpp's source tree ships vocabulary-only GGUFs (`models/ggml-vocab-<name>.gguf`) with test
//! texts (`.inp`, separated by `\n__ggml_vocab_test__\n`) and the expected ids (`.out`, one line each,
//! from the model's reference tokenizer, no special tokens added or parsed), which its
//! `test-tokenizer-0` checks. Those files are not in this repository (18 MB), so this test is ignored
//! by default: point `LLAMA_CPP_VOCABS` at that `models/` folder and run it with `--ignored`. A missing
//! folder or file is then a failure, not a skip.

use std::path::{Path, PathBuf};

use shoal_model::tokenizer::{PreTokenizerKind, Tokenizer, VocabType};

use crate::tokenizer_common;

/// The suites for vocabularies shoal supports, with the algorithm and pre-tokenizer each must get.
const SUITES: &[(&str, VocabType, PreTokenizerKind)] = &[
    ("llama-spm", VocabType::Spm, PreTokenizerKind::Default),
    ("phi-3", VocabType::Spm, PreTokenizerKind::Default),
    ("llama-bpe", VocabType::Bpe, PreTokenizerKind::Llama3),
    ("qwen2", VocabType::Bpe, PreTokenizerKind::Qwen2),
    ("gpt-2", VocabType::Bpe, PreTokenizerKind::Gpt2),
    ("mpt", VocabType::Bpe, PreTokenizerKind::Gpt2),
    (
        "starcoder",
        VocabType::Bpe,
        PreTokenizerKind::DigitsThenGpt2,
    ),
    ("refact", VocabType::Bpe, PreTokenizerKind::DigitsThenGpt2),
    (
        "command-r",
        VocabType::Bpe,
        PreTokenizerKind::DigitsThenGpt2,
    ),
];

fn vocab_dir() -> PathBuf {
    let dir = std::env::var_os("LLAMA_CPP_VOCABS").map(PathBuf::from).expect(
        "set LLAMA_CPP_VOCABS to llama.cpp's models/ folder (with ggml-vocab-*.gguf and .inp/.out)",
    );
    assert!(
        dir.is_dir(),
        "LLAMA_CPP_VOCABS={} is not a folder",
        dir.display()
    );
    dir
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The (text, expected ids) pairs of one suite.
fn suite(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let inp = read(&base.with_extension("gguf.inp"));
    let out = read(&base.with_extension("gguf.out"));
    // As `test-tokenizer-0` reads it: a separator at the very end starts no further text.
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts: Vec<&str> = inp.split(sep).collect();
    if inp.ends_with(sep) {
        texts.pop();
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|t| t.parse().expect("token id"))
                .collect()
        })
        .collect();
    assert_eq!(texts.len(), ids.len(), "{name}: .inp and .out disagree");
    texts.into_iter().map(str::to_owned).zip(ids).collect()
}

#[test]
#[ignore = "needs llama.cpp's models/ggml-vocab-*.gguf: set LLAMA_CPP_VOCABS and run with --ignored"]
fn llama_cpp_vocab_suites() {
    let dir = vocab_dir();
    let mut failures = Vec::new();
    let mut checked = 0;
    for &(name, vocab_type, pre) in SUITES {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let content = tokenizer_common::read_header(&path);
        let tok = Tokenizer::from_gguf(&content).expect("tokenizer from GGUF");
        assert_eq!(tok.vocab_type(), vocab_type, "{name}");
        assert_eq!(tok.pre_tokenizer(), pre, "{name}");
        for (text, want) in suite(&dir, name) {
            let got = tok.encode(&text, false);
            checked += 1;
            if got != want {
                failures.push(format!(
                    "{name} {text:?}:\n  expected {want:?}\n  shoal    {got:?}"
                ));
            }
        }
    }
    eprintln!("{checked} texts checked in {} suites", SUITES.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
