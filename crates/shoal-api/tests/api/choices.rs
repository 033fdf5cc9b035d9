//! Several choices (`n`) and log-probabilities (`logprobs`, `top_logprobs`) on chat and completions,
//! whole and streamed, through the router on the real model.

use crate::common::{self, MODEL_ID, assert_error, chat_body, post_json, sse_data};
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

async fn ok_json(uri: &str, body: &Value) -> Value {
    let reply = post_json(uri, body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()
}

/// The JSON chunks of a stream, `[DONE]` checked and dropped.
async fn chunks(uri: &str, body: &Value) -> Vec<Value> {
    let reply = post_json(uri, body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let data = sse_data(&reply.body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk json"))
        .collect()
}

#[tokio::test]
async fn n_chat_choices_whole_and_streamed_count_the_prompt_once() {
    let greedy = json!({"max_tokens": 6, "temperature": 0});
    let one = ok_json(CHAT, &chat_body("Name three colors.", greedy.clone())).await;
    let mut body = chat_body("Name three colors.", greedy);
    common::merge(&mut body, json!({"n": 3}));
    let three = ok_json(CHAT, &body).await;
    let choices = three["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(
            c["message"], one["choices"][0]["message"],
            "greedy choices agree"
        );
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(
        three["usage"]["prompt_tokens"],
        one["usage"]["prompt_tokens"]
    );
    assert_eq!(three["usage"]["completion_tokens"], 18);
    // Streamed: every index opens with the role, carries the same text, ends once; one usage chunk.
    common::merge(
        &mut body,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let chunks = chunks(CHAT, &body).await;
    let mut text = vec![String::new(); 3];
    let (mut roles, mut ends) = (vec![0; 3], vec![0; 3]);
    for c in &chunks {
        assert_eq!(c["id"], chunks[0]["id"], "one id for every chunk");
        for ch in c["choices"].as_array().expect("choices") {
            let i = ch["index"].as_u64().expect("index") as usize;
            roles[i] += usize::from(ch["delta"]["role"] == "assistant");
            ends[i] += usize::from(ch["finish_reason"].is_string());
            text[i] += ch["delta"]["content"].as_str().unwrap_or("");
        }
    }
    assert_eq!((roles, ends), (vec![1; 3], vec![1; 3]));
    let want = one["choices"][0]["message"]["content"]
        .as_str()
        .expect("text");
    assert!(text.iter().all(|t| t == want), "{text:?}");
    let usage = &chunks.last().expect("usage chunk")["usage"];
    assert_eq!(usage["completion_tokens"], 18);
    assert_eq!(usage["prompt_tokens"], one["usage"]["prompt_tokens"]);
}

#[tokio::test]
async fn seeded_completion_choices_differ_and_come_back_the_same() {
    let body = json!({"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 12,
                      "temperature": 1.0, "seed": 5, "n": 3});
    let a = ok_json(COMPLETIONS, &body).await;
    let b = ok_json(COMPLETIONS, &body).await;
    let texts = |v: &Value| -> Vec<String> {
        let choices = v["choices"].as_array().expect("choices");
        choices
            .iter()
            .map(|c| c["text"].as_str().expect("text").to_string())
            .collect()
    };
    assert_eq!(texts(&a), texts(&b));
    let t = texts(&a);
    assert!(t[0] != t[1] && t[1] != t[2] && t[0] != t[2], "{t:?}");
    assert_eq!(a["usage"]["completion_tokens"], 36);
    // Choice 0 is what n = 1 draws with the same seed.
    let mut single = body.clone();
    single["n"] = json!(1);
    assert_eq!(texts(&ok_json(COMPLETIONS, &single).await)[0], t[0]);
}

#[tokio::test]
async fn chat_top_logprobs_are_the_best_tokens_with_bytes_whole_and_streamed() {
    let mut body = chat_body(
        "Name three colors.",
        json!({"max_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 3}),
    );
    let v = ok_json(CHAT, &body).await;
    let entries = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content")
        .clone();
    assert_eq!(entries.len(), 5);
    for e in &entries {
        let top = e["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 3);
        // Greedy: the token taken is the most likely one.
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(
            top.windows(2)
                .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64())
        );
        for t in top {
            let bytes: Vec<u8> = t["bytes"]
                .as_array()
                .expect("bytes")
                .iter()
                .map(|b| b.as_u64().expect("byte") as u8)
                .collect();
            assert_eq!(
                String::from_utf8_lossy(&bytes),
                t["token"].as_str().expect("token")
            );
        }
    }
    common::merge(&mut body, json!({"stream": true}));
    let streamed: Vec<Value> = chunks(CHAT, &body)
        .await
        .iter()
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        streamed, entries,
        "the stream reports the same log-probabilities"
    );
}

#[tokio::test]
async fn completion_logprobs_k_give_a_dict_per_token_with_the_sampled_one() {
    let mut body = json!({"model": MODEL_ID, "prompt": "The capital of France is", "max_tokens": 4,
                          "temperature": 0, "logprobs": 2});
    let v = ok_json(COMPLETIONS, &body).await;
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().expect("tokens");
    let tops = lp["top_logprobs"].as_array().expect("top_logprobs");
    assert_eq!((tokens.len(), tops.len()), (4, 4));
    let mut offset = 0;
    for (i, (t, top)) in tokens.iter().zip(tops).enumerate() {
        assert_eq!(lp["text_offset"][i], offset);
        offset += t.as_str().expect("token").len();
        let top = top.as_object().expect("dict");
        assert!((2..=3).contains(&top.len()), "{top:?}");
        let best = top
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::MIN, f64::max);
        // Greedy: the sampled token is the best, and it is in the dict.
        assert_eq!(lp["token_logprobs"][i].as_f64(), Some(best));
    }
    body["stream"] = json!(true);
    let streamed: Vec<Value> = chunks(COMPLETIONS, &body)
        .await
        .iter()
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["top_logprobs"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(&streamed, tops);
}

#[tokio::test]
async fn bad_choices_and_logprobs_name_their_parameter() {
    for n in [0, 17] {
        assert_error(
            &post_json(CHAT, &chat_body("hi", json!({"n": n}))).await,
            400,
            Some("n"),
        );
    }
    let body = chat_body("hi", json!({"top_logprobs": 2}));
    assert_error(&post_json(CHAT, &body).await, 400, Some("top_logprobs"));
    let body = chat_body("hi", json!({"logprobs": true, "top_logprobs": -1}));
    assert_error(&post_json(CHAT, &body).await, 400, Some("top_logprobs"));
    let body = json!({"model": MODEL_ID, "prompt": "hi", "logprobs": -1});
    assert_error(&post_json(COMPLETIONS, &body).await, 400, Some("logprobs"));
    let body = json!({"model": MODEL_ID, "prompt": "hi", "n": 20});
    assert_error(&post_json(COMPLETIONS, &body).await, 400, Some("n"));
}
