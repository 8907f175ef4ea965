//! The handlers. Errors are `{"error": "..."}` with a status that says whose fault it
//! is: 400 bad input, 401 token, 404 unknown id or key, 409 a checkpoint already in
//! flight or no version to roll back to, 413 body too large, 307 to the owner of a key
//! (421 if `admin.peer_url` is unset), 502 the broker refused a publish, 503 job not ready
//! or busy, 504 no answer in time.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::AppState;
use crate::checkpoint::CheckpointRef;
use crate::control::RuleView;
use crate::history::SavepointRecord;
use crate::requests::{Reply, Request, SendError, StateAnswer};
use crate::rules::metrics::{RULE_MATCHES, RULE_OUTPUTS};
use crate::savepoint::{self, SavepointRequest};

pub(super) fn error(status: StatusCode, message: impl Into<String>) -> (StatusCode, Json<Value>) {
    (status, Json(json!({ "error": message.into() })))
}

type ApiResult = Result<Response, (StatusCode, Json<Value>)>;

pub(super) async fn not_found() -> impl IntoResponse {
    error(
        StatusCode::NOT_FOUND,
        "no such endpoint; see docs/admin-api.md",
    )
}

// ------------------------------------------------------------------ health and metrics

/// Process up and the poll loop turning; never asks the broker.
pub(super) async fn livez(State(s): State<AppState>) -> Response {
    let beat = s.control.heartbeat_ms.load(Ordering::Relaxed);
    if beat == 0 {
        return (StatusCode::OK, Json(json!({"status": "starting"}))).into_response();
    }
    let age_ms = now_ms().saturating_sub(beat);
    if age_ms > s.stall_limit.as_millis() as u64 {
        let msg = format!("the job loop has not turned for {}s", age_ms / 1000);
        return error(StatusCode::SERVICE_UNAVAILABLE, msg).into_response();
    }
    (StatusCode::OK, Json(json!({"status": "alive"}))).into_response()
}

/// State restored, partitions assigned, transaction open, not draining.
pub(super) async fn readyz(State(s): State<AppState>) -> Response {
    if s.control.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, Json(json!({"status": "ready"}))).into_response()
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready (starting, restoring or draining)",
        )
        .into_response()
    }
}

pub(super) async fn metrics_text(State(s): State<AppState>) -> impl IntoResponse {
    s.metrics
        .transaction_open_age
        .set(s.control.transactions.open_age().as_secs_f64());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

// ------------------------------------------------------------------ talking to the loop

/// Sends a request to the job loop and waits for its answer.
async fn ask<T>(
    s: &AppState,
    make: impl FnOnce(Reply<T>) -> Request,
) -> Result<T, (StatusCode, Json<Value>)> {
    if !s.control.ready.load(Ordering::SeqCst) {
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the job is not ready (starting, restoring or draining)",
        ));
    }
    let (tx, rx) = oneshot::channel();
    match s.control.requests.send(make(tx)) {
        Ok(()) => {}
        Err(SendError::Busy) => {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the job has too many requests waiting; retry",
            ));
        }
        Err(SendError::Gone) => {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the job loop has ended",
            ));
        }
    }
    match tokio::time::timeout(s.answer_timeout, rx).await {
        Err(_) => Err(error(
            StatusCode::GATEWAY_TIMEOUT,
            "no answer from the job loop in time",
        )),
        Ok(Err(_)) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the job loop ended before answering",
        )),
        Ok(Ok(Err(e))) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, e)),
        Ok(Ok(Ok(v))) => Ok(v),
    }
}

/// Holds the "checkpoint in flight" flag; released when the handler ends, even when the
/// client goes away.
struct Busy<'a>(&'a std::sync::atomic::AtomicBool);

