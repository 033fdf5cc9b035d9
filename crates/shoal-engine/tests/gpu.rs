//! GPU stages behind the stage seam (lavapipe in CI): a [`GpuStage`]'s batched decode, prefix reuse
//! and forks give each sequence's lone-run tokens; a pipeline of a GPU stage and a CPU stage gives
//! the CPU's tokens, and so does one stage split between the two (its first layers on the GPU, a
//! `HybridStage`, KV operations and rewinds on both parts); an engine on `Device::Gpu` serves
//! greedy requests as the CPU engine does; a GPU index with no adapter is an
//! `EngineError::Device`. These fail when no adapter exists unless `SHOAL_GPU_TESTS=skip`.

use std::sync::Arc;

use shoal_engine::EngineError;
use shoal_engine::engine::{
    Device, EngineConfig, Placement, load_hybrid_stage, load_local_stage, load_stage_on,
    spawn_from_gguf,
};
use shoal_engine::stage::{ChunkSpec, KvOp, Pool, Stage, StageData};
use shoal_engine::{Event, Prompt};
use shoal_kernels::ThreadPool;
use shoal_model::LayerRange;
use shoal_testkit::fixtures::model_path;

mod common;
use common::PATIENCE;

const MODEL: &str = "smollm2-135m-instruct-q4_1";

/// Whether an adapter exists; without one the tests fail unless `SHOAL_GPU_TESTS=skip`.
fn have_gpu() -> bool {
    if !shoal_gpu::Gpu::discover().is_empty() {
        return true;
    }
    assert!(
        std::env::var("SHOAL_GPU_TESTS").is_ok_and(|v| v == "skip"),
        "no GPU adapter; install Mesa's lavapipe (apt-get install mesa-vulkan-drivers) or set \
         SHOAL_GPU_TESTS=skip"
    );
    false
}

fn gpu_placement() -> Placement {
    Placement {
        device: Device::Gpu(0),
        device_kv_budget_bytes: 64 << 20,
        gpu_layers: None,
        nextn: false,
    }
}

fn gpu_stage(range: LayerRange) -> Box<dyn Stage> {
    let pool = Arc::new(ThreadPool::new(1));
    load_stage_on(&model_path(), range, &pool, gpu_placement()).expect("GPU stage")
}

fn spec(seq_id: u64, len: usize) -> ChunkSpec {
    ChunkSpec {
        seq_id,
        len,
        want_logits: true,
        pool: Pool::None,
    }
}

/// One batch through `stages`: the greedy token of each chunk.
fn step(stages: &mut [Box<dyn Stage>], batch: &[ChunkSpec], tokens: Vec<u32>) -> Vec<u32> {
    let mut data = StageData::Tokens(tokens);
    for s in stages.iter_mut() {
        data = shoal_engine::stage::forward(s.as_mut(), batch, data, &[]).expect("forward");
    }
    greedy(data)
}

/// `n` greedy tokens of `prompt` alone as sequence `id`.
fn alone(stages: &mut [Box<dyn Stage>], id: u64, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut out = step(stages, &[spec(id, prompt.len())], prompt.to_vec());
    while out.len() < n {
        let last = out[out.len() - 1];
        out.extend(step(stages, &[spec(id, 1)], vec![last]));
    }
    stages.iter_mut().for_each(|s| {
        s.kv(KvOp::Release { seq_id: id }).expect("release");
    });
    out
}

#[test]
fn batched_sequences_prefixes_and_forks_on_a_gpu_stage_give_the_lone_tokens() {
    if !have_gpu() {
        return;
    }
    let mut stages = vec![gpu_stage(LayerRange { start: 0, end: 30 })];
    let info = stages[0].info();
    assert_eq!(
        info.local_kv_layers, 0,
        "device KV is not on the host budget"
    );
    assert!(info.kv_token_capacity.is_some_and(|c| c > 1000));
    let a: &[u32] = &[504, 3575, 282, 4649, 314];
    let b: &[u32] = &[1604, 3987, 46477, 24, 94, 727];
    let (want_a, want_b) = (alone(&mut stages, 1, a, 3), alone(&mut stages, 2, b, 3));
    // Both prefilled in one batch, then decoded together.
    let mut got = step(
        &mut stages,
        &[spec(3, a.len()), spec(4, b.len())],
        [a, b].concat(),
    );
    for _ in 0..2 {
        let next = step(
            &mut stages,
            &[spec(3, 1), spec(4, 1)],
            got[got.len() - 2..].to_vec(),
        );
        got.extend(next);
    }
    let (ga, gb): (Vec<u32>, Vec<u32>) = got.chunks(2).map(|p| (p[0], p[1])).unzip();
    assert_eq!((ga, gb), (want_a.clone(), want_b));
    // Sequence 3's prompt kept as a prefix; sequence 5 starts from it and prefills only its last
    // token; sequence 6 is a fork of 5.
    let s = &mut stages[0];
    s.kv(KvOp::Retain {
        seq_id: 3,
        prefix_id: 9,
        len: a.len() - 1,
    })
    .expect("retain");
    s.kv(KvOp::Start {
        prefix_id: 9,
        seq_id: 5,
        len: a.len() - 1,
    })
    .expect("start");
    s.kv(KvOp::DropPrefix { prefix_id: 9 }).expect("drop");
    let first = step(&mut stages, &[spec(5, 1)], vec![a[a.len() - 1]]);
    assert_eq!(first[0], want_a[0]);
    stages[0]
        .kv(KvOp::Fork {
            seq_id: 5,
            into: 6,
            len: a.len(),
        })
        .expect("fork");
    let next = step(
        &mut stages,
        &[spec(5, 1), spec(6, 1)],
        vec![first[0], first[0]],
    );
    assert_eq!(next, vec![want_a[1], want_a[1]]);
    assert_eq!(stages[0].held_sequences(), 3);
}

