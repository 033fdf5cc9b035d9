//! Prompt lookup ([`NgramDraft`]): drafts by copying an earlier stretch of the sequence itself.
//!
//! A copy is an *offset*: the token at position `x` is predicted to be the one at `x - offset`.
//! Each proposal scores a few candidate offsets by how well the sequence's recent tokens agree with
//! them and copies along the best:
//! - the offset the previous draft followed (and one more or one less: a token inserted or
//!   dropped) — an edit that reproduces its source keeps its alignment across a changed token
//!   (a renamed identifier), where a lookup of the last few tokens finds nothing or finds a wrong
//!   place (the latest earlier occurrence of `" ="`, not the line being copied);
//! - the latest earlier occurrence of the sequence's last `n` tokens (`n` = `max_ngram` down to 1),
//!   found in an index of every n-gram by where it last started.
//!
//! A candidate's *support* is how many of the last [`WINDOW`] tokens agree with it. One that agrees
//! on the last token drafts; so does the followed offset when only the last token broke it after a
//! long run (a substitution: the copy resumes after the changed token). A substitution is taken at
//! once for a rename (`total` → `running`), applied to what is copied later and kept while the copy
//! goes on agreeing after it, so a renamed identifier costs one rejection, not one per occurrence;
//! a dropped or inserted token moves the copy by one. The support
//! comes with [`NgramDraft::propose_scored`]'s draft ([`Proposal`]): the acceptance of drafted
//! tokens climbs with it (`examples/spec_trace` measures it), which a draft length could use.

use std::collections::HashMap;

use super::{DraftSource, Proposal};

/// The longest n-gram [`NgramDraft`] indexes.
pub const MAX_NGRAM: usize = 4;
/// Tokens back that a candidate offset is scored over.
pub const WINDOW: usize = 16;
/// Renames kept at most (the oldest goes first).
const MAX_RENAMES: usize = 16;
/// A followed copy must have matched this many tokens before the one that broke it for the
/// break to count as a substitution.
const SUBSTITUTION_RUN: usize = 4;
/// How far back a run of agreeing tokens is counted.
const RUN_CAP: usize = 4 * WINDOW;

/// Prompt-lookup drafting: copies of the sequence itself (see the module's overview).
///
/// Each n-gram (n = 1..=`max_ngram`) of the tokens seen so far is indexed by where it last started,
/// so a proposal is a few hash lookups and a few short comparisons however long the sequence (a
/// scan per step would cost the engine thread milliseconds a step at long contexts and many
/// sequences); the index grows with the sequence and is rebuilt when it is handed another one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramDraft {
    /// The longest suffix looked up (then shorter ones down to 1).
    pub max_ngram: usize,
    /// The tokens indexed so far.
    seen: Vec<u32>,
    /// `(n, the n-gram's tokens, zero-padded)` → the latest start of that n-gram among those with
    /// at least one token after them.
    latest: HashMap<(usize, [u32; MAX_NGRAM]), usize>,
    /// The offset the last draft copied along, and the sequence's length then.
    follow: Option<(usize, usize)>,
    /// Support the followed copy keeps across a token it dropped or inserted (its offset moved by
    /// one, so the tokens before the edit no longer agree with it).
    carry: usize,
    /// A substitution seen where a followed copy broke: `(copied token, the token in its place, its
    /// position, the copy's offset)`; a rename once the tokens after it follow the copy again.
    pending: Option<(u32, u32, usize, usize)>,
    /// Confirmed renames, `(copied token, the token that replaces it)`, oldest first.
    renames: Vec<(u32, u32)>,
}

impl Default for NgramDraft {
    fn default() -> Self {
        Self::new(3)
    }
}

/// A candidate offset, scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    offset: usize,
    /// Tokens of the last [`WINDOW`] that agree with the offset.
    support: usize,
    /// Consecutive agreeing tokens ending at the last one.
    run: usize,
    /// Only the last token disagrees, after a run of at least [`SUBSTITUTION_RUN`].
    substitution: bool,
}

impl NgramDraft {
    /// Looks up suffixes of `max_ngram` tokens (at most [`MAX_NGRAM`]) down to 1.
    pub fn new(max_ngram: usize) -> Self {
        Self {
            max_ngram: max_ngram.clamp(1, MAX_NGRAM),
            seen: Vec::new(),
            latest: HashMap::new(),
            follow: None,
            carry: 0,
            pending: None,
            renames: Vec::new(),
        }
    }

    fn key(gram: &[u32]) -> (usize, [u32; MAX_NGRAM]) {
        let mut k = [0u32; MAX_NGRAM];
        k[..gram.len()].copy_from_slice(gram);
        (gram.len(), k)
    }