impl<'a> Busy<'a> {
    fn take(s: &'a AppState) -> Result<Self, (StatusCode, Json<Value>)> {
        if s.busy.swap(true, Ordering::SeqCst) {
            return Err(error(
                StatusCode::CONFLICT,
                "a checkpoint or savepoint requested through the API is in flight",
            ));
        }
        Ok(Self(&s.busy))
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

// ------------------------------------------------------------------ checkpoints

pub(super) async fn trigger_checkpoint(State(s): State<AppState>) -> ApiResult {
    let _busy = Busy::take(&s)?;
    let record = ask(&s, |reply| Request::Checkpoint { reply }).await?;
    Ok((StatusCode::OK, Json(record)).into_response())
}

pub(super) async fn list_checkpoints(State(s): State<AppState>) -> Json<Value> {
    Json(json!(s.control.history.checkpoints()))
}

/// `{id}` is the numeric id or the name `chk-<n>-<run>`; anything else is 400.
pub(super) async fn get_checkpoint(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let wanted = match id.parse::<u64>() {
        Ok(n) => (n, None),
        Err(_) => match CheckpointRef::parse(&id) {
            Some(c) => (c.id, Some(c.to_string())),
            None => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "checkpoint id must be a number or chk-<n>-<run>",
                ));
            }
        },
    };
    match s.control.history.checkpoint(wanted.0) {
        Some(r) if wanted.1.as_ref().is_none_or(|name| *name == r.name) => {
            Ok(Json(r).into_response())
        }
        _ => Err(error(
            StatusCode::NOT_FOUND,
            format!("no checkpoint {id} in this run's history"),
        )),
    }
}

// ------------------------------------------------------------------ savepoints and stop

pub(super) async fn trigger_savepoint(State(s): State<AppState>, body: Bytes) -> ApiResult {
    let request: SavepointRequest = parse_body(&body)?;
    let target = match &request.target {
        Some(t) => Some(
            savepoint::validate_target(&s.config, t)
                .map_err(|e| error(StatusCode::BAD_REQUEST, e))?,
        ),
        None => None,
    };
    let _busy = Busy::take(&s)?;
    let record = ask(&s, |reply| Request::Savepoint { target, reply }).await?;
    Ok((StatusCode::OK, Json(record)).into_response())
}

/// Savepoints at the default location (any run) and those this run wrote elsewhere.
pub(super) async fn list_savepoints(State(s): State<AppState>) -> ApiResult {
    let config = s.config.clone();
    let stored = tokio::task::spawn_blocking(move || {
        let location = savepoint::default_location(&config)?;
        savepoint::list(&config, &location)
    })
    .await
    .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let mut all: Vec<SavepointRecord> = s.control.history.savepoints();
    for r in stored {
        if !all.iter().any(|h| h.id == r.id && h.location == r.location) {
            all.push(r);
        }
    }
    all.sort_by_key(|r| std::cmp::Reverse(r.created_at_ms));
    Ok(Json(all).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StopRequest {
    #[serde(default)]
    savepoint: bool,
    /// Stay up, idle and not ready, until SIGTERM (Kubernetes would restart an exited
    /// pod straight into processing; a rescale needs it to stay stopped).
    #[serde(default)]
    hold: bool,
}

/// Drains, commits the final checkpoint (after a savepoint when asked) and exits 0;
/// answers once that is done.
pub(super) async fn stop(State(s): State<AppState>, body: Bytes) -> ApiResult {
    let request: StopRequest = parse_body(&body)?;
    let _busy = Busy::take(&s)?;
    s.control
        .hold_after_stop
        .store(request.hold, Ordering::SeqCst);
    let savepoint = ask(&s, |reply| Request::Stop {
        savepoint: request.savepoint,
        reply,
    })
    .await?;
    Ok(Json(json!({ "stopped": true, "savepoint": savepoint })).into_response())
}

fn parse_body<T: Default + serde::de::DeserializeOwned>(
    body: &Bytes,
) -> Result<T, (StatusCode, Json<Value>)> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("request body: {e}")))
}

// ------------------------------------------------------------------ rules and state

/// A per-rule counter of the rule engine (`RULE_MATCHES`, `RULE_OUTPUTS`) by rule id.
fn by_rule(families: &[prometheus::proto::MetricFamily], name: &str) -> HashMap<String, u64> {
    families
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric())
        .filter_map(|m| {
            let id = m.get_label().iter().find(|l| l.name() == "rule")?;
            Some((id.value().to_string(), m.get_counter().get_value() as u64))
        })
        .collect()
}

