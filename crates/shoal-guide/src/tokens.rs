//! The model's vocabulary as llguidance sees it: [`ShoalTokens`] (toktrie's `TokenizerEnv` over
//! shoal's own [`Tokenizer`]), built once per model by [`tok_env`], and [`TokenMask`], the set of
//! tokens allowed next.
//!
//! Each token's bytes are what the engine's detokenizer prints for it ([`Tokenizer::token_bytes`]),
//! so what a grammar matches is exactly the text a client receives. Control tokens (`<|im_end|>`,
//! `[TOOL_CALLS]`) get toktrie's special-token marker byte `0xFF` in front, as llama.cpp's
//! integration does: plain grammar text can never produce them, a grammar names them as
//! `<[id]>`. End-of-generation ids are the tokenizer's (`eog_ids`): any of them ends a grammar that
//! is complete.

use std::sync::Arc;

use shoal_model::tokenizer::{TokenType, Tokenizer};
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

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

/// The tokens allowed next: a bit per vocabulary id (ids past the vocabulary are never allowed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    vocab_size: usize,
}

impl TokenMask {
    pub(crate) fn from_vob(vob: &SimpleVob) -> Self {
        Self {
            words: vob.as_slice().to_vec(),
            vocab_size: vob.len(),
        }
    }

    /// Only `tokens` allowed.
    pub fn only(vocab_size: usize, tokens: &[u32]) -> Self {
        let mut words = vec![0u32; vocab_size.div_ceil(32)];
        for &t in tokens {
            if (t as usize) < vocab_size {
                words[t as usize / 32] |= 1 << (t % 32);
            }
        }
        Self { words, vocab_size }
    }

    pub fn is_allowed(&self, token: u32) -> bool {
        let i = token as usize;
        i < self.vocab_size
            && self
                .words
                .get(i / 32)
                .is_some_and(|w| w & (1 << (i % 32)) != 0)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The bits, 32 ids a word, lowest id in the lowest bit (the shape to send over a wire).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Sets every disallowed logit to `-inf`, 32 at a time (a word with no allowed token costs one
    /// fill; a full word nothing).
    pub fn apply(&self, logits: &mut [f32]) {
        for (chunk_index, chunk) in logits.chunks_mut(32).enumerate() {
            let word = self.words.get(chunk_index).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            if word == 0 {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        // Bits past the vocabulary in the last word are never set by llguidance; rows longer than the
        // vocabulary (padded embedding tables) were cleared above by the missing words.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_bans_everything_it_does_not_name() {
        let mask = TokenMask::only(70, &[1, 33, 69, 500]);
        assert_eq!(mask.count(), 3);
        assert!(mask.is_allowed(33) && !mask.is_allowed(32) && !mask.is_allowed(500));
        // A row padded past the vocabulary: the padding is banned too.
        let mut row = vec![0.5f32; 100];
        mask.apply(&mut row);
        let kept: Vec<usize> = (0..100).filter(|&i| row[i].is_finite()).collect();
        assert_eq!(kept, vec![1, 33, 69]);
    }
}
