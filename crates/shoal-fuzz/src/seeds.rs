//! Starting inputs for each target: valid examples made with shoal's own encoders (frames, handshakes,
//! tokens, requests), from which the fuzzers mutate. `scripts/fuzz` writes them into the corpus before a
//! run (`fuzz-seeds`); the GGUF target's seeds are tiny files the script writes with the `gguf` package.

use shoal_cluster::invite::{EnrollReply, EnrollRequest, InviteToken};
use shoal_wire::{
    Activations, ChunkHeader, DType, Frame, Handshake, Inputs, Pool, PrefixAction, PrefixOp, Role,
    SampleJob, SamplingParams, TokenItem,
};

/// The seeds of `target` (empty for `gguf` and unknown names).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "frame" => frames(),
        "handshake" => handshakes(),
        "tokenizer" => texts(),
        "chat_template" => conversations(),
        "invite" => invites(),
        "api" => requests(),
        _ => Vec::new(),
    }
}

/// Joins pieces the way [`crate::pieces`] cuts them.
pub fn join(pieces: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        let p = &p[..p.len().min(255)];
        out.push(p.len() as u8);
        out.extend_from_slice(p);
    }
    out
}

fn frames() -> Vec<Vec<u8>> {
    let chunk = |seq_id, len| ChunkHeader {
        seq_id,
        start_pos: 3,
        len,
        want_logits: true,
        pool: Pool::None,
        drafted: 0,
    };
    let all = [
        Frame::Activations(
            Activations::from_f32(7, vec![chunk(1, 2), chunk(2, 1)], 4, &[0.5; 12], DType::F16)
                .expect("activations"),
        ),
        Frame::Tokens {
            batch_id: 7,
            items: vec![TokenItem {
                seq_id: 1,
                token: 42,
                logprob: -0.25,
                top: vec![(42, -0.25), (7, -2.0)],
            }],
        },
        Frame::Release {
            seq_ids: vec![1, 2],
        },
        Frame::Ping { nonce: 9 },
        Frame::Error {
            code: 3,
            message: "stage lost".into(),
        },
        Frame::Sample {
            batch_id: 7,
            jobs: vec![SampleJob {
                seq_id: 1,
                params: SamplingParams::default(),
                rng_state: 5,
                history: vec![1, 2, 3],
                counts: vec![(2, 1)],
                mask: vec![u32::MAX, 1],
                draft: vec![],
                draft_masks: vec![],
            }],
        },
        Frame::Prefix(PrefixOp {
            action: PrefixAction::Fork,
            seq_id: 1,
            prefix_id: 2,
            len: 3,
        }),
        Frame::Lane {
            port: 4000,
            token: [7; 32],
        },
        Frame::Inputs(Inputs {
            batch_id: 6,
            chunks: vec![ChunkHeader {
                seq_id: 2,
                start_pos: 5,
                len: 2,
                want_logits: true,
                pool: Pool::None,
                drafted: 0,
            }],
            tokens: vec![11, 151_000],
        }),
    ];
    let mut out: Vec<Vec<u8>> = all
        .iter()
        .map(|f| {
            // A first byte (the maximum's pick), then the frame as one piece.
            let bytes = f.encode().expect("a seed frame encodes");
            let mut v = vec![1u8];
            for c in bytes.chunks(255) {
                v.push(c.len() as u8);
                v.extend_from_slice(c);
            }
            v
        })
        .collect();
    // Two frames back to back, cut in small pieces.
    let mut two = Frame::Ping { nonce: 1 }.encode().expect("ping");
    two.extend(
        Frame::Release { seq_ids: vec![4] }
            .encode()
            .expect("release"),
    );
    let mut v = vec![0u8];
    for c in two.chunks(5) {
        v.push(c.len() as u8);
        v.extend_from_slice(c);
    }
    out.push(v);
    out
}

fn handshakes() -> Vec<Vec<u8>> {
    let stage = Role::Stage {
        instance_id: 11,
        stage_index: 1,
        layer_start: 4,
        layer_end: 8,
    };
    let owner = Role::Owner { instance_id: 11 };
    let member = Role::Member {
        instance_id: 11,
        stage_index: 0,
        rank: 0,
        to: 1,
    };
    [stage, owner, member]
        .into_iter()
        .map(|role| {
            let mut bytes = Handshake::new([1; 32], [2; 32], role).encode();
            bytes.extend(Frame::Ping { nonce: 1 }.encode().expect("ping"));
            bytes
        })
        .collect()
}

fn texts() -> Vec<Vec<u8>> {
    let texts = [
        "Hello world! The quick brown fox jumps over the lazy dog.",
        "  Numbers: 3.14159, 2024;   café, naïve, 日本語 — done.\n\tTabbed\n\n",
        "<|im_start|>user\nWhat's 7*8?<|im_end|>\n<|im_start|>assistant\n",
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
        "<s> Hello</s> again <unk> [INST] x [/INST]",
        "emoji 🦀🐟 and \u{0}\u{7f}\u{feff} zero-width\u{200b}joiner",
    ];
    let mut out = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        for flags in [0u8, 0x80] {
            let mut v = vec![i as u8 | flags];
            v.extend_from_slice(t.as_bytes());
            out.push(v);
        }
    }
    out
}

