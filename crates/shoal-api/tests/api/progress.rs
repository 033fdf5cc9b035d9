//! The prompt's prefill progress in OpenAI streams, on the real router and the real model: asked for
//! with `stream_options.include_progress`, each landed prefill chunk is an SSE comment
//! `: prefill {"done":N,"total":M}` before the first token, counting up to the whole prompt; without it
//! the stream has no comment, and the chunks are the same either way.

use crate::common::*;
use serde_json::{Value, json};

/// A prompt of some 1,400 tokens (the numbers' digits are tokens): several prefill chunks of the
/// engine's 256.
fn long_question() -> String {
    let mut q = String::from("Read these numbers and tell me the last one: ");
    for i in 0..300 {
        q.push_str(&format!("{i}, "));
    }
    q
}

/// The progress comments of an SSE body, in order, and how many data events came before the last one.
fn progress(body: &str) -> (Vec<(u64, u64)>, usize) {
    let mut seen = Vec::new();
    let mut data_before_last = 0;
    let mut data = 0;
    for line in body.lines() {
        if let Some(c) = line.strip_prefix(':') {
            let Some(p) = c.trim_start().strip_prefix("prefill ") else {
                continue;
            };
            let v: Value = serde_json::from_str(p).expect("progress is JSON");
            seen.push((v["done"].as_u64().unwrap(), v["total"].as_u64().unwrap()));
            data_before_last = data;
        } else if line.starts_with("data:") {
            data += 1;
        }
    }
    (seen, data_before_last)
}

/// The data payloads without what differs between two requests of one prompt (id, created, and the
/// cached tokens: the second one finds the first one's prefix).
fn chunks(body: &str) -> Vec<String> {
    sse_data(body)
        .into_iter()
        .map(|d| match serde_json::from_str::<Value>(&d) {
            Ok(mut v) => {
                if let Some(o) = v.as_object_mut() {
                    o.remove("id");
                    o.remove("created");
                    if let Some(u) = o.get_mut("usage").and_then(Value::as_object_mut) {
                        u.remove("prompt_tokens_details");
                    }
                }
                v.to_string()
            }
            Err(_) => d,
        })
        .collect()
}

#[tokio::test]
async fn a_long_prompt_streams_its_prefill_progress_when_asked_and_nothing_else_changes() {
    let ask = |options: Value| {
        chat_body(
            &long_question(),
            json!({"stream": true, "max_tokens": 8, "temperature": 0, "stream_options": options}),
        )
    };
    let with = post_json(
        "/v1/chat/completions",
        &ask(json!({"include_usage": true, "include_progress": true})),
    )
    .await;
    assert_eq!(with.status, 200, "{}", with.body);
    let (seen, data_before_last) = progress(&with.body);
    let usage = with
        .sse_data()
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["usage"].is_object())
        .expect("a usage chunk")["usage"]
        .clone();
    let total = usage["prompt_tokens"].as_u64().unwrap();
    assert!(total > 512, "the prompt spans three chunks: {total}");
    assert!(seen.len() >= 3, "one comment per chunk: {seen:?}");
    assert!(seen.iter().all(|&(_, t)| t == total), "{seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "counting up: {seen:?}"
    );
    assert_eq!(
        seen.last().map(|p| p.0),
        Some(total),
        "ends at the whole prompt"
    );
    assert!(
        data_before_last <= 1,
        "progress comes before any token (the role chunk may open the stream): {data_before_last}"
    );

    let without = post_json("/v1/chat/completions", &ask(json!({"include_usage": true}))).await;
    assert_eq!(without.status, 200, "{}", without.body);
    assert!(
        !without.body.lines().any(|l| l.starts_with(':')),
        "no comment unless asked: {}",
        without.body
    );
    assert_eq!(chunks(&with.body), chunks(&without.body));
}
