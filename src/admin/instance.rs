//! `GET /instance`: who this instance is and what it owns, for the console's overview
//! (and for a person with curl). Read from the config, the metrics the job loop keeps
//! and the key groups it published at start; it never asks the loop.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::AppState;

/// The gauge the job sets for every input partition it consumes.
const LAG: &str = "streamstate_consumer_lag_records";

pub(super) async fn instance(State(s): State<AppState>) -> Json<Value> {
    let c = &s.config;
    let partitions = owned_partitions(&s);
    let key_groups = s.control.key_groups.lock().ok().and_then(|g| *g);
    Json(json!({
        "app_id": c.kafka.app_id,
        "instance": c.job.instance,
        "instances": c.job.instances,
        "version": env!("CARGO_PKG_VERSION"),
        "function": c.job.function,
        "backend": c.state.backend,
        "input_topics": c.kafka.input_topics,
        "output_topic": c.kafka.output_topic,
        "dead_letter_topic": c.kafka.dead_letter_topic,
        "control_topic": c.kafka.control_topic,
        "checkpoint_interval_ms": c.checkpoint.interval.as_millis() as u64,
        "transaction_timeout_ms": c.kafka.transaction_timeout.as_millis() as u64,
        "token_required": s.token.is_some(),
        "ready": s.control.ready.load(std::sync::atomic::Ordering::SeqCst),
        "partitions": partitions
            .iter()
            .map(|(t, p)| json!({"topic": t, "partition": p}))
            .collect::<Vec<_>>(),
        "key_groups": key_groups.map(|(range, numbering)| json!({
            "first": range.start,
            "last": range.end,
            "max_parallelism": numbering.max_parallelism(),
            "aligned_partitions": numbering.aligned_partitions(),
        })),
    }))
}

/// (topic, partition) pairs the job reports lag for: the partitions it consumes (empty
/// until its first poll).
fn owned_partitions(s: &AppState) -> BTreeSet<(String, i32)> {
    s.metrics
        .registry()
        .gather()
        .iter()
        .filter(|f| f.name() == LAG)
        .flat_map(|f| f.get_metric())
        .filter_map(|m| {
            let label = |n: &str| {
                m.get_label()
                    .iter()
                    .find(|l| l.name() == n)
                    .map(|l| l.value().to_string())
            };
            Some((label("topic")?, label("partition")?.parse().ok()?))
        })
        .collect()
}
