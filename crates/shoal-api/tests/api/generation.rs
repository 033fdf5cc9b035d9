//! Generation through the OpenAI routes on the real engine and model: response shapes, usage, greedy
//! determinism, SSE framing, stop sequences, the golden chat prompt.

use crate::common::{self, *};
use axum::http::StatusCode;
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

async fn ok_json(uri: &str, body: &Value) -> Value {
    let reply = post_json(uri, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string()
}

#[tokio::test]
async fn chat_non_stream_max_tokens_5() {
    let body = chat_body(
        "Tell me a long story about a dragon.",
        json!({"max_tokens": 5, "temperature": 0}),
    );
    let v = ok_json(CHAT, &body).await;
    assert_eq!(v["object"], "chat.completion");
    assert!(
        v["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-")),
        "{v}"
    );
    assert!(v["created"].as_u64().is_some_and(|t| t > 1_600_000_000));
    assert_eq!(v["model"], MODEL_ID);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "length");
    assert!(!content(&v).is_empty());
    let usage = &v["usage"];
    assert_eq!(usage["completion_tokens"], 5);
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(prompt > 10, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt + 5));
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"].is_u64(),
        "{usage}"
    );
}

#[tokio::test]
async fn greedy_is_deterministic() {
    let body = chat_body(
        "Name three colors.",
        json!({"max_tokens": 12, "temperature": 0}),
    );
    let a = content(&ok_json(CHAT, &body).await);
    let b = content(&ok_json(CHAT, &body).await);
    assert_eq!(a, b);
    let body = json!({"model": MODEL_ID, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0});
    let a = ok_json(COMPLETIONS, &body).await;
    let b = ok_json(COMPLETIONS, &body).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
}

/// A greedy pick's probability above which no rival can be within 0.3 nats of it (two candidates that close
/// each have p < 1 / (1 + e^-0.3) ≈ 0.574): where shoal was that sure, it must agree with llama.cpp.
const NEAR_TIE_MAX_P: f64 = 0.6;

/// The chat path renders llama.cpp's prompt exactly and generates its greedy answer — up to the first near
/// tie. Kernels that round differently (AVX2 vs AVX-512, llama.cpp's own builds) may flip a token where two
/// candidates are within a hair: on this prompt llama.cpp itself has " Mar" at -2.638 and " Cit" at -2.743
/// after "L'Étoile, la" (and "L" vs "The" 0.095 nats apart at the first token). A divergence is accepted
/// only at a token shoal itself was unsure of (p < 0.6), never where it was confident, and never before the
/// answer's first two words ("L'Étoile, la"), which every build has given.
#[tokio::test]
async fn golden_chat_prompt_matches_llama_cpp() {
    let golden = golden_chat();
    let case = golden
        .as_array()
        .and_then(|cases| {
            cases
                .iter()
                .find(|c| c["messages"][0]["content"] == "What is the capital of France?")
        })
        .expect("golden case");
    let expected = case["completion_text"].as_str().expect("completion_text");
    let body = json!({"model": MODEL_ID, "messages": case["messages"], "max_tokens": 16,
                      "temperature": 0, "logprobs": true});
    let v = ok_json(CHAT, &body).await;
    assert_eq!(
        v["usage"]["prompt_tokens"], case["usage"]["prompt_tokens"],
        "chat template or tokenizer differ"
    );
    let tokens = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content");
    let got = content(&v);
    assert!(!tokens.is_empty(), "no tokens generated");
    let mut offset = 0;
    let mut agreed = 0;
    for t in tokens {
        let text = t["token"].as_str().expect("token text");
        if expected[offset..].starts_with(text) {
            offset += text.len();
            agreed += 1;
            continue;
        }
        let p = t["logprob"].as_f64().expect("logprob").exp();
        assert!(
            p < NEAR_TIE_MAX_P,
            "shoal was sure of {text:?} (p = {p:.3}) after {:?}, llama.cpp went on {:?}",
            &expected[..offset],
            &expected[offset..]
        );
        break;
    }
    // The old check up to the measured near tie: llama.cpp's first two words, exactly.
    let first_words: String = expected.split(' ').take(2).collect::<Vec<_>>().join(" ");
    assert!(
        got.starts_with(&expected[..offset]) && got.starts_with(&first_words),
        "got {got:?}, golden {expected:?}"
    );
    eprintln!(
        "agreed with llama.cpp for {agreed} of {} tokens: {got:?}",
        tokens.len()
    );
}

#[tokio::test]
async fn chat_stream_framing_and_usage() {
    let body = chat_body(
        "Name three colors.",
        json!({"max_tokens": 10, "temperature": 0}),
    );
    let expected = content(&ok_json(CHAT, &body).await);

    let mut streamed = body.clone();
    merge(
        &mut streamed,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let chunks = common::chunks(&post_json(CHAT, &streamed).await);
    let first = &chunks[0];
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let id = first["id"].as_str().expect("id");
    assert!(id.starts_with("chatcmpl-"));
    assert!(
        chunks
            .iter()
            .all(|c| c["id"] == id && c["model"] == MODEL_ID)
    );

    let usage_chunk = chunks.last().expect("usage chunk");
    assert_eq!(
        usage_chunk["choices"].as_array().map(Vec::len),
        Some(0),
        "{usage_chunk}"
    );
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 10);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let finishes = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_string())
        .count();
    assert_eq!(finishes, 1);

    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect::<Vec<_>>()
        .concat();
    assert_eq!(text, expected, "stream and non-stream greedy differ");

    // Without include_usage there is no usage chunk.
    let mut plain = body.clone();
    merge(&mut plain, json!({"stream": true}));
    let chunks = common::chunks(&post_json(CHAT, &plain).await);
    assert!(
        chunks
            .iter()
            .all(|c| c.get("usage").is_none_or(Value::is_null))
    );
    assert_eq!(
        chunks
            .last()
            .map(|c| c["choices"][0]["finish_reason"].clone()),
        Some(json!("length"))
    );
}