/// Fills in a rule view's counts since start from the rule engine's counters.
struct RuleCounts {
    matches: HashMap<String, u64>,
    outputs: HashMap<String, u64>,
}

impl RuleCounts {
    fn gather(s: &AppState) -> Self {
        let families = s.metrics.registry().gather();
        Self {
            matches: by_rule(&families, RULE_MATCHES),
            outputs: by_rule(&families, RULE_OUTPUTS),
        }
    }

    fn fill(&self, view: &mut RuleView) {
        view.matches = self.matches.get(&view.id).copied().unwrap_or(0);
        view.outputs = self.outputs.get(&view.id).copied().unwrap_or(0);
    }
}

fn rule_view(s: &AppState, id: &str) -> Result<RuleView, (StatusCode, Json<Value>)> {
    let rules = s
        .control
        .rules
        .read()
        .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "rules view unavailable"))?;
    rules
        .get(id)
        .cloned()
        .ok_or_else(|| error(StatusCode::NOT_FOUND, format!("no rule {id:?}")))
}

/// The rules in force (and deleted ones, with the version that deleted them), without
/// their history.
pub(super) async fn rules(State(s): State<AppState>) -> ApiResult {
    let counts = RuleCounts::gather(&s);
    let rules = s
        .control
        .rules
        .read()
        .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "rules view unavailable"))?;
    let all: Vec<RuleView> = rules
        .values()
        .map(|r| {
            let mut view = RuleView {
                history: Vec::new(),
                ..r.clone()
            };
            counts.fill(&mut view);
            view
        })
        .collect();
    Ok(Json(all).into_response())
}

/// One rule with its version history.
pub(super) async fn rule(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let mut view = rule_view(&s, &id)?;
    RuleCounts::gather(&s).fill(&mut view);
    Ok(Json(view).into_response())
}

/// Republishes the previous version's body as the current version + 1 to the control
/// topic; every instance applies it from there. Answers once the broker has the record.
pub(super) async fn rollback_rule(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let view = rule_view(&s, &id)?;
    let body = view
        .rollback_body()
        .map_err(|e| error(StatusCode::CONFLICT, e.to_string()))?;
    let bytes = serde_json::to_vec(&body)
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let (partition, offset) = s.publisher.publish(&id, &bytes).await.map_err(|e| {
        tracing::warn!(rule = %id, error = %e, "rollback not published");
        error(StatusCode::BAD_GATEWAY, e.to_string())
    })?;
    let version = body.get("version").and_then(Value::as_u64);
    tracing::info!(rule = %id, from = view.version, ?version, partition, offset, "rollback published to the control topic");
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "id": id,
            "rolled_back_from": view.version,
            "version": version,
            "control_partition": partition,
            "control_offset": offset,
            "rule": body,
        })),
    )
        .into_response())
}

/// Publishes a rule (new, a new version, or `"status": "deleted"`) to the control topic,
/// as a person would with a Kafka producer; every instance applies it from there. The
/// body is checked first as the rule engine would check it, and its version must be above
/// the one this instance applied (a lower one would be ignored by every instance), so a
/// bad rule is refused here with the engine's reason instead of being rejected silently
/// downstream. Answers `202` once the broker has the record.
pub(super) async fn publish_rule(State(s): State<AppState>, body: Bytes) -> ApiResult {
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("request body: {e}")))?;
    let Some(id) = value.get("id").and_then(Value::as_str).map(str::to_string) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "rule: `id` must be a non-empty string",
        ));
    };
    let Some(version) = value.get("version").and_then(Value::as_u64) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "rule: `version` must be a non-negative integer",
        ));
    };
    let deleting = value.get("status").and_then(Value::as_str) == Some("deleted");
    if id.is_empty() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "rule: `id` must be a non-empty string",
        ));
    }
    if !deleting {
        crate::rules::spec::compile(&value)
            .map_err(|e| error(StatusCode::BAD_REQUEST, e.to_string()))?;
    }
    let current = s
        .control
        .rules
        .read()
        .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "rules view unavailable"))?
        .get(&id)
        .map(|r| r.version);
    if let Some(current) = current.filter(|c| version <= *c) {
        return Err(error(
            StatusCode::CONFLICT,
            format!(
                "rule {id:?} is at version {current}; publish version {} or above",
                current + 1
            ),
        ));
    }
    let bytes = serde_json::to_vec(&value)
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let (partition, offset) = s.publisher.publish(&id, &bytes).await.map_err(|e| {
        tracing::warn!(rule = %id, error = %e, "rule not published");
        error(StatusCode::BAD_GATEWAY, e.to_string())
    })?;
    tracing::info!(rule = %id, version, partition, offset, "rule published to the control topic");
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "id": id,
            "version": version,
            "control_partition": partition,
            "control_offset": offset,
        })),
    )
        .into_response())
}

