//! llama.cpp's text heuristics over a vocabulary (`llama_vocab::impl::load`): which tokens are really
//! control tokens, and which end a generation.
//!
//! Converters do not always mark special tokens: `<|end|>` may come as a user-defined token, Qwen's
//! `<|fim_prefix|>` as a normal one. llama.cpp therefore recognises them by their text and makes them
//! control tokens, so that plain-text tokenization (no `parse_special`) leaves their text alone.
//! [`apply`] does the same to the token types and returns the end-of-generation ids:
//! - every token named in [`EOG_TEXTS`] ends generation and becomes a control token;
//! - fill-in-the-middle tokens found by text (only when the GGUF does not give that FIM id) become
//!   control tokens; the FIM pad / repo / separator ones end generation;
//! - gpt-oss' `<|channel|>`, `<|message|>`, `<|start|>`, `<|constrain|>` are always user-defined;
//! - `<|end|>` does not end generation beside `<|return|>` + `<|call|>` or `<|calls|>` + `<|flush|>`
//!   (gpt-oss, solar-open), nor `</s>` beside `<|tool_response>` or `<|plamo:eos|>`;
//! - EOS, EOT and EOM (from the GGUF) always end generation.
//!
//! Where llama.cpp takes only the first FIM candidate it meets in a hash map, every candidate is taken
//! here: vocabularies hold at most one per kind in practice.

use super::TokenType;
use super::index::TextIndex;
use super::meta::{self, Metadata};

/// Token texts that end a generation (llama.cpp's `special_eog_ids` list).
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// One fill-in-the-middle kind: its GGUF keys (current, then deprecated), the texts that name it, and
/// whether it ends generation.
struct Fim {
    keys: &'static [&'static str],
    texts: &'static [&'static str],
    eog: bool,
}

const FIMS: &[Fim] = &[
    Fim {
        keys: &[
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.prefix_token_id",
        ],
        texts: &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
        eog: false,
    },
    Fim {
        keys: &[
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.suffix_token_id",
        ],
        texts: &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
        eog: false,
    },
    Fim {
        keys: &[
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.middle_token_id",
        ],
        texts: &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
        eog: false,
    },
    Fim {
        keys: &["tokenizer.ggml.fim_pad_token_id"],
        texts: &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
        eog: true,
    },
    Fim {
        keys: &["tokenizer.ggml.fim_rep_token_id"],
        texts: &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
        eog: true,
    },
    Fim {
        keys: &["tokenizer.ggml.fim_sep_token_id"],
        texts: &["<|file_sep|>"],
        eog: true,
    },
];

/// Adjusts `types` as llama.cpp does and returns the sorted end-of-generation ids. `given` holds
/// EOS, EOT and EOM as read from the GGUF.
pub(crate) fn apply(
    vocab: &TextIndex,
    types: &mut [TokenType],
    md: &Metadata,
    given: [Option<u32>; 3],
) -> Vec<u32> {
    let n = vocab.len();
    let mut eog: Vec<u32> = Vec::new();

    for fim in FIMS {
        let given_id = fim
            .keys
            .iter()
            .find_map(|key| meta::token_id(md, key, n).ok().flatten());
        match given_id {
            Some(id) if fim.eog => eog.push(id),
            Some(_) => {}
            None => {
                for id in fim.texts.iter().filter_map(|t| vocab.get(t)) {
                    types[id as usize] = TokenType::Control;
                    if fim.eog {
                        eog.push(id);
                    }
                }
            }
        }
    }
    for id in EOG_TEXTS.iter().filter_map(|t| vocab.get(t)) {
        types[id as usize] = TokenType::Control;
        eog.push(id);
    }
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = vocab.get(text) {
            types[id as usize] = TokenType::UserDefined;
        }
    }

    let has = |eog: &[u32], text: &str| vocab.get(text).is_some_and(|id| eog.contains(&id));
    let calls = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
    if calls
        && (has(&eog, "<|return|>") || has(&eog, "<|flush|>"))
        && has(&eog, "<|end|>")
        && let Some(end) = vocab.get("<|end|>")
    {
        eog.retain(|&id| id != end);
        types[end as usize] = TokenType::UserDefined;
    }
    if (has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>"))
        && let Some(s) = vocab.get("</s>")
    {
        eog.retain(|&id| id != s);
        types[s as usize] = TokenType::Normal;
    }

    eog.extend(given.into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    eog
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::quantized::gguf_file::Value;

    use super::*;

    fn run(texts: &[&str], md: &Metadata) -> (Vec<TokenType>, Vec<u32>) {
        let vocab = TextIndex::new(texts.iter().copied());
        let mut types = vec![TokenType::Normal; texts.len()];
        let eog = apply(&vocab, &mut types, md, [Some(0), None, None]);
        (types, eog)
    }

    #[test]
    fn named_tokens_become_control_and_end_generation() {
        use TokenType::*;
        let md = HashMap::new();
        let (types, eog) = run(
            &[
                "a",
                "<|end|>",
                "</s>",
                "<|fim_prefix|>",
                "<|file_sep|>",
                "<x>",
            ],
            &md,
        );
        assert_eq!(types, [Normal, Control, Control, Control, Control, Normal]);
        assert_eq!(eog, [0, 1, 2, 4]);
    }

    #[test]
    fn a_given_fim_id_stops_the_text_search() {
        use TokenType::*;
        let mut md = HashMap::new();
        md.insert("tokenizer.ggml.fim_pre_token_id".to_string(), Value::U32(2));
        md.insert("tokenizer.ggml.fim_sep_token_id".to_string(), Value::U32(3));
        let (types, eog) = run(&["a", "<|fim_prefix|>", "<p>", "<s>"], &md);
        assert_eq!(types, [Normal; 4]);
        assert_eq!(eog, [0, 3]);
    }

    #[test]
    fn end_is_not_eog_beside_return_and_call() {
        use TokenType::*;
        let md = HashMap::new();
        let (types, eog) = run(
            &["a", "<|end|>", "<|return|>", "<|call|>", "<|channel|>"],
            &md,
        );
        assert_eq!(types, [Normal, UserDefined, Control, Control, UserDefined]);
        assert_eq!(eog, [0, 2, 3]);
    }
}
