//! [`FrameReader`]: a push-based streaming decoder for one connection.

use crate::WireError;
use crate::frame::{DEFAULT_MAX_FRAME_LEN, Frame, LEN_PREFIX, check_len_prefix};

/// Consumed bytes are dropped from the buffer once they exceed this and half the buffer, so a
/// long-lived connection neither grows the buffer nor shifts it after every frame.
const COMPACT_AT: usize = 64 * 1024;

/// Incremental frame decoder: feed it whatever the socket returned with [`FrameReader::push`],
/// then call [`FrameReader::next_frame`] until it yields `Ok(None)`.
///
/// The length prefix is checked against the maximum as soon as its 4 bytes arrive, so an
/// oversized or lying length is rejected before any payload is buffered for it. After the
/// first error the reader is poisoned: every later `next_frame` returns the same error and
/// pushed bytes are discarded — the caller should log it and close the connection.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    pos: usize,
    max_frame_len: u32,
    failed: Option<WireError>,
}

impl Default for FrameReader {
    fn default() -> Self {
        FrameReader::new(DEFAULT_MAX_FRAME_LEN)
    }
}

impl FrameReader {
    /// A reader that rejects frames longer than `max_frame_len` bytes (after the prefix).
    pub fn new(max_frame_len: u32) -> Self {
        FrameReader {
            buf: Vec::new(),
            pos: 0,
            max_frame_len,
            failed: None,
        }
    }

    /// The configured maximum frame length.
    pub fn max_frame_len(&self) -> u32 {
        self.max_frame_len
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The error that poisoned this reader, if any.
    pub fn error(&self) -> Option<&WireError> {
        self.failed.as_ref()
    }

    /// Appends received bytes. Ignored once the reader has failed.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if self.pos > 0
            && (self.pos == self.buf.len() || self.pos >= COMPACT_AT.max(self.buf.len() / 2))
        {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the error that ended
    /// this connection (returned again on every later call).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.decode_one() {
            Ok(frame) => Ok(frame),
            Err(e) => {
                self.failed = Some(e.clone());
                self.buf = Vec::new();
                self.pos = 0;
                Err(e)
            }
        }
    }

    fn decode_one(&mut self) -> Result<Option<Frame>, WireError> {
        let pending = &self.buf[self.pos..];
        let Some(len) = check_len_prefix(pending, self.max_frame_len)? else {
            return Ok(None);
        };
        let total = LEN_PREFIX + len;
        if pending.len() < total {
            return Ok(None);
        }
        let frame = Frame::decode_body(&pending[LEN_PREFIX..total])?;
        self.pos += total;
        Ok(Some(frame))
    }
}