    /// Brings the index to `tokens`: every n-gram that ends before its last token. Another
    /// sequence (not an extension of the one seen) starts everything afresh.
    fn index(&mut self, tokens: &[u32]) {
        let known = self.seen.len();
        if known > tokens.len() || self.seen[..] != tokens[..known] {
            *self = Self::new(self.max_ngram);
        }
        let from = self.seen.len();
        // A gram ending at position e (inclusive) has a token after it once the length exceeds e + 1.
        for end in from.saturating_sub(1)..tokens.len().saturating_sub(1) {
            for n in 1..=self.max_ngram.min(end + 1) {
                let start = end + 1 - n;
                self.latest.insert(Self::key(&tokens[start..=end]), start);
            }
        }
        self.seen.extend_from_slice(&tokens[from..]);
    }

    /// Where the next token is copied from by the latest earlier occurrence of the longest suffix
    /// of `tokens` (indexed) that has one.
    fn lookup(&self, tokens: &[u32]) -> Option<usize> {
        let len = tokens.len();
        (1..=self.max_ngram.min(len.saturating_sub(1)))
            .rev()
            .find_map(|n| {
                let start = self.latest.get(&Self::key(&tokens[len - n..]))?;
                Some(start + n)
            })
    }

    /// What a copy of `copied` writes: its rename, if one was learned.
    fn renamed(&self, copied: u32) -> u32 {
        self.renames
            .iter()
            .find(|r| r.0 == copied)
            .map_or(copied, |r| r.1)
    }

    /// Whether `got` is what a copy of `copied` writes (itself, or its rename).
    fn agrees(&self, got: u32, copied: u32) -> bool {
        got == copied || got == self.renamed(copied)
    }

    /// Scores copying along `offset` at the end of `tokens`.
    fn score(&self, tokens: &[u32], offset: usize) -> Candidate {
        let len = tokens.len();
        let at = |x: usize| x >= offset && self.agrees(tokens[x], tokens[x - offset]);
        let support = (len.saturating_sub(WINDOW)..len).filter(|&x| at(x)).count();
        // Runs are counted as far as they matter (a long repetition is not scanned whole).
        let run = (0..len).rev().take(RUN_CAP).take_while(|&x| at(x)).count();
        let before = (0..len.saturating_sub(1))
            .rev()
            .take(SUBSTITUTION_RUN)
            .take_while(|&x| at(x))
            .count();
        Candidate {
            offset,
            support,
            run,
            substitution: run == 0 && before >= SUBSTITUTION_RUN,
        }
    }

    /// Learns from how the sequence went on since the last proposal, where the followed copy broke
    /// on its last token after a run:
    /// - the token after the copied one came instead: a token dropped, the copy moves on by one;
    /// - another token came: a rename of the copied token to it, tried at once (an edit renames
    ///   consistently) and kept if the copy resumes after it;
    /// - the copied token came one later: a token inserted, the copy moves back by one.
    ///
    /// A rename is dropped where a copy took the token as it was.
    fn learn(&mut self, tokens: &[u32]) {
        let len = tokens.len();
        if let Some((copied, got, x, offset)) = self.pending
            && x + 1 < len
        {
            self.pending = None;
            // Kept when the tokens after it (two, or the one there is) follow the same copy.
            let resumed = (x + 1..len.min(x + 3))
                .all(|y| y >= offset && self.agrees(tokens[y], tokens[y - offset]));
            if !resumed {
                self.renames.retain(|&r| r != (copied, got));
                if x + 2 == len && tokens[x + 1] == copied {
                    self.follow = Some((offset + 1, len));
                    self.carry = WINDOW - 1;
                    return;
                }
            }
        }
        let Some((offset, since)) = self.follow else {
            return;
        };
        // The first token since the last proposal that the copy did not predict.
        let Some(x) =
            (since.max(offset)..len).find(|&x| tokens[x] != self.renamed(tokens[x - offset]))
        else {
            return;
        };
        self.carry = 0;
        let copied = tokens[x - offset];
        self.renames.retain(|r| r.0 != copied);
        let run = (offset..x)
            .rev()
            .take(SUBSTITUTION_RUN)
            .take_while(|&y| self.agrees(tokens[y], tokens[y - offset]))
            .count();
        if tokens[x] == copied || x + 1 != len || run < SUBSTITUTION_RUN {
            return;
        }
        if offset > 1 && tokens[x] == self.renamed(tokens[x + 1 - offset]) {
            self.follow = Some((offset - 1, len));
            self.carry = WINDOW - 1;
            return;
        }
        if self.renames.len() == MAX_RENAMES {
            self.renames.remove(0);
        }
        self.renames.push((copied, tokens[x]));
        self.pending = Some((copied, tokens[x], x, offset));
    }
}

impl DraftSource for NgramDraft {
    fn propose(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        self.propose_scored(tokens, max)
            .map(|p| p.tokens)
            .unwrap_or_default()
    }
}

