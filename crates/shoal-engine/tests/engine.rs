//! The engine on the real model: no token lost, cancellation stops work, stop sequences, seeded
//! determinism (the engine's default seed too), batching equals running alone, local pipelines equal
//! one stage, and clear errors.

use std::time::{Duration, Instant};

use shoal_engine::engine::{EngineConfig, spawn_from_gguf};
use shoal_engine::{
    EngineError, EngineHandle, Event, FinishReason, GenerateRequest, Prompt, SamplingParams,
};
use shoal_model::LayerRange;
use shoal_testkit::fixtures::model_path;

mod common;
use common::{PATIENCE, wait_for};

const MODEL: &str = "smollm2-135m-instruct-q4_1";
/// KV bytes per token of the test model: K and V × 30 layers × 3 KV heads × 64 values, f16 on CPU.
const KV_TOKEN: usize = 2 * 30 * 3 * 64 * 2;

fn engine_with(config: EngineConfig) -> EngineHandle {
    spawn_from_gguf(&model_path(), MODEL, config).expect("engine")
}

fn engine() -> EngineHandle {
    engine_with(EngineConfig {
        threads: 1,
        ..Default::default()
    })
}

fn request(prompt: &str, max_tokens: u32) -> GenerateRequest {
    common::greedy(MODEL, Prompt::Text(prompt.into()), max_tokens)
}

struct Output {
    tokens: Vec<u32>,
    text: String,
    finish: FinishReason,
    completion_tokens: u32,
    cached_tokens: u32,
    stop_sequence: Option<String>,
}

async fn collect(engine: &EngineHandle, req: GenerateRequest) -> Output {
    let mut stream = engine.submit(req).expect("submit");
    let (mut tokens, mut text) = (Vec::new(), String::new());
    loop {
        match tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("engine stalled")
        {
            Some(Event::Token { id, text: t, .. }) => {
                tokens.push(id);
                text.push_str(&t);
            }
            Some(Event::Done {
                finish_reason,
                usage,
                stop_sequence,
            }) => {
                return Output {
                    tokens,
                    text,
                    finish: finish_reason,
                    completion_tokens: usage.completion_tokens,
                    cached_tokens: usage.cached_tokens,
                    stop_sequence,
                };
            }
            Some(Event::Error(e)) => panic!("engine error: {e}"),
            None => panic!("stream ended without Done"),
        }
    }
}

#[tokio::test]
async fn no_token_lost_when_the_engine_finishes_before_the_first_poll() {
    let engine = engine();
    let mut stream = engine
        .submit(request("The capital of France is", 12))
        .expect("submit");
    // The engine runs the whole request before anyone reads the stream.
    wait_for(&engine, "the request to finish", |s| {
        s.active_sequences == 0 && s.generated_tokens == 12
    });
    let mut n = 0;
    let mut done = None;
    while let Some(ev) = stream.next().await {
        match ev {
            Event::Token { .. } => n += 1,
            Event::Done {
                finish_reason,
                usage,
                ..
            } => done = Some((finish_reason, usage)),
            Event::Error(e) => panic!("{e}"),
        }
    }
    let (reason, usage) = done.expect("Done event");
    assert_eq!(
        (n, reason, usage.completion_tokens),
        (12, FinishReason::Length, 12)
    );
    assert_eq!(usage.prompt_tokens, 5);
    assert_eq!(
        engine.count_tokens("The capital of France is", true),
        5,
        "count_tokens counts as submit does"
    );
}

#[tokio::test]
async fn dropping_the_stream_stops_generation_within_a_step() {
    let engine = engine();
    let mut req = request("Once upon a time", 5000);
    req.ignore_eos = true;
    let mut stream = engine.submit(req).expect("submit");
    // Read two tokens, then the client goes away.
    for _ in 0..2 {
        match stream.next().await {
            Some(Event::Token { .. }) => {}
            other => panic!("expected a token, got {other:?}"),
        }
    }
    drop(stream);
    let at_drop = engine.stats().generated_tokens;
    wait_for(&engine, "the sequence to be freed", |s| {
        s.active_sequences == 0
    });
    let after = engine.stats();
    // At most the step in flight when the stream was dropped finishes.
    assert!(
        after.generated_tokens <= at_drop + 1,
        "kept generating: {at_drop} -> {}",
        after.generated_tokens
    );
    let steps = after.steps;
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        engine.stats().steps,
        steps,
        "the engine kept stepping with nothing to do"
    );
}