#[tokio::test]
async fn stop_sequence_never_appears() {
    let base = chat_body(
        "Name three colors.",
        json!({"max_tokens": 24, "temperature": 0}),
    );
    let full = content(&ok_json(CHAT, &base).await);
    // A word from the middle of the greedy output becomes the stop sequence.
    let words: Vec<&str> = full.split_whitespace().filter(|w| w.len() >= 3).collect();
    assert!(
        words.len() >= 3,
        "output too short to pick a stop word: {full:?}"
    );
    let stop = words[words.len() / 2].to_string();
    let cut = full.find(&stop).expect("stop word in output");

    let mut body = base.clone();
    merge(&mut body, json!({"stop": [stop.clone(), "\u{0}never"]}));
    let v = ok_json(CHAT, &body).await;
    let got = content(&v);
    assert!(!got.contains(&stop), "stop {stop:?} emitted in {got:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        got,
        full[..cut],
        "output must be the greedy text up to the stop sequence"
    );

    merge(&mut body, json!({"stream": true, "stop": stop.clone()}));
    let chunks = common::chunks(&post_json(CHAT, &body).await);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect::<Vec<_>>()
        .concat();
    assert!(!text.contains(&stop), "stop {stop:?} streamed in {text:?}");
    assert_eq!(text, full[..cut]);
}

#[tokio::test]
async fn content_parts_are_concatenated() {
    let parts =
        json!([{"type": "text", "text": "Name three "}, {"type": "text", "text": "colors."}]);
    let body = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": parts}],
                      "max_tokens": 6, "temperature": 0});
    let with_parts = ok_json(CHAT, &body).await;
    let plain = ok_json(
        CHAT,
        &chat_body(
            "Name three colors.",
            json!({"max_tokens": 6, "temperature": 0}),
        ),
    )
    .await;
    assert_eq!(content(&with_parts), content(&plain));
    assert_eq!(
        with_parts["usage"]["prompt_tokens"],
        plain["usage"]["prompt_tokens"]
    );
}

#[tokio::test]
async fn completions_non_stream_and_stream() {
    let body = json!({"model": MODEL_ID, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
    let v = ok_json(COMPLETIONS, &body).await;
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    let text = v["choices"][0]["text"].as_str().expect("text").to_string();
    assert!(text.starts_with(" Paris"), "{text:?}");

    // A single-element array and the token ids of the same prompt give the same output.
    let ids = json!([504, 3575, 282, 4649, 314]);
    for prompt in [
        json!(["The capital of France is"]),
        ids.clone(),
        json!([ids]),
    ] {
        let mut b = body.clone();
        merge(&mut b, json!({"prompt": prompt}));
        assert_eq!(
            ok_json(COMPLETIONS, &b).await["choices"][0]["text"],
            text.as_str()
        );
    }

    let mut streamed = body.clone();
    merge(
        &mut streamed,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let chunks = common::chunks(&post_json(COMPLETIONS, &streamed).await);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect::<Vec<_>>()
        .concat();
    assert_eq!(joined, text);
    assert_eq!(
        chunks
            .last()
            .map(|c| c["usage"]["completion_tokens"].clone()),
        Some(json!(6))
    );
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test]
async fn logprobs_of_sampled_tokens() {
    let body = chat_body(
        "Name three colors.",
        json!({"max_tokens": 4, "temperature": 0, "logprobs": true}),
    );
    let v = ok_json(CHAT, &body).await;
    let entries = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content")
        .clone();
    assert_eq!(entries.len(), 4);
    assert!(
        entries
            .iter()
            .all(|e| e["logprob"].as_f64().is_some_and(|l| l <= 0.0))
    );
    let joined: String = entries
        .iter()
        .filter_map(|e| e["token"].as_str())
        .collect::<Vec<_>>()
        .concat();
    assert_eq!(joined, content(&v));

    let body = json!({"model": MODEL_ID, "prompt": "The capital of France is", "max_tokens": 3,
                      "temperature": 0, "logprobs": 0});
    let v = ok_json(COMPLETIONS, &body).await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(3));
    assert_eq!(lp["text_offset"][0], 0);
}

#[tokio::test]
async fn model_defaults_to_the_only_one_served() {
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let v = ok_json(CHAT, &body).await;
    assert_eq!(v["model"], MODEL_ID);
}

#[tokio::test]
async fn models_and_health() {
    let v = get("/v1/models").await.json();
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().expect("data");
    assert!(
        data.iter()
            .any(|m| m["id"] == MODEL_ID && m["object"] == "model" && m["owned_by"].is_string())
    );
    let one = get(&format!("/v1/models/{MODEL_ID}")).await;
    assert_eq!(one.status, StatusCode::OK);
    assert_eq!(one.json()["id"], MODEL_ID);
    let health = get("/health").await;
    assert_eq!(health.json(), json!({"status": "ok"}));
}
