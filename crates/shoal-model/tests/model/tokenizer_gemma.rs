//! The SentencePiece tokenizer on the real Gemma 3 270M Q4_K_M GGUF, against llama.cpp.
//!
//! - `shared/golden/gemma3-270m-q4_k_m.greedy.json`: the eight golden prompts' `prompt_tokens` (with
//!   BOS) must equal `encode_prompt`, and the decoded `completion_tokens` must equal llama.cpp's text.
//! - `tests/fixtures/tokenize/gemma3.json` (recorded by `scripts/reference/tokenize_reference.py
//!   gemma3` from llama-server's `/tokenize` and `/detokenize`): every text three ways (plain, with
//!   special tokens parsed, as a prompt with BOS) and the detokenized prompt.
//!
//! The model comes from `SHOAL_GEMMA_MODEL` (else the default models dir); missing is a failure with
//! instructions, never a skip.

use std::sync::OnceLock;
use std::time::Instant;

use crate::tokenizer_common::{
    Loaded, assert_long_input_fast, assert_roundtrips, ids, load_once, with_metadata,
};
use candle_core::quantized::gguf_file::{Content, Value};
use shoal_model::tokenizer::{
    PreTokenizerKind, StreamDecoder, TokenType, Tokenizer, TokenizerError, VocabType,
};
use shoal_testkit::fixtures::{gemma_path, golden};

fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    load_once(&LOADED, gemma_path)
}

fn content() -> &'static Content {
    &loaded().content
}

fn tokenizer() -> &'static Tokenizer {
    &loaded().tok
}

fn fixture_cases() -> Vec<serde_json::Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tokenize/gemma3.json"
    );
    let text = std::fs::read_to_string(path).expect("read gemma3.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("parse gemma3.json");
    let cases = json["cases"].as_array().expect("cases").clone();
    assert!(cases.len() >= 50, "expected the full text list");
    cases
}

#[test]
fn metadata_matches_gemma3() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_type(), VocabType::Spm);
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.pre_tokenizer(), PreTokenizerKind::Default);
    assert_eq!(tok.bos_id(), Some(2));
    assert_eq!(tok.eos_id(), Some(1));
    assert_eq!(tok.unk_id(), Some(3));
    assert_eq!(tok.pad_id(), Some(0));
    assert!(tok.add_bos());
    assert_eq!(tok.token_id("<start_of_turn>"), Some(105));
    assert_eq!(tok.token_id("<end_of_turn>"), Some(106));
    assert!(tok.is_eog(1), "<eos> ends generation");
    assert!(tok.is_eog(106), "<end_of_turn> ends generation");
    assert!(!tok.is_eog(2) && !tok.is_eog(105));
    // `▁` is a space when decoding; byte tokens are their byte; control tokens their text.
    assert_eq!(tok.token_text(236743), Some("▁"));
    assert_eq!(tok.token_bytes(236743), b" ");
    let byte_a = tok.token_id("<0x41>").expect("byte token");
    assert_eq!(tok.token_type(byte_a), Some(TokenType::Byte));
    assert_eq!(tok.token_bytes(byte_a), b"A");
    assert_eq!(tok.token_bytes(106), b"<end_of_turn>");
}

#[test]
fn golden_prompts_tokenize_exactly() {
    let tok = tokenizer();
    let cases = golden("gemma3-270m-q4_k_m.greedy.json");
    let cases = cases.as_array().expect("top-level array");
    assert_eq!(cases.len(), 8, "the eight golden prompts");
    for case in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let want = ids(&case["prompt_tokens"]);
        assert_eq!(want[0], 2, "golden prompt tokens start with BOS");
        assert_eq!(tok.encode_prompt(prompt), want, "prompt {prompt:?}");
        assert_eq!(tok.encode(prompt, false), want[1..], "prompt {prompt:?}");
    }
}

#[test]
fn golden_completions_decode_exactly() {
    let tok = tokenizer();
    let cases = golden("gemma3-270m-q4_k_m.greedy.json");
    for case in cases.as_array().expect("top-level array") {
        let completion = ids(&case["completion_tokens"]);
        let text = case["completion_text"].as_str().expect("completion_text");
        assert_eq!(tok.decode(&completion), text);
        let first16 = case["first16_text"].as_str().expect("first16_text");
        assert_eq!(tok.decode(&completion[..16]), first16);
        // Streaming gives the same text (no character is cut at the end of these completions).
        let mut dec = StreamDecoder::new();
        let mut streamed: String = completion.iter().map(|&id| dec.push(tok, id)).collect();
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, text);
    }
}

