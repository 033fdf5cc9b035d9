//! The bytes of a GGUF file a stage reads: [`stage_byte_ranges`] gives them for layers `start..end` of
//! `n_layers`, so a node can fetch only those (the rest of its copy may stay a hole).
//!
//! The rule is the loader's ([`DecoderStage::load`](crate::DecoderStage::load)): the header (metadata,
//! tokenizer, tensor directory: everything before the tensor data), every `blk.{i}.*` tensor of the
//! stage's layers, `token_embd` on the first stage (and on the last when the head is tied to it),
//! `output_norm` and `output` on the last, and the rope scaling tensor (`rope_freqs`, else
//! `rope_factors_short`) on every stage that has one. Ranges come sorted and merged (the alignment padding
//! between neighbouring tensors is taken along).

use std::ops::Range;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use super::header::DEFAULT_ALIGNMENT;
use super::{GgufFile, names};
use crate::error::{ModelError, Result};

/// The byte ranges of the file `gguf` (only its header is needed) that a stage of layers `start..end` of
/// `n_layers` reads (sorted, disjoint, merged across alignment padding).
pub fn stage_byte_ranges(
    gguf: &GgufFile,
    start: usize,
    end: usize,
    n_layers: usize,
) -> Result<Vec<Range<u64>>> {
    if start >= end || end > n_layers {
        return Err(ModelError::BadLayerRange {
            start,
            end,
            n_layers,
        });
    }
    let (content, infos) = (gguf.content(), gguf.tensors());
    let has = |name: &str| infos.contains_key(name);
    let mut tensors: Vec<&str> = Vec::new();
    let prefixes: Vec<String> = (start..end).map(names::blk_prefix).collect();
    tensors.extend(
        infos
            .keys()
            .map(String::as_str)
            .filter(|n| prefixes.iter().any(|p| n.starts_with(p.as_str()))),
    );
    let (first, last) = (start == 0, end == n_layers);
    let tied = !has(names::OUTPUT);
    if first || (last && tied) {
        tensors.push(names::TOKEN_EMBD);
    }
    if last {
        tensors.push(names::OUTPUT_NORM);
        if !tied {
            tensors.push(names::OUTPUT);
        }
    }
    if has(names::ROPE_FREQS) {
        tensors.push(names::ROPE_FREQS);
    } else if has(names::ROPE_FACTORS_SHORT) {
        tensors.push(names::ROPE_FACTORS_SHORT);
    }

    let data = content.tensor_data_offset;
    let header = 0..data;
    let mut ranges: Vec<Range<u64>> = vec![header];
    ranges.extend(tensors.iter().filter_map(|n| infos.get(*n)).map(|info| {
        let start = data.saturating_add(info.offset);
        start..start.saturating_add(info.bytes)
    }));
    ranges.sort_by_key(|r| r.start);
    let gap = alignment(content);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges.into_iter().filter(|r| r.start < r.end) {
        match merged.last_mut() {
            Some(m) if r.start <= m.end.saturating_add(gap) => m.end = m.end.max(r.end),
            _ => merged.push(r),
        }
    }
    Ok(merged)
}

/// [`stage_byte_ranges`] of the GGUF file at `path` (only its header is read).
pub fn stage_byte_ranges_at(
    path: &Path,
    start: usize,
    end: usize,
    n_layers: usize,
) -> Result<Vec<Range<u64>>> {
    stage_byte_ranges(&GgufFile::open(path)?, start, end, n_layers)
}

/// The file's tensor alignment: the most padding between two neighbouring tensors.
fn alignment(content: &Content) -> u64 {
    match content.metadata.get("general.alignment") {
        Some(Value::U32(a)) => u64::from(*a),
        Some(Value::U64(a)) => *a,
        _ => DEFAULT_ALIGNMENT,
    }
}
