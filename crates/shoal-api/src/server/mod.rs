//! [`serve`]: the API's own accept loop, HTTP/1 on hyper, so that no connection holds the node forever.
//!
//! - **Header timeout.** A connection has [`ServeConfig::header_timeout`] to send a request's headers:
//!   from its opening (one that sends nothing is closed), between two requests of a kept-alive
//!   connection, and while the headers trickle in (slowloris). It is hyper's `header_read_timeout`,
//!   whose timer runs whenever the connection waits for a request head, and only then — a response
//!   being written (an SSE token stream that pauses for seconds) is never cut by it.
//! - **Connection cap.** At most [`ServeConfig::max_connections`] connections are served at once
//!   (a semaphore; [`max_connections_for`] derives the cap from the descriptor limit, leaving room for
//!   model files and the cluster's sockets and lanes). One past the cap is answered a minimal
//!   `HTTP/1.1 503` with `Connection: close` on the accepted socket and closed, never left hanging; so
//!   the node keeps descriptors to answer `/health` once the crowd leaves.
//! - **Peer address.** Every request carries the client's address as [`ConnectInfo<SocketAddr>`] in
//!   its extensions (the enrolment limit counts by it). Requests handed to the router without a socket
//!   (tests with `oneshot`) have none, and readers treat it as optional.
//! - **Graceful shutdown.** When the shutdown future resolves, the listener closes, each connection
//!   finishes the request it is answering and closes, and [`serve`] returns once all have.
//!
//! Accept errors (a connection reset before it was accepted; running out of descriptors) never end the
//! loop: the latter waits a second and tries again.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower::ServiceExt;

use crate::ApiState;

/// How long a connection may take to send a request's headers, by default.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Refused connections lingering at once (each reads what its client sent for a moment, so that
/// closing does not reset the connection before the client reads the 503); more are closed at once.
const REFUSALS_LINGERING: usize = 32;
/// How long a refused connection lingers, and how much of its request it reads meanwhile.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
const REFUSAL_READ_MAX: usize = 64 * 1024;
/// How often, at most, hitting the cap is logged.
const CAP_WARN_EVERY: Duration = Duration::from_secs(60);

/// How connections are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeConfig {
    /// See the module docs.
    pub header_timeout: Duration,
    /// Connections served at once; one more is answered 503 and closed.
    pub max_connections: usize,
}

impl Default for ServeConfig {
    /// 30 s for headers, the cap of the common default descriptor limit (1,024).
    fn default() -> Self {
        ServeConfig {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: max_connections_for(1024),
        }
    }
}

/// The connection cap of a process allowed `fd_limit` open descriptors: the limit less a reserve of a
/// quarter (at least 64, at most 4,096) for model files, the cluster's sockets, lanes and downloads;
/// between 8 and 16,384.
pub fn max_connections_for(fd_limit: u64) -> usize {
    let reserve = (fd_limit / 4).clamp(64, 4096);
    fd_limit.saturating_sub(reserve).clamp(8, 16_384) as usize
}

/// Serves the API on `listener` until `shutdown` resolves, then lets running requests finish. The
/// state's origin policy learns the address listened on (a loopback node checks the `Host` of requests:
/// [`crate::guard::origin`]).
pub async fn serve(
    listener: TcpListener,
    mut state: ApiState,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    state.origins = state.origins.bound_to(listener.local_addr()?);
    serve_router(listener, crate::router(state), config, shutdown).await
}

/// [`serve`] for any router.
pub(crate) async fn serve_router(
    listener: TcpListener,
    app: Router,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let open = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let lingering = Arc::new(Semaphore::new(REFUSALS_LINGERING));
    // `stop` tells connections to finish; every connection holds a `live` receiver until it ends.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (live_tx, live_rx) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    let mut warned: Option<Instant> = None;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        match open.clone().try_acquire_owned() {
            Ok(permit) => {
                let held = Held {
                    _permit: permit,
                    _live: live_rx.clone(),
                };
                let (app, stop) = (app.clone(), stop_rx.clone());
                tokio::spawn(connection(
                    stream,
                    peer,
                    app,
                    config.header_timeout,
                    stop,
                    held,
                ));
            }
            Err(_) => {
                if warned.is_none_or(|at| at.elapsed() >= CAP_WARN_EVERY) {
                    warned = Some(Instant::now());
                    tracing::warn!(
                        max_connections = config.max_connections,
                        "connection cap reached: refusing new connections with 503 until some close"
                    );
                }
                refuse(stream, &lingering);
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(live_rx);
    live_tx.closed().await;
    Ok(())
}

/// What a connection holds while it is served: its place under the cap, and the receiver that keeps
/// [`serve_router`] waiting for it at shutdown.
struct Held {
    _permit: OwnedSemaphorePermit,
    _live: watch::Receiver<()>,
}

/// Serves one connection until it ends, finishing its current request once `stop` turns true.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
    _held: Held,
) {
    // Token streams write small chunks: each goes out at once.
    let _ = stream.set_nodelay(true);
    let app = app.map_request(move |mut req: axum::http::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        req
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let mut conn =
        pin!(builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app)));
    let mut stopping = false;
    loop {
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(%peer, "connection closed: {e}");
                }
                return;
            }
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The whole answer to a connection past the cap.
fn refusal() -> String {
    let body = r#"{"error":{"message":"the server has too many open connections, retry later","type":"server_error","param":null,"code":"overloaded"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Answers a connection past the cap with a 503 and closes it: written at once (a fresh socket's send
/// buffer takes it whole), then the write side shut and, while few others do, what the client sent read
/// for a moment so the close does not reset the connection before the client reads the answer.
fn refuse(stream: TcpStream, lingering: &Arc<Semaphore>) {
    let _ = stream.try_write(refusal().as_bytes());
    let Ok(permit) = lingering.clone().try_acquire_owned() else {
        return; // dropped: closed now
    };
    tokio::spawn(async move {
        let _permit = permit;
        let mut stream = stream;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut read = 0;
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            while read < REFUSAL_READ_MAX {
                match stream.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
        })
        .await;
    });
}

/// After a failed accept: a connection that went away before it was accepted is nothing; anything else
/// (out of descriptors) is logged and waited out for a second, so the loop does not spin.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset, Interrupted};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset | Interrupted
    ) {
        return;
    }
    tracing::warn!("accepting a connection failed (trying again in 1 s): {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[cfg(test)]
mod tests;
