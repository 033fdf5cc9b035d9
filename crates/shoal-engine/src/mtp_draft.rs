//! Drafts from the model's own multi-token-prediction block ([`shoal_model::decoder::nextn::Nextn`]: GLM-4.5's
//! `nextn` layer), `Speculation::Mtp`.
//!
//! The block needs the main model's final-normed hidden state at every position, which only the last
//! stage sees: an engine whose last stage is a [`crate::stage::LocalStage`] of a model with the block
//! gets an [`Mtp`] from it ([`crate::stage::Stage::mtp`]); that stage then hands each pass's hidden rows
//! of the sequences registered in its [`MtpTap`] to the tap, by position. A sequence's [`MtpDraft`]
//! (registered while it lives) keeps the block's own one-layer KV cache: at each proposal it feeds the
//! positions it has not seen — position `i` combines hidden row `i` with token `i + 1`, so all but the
//! sequence's last token, whose hidden row the next pass computes — and the last of them gives the
//! first drafted token; each further drafted token is one more step on the block's own output and the
//! token it drafted (as DeepSeek's and GLM's MTP chain), whose cache entries are cut again after.
//! The block's cache follows the verified sequence like the stages' KV does: entries whose token
//! changed, or whose hidden row a later pass computed again (a rewound draft, a recomputed prompt), are
//! cut and fed again. Positions whose hidden rows never came (a prompt prefix served from the cache)
//! are fed with zero rows: the drafts are worse there, never wrong, since the target verifies them.
//! Nothing is drafted until a pass has computed the row of the sequence's next-to-last token (a new
//! request's prompt carries no draft): a first token drafted from a zero row would be wasted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use shoal_model::KvCache;
use shoal_model::decoder::nextn::Nextn;

use crate::draft::DraftSource;
use crate::draft_model::or_none;
use crate::error::EngineError;
use crate::sampler::argmax;

/// Positions the block is fed in one call when it catches up with a sequence (a prompt).
const CATCH_UP_CHUNK: usize = 256;

/// A model's multi-token-prediction block and the tap its last stage fills.
#[derive(Clone, Debug)]
pub struct Mtp {
    pub nextn: Arc<Nextn>,
    pub tap: Arc<MtpTap>,
}

/// One registered sequence's hidden rows not yet fed to its block: positions `start..`.
#[derive(Debug, Default)]
struct Rows {
    start: usize,
    data: Vec<f32>,
    /// The lowest position a pass wrote since the last [`MtpTap::take`] (`usize::MAX`: none).
    dirty_from: usize,
}

/// The final-normed hidden rows the last stage computed for the sequences that draft with the
/// model's multi-token-prediction block, by sequence and position.
#[derive(Debug)]
pub struct MtpTap {
    dim: usize,
    seqs: Mutex<HashMap<u64, Rows>>,
}

/// What [`MtpTap::take`] hands a sequence's drafts.
struct Taken {
    /// The first position of `data`'s rows.
    start: usize,
    data: Vec<f32>,
    dirty_from: usize,
}

impl MtpTap {
    /// A tap of hidden rows of `dim` values.
    pub fn new(dim: usize) -> Self {
        Self {
            dim,
            seqs: Mutex::new(HashMap::new()),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<u64, Rows>) -> R) -> R {
        let mut guard = self.seqs.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    fn register(&self, seq_id: u64) {
        self.with(|m| {
            m.insert(
                seq_id,
                Rows {
                    dirty_from: usize::MAX,
                    ..Rows::default()
                },
            )
        });
    }

    fn unregister(&self, seq_id: u64) {
        self.with(|m| m.remove(&seq_id));
    }

    /// Whether the rows of `seq_id` are wanted.
    pub fn wants(&self, seq_id: u64) -> bool {
        self.with(|m| m.contains_key(&seq_id))
    }

    /// Keeps `rows` (`len × dim`), the hidden states of positions `pos..pos + len` of `seq_id`, when
    /// that sequence is registered; rows it held from `pos` on are replaced.
    pub fn deposit(&self, seq_id: u64, pos: usize, rows: &[f32]) {
        let dim = self.dim;
        self.with(|m| {
            let Some(r) = m.get_mut(&seq_id) else {
                return;
            };
            let end = r.start + r.data.len() / dim;
            if pos < r.start || pos > end {
                // Before what is held, or after a gap: start again from here.
                r.start = pos;
                r.data.clear();
            } else {
                r.data.truncate((pos - r.start) * dim);
            }
            r.data.extend_from_slice(rows);
            r.dirty_from = r.dirty_from.min(pos);
        });
    }

    /// Whether the hidden row of position `pos` of `seq_id` is held (a pass computed it and no
    /// proposal has fed it past).
    fn holds(&self, seq_id: u64, pos: usize) -> bool {
        let dim = self.dim;
        self.with(|m| {
            m.get(&seq_id)
                .is_some_and(|r| (r.start..r.start + r.data.len() / dim).contains(&pos))
        })
    }

    /// The rows of `seq_id` held for positions before `end`, and the lowest position written since
    /// the last take; keeps only the row of position `end - 1` (fed again when nothing came since).
    fn take(&self, seq_id: u64, end: usize) -> Taken {
        let dim = self.dim;
        self.with(|m| {
            let Some(r) = m.get_mut(&seq_id) else {
                return Taken {
                    start: end,
                    data: Vec::new(),
                    dirty_from: usize::MAX,
                };
            };
            let held = r.start + r.data.len() / dim;
            let upto = end.min(held).max(r.start);
            let data = r.data[..(upto - r.start) * dim].to_vec();
            let taken = Taken {
                start: r.start,
                data,
                dirty_from: std::mem::replace(&mut r.dirty_from, usize::MAX),
            };
            let keep_from = end.saturating_sub(1).clamp(r.start, held);
            r.data.drain(..(keep_from - r.start) * dim);
            r.start = keep_from;
            taken
        })
    }
}

/// One sequence's drafts from the model's multi-token-prediction block.
pub struct MtpDraft {
    seq_id: u64,
    mtp: Mtp,
    kv: KvCache,
    /// The token each entry of `kv` combined (entry `i`: the sequence's token `i + 1`).
    fed: Vec<u32>,
}

impl std::fmt::Debug for MtpDraft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MtpDraft")
            .field("seq_id", &self.seq_id)
            .field("fed", &self.fed.len())
            .finish()
    }
}

