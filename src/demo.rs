//! `streamstate demo`: the whole job against librdkafka's in-process mock cluster.
//!
//! The mock cluster speaks the Kafka protocol well enough to show the job running, but it
//! does not filter aborted transactions for read_committed readers, so the demo shows the
//! moving parts, not the exactly-once guarantee (the integration tests on a real broker do).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::Rng;
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use streamstate::config::{
    AdminConfig, CheckpointConfig, Config, FunctionKind, JobConfig, KafkaConfig, StartOffsets,
    StateConfig,
};
use streamstate::job::Control;
use streamstate::metrics::Metrics;
use tracing::info;
use tracing_subscriber::filter::FilterFn;

const EVENTS_PER_SECOND: u64 = 2_000;

pub fn config(bootstrap: String, work: &std::path::Path, admin: SocketAddr) -> Config {
    Config {
        kafka: KafkaConfig {
            bootstrap_servers: bootstrap,
            app_id: "demo".into(),
            input_topics: vec!["events".into()],
            output_topic: "results".into(),
            control_topic: Some("rules".into()),
            dead_letter_topic: "events-dlq".into(),
            start_offsets: StartOffsets::Earliest,
            transaction_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            properties: Default::default(),
            consumer_properties: Default::default(),
            producer_properties: Default::default(),
        },
        job: JobConfig {
            key: "/user_id".into(),
            max_record_bytes: 1 << 20,
            max_key_bytes: 4096,
            instance: 0,
            instances: 1,
            repartition: false,
            function: FunctionKind::Rules,
            timestamp: None,
            max_out_of_orderness: Duration::from_secs(5),
            max_event_time_skew: None,
            idle_timeout: None,
            state_ttl: None,
            guarantee: Default::default(),
            format: Default::default(),
            output_format: Default::default(),
        },
        state: StateConfig {
            dir: work.join("state"),
            ..StateConfig::default()
        },
        checkpoint: CheckpointConfig {
            storage: format!("file://{}", work.join("checkpoints").display()),
            ..CheckpointConfig::default()
        },
        admin: AdminConfig {
            listen: admin,
            ..AdminConfig::default()
        },
        schema_registry: None,
        avro: Default::default(),
        protobuf: Default::default(),
    }
}

/// Starts the mock cluster and the event generator; returns the cluster (keep it alive).
pub fn start_cluster()
-> anyhow::Result<MockCluster<'static, rdkafka::producer::DefaultProducerContext>> {
    let cluster = MockCluster::new(1).context("starting librdkafka's mock cluster")?;
    for (topic, partitions) in [
        ("events", 4),
        ("results", 4),
        ("alerts", 1),
        ("events-dlq", 1),
        ("rules", 1),
    ] {
        cluster
            .create_topic(topic, partitions, 1)
            .with_context(|| format!("creating topic {topic}"))?;
    }
    publish_rules(&cluster.bootstrap_servers())?;
    Ok(cluster)
}

/// One rule of each kind, published before the job starts (it reads the control topic
/// to its end before any input). `rules/*.json` under docs show more.
pub const DEMO_RULES: &[(&str, &str)] = &[
    (
        "events-per-user",
        r#"{"id":"events-per-user","version":1,"kind":"aggregate","aggregate":{"fn":"count","emit":"every_event"}}"#,
    ),
    (
        "big-spender",
        r#"{"id":"big-spender","version":1,"filter":{"field":"/type","eq":"pay"},"kind":"aggregate",
            "aggregate":{"fn":"sum","field":"/amount","window":{"type":"tumbling","size":"10s"},
                         "having":{"gt":1500},"emit":"on_match"},"output_topic":"alerts"}"#,
    ),
    (
        "first-event-id",
        r#"{"id":"first-event-id","version":1,"kind":"dedup","dedup":{"field":"/event_id","ttl":"1m"}}"#,
    ),
    (
        "login-then-pay",
        r#"{"id":"login-then-pay","version":1,"kind":"sequence",
            "sequence":{"steps":[{"field":"/type","eq":"login"},{"field":"/type","eq":"pay"}],"within":"30s"},
            "output_topic":"alerts"}"#,
    ),
    (
        "odd-amount",
        r#"{"id":"odd-amount","version":1,"kind":"anomaly",
            "anomaly":{"field":"/amount","model":"welford","z_gt":2.5,"min_samples":20},"output_topic":"alerts"}"#,
    ),
];