fn conversations() -> Vec<Vec<u8>> {
    let tool = br#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}"#;
    let mut out = Vec::new();
    for fam in 0..8u8 {
        out.push(join(&[
            &[fam * 2],
            &[0],
            b"You are {{ raise_exception('x') }} helpful.",
            &[1],
            b"Hi {% if true %}there{% endif %} <|im_end|>",
            &[2 | 0x40],
            b"",
            b"get_weather",
            br#"{"city": "Paris"}"#,
            &[3 | 0x20],
            b"sunny",
            &[1],
            tool,
        ]));
        out.push(join(&[
            &[fam * 2 + 1],
            &[5, b'r', b'o', b'b', b'o', b't'],
            b"who?",
            &[2],
            b"",
        ]));
    }
    out
}

fn invites() -> Vec<Vec<u8>> {
    let token = InviteToken {
        id: "a1b2c3".into(),
        secret: [9; 32],
        urls: vec!["http://127.0.0.1:8080".into(), "http://[::1]:8080".into()],
    };
    let request: EnrollRequest = token.request("12D3KooWnode");
    let reply = EnrollReply {
        nonce: "00".repeat(12),
        sealed: "ab".repeat(40),
        addrs: vec!["/ip4/127.0.0.1/tcp/4001".into()],
    };
    let request = serde_json::to_vec(&request).expect("json");
    let reply = serde_json::to_vec(&reply).expect("json");
    let book =
        br#"[{"id": "a1b2c3", "secret": "00", "created": 1, "expires": null, "uses_left": 2}]"#;
    vec![join(&[
        token.encode().as_bytes(),
        &request,
        &reply,
        b"12D3KooWnode",
        book,
    ])]
}

fn requests() -> Vec<Vec<u8>> {
    let m = crate::api::MODEL;
    let bodies: Vec<(&str, String)> = vec![
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model": "{m}", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 4}}"#
            ),
        ),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model": "{m}", "messages": [{{"role": "system", "content": "s"}}, {{"role": "user", "content": [{{"type": "text", "text": "hi"}}]}}], "max_tokens": 3, "stream": true, "stream_options": {{"include_usage": true}}, "temperature": 0.7, "top_p": 0.9, "seed": 1, "stop": ["x"], "logprobs": true, "top_logprobs": 2}}"#
            ),
        ),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model": "{m}", "messages": [{{"role": "user", "content": "w"}}], "max_tokens": 8, "tools": [{{"type": "function", "function": {{"name": "f", "parameters": {{"type": "object", "properties": {{"a": {{"type": "integer"}}}}, "required": ["a"]}}}}}}], "tool_choice": "required"}}"#
            ),
        ),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model": "{m}", "messages": [{{"role": "user", "content": "j"}}], "max_tokens": 6, "response_format": {{"type": "json_schema", "json_schema": {{"name": "x", "schema": {{"type": "object", "properties": {{"b": {{"type": "boolean"}}}}}}}}}}}}"#
            ),
        ),
        (
            "/v1/completions",
            format!(r#"{{"model": "{m}", "prompt": "Once", "max_tokens": 3, "n": 2}}"#),
        ),
        (
            "/v1/responses",
            format!(
                r#"{{"model": "{m}", "input": "hi", "max_output_tokens": 3, "instructions": "be brief"}}"#
            ),
        ),
        (
            "/v1/embeddings",
            format!(r#"{{"model": "{m}", "input": ["a", "b"]}}"#),
        ),
        (
            "/v1/messages",
            format!(
                r#"{{"model": "{m}", "max_tokens": 3, "system": "s", "messages": [{{"role": "user", "content": "hi"}}, {{"role": "assistant", "content": "Sure"}}]}}"#
            ),
        ),
        (
            "/v1/messages",
            format!(
                r#"{{"model": "{m}", "max_tokens": 4, "stream": true, "messages": [{{"role": "user", "content": [{{"type": "text", "text": "hi"}}]}}], "tools": [{{"name": "t", "input_schema": {{"type": "object"}}}}], "tool_choice": {{"type": "any"}}}}"#
            ),
        ),
        (
            "/v1/messages/count_tokens",
            format!(r#"{{"model": "{m}", "messages": [{{"role": "user", "content": "count"}}]}}"#),
        ),
        (
            "/api/chat",
            format!(
                r#"{{"model": "{m}", "messages": [{{"role": "user", "content": "hi"}}], "stream": false, "options": {{"num_predict": 3, "temperature": 0}}}}"#
            ),
        ),
        (
            "/api/chat",
            format!(
                r#"{{"model": "{m}", "messages": [{{"role": "user", "content": "hi"}}], "format": {{"type": "object"}}, "options": {{"num_predict": 4}}}}"#
            ),
        ),
        (
            "/api/generate",
            format!(
                r#"{{"model": "{m}", "prompt": "Once", "stream": true, "options": {{"num_predict": 3, "stop": ["."]}}}}"#
            ),
        ),
        ("/api/embed", format!(r#"{{"model": "{m}", "input": "a"}}"#)),
        (
            "/api/embeddings",
            format!(r#"{{"model": "{m}", "prompt": "a"}}"#),
        ),
        ("/api/show", format!(r#"{{"model": "{m}"}}"#)),
        ("/instance", format!(r#"{{"model": "{m}"}}"#)),
        (
            "/cluster/enroll",
            r#"{"invite": "a1", "node": "n", "proof": "00"}"#.to_string(),
        ),
        ("/cluster/remove", r#"{"node": "n"}"#.to_string()),
    ];
    bodies
        .into_iter()
        .map(|(route, body)| {
            let pick = crate::api::ROUTES
                .iter()
                .position(|r| *r == route)
                .expect("a seed's route is fuzzed");
            let mut v = vec![pick as u8];
            v.extend_from_slice(body.as_bytes());
            v
        })
        .collect()
}
