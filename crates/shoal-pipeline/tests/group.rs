//! A tensor-parallel group of three real nodes in this process, joined by real lanes on 127.0.0.1:
//! rank 0's share, fed the prompt and driving the others over the lanes, computes what the whole
//! model computes — through a chunked prefill, greedy decoding, a fork, a release, a rewind and a clear, and
//! again once a new rank 0 forms the group after the first went — and a
//! member that goes takes the group with it (rank 0's next batch fails as a lost stage).

mod common;

use common::node;

use std::sync::Arc;
use std::time::Duration;

use shoal_cluster::InstanceId;
use shoal_engine::EngineError;
use shoal_engine::engine::{load_local_share, load_local_stage};
use shoal_engine::kvpool::{KvPool, KvShare};
use shoal_engine::stage::{ChunkSpec, KvOp, LocalStage, Pool, Stage, StageData};
use shoal_kernels::ThreadPool;
use shoal_model::gguf::GgufFile;
use shoal_model::split::shares;
use shoal_model::{LayerRange, ModelConfig};
use shoal_pipeline::dataplane::{Hosts, Lanes, connect_group, serve_stages};

const INSTANCE: InstanceId = InstanceId::from_u64(0xbb);
const TIMEOUT: Duration = Duration::from_secs(30);

/// The logits a stage returns for a batch whose last chunk wants them.
fn logits(out: StageData) -> Vec<f32> {
    match out {
        StageData::Logits { logits, .. } => logits.into_data(),
        _ => panic!("the last stage returns logits"),
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn chunk(seq_id: u64, len: usize, want_logits: bool) -> [ChunkSpec; 1] {
    [ChunkSpec {
        seq_id,
        len,
        want_logits,
        pool: Pool::None,
    }]
}

/// Runs `tokens` of `seq` on `stage` (in chunks of `split`), then `steps` greedy tokens; returns the
/// generated tokens and the last logits.
fn greedy(
    stage: &mut LocalStage,
    seq: u64,
    tokens: &[u32],
    split: usize,
    steps: usize,
) -> (Vec<u32>, Vec<f32>) {
    let mut out = None;
    for (i, part) in tokens.chunks(split).enumerate() {
        let last = (i + 1) * split >= tokens.len();
        let r = stage
            .forward(
                &chunk(seq, part.len(), last),
                StageData::Tokens(part.to_vec()),
                &[],
            )
            .unwrap();
        if last {
            out = Some(logits(r));
        }
    }
    let mut last = out.unwrap();
    let mut got = Vec::new();
    for _ in 0..steps {
        let next = argmax(&last);
        got.push(next);
        let r = stage
            .forward(&chunk(seq, 1, true), StageData::Tokens(vec![next]), &[])
            .unwrap();
        last = logits(r);
    }
    (got, last)
}

fn close(a: &[f32], b: &[f32]) -> f32 {
    let top = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / top
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_three_nodes_computes_what_one_does_and_fails_as_one() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = node(&dirs[0], "group-test", vec![]).await;
    let a_addr: libp2p::Multiaddr = a.snapshot().listen_addrs[0].parse().unwrap();
    let b = node(&dirs[1], "group-test", vec![a_addr.clone()]).await;
    let c = node(&dirs[2], "group-test", vec![a_addr]).await;
    for n in [&a, &b, &c] {
        let met = n.wait_for(TIMEOUT, |s| s.state.members().len() == 3).await;
        assert_eq!(met.state.members().len(), 3, "the nodes never met");
    }

    let path = shoal_testkit::fixtures::model_path();
    let mut gguf = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let range = LayerRange::full(cfg.n_layers);
    let cut = shares(&mut gguf, &cfg, range, &[2.0, 1.0, 1.0]).unwrap();
    // The head is read in parallel too: each member holds a run of its rows (half to rank 0).
    let rows: Vec<std::ops::Range<usize>> = cut.iter().map(|s| s.vocab.clone()).collect();
    assert_eq!((rows[0].start, rows[2].end), (0, cfg.vocab_size));
    assert!(
        rows.windows(2)
            .all(|w| w[0].end == w[1].start && !w[1].is_empty())
    );
    assert!(rows[0].len().abs_diff(cfg.vocab_size / 2) <= 64, "{rows:?}");
    let pool = Arc::new(ThreadPool::new(1));
    let peers = vec![a.id(), b.id(), c.id()];
    // b and c host ranks 1 and 2, each with its KV set aside.
    let mut hosts = Vec::new();
    for (rank, n) in [(1, &b), (2, &c)] {
        let h = Hosts::default();
        let lanes = Lanes::bind([127, 0, 0, 1].into(), 0, n.traffic()).unwrap();
        serve_stages(n.clone(), h.clone(), Some(lanes)).unwrap();
        let stage = load_local_share(&path, range, &cut[rank], &pool).unwrap();
        let bytes = stage.kv_bytes_per_token();
        let kv = KvShare::reserve(&Arc::new(KvPool::new(512 * bytes)), bytes, bytes).unwrap();
        h.members
            .insert(&INSTANCE, 0, rank, peers.clone(), stage, Some(kv));
        hosts.push(h);
    }
    let mut rank0 = load_local_share(&path, range, &cut[0], &pool).unwrap();
    let link = connect_group(&a, &INSTANCE, 0, &peers, cfg.dim)
        .await
        .unwrap();
    rank0.join(Box::new(link)).unwrap();
    let whole = load_local_stage(&path, range, &pool).unwrap();

    let (rank0, whole) = tokio::task::spawn_blocking(move || {
        let (mut rank0, mut whole) = (rank0, whole);
        let prompt: Vec<u32> = vec![1, 504, 3458, 282, 4193, 30, 2, 28, 1073];
        // A chunked prefill (4 + 4 + 1 tokens), then 12 greedy tokens: the same tokens, logits as
        // near as summation order leaves them (the split tests' bound).
        let (g_tokens, g_last) = greedy(&mut rank0, 1, &prompt, 4, 12);
        let (w_tokens, w_last) = greedy(&mut whole, 1, &prompt, 4, 12);
        assert_eq!(g_tokens, w_tokens);
        assert!(
            close(&w_last, &g_last) < 0.05,
            "{}",
            close(&w_last, &g_last)
        );
        // A fork of the first sequence's prompt on every member, a rewind of the first, a release:
        // the members' caches follow rank 0's, so each continuation matches the whole model's.
        let held = prompt.len() + 12;
        for s in [&mut rank0 as &mut dyn Stage, &mut whole] {
            s.kv(KvOp::Fork {
                seq_id: 1,
                into: 2,
                len: prompt.len(),
            })
            .unwrap();
        }
        let next = |s: &mut LocalStage, seq, tok| {
            logits(
                s.forward(&chunk(seq, 1, true), StageData::Tokens(vec![tok]), &[])
                    .unwrap(),
            )
        };
        let (gf, wf) = (next(&mut rank0, 2, 17), next(&mut whole, 2, 17));
        assert_eq!(argmax(&gf), argmax(&wf));
        rank0.rewind(1, held - 3).unwrap();
        whole.rewind(1, held - 3).unwrap();
        assert_eq!(rank0.cached_len(1), held - 3);
        let (gr, wr) = (next(&mut rank0, 1, 42), next(&mut whole, 1, 42));
        assert_eq!(argmax(&gr), argmax(&wr));
        assert!(close(&wr, &gr) < 0.05);
        for s in [&mut rank0 as &mut dyn Stage, &mut whole] {
            s.kv(KvOp::Release { seq_id: 1 }).unwrap();
            s.kv(KvOp::Release { seq_id: 2 }).unwrap();
        }
        assert_eq!(rank0.held_sequences(), 0);
        // A cleared rank 0 (its upstream pipeline went) clears its members: the same sequence id
        // starts again from nothing on every member (one that kept it would refuse the start).
        let (g1, _) = greedy(&mut rank0, 5, &prompt[..4], 4, 0);
        rank0.clear();
        let (g2, _) = greedy(&mut rank0, 5, &prompt[..4], 4, 2);
        let (w2, _) = greedy(&mut whole, 5, &prompt[..4], 4, 2);
        assert!(g1.is_empty());
        assert_eq!(g2, w2);
        rank0.kv(KvOp::Release { seq_id: 5 }).unwrap();
        (rank0, whole)
    })
    .await
    .unwrap();

    // Rank 0 goes (its driver was rebuilt): the members clear their caches and wait; a new rank 0
    // forms the group again and computes what the whole model computes.
    drop(rank0);
    let mut rank0 = load_local_share(&path, range, &cut[0], &pool).unwrap();
    let link = connect_group(&a, &INSTANCE, 0, &peers, cfg.dim)
        .await
        .unwrap();
    rank0.join(Box::new(link)).unwrap();
    let rank0 = tokio::task::spawn_blocking(move || {
        let (mut rank0, mut whole) = (rank0, whole);
        let prompt = [1, 504, 3458, 282];
        assert_eq!(
            greedy(&mut rank0, 1, &prompt, 4, 6).0,
            greedy(&mut whole, 1, &prompt, 4, 6).0
        );
        rank0
    })
    .await
    .unwrap();

    // c's member goes (its instance torn down): rank 0's next batch fails as a lost stage, promptly.
    hosts[1].remove(&INSTANCE);
    let err = tokio::task::spawn_blocking(move || {
        let mut rank0 = rank0;
        match rank0.forward(&chunk(3, 2, true), StageData::Tokens(vec![1, 504]), &[]) {
            Ok(_) => panic!("a group without one of its members computed"),
            Err(e) => e,
        }
    });
    let err = tokio::time::timeout(TIMEOUT, err).await.unwrap().unwrap();
    assert!(matches!(err, EngineError::StageLost(_)), "{err}");
}
