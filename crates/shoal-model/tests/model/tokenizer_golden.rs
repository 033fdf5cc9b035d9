//! Golden tests for `shoal_model::tokenizer::Tokenizer` against llama.cpp's tokenization of the real
//! SmolLM2-135M-Instruct Q4_1 GGUF (`shared/golden/smollm2-135m-q4_1.greedy.json`).
//!
//! The model is found through `SHOAL_TEST_MODEL` (else the default path under `$HOME`), the golden
//! files through `SHOAL_GOLDEN_DIR` (else `shared/golden` next to the repository). Either missing is a
//! failure with instructions, never a silent skip.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::tokenizer_common::{
    Loaded, assert_long_input_fast, assert_roundtrips, ids, load_once, with_metadata,
};
use candle_core::quantized::gguf_file::{Content, Value};
use shoal_model::tokenizer::{PreTokenizerKind, StreamDecoder, Tokenizer, TokenizerError};
use shoal_testkit::fixtures::{golden_dir, model_path};

fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    load_once(&LOADED, model_path)
}

fn content() -> &'static Content {
    &loaded().content
}

fn tokenizer() -> &'static Tokenizer {
    &loaded().tok
}

struct Case {
    prompt: String,
    prompt_tokens: Vec<u32>,
    completion_tokens: Vec<u32>,
    first16_text: String,
}

fn cases() -> Vec<Case> {
    let path = golden_dir().join("smollm2-135m-q4_1.greedy.json");
    let text = std::fs::read_to_string(&path).expect("read greedy golden");
    let json: serde_json::Value = serde_json::from_str(&text).expect("parse greedy golden");
    let cases: Vec<Case> = json
        .as_array()
        .expect("top-level array")
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().expect("prompt").to_owned(),
            prompt_tokens: ids(&c["prompt_tokens"]),
            completion_tokens: ids(&c["completion_tokens"]),
            first16_text: c["first16_text"].as_str().expect("first16_text").to_owned(),
        })
        .collect();
    assert!(cases.len() >= 8, "expected at least 8 golden prompts");
    cases
}

#[test]
fn metadata_matches_smollm2() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.pre_tokenizer(), PreTokenizerKind::DigitsThenGpt2);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert!(!tok.add_bos());
    assert_eq!(tok.token_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert_eq!(tok.token_id("<|endoftext|>"), Some(0));
    assert!(tok.is_eog(2), "<|im_end|> ends generation");
    assert!(tok.is_eog(0), "<|endoftext|> ends generation");
    assert!(!tok.is_eog(1));
    assert!(!tok.is_eog(504));
    assert_eq!(tok.token_bytes(2), b"<|im_end|>");
    assert_eq!(tok.token_bytes(u32::MAX), b"");
}

#[test]
fn golden_prompts_tokenize_exactly() {
    let tok = tokenizer();
    for case in cases() {
        assert_eq!(
            tok.encode(&case.prompt, false),
            case.prompt_tokens,
            "prompt {:?}",
            case.prompt
        );
        // No special-token text in these prompts: parse_special must not change anything.
        assert_eq!(tok.encode(&case.prompt, true), case.prompt_tokens);
        assert_eq!(
            tok.encode_prompt(&case.prompt),
            case.prompt_tokens,
            "no BOS for SmolLM2"
        );
    }
}

#[test]
fn golden_prompts_decode_back() {
    let tok = tokenizer();
    for case in cases() {
        assert_eq!(tok.decode(&case.prompt_tokens), case.prompt);
    }
}

#[test]
fn golden_first16_completion_text() {
    let tok = tokenizer();
    for case in cases() {
        let first16 = &case.completion_tokens[..16.min(case.completion_tokens.len())];
        assert_eq!(
            tok.decode(first16),
            case.first16_text,
            "prompt {:?}",
            case.prompt
        );
    }
}

#[test]
fn stream_decoder_yields_only_complete_utf8() {
    let tok = tokenizer();
    let multibyte: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.prompt.contains('日') || c.prompt.contains('🦀'))
        .collect();
    assert_eq!(multibyte.len(), 2, "Japanese and emoji golden prompts");
    for case in multibyte {
        let is_prompt = [true, false];
        for (ids, is_prompt) in [&case.prompt_tokens, &case.completion_tokens]
            .into_iter()
            .zip(is_prompt)
        {
            let mut dec = StreamDecoder::new();
            let mut streamed = String::new();
            let mut held_back = false;
            for &id in ids.iter() {
                let chunk = dec.push(tok, id);
                assert!(!chunk.contains('\u{FFFD}'), "chunk {chunk:?} has U+FFFD");
                held_back |= dec.pending_len() > 0;
                streamed.push_str(&chunk);
            }
            if is_prompt {
                assert!(held_back, "these prompts split characters across tokens");
            }
            let rest = dec.finish();
            streamed.push_str(&rest);
            assert_eq!(streamed, tok.decode(ids));
        }
        let mut dec = StreamDecoder::new();
        let whole: String = case
            .prompt_tokens
            .iter()
            .map(|&id| dec.push(tok, id))
            .collect();
        assert_eq!(dec.finish(), "");
        assert_eq!(whole, case.prompt);
    }
}

