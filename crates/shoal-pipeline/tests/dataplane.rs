//! Two real nodes in this process, talking over real sockets on 127.0.0.1: the data plane refuses
//! malformed input without going down, and a pipeline across the two nodes samples what one node would.

mod common;

use common::node;

use std::sync::Arc;
use std::time::Duration;

use futures::{AsyncReadExt, AsyncWriteExt};
use shoal_cluster::InstanceId;
use shoal_engine::engine::load_local_stage;
use shoal_engine::kvpool::{KvPool, KvShare};
use shoal_engine::sampler::Sampler;
use shoal_engine::stage::{
    ChunkSpec, KvOp, LocalStage, Outputs, Pick, Pool, SampleRef, Stage, StageData, forward,
};
use shoal_engine::{SamplingParams, TokenMask};
use shoal_kernels::ThreadPool;
use shoal_model::LayerRange;
use shoal_pipeline::dataplane::{
    HostedStage, Hosts, Lanes, RemoteChain, STAGE_PROTOCOL, serve_stages, wire_node_id,
};
use shoal_wire::{DType, Handshake, Role};

const INSTANCE: InstanceId = InstanceId::from_u64(0xaa);
const TIMEOUT: Duration = Duration::from_secs(30);

/// Reads until the peer closes the stream; true if it did within the timeout.
async fn closed_by_peer(stream: &mut libp2p::Stream) -> bool {
    let mut buf = [0u8; 4096];
    let work = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(TIMEOUT, work).await.unwrap_or(false)
}

/// What the whole model (one local stage) picks for `job`'s history as its sequence.
fn sample_whole(whole: &mut LocalStage, job: SampleRef<'_>) -> Pick {
    let batch = [ChunkSpec {
        seq_id: job.seq_id,
        len: job.history.len(),
        want_logits: true,
        pool: Pool::None,
    }];
    let input = StageData::Tokens(job.history.to_vec());
    match whole.forward(&batch, input, &[job]).unwrap() {
        StageData::Sampled(mut out) if out.picks.len() == 1 => out.picks.remove(0),
        _ => panic!("the whole model samples when given jobs"),
    }
}

/// How b offers lanes in a run.
#[derive(Clone, Copy, PartialEq)]
enum LaneMode {
    /// On the address a reaches it at: the streams move to lanes.
    Offered,
    /// None: the streams carry the frames (the relay).
    Off,
    /// On an address a does not connect to (like a closed data port): a falls back to the relay.
    Unreachable,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_is_refused_and_the_pipeline_still_matches_one_node() {
    refuses_malformed_input_then_matches_one_node(LaneMode::Offered).await;
}

/// The same through the cluster connection itself (the relay, where no direct connection can be made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_lanes_the_pipeline_still_matches_one_node() {
    refuses_malformed_input_then_matches_one_node(LaneMode::Off).await;
}

/// A lane offered on a port a cannot reach: a says so and both use the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_that_cannot_connect_falls_back_to_the_stream() {
    refuses_malformed_input_then_matches_one_node(LaneMode::Unreachable).await;
}

