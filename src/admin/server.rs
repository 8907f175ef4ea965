//! The admin listener's connections: a cap on how many are open at once, deadlines for a
//! request's head and body, and a bounded graceful shutdown.
//!
//! `axum::serve` has none of these (its hyper builder has no timer, so hyper's header
//! timeout is off): a client that opens connections and sends a request line one byte at
//! a time would hold a socket and a task for as long as it liked, and enough of them
//! would exhaust file descriptors, with the probes' `/livez` failing as a result.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::warn;

use super::MAX_BODY_BYTES;
use super::routes::error;
use crate::metrics::Metrics;

/// Open connections served at once. Far above what probes, a Prometheus scrape and an
/// operator need, and room for a burst of 100 concurrent requests while 200 slow clients
/// wait out their header timeout; far below the usual file-descriptor limit (1024 soft).
/// A connection beyond it is closed at once (and counted) rather than queued, so a flood
/// cannot make the kernel's backlog hold the probes' connections.
pub const MAX_CONNECTIONS: usize = 512;

/// A request head (request line and headers) must arrive whole within this time of the
/// connection becoming ready to read one, also between requests on a kept-alive
/// connection; otherwise the connection is closed. Kubernetes probes and Prometheus send
/// their head in one packet.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A request body (at most [`MAX_BODY_BYTES`]) must arrive whole within this time of its
/// head; otherwise 408 and the connection closes.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// After the job has stopped, requests still in flight get this long to finish; idle or
/// hostile connections are not waited for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    metrics: Metrics,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors or a connection reset before accept: keep
                    // serving, without spinning.
                    warn!(error = %e, "admin listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics.http_connections_refused.inc();
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // Errors here are the client's (reset, header timeout, malformed request).
            let _ = connection.await;
            drop(permit);
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {}
    }
}

/// Reads the whole body (at most [`MAX_BODY_BYTES`], within [`BODY_READ_TIMEOUT`]) before
/// any handler runs: 413 for a larger one, announced or not, 408 for one that trickles.
pub(super) async fn read_body(request: Request, next: Next) -> Response {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(body, MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let limit = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return if limit {
                too_large()
            } else {
                error(StatusCode::BAD_REQUEST, format!("request body: {e}")).into_response()
            };
        }
        Err(_) => {
            let mut r = error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body not received within {}s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            )
            .into_response();
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return r;
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn too_large() -> Response {
    let mut r = error(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body larger than {MAX_BODY_BYTES} bytes"),
    )
    .into_response();
    // The rest of the body is not read: the connection cannot carry another request.
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}
