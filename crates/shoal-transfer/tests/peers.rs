//! The blob protocol between real in-process cluster nodes on 127.0.0.1: a third node fetches the SmolLM2
//! GGUF from two peers at once while one peer's copy has gone bad after its manifest was made — its
//! chunks are refused and fetched from the other, and the result is the real file; a peer whose node
//! dies half way (its runtime dropped: its connections close) is dropped and the other serves the rest.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use shoal_cluster::{ClusterConfig, ClusterHandle};
use shoal_transfer::{
    ChunkSource, FetchProgress, FetchSpec, Manifest, PeerSource, SourceError, Wanted, fetch,
    serve_blobs,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const MODEL: &str = "smollm2-135m-instruct-q4_1";
const TIMEOUT: Duration = Duration::from_secs(60);

async fn node(dir: &Path, peers: Vec<libp2p::Multiaddr>) -> ClusterHandle {
    shoal_cluster::start(ClusterConfig {
        state_dir: dir.to_path_buf(),
        cluster_key: "transfer-test".into(),
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        peers,
        mdns: false,
        api_url: None,
        models: vec![],
        backend: "test".into(),
        machine: None,
    })
    .await
    .unwrap()
}

/// A node serving `file` as MODEL.
async fn server(dir: &Path, file: PathBuf, peers: Vec<libp2p::Multiaddr>) -> ClusterHandle {
    let n = node(dir, peers).await;
    serve_blobs(
        &n,
        Arc::new(move |m: &str| (m == MODEL).then(|| file.clone())),
        None,
    )
    .unwrap();
    n
}

/// Flips one byte in every chunk of `path` and puts its modification time back, as silent disk damage
/// would: the cached manifest still matches the file's size and mtime.
fn damage_every_chunk(path: &Path, m: &Manifest) {
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    for i in 0..m.chunk_count() {
        let r = m.chunk_range(i);
        bytes[(r.start + (r.end - r.start) / 2) as usize] ^= 0x5a;
    }
    std::fs::write(path, bytes).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(mtime).unwrap();
}

/// Three node folders, the real model, and copies of it in the first two folders.
fn two_copies() -> (Vec<tempfile::TempDir>, PathBuf, PathBuf, PathBuf) {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let real = shoal_testkit::fixtures::model_path();
    let (file_a, file_b) = (dirs[0].path().join("a.gguf"), dirs[1].path().join("b.gguf"));
    std::fs::copy(&real, &file_a).unwrap();
    std::fs::copy(&real, &file_b).unwrap();
    (dirs, real, file_a, file_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_peers_serve_a_model_and_the_damaged_copy_is_refused() {
    let (dirs, real, file_a, file_b) = two_copies();

    let a = server(&dirs[0].path().join("state"), file_a, vec![]).await;
    let a_addr: libp2p::Multiaddr = a.snapshot().listen_addrs[0].parse().unwrap();
    let b = server(
        &dirs[1].path().join("state"),
        file_b.clone(),
        vec![a_addr.clone()],
    )
    .await;
    let c = node(&dirs[2].path().join("state"), vec![a_addr]).await;
    let met = c.wait_for(TIMEOUT, |s| s.state.members().len() == 3).await;
    assert_eq!(met.state.members().len(), 3, "the nodes never met");

    let from =
        |n: &ClusterHandle, model: &str| Arc::new(PeerSource::new(c.streams(), n.id(), model, 2));
    let (pa, pb) = (from(&a, MODEL), from(&b, MODEL));
    let ma = tokio::time::timeout(TIMEOUT, pa.manifest())
        .await
        .unwrap()
        .unwrap();
    let mb = tokio::time::timeout(TIMEOUT, pb.manifest())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ma.root(), mb.root(), "both peers have the same file");
    assert_eq!(ma.size, std::fs::metadata(&real).unwrap().len());
    // b's copy goes bad after it made its manifest.
    damage_every_chunk(&file_b, &mb);

    let missing = from(&a, "no-such-model");
    assert!(matches!(
        tokio::time::timeout(TIMEOUT, missing.manifest())
            .await
            .unwrap(),
        Err(SourceError::Remote { .. })
    ));

    let dest = dirs[2].path().join("SmolLM2.gguf");
    let spec = FetchSpec::new(Arc::new(ma.clone()), dest.clone(), Wanted::Whole);
    let (tx, rx) = watch::channel(FetchProgress::default());
    let sources: Vec<Arc<dyn ChunkSource>> = vec![pb, pa];
    let out = tokio::time::timeout(
        TIMEOUT,
        fetch(spec, sources, &tx, &CancellationToken::new()),
    )
    .await
    .unwrap()
    .unwrap();
    let p = rx.borrow().clone();
    assert!(out.complete && out.path == dest);
    assert!(out.chunks_refused > 0, "{p:?}");
    assert_eq!(Manifest::compute(&dest).unwrap().sha256, ma.sha256);
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&real).unwrap());
    let by_b = p
        .sources
        .iter()
        .find(|s| s.name == format!("peer {}", b.id()))
        .unwrap();
    assert_eq!((by_b.bytes, by_b.refused), (0, out.chunks_refused));
}

