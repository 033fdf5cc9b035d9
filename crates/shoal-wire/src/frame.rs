//! [`Frame`] and its payload types, with encoding and single-frame decoding.

use crate::WireError;
use crate::chunk::{CHUNK_HEADER_LEN, ChunkHeader, decode_chunk_headers, write_chunk_headers};
use crate::cursor::Cursor;
use crate::f16::{
    decode_f16_to_f32, decode_f32_le, encode_f32_as_f16, encode_f32_as_f16_into, encode_f32_le,
    encode_f32_le_into,
};
use crate::inputs::Inputs;
use crate::job::{SampleJob, decode_sample_job, sample_job_len, write_sample_job};

/// Default maximum frame length (bytes after the length prefix): 64 MiB.
pub const DEFAULT_MAX_FRAME_LEN: u32 = 64 * 1024 * 1024;
/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 4;

/// Frame kind bytes.
pub mod kind {
    pub const ACTIVATIONS: u8 = 1;
    pub const TOKENS: u8 = 2;
    pub const RELEASE: u8 = 3;
    pub const PING: u8 = 4;
    pub const PONG: u8 = 5;
    pub const ERROR: u8 = 6;
    pub const SAMPLE: u8 = 7;
    pub const PREFIX: u8 = 8;
    pub const POOLED: u8 = 9;
    pub const LANE: u8 = 10;
    pub const INPUTS: u8 = 11;
}

/// Encoded size of one [`TokenItem`] without its alternatives (each adds 8 bytes).
pub const TOKEN_ITEM_LEN: usize = 17;
/// Encoded size of a [`PrefixOp`].
pub const PREFIX_OP_LEN: usize = 21;

/// Element type of activation data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }

    /// Tag byte on the wire.
    pub fn tag(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
        }
    }

    /// Parses a tag byte.
    pub fn from_tag(tag: u8) -> Result<Self, WireError> {
        match tag {
            0 => Ok(DType::F32),
            1 => Ok(DType::F16),
            other => Err(WireError::UnknownDType(other)),
        }
    }
}

/// Hidden states of a batch, row-major `[rows, cols]`, rows ordered chunk by chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct Activations {
    pub batch_id: u64,
    pub chunks: Vec<ChunkHeader>,
    pub dtype: DType,
    /// `[rows, cols]`; rows equals the sum of the chunk lengths.
    pub shape: [u32; 2],
    /// Little-endian elements of `dtype`, exactly `rows * cols * dtype.size()` bytes.
    pub data: Vec<u8>,
}

impl Activations {
    /// Builds a frame payload from f32 hidden states (`rows * cols` values, rows = sum of chunk
    /// lengths), stored as `dtype` — use [`DType::F16`] to halve the bytes on the wire.
    pub fn from_f32(
        batch_id: u64,
        chunks: Vec<ChunkHeader>,
        cols: u32,
        values: &[f32],
        dtype: DType,
    ) -> Result<Self, WireError> {
        let rows = f32_rows(&chunks, cols, values, dtype)?;
        let data = match dtype {
            DType::F32 => encode_f32_le(values),
            DType::F16 => encode_f32_as_f16(values),
        };
        Ok(Activations {
            batch_id,
            chunks,
            dtype,
            shape: [rows, cols],
            data,
        })
    }