async fn refuses_malformed_input_then_matches_one_node(mode: LaneMode) {
    let lanes = mode == LaneMode::Offered;
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = node(&da, "dataplane-test", vec![]).await;
    let a_addr: libp2p::Multiaddr = a.snapshot().listen_addrs[0].parse().unwrap();
    let b = node(&db, "dataplane-test", vec![a_addr]).await;
    let met = a.wait_for(TIMEOUT, |s| s.state.members().len() == 2).await;
    assert_eq!(met.state.members().len(), 2, "the nodes never met");

    // b hosts the last 15 layers of the model as stage 1 of INSTANCE.
    let path = shoal_testkit::fixtures::model_path();
    let pool = Arc::new(ThreadPool::new(1));
    let hosts = Hosts::default();
    // a dials b's lane at 127.0.0.1 (its path's address); one bound on 127.0.0.2 is not there.
    let b_lanes = match mode {
        LaneMode::Offered => Some(Lanes::bind([127, 0, 0, 1].into(), 0, b.traffic()).unwrap()),
        LaneMode::Off => None,
        LaneMode::Unreachable => Some(Lanes::bind([127, 0, 0, 2].into(), 0, b.traffic()).unwrap()),
    };
    serve_stages(b.clone(), hosts.clone(), b_lanes).unwrap();
    let tail = load_local_stage(&path, LayerRange { start: 15, end: 30 }, &pool).unwrap();
    // b's KV budget holds 8 tokens of the whole model (16 of these 15 layers): the stage sets them aside.
    let stage_bytes = tail.kv_bytes_per_token();
    let kv_pool = Arc::new(KvPool::new(16 * stage_bytes));
    let share = KvShare::reserve(&kv_pool, stage_bytes, 2 * stage_bytes).unwrap();
    assert_eq!((share.tokens(), kv_pool.reserved()), (8, 8 * stage_bytes));
    hosts.insert(HostedStage::new(INSTANCE, 1, (15, 30), None, tail, share));

    // 1. Garbage instead of a handshake: refused, stream closed.
    let mut s = a
        .streams()
        .open_stream(b.id(), STAGE_PROTOCOL)
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    s.flush().await.unwrap();
    assert!(
        closed_by_peer(&mut s).await,
        "garbage handshake not refused"
    );

    // 2. A valid handshake, then a frame with an unknown kind: the stage drops the stream.
    let mut s = a
        .streams()
        .open_stream(b.id(), STAGE_PROTOCOL)
        .await
        .unwrap();
    let hs = Handshake::new(
        wire_node_id(&a.id()),
        a.cluster_hash(),
        Role::Stage {
            instance_id: INSTANCE.as_u64(),
            stage_index: 0,
            layer_start: 0,
            layer_end: 15,
        },
    );
    s.write_all(&hs.encode()).await.unwrap();
    s.write_all(&[5, 0, 0, 0, 0xEE, 1, 2, 3, 4]).await.unwrap();
    // A 4 GiB length prefix would be refused just the same; the unknown kind is enough here.
    s.flush().await.unwrap();
    assert!(closed_by_peer(&mut s).await, "malformed frame not refused");

    // 3. The node is still up and serves a real pipeline: tokens 0..15 here, 15..30 on b, sampled there,
    //    equal to the whole model run here — with a constraint's mask (banning the model's favourite)
    //    and the top alternatives travelling over the wire.
    let tokens: Vec<u32> = vec![1, 504, 3458, 282, 4193, 30, 2];
    let head = load_local_stage(&path, LayerRange { start: 0, end: 15 }, &pool).unwrap();
    let whole = load_local_stage(&path, LayerRange { start: 0, end: 30 }, &pool).unwrap();
    let chain = RemoteChain::connect(
        &a,
        &INSTANCE,
        &[(0, 15), (15, 30)],
        &[shoal_cluster::node_id(&b.id())],
        DType::F32,
        mode != LaneMode::Off,
    )
    .await
    .unwrap();
    let transport = if lanes { "lane" } else { "relay" };
    assert_eq!(chain.transports(), (transport, transport));
    // a publishes which of its paths carry the instance's streams, and whether they are relayed.
    let shown = |snap: &shoal_cluster::Snapshot| {
        let inst = INSTANCE;
        let paths = snap.state.me().links.iter().flat_map(|l| &l.paths);
        paths
            .filter(|p| p.instances.contains(&inst))
            .map(|p| p.relayed.contains(&inst))
            .collect::<Vec<bool>>()
    };
    let snap = a.wait_for(TIMEOUT, |s| !shown(s).is_empty()).await;
    assert_eq!(
        shown(&snap),
        [!lanes],
        "one path carries both streams, relayed only without lanes"
    );
    let (remote_pick, local_pick) = tokio::task::spawn_blocking(move || {
        let (mut head, mut whole, mut chain) = (head, whole, chain);
        // The prompt in two chunks, as a chunked prefill sends it: the first wants no token.
        let split = 3;
        let first = [ChunkSpec {
            seq_id: 7,
            len: split,
            want_logits: false,
            pool: Pool::None,
        }];
        let batch = [ChunkSpec {
            seq_id: 7,
            len: tokens.len() - split,
            want_logits: true,
            pool: Pool::None,
        }];
        let sampler = Sampler::new(
            SamplingParams {
                temperature: 0.0,
                top_logprobs: 5,
                ..Default::default()
            },
            1,
        );
        // The whole model here, unconstrained: its favourite is what the mask bans below.
        let free = SampleRef {
            seq_id: 9,
            sampler: &sampler,
            history: &tokens,
            mask: None,
            draft: &[],
            draft_masks: &[],
        };
        let favourite = sample_whole(&mut whole, free);
        let vocab = whole.model().config().vocab_size;
        let ban = TokenMask::banning(vocab, [favourite.id]);
        let job = [SampleRef {
            seq_id: 7,
            sampler: &sampler,
            history: &tokens,
            mask: Some(&ban),
            draft: &[],
            draft_masks: &[],
        }];
        let StageData::Hidden(h) = head
            .forward(&first, StageData::Tokens(tokens[..split].to_vec()), &[])
            .unwrap()
        else {
            panic!("the head stage must return hidden states");
        };
        match forward(&mut chain, &first, StageData::Hidden(h), &[]).unwrap() {
            StageData::Sampled(none) => assert!(none.picks.is_empty() && none.pooled.rows() == 0),
            _ => panic!("a remote chain answers every batch with sampled tokens"),
        }
        let StageData::Hidden(h) = head
            .forward(&batch, StageData::Tokens(tokens[split..].to_vec()), &job)
            .unwrap()
        else {
            panic!("the head stage must return hidden states");
        };
        let StageData::Sampled(Outputs { picks: remote, .. }) =
            forward(&mut chain, &batch, StageData::Hidden(h), &job).unwrap()
        else {
            panic!("a remote chain returns sampled tokens");
        };
        let local = sample_whole(&mut whole, job[0]);
        assert_ne!(local.id, favourite.id, "the mask bans the favourite");
        // Alternatives are the model's raw ones: the banned favourite still leads them.
        assert_eq!(local.top.len(), 5);
        assert_eq!(local.top[0].0, favourite.id);
        assert_eq!(local.top, favourite.top);
        assert_eq!(chain.cached_len(7), tokens.len());
        chain.kv(KvOp::Release { seq_id: 7 }).unwrap();
        // An embedding: 5 tokens in two chunks, each asking b for the sum of its final-normed states,
        // which come back in a Pooled frame: their sum is the whole model's.
        let input = &tokens[..5];
        let mut remote_sum = vec![0f32; whole.model().config().dim];
        for (start, n) in [(0, 2), (2, 3)] {
            let batch = [ChunkSpec {
                seq_id: 10,
                len: n,
                want_logits: false,
                pool: Pool::Sum,
            }];
            let ids = StageData::Tokens(input[start..start + n].to_vec());
            let Ok(StageData::Hidden(h)) = head.forward(&batch, ids, &[]) else {
                panic!("the head stage must return hidden states");
            };
            let Ok(StageData::Sampled(out)) =
                forward(&mut chain, &batch, StageData::Hidden(h), &[])
            else {
                panic!("a remote chain answers every batch");
            };
            assert!(out.picks.is_empty());
            assert_eq!(out.pooled.rows(), 1);
            for (s, v) in remote_sum.iter_mut().zip(out.pooled.data()) {
                *s += v;
            }
        }
        chain.kv(KvOp::Release { seq_id: 10 }).unwrap();
        // A second choice of a prompt: forked from the first's KV on both nodes, it runs the prompt's
        // last token itself and draws what the first drew.
        let prompt = &tokens[..3];
        let run = |head: &mut LocalStage, chain: &mut RemoteChain, seq_id, at: usize| {
            let batch = [ChunkSpec {
                seq_id,
                len: prompt.len() - at,
                want_logits: true,
                pool: Pool::None,
            }];
            let job = [SampleRef {
                seq_id,
                sampler: &sampler,
                history: prompt,
                mask: None,
                draft: &[],
                draft_masks: &[],
            }];
            let ids = StageData::Tokens(prompt[at..].to_vec());
            let Ok(StageData::Hidden(h)) = head.forward(&batch, ids, &job) else {
                panic!("the head stage must return hidden states");
            };
            match forward(chain, &batch, StageData::Hidden(h), &job) {
                Ok(StageData::Sampled(mut out)) if out.picks.len() == 1 => out.picks.remove(0),
                _ => panic!("a remote chain returns the pick"),
            }
        };
        let first = run(&mut head, &mut chain, 12, 0);
        let fork = KvOp::Fork {
            seq_id: 12,
            into: 13,
            len: prompt.len() - 1,
        };
        head.kv(fork).unwrap();
        chain.kv(fork).unwrap();
        assert_eq!(chain.cached_len(13), prompt.len() - 1);
        let second = run(&mut head, &mut chain, 13, prompt.len() - 1);
        assert_eq!(second.id, first.id);
        for seq_id in [12, 13] {
            chain.kv(KvOp::Release { seq_id }).unwrap();
        }
        let whole_batch = [ChunkSpec {
            seq_id: 11,
            len: 5,
            want_logits: false,
            pool: Pool::Sum,
        }];
        let Ok(StageData::Logits { pooled, .. }) =
            whole.forward(&whole_batch, StageData::Tokens(input.to_vec()), &[])
        else {
            panic!("the whole model returns its pooled rows");
        };
        for (r, l) in remote_sum.iter().zip(pooled.data()) {
            assert!((r - l).abs() <= 1e-4 * (1.0 + l.abs()), "{r} vs {l}");
        }
        // 4. A batch past the KV b set aside is refused with an error, not allocated.
        let long: Vec<u32> = (300..309).collect();
        let batch = [ChunkSpec {
            seq_id: 8,
            len: long.len(),
            want_logits: true,
            pool: Pool::None,
        }];
        let job = [SampleRef {
            seq_id: 8,
            sampler: &sampler,
            history: &long,
            mask: None,
            draft: &[],
            draft_masks: &[],
        }];
        let StageData::Hidden(h) = head
            .forward(&batch, StageData::Tokens(long.clone()), &job)
            .unwrap()
        else {
            panic!("the head stage must return hidden states");
        };
        let err = match forward(&mut chain, &batch, StageData::Hidden(h), &job) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a batch past the stage's KV share was computed"),
        };
        assert!(err.contains("reserved"), "{err}");
        (remote[0].clone(), local)
    })
    .await
    .unwrap();
    assert_eq!(remote_pick.id, local_pick.id);
    assert!((remote_pick.logprob - local_pick.logprob).abs() < 1e-5);
    let ids = |p: &Pick| p.top.iter().map(|t| t.0).collect::<Vec<_>>();
    assert_eq!(ids(&remote_pick), ids(&local_pick));
    for (r, l) in remote_pick.top.iter().zip(&local_pick.top) {
        assert!((r.1 - l.1).abs() < 1e-5, "{r:?} vs {l:?}");
    }
}
