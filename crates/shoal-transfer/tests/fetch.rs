//! The fetcher against in-memory sources: a corrupt source's chunks are refused and fetched elsewhere, a
//! source dying half way leaves the rest to the others, a cancelled fetch resumes with only the rest, no
//! good source left is a clear error, and a ranges fetch reads only the chunks covering them.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use shoal_transfer::{
    CHUNK_SIZE, ChunkSource, FetchProgress, FetchSpec, FetchState, Manifest, TransferError, Wanted,
    fetch, partial_path,
};
mod common;

use common::MemSource;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A file of `chunks` chunks and a tail of 12345 bytes; its manifest.
fn model(dir: &Path, chunks: u64) -> (Arc<Vec<u8>>, Arc<Manifest>) {
    let len = (chunks * CHUNK_SIZE + 12345) as usize;
    let data: Vec<u8> = (0..len)
        .map(|i| (i ^ (i >> 11) ^ (i >> 19)) as u8)
        .collect();
    let src = dir.join("model.gguf");
    std::fs::write(&src, &data).unwrap();
    let m = Manifest::compute(&src).unwrap();
    (Arc::new(data), Arc::new(m))
}

fn dest(dir: &Path) -> PathBuf {
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    out.join("model.gguf")
}

fn sources(list: &[&Arc<MemSource>]) -> Vec<Arc<dyn ChunkSource>> {
    list.iter()
        .map(|s| (*s).clone() as Arc<dyn ChunkSource>)
        .collect()
}

