//! `HttpSource` against a local server on 127.0.0.1: a 206 answer is the range; a server that ignores
//! `Range` (200 with the whole file) is an error, never taken as the range; extra headers are sent.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use shoal_transfer::{ChunkSource, HttpSource, SourceError};

/// Serves `data` at /ranged (honouring `Range` when the token header is right) and at /whole (ignoring it).
async fn server(data: Arc<Vec<u8>>) -> String {
    async fn ranged(State(data): State<Arc<Vec<u8>>>, h: HeaderMap) -> Response {
        if h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some("Bearer t0k") {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        let spec = h
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes="))
            .and_then(|v| v.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
        let Some((a, b)) = spec.filter(|&(a, b)| a <= b && b < data.len()) else {
            return StatusCode::RANGE_NOT_SATISFIABLE.into_response();
        };
        let cr = format!("bytes {a}-{b}/{}", data.len());
        (
            StatusCode::PARTIAL_CONTENT,
            [(header::CONTENT_RANGE, cr)],
            data[a..=b].to_vec(),
        )
            .into_response()
    }
    async fn whole(State(data): State<Arc<Vec<u8>>>) -> Response {
        (StatusCode::OK, data.to_vec()).into_response()
    }
    let app = Router::new()
        .route("/ranged", get(ranged))
        .route("/whole", get(whole))
        .with_state(data);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn ranged_gets_take_206_only() {
    let data: Arc<Vec<u8>> = Arc::new((0..100_000u32).map(|i| (i % 251) as u8).collect());
    let base = server(data.clone()).await;
    let client = reqwest::Client::new();
    let mut auth = reqwest::header::HeaderMap::new();
    auth.insert(
        reqwest::header::AUTHORIZATION,
        "Bearer t0k".parse().unwrap(),
    );

    let src = HttpSource::new(
        client.clone(),
        format!("{base}/ranged?sig=secret"),
        auth.clone(),
    );
    assert!(!src.name().contains("secret"), "the name hides the query");
    let got = src.read(1000, 5000).await.unwrap();
    assert_eq!(&got[..], &data[1000..6000]);
    assert!(matches!(
        src.read(99_999, 10).await,
        Err(SourceError::Status { status: 416 })
    ));

    let unauth = HttpSource::new(client.clone(), format!("{base}/ranged"), Default::default());
    assert!(matches!(
        unauth.read(0, 10).await,
        Err(SourceError::Status { status: 401 })
    ));

    let whole = HttpSource::new(client, format!("{base}/whole"), auth);
    assert!(matches!(
        whole.read(10, 20).await,
        Err(SourceError::RangeIgnored { start: 10, end: 30 })
    ));
}