    /// The encoded [`Frame::Activations`] of f32 hidden states, written straight from `values`: byte
    /// for byte what `Frame::Activations(Activations::from_f32(..)?).encode()` returns, without the
    /// intermediate copy (the [`DEFAULT_MAX_FRAME_LEN`] limit applies).
    pub fn encode_f32(
        batch_id: u64,
        chunks: &[ChunkHeader],
        cols: u32,
        values: &[f32],
        dtype: DType,
    ) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::new();
        Self::encode_f32_into(&mut out, batch_id, chunks, cols, values, dtype)?;
        Ok(out)
    }

    /// [`Activations::encode_f32`] appended to `out` (after other frames of the same write); on error
    /// `out` is left as it was.
    pub fn encode_f32_into(
        out: &mut Vec<u8>,
        batch_id: u64,
        chunks: &[ChunkHeader],
        cols: u32,
        values: &[f32],
        dtype: DType,
    ) -> Result<(), WireError> {
        let rows = f32_rows(chunks, cols, values, dtype)?;
        let len =
            activations_payload_len(chunks.len(), values.len() as u64 * dtype.size() as u64) + 1;
        if len > DEFAULT_MAX_FRAME_LEN as u64 {
            return Err(WireError::FrameTooLarge {
                len,
                max: DEFAULT_MAX_FRAME_LEN,
            });
        }
        let start = out.len();
        out.reserve(LEN_PREFIX + len as usize);
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.push(kind::ACTIVATIONS);
        write_activations_head(out, batch_id, chunks, dtype, [rows, cols]);
        match dtype {
            DType::F32 => encode_f32_le_into(values, out),
            DType::F16 => encode_f32_as_f16_into(values, out),
        }
        debug_assert_eq!((out.len() - start) as u64, LEN_PREFIX as u64 + len);
        Ok(())
    }

    /// The hidden states as f32, whatever the wire dtype.
    pub fn to_f32(&self) -> Result<Vec<f32>, WireError> {
        self.validate()?;
        match self.dtype {
            DType::F32 => decode_f32_le(&self.data),
            DType::F16 => decode_f16_to_f32(&self.data),
        }
    }

    /// Checks rows = sum of chunk lengths and data length = rows * cols * dtype size.
    pub fn validate(&self) -> Result<(), WireError> {
        let [rows, cols] = self.shape;
        let chunk_rows: u64 = self.chunks.iter().map(|c| c.len as u64).sum();
        if rows as u64 != chunk_rows {
            return Err(WireError::ShapeMismatch { rows, chunk_rows });
        }
        let expected = data_len(rows, cols, self.dtype);
        let got = self.data.len() as u64;
        if expected != Some(got) {
            return Err(WireError::DataLength {
                expected: expected.unwrap_or(u64::MAX),
                got,
            });
        }
        Ok(())
    }
}

/// A sampled token going back to the node that owns the request.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenItem {
    pub seq_id: u64,
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first (as many as the job's
    /// `top_logprobs` asked; at most 255 on the wire).
    pub top: Vec<(u32, f32)>,
}

/// Pooled hidden states of a batch's chunks that asked for them ([`ChunkHeader::pool`]), one row of
/// `cols` values per chunk, in batch order; sent by the last stage before the batch's tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Pooled {
    pub batch_id: u64,
    pub seq_ids: Vec<u64>,
    pub cols: u32,
    /// `seq_ids.len() × cols` values, row-major.
    pub values: Vec<f32>,
}

impl Pooled {
    /// Checks that the values fill one row of `cols` per sequence.
    pub fn validate(&self) -> Result<(), WireError> {
        let expected = self.seq_ids.len() as u64 * self.cols as u64 * 4;
        let got = self.values.len() as u64 * 4;
        if expected != got {
            return Err(WireError::DataLength { expected, got });
        }
        Ok(())
    }

    /// Row `i` (the pooled states of `seq_ids[i]`).
    pub fn row(&self, i: usize) -> Option<&[f32]> {
        let cols = self.cols as usize;
        self.values.get(i * cols..(i + 1) * cols)
    }
}

/// What a [`PrefixOp`] does to a stage's KV caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixAction {
    /// Keep the first `len` tokens of `seq_id` as prefix `prefix_id`, free the sequence.
    Retain,
    /// Start `seq_id` from the first `len` tokens of prefix `prefix_id`.
    Start,
    /// Free prefix `prefix_id`.
    Drop,
    /// Start a new sequence — its id travels in `prefix_id` — with a copy of the first `len` tokens of
    /// `seq_id` (`n` choices of one prompt, prefilled once).
    Fork,
    /// Leave `seq_id` with exactly its first `len` tokens (a driver sending again what a cut path left
    /// unconfirmed): cut back when it holds more; when it is gone (released after the batch being sent
    /// again), a placeholder of `len` blank tokens whose outputs mean nothing and whose KV is never kept.
    Rewind,
    /// Free every sequence and prefix (version 5): a tensor-parallel group's rank 0 whose stage was
    /// cleared (its upstream pipeline went) tells its members; ids and length are zero.
    Clear,
}

