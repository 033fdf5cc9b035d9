//! `POST /v1/embeddings` through the router on the real model: llama.cpp's vectors (the engine's
//! fixture), every input shape, both encodings, usage, and errors naming their parameter.

use crate::common::{self, MODEL_ID, assert_error, post_json};
use serde_json::{Value, json};
use shoal_testkit::fixtures::{cosine, embedding_reference};

fn vectors(reply: &Value) -> Vec<Vec<f32>> {
    reply["data"]
        .as_array()
        .expect("data")
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            let e = &d["embedding"];
            match e.as_str() {
                Some(b64) => decode_f32(b64),
                None => e
                    .as_array()
                    .expect("floats")
                    .iter()
                    .map(|x| x.as_f64().expect("number") as f32)
                    .collect(),
            }
        })
        .collect()
}

/// Little-endian f32s from standard base64.
fn decode_f32(b64: &str) -> Vec<f32> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut bytes = Vec::new();
    for quad in b64.as_bytes().chunks(4) {
        let data: Vec<u8> = quad
            .iter()
            .copied()
            .filter(|&c| c != b'=')
            .map(value)
            .collect();
        let n = data.iter().fold(0u32, |n, &v| (n << 6) | u32::from(v)) << (6 * (4 - data.len()));
        bytes.extend(&n.to_be_bytes()[1..data.len()]);
    }
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[tokio::test]
async fn every_input_shape_gives_llama_cpps_vectors_as_floats_or_base64() {
    // The short inputs (the long one is the engine tests' business).
    let want = &embedding_reference("smollm2")[..4];
    let texts: Vec<&str> = want.iter().map(|c| c.text.as_str()).collect();
    let tokens: usize = want.iter().map(|c| c.tokens.len()).sum();
    let reply = post_json(
        "/v1/embeddings",
        &json!({"model": MODEL_ID, "input": texts}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], MODEL_ID);
    assert_eq!(body["usage"]["prompt_tokens"], tokens);
    assert_eq!(body["usage"]["total_tokens"], tokens);
    let floats = vectors(&body);
    assert_eq!(floats.len(), want.len());
    for (v, case) in floats.iter().zip(want) {
        assert_eq!(v.len(), 576);
        let c = cosine(v, &case.embedding);
        assert!(c >= 0.999, "{:?}: cosine {c}", case.text);
    }
    // base64: the same floats (another request: batches, hence sums, may round apart).
    let reply = post_json(
        "/v1/embeddings",
        &json!({"model": MODEL_ID, "input": texts, "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.json()["data"][0]["embedding"].is_string());
    for (a, b) in vectors(&reply.json()).iter().zip(&floats) {
        assert!(a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5));
    }
    // One string; one token list; a list of token lists.
    let one = post_json(
        "/v1/embeddings",
        &json!({"model": MODEL_ID, "input": texts[0]}),
    )
    .await;
    let one = vectors(&one.json());
    assert_eq!(one.len(), 1);
    let ids: Vec<&Vec<u32>> = want.iter().map(|c| &c.tokens).collect();
    let by_ids = post_json(
        "/v1/embeddings",
        &json!({"model": MODEL_ID, "input": ids[0]}),
    )
    .await;
    let batches = post_json("/v1/embeddings", &json!({"model": MODEL_ID, "input": ids})).await;
    assert_eq!(batches.json()["usage"]["prompt_tokens"], tokens);
    for (a, b) in [
        (&one[0], &vectors(&by_ids.json())[0]),
        (&floats[1], &vectors(&batches.json())[1]),
    ] {
        assert!(cosine(a, b) > 0.99999);
    }
}

#[tokio::test]
async fn bad_embedding_requests_name_their_parameter() {
    let body = |extra: Value| {
        let mut b = json!({"model": MODEL_ID, "input": "hello"});
        common::merge(&mut b, extra);
        b
    };
    let cases = [
        (json!({"dimensions": 256}), "dimensions"),
        (json!({"encoding_format": "int8"}), "encoding_format"),
        (json!({"input": ""}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": ["a", ""]}), "input"),
        (json!({"input": [[1, 2], []]}), "input"),
        (json!({"input": 5}), "input"),
        (json!({"input": [49152]}), "input"),
        (json!({"input": vec![28; 8193]}), "input"),
    ];
    for (extra, param) in cases {
        let reply = post_json("/v1/embeddings", &body(extra.clone())).await;
        assert_error(&reply, 400, Some(param));
    }
    let reply = post_json("/v1/embeddings", &body(json!({"model": "nope"}))).await;
    assert_eq!(reply.status, 404, "{}", reply.body);
}
