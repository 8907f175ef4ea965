//! The transactional Kafka producer: one transaction per checkpoint epoch.
//!
//! Every error here that is not a full local queue ends the epoch: the caller exits and
//! the restart restores the last committed checkpoint. Retrying a failed transaction
//! in place is how duplicates are born, so this module never does.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::config::Config;
use crate::kafka_log::LogContext;

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("kafka producer: {0}")]
    Kafka(#[from] KafkaError),
    #[error("this instance was fenced by a newer one with transactional.id `{0}`: exiting")]
    Fenced(String),
}

pub struct Sink {
    producer: BaseProducer<LogContext>,
    transactional_id: String,
    timeout: Duration,
}

impl Sink {
    /// Creates the producer and fences any older instance with the same transactional id.
    pub fn new(config: &Config) -> Result<Self, SinkError> {
        let mut cc = ClientConfig::new();
        for (k, v) in config.kafka.properties.iter().chain(&config.kafka.producer_properties) {
            cc.set(k, v);
        }
        let transactional_id = config.transactional_id();
        cc.set("bootstrap.servers", &config.kafka.bootstrap_servers)
            .set("transactional.id", &transactional_id)
            .set("enable.idempotence", "true")
            .set("transaction.timeout.ms", config.kafka.transaction_timeout.as_millis().to_string())
            .set("linger.ms", "5");
        let producer: BaseProducer<LogContext> = cc.create_with_context(LogContext::default())?;
        let sink = Self { producer, transactional_id, timeout: config.kafka.transaction_timeout };
        sink.producer.init_transactions(sink.timeout).map_err(|e| sink.classify(e))?;
        Ok(sink)
    }

    pub fn begin(&self) -> Result<(), SinkError> {
        self.producer.begin_transaction().map_err(|e| self.classify(e))
    }

    /// Queues one record; waits for queue space rather than dropping anything.
    pub fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        headers: Option<OwnedHeaders>,
    ) -> Result<(), SinkError> {
        let mut record = BaseRecord::<[u8], [u8]>::to(topic).payload(payload);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(h) = headers {
            record = record.headers(h);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => return Err(self.classify(e)),
            }
        }
    }

    /// Serves delivery callbacks; call often so the queue drains.
    pub fn poll(&self) {
        self.producer.poll(Duration::ZERO);
    }

    /// Makes offsets part of the open transaction, then commits. This is the one atomic
    /// decision point: outputs, offsets and the named checkpoint become true together.
    pub fn commit(
        &self,
        offsets: &rdkafka::TopicPartitionList,
        group: &ConsumerGroupMetadata,
    ) -> Result<(), SinkError> {
        self.producer.send_offsets_to_transaction(offsets, group, self.timeout).map_err(|e| self.classify(e))?;
        self.producer.commit_transaction(self.timeout).map_err(|e| self.classify(e))
    }

    fn classify(&self, e: KafkaError) -> SinkError {
        let fenced = matches!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
        );
        if fenced { SinkError::Fenced(self.transactional_id.clone()) } else { SinkError::Kafka(e) }
    }
}