#[tokio::test]
async fn stop_sequences_end_generation_and_are_never_emitted() {
    let engine = engine();
    let full = collect(&engine, request("The capital of France is", 16)).await;
    assert!(
        full.text.contains("\n\n"),
        "precondition: greedy text {:?}",
        full.text
    );
    assert_eq!(full.stop_sequence, None);
    let mut req = request("The capital of France is", 16);
    req.stop = vec!["never there".into(), "\n\n".into()];
    let cut = collect(&engine, req).await;
    assert_eq!(cut.finish, FinishReason::Stop);
    assert_eq!(
        cut.stop_sequence.as_deref(),
        Some("\n\n"),
        "the matched stop is named"
    );
    assert_eq!(cut.text, full.text[..full.text.find("\n\n").unwrap_or(0)]);
    assert!(!cut.text.contains("\n\n"));
}

#[tokio::test]
async fn same_seed_same_output_and_concurrent_requests_do_not_cross() {
    let engine = engine();
    let seeded = |seed| {
        let mut r = request("Tell me a story about a fish.", 24);
        r.sampling = SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            seed: Some(seed),
            ..Default::default()
        };
        r.ignore_eos = true;
        r
    };
    let alone_1 = collect(&engine, seeded(1)).await.tokens;
    let alone_2 = collect(&engine, seeded(2)).await.tokens;
    let greedy = collect(&engine, request("1, 2, 3,", 16)).await.tokens;
    assert_ne!(alone_1, alone_2, "different seeds should differ");
    // The same three requests at once, batched by the engine.
    let (a, b, c) = tokio::join!(
        collect(&engine, seeded(1)),
        collect(&engine, seeded(2)),
        collect(&engine, request("1, 2, 3,", 16))
    );
    assert_eq!(a.tokens, alone_1);
    assert_eq!(b.tokens, alone_2);
    assert_eq!(c.tokens, greedy);
}

/// `EngineConfig::seed` (`shoal serve --seed`): a sampled request that names no seed draws as if it had
/// named the engine's, every time; one that names a seed keeps its own.
#[tokio::test]
async fn an_engine_seed_makes_unseeded_sampled_requests_repeat() {
    let engine = engine_with(EngineConfig {
        threads: 1,
        seed: Some(42),
        ..Default::default()
    });
    let sampled = |seed| {
        let mut r = request("Tell me a story about a fish.", 16);
        r.sampling = SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        };
        r.ignore_eos = true;
        r
    };
    let unseeded = collect(&engine, sampled(None)).await.tokens;
    assert_eq!(unseeded.len(), 16);
    assert_eq!(collect(&engine, sampled(None)).await.tokens, unseeded);
    assert_eq!(collect(&engine, sampled(Some(42))).await.tokens, unseeded);
    assert_ne!(
        collect(&engine, sampled(Some(7))).await.tokens,
        unseeded,
        "a request's own seed should win over the engine's"
    );
}

#[tokio::test]
async fn three_local_stages_generate_what_one_stage_generates() {
    let one = engine();
    let three = engine_with(EngineConfig {
        threads: 1,
        stages: Some(vec![
            LayerRange { start: 0, end: 10 },
            LayerRange { start: 10, end: 20 },
            LayerRange { start: 20, end: 30 },
        ]),
        ..Default::default()
    });
    let a = collect(&one, request("def fibonacci(n):", 20)).await;
    let b = collect(&three, request("def fibonacci(n):", 20)).await;
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.text, b.text);
}

