use super::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

fn get(uri: &str, accept: Option<&str>) -> Request<Body> {
    let mut b = Request::get(uri);
    if let Some(a) = accept {
        b = b.header(header::ACCEPT, a);
    }
    b.body(Body::empty()).expect("request")
}

async fn call(routes: Routes, state: ApiState, req: Request<Body>) -> (StatusCode, String, String) {
    let r = routes
        .into_router()
        .with_state(state)
        .oneshot(req)
        .await
        .expect("response");
    let status = r.status();
    let ct = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = axum::body::to_bytes(r.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, ct, String::from_utf8_lossy(&body).into_owned())
}

#[test]
fn a_browser_asks_for_html_and_a_tool_does_not() {
    let chrome = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    let mut h = HeaderMap::new();
    h.insert(header::ACCEPT, chrome.parse().unwrap());
    assert!(wants_html(&h));
    for other in ["*/*", "application/json", "text/plain"] {
        h.insert(header::ACCEPT, other.parse().unwrap());
        assert!(!wants_html(&h), "{other}");
    }
    assert!(
        !wants_html(&HeaderMap::new()),
        "curl sends no Accept or */*"
    );
}

#[test]
fn the_page_uses_only_its_own_assets() {
    for asset in ["/dashboard/app.js", "/dashboard/style.css"] {
        assert!(INDEX_HTML.contains(asset), "{asset} is linked");
        assert!(
            crate::auth::OPEN_PATHS.contains(&asset),
            "{asset} needs no key"
        );
    }
    for text in [INDEX_HTML, APP_JS, STYLE_CSS] {
        for remote in [
            "src=\"http",
            "href=\"http",
            "url(http",
            "fetch('http",
            "@import",
            "https://",
        ] {
            assert!(
                !text.contains(remote),
                "nothing is fetched from elsewhere: {remote}"
            );
        }
    }
}

#[tokio::test]
async fn with_keys_the_page_is_open_and_the_feed_is_not() {
    let mut state = ApiState::new(shoal_engine::Engines::default());
    state.api_keys = crate::auth::ApiKeys::new(["secret"]);
    for path in ["/", "/dashboard/app.js", "/dashboard/style.css"] {
        let r = crate::router(state.clone())
            .oneshot(get(path, Some("text/html")))
            .await
            .expect("response");
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    let r = crate::router(state.clone())
        .oneshot(get("/dashboard/events", None))
        .await
        .expect("response");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let mut req = get("/dashboard/events", None);
    req.headers_mut()
        .insert(header::AUTHORIZATION, "Bearer secret".parse().unwrap());
    let r = crate::router(state).oneshot(req).await.expect("response");
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "past the key: no cluster here"
    );
}

#[tokio::test]
async fn root_is_the_page_for_a_browser_and_ollamas_answer_otherwise() {
    let state = ApiState::new(shoal_engine::Engines::default());
    let (status, ct, body) = call(routes(), state.clone(), get("/", Some("text/html"))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(ct.starts_with("text/html"), "{ct}");
    assert!(body.contains("/dashboard/app.js"));
    let (status, ct, body) = call(routes(), state.clone(), get("/", None)).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, OLLAMA_ROOT));
    assert!(ct.starts_with("text/plain"), "{ct}");
    let (status, ct, body) = call(routes(), state, get("/dashboard/app.js", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(ct.starts_with("text/javascript"), "{ct}");
    assert_eq!(body, APP_JS);
}

#[tokio::test]
async fn the_feed_needs_a_cluster() {
    let state = ApiState::new(shoal_engine::Engines::default());
    let (status, _, _) = call(routes(), state, get("/dashboard/events", None)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
