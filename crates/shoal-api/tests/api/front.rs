//! The one front half (`shoal_api::generate`): every chat-like API plans its first constrained request
//! off the async workers. A node's first constrained request of a model builds the model's token tables
//! (tens of milliseconds for SmolLM2); on a one-thread runtime a task that ticks every millisecond would
//! stall for all of that if the handler built them inline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shoal_api::ApiState;

use crate::common::{self, MODEL_ID, post_raw, send_with};

fn parameters() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
}

/// A forced call in each chat-like API, as (route, body).
fn forced_calls() -> Vec<(&'static str, Value)> {
    let ask = json!([{"role": "user", "content": "Weather in Paris?"}]);
    vec![
        (
            "/v1/chat/completions",
            json!({"model": MODEL_ID, "messages": ask, "max_tokens": 4,
                   "tools": [{"type": "function", "function": {"name": "w", "parameters": parameters()}}],
                   "tool_choice": "required"}),
        ),
        (
            "/v1/responses",
            json!({"model": MODEL_ID, "input": "Weather in Paris?", "max_output_tokens": 4,
                   "tools": [{"type": "function", "name": "w", "parameters": parameters()}],
                   "tool_choice": "required"}),
        ),
        (
            "/v1/messages",
            json!({"model": MODEL_ID, "messages": ask, "max_tokens": 4,
                   "tools": [{"name": "w", "input_schema": parameters()}],
                   "tool_choice": {"type": "any"}}),
        ),
        (
            "/api/chat",
            json!({"model": MODEL_ID, "messages": ask, "stream": false,
                   "options": {"num_predict": 4}, "format": {"type": "object"}}),
        ),
    ]
}

#[test]
fn each_api_plans_its_first_constrained_request_off_the_async_workers() {
    // What building the tables costs here, on a guide cache of its own (the second time: what the
    // tokenizer keeps from a first build is not the guide's).
    let tokenizer = common::engine().tokenizer().clone();
    let mut build = Duration::MAX;
    for _ in 0..2 {
        let started = Instant::now();
        shoal_guide::Guides::default()
            .for_tokenizer(&tokenizer)
            .expect("guide");
        build = started.elapsed();
    }
    eprintln!("building the tables: {build:?}");
    assert!(
        build >= Duration::from_millis(8),
        "too fast to tell: {build:?}"
    );
    for (route, body) in forced_calls() {
        // Inline planning stalls every try by the whole build; a busy machine may stall one now and
        // then, so the best of three tries counts.
        let best = (0..3)
            .map(|_| longest_stall(route, &body))
            .min()
            .expect("tries");
        eprintln!("{route}: longest stall {best:?}");
        assert!(
            best < build / 2,
            "{route}: the runtime stalled {best:?} (building the tables takes {build:?})"
        );
    }
}

/// The longest a one-thread runtime went without ticking while it answered `body` at `route` on a
/// fresh node state (an empty guide cache, so the request builds the model's tables).
fn longest_stall(route: &str, body: &Value) -> Duration {
    let state = ApiState::new(common::engine());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let done = Arc::new(AtomicBool::new(false));
        let ticking = done.clone();
        let ticker = tokio::spawn(async move {
            let mut last = Instant::now();
            let mut longest = Duration::ZERO;
            while !ticking.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(1)).await;
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
            longest
        });
        // Let the ticker start: a request that never yields would otherwise hide a stall before it.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let reply = send_with(
            state,
            post_raw(route, Some("application/json"), body.to_string()),
        )
        .await;
        assert_eq!(reply.status, 200, "{route}: {}", reply.body);
        done.store(true, Ordering::Relaxed);
        ticker.await.expect("ticker")
    })
}