impl PrefixAction {
    fn tag(self) -> u8 {
        match self {
            PrefixAction::Retain => 1,
            PrefixAction::Start => 2,
            PrefixAction::Drop => 3,
            PrefixAction::Fork => 4,
            PrefixAction::Rewind => 5,
            PrefixAction::Clear => 6,
        }
    }

    fn from_tag(tag: u8) -> Result<Self, WireError> {
        match tag {
            1 => Ok(PrefixAction::Retain),
            2 => Ok(PrefixAction::Start),
            3 => Ok(PrefixAction::Drop),
            4 => Ok(PrefixAction::Fork),
            5 => Ok(PrefixAction::Rewind),
            6 => Ok(PrefixAction::Clear),
            other => Err(WireError::UnknownPrefixAction(other)),
        }
    }
}

/// A prefix-cache operation every stage applies to its own KV caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixOp {
    pub action: PrefixAction,
    pub seq_id: u64,
    pub prefix_id: u64,
    pub len: u32,
}

/// One message on a data-plane connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Hidden states from stage N to stage N+1.
    Activations(Activations),
    /// Sampled tokens from the last stage to the request owner.
    Tokens {
        batch_id: u64,
        items: Vec<TokenItem>,
    },
    /// Sequences cancelled or finished: free their KV cache.
    Release {
        seq_ids: Vec<u64>,
    },
    Ping {
        nonce: u64,
    },
    Pong {
        nonce: u64,
    },
    /// The peer reports a problem (it usually closes the connection afterwards).
    Error {
        code: u16,
        message: String,
    },
    /// Sampling instructions for the chunks of batch `batch_id` that want logits, sent ahead of its
    /// activations and passed along to the last stage.
    Sample {
        batch_id: u64,
        jobs: Vec<SampleJob>,
    },
    /// A prefix-cache operation, applied by every stage and passed along.
    Prefix(PrefixOp),
    /// Pooled hidden states from the last stage to the request owner (embeddings).
    Pooled(Pooled),
    /// Setting up a direct connection for a stream's frames (a *lane*): the accepting side offers the
    /// TCP `port` it listens on and a secret `token` (this frame travels on the encrypted stream);
    /// the opening side answers with `port` 1 when it connected and 0 when it did not (the token
    /// then zero). Port 0 in an offer: no lane.
    Lane {
        port: u16,
        token: [u8; 32],
    },
    /// A batch's token ids, from a tensor-parallel group's rank 0 to its other members (version 5).
    Inputs(Inputs),
}

impl Frame {
    /// The kind byte of this frame.
    pub fn kind(&self) -> u8 {
        match self {
            Frame::Activations(_) => kind::ACTIVATIONS,
            Frame::Tokens { .. } => kind::TOKENS,
            Frame::Release { .. } => kind::RELEASE,
            Frame::Ping { .. } => kind::PING,
            Frame::Pong { .. } => kind::PONG,
            Frame::Error { .. } => kind::ERROR,
            Frame::Sample { .. } => kind::SAMPLE,
            Frame::Prefix(_) => kind::PREFIX,
            Frame::Pooled(_) => kind::POOLED,
            Frame::Lane { .. } => kind::LANE,
            Frame::Inputs(_) => kind::INPUTS,
        }
    }