impl MtpDraft {
    /// Drafts for sequence `seq_id`, registered in the tap until dropped.
    pub fn new(seq_id: u64, mtp: Mtp) -> Self {
        mtp.tap.register(seq_id);
        let kv = mtp.nextn.new_kv_cache();
        Self {
            seq_id,
            mtp,
            kv,
            fed: Vec::new(),
        }
    }

    /// Entries of the block's cache (positions it has fed), for tests.
    pub fn cached(&self) -> usize {
        self.kv.len()
    }

    /// Up to `max` tokens after `tokens`, whose hidden rows up to the next-to-last token the last
    /// stage has computed.
    pub fn try_propose(&mut self, tokens: &[u32], max: usize) -> Result<Vec<u32>, EngineError> {
        let err = |e: shoal_model::ModelError| EngineError::Internal(format!("mtp draft: {e}"));
        // Positions with a hidden row: all but the last token.
        let n = tokens.len() - 1;
        // The first drafted token comes from the row of the next-to-last token. Before a pass has
        // computed it (a new request's prompt) a draft would start from a zero row and be wasted.
        if !self.mtp.tap.holds(self.seq_id, n - 1) {
            return Ok(Vec::new());
        }
        let taken = self.mtp.tap.take(self.seq_id, n);
        let same = self
            .fed
            .iter()
            .zip(&tokens[1..])
            .take_while(|(a, b)| a == b)
            .count();
        let keep = same.min(taken.dirty_from).min(n - 1).min(self.kv.len());
        self.kv.truncate(keep);
        self.fed.truncate(keep);
        let dim = self.mtp.nextn.dim();
        let held = taken.start..taken.start + taken.data.len() / dim;
        let mut out = None;
        let mut pos = keep;
        while pos < n {
            let to = (pos + CATCH_UP_CHUNK).min(n);
            let mut hidden = vec![0f32; (to - pos) * dim];
            for (p, row) in (pos..to).zip(hidden.chunks_exact_mut(dim)) {
                if held.contains(&p) {
                    let at = (p - taken.start) * dim;
                    row.copy_from_slice(&taken.data[at..at + dim]);
                }
            }
            let next = &tokens[pos + 1..=to];
            out = Some(
                self.mtp
                    .nextn
                    .forward(&mut self.kv, next, &hidden)
                    .map_err(err)?,
            );
            self.fed.extend_from_slice(next);
            pos = to;
        }
        let Some(mut out) = out else {
            return Ok(Vec::new());
        };
        let mut draft = Vec::with_capacity(max);
        loop {
            let t = argmax(&out.logits);
            draft.push(t);
            if draft.len() == max {
                break;
            }
            let h = std::mem::take(&mut out.carried);
            out = self
                .mtp
                .nextn
                .forward(&mut self.kv, &[t], &h)
                .map_err(err)?;
        }
        // The chained entries were drafts: keep only the sequence's own.
        self.kv.truncate(n);
        Ok(draft)
    }
}

impl DraftSource for MtpDraft {
    fn propose(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        if max == 0 || tokens.len() < 2 {
            return Vec::new();
        }
        let draft = self.try_propose(tokens, max);
        or_none(draft, || {
            self.kv.truncate(0);
            self.fed.clear();
        })
    }
}

impl Drop for MtpDraft {
    fn drop(&mut self) {
        self.mtp.tap.unregister(self.seq_id);
    }
}
