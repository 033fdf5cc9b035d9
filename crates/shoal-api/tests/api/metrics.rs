//! `GET /metrics` on the real router and engine (SmolLM2): Prometheus' text format with a `# TYPE` for
//! every family, each family listed in `shoal_api::metrics::names` with the same type, latencies as
//! histograms with buckets; a chat request moves the request, token and latency series by what its
//! answer reports; routes are labelled by template (never the raw path), unknown models as `other`;
//! the route needs the API key like every other.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::common::*;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::json;
use shoal_api::ApiState;
use shoal_api::metrics::names::{self, Kind};
use shoal_engine::EngineHandle;

/// The process's one recorder counts every metered request: the tests that read deltas of the same series
/// take turns, or one's chat request lands between another's two scrapes.
static COUNTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The node's state with the process's recorder installed before the engine registers its handles: an
/// engine of this file's own, as another test in the process may have started the shared one first.
fn metered() -> ApiState {
    static ENGINE: OnceLock<EngineHandle> = OnceLock::new();
    let handle = shoal_api::metrics::install();
    let mut s = ApiState::new(ENGINE.get_or_init(spawn_engine).clone());
    s.metrics = Some(handle);
    s
}

/// One scrape: `# TYPE` of each family and the value of each sample (`name{labels}` as written).
struct Scrape {
    types: HashMap<String, String>,
    samples: HashMap<String, f64>,
}

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut types = HashMap::new();
        let mut samples = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
                let before = types.insert(name.to_string(), kind.to_string());
                assert!(before.is_none(), "family {name} typed twice");
            } else if !line.is_empty() && !line.starts_with('#') {
                let (series, value) = line.rsplit_once(' ').expect("series value");
                let v: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
                samples.insert(series.to_string(), v);
            }
        }
        Scrape { types, samples }
    }

    /// The sum of the samples of `name` whose labels include every one of `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(series, _)| {
                let (n, rest) = series.split_once('{').unwrap_or((series, ""));
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