#[test]
fn stream_decoder_flushes_cut_character_lossily() {
    let tok = tokenizer();
    // The Japanese completion's 16th token cuts a character: llama.cpp's text ends in U+FFFD.
    let case = cases()
        .into_iter()
        .find(|c| c.prompt.contains('日'))
        .expect("Japanese golden prompt");
    let mut dec = StreamDecoder::new();
    let mut text: String = case.completion_tokens[..16]
        .iter()
        .map(|&id| dec.push(tok, id))
        .collect();
    assert!(dec.pending_len() > 0);
    text.push_str(&dec.finish());
    assert_eq!(text, case.first16_text);
    assert!(text.ends_with('\u{FFFD}'));
}

#[test]
fn special_tokens_parsed_only_when_asked() {
    let tok = tokenizer();
    let text = "<|im_start|>user\nHi<|im_end|>\n";
    let parsed = tok.encode(text, true);
    assert_eq!(parsed.first(), Some(&1));
    assert_eq!(parsed.iter().filter(|&&id| id == 2).count(), 1);
    let mut expected = vec![1];
    expected.extend(tok.encode("user\nHi", false));
    expected.push(2);
    expected.extend(tok.encode("\n", false));
    assert_eq!(parsed, expected);
    assert_eq!(tok.decode(&parsed), text);

    let plain = tok.encode(text, false);
    assert!(!plain.contains(&1) && !plain.contains(&2), "{plain:?}");
    assert_eq!(tok.decode(&plain), text);

    // Adjacent specials and a special at the very end.
    assert_eq!(tok.encode("<|im_end|><|im_start|>", true), [2, 1]);
    assert_eq!(tok.encode("<|endoftext|>", true), [0]);
}

#[test]
fn digits_are_single_tokens() {
    let tok = tokenizer();
    let ids = tok.encode("12345", false);
    assert_eq!(ids.len(), 5);
    assert_eq!(tok.decode(&ids), "12345");
    let singles: Vec<u32> = "12345"
        .chars()
        .flat_map(|c| tok.encode(&c.to_string(), false))
        .collect();
    assert_eq!(ids, singles);
    // No GPT-2 prefix space: the first word is not " Hello".
    let hello = tok.encode("Hello", false);
    assert_eq!(tok.decode(&hello), "Hello");
    assert_ne!(hello, tok.encode(" Hello", false));
}

#[test]
fn roundtrips_arbitrary_text() {
    assert_roundtrips(
        tokenizer(),
        &[
            "",
            " ",
            "\n\n\n",
            "a\u{0}b\u{7f}c",
            "Ünïcödé — «quotes» 𝔘𝔫𝔦",
            "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
            "<|im_start|> not parsed",
        ],
    );
}

#[test]
fn long_input_is_fast_enough() {
    assert_long_input_fast(tokenizer());
}

fn metadata_with(edit: impl FnOnce(&mut HashMap<String, Value>)) -> Content {
    with_metadata(content(), edit)
}

#[test]
fn bad_metadata_is_an_error_not_a_panic() {
    let missing = metadata_with(|m| {
        m.remove("tokenizer.ggml.tokens");
    });
    assert!(matches!(
        Tokenizer::from_gguf(&missing),
        Err(TokenizerError::MissingKey {
            key: "tokenizer.ggml.tokens"
        })
    ));

    let spm = metadata_with(|m| {
        m.insert("tokenizer.ggml.model".into(), Value::String("bert".into()));
    });
    assert!(matches!(
        Tokenizer::from_gguf(&spm),
        Err(TokenizerError::UnsupportedModel { .. })
    ));

    let bad_merge = metadata_with(|m| {
        m.insert(
            "tokenizer.ggml.merges".into(),
            Value::Array(vec![Value::String("nospace".into())]),
        );
    });
    assert!(matches!(
        Tokenizer::from_gguf(&bad_merge),
        Err(TokenizerError::BadMerge { index: 0, .. })
    ));

    let bad_bos = metadata_with(|m| {
        m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(1_000_000));
    });
    assert!(matches!(
        Tokenizer::from_gguf(&bad_bos),
        Err(TokenizerError::TokenIdOutOfRange { .. })
    ));

    let short_types = metadata_with(|m| {
        m.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array(vec![Value::I32(1)]),
        );
    });
    assert!(matches!(
        Tokenizer::from_gguf(&short_types),
        Err(TokenizerError::LengthMismatch { .. })
    ));

    let wrong_type = metadata_with(|m| {
        m.insert("tokenizer.ggml.tokens".into(), Value::U32(3));
    });
    assert!(matches!(
        Tokenizer::from_gguf(&wrong_type),
        Err(TokenizerError::WrongType { .. })
    ));

    let unknown_pre = metadata_with(|m| {
        m.insert("tokenizer.ggml.pre".into(), Value::String("made-up".into()));
    });
    let tok = Tokenizer::from_gguf(&unknown_pre).expect("unknown pre falls back");
    assert_eq!(tok.pre_tokenizer(), PreTokenizerKind::Gpt2);
}
