//! The admin HTTP server: health, readiness, metrics, checkpoints, savepoints, stop,
//! rules (publish and rollback), transactions, state lookup, and the web console at `/`. JSON in and out; see
//! `docs/admin-api.md`.
//!
//! It never touches state, the job's transaction or checkpoint storage writes itself
//! (its one Kafka write is a rollback's control-topic publish, see
//! [`control_producer`]), so a slow or
//! hostile client cannot stall the job loop: what needs the job goes through the
//! bounded request channel ([`crate::requests`]) and is served by the loop between
//! polls; history comes from what the loop publishes ([`crate::history`]) and, for
//! savepoints of earlier runs, from reading the savepoint location.

mod auth;
mod console;
pub mod control_producer;
#[doc(hidden)]
pub mod fuzzing;
mod instance;
mod routes;
mod server;

pub use server::{BODY_READ_TIMEOUT, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, serve};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};

use crate::config::{Config, ConfigError, Secret};
use crate::job::Control;
use crate::metrics::Metrics;

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

#[derive(Clone)]
struct AppState {
    control: Arc<Control>,
    metrics: Metrics,
    config: Arc<Config>,
    token: Option<Arc<Secret>>,
    /// A checkpoint or savepoint requested through the API is in flight (409 for another).
    busy: Arc<AtomicBool>,
    /// How long a request waits for the job loop's answer before 504.
    answer_timeout: Duration,
    /// `/livez` fails when the loop has not turned for this long.
    stall_limit: Duration,
    /// Publishes rollbacks to the control topic.
    publisher: Arc<control_producer::ControlProducer>,
}

pub fn router(
    control: Arc<Control>,
    metrics: Metrics,
    config: &Config,
) -> Result<Router, ConfigError> {
    let chk = &config.checkpoint;
    let shared = Arc::new(config.clone());
    let state = AppState {
        control,
        metrics,
        token: config.admin_token()?.map(Arc::new),
        publisher: Arc::new(control_producer::ControlProducer::new(shared.clone())),
        config: shared,
        busy: Arc::default(),
        answer_timeout: chk.timeout * 3 + Duration::from_secs(30),
        stall_limit: chk.timeout * 2 + chk.interval + Duration::from_secs(30),
    };
    // Everything that changes the job or reveals its data needs the token (when set).
    let guarded = Router::new()
        .route("/checkpoints", post(routes::trigger_checkpoint))
        .route("/savepoints", post(routes::trigger_savepoint))
        .route("/stop", post(routes::stop))
        .route("/rules", post(routes::publish_rule))
        .route("/rules/{id}/rollback", post(routes::rollback_rule))
        .route("/state/{key}", get(routes::key_state))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    let open = Router::new()
        // The console's page and files; its API calls follow the rules of the routes
        // they call (the token for the guarded ones, sent by the page).
        .route("/", get(console::index))
        .route("/assets/{file}", get(console::asset))
        .route("/instance", get(instance::instance))
        .route("/livez", get(routes::livez))
        .route("/readyz", get(routes::readyz))
        .route("/metrics", get(routes::metrics_text))
        .route("/checkpoints", get(routes::list_checkpoints))
        .route("/checkpoints/{id}", get(routes::get_checkpoint))
        .route("/savepoints", get(routes::list_savepoints))
        .route("/rules", get(routes::rules))
        .route("/rules/{id}", get(routes::rule))
        .route("/transactions", get(routes::transactions));
    Ok(open
        .merge(guarded)
        .fallback(routes::not_found)
        .layer(middleware::from_fn(server::read_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state))
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// `streamstate_http_requests_total{route,status}` with the route pattern, never the
/// raw path (ids and keys would make the label set unbounded).
async fn count_requests(State(s): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    s.metrics
        .http_requests
        .with_label_values(&[&route, response.status().as_str()])
        .inc();
    s.metrics
        .http_duration
        .with_label_values(&[&route])
        .observe(started.elapsed().as_secs_f64());
    response
}
