//! The multi-source verified fetcher: [`fetch`] fills `<dest>.partial` with the chunks a [`FetchSpec`]
//! wants, from any number of [`ChunkSource`]s at once.
//!
//! Flow: open the [`PartialFile`] (sparse, as long as the file; chunks a previous run verified are hashed
//! again and kept) → queue the wanted chunks not yet verified → keep up to
//! [`FetchSpec::in_flight_per_source`] reads in flight per source, each taking the next queued chunk when
//! one finishes (so a faster source takes more; once the queue is empty, a source with room also reads a
//! chunk one other source is still reading, and the first good copy wins) → verify every chunk against the manifest on the blocking
//! pool, write it at its offset, record it. A chunk that does not verify is refused: that source is not
//! asked for it again and it goes back to the queue for the others. A source that errors, hangs past
//! [`READ_TIMEOUT`] or refuses chunk after chunk is dropped and its chunks re-queued. With no source left
//! for a queued chunk the fetch fails with the missing byte ranges and why each source went.
//!
//! [`Wanted::Whole`]: when every chunk is verified (and the whole sha256 matches, when known: it is
//! computed while the chunks land, `whole.rs`) the partial file is renamed to `dest`. [`Wanted::Ranges`]: the ranges are rounded out to whole chunks and
//! the partial file stays (sparse); [`FetchOutcome::path`] says which file to load from. Progress goes
//! out on a `watch` channel ([`FetchProgress`]); a [`CancellationToken`] stops the fetch and keeps what
//! was verified for the next run.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::{SourceError, TransferError};
use crate::manifest::Manifest;
use crate::partial::PartialFile;
use crate::source::ChunkSource;
use crate::whole::WholeHasher;

/// Reads in flight per source unless the spec says otherwise: with 4 MiB chunks, 16 MiB per source
/// covers the bandwidth-delay product of a 1 Gbit/s link up to ~130 ms of round trip.
pub const IN_FLIGHT_PER_SOURCE: usize = 4;
/// A chunk read that takes longer drops its source (a live peer that stopped answering).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// A source that has refused this many chunks, and more than it delivered, is dropped.
const MAX_REFUSED: u64 = 4;
/// The speed shown is over this window.
const SPEED_WINDOW: Duration = Duration::from_secs(5);

/// Which bytes of the file to fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wanted {
    Whole,
    /// These byte ranges (rounded out to whole chunks).
    Ranges(Vec<Range<u64>>),
}

/// What to fetch and where. One fetch per `dest` at a time (the partial file and its record are not
/// shared); run further fetches of the same file one after another: each keeps what the last verified.
#[derive(Clone, Debug)]
pub struct FetchSpec {
    pub manifest: Arc<Manifest>,
    /// The final path of the complete file; the download lives in `<dest>.partial` until then.
    pub dest: PathBuf,
    pub wanted: Wanted,
    pub in_flight_per_source: usize,
}

impl FetchSpec {
    pub fn new(manifest: Arc<Manifest>, dest: PathBuf, wanted: Wanted) -> Self {
        Self {
            manifest,
            dest,
            wanted,
            in_flight_per_source: IN_FLIGHT_PER_SOURCE,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FetchState {
    #[default]
    Starting,
    /// Re-hashing the chunks a previous run left.
    Checking,
    Fetching,
    /// Hashing the whole file and moving it into place.
    Finishing,
    Done,
    Cancelled,
    Failed,
}

/// One source's share.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SourceProgress {
    pub name: String,
    pub bytes: u64,
    pub chunks: u64,
    pub refused: u64,
    /// Why the source was dropped, once it was.
    pub dropped: Option<String>,
}

/// A fetch's progress, as its `watch` channel carries it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FetchProgress {
    pub state: FetchState,
    pub file_size: u64,
    /// Bytes of the chunks wanted (the whole file, or the chunks covering the wanted ranges).
    pub needed: u64,
    /// Of `needed`, bytes verified (including those a previous run left).
    pub done: u64,
    pub bytes_per_s: f64,
    pub eta_s: Option<f64>,
    pub sources: Vec<SourceProgress>,
    pub chunks_refused: u64,
}

/// How a fetch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchOutcome {
    /// The file to load from: `dest` when complete, else the `.partial` file holding the wanted chunks.
    pub path: PathBuf,
    pub complete: bool,
    pub needed: u64,
    /// Bytes fetched by this run (verified).
    pub fetched: u64,
    /// Bytes a previous run had already verified.
    pub reused: u64,
    pub chunks_refused: u64,
}

/// What one chunk read came to.
enum Landed {
    Verified,
    Refused,
    SourceFailed(SourceError),
    WriteFailed(std::io::Error),
}

struct Src {
    source: Arc<dyn ChunkSource>,
    in_flight: usize,
    /// Chunks this source is reading now.
    reading: HashSet<usize>,
    /// Chunks this source served wrong: never asked again.
    refused: HashSet<usize>,
    stats: SourceProgress,
}