#[test]
fn a_gpu_stage_then_a_cpu_stage_give_the_cpu_s_tokens() {
    if !have_gpu() {
        return;
    }
    let pool = Arc::new(ThreadPool::new(1));
    let cpu = |r| {
        Box::new(load_local_stage(&model_path(), r, &pool).expect("CPU stage")) as Box<dyn Stage>
    };
    let mut one_node = vec![cpu(LayerRange { start: 0, end: 30 })];
    let mut mixed = vec![
        gpu_stage(LayerRange { start: 0, end: 12 }),
        cpu(LayerRange { start: 12, end: 30 }),
    ];
    let prompt = [504u32, 3575, 282, 4649, 314];
    assert_eq!(
        alone(&mut mixed, 1, &prompt, 4),
        alone(&mut one_node, 1, &prompt, 4)
    );
}

/// llama.cpp's `-ngl` per stage: the first 3 layers on the GPU, the other 27 on the CPU, as one
/// stage. Its greedy tokens are the all-CPU stage's; every KV operation, the rewind and the counts
/// hold for both parts.
#[test]
fn a_stage_split_between_the_gpu_and_the_cpu_gives_the_cpu_s_tokens() {
    if !have_gpu() {
        return;
    }
    let pool = Arc::new(ThreadPool::new(1));
    let full = LayerRange { start: 0, end: 30 };
    let split = load_hybrid_stage(&model_path(), full, &pool, Placement::gpu(0, 3, 64 << 20))
        .expect("split stage");
    assert_eq!((split.gpu_layers(), split.cpu_layers()), (3, 27));
    assert_eq!(split.layers(), (0, 30));
    let info = Stage::info(&split);
    assert_eq!(info.local_kv_layers, 27, "the CPU part's KV is the host's");
    assert!(
        info.kv_token_capacity.is_some_and(|c| c > 1000),
        "the GPU part's is the device's"
    );
    assert_eq!(
        split.host_kv_bytes_per_token(),
        27 * split.model_kv_bytes_per_token() / 30
    );
    let mut split: Vec<Box<dyn Stage>> = vec![Box::new(split)];
    let mut cpu: Vec<Box<dyn Stage>> = vec![Box::new(
        load_local_stage(&model_path(), full, &pool).expect("CPU stage"),
    )];
    let prompt = [504u32, 3575, 282, 4649, 314];
    let want = alone(&mut cpu, 1, &prompt, 4);
    assert_eq!(alone(&mut split, 1, &prompt, 4), want);
    // The prompt kept as a prefix, started again as sequence 2 and forked into 3: both parts follow.
    let s = &mut split[0];
    step_into(s.as_mut(), 1, &prompt);
    s.kv(KvOp::Retain {
        seq_id: 1,
        prefix_id: 7,
        len: prompt.len() - 1,
    })
    .expect("retain");
    s.kv(KvOp::Start {
        prefix_id: 7,
        seq_id: 2,
        len: prompt.len() - 1,
    })
    .expect("start");
    let first = step(&mut split, &[spec(2, 1)], vec![prompt[prompt.len() - 1]]);
    assert_eq!(first[0], want[0]);
    split[0]
        .kv(KvOp::Fork {
            seq_id: 2,
            into: 3,
            len: prompt.len(),
        })
        .expect("fork");
    assert_eq!(split[0].held_sequences(), 2);
    let next = step(
        &mut split,
        &[spec(2, 1), spec(3, 1)],
        vec![want[0], want[0]],
    );
    assert_eq!(next, vec![want[1], want[1]]);
    // Rewound by one token on both parts, sequence 3 computes its last token again.
    let mut hybrid = load_hybrid_stage(&model_path(), full, &pool, Placement::gpu(0, 3, 64 << 20))
        .expect("split stage");
    let run = |h: &mut shoal_engine::engine::HybridStage, tokens: &[u32]| {
        let batch = [spec(9, tokens.len())];
        let out = h
            .forward(&batch, StageData::Tokens(tokens.to_vec()), &[])
            .expect("forward");
        greedy(out)[0]
    };
    let t0 = run(&mut hybrid, &prompt);
    let t1 = run(&mut hybrid, &[t0]);
    assert_eq!((hybrid.cached_len(9), hybrid.held_tokens()), (6, 6));
    hybrid.rewind(9, 5).expect("rewind");
    assert_eq!(hybrid.cached_len(9), 5);
    assert_eq!(
        run(&mut hybrid, &[t0]),
        t1,
        "after the rewind, the same token"
    );
    assert_eq!((t0, t1), (want[0], want[1]));
    hybrid.apply(KvOp::Release { seq_id: 9 }).expect("release");
    assert_eq!(
        (Stage::held_sequences(&hybrid), hybrid.held_tokens()),
        (0, 0)
    );
}