/// This instance's transactional id and the open transaction.
pub(super) async fn transactions(State(s): State<AppState>) -> Json<Value> {
    Json(json!(s.control.transactions.view()))
}

/// Every state of one key, read by the job loop between two records.
/// `GET /state/{key}?redirect=false`: answer `421` with the owner's URL instead of `307`.
/// The console asks so: a browser follows a 307 itself, and a cross-origin one fails
/// under the console's `connect-src 'self'` without telling the page where it led.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StateQuery {
    #[serde(default = "yes")]
    redirect: bool,
}

fn yes() -> bool {
    true
}

pub(super) async fn key_state(
    State(s): State<AppState>,
    Path(key): Path<String>,
    query: Result<Query<StateQuery>, QueryRejection>,
) -> ApiResult {
    let Query(query) = query.map_err(|e| error(StatusCode::BAD_REQUEST, e.body_text()))?;
    if key.is_empty() || key.len() > s.config.job.max_key_bytes {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("key must be 1..={} bytes", s.config.job.max_key_bytes),
        ));
    }
    let answer = ask(&s, |reply| Request::State {
        key: key.clone(),
        reply,
    })
    .await?;
    match answer {
        StateAnswer::Found(state) => {
            let mut body = json!({ "key": key, "instance": s.config.job.instance });
            if let (Some(b), Value::Object(st)) = (body.as_object_mut(), state) {
                b.extend(st);
            }
            Ok(Json(body).into_response())
        }
        StateAnswer::NotFound => Err(error(
            StatusCode::NOT_FOUND,
            format!("no state for key {key:?}"),
        )),
        StateAnswer::NotOwned { key_group, owner } => {
            let message =
                format!("key {key:?} is in key group {key_group}, owned by instance {owner}");
            match s.config.peer_admin_url(owner) {
                // A redirect, not a proxy: the admin server stays free of outbound calls,
                // and clients (curl -L, browsers) follow it with the same method.
                Some(base) if query.redirect => {
                    let location =
                        format!("{base}/state/{}", utf8_percent_encode(&key, PATH_SEGMENT));
                    Ok((
                        StatusCode::TEMPORARY_REDIRECT,
                        [(header::LOCATION, location.clone())],
                        Json(json!({
                            "error": message,
                            "key_group": key_group,
                            "owner_instance": owner,
                            "owner_url": location,
                        })),
                    )
                        .into_response())
                }
                Some(base) => Ok((
                    StatusCode::MISDIRECTED_REQUEST,
                    Json(json!({
                        "error": message,
                        "key_group": key_group,
                        "owner_instance": owner,
                        "owner_url": format!("{base}/state/{}", utf8_percent_encode(&key, PATH_SEGMENT)),
                        "owner_admin_url": base,
                    })),
                )
                    .into_response()),
                None => Ok((
                    StatusCode::MISDIRECTED_REQUEST,
                    Json(json!({
                        "error": format!("{message}; set admin.peer_url to be redirected there"),
                        "key_group": key_group,
                        "owner_instance": owner,
                    })),
                )
                    .into_response()),
            }
        }
    }
}

/// Characters a key must not carry raw in one path segment of the owner's URL.
const PATH_SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\\')
    .add(b'^')
    .add(b'|');

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
