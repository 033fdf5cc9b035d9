//! [`fetch_stage`]: only the bytes a pipeline stage reads — the GGUF header first, then the tensors of
//! layers `start..end` by the loader's rule ([`shoal_model::stage_byte_ranges`]).
//!
//! The header's length is not known before it is read, so it is fetched as a growing prefix: the first
//! chunk, parsed from the `.partial` file; while the parsed tensor data would start at or past the fetched
//! prefix (the parse ran into the hole, whose zeros it read as header) or the parse failed, the prefix
//! doubles. A parse that ends inside the fetched bytes read only verified bytes, so its ranges are right.
//! Every step is a [`fetch`] of [`Wanted::Ranges`] on the same partial file: chunks already there are
//! kept, so the steps cost only what they add.

use std::path::PathBuf;
use std::sync::Arc;

use shoal_model::ModelConfig;
use shoal_model::gguf::GgufFile;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::TransferError;
use crate::fetch::{FetchOutcome, FetchProgress, FetchSpec, Wanted, fetch};
use crate::manifest::Manifest;
use crate::source::ChunkSource;

/// The layers a stage runs: `start..end` (`end` exclusive, at most the model's layer count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageLayers {
    pub start: usize,
    pub end: usize,
}

/// Fetches the header and the tensors of `layers` of the GGUF `manifest` describes into
/// `<dest>.partial` (or `dest`, if that makes the file complete); the outcome's `path` is the file to
/// load the stage from. `in_flight_per_source` as in [`FetchSpec`].
pub async fn fetch_stage(
    manifest: Arc<Manifest>,
    dest: PathBuf,
    layers: StageLayers,
    sources: Vec<Arc<dyn ChunkSource>>,
    progress: &watch::Sender<FetchProgress>,
    cancel: &CancellationToken,
) -> Result<FetchOutcome, TransferError> {
    let step = |wanted| {
        let spec = FetchSpec::new(manifest.clone(), dest.clone(), wanted);
        fetch(spec, sources.clone(), progress, cancel)
    };
    let mut prefix = manifest.chunk_size.min(manifest.size);
    let ranges = loop {
        let header = 0..prefix;
        let out = step(Wanted::Ranges(vec![header])).await?;
        if out.complete {
            // A file no longer than the prefix: all of it is here.
            return Ok(out);
        }
        let path = out.path.clone();
        let parsed = tokio::task::spawn_blocking(move || {
            let g = GgufFile::open(&path)?;
            let n = ModelConfig::from_gguf(&g)?.n_layers;
            let data = g.content().tensor_data_offset;
            Ok::<_, shoal_model::ModelError>((data, n, g))
        })
        .await
        .map_err(|e| TransferError::Task(e.to_string()))?;
        match parsed {
            Ok((data, n, g)) if data < prefix || prefix >= manifest.size => {
                break shoal_model::stage_byte_ranges(&g, layers.start, layers.end, n)?;
            }
            Err(e) if prefix >= manifest.size => return Err(e.into()),
            _ => prefix = prefix.saturating_mul(2).min(manifest.size),
        }
    };
    step(Wanted::Ranges(ranges)).await
}