#[tokio::test]
async fn long_prompt_is_prefilled_in_chunks() {
    // A 64-token step budget forces a ~200-token prompt through several prefill chunks.
    let small = engine_with(EngineConfig {
        threads: 1,
        max_batch_tokens: 64,
        ..Default::default()
    });
    let big = engine();
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    let a = collect(&small, request(&prompt, 8)).await;
    let b = collect(&big, request(&prompt, 8)).await;
    assert_eq!(a.tokens, b.tokens);
    assert!(small.stats().steps > big.stats().steps);
}

#[tokio::test]
async fn bad_requests_are_clear_errors() {
    let engine = engine();
    let mut r = request("hi", 4);
    r.model = "nope".into();
    assert!(matches!(
        engine.submit(r),
        Err(EngineError::ModelNotFound { .. })
    ));
    assert!(matches!(
        engine.submit(request("", 4)),
        Err(EngineError::EmptyPrompt)
    ));
    let long = "word ".repeat(9000);
    match engine.submit(request(&long, 4)) {
        Err(EngineError::PromptTooLong {
            prompt_tokens,
            context_length,
        }) => {
            assert_eq!(context_length, 8192);
            assert!(prompt_tokens > 8192);
        }
        other => panic!("expected PromptTooLong, got {:?}", other.map(|s| s.id())),
    }
    let mut r = request("hi", 4);
    r.prompt = Prompt::Tokens(vec![1, 49152]);
    assert!(matches!(
        engine.submit(r),
        Err(EngineError::InvalidParam {
            param: "prompt",
            ..
        })
    ));
    assert!(
        SamplingParams {
            temperature: 2.5,
            ..Default::default()
        }
        .validate()
        .is_err()
    );
    // Still serving.
    assert_eq!(
        collect(&engine, request("hi", 3)).await.completion_tokens,
        3
    );
}