/// Fetches `spec` from `sources`, publishing progress on `progress`; see the module doc.
pub async fn fetch(
    spec: FetchSpec,
    sources: Vec<Arc<dyn ChunkSource>>,
    progress: &watch::Sender<FetchProgress>,
    cancel: &CancellationToken,
) -> Result<FetchOutcome, TransferError> {
    let result = run(&spec, sources, progress, cancel).await;
    let end = match &result {
        Ok(_) => FetchState::Done,
        Err(TransferError::Cancelled) => FetchState::Cancelled,
        Err(_) => FetchState::Failed,
    };
    progress.send_modify(|p| {
        p.state = end;
        p.bytes_per_s = 0.0;
        p.eta_s = None;
    });
    result
}

async fn run(
    spec: &FetchSpec,
    sources: Vec<Arc<dyn ChunkSource>>,
    progress: &watch::Sender<FetchProgress>,
    cancel: &CancellationToken,
) -> Result<FetchOutcome, TransferError> {
    let m = spec.manifest.clone();
    m.validate()?;
    let per_source = spec.in_flight_per_source.max(1);
    let mut p = FetchProgress {
        state: FetchState::Checking,
        file_size: m.size,
        sources: sources
            .iter()
            .map(|s| SourceProgress {
                name: s.name(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    progress.send_replace(p.clone());

    let (dest, m2) = (spec.dest.clone(), m.clone());
    let mut partial = blocking(move || PartialFile::open(&dest, &m2)).await?;
    let wanted = match &spec.wanted {
        Wanted::Whole => (0..m.chunk_count()).collect(),
        Wanted::Ranges(r) => m.chunks_covering(r),
    };
    let len = |i: usize| {
        let r = m.chunk_range(i);
        r.end - r.start
    };
    p.needed = wanted.iter().map(|&i| len(i)).sum();
    let mut queue: VecDeque<usize> = wanted
        .iter()
        .copied()
        .filter(|&i| !partial.is_verified(i))
        .collect();
    let reused = p.needed - queue.iter().map(|&i| len(i)).sum::<u64>();
    p.done = reused;
    p.state = FetchState::Fetching;
    progress.send_replace(p.clone());

    let writer = Arc::new(partial.writer()?);
    // The whole-file hash, on the way, when the whole file is coming and its hash is known.
    let whole = match (&spec.wanted, &m.sha256) {
        (Wanted::Whole, Some(_)) => {
            let present = partial.verified().to_vec();
            let file = partial.writer()?;
            let path = partial.path().to_path_buf();
            Some(WholeHasher::start(file, m.clone(), present).map_err(TransferError::io(path))?)
        }
        _ => None,
    };
    let mut srcs: Vec<Src> = sources
        .into_iter()
        .zip(p.sources.iter().cloned())
        .map(|(source, stats)| Src {
            source,
            in_flight: 0,
            reading: HashSet::new(),
            refused: HashSet::new(),
            stats,
        })
        .collect();
    let mut in_flight = FuturesUnordered::new();
    // Chunks being read, and by how many sources (2 in the end game).
    let mut reading: HashMap<usize, u8> = HashMap::new();
    let mut remaining = queue.len();
    let mut samples: VecDeque<(Instant, u64)> = VecDeque::from([(Instant::now(), 0)]);
    let mut fetched = 0u64;
    loop {
        if remaining == 0 {
            // Every wanted chunk is verified (a duplicate still under way is dropped).
            break;
        }
        // Give every live source work up to its share; once the queue is empty, a source with room
        // also reads a chunk only one other source is reading (the end game: the last chunks do not
        // wait on the slowest source).
        for (s, src) in srcs.iter_mut().enumerate() {
            while src.stats.dropped.is_none() && src.in_flight < per_source {
                let i = match queue.iter().position(|i| !src.refused.contains(i)) {
                    Some(pos) => queue.remove(pos),
                    None if queue.is_empty() => reading
                        .iter()
                        .filter(|&(i, &n)| {
                            n == 1
                                && !partial.is_verified(*i)
                                && !src.reading.contains(i)
                                && !src.refused.contains(i)
                        })
                        .map(|(&i, _)| i)
                        .min(),
                    None => None,
                };
                let Some(i) = i else { break };
                src.in_flight += 1;
                src.reading.insert(i);
                *reading.entry(i).or_insert(0) += 1;
                in_flight.push(read_chunk(
                    src.source.clone(),
                    m.clone(),
                    writer.clone(),
                    s,
                    i,
                ));
            }
        }
        if in_flight.is_empty() {
            return Err(no_source_left(&m, &queue, &srcs));
        }
        let (s, i, landed) = tokio::select! {
            () = cancel.cancelled() => return Err(TransferError::Cancelled),
            Some(done) = in_flight.next() => done,
        };
        let src = &mut srcs[s];
        src.in_flight -= 1;
        src.reading.remove(&i);
        let others = match reading.get_mut(&i) {
            Some(n) => {
                *n -= 1;
                *n
            }
            None => 0,
        };
        if others == 0 {
            reading.remove(&i);
        }
        // A chunk that failed here goes back to the queue unless another source has it or is at it.
        let lost = !partial.is_verified(i) && others == 0;
        match landed {
            // The other reader of this chunk was first.
            Landed::Verified if partial.is_verified(i) => {}
            Landed::Verified => {
                partial.mark(i)?;
                if let Some(w) = &whole {
                    w.landed(i);
                }
                remaining -= 1;
                src.stats.bytes += len(i);
                src.stats.chunks += 1;
                metrics::counter!("shoal_download_bytes_total", "source" => src.stats.name.clone())
                    .increment(len(i));
                fetched += len(i);
            }
            Landed::Refused => {
                tracing::warn!(source = %src.stats.name, chunk = i, "chunk refused: its bytes do not match the manifest");
                src.refused.insert(i);
                src.stats.refused += 1;
                p.chunks_refused += 1;
                metrics::counter!("shoal_download_refused_chunks_total").increment(1);
                if lost {
                    queue.push_front(i);
                }
                if src.stats.refused >= MAX_REFUSED && src.stats.refused > src.stats.chunks {
                    src.stats.dropped = Some(format!("{} chunks refused", src.stats.refused));
                }
            }
            Landed::SourceFailed(e) => {
                tracing::warn!(source = %src.stats.name, chunk = i, "source dropped: {e}");
                src.stats.dropped.get_or_insert_with(|| e.to_string());
                if lost {
                    queue.push_front(i);
                }
            }
            Landed::WriteFailed(source) => {
                let path = partial.path().to_path_buf();
                return Err(TransferError::Io { path, source });
            }
        }
        // Progress and speed over the last few seconds.
        let now = Instant::now();
        samples.push_back((now, fetched));
        while samples.len() > 2 && now - samples[1].0 > SPEED_WINDOW {
            samples.pop_front();
        }
        let (t0, b0) = samples[0];
        let dt = (now - t0).as_secs_f64();
        p.done = reused + fetched;
        p.bytes_per_s = if dt > 0.05 {
            (fetched - b0) as f64 / dt
        } else {
            0.0
        };
        p.eta_s = (p.bytes_per_s > 0.0).then(|| (p.needed - p.done) as f64 / p.bytes_per_s);
        p.sources = srcs.iter().map(|s| s.stats.clone()).collect();
        progress.send_replace(p.clone());
    }

    let complete = (0..m.chunk_count()).all(|i| partial.is_verified(i));
    let path = if complete {
        progress.send_modify(|p| p.state = FetchState::Finishing);
        let (dest, m2) = (spec.dest.clone(), m.clone());
        let hashed = match whole {
            Some(w) => w.finish().await,
            None => None,
        };
        blocking(move || partial.finish(&dest, &m2, hashed)).await?;
        spec.dest.clone()
    } else {
        partial.path().to_path_buf()
    };
    Ok(FetchOutcome {
        path,
        complete,
        needed: p.needed,
        fetched,
        reused,
        chunks_refused: p.chunks_refused,
    })
}

/// Reads chunk `i` from source `s`, verifies it and writes it at its offset.
async fn read_chunk(
    source: Arc<dyn ChunkSource>,
    m: Arc<Manifest>,
    file: Arc<File>,
    s: usize,
    i: usize,
) -> (usize, usize, Landed) {
    let r = m.chunk_range(i);
    let read = tokio::time::timeout(READ_TIMEOUT, source.read(r.start, r.end - r.start)).await;
    let data = match read {
        Ok(Ok(data)) => data,
        Ok(Err(e)) => return (s, i, Landed::SourceFailed(e)),
        Err(_) => {
            let e = SourceError::Protocol(format!("no answer within {READ_TIMEOUT:?}"));
            return (s, i, Landed::SourceFailed(e));
        }
    };
    let landed = tokio::task::spawn_blocking(move || {
        if !m.verify_chunk(i, &data) {
            return Landed::Refused;
        }
        match file.write_all_at(&data, r.start) {
            Ok(()) => Landed::Verified,
            Err(e) => Landed::WriteFailed(e),
        }
    })
    .await
    .unwrap_or_else(|e| Landed::WriteFailed(std::io::Error::other(e.to_string())));
    (s, i, landed)
}

/// The error when queued chunks have no source left: which bytes, and what became of each source.
fn no_source_left(m: &Manifest, queue: &VecDeque<usize>, srcs: &[Src]) -> TransferError {
    let mut chunks: Vec<usize> = queue.iter().copied().collect();
    chunks.sort_unstable();
    let mut missing: Vec<Range<u64>> = Vec::new();
    for r in chunks.iter().map(|&i| m.chunk_range(i)) {
        match missing.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => missing.push(r),
        }
    }
    let reasons: Vec<String> = srcs
        .iter()
        .map(|s| match &s.stats.dropped {
            Some(why) => format!("{}: {why}", s.stats.name),
            None => format!("{}: refused {} chunk(s)", s.stats.name, s.stats.refused),
        })
        .collect();
    TransferError::NoSourceLeft {
        file: m.file_name.clone(),
        missing_bytes: missing.iter().map(|r| r.end - r.start).sum(),
        missing,
        reasons: if reasons.is_empty() {
            "no sources were given".into()
        } else {
            reasons.join("; ")
        },
    }
}

/// Runs blocking file work on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TransferError> + Send + 'static,
) -> Result<T, TransferError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TransferError::Task(e.to_string()))?
}