async fn run(
    spec: FetchSpec,
    list: &[&Arc<MemSource>],
) -> (
    Result<shoal_transfer::FetchOutcome, TransferError>,
    FetchProgress,
) {
    let (tx, rx) = watch::channel(FetchProgress::default());
    let out = fetch(spec, sources(list), &tx, &CancellationToken::new()).await;
    let last = rx.borrow().clone();
    (out, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_source_is_refused_and_its_chunks_come_from_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (data, m) = model(dir.path(), 12);
    let good = Arc::new(MemSource::new("good", &data));
    let bad = Arc::new(MemSource {
        corrupt: true,
        ..MemSource::new("bad", &data)
    });
    let spec = FetchSpec::new(m.clone(), dest(dir.path()), Wanted::Whole);
    let (out, p) = run(spec, &[&bad, &good]).await;
    let out = out.unwrap();
    assert!(out.complete);
    assert!(out.chunks_refused > 0 && p.chunks_refused == out.chunks_refused);
    assert_eq!(std::fs::read(&out.path).unwrap(), *data);
    assert!(!partial_path(&out.path).exists());
    assert_eq!(p.state, FetchState::Done);
    assert_eq!((p.done, p.needed, p.file_size), (m.size, m.size, m.size));
    let by = |n: &str| p.sources.iter().find(|s| s.name == n).unwrap().clone();
    assert_eq!((by("bad").bytes, by("good").bytes), (0, m.size));
    assert!(
        by("bad").dropped.is_some(),
        "a source refusing chunk after chunk is dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_dying_half_way_leaves_the_rest_to_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (data, m) = model(dir.path(), 16);
    let dies = Arc::new(MemSource {
        fail_after: Some(5),
        ..MemSource::new("dies", &data)
    });
    let a = Arc::new(MemSource {
        delay: Duration::from_millis(5),
        ..MemSource::new("a", &data)
    });
    let spec = FetchSpec::new(m.clone(), dest(dir.path()), Wanted::Whole);
    let (out, p) = run(spec, &[&dies, &a]).await;
    let out = out.unwrap();
    assert_eq!(std::fs::read(&out.path).unwrap(), *data);
    let dies = p.sources.iter().find(|s| s.name == "dies").unwrap();
    assert!(
        dies.dropped.is_some() && dies.chunks > 0 && dies.chunks <= 5,
        "{dies:?}"
    );
    assert_eq!(p.sources.iter().map(|s| s.bytes).sum::<u64>(), m.size);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_fetch_resumes_with_only_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (data, m) = model(dir.path(), 16);
    let slow = Arc::new(MemSource {
        delay: Duration::from_millis(20),
        ..MemSource::new("slow", &data)
    });
    let dest = dest(dir.path());
    let (tx, mut rx) = watch::channel(FetchProgress::default());
    let cancel = CancellationToken::new();
    let canceller = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let _ = rx.wait_for(|p| p.done >= 6 * CHUNK_SIZE).await;
            cancel.cancel();
        })
    };
    let spec = FetchSpec::new(m.clone(), dest.clone(), Wanted::Whole);
    let first = fetch(spec.clone(), sources(&[&slow]), &tx, &cancel).await;
    assert!(matches!(first, Err(TransferError::Cancelled)), "{first:?}");
    assert_eq!(tx.borrow().state, FetchState::Cancelled);
    canceller.await.unwrap();
    assert!(partial_path(&dest).exists() && !dest.exists());
    let kept = tx.borrow().done;
    assert!(kept >= 6 * CHUNK_SIZE && kept < m.size, "{kept}");

    let again = Arc::new(MemSource::new("again", &data));
    let (out, _) = run(spec, &[&again]).await;
    let out = out.unwrap();
    assert_eq!((out.reused, out.fetched), (kept, m.size - kept));
    assert_eq!(again.reads() as u64, (m.size - kept).div_ceil(CHUNK_SIZE));
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_chunk_whose_bytes_changed_is_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let (data, m) = model(dir.path(), 4);
    let dest = dest(dir.path());
    let first = Arc::new(MemSource::new("first", &data));
    let spec = FetchSpec::new(
        m.clone(),
        dest.clone(),
        Wanted::Ranges(vec![0..CHUNK_SIZE, CHUNK_SIZE..2 * CHUNK_SIZE]),
    );
    let (out, _) = run(spec, &[&first]).await;
    assert_eq!(out.unwrap().fetched, 2 * CHUNK_SIZE);
    // Damage chunk 1 on disk behind the fetcher's back.
    let partial = partial_path(&dest);
    let mut bytes = std::fs::read(&partial).unwrap();
    bytes[CHUNK_SIZE as usize + 7] ^= 1;
    std::fs::write(&partial, bytes).unwrap();
    let second = Arc::new(MemSource::new("second", &data));
    let spec = FetchSpec::new(m.clone(), dest.clone(), Wanted::Whole);
    let (out, _) = run(spec, &[&second]).await;
    let out = out.unwrap();
    assert_eq!(out.reused, CHUNK_SIZE, "only chunk 0 still verifies");
    assert!(second.offsets.lock().unwrap().contains(&CHUNK_SIZE));
    assert_eq!(std::fs::read(&dest).unwrap(), *data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_good_source_left_is_an_error_naming_the_missing_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (data, m) = model(dir.path(), 3);
    let bad = Arc::new(MemSource {
        corrupt: true,
        ..MemSource::new("bad", &data)
    });
    let dead = Arc::new(MemSource {
        fail_after: Some(0),
        ..MemSource::new("dead", &data)
    });
    let dest = dest(dir.path());
    let spec = FetchSpec::new(m.clone(), dest.clone(), Wanted::Whole);
    let (out, p) = run(spec, &[&bad, &dead]).await;
    match out {
        Err(TransferError::NoSourceLeft {
            missing,
            missing_bytes,
            reasons,
            ..
        }) => {
            assert_eq!(missing_bytes, m.size);
            assert_eq!(missing, vec![0..m.size]);
            assert!(
                reasons.contains("bad") && reasons.contains("dead"),
                "{reasons}"
            );
        }
        other => panic!("expected NoSourceLeft, got {other:?}"),
    }
    assert_eq!(p.state, FetchState::Failed);
    assert!(!dest.exists());
    // No sources at all says so.
    let spec = FetchSpec::new(m, dest, Wanted::Whole);
    let (out, _) = run(spec, &[]).await;
    assert!(
        matches!(out, Err(TransferError::NoSourceLeft { ref reasons, .. }) if reasons.contains("no sources"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ranges_fetch_reads_only_the_chunks_covering_them() {
    let dir = tempfile::tempdir().unwrap();
    let (data, m) = model(dir.path(), 10);
    let a = Arc::new(MemSource::new("a", &data));
    let b = Arc::new(MemSource::new("b", &data));
    let ranges: Vec<Range<u64>> = vec![
        100..200,
        3 * CHUNK_SIZE + 5..5 * CHUNK_SIZE - 1,
        m.size - 10..m.size,
    ];
    let dest = dest(dir.path());
    let spec = FetchSpec::new(m.clone(), dest.clone(), Wanted::Ranges(ranges.clone()));
    let (out, p) = run(spec, &[&a, &b]).await;
    let out = out.unwrap();
    assert!(!out.complete && out.path == partial_path(&dest) && !dest.exists());
    // Chunks 0, 3, 4 and the tail chunk 10.
    assert_eq!(out.needed, 3 * CHUNK_SIZE + 12345);
    assert_eq!(
        (p.needed, p.done, p.file_size),
        (out.needed, out.needed, m.size)
    );
    let mut read: Vec<u64> = [&a, &b]
        .iter()
        .flat_map(|s| s.offsets.lock().unwrap().clone())
        .collect();
    read.sort_unstable();
    let reads = read.len();
    read.dedup();
    assert!(
        reads <= 2 * read.len(),
        "a chunk is read by two sources at most"
    );
    assert_eq!(
        read,
        vec![0, 3 * CHUNK_SIZE, 4 * CHUNK_SIZE, 10 * CHUNK_SIZE]
    );
    let got = std::fs::read(&out.path).unwrap();
    assert_eq!(
        got.len() as u64,
        m.size,
        "the partial file is as long as the file"
    );
    for r in &ranges {
        let r = r.start as usize..r.end as usize;
        assert_eq!(got[r.clone()], data[r]);
    }
    assert!(
        got[CHUNK_SIZE as usize..2 * CHUNK_SIZE as usize]
            .iter()
            .all(|&x| x == 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_chunks_do_not_wait_on_a_slow_source() {
    let dir = tempfile::tempdir().unwrap();
    let (data, m) = model(dir.path(), 7);
    // The slow source takes its four chunks at the start and would hold them for 20 s.
    let slow = Arc::new(MemSource {
        delay: Duration::from_secs(20),
        ..MemSource::new("slow", &data)
    });
    let fast = Arc::new(MemSource::new("fast", &data));
    let spec = FetchSpec::new(m.clone(), dest(dir.path()), Wanted::Whole);
    let t = std::time::Instant::now();
    let (out, p) = run(spec, &[&slow, &fast]).await;
    let out = out.unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(std::fs::read(&out.path).unwrap(), *data);
    assert_eq!(slow.reads(), 4, "the slow source was given its share");
    let by = |n: &str| p.sources.iter().find(|s| s.name == n).unwrap().bytes;
    assert_eq!(
        (by("slow"), by("fast")),
        (0, m.size),
        "the fast source read the slow one's chunks too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_file_whose_sha256_differs_from_the_manifest_is_not_moved_into_place() {
    let dir = tempfile::tempdir().unwrap();
    let (data, m) = model(dir.path(), 3);
    let mut wrong = (*m).clone();
    wrong.sha256 = Some("0".repeat(64));
    let src = Arc::new(MemSource::new("src", &data));
    let dest = dest(dir.path());
    let spec = FetchSpec::new(Arc::new(wrong), dest.clone(), Wanted::Whole);
    let (out, p) = run(spec, &[&src]).await;
    match out {
        Err(TransferError::WholeHashMismatch { got, .. }) => {
            assert_eq!(
                Some(got),
                m.sha256,
                "the hash computed on the way is the file's"
            )
        }
        other => panic!("expected WholeHashMismatch, got {other:?}"),
    }
    assert_eq!(p.state, FetchState::Failed);
    assert!(!dest.exists() && partial_path(&dest).exists());
}
