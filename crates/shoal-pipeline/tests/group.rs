//! A tensor-parallel group of three real nodes in this process, joined by real lanes on 127.0.0.1:
//! rank 0's share, fed the prompt and driving the others over the lanes, computes what the whole
//! model computes — through a chunked prefill, greedy decoding, drafted tokens verified (speculative
//! decoding), a fork, a release, a rewind and a clear, and
//! again once a new rank 0 forms the group after the first went — and a
//! member that goes takes the group with it (rank 0's next batch fails as a lost stage).

mod common;

use common::node;

use std::sync::Arc;
use std::time::Duration;

use shoal_cluster::InstanceId;
use shoal_engine::EngineError;
use shoal_engine::SamplingParams;
use shoal_engine::engine::{load_local_share, load_local_stage};
use shoal_engine::kvpool::{KvPool, KvShare};
use shoal_engine::sampler::Sampler;
use shoal_engine::stage::{ChunkSpec, KvOp, LocalStage, Pick, Pool, SampleRef, Stage, StageData};
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

/// `follow.len()` steps after `tokens` (prefilled in chunks of `split`), feeding `follow`'s tokens
/// (teacher forcing: two computations that would part at a near tie stay on one sequence): each step's
/// own pick, and the logits it picked from.
fn following(
    stage: &mut LocalStage,
    seq: u64,
    tokens: &[u32],
    split: usize,
    follow: &[u32],
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (_, mut last) = greedy(stage, seq, tokens, split, 0);
    let (mut picks, mut rows) = (Vec::new(), Vec::new());
    for &next in follow {
        picks.push(argmax(&last));
        let r = stage
            .forward(&chunk(seq, 1, true), StageData::Tokens(vec![next]), &[])
            .unwrap();
        rows.push(std::mem::replace(&mut last, logits(r)));
    }
    rows.push(last);
    (picks, rows)
}

/// The group's picks are the whole model's but where the whole model's best two logits are within
/// `TIE` of its largest |logit| (summation order may break such a tie either way), and every row of
/// logits is as near as the split tests' bound.
fn same_picks_but_near_ties(whole: &[Vec<f32>], group: &[Vec<f32>]) {
    const TIE: f32 = 0.01;
    for (i, (w, g)) in whole.iter().zip(group).enumerate() {
        assert!(close(w, g) < 0.05, "step {i}: {}", close(w, g));
        let (a, b) = (argmax(w) as usize, argmax(g) as usize);
        let top = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(
            a == b || w[a] - w[b] <= TIE * top,
            "step {i}: the group picked {b} ({}), the whole model {a} ({})",
            w[b],
            w[a]
        );
    }
}

/// One token of `seq` after `tok`, sampled by the stage itself as `sampler` says.
fn sampled(stage: &mut LocalStage, seq: u64, tok: u32, sampler: &Sampler) -> Pick {
    let job = SampleRef {
        seq_id: seq,
        sampler,
        history: &[],
        mask: None,
        draft: &[],
        draft_masks: &[],
    };
    match stage.forward(&chunk(seq, 1, true), StageData::Tokens(vec![tok]), &[job]) {
        Ok(StageData::Sampled(mut out)) if out.picks.len() == 1 => out.picks.remove(0),
        _ => panic!("a last stage asked to sample returns one pick"),
    }
}