    /// Encodes with the [`DEFAULT_MAX_FRAME_LEN`] limit.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::new();
        self.encode_into(&mut out, DEFAULT_MAX_FRAME_LEN)?;
        Ok(out)
    }

    /// Appends the encoded frame (length prefix included) to `out`. Refuses frames the peer
    /// would reject: invalid activations, or a length over `max_frame_len`. On error `out` is
    /// left as it was.
    pub fn encode_into(&self, out: &mut Vec<u8>, max_frame_len: u32) -> Result<(), WireError> {
        match self {
            Frame::Activations(a) => a.validate()?,
            Frame::Pooled(p) => p.validate()?,
            Frame::Inputs(i) => i.validate()?,
            _ => {}
        }
        let len = self.payload_len() + 1;
        if len > max_frame_len as u64 {
            return Err(WireError::FrameTooLarge {
                len,
                max: max_frame_len,
            });
        }
        let start = out.len();
        out.reserve(LEN_PREFIX + len as usize);
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.push(self.kind());
        self.write_payload(out);
        debug_assert_eq!((out.len() - start) as u64, LEN_PREFIX as u64 + len);
        Ok(())
    }

    fn payload_len(&self) -> u64 {
        match self {
            Frame::Activations(a) => activations_payload_len(a.chunks.len(), a.data.len() as u64),
            Frame::Tokens { items, .. } => {
                8 + 4
                    + items
                        .iter()
                        .map(|t| (TOKEN_ITEM_LEN + 8 * t.top.len().min(255)) as u64)
                        .sum::<u64>()
            }
            Frame::Release { seq_ids } => 4 + 8 * seq_ids.len() as u64,
            Frame::Ping { .. } | Frame::Pong { .. } => 8,
            Frame::Error { message, .. } => 2 + message.len() as u64,
            Frame::Sample { jobs, .. } => 8 + 4 + jobs.iter().map(sample_job_len).sum::<u64>(),
            Frame::Prefix(_) => PREFIX_OP_LEN as u64,
            Frame::Pooled(p) => 8 + 4 + 4 + 8 * p.seq_ids.len() as u64 + 4 * p.values.len() as u64,
            Frame::Lane { .. } => 2 + 32,
            Frame::Inputs(i) => {
                8 + 4 + (i.chunks.len() * CHUNK_HEADER_LEN) as u64 + 4 + 4 * i.tokens.len() as u64
            }
        }
    }

    fn write_payload(&self, out: &mut Vec<u8>) {
        match self {
            Frame::Activations(a) => {
                write_activations_head(out, a.batch_id, &a.chunks, a.dtype, a.shape);
                out.extend_from_slice(&a.data);
            }
            Frame::Tokens { batch_id, items } => {
                out.extend_from_slice(&batch_id.to_le_bytes());
                out.extend_from_slice(&(items.len() as u32).to_le_bytes());
                for t in items {
                    out.extend_from_slice(&t.seq_id.to_le_bytes());
                    out.extend_from_slice(&t.token.to_le_bytes());
                    out.extend_from_slice(&t.logprob.to_le_bytes());
                    let top = &t.top[..t.top.len().min(255)];
                    out.push(top.len() as u8);
                    for (id, lp) in top {
                        out.extend_from_slice(&id.to_le_bytes());
                        out.extend_from_slice(&lp.to_le_bytes());
                    }
                }
            }
            Frame::Release { seq_ids } => {
                out.extend_from_slice(&(seq_ids.len() as u32).to_le_bytes());
                for s in seq_ids {
                    out.extend_from_slice(&s.to_le_bytes());
                }
            }
            Frame::Ping { nonce } | Frame::Pong { nonce } => {
                out.extend_from_slice(&nonce.to_le_bytes());
            }
            Frame::Lane { port, token } => {
                out.extend_from_slice(&port.to_le_bytes());
                out.extend_from_slice(token);
            }
            Frame::Error { code, message } => {
                out.extend_from_slice(&code.to_le_bytes());
                out.extend_from_slice(message.as_bytes());
            }
            Frame::Sample { batch_id, jobs } => {
                out.extend_from_slice(&batch_id.to_le_bytes());
                out.extend_from_slice(&(jobs.len() as u32).to_le_bytes());
                for j in jobs {
                    write_sample_job(j, out);
                }
            }
            Frame::Prefix(op) => {
                out.push(op.action.tag());
                out.extend_from_slice(&op.seq_id.to_le_bytes());
                out.extend_from_slice(&op.prefix_id.to_le_bytes());
                out.extend_from_slice(&op.len.to_le_bytes());
            }
            Frame::Pooled(p) => {
                out.extend_from_slice(&p.batch_id.to_le_bytes());
                out.extend_from_slice(&(p.seq_ids.len() as u32).to_le_bytes());
                out.extend_from_slice(&p.cols.to_le_bytes());
                for s in &p.seq_ids {
                    out.extend_from_slice(&s.to_le_bytes());
                }
                encode_f32_le_into(&p.values, out);
            }
            Frame::Inputs(i) => {
                out.extend_from_slice(&i.batch_id.to_le_bytes());
                write_chunk_headers(out, &i.chunks);
                out.extend_from_slice(&(i.tokens.len() as u32).to_le_bytes());
                for t in &i.tokens {
                    out.extend_from_slice(&t.to_le_bytes());
                }
            }
        }
    }

    /// Decodes one frame body: the kind byte and its payload, without the length prefix.
    /// Every field is checked; nothing is allocated beyond what `body` already holds.
    pub fn decode_body(body: &[u8]) -> Result<Frame, WireError> {
        let mut c = Cursor::new(body);
        let k = c.u8().map_err(|_| WireError::EmptyFrame)?;
        let frame = match k {
            kind::ACTIVATIONS => Frame::Activations(decode_activations(&mut c)?),
            kind::TOKENS => {
                let batch_id = c.u64()?;
                let n = c.count(TOKEN_ITEM_LEN)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    let (seq_id, token, logprob) = (c.u64()?, c.u32()?, c.f32()?);
                    let k = c.u8()? as usize;
                    let mut top = Vec::with_capacity(k.min(c.remaining() / 8));
                    for _ in 0..k {
                        top.push((c.u32()?, c.f32()?));
                    }
                    items.push(TokenItem {
                        seq_id,
                        token,
                        logprob,
                        top,
                    });
                }
                Frame::Tokens { batch_id, items }
            }
            kind::RELEASE => {
                let n = c.count(8)?;
                let mut seq_ids = Vec::with_capacity(n);
                for _ in 0..n {
                    seq_ids.push(c.u64()?);
                }
                Frame::Release { seq_ids }
            }
            kind::PING => Frame::Ping { nonce: c.u64()? },
            kind::PONG => Frame::Pong { nonce: c.u64()? },
            kind::ERROR => {
                let code = c.u16()?;
                let message = std::str::from_utf8(c.rest())
                    .map_err(|_| WireError::InvalidUtf8)?
                    .to_owned();
                Frame::Error { code, message }
            }
            kind::SAMPLE => {
                let batch_id = c.u64()?;
                let n = c.count(crate::job::SAMPLE_JOB_FIXED_LEN)?;
                let mut jobs = Vec::with_capacity(n);
                for _ in 0..n {
                    jobs.push(decode_sample_job(&mut c)?);
                }
                Frame::Sample { batch_id, jobs }
            }
            kind::PREFIX => Frame::Prefix(PrefixOp {
                action: PrefixAction::from_tag(c.u8()?)?,
                seq_id: c.u64()?,
                prefix_id: c.u64()?,
                len: c.u32()?,
            }),
            kind::POOLED => Frame::Pooled(decode_pooled(&mut c)?),
            kind::LANE => {
                let port = c.u16()?;
                let mut token = [0u8; 32];
                for b in &mut token {
                    *b = c.u8()?;
                }
                Frame::Lane { port, token }
            }
            kind::INPUTS => {
                let batch_id = c.u64()?;
                let chunks = decode_chunk_headers(&mut c)?;
                let n = c.count(4)?;
                let mut tokens = Vec::with_capacity(n);
                for _ in 0..n {
                    tokens.push(c.u32()?);
                }
                let inputs = Inputs {
                    batch_id,
                    chunks,
                    tokens,
                };
                inputs.validate()?;
                Frame::Inputs(inputs)
            }
            other => return Err(WireError::UnknownKind(other)),
        };
        c.finish()?;
        Ok(frame)
    }

    /// Decodes one complete frame (length prefix included) from the start of `buf`.
    /// Returns `Ok(None)` if `buf` does not yet hold the whole frame, else the frame and the
    /// number of bytes it used. The length prefix is checked against `max_frame_len` first.
    pub fn decode(buf: &[u8], max_frame_len: u32) -> Result<Option<(Frame, usize)>, WireError> {
        let Some(len) = check_len_prefix(buf, max_frame_len)? else {
            return Ok(None);
        };
        let total = LEN_PREFIX + len;
        if buf.len() < total {
            return Ok(None);
        }
        let frame = Frame::decode_body(&buf[LEN_PREFIX..total])?;
        Ok(Some((frame, total)))
    }
}

