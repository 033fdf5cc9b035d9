//! [`StreamDecoder`]: incremental detokenization that only ever yields complete UTF-8 text.
//!
//! Byte-level BPE tokens can end in the middle of a multi-byte character (the emoji 🦀 is four bytes
//! spread over several tokens). The decoder appends each token's raw bytes to a small buffer, emits the
//! longest valid UTF-8 prefix and keeps the incomplete tail until the next token completes it. Bytes
//! that can never become valid are emitted as U+FFFD right away, so one bad token cannot stall the
//! stream.

use super::Tokenizer;

/// Turns a stream of token ids into a stream of valid UTF-8 chunks.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tok.token_bytes(id));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // `valid_up_to` bytes are valid UTF-8 by definition.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Invalid bytes: replace them and continue after them.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes whatever is held back, lossily (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Number of bytes held back waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}