/// `tok` and the drafted tokens `draft` after it as one chunk of `seq`, verified by the stage itself
/// as `sampler` says: the accepted drafted tokens and the one picked past them.
fn verified(
    stage: &mut LocalStage,
    seq: u64,
    tok: u32,
    draft: &[u32],
    sampler: &Sampler,
) -> Vec<Pick> {
    let masks = vec![None; draft.len()];
    let job = SampleRef {
        seq_id: seq,
        sampler,
        history: &[],
        mask: None,
        draft,
        draft_masks: &masks,
    };
    let tokens = [&[tok][..], draft].concat();
    let batch = chunk(seq, tokens.len(), true);
    match stage.forward(&batch, StageData::Tokens(tokens), &[job]) {
        Ok(StageData::Sampled(out)) => out.picks,
        _ => panic!("a last stage asked to verify returns picks"),
    }
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
    // The members' least KV capacity bounds the stage: what its engine budgets against.
    let link = connect_group(&a, &INSTANCE, 0, &peers, cfg.dim, Some(4096))
        .await
        .unwrap();
    assert_eq!(rank0.info().kv_token_capacity, None);
    let reduced = link.reduced_values();
    rank0.join(Box::new(link)).unwrap();
    assert_eq!(rank0.info().kv_token_capacity, Some(4096));
    let whole = load_local_stage(&path, range, &pool).unwrap();

    let (rank0, whole) = tokio::task::spawn_blocking(move || {
        let (mut rank0, mut whole) = (rank0, whole);
        let prompt: Vec<u32> = vec![1, 504, 3458, 282, 4193, 30, 2, 28, 1073];
        // A chunked prefill (4 + 4 + 1 tokens), then the whole model's 12 greedy tokens fed to both:
        // the group picks them too (but at a near tie), logits as near as summation order leaves them.
        let (w_tokens, _) = greedy(&mut whole, 3, &prompt, 4, 12);
        whole.kv(KvOp::Release { seq_id: 3 }).unwrap();
        let (g_picks, g_rows) = following(&mut rank0, 1, &prompt, 4, &w_tokens);
        let (w_picks, w_rows) = following(&mut whole, 1, &prompt, 4, &w_tokens);
        assert_eq!(w_picks, w_tokens);
        same_picks_but_near_ties(&w_rows, &g_rows);
        assert_eq!(g_picks.len(), 12);
        // Sampled on the stage, greedily: the split head's members send only each row's best entry
        // and log-normalizer (no logits row crosses the lanes) — the same tokens as the whole
        // model's sampler, the same log-probabilities up to summation order. Asking for alternatives
        // makes the group exchange whole rows again: the same alternatives.
        let greedy_params = |top_logprobs| SamplingParams {
            temperature: 0.0,
            top_logprobs,
            ..SamplingParams::default()
        };
        for top in [0, 3] {
            let sampler = Sampler::new(greedy_params(top), 7);
            let (mut g_tok, mut w_tok) = (w_tokens[11], w_tokens[11]);
            for step in 0..4 {
                let seq = 10 + top as u64;
                if step == 0 {
                    for s in [&mut rank0 as &mut dyn Stage, &mut whole] {
                        s.kv(KvOp::Fork {
                            seq_id: 1,
                            into: seq,
                            len: prompt.len() + 11,
                        })
                        .unwrap();
                    }
                }
                let before = reduced.load(std::sync::atomic::Ordering::Relaxed);
                let (g, w) = (
                    sampled(&mut rank0, seq, g_tok, &sampler),
                    sampled(&mut whole, seq, w_tok, &sampler),
                );
                // A greedy step without alternatives exchanges the hidden states' partial sums and
                // three numbers a member for the head; one asking for alternatives, whole rows too.
                let values = reduced.load(std::sync::atomic::Ordering::Relaxed) - before;
                let layers = 2 * cfg.n_layers as u64 * cfg.dim as u64;
                let summary = 3 * 3 + 1;
                let rows = if top == 0 { 0 } else { cfg.vocab_size as u64 };
                assert_eq!(values, layers + summary + rows, "top {top} step {step}");
                assert_eq!(g.id, w.id, "top {top} step {step}");
                assert!((g.logprob - w.logprob).abs() < 0.05, "{g:?} {w:?}");
                assert_eq!(g.top.len(), top as usize);
                // The same alternatives, but where two are within rounding of each other (a near tie
                // summation order may order either way; f16 partial sums move a far-down alternative's
                // log-probability by ~2 %).
                for (x, y) in g.top.iter().zip(&w.top) {
                    assert!(
                        x.0 == y.0 || (x.1 - y.1).abs() < 0.05 + 0.02 * y.1.abs(),
                        "top {top} step {step}: {:?} vs {:?}",
                        g.top,
                        w.top
                    );
                }
                (g_tok, w_tok) = (g.id, w.id);
            }
            for s in [&mut rank0 as &mut dyn Stage, &mut whole] {
                s.kv(KvOp::Release {
                    seq_id: 10 + top as u64,
                })
                .unwrap();
            }
        }
        // Drafted tokens verified through the group (speculative decoding): rank 0 sends each chunk's
        // logits rows in its header, every member computes its share of the head for them. Greedy
        // without alternatives, rank 0 verifies from the members' summaries (no logits row crosses
        // the lanes); with alternatives, from whole rows. The whole model's two drafted tokens are
        // accepted, a wrong third is replaced by the whole model's token, as on one node — at three
        // positions where the group's own steps picked the whole model's tokens (not a near tie).
        let at = (1..10)
            .find(|&i| g_picks[i..i + 3] == w_tokens[i..i + 3])
            .expect("three positions without a near tie");
        for top in [0, 3] {
            let sampler = Sampler::new(greedy_params(top), 7);
            let seq = 20 + top as u64;
            for s in [&mut rank0 as &mut dyn Stage, &mut whole] {
                s.kv(KvOp::Fork {
                    seq_id: 1,
                    into: seq,
                    len: prompt.len() + at - 1,
                })
                .unwrap();
            }
            let wrong = (w_tokens[at + 2] + 1) % cfg.vocab_size as u32;
            let draft = [w_tokens[at], w_tokens[at + 1], wrong];
            let before = reduced.load(std::sync::atomic::Ordering::Relaxed);
            let g = verified(&mut rank0, seq, w_tokens[at - 1], &draft, &sampler);
            let values = reduced.load(std::sync::atomic::Ordering::Relaxed) - before;
            let w = verified(&mut whole, seq, w_tokens[at - 1], &draft, &sampler);
            let ids = |p: &[Pick]| p.iter().map(|p| p.id).collect::<Vec<_>>();
            assert_eq!(ids(&w), w_tokens[at..at + 3]);
            assert_eq!(ids(&g), ids(&w), "top {top}");
            // Log-probabilities as near as summation order and f16 partial sums leave them.
            for (x, y) in g.iter().zip(&w) {
                let near = 0.05 + 0.05 * y.logprob.abs();
                assert!((x.logprob - y.logprob).abs() < near, "{x:?} {y:?}");
                assert_eq!(x.top.len(), top as usize);
            }
            // 4 tokens' partial sums, then 4 rows' summaries (and with alternatives 4 whole rows).
            let layers = 4 * 2 * cfg.n_layers as u64 * cfg.dim as u64;
            let summaries = 4 * (3 * 3 + 1);
            let rows = if top == 0 {
                0
            } else {
                4 * cfg.vocab_size as u64
            };
            assert_eq!(values, layers + summaries + rows, "top {top}");
            for s in [&mut rank0 as &mut dyn Stage, &mut whole] {
                s.kv(KvOp::Release { seq_id: seq }).unwrap();
            }
        }
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
        same_picks_but_near_ties(&[wf], &[gf]);
        rank0.rewind(1, held - 3).unwrap();
        whole.rewind(1, held - 3).unwrap();
        assert_eq!(rank0.cached_len(1), held - 3);
        let (gr, wr) = (next(&mut rank0, 1, 42), next(&mut whole, 1, 42));
        same_picks_but_near_ties(&[wr], &[gr]);
        for s in [&mut rank0 as &mut dyn Stage, &mut whole] {
            s.kv(KvOp::Release { seq_id: 1 }).unwrap();
            s.kv(KvOp::Release { seq_id: 2 }).unwrap();
        }
        assert_eq!(rank0.held_sequences(), 0);
        // A cleared rank 0 (its upstream pipeline went) clears its members: the same sequence id
        // starts again from nothing on every member (one that kept it would refuse the start).
        let (g1, _) = greedy(&mut rank0, 5, &prompt[..4], 4, 0);
        rank0.clear();
        let (w2, _) = greedy(&mut whole, 5, &prompt[..4], 4, 2);
        let (_, g2) = following(&mut rank0, 5, &prompt[..4], 4, &w2);
        let (_, w2) = following(&mut whole, 6, &prompt[..4], 4, &w2);
        assert!(g1.is_empty());
        same_picks_but_near_ties(&w2, &g2);
        whole.kv(KvOp::Release { seq_id: 6 }).unwrap();
        rank0.kv(KvOp::Release { seq_id: 5 }).unwrap();
        (rank0, whole)
    })
    .await
    .unwrap();

    // Rank 0 goes (its driver was rebuilt): the members clear their caches and wait; a new rank 0
    // forms the group again and computes what the whole model computes.
    drop(rank0);
    let mut rank0 = load_local_share(&path, range, &cut[0], &pool).unwrap();
    let link = connect_group(&a, &INSTANCE, 0, &peers, cfg.dim, None)
        .await
        .unwrap();
    rank0.join(Box::new(link)).unwrap();
    let rank0 = tokio::task::spawn_blocking(move || {
        let (mut rank0, mut whole) = (rank0, whole);
        let prompt = [1, 504, 3458, 282];
        let (w, _) = greedy(&mut whole, 1, &prompt, 4, 6);
        let (_, g_rows) = following(&mut rank0, 1, &prompt, 4, &w);
        let (_, w_rows) = following(&mut whole, 2, &prompt, 4, &w);
        same_picks_but_near_ties(&w_rows, &g_rows);
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