/// Reads and checks the length prefix at the start of `buf` (`Ok(None)` if under 4 bytes).
pub(crate) fn check_len_prefix(buf: &[u8], max_frame_len: u32) -> Result<Option<usize>, WireError> {
    let Some(prefix) = buf.get(..LEN_PREFIX) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if len == 0 {
        return Err(WireError::EmptyFrame);
    }
    if len > max_frame_len {
        return Err(WireError::FrameTooLarge {
            len: len as u64,
            max: max_frame_len,
        });
    }
    Ok(Some(len as usize))
}

fn decode_pooled(c: &mut Cursor<'_>) -> Result<Pooled, WireError> {
    let batch_id = c.u64()?;
    let n = c.count(8)?;
    let cols = c.u32()?;
    let mut seq_ids = Vec::with_capacity(n);
    for _ in 0..n {
        seq_ids.push(c.u64()?);
    }
    let expected = (n as u64) * cols as u64 * 4;
    let got = c.remaining() as u64;
    if expected != got {
        return Err(WireError::DataLength { expected, got });
    }
    let values = decode_f32_le(c.rest())?;
    Ok(Pooled {
        batch_id,
        seq_ids,
        cols,
        values,
    })
}

fn decode_activations(c: &mut Cursor<'_>) -> Result<Activations, WireError> {
    let batch_id = c.u64()?;
    let chunks = decode_chunk_headers(c)?;
    let dtype = DType::from_tag(c.u8()?)?;
    let rows = c.u32()?;
    let cols = c.u32()?;
    let chunk_rows: u64 = chunks.iter().map(|c| c.len as u64).sum();
    if rows as u64 != chunk_rows {
        return Err(WireError::ShapeMismatch { rows, chunk_rows });
    }
    let expected = data_len(rows, cols, dtype);
    let got = c.remaining() as u64;
    if expected != Some(got) {
        return Err(WireError::DataLength {
            expected: expected.unwrap_or(u64::MAX),
            got,
        });
    }
    let data = c.rest().to_vec();
    Ok(Activations {
        batch_id,
        chunks,
        dtype,
        shape: [rows, cols],
        data,
    })
}

