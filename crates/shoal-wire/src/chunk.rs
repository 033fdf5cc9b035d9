//! [`ChunkHeader`]: one sequence's slice of a batch's rows, as activation and input frames carry it,
//! with its [`Pool`] request, and their encoding.

use crate::WireError;
use crate::cursor::Cursor;

/// Encoded size of one [`ChunkHeader`].
pub const CHUNK_HEADER_LEN: usize = 19;

const FLAG_WANT_LOGITS: u8 = 0x01;
/// Bits 1–2 of a chunk's flags: its [`Pool`].
const POOL_SHIFT: u8 = 1;
const POOL_MASK: u8 = 0x03 << POOL_SHIFT;

/// What the last stage returns of a chunk's final hidden states (after the output norm), for
/// embeddings: nothing, their sum, the last row or the first row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pool {
    #[default]
    None,
    Sum,
    Last,
    First,
}

impl Pool {
    fn bits(self) -> u8 {
        let tag = match self {
            Pool::None => 0,
            Pool::Sum => 1,
            Pool::Last => 2,
            Pool::First => 3,
        };
        tag << POOL_SHIFT
    }

    fn from_flags(flags: u8) -> Self {
        match (flags & POOL_MASK) >> POOL_SHIFT {
            1 => Pool::Sum,
            2 => Pool::Last,
            3 => Pool::First,
            _ => Pool::None,
        }
    }
}

/// One sequence's slice of the rows in an activations frame (chunked prefill or one decode row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub seq_id: u64,
    /// Position of the chunk's first token in its sequence.
    pub start_pos: u32,
    /// Number of rows (tokens) of this chunk.
    pub len: u32,
    /// Whether the last stage must compute logits (and sample) for this chunk.
    pub want_logits: bool,
    /// What the last stage returns of this chunk's hidden states (a [`Frame::Pooled`] row).
    pub pool: Pool,
    /// Drafted tokens at the chunk's end that the last stage verifies (speculative decoding): it
    /// computes a logits row for each of the chunk's last `drafted + 1` tokens. 0 otherwise. A
    /// stage that also receives the chunk's sample job reads the draft there; a tensor-parallel
    /// group's members, which get no jobs, read the count here.
    pub drafted: u16,
}

impl ChunkHeader {
    fn flags(&self) -> u8 {
        let logits = if self.want_logits {
            FLAG_WANT_LOGITS
        } else {
            0
        };
        logits | self.pool.bits()
    }
}

/// A chunk count and that many chunk headers.
pub(crate) fn decode_chunk_headers(c: &mut Cursor<'_>) -> Result<Vec<ChunkHeader>, WireError> {
    let n = c.count(CHUNK_HEADER_LEN)?;
    let mut chunks = Vec::with_capacity(n);
    for _ in 0..n {
        let seq_id = c.u64()?;
        let start_pos = c.u32()?;
        let len = c.u32()?;
        let flags = c.u8()?;
        let drafted = c.u16()?;
        if flags & !(FLAG_WANT_LOGITS | POOL_MASK) != 0 {
            return Err(WireError::ReservedFlags(flags));
        }
        let want_logits = flags & FLAG_WANT_LOGITS != 0;
        if drafted > 0 && (!want_logits || u32::from(drafted) >= len) {
            return Err(WireError::BadDraft { drafted, len });
        }
        chunks.push(ChunkHeader {
            seq_id,
            start_pos,
            len,
            want_logits,
            pool: Pool::from_flags(flags),
            drafted,
        });
    }
    Ok(chunks)
}

/// A chunk count and the chunks' headers.
pub(crate) fn write_chunk_headers(out: &mut Vec<u8>, chunks: &[ChunkHeader]) {
    out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
    for c in chunks {
        out.extend_from_slice(&c.seq_id.to_le_bytes());
        out.extend_from_slice(&c.start_pos.to_le_bytes());
        out.extend_from_slice(&c.len.to_le_bytes());
        out.push(c.flags());
        out.extend_from_slice(&c.drafted.to_le_bytes());
    }
}