/// Runs `prompt` as sequence `id` through `stage` (its KV kept).
fn step_into(stage: &mut dyn Stage, id: u64, prompt: &[u32]) {
    let batch = [spec(id, prompt.len())];
    shoal_engine::stage::forward(stage, &batch, StageData::Tokens(prompt.to_vec()), &[])
        .expect("forward");
}

/// The greedy token of each logits row.
fn greedy(data: StageData) -> Vec<u32> {
    let StageData::Logits { logits, .. } = data else {
        panic!("no logits");
    };
    (0..logits.rows())
        .map(|i| {
            let row = logits.row(i).expect("row");
            (0..row.len()).fold(0, |b, j| if row[j] > row[b] { j } else { b }) as u32
        })
        .collect()
}

#[tokio::test]
async fn an_engine_on_the_gpu_serves_the_cpu_engine_s_greedy_tokens() {
    if !have_gpu() {
        return;
    }
    let tokens = |device| async move {
        let engine = spawn_from_gguf(
            &model_path(),
            MODEL,
            EngineConfig {
                threads: 1,
                device,
                ..Default::default()
            },
        )
        .expect("engine");
        let req = common::greedy(MODEL, Prompt::Text("The capital of France is".into()), 4);
        let mut stream = engine.submit(req).expect("submit");
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout(PATIENCE, stream.next())
                .await
                .expect("stalled")
            {
                Some(Event::Token { id, .. }) => out.push(id),
                Some(Event::Done { .. }) => return out,
                other => panic!("{other:?}"),
            }
        }
    };
    assert_eq!(tokens(Device::Gpu(0)).await, tokens(Device::Cpu).await);
}

/// The n-gram drafter's favourite: a continuation that repeats its prompt.
const PATTERN: &str = "def f0(x):\n    y = x * 2\n    return y + 0\n\ndef f1(x):\n    y = x * 2\n    \
return y + 1\n\ndef f2(x):\n    y = x * 2\n    return y + 2\n\n";

#[tokio::test]
async fn a_gpu_engine_verifies_drafts_and_its_greedy_output_is_unchanged() {
    if !have_gpu() {
        return;
    }
    let engine = spawn_from_gguf(
        &model_path(),
        MODEL,
        EngineConfig {
            threads: 1,
            device: Device::Gpu(0),
            ..Default::default()
        },
    )
    .expect("engine");
    let run = |spec| {
        let mut req = common::greedy(MODEL, Prompt::Text(PATTERN.into()), 24);
        req.speculative = Some(spec);
        let mut stream = engine.submit(req).expect("submit");
        async move { common::drain(&mut stream).await }
    };
    let plain = run(shoal_engine::Speculation::Off).await;
    let before = engine.stats();
    let drafted = run(shoal_engine::Speculation::Ngram { max_draft: 8 }).await;
    let after = engine.stats();
    let ids = |d: &common::Drained| d.tokens.iter().map(|t| t.0).collect::<Vec<_>>();
    assert_eq!(ids(&drafted), ids(&plain));
    assert_eq!(drafted.finish, plain.finish);
    let passes = after.spec_passes - before.spec_passes;
    let accepted = after.accepted_tokens - before.accepted_tokens;
    assert!(
        passes > 0 && accepted > 0,
        "the GPU stage verified {passes} passes, {accepted} tokens accepted"
    );
}

#[test]
fn a_gpu_index_without_an_adapter_is_a_device_error() {
    let pool = Arc::new(ThreadPool::new(1));
    let placement = Placement {
        device: Device::Gpu(99),
        ..gpu_placement()
    };
    let err = load_stage_on(
        &model_path(),
        LayerRange { start: 0, end: 30 },
        &pool,
        placement,
    )
    .err()
    .expect("no adapter 99");
    assert!(matches!(err, EngineError::Device(_)), "{err}");
}