/// Rows of f32 activations for `chunks` (their summed lengths), checked against `values`.
fn f32_rows(
    chunks: &[ChunkHeader],
    cols: u32,
    values: &[f32],
    dtype: DType,
) -> Result<u32, WireError> {
    let rows64: u64 = chunks.iter().map(|c| c.len as u64).sum();
    let rows = u32::try_from(rows64).map_err(|_| WireError::ShapeMismatch {
        rows: u32::MAX,
        chunk_rows: rows64,
    })?;
    let size = dtype.size() as u64;
    let expected = rows64 * cols as u64;
    if values.len() as u64 != expected {
        return Err(WireError::DataLength {
            expected: expected.saturating_mul(size),
            got: (values.len() as u64).saturating_mul(size),
        });
    }
    Ok(rows)
}

/// Payload bytes of an activations frame: batch id, chunk count and headers, dtype, shape, data.
fn activations_payload_len(n_chunks: usize, data_len: u64) -> u64 {
    8 + 4 + (n_chunks * CHUNK_HEADER_LEN) as u64 + 1 + 8 + data_len
}

/// An activations payload up to its data.
fn write_activations_head(
    out: &mut Vec<u8>,
    batch_id: u64,
    chunks: &[ChunkHeader],
    dtype: DType,
    shape: [u32; 2],
) {
    out.extend_from_slice(&batch_id.to_le_bytes());
    write_chunk_headers(out, chunks);
    out.push(dtype.tag());
    out.extend_from_slice(&shape[0].to_le_bytes());
    out.extend_from_slice(&shape[1].to_le_bytes());
}

/// `rows * cols * dtype.size()` in bytes; `None` on u64 overflow (u32 * u32 * 4 can exceed it).
fn data_len(rows: u32, cols: u32, dtype: DType) -> Option<u64> {
    (rows as u64)
        .checked_mul(cols as u64)?
        .checked_mul(dtype.size() as u64)
}
