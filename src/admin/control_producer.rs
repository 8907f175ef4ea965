//! The admin server's own producer to the control topic, for `POST /rules/{id}/rollback`.
//!
//! A rollback is an ordinary control-topic publish: every instance (this one included)
//! applies it from the topic like any rule update, so the job loop and its transaction
//! are never involved and never blocked. The producer is idempotent, not transactional
//! (a publish is one record; a retried request may publish twice, and the second copy is
//! ignored as not newer), and is created on first use so instances that never roll back
//! hold no extra connection. It uses `partitioner = murmur2_random`, the Java client's
//! choice, so the rule id lands on the partition other publishers keyed by id use.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::config::Config;
use crate::kafka_client::{self, Role};

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("kafka.control_topic is not set: there are no rules to roll back")]
    NoControlTopic,
    #[error("creating the control-topic producer: {0}")]
    Create(KafkaError),
    #[error("publishing to the control topic: {0}")]
    Send(KafkaError),
}

pub struct ControlProducer {
    config: Arc<Config>,
    producer: Mutex<Option<FutureProducer>>,
    /// Delivery timeout of one publish.
    timeout: Duration,
}

impl ControlProducer {
    pub fn new(config: Arc<Config>) -> Self {
        let timeout = config.kafka.connect_timeout;
        Self {
            config,
            producer: Mutex::new(None),
            timeout,
        }
    }

    fn producer(&self) -> Result<FutureProducer, PublishError> {
        let mut slot = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        // Connection and security settings only: producer_properties may tune the job's
        // transactional producer in ways that do not fit a one-record publisher.
        let mut cc = kafka_client::client_config(&self.config, Role::Shared, &[]);
        cc.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set(
                "message.timeout.ms",
                self.timeout.as_millis().max(1).to_string(),
            );
        let p: FutureProducer = cc.create().map_err(PublishError::Create)?;
        *slot = Some(p.clone());
        Ok(p)
    }

    /// Publishes `body` keyed by `id`; returns the record's partition and offset once the
    /// broker acknowledged it.
    pub async fn publish(&self, id: &str, body: &[u8]) -> Result<(i32, i64), PublishError> {
        let topic = self
            .config
            .kafka
            .control_topic
            .as_deref()
            .ok_or(PublishError::NoControlTopic)?;
        let producer = self.producer()?;
        let record = FutureRecord::to(topic).key(id).payload(body);
        producer
            .send(record, self.timeout)
            .await
            .map(|d| (d.partition, d.offset))
            .map_err(|(e, _)| PublishError::Send(e))
    }
}