#[tokio::test]
async fn a_full_queue_answers_overloaded_and_recovers() {
    // Room for one running sequence, one waiting and one in the channel: a fourth request cannot fit.
    let engine = engine_with(EngineConfig {
        threads: 1,
        max_running: 1,
        queue_depth: 1,
        ..Default::default()
    });
    let mut long = request("Once upon a time", 5000);
    long.ignore_eos = true;
    let mut streams = Vec::new();
    let mut overloaded = 0;
    for _ in 0..4 {
        match engine.submit(long.clone()) {
            Ok(s) => streams.push(s),
            Err(EngineError::Overloaded) => overloaded += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(
        overloaded >= 1,
        "four long requests fit in a capacity of three"
    );
    drop(streams);
    wait_for(&engine, "the cancelled requests to be freed", |s| {
        s.active_sequences == 0 && s.waiting == 0
    });
    assert_eq!(
        collect(&engine, request("hi", 3)).await.completion_tokens,
        3
    );
}

#[tokio::test]
async fn cancel_by_id_and_timeouts_end_requests() {
    let engine = engine();
    let mut long = request("Once upon a time", 5000);
    long.ignore_eos = true;
    let mut stream = engine.submit(long.clone()).expect("submit");
    assert!(matches!(stream.next().await, Some(Event::Token { .. })));
    assert!(engine.cancel(stream.id()));
    let mut last = None;
    while let Some(ev) = tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("stalled")
    {
        last = Some(ev);
    }
    assert!(
        matches!(
            last,
            Some(Event::Done {
                finish_reason: FinishReason::Cancelled,
                ..
            })
        ),
        "{last:?}"
    );
    assert!(!engine.cancel(stream.id()), "already gone");
    assert!(!engine.cancel(987_654), "never existed");

    long.timeout = Some(Duration::from_millis(200));
    let mut stream = engine.submit(long).expect("submit");
    let mut last = None;
    while let Some(ev) = tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("stalled")
    {
        last = Some(ev);
    }
    assert_eq!(
        last,
        Some(Event::Error(EngineError::Timeout { after_ms: 200 }))
    );
    wait_for(&engine, "the timed-out sequence to be freed", |s| {
        s.active_sequences == 0
    });
}

#[tokio::test]
async fn prefix_cache_reuses_a_previous_turn_and_changes_nothing() {
    let cached = engine();
    let plain = engine_with(EngineConfig {
        threads: 1,
        prefix_cache_tokens: 0,
        ..Default::default()
    });
    let system = "<|im_start|>system\nYou are a helpful assistant who answers briefly.<|im_end|>\n";
    let turn1 =
        format!("{system}<|im_start|>user\nName a fish.<|im_end|>\n<|im_start|>assistant\n");
    let first = collect(&cached, request(&turn1, 8)).await;
    assert_eq!(first.cached_tokens, 0);
    // Second turn: the whole first turn is a prefix of the new prompt.
    let turn2 = format!(
        "{turn1}{}<|im_end|>\n<|im_start|>user\nAnother one?<|im_end|>\n<|im_start|>assistant\n",
        first.text
    );
    let with = collect(&cached, request(&turn2, 12)).await;
    let without = collect(&plain, request(&turn2, 12)).await;
    assert!(
        with.cached_tokens >= 20,
        "cached {} tokens",
        with.cached_tokens
    );
    assert_eq!(without.cached_tokens, 0);
    assert_eq!(with.tokens, without.tokens, "the cache changed the output");
    // The same prompt again reuses all but its last token.
    let again = collect(&cached, request(&turn2, 12)).await;
    assert_eq!(again.tokens, without.tokens);
    assert!(again.cached_tokens > with.cached_tokens);
}

#[tokio::test]
async fn a_small_kv_budget_queues_and_preempts_but_every_request_finishes_unchanged() {
    // Room for ~96 tokens of KV: four requests of ~10 prompt + 40 generated tokens cannot all hold
    // their KV at once, so some wait and some are preempted and recomputed.
    let kv_token = KV_TOKEN;
    let tight = engine_with(EngineConfig {
        threads: 1,
        kv_budget_bytes: 96 * kv_token,
        prefix_cache_tokens: 0,
        ..Default::default()
    });
    four_requests_finish_as_alone_and_a_huge_prompt_is_refused(&tight).await;
}

/// Four concurrent requests of ~10 prompt + 40 generated tokens on `tight` (room for about 96 tokens
/// of KV) give what each gives alone on a roomy engine; a 200-word prompt is refused, not hung.
async fn four_requests_finish_as_alone_and_a_huge_prompt_is_refused(tight: &EngineHandle) {
    let roomy = engine();
    let prompts = [
        "Once upon a time, in a small village,",
        "1, 2, 3, 4, 5,",
        "def fibonacci(n):",
        "The cat sat on",
    ];
    let req = |p: &str| {
        let mut r = request(p, 40);
        r.ignore_eos = true;
        r
    };
    let (a, b, c, d) = tokio::join!(
        collect(tight, req(prompts[0])),
        collect(tight, req(prompts[1])),
        collect(tight, req(prompts[2])),
        collect(tight, req(prompts[3]))
    );
    for (out, p) in [a, b, c, d].iter().zip(prompts) {
        let alone = collect(&roomy, req(p)).await;
        assert_eq!(out.tokens, alone.tokens, "{p}");
        assert_eq!(out.finish, FinishReason::Length);
    }
    let mut stream = tight
        .submit(request(&"word ".repeat(200), 4))
        .expect("submit");
    assert!(matches!(
        stream.next().await,
        Some(Event::Error(EngineError::PromptTooLong { .. }))
    ));
}

#[tokio::test]
async fn two_models_share_the_node_kv_pool_and_both_finish_unchanged() {
    // Two engines (two "models") on one pool with room for ~80 tokens of KV: each request needs ~60, so
    // they cannot both hold their KV at once; the second waits for the first instead of overflowing.
    let kv_token = KV_TOKEN;
    let pool = std::sync::Arc::new(shoal_engine::kvpool::KvPool::new(80 * kv_token));
    let shared = || EngineConfig {
        threads: 1,
        kv_pool: Some(pool.clone()),
        prefix_cache_tokens: 0,
        ..Default::default()
    };
    let (first, second) = (engine_with(shared()), engine_with(shared()));
    let req = |p: &str| {
        let mut r = request(p, 50);
        r.ignore_eos = true;
        r
    };
    let (x, y) = tokio::join!(
        collect(&first, req("Once upon a time, in a small village,")),
        collect(&second, req("The cat sat on"))
    );
    let roomy = engine();
    assert_eq!(
        x.tokens,
        collect(&roomy, req("Once upon a time, in a small village,"))
            .await
            .tokens
    );
    assert_eq!(
        y.tokens,
        collect(&roomy, req("The cat sat on")).await.tokens
    );
    assert_eq!((x.completion_tokens, y.completion_tokens), (50, 50));
    // Everything reserved is given back once both are done (no prefix cache here).
    let deadline = Instant::now() + PATIENCE;
    while pool.reserved() != 0 {
        assert!(
            Instant::now() < deadline,
            "{} bytes still reserved",
            pool.reserved()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(first.stats().kv_tokens == 0 && second.stats().kv_tokens == 0);
}

#[tokio::test]
async fn an_idle_engine_evicts_its_cached_prefixes_for_another_engine_short_of_memory() {
    // Room for 100 tokens of KV. The first engine's finished request leaves ~70 tokens in its prefix
    // cache; the second engine's request needs ~70 more, so it can only finish if the first one, idle,
    // gives up its cached prefix.
    let pool = std::sync::Arc::new(shoal_engine::kvpool::KvPool::new(100 * KV_TOKEN));
    let shared = |prefix_cache_tokens| EngineConfig {
        threads: 1,
        kv_pool: Some(pool.clone()),
        prefix_cache_tokens,
        ..Default::default()
    };
    let (holder, needy) = (engine_with(shared(4096)), engine_with(shared(0)));
    let req = |p: &str, n| {
        let mut r = request(p, n);
        r.ignore_eos = true;
        r
    };
    collect(&holder, req("Once upon a time, in a small village,", 60)).await;
    wait_for(
        &holder,
        "the finished request's prefix to stay cached",
        |s| s.kv_tokens > 60,
    );
    let held = holder.stats().kv_tokens;
    let out = tokio::time::timeout(PATIENCE, collect(&needy, req("The cat sat on", 65)))
        .await
        .expect("the second engine never got the memory the idle one caches");
    assert_eq!(out.completion_tokens, 65);
    assert_eq!(
        out.tokens,
        collect(&engine(), req("The cat sat on", 65)).await.tokens
    );
    let after = holder.stats().kv_tokens;
    assert!(
        after < held,
        "the cached prefix was kept: {after} of {held} tokens"
    );
    assert!(pool.reserved() <= pool.budget());
}

#[tokio::test]
async fn cancelling_in_a_two_stage_pipeline_frees_every_stage() {
    let engine = engine_with(EngineConfig {
        threads: 1,
        stages: Some(vec![
            LayerRange { start: 0, end: 15 },
            LayerRange { start: 15, end: 30 },
        ]),
        prefix_cache_tokens: 0,
        ..Default::default()
    });
    let mut long = request("Once upon a time", 5000);
    long.ignore_eos = true;
    let mut stream = engine.submit(long).expect("submit");
    assert!(matches!(stream.next().await, Some(Event::Token { .. })));
    wait_for(&engine, "both stages to hold the sequence", |s| {
        s.stage_sequences == 2
    });
    assert!(engine.cancel(stream.id()));
    wait_for(&engine, "both stages to free it", |s| {
        s.stage_sequences == 0 && s.active_sequences == 0
    });
    let (steps, generated) = (engine.stats().steps, engine.stats().generated_tokens);
    std::thread::sleep(Duration::from_millis(50));
    let after = engine.stats();
    assert_eq!(
        (after.steps, after.generated_tokens, after.kv_tokens),
        (steps, generated, 0),
        "work after cancel"
    );
}

#[tokio::test]
async fn cancelling_a_queued_request_ends_its_stream_with_cancelled() {
    let engine = engine_with(EngineConfig {
        threads: 1,
        max_running: 1,
        ..Default::default()
    });
    let mut long = request("Once upon a time", 5000);
    long.ignore_eos = true;
    let mut running = engine.submit(long).expect("submit");
    assert!(matches!(running.next().await, Some(Event::Token { .. })));
    let mut queued = engine.submit(request("hi", 4)).expect("submit");
    wait_for(&engine, "the second request to queue", |s| s.waiting == 1);
    assert!(engine.cancel(queued.id()));
    let ev = tokio::time::timeout(PATIENCE, queued.next())
        .await
        .expect("stalled");
    assert!(
        matches!(
            ev,
            Some(Event::Done {
                finish_reason: FinishReason::Cancelled,
                ..
            })
        ),
        "{ev:?}"
    );
    drop(running);
}

/// Layers standing in for a stage on another node: its KV is not paid from the engine's pool, and its
/// node set aside room for `cap` tokens. Records the most KV it ever held.
struct HostedElsewhere {
    stage: shoal_engine::stage::LocalStage,
    cap: usize,
    most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl HostedElsewhere {
    fn record(&self) {
        self.most.fetch_max(
            self.stage.held_tokens(),
            std::sync::atomic::Ordering::SeqCst,
        );
    }
}

impl shoal_engine::stage::Stage for HostedElsewhere {
    fn info(&self) -> shoal_engine::stage::StageInfo {
        shoal_engine::stage::StageInfo {
            kv_token_capacity: Some(self.cap),
            local_kv_layers: 0,
            ..self.stage.info()
        }
    }
    fn launch(
        &mut self,
        batch: &[shoal_engine::stage::ChunkSpec],
        input: shoal_engine::stage::StageData,
        sampling: &[shoal_engine::stage::SampleRef<'_>],
    ) -> Result<shoal_engine::stage::Launched, EngineError> {
        let out = self.stage.launch(batch, input, sampling);
        self.record();
        out
    }
    fn complete(&mut self, ticket: u64) -> Result<shoal_engine::stage::StageData, EngineError> {
        self.stage.complete(ticket)
    }
    fn kv(&mut self, op: shoal_engine::stage::KvOp) -> Result<(), EngineError> {
        let r = self.stage.kv(op);
        self.record();
        r
    }
    fn held_sequences(&self) -> usize {
        self.stage.held_sequences()
    }
}

#[tokio::test]
async fn a_remote_stage_kv_capacity_bounds_the_engine_and_every_request_finishes_unchanged() {
    // The driver's own pool is roomy, but the second stage's node set aside room for 96 tokens only:
    // four requests of ~10 prompt + 40 generated tokens must wait or be preempted, never overflow it.
    let pool = std::sync::Arc::new(shoal_kernels::ThreadPool::new(1));
    let mut model = shoal_engine::engine::LoadedModel::from_gguf(
        &model_path(),
        MODEL,
        Some(&[LayerRange { start: 0, end: 15 }]),
        &pool,
    )
    .expect("first stage");
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let second = shoal_engine::engine::load_local_stage(
        &model_path(),
        LayerRange { start: 15, end: 30 },
        &pool,
    )
    .expect("second stage");
    model.stages.push(Box::new(HostedElsewhere {
        stage: second,
        cap: 96,
        most: most.clone(),
    }));
    let capped = shoal_engine::engine::spawn(
        model,
        EngineConfig {
            threads: 1,
            prefix_cache_tokens: 0,
            ..Default::default()
        },
    )
    .expect("engine");
    four_requests_finish_as_alone_and_a_huge_prompt_is_refused(&capped).await;
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    // The four together need ~200 tokens: the cap was reached, and never passed.
    assert!(
        most > 48 && most <= 96,
        "the remote stage held {most} tokens"
    );
}
