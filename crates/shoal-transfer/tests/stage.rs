//! `fetch_stage` fetches the SmolLM2 header and one stage's tensors and nothing else: the chunks read are
//! exactly those covering `stage_byte_ranges`, the header is found even when it spans many chunks, and
//! the stage loads from the sparse partial file.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::MemSource;
use sha2::{Digest, Sha256};
use shoal_model::gguf::GgufFile;
use shoal_model::{DecoderStage, LayerRange, stage_byte_ranges_at};
use shoal_transfer::{
    ChunkSource, FetchProgress, Manifest, StageLayers, fetch_stage, partial_path,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The manifest of `data` in chunks of `chunk_size` (smaller than the default to make the header span
/// several chunks).
fn manifest(data: &[u8], chunk_size: u64) -> Manifest {
    Manifest {
        file_name: "model.gguf".into(),
        size: data.len() as u64,
        sha256: None,
        chunk_size,
        chunks: data
            .chunks(chunk_size as usize)
            .map(|c| Sha256::digest(c).into())
            .collect(),
    }
}

async fn stage(chunk_size: u64, start: usize, end: usize) {
    let real = shoal_testkit::fixtures::model_path();
    let data = Arc::new(std::fs::read(&real).unwrap());
    let m = Arc::new(manifest(&data, chunk_size));
    let src = Arc::new(MemSource::new("mem", &data));
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("model.gguf");
    let (tx, rx) = watch::channel(FetchProgress::default());
    let sources: Vec<Arc<dyn ChunkSource>> = vec![src.clone()];
    let layers = StageLayers { start, end };
    let out = fetch_stage(
        m.clone(),
        dest.clone(),
        layers,
        sources,
        &tx,
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(!out.complete && out.path == partial_path(&dest));

    let ranges = stage_byte_ranges_at(&real, start, end, 30).unwrap();
    let mut want = m.chunks_covering(&ranges);
    want.sort_unstable();
    let mut read: Vec<u64> = src.offsets.lock().unwrap().clone();
    read.sort_unstable();
    let want_offsets: Vec<u64> = want.iter().map(|&i| i as u64 * chunk_size).collect();
    // Each chunk read once, the header's prefix chunks included (they are part of the ranges).
    assert_eq!(read, want_offsets, "chunk size {chunk_size}");
    let needed: u64 = want
        .iter()
        .map(|&i| m.chunk_range(i).end - m.chunk_range(i).start)
        .sum();
    assert_eq!(rx.borrow().needed, needed);
    assert!(needed < m.size * 2 / 3, "{needed} of {}", m.size);

    let got = std::fs::read(&out.path).unwrap();
    for r in &ranges {
        let r = r.start as usize..r.end as usize;
        assert!(
            got[r.clone()] == data[r],
            "the stage's bytes are the file's"
        );
    }
    load(&out.path, start, end);
}

fn load(path: &Path, start: usize, end: usize) {
    let pool = Arc::new(shoal_kernels::ThreadPool::new(1));
    let mut g = GgufFile::open(path).unwrap();
    DecoderStage::load(&mut g, LayerRange { start, end }, &pool).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_middle_stage_fetches_the_header_and_its_layers_only() {
    stage(shoal_transfer::CHUNK_SIZE, 10, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_spanning_many_chunks_is_found_by_a_growing_prefix() {
    // 64 KiB chunks: SmolLM2's header (its tokenizer) is far longer than the first chunk.
    stage(64 << 10, 20, 30).await;
}
