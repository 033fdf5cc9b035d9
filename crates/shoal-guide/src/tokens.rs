//! The model's vocabulary as llguidance sees it: [`ShoalTokens`] (toktrie's `TokenizerEnv` over
//! shoal's own [`Tokenizer`]), built once per model by [`tok_env`].
//!
//! Each token's bytes are what the engine's detokenizer prints for it ([`Tokenizer::token_bytes`]),
//! so what a grammar matches is exactly the text a client receives. Control tokens (`<|im_end|>`,
//! `[TOOL_CALLS]`) get toktrie's special-token marker byte `0xFF` in front, as llama.cpp's
//! integration does: plain grammar text can never produce them, a grammar names them as
//! `<[id]>`. End-of-generation ids are the tokenizer's (`eog_ids`): any of them ends a grammar that
//! is complete.

use std::sync::Arc;

use shoal_model::tokenizer::{TokenType, Tokenizer};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::GuideError;

/// toktrie's view of a shoal tokenizer.
pub struct ShoalTokens {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

/// Builds the token trie of `tokenizer` (once per model: ~49k tokens take tens of milliseconds).
pub fn tok_env(tokenizer: Arc<Tokenizer>) -> Result<TokEnv, GuideError> {
    let n = tokenizer.vocab_size();
    let vocab_size = u32::try_from(n).map_err(|_| GuideError::Vocabulary {
        message: format!("{n} tokens do not fit 32-bit ids"),
    })?;
    let eog = tokenizer.eog_ids();
    let eos = tokenizer
        .eos_id()
        .or_else(|| eog.first().copied())
        .ok_or_else(|| GuideError::Vocabulary {
            message: "the tokenizer has no end-of-generation token".into(),
        })?;
    let words: Vec<Vec<u8>> = (0..vocab_size)
        .map(|id| token_bytes(&tokenizer, id))
        .collect();
    let mut info = TokRxInfo::new(vocab_size, eos);
    info.tok_bos = tokenizer.bos_id();
    info.tok_pad = tokenizer.pad_id();
    info.tok_unk = tokenizer.unk_id();
    let mut ends: Vec<TokenId> = vec![eos];
    ends.extend(eog.iter().copied().filter(|&id| id != eos));
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
    Ok(Arc::new(ShoalTokens { tokenizer, trie }))
}

/// A token's bytes for the trie: control tokens carry the special-token marker in front.
fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let bytes = tokenizer.token_bytes(id);
    match tokenizer.token_type(id) {
        Some(TokenType::Control) if !bytes.is_empty() => {
            let mut marked = Vec::with_capacity(bytes.len() + 1);
            marked.push(TokTrie::SPECIAL_TOKEN_MARKER);
            marked.extend_from_slice(bytes);
            marked
        }
        _ => bytes.to_vec(),
    }
}

impl TokenizerEnv for ShoalTokens {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// shoal's own encoder (as llama.cpp's) on text; bytes that are no valid UTF-8 fall back to the
    /// trie's greedy split.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false),
            Err(e) => {
                let (valid, rest) = s.split_at(e.valid_up_to());
                let mut out = self.tokenize_bytes(valid);
                out.extend(self.trie.greedy_tokenize(rest));
                out
            }
        }
    }
}
