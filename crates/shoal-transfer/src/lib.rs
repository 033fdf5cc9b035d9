//! # shoal-transfer — models between peers
//!
//! Moves a model's file (or only the byte ranges a stage needs) from the nodes that have it, chunk by
//! chunk, each chunk verified before it is kept.
//!
//! - [`manifest`]: [`Manifest`] — a complete file's size, whole sha256 and per-chunk sha256s
//!   ([`CHUNK_SIZE`] = 4 MiB), computed in one pass and cached beside the file (`.<file>.manifest.json`,
//!   keyed by size + mtime).
//! - [`protocol`]: the blob protocol `/shoal/blob/1` on the cluster's libp2p connections — requests
//!   `Manifest{model}` and `Read{model, offset, len}`, length-prefixed JSON headers and raw bytes, several
//!   pipelined per stream — and its server, [`serve_blobs`], optionally paced by an [`UploadLimit`].
//! - [`source`]: [`ChunkSource`] (read a byte range) and [`HttpSource`] (ranged GETs, e.g. on the hub's
//!   resolve URL); [`peer`]: [`PeerSource`] (the blob protocol to one peer, a few streams, pipelined).
//! - [`partial`]: [`PartialFile`] — `<dest>.partial` (sparse, full length) and its record of verified
//!   chunks, re-checked on resume.
//! - [`fetch`](mod@fetch): [`fetch()`] — the wanted chunks from several sources at once (faster sources take
//!   more), each verified against the manifest; refused chunks and dropped sources are re-queued on the
//!   others; progress on a `watch` channel ([`FetchProgress`]); cancellable; renames to `dest` when the
//!   whole file is there (the whole-file sha256 is computed while the chunks land: `whole.rs`).
//! - [`stage`]: [`fetch_stage`] — only a pipeline stage's bytes: the GGUF header (a growing prefix),
//!   then the stage's tensors by the loader's rule (`shoal_model::stage_byte_ranges`).
//! - [`downloads`]: [`Downloads`] — the node's downloads: peers first (the manifest most of them agree
//!   on), only a stage's bytes when that is all it needs, else the internet through `shoal-store`;
//!   progress published in the node's facts; start / cancel for the API.
//! - Errors: [`TransferError`] for fetches and servers, [`SourceError`] for one source's read.
//!
//! Flow: a node with the file runs [`serve_blobs`]; a node without it asks peers for their
//! [`Manifest`] ([`PeerSource::manifest`]), keeps the peers whose [`Manifest::root`] agree, and runs
//! [`fetch()`] with one [`PeerSource`] per peer (plus an [`HttpSource`] as a fallback, if any).

pub mod downloads;
mod error;
pub mod fetch;
pub mod limit;
pub mod manifest;
pub mod partial;
pub mod peer;
pub mod protocol;
pub mod source;
pub mod stage;
mod whole;

pub use downloads::{Downloads, OnComplete, Want};
pub use error::{SourceError, TransferError};
pub use fetch::{
    FetchOutcome, FetchProgress, FetchSpec, FetchState, IN_FLIGHT_PER_SOURCE, SourceProgress,
    Wanted, fetch,
};
pub use limit::UploadLimit;
pub use manifest::{CHUNK_SIZE, Manifest};
pub use partial::{PartialFile, partial_path};
pub use peer::PeerSource;
pub use protocol::{BLOB_PROTOCOL, Locate, serve_blobs};
pub use source::{ChunkSource, HttpSource};
pub use stage::{StageLayers, fetch_stage};
