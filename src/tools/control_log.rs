//! The control topic read from its beginning to its end, judged the way the job judges
//! it: which rule versions are in force, which records were ignored or refused.
//!
//! The verdict is not reimplemented here: every record goes through the runtime's own
//! [`crate::control::Rules`] (versioning, tombstones, `"status": "deleted"`, bad records)
//! on a throw-away in-memory store, and, when the job runs the rule engine, through the
//! engine's parser like `process_broadcast_element` does. So `rules list` shows what a
//! job that has read the whole topic holds, and `rules publish` compares against that.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;
use streamstate_state::{BackendKind, StateStore, StoreConfig};

use super::cluster_client::{ClientError, ClusterClient};
use crate::config::{Config, FunctionKind};
use crate::control::{RuleOutcome, RuleView, Rules, RulesView};
use crate::kafka_client::{Role, client_config};
use crate::kafka_log::LogContext;
use crate::rules::spec;

#[derive(Debug, thiserror::Error)]
pub enum ControlLogError {
    #[error("kafka.control_topic is not set in the config: the job reads no rules")]
    NoControlTopic,
    #[error(
        "kafka.control_topic: topic `{0}` does not exist (`streamstate topics create` creates it)"
    )]
    MissingTopic(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("reading the control topic `{topic}`: {source}")]
    Kafka {
        topic: String,
        source: rdkafka::error::KafkaError,
    },
    #[error(
        "reading the control topic `{topic}`: no progress for {timeout:?} before its end offsets {ends:?} (an open transaction?)"
    )]
    Stalled {
        topic: String,
        timeout: Duration,
        ends: BTreeMap<i32, i64>,
    },
    #[error("a scratch store for reading the control topic: {0}")]
    Scratch(String),
}

/// A control record the job does not put in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub partition: i32,
    pub offset: i64,
    pub id: Option<String>,
    pub why: String,
}

/// What the control topic holds.
#[derive(Debug)]
pub struct InForce {
    pub topic: String,
    /// Every rule id seen, deleted ones included (status `deleted`).
    pub rules: BTreeMap<String, RuleView>,
    pub skipped: Vec<Skipped>,
    pub records: u64,
}

impl InForce {
    /// The rule with this id when it is in force (not deleted).
    pub fn active(&self, id: &str) -> Option<&RuleView> {
        self.rules.get(id).filter(|r| r.status != "deleted")
    }
}

/// Reads `kafka.control_topic` to the end offsets it has now.
pub fn read(config: &Config, client: &ClusterClient) -> Result<InForce, ControlLogError> {
    let topic = config
        .kafka
        .control_topic
        .clone()
        .ok_or(ControlLogError::NoControlTopic)?;
    let partitions = client
        .topics()?
        .get(&topic)
        .map(|i| i.partitions)
        .ok_or_else(|| ControlLogError::MissingTopic(topic.clone()))?;
    let kafka = |source| ControlLogError::Kafka {
        topic: topic.clone(),
        source,
    };
    let mut cc = client_config(config, Role::Shared, &[]);
    // No group offsets are ever committed: the group id only satisfies the client.
    cc.set("group.id", format!("{}-rules-cli", config.kafka.app_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed");
    let consumer: BaseConsumer<LogContext> = cc
        .create_with_context(LogContext::default())
        .map_err(kafka)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in 0..partitions as i32 {
        let (low, high) = consumer
            .fetch_watermarks(&topic, p, client.timeout)
            .map_err(kafka)?;
        if high > low {
            ends.insert(p, high);
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .map_err(kafka)?;
        }
    }
    let scratch = tempfile::Builder::new()
        .prefix("streamstate-rules-")
        .tempdir()
        .map_err(|e| ControlLogError::Scratch(e.to_string()))?;
    let store = StateStore::open(StoreConfig::new(BackendKind::Hashmap, scratch.path(), 1))
        .map_err(|e| ControlLogError::Scratch(e.to_string()))?;
    let rules = Rules::new(&store, RulesView::default());
    let mut skipped = Vec::new();
    let mut records = 0;
    if !ends.is_empty() {
        consumer.assign(&tpl).map_err(kafka)?;
    }
    let mut progress = Instant::now();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    while ends
        .iter()
        .any(|(p, end)| next.get(p).is_none_or(|n| n < end))
    {
        if progress.elapsed() > client.timeout {
            return Err(ControlLogError::Stalled {
                topic,
                timeout: client.timeout,
                ends,
            });
        }
        // Transaction markers take offsets but are never delivered: the position says
        // how far the consumer really is.
        if let Ok(pos) = consumer.position() {
            for e in pos.elements_for_topic(&topic) {
                if let Offset::Offset(o) = e.offset() {
                    let n = next.entry(e.partition()).or_insert(o);
                    *n = (*n).max(o);
                }
            }
        }
        let Some(m) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.map_err(kafka)?;
        progress = Instant::now();
        records += 1;
        next.insert(m.partition(), m.offset() + 1);
        let at_ms = m.timestamp().to_millis().map_or(0, |t| t.max(0) as u64);
        let prepared = rules
            .prepare(m.key(), m.payload(), m.partition(), m.offset(), at_ms)
            .map_err(|e| ControlLogError::Scratch(e.to_string()))?;
        let skip = |id: Option<String>, why: String| Skipped {
            partition: m.partition(),
            offset: m.offset(),
            id,
            why,
        };
        match prepared {
            Ok(candidate) => {
                let refusal = match (&candidate.body, config.job.function) {
                    (Some(body), FunctionKind::Rules) => {
                        engine_refusal(body, &candidate.id, candidate.version())
                    }
                    _ => None,
                };
                match refusal {
                    Some(why) => skipped.push(skip(Some(candidate.id.clone()), why)),
                    None => {
                        rules
                            .commit(candidate)
                            .map_err(|e| ControlLogError::Scratch(e.to_string()))?;
                    }
                }
            }
            Err(RuleOutcome::Ignored {
                id,
                version,
                applied,
            }) => skipped.push(skip(
                Some(id),
                format!("version {version} ignored: not above {applied}"),
            )),
            Err(RuleOutcome::Rejected(r)) => {
                let id = m
                    .key()
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .map(str::to_string);
                skipped.push(skip(id, format!("{r} ({})", r.reason())));
            }
            Err(_) => {}
        }
    }
    let view = rules.view();
    let rules = view.read().map(|v| v.clone()).unwrap_or_default();
    Ok(InForce {
        topic,
        rules,
        skipped,
        records,
    })
}

/// Why the rule engine would refuse this update (as `process_broadcast_element` does).
fn engine_refusal(body: &Value, id: &str, version: u64) -> Option<String> {
    match spec::compile(body) {
        Ok(rule) if rule.id != id || rule.version != version => Some(format!(
            "id/version in the body ({}, {}) differ from the record's ({id}, {version})",
            rule.id, rule.version
        )),
        Ok(_) => None,
        Err(e) => Some(format!(
            "refused by the rule engine: {} ({})",
            e.message, e.reason
        )),
    }
}