impl NgramDraft {
    /// [`DraftSource::propose`] with the support the sequence gives the draft (`None`: no copy
    /// found, or `max` is 0).
    pub fn propose_scored(&mut self, tokens: &[u32], max: usize) -> Option<Proposal> {
        let len = tokens.len();
        self.index(tokens);
        self.learn(tokens);
        let followed = self.follow.map(|f| f.0);
        let looked_up = self.lookup(tokens).map(|q| len - q);
        // The followed copy first: among equals, the copy already under way.
        let best = followed
            .into_iter()
            .chain(looked_up)
            .filter(|&o| o >= 1 && o <= len)
            .map(|o| {
                let mut c = self.score(tokens, o);
                if Some(o) == followed && c.run > 0 {
                    c.support = c.support.max(self.carry);
                }
                c
            })
            .filter(|c| c.run > 0 || (c.substitution && Some(c.offset) == followed))
            .fold(None::<Candidate>, |best, c| match best {
                Some(b) if (b.support, b.run) >= (c.support, c.run) => Some(b),
                _ => Some(c),
            });
        let Some(best) = best else {
            self.follow = None;
            self.carry = 0;
            return None;
        };
        if Some(best.offset) != followed {
            self.carry = 0;
        }
        self.follow = Some((best.offset, len));
        if max == 0 {
            return None;
        }
        // Copy from `len - offset` on; past the end the copy reads its own drafted tokens (a
        // repeating stretch shorter than the draft).
        let mut draft: Vec<u32> = Vec::with_capacity(max);
        for i in 0..max {
            let src = len + i - best.offset;
            let next = if src < len {
                self.renamed(tokens[src])
            } else {
                draft[src - len]
            };
            draft.push(next);
        }
        // Just past a substitution (stepped over, or renamed): the copy's resumption is a guess.
        let renamed_last = self.pending.is_some_and(|p| p.2 + 1 == len);
        Some(Proposal {
            tokens: draft,
            support: best.support,
            resync: best.run == 0 || renamed_last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan the index replaces: where the latest earlier occurrence of the longest suffix is
    /// continued.
    fn scanned(tokens: &[u32], max_ngram: usize) -> Option<usize> {
        let len = tokens.len();
        (1..=max_ngram.min(len.saturating_sub(1)))
            .rev()
            .find_map(|n| {
                let tail = &tokens[len - n..];
                (0..len - n)
                    .rev()
                    .find(|&j| &tokens[j..j + n] == tail)
                    .map(|j| j + n)
            })
    }

    #[test]
    fn the_index_finds_what_a_scan_of_the_whole_sequence_finds() {
        let mut rng = crate::sampler::Sampler::new(
            crate::SamplingParams {
                seed: Some(3),
                ..Default::default()
            },
            0,
        );
        for max_ngram in [1, 3, 4] {
            let mut d = NgramDraft::new(max_ngram);
            let mut tokens = Vec::new();
            // A sequence over a small vocabulary grows a token at a time (repeats are common), then
            // another sequence is handed to the same source.
            for step in 0..600 {
                if step == 400 {
                    tokens.truncate(37);
                    tokens[36] ^= 1;
                }
                let mut row = [0.0f32; 6];
                tokens.push(rng.sample(&mut row, &[]));
                d.propose(&tokens, 5);
                let q = d.lookup(&tokens);
                assert_eq!(q, scanned(&tokens, max_ngram), "n {max_ngram} step {step}");
            }
        }
    }

    #[test]
    fn a_match_is_continued_from_its_latest_longest_occurrence() {
        // "1 2 3" occurs at 0 and at 5; the latest earlier one (5) is followed by 9 8.
        let t = [1, 2, 3, 4, 5, 1, 2, 3, 9, 8, 7, 1, 2, 3];
        assert_eq!(NgramDraft::default().propose(&t, 2), vec![9, 8]);
        // Past the sequence's end the copy reads its own draft: the stretch repeats.
        assert_eq!(
            NgramDraft::default().propose(&t, 10),
            vec![9, 8, 7, 1, 2, 3, 9, 8, 7, 1]
        );
        let p = NgramDraft::default()
            .propose_scored(&t, 2)
            .expect("a match");
        // "1 2 3" and the 9 at offset 6 agree; nothing else in the last 14 tokens does.
        assert_eq!((p.support, p.resync), (3, false));
        // No trigram or bigram match: the last token alone (7 occurs at 2).
        let t = [5, 6, 7, 8, 1, 7];
        assert_eq!(NgramDraft::default().propose(&t, 3), vec![8, 1, 7]);
        // Nothing repeats: no draft.
        let mut d = NgramDraft::default();
        assert!(d.propose(&[1, 2, 3], 4).is_empty());
        assert!(d.propose(&[], 4).is_empty());
        assert!(d.propose(&t, 0).is_empty());
    }

    /// The plain lookup: the latest earlier occurrence of the longest suffix, continued.
    fn lookup_draft(tokens: &[u32], k: usize) -> Vec<u32> {
        let len = tokens.len();
        scanned(tokens, 3).map_or_else(Vec::new, |q| tokens[q..(q + k).min(len)].to_vec())
    }

    /// Greedy speculation over a known output: each pass drafts up to `k` tokens after the sequence
    /// so far and takes the accepted ones and one more. Returns the passes' `(drafted, accepted)`.
    fn replay(
        mut propose: impl FnMut(&[u32], usize) -> Vec<u32>,
        prompt: &[u32],
        out: &[u32],
        k: usize,
    ) -> Vec<(usize, usize)> {
        let mut tokens = prompt.to_vec();
        let mut passes = Vec::new();
        let mut j = 0;
        while j < out.len() {
            let draft = propose(&tokens, k.min(out.len() - j - 1));
            let accepted = draft
                .iter()
                .zip(&out[j..])
                .take_while(|(a, b)| a == b)
                .count();
            tokens.extend_from_slice(&out[j..j + accepted + 1]);
            j += accepted + 1;
            passes.push((draft.len(), accepted));
        }
        passes
    }

    /// A "function" of six distinct lines, each an indent (100), an identifier (7), three tokens of
    /// its own and a newline (99).
    fn source() -> Vec<u32> {
        (0..6u32)
            .flat_map(|l| [100, 7, 10 + l * 10, 11 + l * 10, 12 + l * 10, 99])
            .collect()
    }

    fn follower() -> impl FnMut(&[u32], usize) -> Vec<u32> {
        let mut d = NgramDraft::default();
        move |t, k| d.propose(t, k)
    }

    #[test]
    fn a_copy_is_followed_across_a_renamed_token_and_the_rename_is_learned() {
        let f = source();
        // The prompt shows the function, then asks for 7 renamed 8; the output is the edit.
        let prompt: Vec<u32> = [vec![1, 2], f.clone(), vec![3, 7, 4, 8, 5, 100, 7]].concat();
        let out: Vec<u32> = f[2..].iter().map(|&t| if t == 7 { 8 } else { t }).collect();
        let passes = replay(follower(), &prompt, &out, 8);
        // Line 0 is copied, line 1's 7 breaks the copy once; the copy resumes after it, and every
        // later 7 is drafted as 8: all drafts accepted whole after that one.
        // (The first draft copies the latest "100 7", line 5.)
        assert_eq!(
            passes,
            [(8, 0), (8, 4), (8, 8), (8, 8), (8, 8), (0, 0)],
            "{passes:?}"
        );
        // The plain lookup finds "8" in the prompt's request after each renamed 7, or finds
        // nothing, and copies from the first line that has the last tokens.
        let plain = replay(lookup_draft, &prompt, &out, 8);
        assert!(plain.len() >= passes.len() + 3, "{plain:?}");
    }

    #[test]
    fn a_rename_the_output_does_not_keep_is_dropped() {
        let f = source();
        let prompt: Vec<u32> = [vec![1, 2], f.clone(), vec![3, 100, 7]].concat();
        // Line 1 renames 7 to 8, the later lines keep 7.
        let out: Vec<u32> = f[2..]
            .iter()
            .enumerate()
            .map(|(i, &t)| if t == 7 && i < 10 { 8 } else { t })
            .collect();
        let mut d = NgramDraft::default();
        let passes = replay(|t, k| d.propose(t, k), &prompt, &out, 8);
        assert!(d.renames.is_empty(), "{:?}", d.renames);
        // The first draft (line 5's "100 7"), the rename, then the first 7 kept.
        assert_eq!(passes.iter().filter(|p| p.1 < p.0).count(), 3, "{passes:?}");
    }

    #[test]
    fn a_token_inserted_or_dropped_in_a_copy_is_stepped_over() {
        let f = source();
        let prompt: Vec<u32> = [vec![1, 2], f.clone(), vec![3, 100, 7]].concat();
        // The copy drops line 2's fourth token and inserts 55 after line 4's third.
        let mut out = f[2..].to_vec();
        out.insert(6 * 4 + 1, 55);
        out.remove(6 * 2 + 1);
        let passes = replay(follower(), &prompt, &out, 8);
        // The first draft, the dropped token, the inserted one (taken for a rename, then not).
        assert_eq!(passes.iter().filter(|p| p.1 < p.0).count(), 4, "{passes:?}");
        let plain = replay(lookup_draft, &prompt, &out, 8);
        assert!(plain.len() > passes.len(), "{plain:?} vs {passes:?}");
    }
}
