//! SentencePiece-style encoding (`tokenizer.ggml.model = "llama"`: Llama 2, Gemma, Mistral v1, Phi-3),
//! as llama.cpp's `llm_tokenizer_spm` does it.
//!
//! [`Spm`] encodes one stretch of plain text (the special-token partition already ran):
//! 1. spaces become `▁` (U+2581), with one more `▁` in front when the vocabulary asks for a space
//!    prefix (`tokenizer.ggml.add_space_prefix`) and the stretch starts the text or follows a special
//!    token;
//! 2. every character is a symbol; the adjacent pair whose concatenation is the vocabulary entry with
//!    the highest score merges first (leftmost on a tie), until no pair is an entry;
//! 3. each symbol left is its token, or, when it is not in the vocabulary (a character the model never
//!    saw), one byte token `<0xXX>` per UTF-8 byte ("byte fallback"), else the unknown token.
//!
//! The merge loop keeps symbols as byte ranges of the escaped text in a linked list and candidate pairs
//! in a binary heap; a candidate whose sides have changed since it was pushed is skipped when popped.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::index::TextIndex;

/// SentencePiece's visible space.
pub(crate) const SPACE: char = '\u{2581}';

/// No neighbour in the symbol list.
const NONE: usize = usize::MAX;

/// What SentencePiece encoding needs beside the vocabulary's [`TextIndex`] (text → id over every
/// token type, as llama.cpp's `token_to_id`).
#[derive(Debug)]
pub(crate) struct Spm {
    scores: Vec<f32>,
    /// The token of each byte for the fallback: `<0xXX>`, else the one-character token.
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
    add_space_prefix: bool,
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    end: usize,
    prev: usize,
    next: usize,
}