fn publish_rules(bootstrap: &str) -> anyhow::Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    for (id, rule) in DEMO_RULES {
        producer
            .send(BaseRecord::to("rules").key(*id).payload(*rule))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(10))?;
    Ok(())
}

/// Produces sample events (1% of them garbage) at a steady rate until shutdown.
pub fn generate(bootstrap: String, control: Arc<Control>) -> anyhow::Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "5")
        .create()?;
    let mut rng = rand::rng();
    let started = Instant::now();
    let mut sent: u64 = 0;
    let actions = ["login", "view", "add_to_cart", "pay", "logout"];
    while !control.shutdown.load(Ordering::SeqCst) {
        let target = started.elapsed().as_millis() as u64 * EVENTS_PER_SECOND / 1000;
        while sent < target {
            let user = format!("user-{}", rng.random_range(0..200));
            let payload = if rng.random_ratio(1, 100) {
                "{this is not json".to_string()
            } else {
                let action = actions[rng.random_range(0..actions.len())];
                let amount = if rng.random_ratio(1, 200) {
                    rng.random_range(2_000..5_000)
                } else {
                    rng.random_range(1..500)
                };
                // 1% re-sends of an earlier event id, for the dedup rule.
                let id = if sent > 0 && rng.random_ratio(1, 100) {
                    rng.random_range(0..sent)
                } else {
                    sent
                };
                format!(
                    r#"{{"user_id":"{user}","type":"{action}","amount":{amount},"event_id":"e{id}"}}"#
                )
            };
            let record = BaseRecord::to("events")
                .key(user.as_str())
                .payload(payload.as_str());
            if let Err((e, _)) = producer.send(record) {
                tracing::warn!(error = %e, "demo generator could not queue an event");
                break;
            }
            sent += 1;
        }
        producer.poll(Duration::from_millis(20));
    }
    producer.flush(Duration::from_secs(5))?;
    Ok(())
}

/// The demo's log filter on top of `RUST_LOG`: it drops the job's `checkpoint completed`
/// line (the event that carries `snapshot_ms`), which the demo's one-second interval would
/// print every second and bury the progress line under; the console's Checkpoints page and
/// `GET /checkpoints` show every checkpoint instead. Failures still log.
pub fn quiet_checkpoints() -> FilterFn<fn(&tracing::Metadata<'_>) -> bool> {
    fn keep(m: &tracing::Metadata<'_>) -> bool {
        !(m.is_event()
            && m.target() == "streamstate::job"
            && *m.level() == tracing::Level::INFO
            && m.fields().field("snapshot_ms").is_some())
    }
    FilterFn::new(keep as fn(&tracing::Metadata<'_>) -> bool)
}

/// Prints what the job is doing every few seconds, from the same metrics `/metrics` serves.
pub fn report(metrics: Metrics, control: Arc<Control>, admin: SocketAddr) {
    let every = Duration::from_secs(5);
    let mut next = Instant::now() + every;
    info!(
        "demo running: open the console at http://{admin}/ (or `curl -s http://{admin}/metrics | grep streamstate_records`)"
    );
    while !control.shutdown.load(Ordering::SeqCst) {
        std::thread::park_timeout(Duration::from_millis(200));
        if Instant::now() < next {
            continue;
        }
        next += every;
        let sum = Metrics::total;
        info!(
            consumed = sum(&metrics.records_consumed),
            produced = sum(&metrics.records_produced),
            dead_lettered = sum(&metrics.records_dead_lettered),
            checkpoints = metrics.checkpoints_completed.get(),
            rules = metrics.rules_active.get(),
            "demo progress"
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_demo_rule_compiles() {
        for (id, rule) in super::DEMO_RULES {
            let value: serde_json::Value =
                serde_json::from_str(rule).unwrap_or_else(|e| panic!("{id}: {e}"));
            assert_eq!(value["id"], *id);
            streamstate::rules::spec::compile(&value).unwrap_or_else(|e| panic!("{id}: {e}"));
        }
    }
}
