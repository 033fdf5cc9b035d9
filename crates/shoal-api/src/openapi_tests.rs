use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

use super::*;
use crate::ApiState;

const METHODS: [&str; 7] = ["get", "post", "put", "delete", "patch", "head", "options"];

fn doc() -> Value {
    serde_json::from_str(document()).expect("the document is JSON")
}

fn state() -> ApiState {
    ApiState::new(shoal_engine::Engines::default())
}

/// A path as OpenAPI names it: axum's tail parameter `{*id}` is the parameter `{id}`.
fn openapi_path(axum_path: &str) -> String {
    axum_path.replace("{*", "{")
}

/// What the router serves, as (method, OpenAPI path).
fn served() -> BTreeSet<(String, String)> {
    crate::routes(&state())
        .served()
        .iter()
        .map(|s| (s.method.to_string(), openapi_path(s.path)))
        .collect()
}

fn documented() -> BTreeSet<(String, String)> {
    let doc = doc();
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in METHODS {
            if item.get(method).is_some() {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

#[test]
fn the_document_is_openapi_3_1_and_lists_every_route_the_router_serves_and_no_other() {
    assert!(doc()["openapi"].as_str().unwrap().starts_with("3.1"));
    let (served, documented) = (served(), documented());
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "routes without a doc entry: {undocumented:?}"
    );
    assert!(
        unserved.is_empty(),
        "doc entries no route serves: {unserved:?}"
    );
    assert!(served.len() >= 37, "{} routes", served.len());
}

#[test]
fn operation_ids_are_unique() {
    let doc = doc();
    let mut seen = BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for method in METHODS {
            if let Some(op) = item.get(method) {
                let id = op["operationId"].as_str().expect("an operationId");
                assert!(seen.insert(id.to_string()), "{id} twice");
            }
        }
    }
}

/// Every `$ref` names a schema of the document's components.
#[test]
fn every_schema_reference_resolves() {
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let doc = doc();
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 20, "{} references", all.len());
    for r in all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r} is not a component schema"));
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "{r} names no schema"
        );
    }
}

/// Each listed route is answered by its handler, not by the router's fallbacks (404 `no route for`,
/// 405, Ollama's `is not served by shoal`): the list is the router's.
#[tokio::test]
async fn every_listed_route_reaches_its_handler() {
    for (method, path) in served() {
        let uri = path
            .replace("{id}", "chatcmpl-0")
            .replace("{model}", "org/some-model");
        let req = Request::builder()
            .method(method.as_str())
            .uri(&uri)
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap();
        let res = crate::router(state()).oneshot(req).await.unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        assert_ne!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {uri}: {text}"
        );
        assert!(
            !text.contains("no route for") && !text.contains("is not served by shoal"),
            "{method} {uri} fell through to a fallback: {status} {text}"
        );
    }
}

#[tokio::test]
async fn the_router_serves_the_document() {
    let req = Request::get("/openapi.json").body(Body::empty()).unwrap();
    let res = crate::router(state()).oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "application/json");
    let body = axum::body::to_bytes(res.into_body(), 1 << 22)
        .await
        .unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), doc());
}

/// `ollama::EndingFields` states what a flattened `Ending` writes: the same fields.
#[test]
fn ollamas_ending_fields_are_what_an_ending_writes() {
    use crate::ollama::types::{Ending, Metrics};
    let written = serde_json::to_value(Ending {
        done_reason: "stop",
        metrics: Some(Metrics::default()),
    })
    .unwrap();
    let written: BTreeSet<&str> = written
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let doc = doc();
    let stated: BTreeSet<&str> = doc["components"]["schemas"]["ollama.EndingFields"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(written, stated);
}
