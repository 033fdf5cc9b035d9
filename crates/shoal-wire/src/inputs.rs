//! [`Inputs`]: a batch's token ids, as a tensor-parallel group's rank 0 sends them to the other
//! members (each embeds them itself: 4 bytes a token instead of a hidden state's thousands).

use crate::WireError;
use crate::chunk::ChunkHeader;

/// A batch's token ids for a group member: one per row of its chunks, in chunk order.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    pub batch_id: u64,
    pub chunks: Vec<ChunkHeader>,
    pub tokens: Vec<u32>,
}

impl Inputs {
    /// Checks that the chunks' lengths add up to the token count.
    pub fn validate(&self) -> Result<(), WireError> {
        let chunk_rows: u64 = self.chunks.iter().map(|c| c.len as u64).sum();
        if chunk_rows != self.tokens.len() as u64 {
            return Err(WireError::ShapeMismatch {
                rows: u32::try_from(self.tokens.len()).unwrap_or(u32::MAX),
                chunk_rows,
            });
        }
        Ok(())
    }
}
