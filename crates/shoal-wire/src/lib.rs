//! # shoal-wire — the data-plane wire format
//!
//! Pure types and codec for the connections between pipeline neighbours (stage N → stage N+1
//! carries activations; the last stage → the request owner carries sampled tokens). No I/O: the
//! caller owns the socket, writes what [`Handshake::encode`] / [`Frame::encode`] return, and
//! feeds what it reads into a [`FrameReader`].
//!
//! Main types:
//! - [`Handshake`] (with [`Role`]): first message on every connection, both directions; check
//!   the peer's with [`Handshake::check_compatible`].
//! - [`Frame`]: one message — [`Frame::Activations`] ([`Activations`], [`ChunkHeader`],
//!   [`DType`]), [`Frame::Tokens`] ([`TokenItem`]), [`Frame::Release`], [`Frame::Ping`],
//!   [`Frame::Pong`], [`Frame::Error`], [`Frame::Sample`] ([`SampleJob`]), [`Frame::Prefix`]
//!   ([`PrefixOp`]), [`Frame::Pooled`] ([`Pooled`]: embeddings, asked per chunk by [`Pool`]),
//!   [`Frame::Inputs`] ([`Inputs`]: a batch's token ids, from a tensor-parallel group's rank 0 to its
//!   other members).
//! - [`SamplingParams`]: a request's sampling knobs, shared with the engine (it re-exports them as
//!   `shoal_engine::SamplingParams`); [`SamplingParams::validate`] fails with a [`SamplingError`].
//! - [`FrameReader`]: push arbitrary byte chunks, pull complete frames; poisoned after an error.
//! - [`WireError`]: structured errors, labelled by [`WireError::error_type`] for metrics.
//! - [`encode_f32_as_f16`] / [`decode_f16_to_f32`]: hidden states travel as f16 (half the bytes).
//! - [`Activations::encode_f32`]: an activations frame written straight from a stage's f32 buffer (the
//!   same bytes as encoding a [`Frame::Activations`], without the intermediate copy), or appended to a
//!   buffer after other frames of the same write ([`Activations::encode_f32_into`]);
//!   [`Activations::to_f32`] decodes one into a buffer.
//!
//! Flow on a connection: both sides send a handshake, read the peer's
//! ([`Handshake::wire_len`] says how many bytes once 8 have arrived), call
//! `peer.check_compatible(&ours)`, then exchange frames. Any error → log it, optionally send a
//! [`Frame::Error`], close the connection; the node stays up.
//!
//! ## Byte layout (version 2)
//!
//! Version 2 (issue 14) added alternatives to token items, the mask and `top_logprobs` to sample
//! jobs, the pool bits of chunk flags, the `Fork` prefix action and the `Pooled` frame; a version-1
//! peer is refused at the handshake ([`WireError::VersionMismatch`]).
//!
//! All integers are little-endian, floats are IEEE 754 little-endian, no padding anywhere.
//!
//! ### Handshake — 91 bytes
//!
//! | offset | size | field                                                           |
//! |-------:|-----:|-----------------------------------------------------------------|
//! | 0      | 4    | magic `b"SHOL"` (`53 48 4F 4C`)                                 |
//! | 4      | 2    | version u16 (= 5)                                                |
//! | 6      | 2    | body length u16 (= 83 in versions 1 and 2)                       |
//! | 8      | 32   | node id                                                          |
//! | 40     | 32   | cluster: hash of the cluster key (never the key)                 |
//! | 72     | 1    | role: 1 = stage, 2 = request owner, 3 = group member             |
//! | 73     | 8    | instance id u64                                                  |
//! | 81     | 2    | stage index u16 (0 for an owner)                                 |
//! | 83     | 4    | layer start u32, inclusive (0 for an owner; a member: its rank)  |
//! | 87     | 4    | layer end u32, exclusive, start ≤ end (0 for an owner; a member: the rank it opens to) |
//!
//! The first 8 bytes are fixed across all versions, so a peer of another version can read the
//! header, skip `body length` bytes and report a [`WireError::VersionMismatch`] naming both
//! versions. A receiver rejects a version it does not speak before looking at the body. For an
//! owner, the stage fields are written as zero and ignored on read.
//!
//! ### Frame
//!
//! ```text
//! [ len: u32 ][ kind: u8 ][ payload: len - 1 bytes ]
//! ```
//!
//! `len` counts the bytes after the length prefix (kind + payload), so `len ≥ 1`. A receiver
//! rejects `len == 0` ([`WireError::EmptyFrame`]) and `len > max` ([`WireError::FrameTooLarge`],
//! default max [`DEFAULT_MAX_FRAME_LEN`] = 64 MiB) as soon as the 4 prefix bytes arrive, before
//! allocating anything for the payload. A payload must be consumed exactly; leftover bytes are
//! [`WireError::TrailingBytes`]. Counts (`n`) are u32 and are checked against the bytes that
//! remain before any vector is allocated.
//!
//! | kind | frame       | payload                                                                     |
//! |-----:|-------------|-----------------------------------------------------------------------------|
//! | 1    | Activations | batch_id u64, n u32, n × chunk (17 bytes), dtype u8, rows u32, cols u32, data |
//! | 2    | Tokens      | batch_id u64, n u32, n × (seq_id u64, token u32, logprob f32, k u8, k × (token u32, logprob f32)) |
//! | 3    | Release     | n u32, n × seq_id u64                                                       |
//! | 4    | Ping        | nonce u64                                                                   |
//! | 5    | Pong        | nonce u64 (echoes the ping's)                                              |
//! | 6    | Error       | code u16, message: the rest of the payload, UTF-8                          |
//! | 7    | Sample      | batch_id u64, n u32, n × sample job (65 bytes + 4 per history token + 8 per count + 4 per mask word + 4 per drafted token + 4 per draft mask and its words) |
//! | 8    | Prefix      | action u8 (1 retain, 2 start, 3 drop, 4 fork, 5 rewind: version 4), seq_id u64, prefix_id u64, len u32 |
//! | 9    | Pooled      | batch_id u64, n u32, cols u32, n × seq_id u64, n × cols × f32                |
//! | 10   | Lane        | port u16, token 32 bytes (version 3: a direct connection's offer / answer)  |
//!
//! Kind 0 and kinds above 10 are [`WireError::UnknownKind`].
//!
//! Sample job: `seq_id u64, temperature f32, top_p f32, top_k u32, min_p f32, repetition_penalty f32,
//! frequency_penalty f32, presence_penalty f32, top_logprobs u8, rng_state u64, n u32, n × history
//! token u32, m u32, m × (token u32, count u32), w u32, w × mask word u32` (no mask: `w = 0`), then
//! (version 6) `d u32, d × drafted token u32, q u32, q × (w u32, w × mask word u32)`: the drafted
//! tokens the chunk verifies and the mask after each (speculative decoding; none: `d = q = 0`). The
//! last stage samples with exactly this state, so it holds no per-sequence sampler of its own.
//!
//! Activations chunk (19 bytes): `seq_id u64, start_pos u32, len u32, flags u8, drafted u16` where
//! flag bit 0 is `want_logits`, bits 1–2 the chunk's [`Pool`] (0 none, 1 sum, 2 last row, 3 first
//! row) and the other bits must be zero ([`WireError::ReservedFlags`]); (version 7) `drafted` is how
//! many drafted tokens end the chunk for the last stage to verify, a logits row each and one more
//! (0 when none; more than 0 needs `want_logits` and fewer than `len`: [`WireError::BadDraft`]).
//! `dtype`: 0 = f32 (4 bytes/element), 1 = f16 (2 bytes/element, IEEE binary16); anything else
//! is [`WireError::UnknownDType`]. `data` is the rest of the payload: a row-major
//! `rows × cols` matrix whose rows follow the chunks in order. The decoder requires
//! `rows == Σ chunk.len` ([`WireError::ShapeMismatch`]) and
//! `data.len() == rows × cols × dtype size` ([`WireError::DataLength`]).

mod chunk;
mod cursor;
mod error;
mod f16;
mod frame;
mod handshake;
mod inputs;
mod job;
mod reader;
pub mod sampling;

pub use chunk::{CHUNK_HEADER_LEN, ChunkHeader, Pool};
pub use error::WireError;
pub use f16::{decode_f16_to_f32, decode_f32_le, encode_f32_as_f16, encode_f32_le};
pub use frame::{
    Activations, DEFAULT_MAX_FRAME_LEN, DType, Frame, LEN_PREFIX, PREFIX_OP_LEN, Pooled,
    PrefixAction, PrefixOp, TOKEN_ITEM_LEN, TokenItem, kind,
};
pub use handshake::{
    HANDSHAKE_HEADER_LEN, HANDSHAKE_V1_BODY_LEN, Handshake, MAGIC, Role, WIRE_VERSION,
};
pub use inputs::Inputs;
pub use job::{SAMPLE_JOB_FIXED_LEN, SampleJob};
pub use reader::FrameReader;
pub use sampling::{MAX_TOP_LOGPROBS, SamplingError, SamplingParams};
