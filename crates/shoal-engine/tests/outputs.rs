//! What the engine reports on the real model besides one stream of tokens: the most likely alternatives
//! of each token (`top_logprobs`), several choices of one prompt (`n`, prefilled once) and embeddings
//! (equal to llama.cpp's within a cosine of 0.999, on one stage or several, without touching the prefix
//! cache or the decodes running beside them).

use std::path::Path;

use shoal_engine::engine::{EngineConfig, spawn_from_gguf};
use shoal_engine::{
    EmbedRequest, EngineError, EngineHandle, Event, FinishReason, GenerateRequest, Prompt,
    RequestStream, SamplingParams, TopLogprob, Usage,
};
use shoal_model::LayerRange;
use shoal_model::gguf::GgufFile;
use shoal_model::tokenizer::Tokenizer;
use shoal_testkit::fixtures::{cosine, embedding_reference, gemma_path, model_path};

mod common;
use common::wait_for;

const MODEL: &str = "smollm2-135m-instruct-q4_1";

fn engine() -> EngineHandle {
    engine_of(&model_path(), MODEL, None)
}

fn engine_of(path: &Path, id: &str, stages: Option<Vec<LayerRange>>) -> EngineHandle {
    let config = EngineConfig {
        threads: 1,
        stages,
        ..Default::default()
    };
    spawn_from_gguf(path, id, config).expect("engine")
}

fn tokenizer() -> Tokenizer {
    let gguf = GgufFile::open(&model_path()).expect("gguf");
    Tokenizer::from_gguf(gguf.content()).expect("tokenizer")
}

/// Each token's id, logprob and alternatives.
async fn tokens(engine: &EngineHandle, req: GenerateRequest) -> Vec<(u32, f32, Vec<TopLogprob>)> {
    let mut stream = engine.submit(req).expect("submit");
    common::drain(&mut stream).await.tokens
}

/// A greedy request for `prompt` on the test model.
fn greedy_text(prompt: &str, max_tokens: u32) -> GenerateRequest {
    common::greedy(MODEL, Prompt::Text(prompt.into()), max_tokens)
}

fn request(sampling: SamplingParams, max_tokens: u32) -> GenerateRequest {
    let mut r = common::greedy(
        MODEL,
        Prompt::Text("The capital of France is".into()),
        max_tokens,
    );
    r.sampling = sampling;
    r
}

