//! Loopback microbenchmark of the blob protocol: three in-process nodes on 127.0.0.1, two serving a file,
//! the third fetching it with [`fetch`] from one peer, then from both; prints MB/s for each, next to the
//! sha256 rate (the verification cost) and a raw single-stream copy over the same libp2p connection.
//!
//! Loopback here is CPU-bound (noise on both ends in one process), so a second part puts each peer behind
//! an emulated link (a [`Throttled`] source: a shared "link busy until" clock at `LINK_MB_S` plus a round
//! trip per request) to show what the pipelining and the multi-source scheduling make of a slower link.
//!
//! `cargo run -p shoal-transfer --example blob_bench -- [MiB=512] [streams per peer=2] [in flight per source=4]
//! [emulated link MB/s=40] [emulated rtt ms=20]`

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{AsyncReadExt, AsyncWriteExt, StreamExt};
use libp2p::StreamProtocol;
use sha2::{Digest, Sha256};
use shoal_cluster::{ClusterConfig, ClusterHandle};
use shoal_transfer::{
    ChunkSource, FetchProgress, FetchSpec, Manifest, PeerSource, SourceError, Wanted, fetch,
    serve_blobs,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const MODEL: &str = "bench";
const RAW: StreamProtocol = StreamProtocol::new("/shoal/blob-bench-raw/1");

async fn node(dir: &Path, peers: Vec<libp2p::Multiaddr>) -> ClusterHandle {
    shoal_cluster::start(ClusterConfig {
        state_dir: dir.to_path_buf(),
        cluster_key: "blob-bench".into(),
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("multiaddr")],
        peers,
        mdns: false,
        api_url: None,
        models: vec![],
        backend: "bench".into(),
        machine: None,
    })
    .await
    .expect("start node")
}

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let (mib, streams, in_flight) = (arg(1, 512), arg(2, 2), arg(3, 4));
    let (link_mb_s, rtt_ms) = (arg(4, 40), arg(5, 20));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bench.bin");
    let data: Vec<u8> = {
        let mut x = 0x9e3779b97f4a7c15u64;
        (0..mib << 17)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect()
    };
    std::fs::write(&file, &data).expect("write");
    let t = Instant::now();
    let _ = Sha256::digest(&data);
    println!(
        "sha256 on one core: {:.0} MB/s",
        mb_s(data.len() as u64, t.elapsed())
    );
    drop(data);
    let t = Instant::now();
    let m = Arc::new(Manifest::load_or_compute(&file).expect("manifest"));
    println!("manifest of {mib} MiB: {:.2} s", t.elapsed().as_secs_f64());

    let serve = |n: &ClusterHandle| {
        let f = file.clone();
        serve_blobs(
            n,
            Arc::new(move |id: &str| (id == MODEL).then(|| f.clone())),
            None,
        )
        .expect("serve");
    };
    let a = node(&dir.path().join("a"), vec![]).await;
    let addr: libp2p::Multiaddr = a.snapshot().listen_addrs[0].parse().expect("addr");
    let b = node(&dir.path().join("b"), vec![addr.clone()]).await;
    let c = node(&dir.path().join("c"), vec![addr]).await;
    serve(&a);
    serve(&b);
    c.wait_for(Duration::from_secs(30), |s| s.state.members().len() == 3)
        .await;

    raw_copy(&a, &c, m.size).await;
    let mut emulated = Vec::new();
    for link in [
        None,
        Some((link_mb_s as f64 * 1e6, Duration::from_millis(rtt_ms as u64))),
    ] {
        for peers in [vec![&a], vec![&a, &b]] {
            let sources: Vec<Arc<dyn ChunkSource>> = peers
                .iter()
                .map(|p| {
                    let peer = PeerSource::new(c.streams(), p.id(), MODEL, streams);
                    match link {
                        None => Arc::new(peer) as Arc<dyn ChunkSource>,
                        Some((rate, rtt)) => Arc::new(Throttled::new(peer, rate, rtt)),
                    }
                })
                .collect();
            let dest = dir.path().join(format!("out-{}.bin", peers.len()));
            let mut spec = FetchSpec::new(m.clone(), dest.clone(), Wanted::Whole);
            spec.in_flight_per_source = in_flight;
            let (tx, _rx) = watch::channel(FetchProgress::default());
            let t = Instant::now();
            let out = fetch(spec, sources, &tx, &CancellationToken::new())
                .await
                .expect("fetch");
            let d = t.elapsed();
            let rate = mb_s(out.fetched, d);
            let over = match link {
                None => "loopback".to_string(),
                Some(_) => {
                    emulated.push(rate);
                    format!("emulated {link_mb_s} MB/s, {rtt_ms} ms links")
                }
            };
            println!(
                "{over}: fetch from {} peer(s), {streams} stream(s) each, {in_flight} chunks in flight \
                 each: {rate:.0} MB/s ({:.2} s, whole-file check included)",
                peers.len(),
                d.as_secs_f64()
            );
            let _ = std::fs::remove_file(&dest);
        }
    }
    if let [one, two] = emulated[..] {
        println!(
            "emulated: one peer fills {:.0}% of its link; two peers give {:.2}x one",
            100.0 * one / link_mb_s as f64,
            two / one
        );
    }
}

/// A source behind an emulated link: requests are answered in order of arrival on a link that carries
/// `rate` bytes/s, each answer arriving half a round trip after the link sent it, each request taking
/// half a round trip to get there.
struct Throttled<S> {
    inner: S,
    rate: f64,
    rtt: Duration,
    link_free_at: Mutex<Instant>,
}

impl<S> Throttled<S> {
    fn new(inner: S, rate: f64, rtt: Duration) -> Self {
        Self {
            inner,
            rate,
            rtt,
            link_free_at: Mutex::new(Instant::now()),
        }
    }
}

impl<S: ChunkSource> ChunkSource for Throttled<S> {
    fn read(&self, offset: u64, len: u64) -> BoxFuture<'_, Result<Bytes, SourceError>> {
        Box::pin(async move {
            let arrives = Instant::now() + self.rtt / 2;
            let data = self.inner.read(offset, len).await?;
            let sent = {
                let mut free = self.link_free_at.lock().unwrap_or_else(|e| e.into_inner());
                let start = (*free).max(arrives);
                *free = start + Duration::from_secs_f64(len as f64 / self.rate);
                *free
            };
            tokio::time::sleep_until((sent + self.rtt / 2).into()).await;
            Ok(data)
        })
    }

    fn name(&self) -> String {
        self.inner.name()
    }
}

/// Writes `bytes` from `from` to `to` on one raw stream of the same connection (no chunks, no hashing):
/// the ceiling of one stream of the transport.
async fn raw_copy(from: &ClusterHandle, to: &ClusterHandle, bytes: u64) {
    let mut incoming = from.streams().accept(RAW).expect("accept");
    tokio::spawn(async move {
        while let Some((_, mut s)) = incoming.next().await {
            let block = vec![7u8; 1 << 20];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(block.len() as u64) as usize;
                if s.write_all(&block[..n]).await.is_err() {
                    return;
                }
                left -= n as u64;
            }
            let _ = s.close().await;
        }
    });
    let mut s = to
        .streams()
        .open_stream(from.id(), RAW)
        .await
        .expect("open");
    let t = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    while got < bytes {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n as u64,
        }
    }
    println!(
        "raw stream over the same connection: {:.0} MB/s",
        mb_s(got, t.elapsed())
    );
}
