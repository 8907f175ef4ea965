//! `GET /instance`: who this instance is and what it owns, for the console's overview
//! (and for a person with curl). Read from the config and the metrics the job loop
//! keeps; it never asks the loop.

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
    let key_groups = key_groups(
        c.state.max_parallelism,
        c.job.instances,
        c.job.instance,
        c.job.repartition,
        &partitions,
        &c.kafka.input_topics,
    );
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
        "key_groups": key_groups.map(|(first, last)| json!({"first": first, "last": last})),
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

/// The key-group range as the job derives it (`src/cluster.rs`): with several instances
/// and keyed input, key group = partition, so the range is the owned partitions of one
/// input topic; one instance owns all `max_parallelism` key groups (default: every input
/// partition). `None` when it cannot be told from here (repartition mode without a
/// configured `max_parallelism`, or before the first poll).
fn key_groups(
    max_parallelism: Option<u32>,
    instances: u32,
    instance: u32,
    repartition: bool,
    partitions: &BTreeSet<(String, i32)>,
    inputs: &[String],
) -> Option<(u32, u32)> {
    if let Some(mp) =
        max_parallelism.filter(|mp| instances > 0 && *mp >= instances && instance < instances)
    {
        let r = streamstate_state::KeyGroupRange::for_instance(mp, instances, instance);
        return Some((r.start, r.end));
    }
    if repartition {
        return None;
    }
    let input: Vec<i32> = partitions
        .iter()
        .filter(|(t, _)| inputs.iter().any(|i| i == t))
        .map(|(_, p)| *p)
        .collect();
    if instances == 1 {
        let n = input.len() as u32;
        return (n > 0).then(|| (0, n - 1));
    }
    let first = inputs.first()?;
    let mine: Vec<u32> = partitions
        .iter()
        .filter(|(t, _)| t == first)
        .map(|(_, p)| *p as u32)
        .collect();
    Some((*mine.first()?, *mine.last()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(v: &[(&str, i32)]) -> BTreeSet<(String, i32)> {
        v.iter().map(|(t, p)| (t.to_string(), *p)).collect()
    }

    #[test]
    fn key_groups_follow_the_jobs_ownership_rules() {
        let inputs = vec!["in".to_string()];
        // One instance: every key group, one per input partition.
        let all = parts(&[("in", 0), ("in", 1), ("in", 2), ("in", 3)]);
        assert_eq!(key_groups(None, 1, 0, false, &all, &inputs), Some((0, 3)));
        // Several instances: key group = partition.
        let mine = parts(&[("in", 2), ("in", 3)]);
        assert_eq!(key_groups(None, 2, 1, false, &mine, &inputs), Some((2, 3)));
        // Configured: Flink's range for the instance.
        assert_eq!(
            key_groups(Some(128), 3, 1, true, &mine, &inputs),
            Some((43, 85))
        );
        // Not knowable from here.
        assert_eq!(key_groups(None, 2, 0, true, &mine, &inputs), None);
        assert_eq!(
            key_groups(None, 1, 0, false, &BTreeSet::new(), &inputs),
            None
        );
    }
}