#[test]
fn reference_texts_tokenize_like_llama_server() {
    let tok = tokenizer();
    let mut failures = Vec::new();
    for case in fixture_cases() {
        let text = case["text"].as_str().expect("text");
        let checks = [
            ("plain", tok.encode(text, false)),
            ("special", tok.encode(text, true)),
            ("prompt", tok.encode_prompt(text)),
        ];
        for (name, got) in checks {
            let want = ids(&case[name]);
            if got != want {
                failures.push(format!(
                    "{name} {text:?}:\n  llama.cpp {want:?}\n  shoal     {got:?}"
                ));
            }
        }
        let detok = case["detokenized"].as_str().expect("detokenized");
        let got = tok.decode(&ids(&case["prompt"]));
        if got != detok {
            failures.push(format!(
                "decode {text:?}: llama.cpp {detok:?}, shoal {got:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn special_tokens_need_parse_special_but_user_defined_do_not() {
    let tok = tokenizer();
    let chat = "<start_of_turn>user\nHi<end_of_turn>\n";
    let parsed = tok.encode(chat, true);
    assert_eq!(parsed[0], 105);
    assert!(parsed.contains(&106));
    let plain = tok.encode(chat, false);
    assert!(!plain.contains(&105) && !plain.contains(&106), "{plain:?}");
    // `\n` is a user-defined token (107): matched with or without parse_special.
    assert!(parsed.contains(&107) && plain.contains(&107));
    assert_eq!(tok.decode(&parsed), chat);
    assert_eq!(tok.decode(&plain), chat);
}

#[test]
fn stream_decoder_joins_byte_fallback_tokens() {
    let tok = tokenizer();
    // Rare emoji are not in the vocabulary: each is four `<0xXX>` byte tokens.
    let text = "melting 🫠 goose 🪿";
    let ids = tok.encode(text, false);
    let bytes = ids
        .iter()
        .filter(|&&id| tok.token_type(id) == Some(TokenType::Byte))
        .count();
    assert!(bytes >= 4, "expected byte-fallback tokens in {ids:?}");
    let mut dec = StreamDecoder::new();
    let mut streamed = String::new();
    let mut held_back = false;
    for &id in &ids {
        let chunk = dec.push(tok, id);
        assert!(!chunk.contains('\u{FFFD}'), "chunk {chunk:?} has U+FFFD");
        held_back |= dec.pending_len() > 0;
        streamed.push_str(&chunk);
    }
    assert!(held_back, "a character spans several byte tokens");
    assert_eq!(dec.finish(), "");
    assert_eq!(streamed, text);
    assert_eq!(tok.decode(&ids), text);
}

#[test]
fn roundtrips_arbitrary_text() {
    assert_roundtrips(
        tokenizer(),
        &[
            "",
            " ",
            "  leading and trailing  ",
            "\n\n\t\r\n",
            "a\u{0}b\u{7f}c",
            "Ünïcödé — «quotes» 𝔘𝔫𝔦 \u{e000}\u{10fffd}",
            "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
            "<start_of_turn> not parsed",
        ],
    );
}

#[test]
fn add_space_prefix_is_applied_and_undone_by_decode() {
    // Gemma 3 has `add_space_prefix = false`; Llama 2 style vocabularies have it on.
    let prefixed = with_metadata(content(), |m| {
        m.insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(true));
    });
    let tok = Tokenizer::from_gguf(&prefixed).expect("tokenizer");
    let plain = tokenizer();
    let hello = tok.encode("Hello", false);
    assert_eq!(hello, plain.encode(" Hello", false), "a ▁ goes in front");
    // After a special token the next stretch is prefixed again, as at the start.
    let chat = tok.encode("<start_of_turn>user", true);
    assert_eq!(chat[0], 105);
    assert_eq!(chat[1..], plain.encode(" user", false));
    assert_eq!(tok.encode_prompt("Hello")[1..], hello);
    // decode drops the first token's leading space (llama.cpp's detokenize), a stream does not.
    assert_eq!(tok.decode(&hello), "Hello");
    assert_eq!(plain.decode(&hello), " Hello");
    let mut dec = StreamDecoder::new();
    let streamed: String = hello.iter().map(|&id| dec.push(&tok, id)).collect();
    assert_eq!(streamed, " Hello");
}

#[test]
fn bad_sentencepiece_metadata_is_an_error_not_a_panic() {
    let short_scores = with_metadata(content(), |m| {
        m.insert(
            "tokenizer.ggml.scores".into(),
            Value::Array(vec![Value::F32(0.0)]),
        );
    });
    assert!(matches!(
        Tokenizer::from_gguf(&short_scores),
        Err(TokenizerError::LengthMismatch {
            key: "tokenizer.ggml.scores",
            ..
        })
    ));
    let wrong_prefix = with_metadata(content(), |m| {
        m.insert(
            "tokenizer.ggml.add_space_prefix".into(),
            Value::String("yes".into()),
        );
    });
    assert!(matches!(
        Tokenizer::from_gguf(&wrong_prefix),
        Err(TokenizerError::WrongType { .. })
    ));
    // Without scores every merge ties and the leftmost pair wins: still valid token ids.
    let no_scores = with_metadata(content(), |m| {
        m.remove("tokenizer.ggml.scores");
    });
    let tok = Tokenizer::from_gguf(&no_scores).expect("scores are optional");
    let ids = tok.encode("Hello world", false);
    assert_eq!(tok.decode(&ids), "Hello world");
    // A missing BOS key falls back to llama.cpp's SentencePiece default (1).
    let no_bos = with_metadata(content(), |m| {
        m.remove("tokenizer.ggml.bos_token_id");
    });
    let tok = Tokenizer::from_gguf(&no_bos).expect("tokenizer");
    assert_eq!(tok.bos_id(), Some(1));
}

#[test]
fn loads_and_encodes_fast_enough() {
    // Generous bounds: they catch a quadratic load or merge loop, they are not a benchmark.
    let content = content();
    let start = Instant::now();
    let tok = Tokenizer::from_gguf(content).expect("tokenizer from GGUF");
    let load = start.elapsed();
    eprintln!("Gemma 3 tokenizer (262,144 tokens) built in {load:?}");
    assert!(
        load.as_secs_f64() < 2.0,
        "building the tokenizer took {load:?}"
    );

    let elapsed = assert_long_input_fast(&tok);
    eprintln!("encoding 112 KB took {elapsed:?}");
}