async fn scrape(state: &ApiState) -> Scrape {
    let reply = send_with(
        state.clone(),
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let ct = reply.headers[header::CONTENT_TYPE].to_str().unwrap();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    Scrape::parse(&reply.body)
}

#[tokio::test]
async fn a_chat_request_moves_the_counters_and_every_family_is_typed_and_listed() {
    let _turn = COUNTING.lock().await;
    let state = metered();
    let before = scrape(&state).await;
    let reply = send_with(
        state.clone(),
        post_raw(
            "/v1/chat/completions",
            Some("application/json"),
            json!({
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 6,
            })
            .to_string(),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let usage = reply.json()["usage"].clone();
    let (prompt, completion) = (
        usage["prompt_tokens"].as_f64().unwrap(),
        usage["completion_tokens"].as_f64().unwrap(),
    );
    assert!(completion >= 1.0, "{usage}");
    let after = scrape(&state).await;

    let m = [("model", MODEL_ID)];
    let delta =
        |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    let chat = [
        ("api", "openai"),
        ("route", "/v1/chat/completions"),
        ("method", "POST"),
        ("model", MODEL_ID),
        ("status", "200"),
    ];
    assert_eq!(delta("shoal_http_requests_total", &chat), 1.0);
    assert_eq!(delta("shoal_generated_tokens_total", &m), completion);
    assert_eq!(delta("shoal_prompt_tokens_total", &m), prompt);
    assert_eq!(delta("shoal_time_to_first_token_seconds_count", &m), 1.0);
    assert_eq!(delta("shoal_request_duration_seconds_count", &m), 1.0);
    assert_eq!(
        delta("shoal_inter_token_latency_seconds_count", &m),
        completion - 1.0
    );
    assert!(delta("shoal_time_to_first_token_seconds_sum", &m) > 0.0);
    assert!(delta("shoal_engine_step_seconds_count", &m) >= completion);
    let finished = delta(
        "shoal_engine_requests_total",
        &[("model", MODEL_ID), ("outcome", "stop")],
    ) + delta(
        "shoal_engine_requests_total",
        &[("model", MODEL_ID), ("outcome", "length")],
    );
    assert_eq!(finished, 1.0);
    // A histogram's +Inf bucket holds every observation.
    assert_eq!(
        after.sum(
            "shoal_time_to_first_token_seconds_bucket",
            &[("model", MODEL_ID), ("le", "+Inf")]
        ),
        after.sum("shoal_time_to_first_token_seconds_count", &m)
    );
    // The engine's live figures, read at the scrape.
    assert_eq!(after.sum("shoal_sequences_running", &m), 0.0);
    assert!(after.sum("shoal_kv_pool_capacity_bytes", &[]) > 0.0);

    // Every family is one of the listed metrics, with the listed type.
    let listed: HashMap<&str, Kind> = names::all().collect();
    for (family, kind) in &after.types {
        let want = listed
            .get(family.as_str())
            .unwrap_or_else(|| panic!("{family} is exported but not listed in metrics::names"));
        assert_eq!(kind, want.as_str(), "{family}");
    }
    for family in [
        "shoal_http_requests_total",
        "shoal_http_request_duration_seconds",
        "shoal_time_to_first_token_seconds",
        "shoal_inter_token_latency_seconds",
        "shoal_request_duration_seconds",
        "shoal_generated_tokens_total",
        "shoal_engine_queue_depth",
    ] {
        assert!(after.types.contains_key(family), "{family} missing");
    }
    for latency in [
        "shoal_time_to_first_token_seconds",
        "shoal_inter_token_latency_seconds",
        "shoal_http_request_duration_seconds",
    ] {
        assert_eq!(after.types[latency], "histogram", "{latency}");
    }
}

#[tokio::test]
async fn routes_are_templates_and_unknown_models_are_other() {
    let _turn = COUNTING.lock().await;
    let state = metered();
    let missing = send_with(
        state.clone(),
        Request::get("/no/such/path/12345")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let model_route = send_with(
        state.clone(),
        Request::get(format!("/v1/models/{MODEL_ID}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(model_route.status, StatusCode::OK, "{}", model_route.body);
    let unknown = send_with(
        state.clone(),
        post_raw(
            "/v1/chat/completions",
            Some("application/json"),
            json!({"model": "made-up-model-xyz", "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
        ),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.body);
    let after = scrape(&state).await;
    let text: Vec<&String> = after.samples.keys().collect();
    assert!(
        !text
            .iter()
            .any(|s| s.contains("12345") || s.contains("made-up-model-xyz")),
        "raw paths and unknown models never become labels"
    );
    assert!(
        after.sum(
            "shoal_http_requests_total",
            &[("route", "unmatched"), ("status", "404")]
        ) >= 1.0
    );
    assert!(
        after.sum(
            "shoal_http_requests_total",
            &[("route", "/v1/models/{*id}"), ("status", "200")]
        ) >= 1.0
    );
    assert!(
        after.sum(
            "shoal_http_requests_total",
            &[("model", "other"), ("status", "404"), ("api", "openai")]
        ) >= 1.0
    );
}

#[tokio::test]
async fn metrics_need_the_api_key_when_keys_are_set() {
    let mut state = metered();
    state.api_keys = shoal_api::auth::ApiKeys::new(["s3cret"]);
    let anonymous = send_with(
        state.clone(),
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let bearer = send_with(
        state.clone(),
        Request::get("/metrics")
            .header(header::AUTHORIZATION, "Bearer s3cret")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(bearer.status, StatusCode::OK);
    assert!(
        bearer
            .body
            .contains("# TYPE shoal_http_requests_total counter")
    );
}

#[tokio::test]
async fn a_server_without_a_recorder_answers_404() {
    let reply = send_with(
        state(),
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

/// [`metered`] as a member of a one-node cluster whose key is `cluster_key`.
async fn metered_member(dir: &std::path::Path, cluster_key: &str) -> ApiState {
    let mut s = metered();
    s.cluster = Some(cluster_node(&dir.join("state"), cluster_key).await);
    s
}

#[tokio::test]
async fn a_request_relayed_by_another_nodes_balancer_is_counted_once_where_the_client_sent_it() {
    let _turn = COUNTING.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = metered_member(dir.path(), "metrics-relay").await;
    let cluster = state.cluster.clone().expect("cluster");
    let body = json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Name a color."}],
        "max_tokens": 3,
    })
    .to_string();
    let chat = [("route", "/v1/chat/completions")];
    let counted = |before: &Scrape, after: &Scrape| {
        after.sum("shoal_http_requests_total", &chat)
            - before.sum("shoal_http_requests_total", &chat)
    };
    // Marked by a member (a proof made with the cluster's key): served, not counted again here.
    let before = scrape(&state).await;
    let mut relayed = post_raw(
        "/v1/chat/completions",
        Some("application/json"),
        body.clone(),
    );
    let (name, proof) = shoal_api::relayed::mark(
        &cluster,
        &axum::http::Method::POST,
        "/v1/chat/completions",
        body.as_bytes(),
    );
    relayed.headers_mut().insert(name, proof);
    let reply = send_with(state.clone(), relayed).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let after = scrape(&state).await;
    assert_eq!(
        counted(&before, &after),
        0.0,
        "the node the client talked to counted it"
    );
    assert_eq!(
        after.sum("shoal_http_request_duration_seconds_count", &chat),
        before.sum("shoal_http_request_duration_seconds_count", &chat)
    );
    let m = [("model", MODEL_ID)];
    assert!(
        after.sum("shoal_generated_tokens_total", &m)
            > before.sum("shoal_generated_tokens_total", &m),
        "the engine that served it counts its tokens"
    );
}

#[tokio::test]
async fn a_client_cannot_pass_as_a_node_with_the_relay_header() {
    let _turn = COUNTING.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = metered_member(dir.path(), "metrics-forged").await;
    let body = json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Name a color."}],
        "max_tokens": 3,
    })
    .to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let other_cluster = shoal_cluster::relay_proof::RelayKey::from_cluster_key("another cluster");
    let forgeries = [
        "1".to_string(),
        format!("v1.{now}.{}", "0".repeat(64)),
        other_cluster.sign(now, "POST", "/v1/chat/completions", body.as_bytes()),
    ];
    let chat = [("route", "/v1/chat/completions")];
    for forged in forgeries {
        let before = scrape(&state).await;
        let mut req = post_raw(
            "/v1/chat/completions",
            Some("application/json"),
            body.clone(),
        );
        req.headers_mut().insert(
            shoal_api::relayed::RELAYED_HEADER,
            header::HeaderValue::from_str(&forged).expect("header"),
        );
        let reply = send_with(state.clone(), req).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let after = scrape(&state).await;
        assert_eq!(
            after.sum("shoal_http_requests_total", &chat)
                - before.sum("shoal_http_requests_total", &chat),
            1.0,
            "{forged}: a client's request with the header must be counted as a client's"
        );
    }
}

#[tokio::test]
async fn an_engine_that_went_leaves_no_preempted_series() {
    let state = metered();
    let series = format!("shoal_sequences_preempted{{model=\"{MODEL_ID}\"}}");
    let with = scrape(&state).await;
    assert_eq!(
        with.samples.get(&series),
        Some(&0.0),
        "{:?}",
        with.samples.keys()
    );
    assert_eq!(with.types["shoal_sequences_preempted"], "gauge");
    assert!(state.engine.remove(MODEL_ID).is_some());
    let without = scrape(&state).await;
    assert!(
        !without
            .samples
            .keys()
            .any(|s| s.starts_with("shoal_sequences_preempted")),
        "a series of an engine that went: {:?}",
        without
            .samples
            .keys()
            .filter(|s| s.contains("preempted"))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_hosted_stages_kv_is_read_at_each_scrape_and_leaves_with_the_stage() {
    let state = metered();
    let series = r#"shoal_kv_share_used_tokens{instance_id="i-hosted",stage="1"}"#;
    let share = shoal_engine::meters::ShareMeter::new("i-hosted".into(), 1);
    share.used(96);
    assert_eq!(scrape(&state).await.samples.get(series), Some(&96.0));
    share.used(12);
    let held = scrape(&state).await;
    assert_eq!(held.samples.get(series), Some(&12.0));
    assert_eq!(held.types["shoal_kv_share_used_tokens"], "gauge");
    drop(share);
    let gone = scrape(&state).await;
    assert!(
        !gone.samples.keys().any(|s| s.contains("i-hosted")),
        "a stage that went has no series"
    );
}
