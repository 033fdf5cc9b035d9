//! Byte-level BPE: GPT-2's byte↔unicode mapping and the ranked merge loop.
//!
//! [`Bpe`] interns every string that can appear during merging (vocabulary entries first, so a piece id
//! below `vocab_size` *is* the token id, then merge halves/results missing from the vocabulary) and keys
//! the merges by piece-id pairs. The merge loop therefore never allocates strings: it works on a linked
//! list of symbols and a binary heap of candidate pairs ordered by (rank, position), exactly like
//! llama.cpp's `llm_tokenizer_bpe_session`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::TokenizerError;
use super::index::TextIndex;

/// GPT-2's reversible mapping of the 256 byte values to printable unicode characters.
pub(crate) fn byte_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            u32::from(b)
        } else {
            extra += 1;
            255 + extra
        };
        // Code points 33..=511 are all valid scalar values.
        table[usize::from(b)] = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// Inverse of [`byte_to_unicode`].
pub(crate) fn unicode_to_byte() -> HashMap<char, u8> {
    byte_to_unicode()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

/// Merge rank and the piece id of the merged string.
#[derive(Debug, Clone, Copy)]
struct Merge {
    rank: u32,
    result: u32,
}

/// The interned pieces and ranked merges of a byte-level BPE vocabulary.
#[derive(Debug)]
pub(crate) struct Bpe {
    /// String → piece id. Ids `< vocab_size` are token ids.
    piece_ids: HashMap<String, u32>,
    vocab_size: u32,
    merges: HashMap<(u32, u32), Merge>,
    /// Piece id of each single byte's mapped character, if interned.
    byte_pieces: [Option<u32>; 256],
    byte_chars: [char; 256],
}

/// A candidate merge in the heap: (rank, left index, right index, left piece, right piece), smallest
/// rank first, then leftmost.
type Candidate = Reverse<(u32, usize, usize, u32, u32)>;

#[derive(Debug, Clone, Copy)]
struct Symbol {
    piece: Option<u32>,
    start: usize,
    end: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Bpe {
    /// Builds the tables from the vocabulary (`tokens[i]` is token `i`) and the merge lines `"a b"`,
    /// ranked by their order.
    pub(crate) fn new(tokens: &TextIndex, merges: &[String]) -> Result<Self, TokenizerError> {
        let vocab_size = tokens.len() as u32;
        let mut piece_ids: HashMap<String, u32> = HashMap::with_capacity(tokens.len() + 1024);
        for (id, text) in tokens.iter().enumerate() {
            // llama.cpp's `token_to_id[text] = id`: a duplicated text maps to its last id.
            piece_ids.insert(text.to_owned(), id as u32);
        }
        let mut next_extra = vocab_size;
        let mut intern = |s: &str, piece_ids: &mut HashMap<String, u32>| -> u32 {
            if let Some(&id) = piece_ids.get(s) {
                return id;
            }
            let id = next_extra;
            next_extra += 1;
            piece_ids.insert(s.to_owned(), id);
            id
        };

        let mut table = HashMap::with_capacity(merges.len());
        for (rank, line) in merges.iter().enumerate() {
            // Like llama.cpp, split at the first space after the first byte.
            let pos = line
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(i, _)| i)
                .ok_or_else(|| TokenizerError::BadMerge {
                    index: rank,
                    line: line.clone(),
                })?;
            let (left, right) = (&line[..pos], &line[pos + 1..]);
            if right.is_empty() {
                return Err(TokenizerError::BadMerge {
                    index: rank,
                    line: line.clone(),
                });
            }
            let l = intern(left, &mut piece_ids);
            let r = intern(right, &mut piece_ids);
            let merged = format!("{left}{right}");
            let result = intern(&merged, &mut piece_ids);
            // A repeated pair keeps its first (best) rank.
            table.entry((l, r)).or_insert(Merge {
                rank: rank as u32,
                result,
            });
        }

        let byte_chars = byte_to_unicode();
        let mut byte_pieces = [None; 256];
        let mut buf = [0u8; 4];
        for (b, c) in byte_chars.iter().enumerate() {
            byte_pieces[b] = piece_ids.get(&*c.encode_utf8(&mut buf)).copied();
        }
        Ok(Self {
            piece_ids,
            vocab_size,
            merges: table,
            byte_pieces,
            byte_chars,
        })
    }

    /// Token id of an exact vocabulary string.
    pub(crate) fn token_id(&self, text: &str) -> Option<u32> {
        self.piece_ids
            .get(text)
            .copied()
            .filter(|&id| id < self.vocab_size)
    }

    /// Maps raw bytes to GPT-2's unicode alphabet, appending to `out`.
    pub(crate) fn encode_bytes(&self, bytes: &[u8], out: &mut String) {
        out.extend(bytes.iter().map(|&b| self.byte_chars[usize::from(b)]));
    }

    /// Encodes one pre-tokenized word, appending token ids to `out`. `scratch` is reused between
    /// calls to avoid allocations.
    pub(crate) fn encode_word(
        &self,
        word: &str,
        ignore_merges: bool,
        scratch: &mut String,
        out: &mut Vec<u32>,
    ) {
        scratch.clear();
        self.encode_bytes(word.as_bytes(), scratch);
        let encoded = scratch.as_str();
        if encoded.is_empty() {
            return;
        }
        if ignore_merges && let Some(id) = self.token_id(encoded) {
            out.push(id);
            return;
        }

        // One symbol per character of the encoded word (each character is one original byte).
        let mut symbols: Vec<Symbol> = Vec::with_capacity(encoded.len());
        for (i, (start, c)) in encoded.char_indices().enumerate() {
            let end = start + c.len_utf8();
            // Look up via the byte table: every char here came from `byte_chars`.
            let piece = word
                .as_bytes()
                .get(i)
                .and_then(|&b| self.byte_pieces[usize::from(b)]);
            symbols.push(Symbol {
                piece,
                start,
                end,
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }

        // Candidate pairs: (rank, left index) smallest first; the pieces are kept to detect stale
        // entries (a side that has since been merged into something else).
        let mut heap: BinaryHeap<Candidate> = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<Candidate>, symbols: &[Symbol], left: usize| {
            let Some(right) = symbols[left].next else {
                return;
            };
            let (Some(l), Some(r)) = (symbols[left].piece, symbols[right].piece) else {
                return;
            };
            if let Some(m) = self.merges.get(&(l, r)) {
                heap.push(Reverse((m.rank, left, right, l, r)));
            }
        };
        for i in 0..symbols.len().saturating_sub(1) {
            push(&mut heap, &symbols, i);
        }

        while let Some(Reverse((_, left, right, l, r))) = heap.pop() {
            let (ls, rs) = (symbols[left], symbols[right]);
            let alive = ls.end > ls.start && rs.end > rs.start;
            if !alive || ls.piece != Some(l) || rs.piece != Some(r) || ls.next != Some(right) {
                continue;
            }
            let Some(merge) = self.merges.get(&(l, r)) else {
                continue;
            };
            symbols[left].piece = Some(merge.result);
            symbols[left].end = rs.end;
            symbols[left].next = rs.next;
            symbols[right].start = rs.end; // mark dead (empty)
            if let Some(n) = rs.next {
                symbols[n].prev = Some(left);
            }
            if let Some(p) = ls.prev {
                push(&mut heap, &symbols, p);
            }
            push(&mut heap, &symbols, left);
        }

        let mut cur = Some(0);
        while let Some(i) = cur {
            let sym = symbols[i];
            cur = sym.next;
            match sym.piece.filter(|&p| p < self.vocab_size) {
                Some(id) => out.push(id),
                // Not a vocabulary entry: llama.cpp emits the tokens of its single bytes that exist.
                None => {
                    for b in encoded[sym.start..sym.end].bytes() {
                        let mut tmp = [0u8; 4];
                        let one = char::from(b).encode_utf8(&mut tmp);
                        if b.is_ascii()
                            && let Some(id) = self.token_id(one)
                        {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_mapping_is_a_bijection() {
        let fwd = byte_to_unicode();
        let back = unicode_to_byte();
        assert_eq!(back.len(), 256);
        for b in 0..=255u8 {
            assert_eq!(back[&fwd[usize::from(b)]], b);
        }
        assert_eq!(fwd[usize::from(b' ')], 'Ġ');
        assert_eq!(fwd[usize::from(b'\n')], 'Ċ');
        assert_eq!(fwd[usize::from(b'a')], 'a');
    }

    fn toy() -> Bpe {
        let tokens = TextIndex::new(["a", "b", "c", "ab", "bc", "abc", "Ġ", "Ġa"]);
        let merges: Vec<String> = ["a b", "Ġ a", "ab c", "b c"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        Bpe::new(&tokens, &merges).expect("valid toy vocab")
    }

    fn enc(bpe: &Bpe, word: &str) -> Vec<u32> {
        let mut out = Vec::new();
        bpe.encode_word(word, false, &mut String::new(), &mut out);
        out
    }

    #[test]
    fn merges_follow_rank_order() {
        let bpe = toy();
        assert_eq!(enc(&bpe, "abc"), [5]);
        assert_eq!(enc(&bpe, "bc"), [4]);
        assert_eq!(enc(&bpe, " a"), [7]);
        assert_eq!(enc(&bpe, "cab"), [2, 3]);
        // Unknown byte with no token: dropped like llama.cpp.
        assert_eq!(enc(&bpe, "az"), [0]);
    }

    #[test]
    fn bad_merge_is_an_error() {
        let tokens = TextIndex::new(["a"]);
        let err = Bpe::new(&tokens, &["ab".to_string()]).unwrap_err();
        assert!(matches!(err, TokenizerError::BadMerge { index: 0, .. }));
    }
}
