//! What flows through the stage seam besides the trait itself: a batch's description ([`ChunkSpec`]), the
//! data passed from stage to stage ([`StageData`]: tokens, hidden states, logits or sampled [`Outputs`])
//! and the operations on a stage's KV ([`KvOp`]). [`crate::stage`] re-exports them; they live apart so
//! that the stages' shared KV bookkeeping ([`crate::seqkv`]) and the stage seam do not import each other.

use shoal_model::HostMatrix;

/// What the last stage returns of a chunk's final hidden states, for embeddings.
pub use shoal_model::Pool;

/// One sequence's part of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSpec {
    pub seq_id: u64,
    /// Tokens of this sequence in the batch (1 when decoding).
    pub len: usize,
    /// Whether the last stage must return logits for this chunk's last token (for the last
    /// `1 + draft` tokens when its [`crate::stage::SampleRef`] carries a draft to verify).
    pub want_logits: bool,
    /// What the last stage returns of this chunk's final hidden states (embeddings).
    pub pool: Pool,
}

/// A token picked by the last stage, with its log-probability and the most likely alternatives when
/// the request asked for them (both of the model's raw logits: before the mask, penalties and
/// temperature).
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    pub id: u32,
    pub logprob: f32,
    /// `(token, logprob)`, best first; empty unless asked.
    pub top: Vec<(u32, f32)>,
}

/// What flows between stages (activations in host memory: a stage on another node sends them as they
/// are, local layers compute in them).
pub enum StageData {
    Tokens(Vec<u32>),
    /// `(total tokens, dim)` hidden states.
    Hidden(HostMatrix),
    /// The last stage's `(chunks wanting logits, vocab)` logits and `(chunks pooling, dim)` pooled
    /// rows.
    Logits {
        logits: HostMatrix,
        pooled: HostMatrix,
    },
    /// Tokens already sampled, one per chunk wanting logits, in batch order (a remote last stage samples
    /// where the logits are, so only token ids travel back), and the pooled rows.
    Sampled(Outputs),
}

/// What a batch produced for the engine: one pick per chunk wanting logits (one to `1 + draft` for a
/// chunk verifying a draft: the accepted drafted tokens, then one more — see [`crate::verify`]) and
/// one pooled row per chunk pooling, each in batch order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outputs {
    pub picks: Vec<Pick>,
    /// `(chunks pooling, dim)`; `0 × 0` when none pools.
    pub pooled: HostMatrix,
}

impl From<Vec<Pick>> for Outputs {
    fn from(picks: Vec<Pick>) -> Self {
        Outputs {
            picks,
            pooled: HostMatrix::default(),
        }
    }
}

/// An operation on the KV a stage keeps for sequences and cached prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvOp {
    /// Free everything held for the sequence (unknown ids are ignored).
    Release { seq_id: u64 },
    /// Keep the first `len` tokens of the sequence's KV as prefix `prefix_id` and free the sequence.
    Retain {
        seq_id: u64,
        prefix_id: u64,
        len: usize,
    },
    /// Start the sequence with a copy of the first `len` tokens of prefix `prefix_id`.
    Start {
        prefix_id: u64,
        seq_id: u64,
        len: usize,
    },
    /// Free the prefix (unknown ids are ignored).
    DropPrefix { prefix_id: u64 },
    /// Start sequence `into` with a copy of the first `len` tokens of sequence `seq_id`'s KV (the
    /// choices of one prompt share its prefill).
    Fork { seq_id: u64, into: u64, len: usize },
    /// Keep only the first `len` tokens of the sequence's KV (speculative decoding drops the
    /// positions of drafted tokens it rejected; unknown ids and shorter caches are left as they are).
    Rewind { seq_id: u64, len: usize },
}