/// A source that waits before each read (so a test can act while a fetch is under way).
struct Slow<S>(S, Duration);

impl<S: ChunkSource> ChunkSource for Slow<S> {
    fn read(
        &self,
        offset: u64,
        len: u64,
    ) -> futures::future::BoxFuture<'_, Result<bytes::Bytes, SourceError>> {
        Box::pin(async move {
            tokio::time::sleep(self.1).await;
            self.0.read(offset, len).await
        })
    }

    fn name(&self) -> String {
        self.0.name()
    }
}

/// A node serving `file` on a runtime of its own; sending on (or dropping) the returned channel ends
/// that runtime, which closes the node's connections as a crashed process would.
fn doomed_server(
    dir: PathBuf,
    file: PathBuf,
    peers: Vec<libp2p::Multiaddr>,
) -> (ClusterHandle, std::sync::mpsc::Sender<()>) {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (handle_tx, handle_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let n = rt.block_on(server(&dir, file, peers));
        handle_tx.send(n).unwrap();
        let _ = stop_rx.recv();
        drop(rt);
    });
    (handle_rx.recv().unwrap(), stop_tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_dying_mid_transfer_leaves_the_rest_to_the_other() {
    let (dirs, real, file_a, file_b) = two_copies();
    let b = server(&dirs[1].path().join("state"), file_b, vec![]).await;
    let b_addr: libp2p::Multiaddr = b.snapshot().listen_addrs[0].parse().unwrap();
    let (a, kill_a) = doomed_server(dirs[0].path().join("state"), file_a, vec![b_addr.clone()]);
    let c = node(&dirs[2].path().join("state"), vec![b_addr]).await;
    let met = c.wait_for(TIMEOUT, |s| s.state.members().len() == 3).await;
    assert_eq!(met.state.members().len(), 3, "the nodes never met");

    let pa = PeerSource::new(c.streams(), a.id(), MODEL, 1);
    let m = tokio::time::timeout(TIMEOUT, pa.manifest())
        .await
        .unwrap()
        .unwrap();
    let pb = PeerSource::new(c.streams(), b.id(), MODEL, 1);
    let pace = Duration::from_millis(40);
    let sources: Vec<Arc<dyn ChunkSource>> =
        vec![Arc::new(Slow(pa, pace)), Arc::new(Slow(pb, pace))];
    let dest = dirs[2].path().join("SmolLM2.gguf");
    let mut spec = FetchSpec::new(Arc::new(m.clone()), dest.clone(), Wanted::Whole);
    spec.in_flight_per_source = 2;
    let (tx, mut rx) = watch::channel(FetchProgress::default());
    // a dies once it has served two chunks.
    let killer = tokio::spawn(async move {
        let _ = rx
            .wait_for(|p| p.sources.first().is_some_and(|s| s.chunks >= 2))
            .await;
        let _ = kill_a.send(());
    });
    let out = tokio::time::timeout(
        TIMEOUT,
        fetch(spec, sources, &tx, &CancellationToken::new()),
    )
    .await
    .unwrap()
    .unwrap();
    killer.await.unwrap();
    let p = tx.borrow().clone();
    assert!(out.complete);
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&real).unwrap());
    let (sa, sb) = (&p.sources[0], &p.sources[1]);
    assert!(sa.dropped.is_some(), "{sa:?}");
    assert!(sa.chunks >= 2 && sa.bytes < m.size, "{sa:?}");
    assert_eq!(sa.bytes + sb.bytes, m.size);
}
