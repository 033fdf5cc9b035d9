//! What the engine reports on the real model besides the tokens: the most likely alternatives of each
//! token (`top_logprobs`).

use shoal_engine::engine::{EngineConfig, spawn_from_gguf};
use shoal_engine::{EngineHandle, Event, GenerateRequest, Prompt, SamplingParams, TopLogprob};
use shoal_model::gguf::GgufFile;
use shoal_model::tokenizer::Tokenizer;
use shoal_testkit::fixtures::model_path;

#[allow(dead_code)]
mod common;
use common::PATIENCE;

const MODEL: &str = "smollm2-135m-instruct-q4_1";

fn engine() -> EngineHandle {
    let config = EngineConfig {
        threads: 1,
        ..Default::default()
    };
    spawn_from_gguf(&model_path(), MODEL, config).expect("engine")
}

fn tokenizer() -> Tokenizer {
    let gguf = GgufFile::open(&model_path()).expect("gguf");
    Tokenizer::from_gguf(gguf.content()).expect("tokenizer")
}

/// Each token's id, logprob and alternatives.
async fn tokens(engine: &EngineHandle, req: GenerateRequest) -> Vec<(u32, f32, Vec<TopLogprob>)> {
    let mut stream = engine.submit(req).expect("submit");
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("engine stalled")
        {
            Some(Event::Token {
                id,
                logprob,
                top_logprobs,
                ..
            }) => out.push((id, logprob, top_logprobs)),
            Some(Event::Done { .. }) => return out,
            other => panic!("unexpected {other:?}"),
        }
    }
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