/// A candidate merge of two adjacent symbols; the heap pops the highest score, then the leftmost.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text, to recognise stale candidates.
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl Spm {
    /// Builds the lookups from the vocabulary and its scores (one per token).
    pub(crate) fn new(
        vocab: &TextIndex,
        scores: Vec<f32>,
        unk: Option<u32>,
        add_space_prefix: bool,
    ) -> Self {
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = vocab.get(&format!("<0x{b:02X}>")).or_else(|| {
                let b = u8::try_from(b).ok().filter(u8::is_ascii)?;
                vocab.get(char::from(b).encode_utf8(&mut [0; 4]))
            });
        }
        Self {
            scores,
            byte_ids,
            unk,
            add_space_prefix,
        }
    }

    /// Whether a stretch at the start of the text or after a special token gets a leading `▁`.
    pub(crate) fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Encodes one stretch of plain text with the vocabulary `vocab` this was built from, appending
    /// ids to `out`; `prefix_space` puts a `▁` first.
    pub(crate) fn encode(
        &self,
        vocab: &TextIndex,
        text: &str,
        prefix_space: bool,
        out: &mut Vec<u32>,
    ) {
        let mut escaped = String::with_capacity(text.len() + text.len() / 2 + 3);
        if prefix_space {
            escaped.push(SPACE);
        }
        for c in text.chars() {
            escaped.push(if c == ' ' { SPACE } else { c });
        }
        let s = escaped.as_str();
        if s.is_empty() {
            return;
        }

        let mut symbols: Vec<Symbol> = Vec::with_capacity(s.len());
        for (i, (start, c)) in s.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                end: start + c.len_utf8(),
                prev: i.checked_sub(1).unwrap_or(NONE),
                next: i + 1,
            });
        }
        if let Some(last) = symbols.last_mut() {
            last.next = NONE;
        }

        let mut heap = BinaryHeap::with_capacity(symbols.len());
        let try_add = |heap: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: usize| {
            if left == NONE || symbols[left].next == NONE {
                return;
            }
            let right = symbols[left].next;
            let merged = &s[symbols[left].start..symbols[right].end];
            if let Some(id) = vocab.get(merged) {
                heap.push(Bigram {
                    score: self.scores.get(id as usize).copied().unwrap_or(0.0),
                    left,
                    right,
                    len: merged.len(),
                });
            }
        };
        for i in 0..symbols.len() {
            try_add(&mut heap, &symbols, i);
        }

        while let Some(b) = heap.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            let (l_len, r_len) = (l.end - l.start, r.end - r.start);
            // A side merged elsewhere since the push: its length changed (or it is gone).
            if l_len == 0 || r_len == 0 || l_len + r_len != b.len {
                continue;
            }
            symbols[b.left].end = r.end;
            symbols[b.left].next = r.next;
            symbols[b.right].end = r.start;
            if r.next != NONE {
                symbols[r.next].prev = b.left;
            }
            try_add(&mut heap, &symbols, l.prev);
            try_add(&mut heap, &symbols, b.left);
        }

        let mut i = 0;
        while i != NONE {
            let sym = symbols[i];
            i = sym.next;
            let piece = &s[sym.start..sym.end];
            if let Some(id) = vocab.get(piece) {
                out.push(id);
                continue;
            }
            for b in piece.bytes() {
                // llama.cpp refuses a vocabulary without the byte; the unknown token is the kinder answer.
                if let Some(id) = self.byte_ids[usize::from(b)].or(self.unk) {
                    out.push(id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: `<unk>`, the bytes `<0x00>..<0xFF>` from id 1, then scored pieces.
    fn toy(pieces: &[(&str, f32)], add_space_prefix: bool) -> (TextIndex, Spm) {
        let mut tokens = vec!["<unk>".to_string()];
        let mut scores = vec![0.0];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
        }
        for (t, s) in pieces {
            tokens.push(t.to_string());
            scores.push(*s);
        }
        let vocab = TextIndex::new(tokens.iter().map(String::as_str));
        let spm = Spm::new(&vocab, scores, Some(0), add_space_prefix);
        (vocab, spm)
    }

    fn enc((vocab, spm): &(TextIndex, Spm), text: &str, prefix: bool) -> Vec<u32> {
        let mut out = Vec::new();
        spm.encode(vocab, text, prefix, &mut out);
        out
    }

    const P: u32 = 257; // id of the first scored piece

    #[test]
    fn highest_score_merges_first() {
        // "ab" beats "bc"; then "abc" is reachable only through "ab" + "c".
        let spm = toy(
            &[
                ("a", -1.0),
                ("b", -1.0),
                ("c", -1.0),
                ("ab", -2.0),
                ("bc", -3.0),
                ("abc", -4.0),
            ],
            false,
        );
        assert_eq!(enc(&spm, "abc", false), [P + 5]);
        assert_eq!(enc(&spm, "bca", false), [P + 4, P]);
        // Equal scores: the leftmost pair merges first.
        let tie = toy(&[("a", 0.0), ("aa", -1.0)], false);
        assert_eq!(enc(&tie, "aaa", false), [P + 1, P]);
    }

    #[test]
    fn spaces_are_escaped_and_prefixed() {
        let spm = toy(&[("▁", -1.0), ("a", -1.0), ("▁a", -0.5)], true);
        assert_eq!(enc(&spm, "a a", false), [P + 1, P + 2]);
        assert_eq!(enc(&spm, "a", true), [P + 2]);
        assert_eq!(enc(&spm, "  ", false), [P, P]);
        assert!(enc(&spm, "", false).is_empty());
        assert_eq!(enc(&spm, "", true), [P]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes_then_unk() {
        let spm = toy(&[("a", -1.0)], false);
        // é = C3 A9, byte tokens are id 1 + byte.
        assert_eq!(enc(&spm, "aé", false), [P, 1 + 0xC3, 1 + 0xA9]);
        let vocab = TextIndex::new(["<unk>", "a"]);
        let no_bytes = (
            vocab,
            Spm::new(
                &TextIndex::new(["<unk>", "a"]),
                vec![0.0, -1.0],
                Some(0),
                false,
            ),
        );
        assert_eq!(enc(&no_bytes, "ab", false), [1, 0]);
    }
}