#[tokio::test]
async fn top_logprobs_are_the_models_own_best_tokens_with_their_bytes() {
    let engine = engine();
    let tokenizer = tokenizer();
    let greedy = SamplingParams {
        temperature: 0.0,
        top_logprobs: 4,
        ..Default::default()
    };
    let out = tokens(&engine, request(greedy.clone(), 6)).await;
    assert_eq!(out.len(), 6);
    for (id, logprob, top) in &out {
        assert_eq!(top.len(), 4);
        // Greedy: the token taken is the best one, with the same log-probability.
        assert_eq!(top[0].id, *id);
        assert_eq!(top[0].logprob, *logprob);
        assert!(top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        assert!(top.iter().all(|t| t.logprob <= 0.0));
        let mass: f32 = top.iter().map(|t| t.logprob.exp()).sum();
        assert!(mass <= 1.0 + 1e-4, "probabilities sum to {mass}");
        for t in top {
            assert_eq!(t.bytes, tokenizer.token_bytes(t.id));
        }
    }
    // Not asked: nothing computed, nothing sent.
    let plain = tokens(
        &engine,
        request(
            SamplingParams {
                top_logprobs: 0,
                ..greedy.clone()
            },
            6,
        ),
    )
    .await;
    assert!(plain.iter().all(|(_, _, top)| top.is_empty()));
    assert_eq!(
        plain.iter().map(|t| (t.0, t.1)).collect::<Vec<_>>(),
        out.iter().map(|t| (t.0, t.1)).collect::<Vec<_>>(),
        "asking for alternatives changes nothing else"
    );
    // The first position depends on the prompt only: its log-probabilities are the raw model's, the
    // same whatever the temperature and penalties (as llama-server and vLLM report them).
    let hot = SamplingParams {
        temperature: 1.7,
        repetition_penalty: 1.8,
        presence_penalty: 1.5,
        seed: Some(3),
        ..greedy
    };
    let first = tokens(&engine, request(hot, 1)).await.remove(0);
    let (id, logprob, top) = first;
    assert_eq!(top, out[0].2);
    let listed = top.iter().find(|t| t.id == id).map(|t| t.logprob);
    if let Some(l) = listed {
        assert_eq!(l, logprob);
    }
    assert!(logprob <= top[0].logprob);
}

fn embed_request(model: &str, inputs: Vec<Prompt>) -> EmbedRequest {
    EmbedRequest {
        model: model.into(),
        inputs,
        truncate: false,
        timeout: None,
    }
}

/// Embeds the reference texts on `engine` and checks them against llama.cpp's.
async fn matches_llama_cpp(engine: &EngineHandle, model: &str, name: &str) -> Vec<Vec<f32>> {
    let want = embedding_reference(name);
    let texts = want.iter().map(|c| Prompt::Text(c.text.clone())).collect();
    let got = engine
        .embed(embed_request(model, texts))
        .await
        .expect("embed");
    let tokens: usize = want.iter().map(|c| c.tokens.len()).sum();
    assert_eq!(
        got.prompt_tokens as usize, tokens,
        "tokens as llama.cpp counts them"
    );
    assert_eq!(got.vectors.len(), want.len());
    for (case, v) in want.iter().zip(&got.vectors) {
        let (text, reference) = (&case.text, &case.embedding);
        assert_eq!(v.len(), reference.len());
        let norm: f64 = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "unit length, got {norm}");
        let c = cosine(v, reference);
        assert!(c >= 0.999, "{name} {text:?}: cosine {c} to llama.cpp's");
    }
    // Token ids in, the same vectors out.
    let ids = want
        .iter()
        .map(|c| Prompt::Tokens(c.tokens.clone()))
        .collect();
    let again = engine
        .embed(embed_request(model, ids))
        .await
        .expect("embed");
    for (a, b) in again.vectors.iter().zip(&got.vectors) {
        // Chunk boundaries may fall elsewhere (other inputs share the batches): sums round apart.
        assert!(max_diff(a, b) < 1e-5);
    }
    got.vectors
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[tokio::test]
async fn embeddings_equal_llama_cpps_mean_pooled_normalized_states() {
    let smol = engine();
    let one_stage = matches_llama_cpp(&smol, MODEL, "smollm2").await;
    // Gemma: BOS added, scaled embeddings, another head size.
    let gemma = engine_of(&gemma_path(), "gemma3", None);
    matches_llama_cpp(&gemma, "gemma3", "gemma3").await;
    // Three stages in this process pool what one does.
    let split = vec![
        LayerRange { start: 0, end: 9 },
        LayerRange { start: 9, end: 20 },
        LayerRange { start: 20, end: 30 },
    ];
    let staged = engine_of(&model_path(), MODEL, Some(split));
    let three = matches_llama_cpp(&staged, MODEL, "smollm2").await;
    for (a, b) in one_stage.iter().zip(&three) {
        assert!(
            max_diff(a, b) < 1e-5,
            "three stages differ by {}",
            max_diff(a, b)
        );
    }
}

#[tokio::test]
async fn embeddings_keep_no_kv_leave_the_prefix_cache_alone_and_change_no_decode() {
    let engine = engine();
    let chat = |max| {
        greedy_text(
            "The capital of France is Paris. The capital of Italy is",
            max,
        )
    };
    let alone = tokens(&engine, chat(12)).await;
    wait_for(&engine, "the turn cached", |s| s.kv_tokens > 0);
    let cached = engine.stats().kv_tokens;
    // A long embedding (two prefill chunks) while the same prompt decodes beside it.
    let long = embedding_reference("smollm2").remove(4).text;
    let mut stream = engine.submit(chat(12)).expect("submit");
    let embedded = engine.embed(embed_request(MODEL, vec![Prompt::Text(long)]));
    let (embedded, beside) = tokio::join!(embedded, async {
        let mut out = Vec::new();
        while let Some(Event::Token { id, .. }) = stream.next().await {
            out.push(id);
        }
        out
    });
    assert_eq!(embedded.expect("embed").prompt_tokens, 471);
    assert_eq!(
        beside,
        alone.iter().map(|t| t.0).collect::<Vec<_>>(),
        "decoding beside an embedding changes nothing"
    );
    wait_for(&engine, "every sequence ended, no KV left behind", |s| {
        s.active_sequences == 0 && s.stage_sequences == 0
    });
    let stats = engine.stats();
    assert!(
        stats.kv_tokens <= cached + 24,
        "the embedding was not cached ({} tokens held, {cached} before)",
        stats.kv_tokens
    );
    // The chat turn is still cached: the same prompt reuses it.
    let mut stream = engine.submit(chat(1)).expect("submit");
    let cached_tokens = loop {
        match stream.next().await {
            Some(Event::Done { usage, .. }) => break usage.cached_tokens,
            Some(Event::Token { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(cached_tokens > 0, "the prefix cache still serves the turn");
}

#[tokio::test]
async fn embedding_errors_are_clear_and_an_empty_list_is_empty() {
    let engine = engine();
    let none = engine
        .embed(embed_request(MODEL, vec![]))
        .await
        .expect("embed");
    assert!(none.vectors.is_empty() && none.prompt_tokens == 0);
    let bad = engine
        .embed(embed_request(
            MODEL,
            vec![Prompt::Tokens(vec![1, 10_000_000])],
        ))
        .await;
    assert!(
        matches!(bad, Err(EngineError::InvalidParam { param: "input", .. })),
        "{bad:?}"
    );
    let empty = engine
        .embed(embed_request(MODEL, vec![Prompt::Tokens(vec![])]))
        .await;
    assert_eq!(empty, Err(EngineError::EmptyPrompt));
    let too_long = vec![Prompt::Tokens(vec![28; 8193])];
    let refused = engine.embed(embed_request(MODEL, too_long)).await;
    assert!(
        matches!(refused, Err(EngineError::PromptTooLong { .. })),
        "{refused:?}"
    );
    let other = engine.embed(embed_request("other", vec![])).await;
    assert!(matches!(other, Err(EngineError::ModelNotFound { .. })));
}

/// A stream's tokens and final usage (panics on anything but `Done`).
async fn choice(stream: &mut RequestStream) -> (Vec<u32>, FinishReason, Usage) {
    let d = common::drain(stream).await;
    (d.ids(), d.finish, d.usage)
}

async fn choices(streams: &mut [RequestStream]) -> Vec<(Vec<u32>, FinishReason, Usage)> {
    let mut out = Vec::new();
    for s in streams.iter_mut() {
        out.push(choice(s).await);
    }
    out
}

#[tokio::test]
async fn n_choices_prefill_the_prompt_once_and_each_draws_its_own() {
    let engine = engine();
    let prompt = "Once upon a time, in a small village by the sea,";
    let req = |sampling: SamplingParams, max| {
        let mut r = common::greedy(MODEL, Prompt::Text(prompt.into()), max);
        r.sampling = sampling;
        r
    };
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let alone = tokens(&engine, req(greedy.clone(), 8)).await;
    let alone: Vec<u32> = alone.iter().map(|t| t.0).collect();
    // A prompt nothing is cached of: its three choices share one prefill.
    let fresh = "A completely different opening line about mountains and rivers, then";
    let before = engine.stats().prefilled_tokens;
    let mut r = req(greedy.clone(), 8);
    r.prompt = Prompt::Text(fresh.into());
    let mut streams = engine.submit_n(r, 3).expect("submit_n");
    assert_eq!(streams.len(), 3);
    let id = streams[0].id();
    assert!(streams.iter().all(|s| s.id() == id), "one request id");
    let out = choices(&mut streams).await;
    let p = out[0].2.prompt_tokens as u64;
    assert!(out.iter().all(|c| c.0 == out[0].0), "greedy choices agree");
    assert!(out.iter().all(|c| c.2.prompt_tokens as u64 == p));
    for c in &out[1..] {
        assert_eq!(
            c.2.cached_tokens as u64,
            p - 1,
            "a later choice copies the prompt's KV"
        );
    }
    wait_for(&engine, "the counters", |s| s.active_sequences == 0);
    assert_eq!(
        engine.stats().prefilled_tokens - before,
        p + 2,
        "the prompt is computed once, and each other choice runs only its last token"
    );
    // Greedy n choices of the first prompt equal it alone.
    let mut streams = engine
        .submit_n(req(greedy.clone(), 8), 2)
        .expect("submit_n");
    for c in choices(&mut streams).await {
        assert_eq!(c.0, alone);
    }
    // Sampled with a seed: choice 0 is what n=1 draws with that seed, the others draw their own, and
    // the same request draws the same choices again.
    let hot = SamplingParams {
        temperature: 1.0,
        seed: Some(42),
        ..Default::default()
    };
    let one: Vec<u32> = tokens(&engine, req(hot.clone(), 16))
        .await
        .iter()
        .map(|t| t.0)
        .collect();
    let mut streams = engine.submit_n(req(hot.clone(), 16), 4).expect("submit_n");
    let first: Vec<Vec<u32>> = choices(&mut streams)
        .await
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(first[0], one, "choice 0 keeps the seed");
    for i in 1..4 {
        for j in 0..i {
            assert_ne!(first[i], first[j], "choices {i} and {j} drew alike");
        }
    }
    let mut streams = engine.submit_n(req(hot, 16), 4).expect("submit_n");
    let again: Vec<Vec<u32>> = choices(&mut streams)
        .await
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(again, first, "seeded choices are reproducible");
    for n in [0, 17] {
        let r = engine.submit_n(req(greedy.clone(), 4), n);
        assert!(
            matches!(r, Err(EngineError::InvalidParam { param: "n", .. })),
            "n = {n}"
        );
    }
}

#[tokio::test]
async fn cancelling_a_request_of_n_choices_stops_them_all_and_dropping_one_stops_that_one() {
    let engine = engine();
    let req = |max| greedy_text("Count from one to a hundred:", max);
    let mut streams = engine.submit_n(req(200), 3).expect("submit_n");
    // Dropping one choice's stream stops that choice only.
    let dropped = streams.remove(1);
    drop(dropped);
    let out = choices(&mut streams).await;
    assert!(
        out.iter()
            .all(|c| c.1 == FinishReason::Length && c.0.len() == 200)
    );
    // Cancelling the request id stops every choice.
    let mut streams = engine.submit_n(req(200), 3).expect("submit_n");
    assert!(matches!(streams[2].next().await, Some(Event::Token { .. })));
    assert!(engine.cancel(streams[0].id()));
    for c in choices(&mut streams).await {
        assert_eq!(c.1, FinishReason::Cancelled);
        assert!(c.0.len() < 200);
    }
    wait_for(&engine, "every choice freed", |s| {
        s.active_sequences == 0 && s.stage_sequences == 0
    });
}

#[tokio::test]
async fn n_choices_on_three_local_stages_equal_one_stage() {
    let split = vec![
        LayerRange { start: 0, end: 9 },
        LayerRange { start: 9, end: 20 },
        LayerRange { start: 20, end: 30 },
    ];
    let staged = engine_of(&model_path(), MODEL, Some(split));
    let one = engine();
    let req = || {
        let mut r = common::greedy(MODEL, Prompt::Text("The sea is".into()), 10);
        r.sampling.seed = Some(7);
        r.sampling.temperature = 0.8;
        r
    };
    let mut a = one.submit_n(req(), 3).expect("submit_n");
    let mut b = staged.submit_n(req(), 3).expect("submit_n");
    let (a, b) = (choices(&mut a).await, choices(&mut b).await);
    assert_eq!(
        a.iter().map(|c| &c.0).collect::<Vec<_>>(),
        b.iter().map(|c| &c.0).collect::<Vec<_>>()
    );
}
