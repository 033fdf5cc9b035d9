//! The accept loop over real loopback sockets: silent, slowloris and idle kept-alive connections are
//! closed after the header timeout while a stream that pauses longer is not cut; past the cap a
//! connection gets a 503 and the node answers again once the crowd leaves; shutdown lets a running
//! stream finish; every request knows its peer's address.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::*;

const TIMEOUT: Duration = Duration::from_millis(400);
/// Slack on timings: the timer, the scheduler and a loaded test machine.
const SLACK: Duration = Duration::from_millis(1500);

/// `/health`, `/peer` (the `ConnectInfo` the request carried) and `/pausing` (two SSE events 3 header
/// timeouts apart).
fn app() -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/peer",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
        )
        .route(
            "/pausing",
            get(|| async {
                let events = futures::stream::unfold(0, |i| async move {
                    match i {
                        0 => Some((Ok::<_, Infallible>(Bytes::from("data: first\n\n")), 1)),
                        1 => {
                            tokio::time::sleep(TIMEOUT * 3).await;
                            Some((Ok(Bytes::from("data: second\n\n")), 2))
                        }
                        _ => None,
                    }
                });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from_stream(events))
                    .expect("a response")
            }),
        )
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<io::Result<()>>,
}

async fn start(max_connections: usize) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let config = ServeConfig {
        header_timeout: TIMEOUT,
        max_connections,
    };
    let served = tokio::spawn(serve_router(listener, app(), config, async {
        let _ = stopped.await;
    }));
    Running {
        addr,
        stop: Some(stop),
        served,
    }
}

/// Reads until the server closes the connection (EOF or reset), at most `within`: what was read and
/// when it closed, `None` when it stayed open.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, Option<Instant>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok();
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

async fn get_request(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    read_until_closed(&mut s, Duration::from_secs(10)).await.0
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_timeout() {
    let server = start(64).await;
    let opened = Instant::now();
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    let (_, closed) = read_until_closed(&mut silent, TIMEOUT + SLACK).await;
    let closed = closed.expect("the server closed the silent connection");
    assert!(
        closed - opened >= TIMEOUT - Duration::from_millis(50),
        "{:?}",
        closed - opened
    );
}

#[tokio::test]
async fn slowloris_headers_are_cut_after_the_header_timeout() {
    let server = start(64).await;
    let opened = Instant::now();
    let stream = TcpStream::connect(server.addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    // A header line every 50 ms, forever: the headers never end.
    let trickle = tokio::spawn(async move {
        let _ = writer.write_all(b"GET /health HTTP/1.1\r\n").await;
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if writer
                .write_all(format!("x-{i}: y\r\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(TIMEOUT + SLACK, async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the server closed the slowloris connection");
    assert!(closed - opened >= TIMEOUT - Duration::from_millis(50));
    trickle.abort();
}

#[tokio::test]
async fn a_kept_alive_connection_idle_between_requests_is_closed() {
    let server = start(64).await;
    let mut s = TcpStream::connect(server.addr).await.expect("connect");
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"ok") {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
    }
    let answered = Instant::now();
    let (rest, closed) = read_until_closed(&mut s, TIMEOUT + SLACK).await;
    let closed = closed.expect("the server closed the idle connection");
    assert!(rest.is_empty(), "{rest}");
    assert!(closed - answered >= TIMEOUT - Duration::from_millis(50));
}

#[tokio::test]
async fn a_stream_pausing_longer_than_the_header_timeout_is_not_cut() {
    let server = start(64).await;
    let started = Instant::now();
    let answer = get_request(server.addr, "/pausing").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("data: first") && answer.contains("data: second"),
        "{answer}"
    );
    assert!(started.elapsed() >= TIMEOUT * 3);
}

#[tokio::test]
async fn past_the_cap_a_connection_gets_a_503_and_health_answers_once_they_close() {
    let server = start(2).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(server.addr).await.expect("connect");
        // A request half sent: the connection is busy until the header timeout.
        s.write_all(b"GET /health HTTP/1.1\r\n")
            .await
            .expect("write");
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(server.addr).await.expect("connect");
    third
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let (answer, closed) = read_until_closed(&mut third, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "the refused connection is closed");
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    assert!(answer.contains(r#""code":"overloaded""#), "{answer}");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let answer = get_request(server.addr, "/health").await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {answer}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn shutdown_lets_a_running_stream_finish_then_serve_returns() {
    let mut server = start(64).await;
    let mut s = TcpStream::connect(server.addr).await.expect("connect");
    s.write_all(b"GET /pausing HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("data: first") {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed early");
        got.extend_from_slice(&buf[..n]);
    }
    let _ = server.stop.take().expect("running").send(());
    let (rest, closed) = read_until_closed(&mut s, Duration::from_secs(10)).await;
    assert!(rest.contains("data: second"), "the stream finished: {rest}");
    assert!(closed.is_some(), "then the connection closed");
    tokio::time::timeout(Duration::from_secs(5), server.served)
        .await
        .expect("serve returned")
        .expect("not panicked")
        .expect("no error");
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "no longer listening"
    );
}

#[tokio::test]
async fn every_request_carries_its_peer_address() {
    let server = start(64).await;
    let mut s = TcpStream::connect(server.addr).await.expect("connect");
    let me = s.local_addr().expect("local addr");
    s.write_all(b"GET /peer HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let (answer, _) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(answer.ends_with(&me.to_string()), "{answer} vs {me}");
}

#[test]
fn the_cap_leaves_room_below_the_descriptor_limit() {
    assert_eq!(max_connections_for(1024), 768);
    assert_eq!(max_connections_for(256), 192);
    assert_eq!(max_connections_for(65_536), 16_384);
    assert_eq!(max_connections_for(1 << 40), 16_384);
    assert_eq!(max_connections_for(0), 8);
    assert!(max_connections_for(100) < 100);
}
