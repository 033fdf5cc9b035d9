//! Limits on what strangers send, on the real router (issue 26, items 4 and 6): bodies declared over a
//! route's limit are 413 before they are read (a 64 MiB `/downloads` body was a 400), enrolling takes a
//! few KB, and failed enrolments are limited per client address (429 with `Retry-After`) with 400s
//! that never repeat what was sent.

use std::net::SocketAddr;

use crate::common::*;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, header};
use serde_json::json;

#[tokio::test]
async fn a_body_declared_over_the_limit_is_413_before_it_is_read() {
    // 64 MiB declared to /downloads: 413 (its handler would call a failed read a 400).
    let big = [
        ("content-type", "application/json"),
        ("content-length", "67108864"),
    ];
    let reply = send(request_with(
        Method::POST,
        "/downloads",
        &big,
        Body::from("{}"),
    ))
    .await;
    let err = assert_error(&reply, 413, None);
    assert_eq!(err["code"], "request_too_large");
    let reply = send(request_with(
        Method::POST,
        "/api/pull",
        &big,
        Body::from("{}"),
    ))
    .await;
    assert_eq!(reply.status, 413);
    assert!(reply.json()["error"].is_string(), "Ollama's shape");
    // Enrolling takes a few KB, declared or streamed.
    let two_mib = [
        ("content-type", "application/json"),
        ("content-length", "2097152"),
    ];
    let reply = send(request_with(
        Method::POST,
        "/cluster/enroll",
        &two_mib,
        Body::from("{}"),
    ))
    .await;
    assert_error(&reply, 413, None);
    let chunks = futures::stream::iter(
        (0..4).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 2048]))),
    );
    let streamed = request_with(
        Method::POST,
        "/cluster/enroll",
        &big[..1],
        Body::from_stream(chunks),
    );
    assert_error(&send(streamed).await, 413, None);
}

fn enroll_from(peer: Option<&str>) -> Request<Body> {
    let body = json!({"invite": "a1b2c3d4e5f6", "node": "12D3KooWabc", "proof": "ab".repeat(32)});
    let mut r = request_with(
        Method::POST,
        "/cluster/enroll",
        &[("content-type", "application/json")],
        json_body(body),
    );
    if let Some(p) = peer {
        let addr: SocketAddr = p.parse().expect("addr");
        r.extensions_mut().insert(ConnectInfo(addr));
    }
    r
}

#[tokio::test]
async fn failed_enrolments_from_one_address_get_429_with_retry_after() {
    let s = state();
    for _ in 0..5 {
        // A bare engine has no cluster: each try fails.
        let reply = send_with(s.clone(), enroll_from(Some("192.0.2.1:40000"))).await;
        assert_eq!(reply.status, 404, "{}", reply.body);
    }
    let reply = send_with(s.clone(), enroll_from(Some("192.0.2.1:40001"))).await;
    let err = assert_error(&reply, 429, None);
    assert_eq!(err["code"], "rate_limit_exceeded");
    let wait: u64 = reply.headers[header::RETRY_AFTER]
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("Retry-After seconds");
    assert!((1..=60).contains(&wait), "{wait}");
    // Another address is not held back by it.
    let reply = send_with(s.clone(), enroll_from(Some("192.0.2.2:40000"))).await;
    assert_eq!(reply.status, 404);
    // A malformed enrolment is a failed try too, and its 400 does not repeat what was sent.
    let forged = json!({"invite": "x\nINFO forged line", "node": "n", "proof": "00"});
    let r = request_with(
        Method::POST,
        "/cluster/enroll",
        &[("content-type", "application/json")],
        json_body(forged),
    );
    let reply = send_with(s, r).await;
    let err = assert_error(&reply, 400, Some("invite"));
    assert!(!reply.body.contains("forged"), "{err}");
}
