//! The admin HTTP server: health, readiness, metrics and checkpoint triggers.
//!
//! It only reads and sets flags in [`Control`]; it never touches state or Kafka itself,
//! so a slow or hostile client cannot stall the job loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::Json;
use axum::response::IntoResponse;
use axum::routing::{get, post};

use crate::job::Control;
use crate::metrics::Metrics;

#[derive(Clone)]
struct AppState {
    control: Arc<Control>,
    metrics: Metrics,
}

pub fn router(control: Arc<Control>, metrics: Metrics) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/checkpoints", post(trigger_checkpoint))
        .route("/rules", get(rules))
        .with_state(AppState { control, metrics })
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

async fn livez(State(s): State<AppState>) -> impl IntoResponse {
    if s.control.alive.load(Ordering::Relaxed) { (StatusCode::OK, "ok") } else { (StatusCode::SERVICE_UNAVAILABLE, "starting") }
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if s.control.ready.load(Ordering::SeqCst) { (StatusCode::OK, "ready") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready") }
}

async fn metrics_text(State(s): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render())
}

async fn trigger_checkpoint(State(s): State<AppState>) -> impl IntoResponse {
    if s.control.checkpoint_requested.swap(true, Ordering::SeqCst) {
        (StatusCode::CONFLICT, "a checkpoint is already requested")
    } else {
        (StatusCode::ACCEPTED, "checkpoint requested")
    }
}

/// The rules in force (and deleted ones, with the version that deleted them).
async fn rules(State(s): State<AppState>) -> impl IntoResponse {
    match s.control.rules.read() {
        Ok(rules) => Json(rules.values().cloned().collect::<Vec<_>>()).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "rules view unavailable").into_response(),
    }
}
