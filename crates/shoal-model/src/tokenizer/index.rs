//! [`TextIndex`]: a vocabulary's token texts in one buffer, with an open-addressing hash table from
//! text to id.
//!
//! Gemma 3 has 262,144 tokens: one `String` and one hash-map key per token cost two allocations each
//! and dominated the tokenizer's load time. Here every text is appended to one `String` arena and the
//! table holds only `u32` slots (id + 1, 0 = empty) at most half full, probed linearly with a
//! multiplicative hash of 8-byte words.

/// Token texts by id, and ids by text.
#[derive(Debug)]
pub(crate) struct TextIndex {
    arena: String,
    /// Text `i` is `arena[starts[i]..starts[i + 1]]`.
    starts: Vec<usize>,
    slots: Vec<u32>,
    /// `64 - log2(slots.len())`: the hash's top bits pick the slot.
    shift: u32,
}

impl TextIndex {
    /// Indexes `texts` (id = position). A text that appears twice maps to its last id, as llama.cpp's
    /// `token_to_id` does.
    pub(crate) fn new<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut arena = String::new();
        let mut starts = vec![0];
        for text in texts {
            arena.push_str(text);
            starts.push(arena.len());
        }
        let n = starts.len() - 1;
        let bits = (2 * n).max(2).next_power_of_two().trailing_zeros();
        let mut index = Self {
            arena,
            starts,
            slots: vec![0; 1 << bits],
            shift: 64 - bits,
        };
        for id in 0..n as u32 {
            let slot = index.find_slot(index.text_of(id));
            index.slots[slot] = id + 1;
        }
        index
    }

    /// Number of texts.
    pub(crate) fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// The text of `id`, if it is in range.
    pub(crate) fn text(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.len()).then(|| self.text_of(id))
    }

    /// All texts in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len() as u32).map(|id| self.text_of(id))
    }

    /// The id of `text`, if it is one of the texts.
    pub(crate) fn get(&self, text: &str) -> Option<u32> {
        self.slots[self.find_slot(text)].checked_sub(1)
    }

    fn text_of(&self, id: u32) -> &str {
        let i = id as usize;
        &self.arena[self.starts[i]..self.starts[i + 1]]
    }

    /// The slot holding `text`, or the empty slot where it would go.
    fn find_slot(&self, text: &str) -> usize {
        let mask = self.slots.len() - 1;
        let mut slot = (hash(text.as_bytes()) >> self.shift) as usize;
        loop {
            match self.slots[slot] {
                0 => return slot,
                id if self.text_of(id - 1) == text => return slot,
                _ => slot = (slot + 1) & mask,
            }
        }
    }
}

/// A fast multiplicative hash over 8-byte words (well mixed in the top bits, which pick the slot).
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    h ^ (h >> 29)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_text_and_nothing_else() {
        let texts: Vec<String> = (0..5000).map(|i| format!("t{i}")).collect();
        let index = TextIndex::new(texts.iter().map(String::as_str));
        assert_eq!(index.len(), 5000);
        for (i, t) in texts.iter().enumerate() {
            assert_eq!(index.get(t), Some(i as u32));
            assert_eq!(index.text(i as u32), Some(t.as_str()));
        }
        assert_eq!(index.get("t5000"), None);
        assert_eq!(index.get(""), None);
        assert_eq!(index.text(5000), None);
        assert_eq!(index.iter().count(), 5000);
    }

    #[test]
    fn repeated_text_keeps_last_id_and_empty_text_is_indexed() {
        let index = TextIndex::new(["a", "", "a", "longer than eight bytes ▁"]);
        assert_eq!(index.get("a"), Some(2));
        assert_eq!(index.get(""), Some(1));
        assert_eq!(index.get("longer than eight bytes ▁"), Some(3));
        assert_eq!(index.text(0), Some("a"));
        let empty = TextIndex::new([]);
        assert_eq!(empty.len(), 0);
        assert_eq!(empty.get("a"), None);
    }
}
