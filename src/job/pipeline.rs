//! Record routing: each consumed record to the process function, the control topic's to
//! the rules, repartition mode's to the internal topic, and bad ones to the dead-letter
//! topic, all inside the open epoch's transaction.

use std::time::{SystemTime, UNIX_EPOCH};

use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use tracing::{info, warn};

use super::JobError;
use crate::config::{Config, FunctionKind};
use crate::control::{RuleOutcome, Rules};
use crate::decode::{DecodeError, Decoder, Event};
use crate::driver::Driver;
use crate::format::avro::{AvroEncoder, EncodeError};
use crate::function::{BroadcastUpdate, OutputRecord, SourceRef, Upcoming};
use crate::metrics::Metrics;
use crate::repartition;
use crate::sink::Sink;
use crate::source::{self, Offsets};

use super::counters::RecordCounters;

/// Everything downstream of the consumer; split from [`super::Job`] so a message borrowed from
/// the consumer can be handled without copying it.
pub(super) struct Pipeline {
    pub(super) config: Config,
    pub(super) metrics: Metrics,
    pub(super) counters: RecordCounters,
    pub(super) decoder: Decoder,
    /// `job.output_format = "avro"`: outputs are encoded with their topic's schema.
    pub(super) encoder: Option<AvroEncoder>,
    /// The producer pool; records go to the open epoch's producer.
    pub(super) sink: Sink,
    pub(super) state: Driver,
    pub(super) offsets: Offsets,
    /// Present when `kafka.control_topic` is set.
    pub(super) rules: Option<Rules>,
    pub(super) control_offsets: Offsets,
    /// Repartition mode: the internal topic (hop 2 reads it; every other input is hop 1).
    pub(super) repartition: Option<String>,
    /// Records handled since start (input and control): with the timers fired, what
    /// tells a barrier whether anything changed since the last one.
    pub(super) handled: u64,
}

/// At most this many records are handled as one batch: the state they read is fetched
/// together ([`Driver::begin_batch`]). Smaller than Kafka's `max.poll.records` (500):
/// a batch's decoded events are all alive until it ends, and on S 64 ran ahead of 500
/// in each of three interleaved pairs (bench/README.md, "Batched state reads"). A batch
/// never spans a barrier, so it also bounds how late a due checkpoint starts.
pub(super) const MAX_BATCH_RECORDS: usize = 64;

impl Pipeline {
    /// One record on its own (the control topic's catch-up).
    pub(super) fn handle(&mut self, msg: &BorrowedMessage<'_>) -> Result<(), JobError> {
        self.handle_batch(std::slice::from_ref(msg))
    }

    /// A batch of polled records, in order, with the timers due after each. Input records
    /// are decoded first so the function can name the state the batch will read; the
    /// rest is per record. An error ends the batch where it happened (the caller rewinds,
    /// and the records after it are read again).
    pub(super) fn handle_batch(&mut self, msgs: &[BorrowedMessage<'_>]) -> Result<(), JobError> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut decoded: Vec<Option<Result<Event, DecodeError>>> = Vec::with_capacity(msgs.len());
        for msg in msgs {
            let d = self
                .takes_decoded(msg)
                .then(|| self.decoder.decode_at(msg.payload(), now_ms));
            let registry_away = matches!(&d, Some(Err(e)) if e.is_transient());
            decoded.push(d);
            // Each decode would wait out the registry's retries again, and handling stops
            // at this record anyway (the epochs rewind): leave the rest undecoded.
            if registry_away {
                break;
            }
        }
        let msgs = &msgs[..decoded.len()];
        let upcoming: Vec<Upcoming<'_>> = msgs
            .iter()
            .zip(&decoded)
            .filter(|(msg, _)| !self.forwards(msg.topic()))
            .filter_map(|(_, d)| match d {
                Some(Ok(e)) => Some(Upcoming {
                    key: &e.key,
                    value: &e.value,
                }),
                _ => None,
            })
            .collect();
        let read = self.state.begin_batch(&upcoming);
        drop(upcoming);
        let handled = read.map_err(JobError::from).and_then(|()| {
            for (msg, decoded) in msgs.iter().zip(decoded) {
                self.handle_one(msg, decoded)?;
                self.fire_timers()?;
            }
            Ok(())
        });
        // The state the records before an error wrote is written too, as it was with
        // writes going straight to the backend.
        let ended = self.state.end_batch().map_err(JobError::from);
        if let (Err(_), Err(e)) = (&handled, &ended) {
            warn!(error = %e, "the failed batch's state writes failed too");
        }
        handled.and(ended)
    }

    /// Whether a record of this topic reaches the decoder: every input but the control
    /// topic's, unless the job passes records through untouched.
    fn takes_decoded(&self, msg: &BorrowedMessage<'_>) -> bool {
        self.config.kafka.control_topic.as_deref() != Some(msg.topic())
            && self.config.job.function != FunctionKind::Passthrough
    }

    /// Repartition mode's hop 1: a record of this topic goes to the internal topic, not
    /// to the function.
    fn forwards(&self, topic: &str) -> bool {
        self.repartition
            .as_deref()
            .is_some_and(|internal| internal != topic)
    }

    /// One record; `decoded` is its value when [`Self::takes_decoded`].
    fn handle_one(
        &mut self,
        msg: &BorrowedMessage<'_>,
        decoded: Option<Result<Event, DecodeError>>,
    ) -> Result<(), JobError> {
        self.handled += 1;
        let (topic, partition, offset) = (msg.topic(), msg.partition(), msg.offset());
        if self.config.kafka.control_topic.as_deref() == Some(topic) {
            self.handle_control(msg)?;
            source::advance(&mut self.control_offsets, topic, partition, offset + 1);
            return Ok(());
        }
        self.counters.consumed(topic, partition);
        let Some(decoded) = decoded else {
            self.pass_through(msg)?;
            source::advance(&mut self.offsets, topic, partition, offset + 1);
            return Ok(());
        };
        let hop2 = self.repartition.as_deref() == Some(topic);
        // A forwarded record names its original input, so functions and dead letters see
        // where it was first written, not the internal topic.
        let source = hop2
            .then(|| repartition::origin(msg.headers()))
            .flatten()
            .unwrap_or_else(|| SourceRef {
                topic: topic.to_string(),
                partition,
                offset,
            });
        match decoded {
            Ok(event) if self.forwards(topic) => {
                self.forward(msg, &event.key, &source)?;
            }
            Ok(event) => {
                let (records, rejection) = self.state.element_from(
                    (topic, partition),
                    &event.key,
                    &event.value,
                    event.timestamp_ms,
                    &source,
                )?;
                // An output its schema cannot hold dead-letters the input that caused
                // it (none of its outputs is written); its state change stays.
                let rejection = match self.encode(records) {
                    Ok(encoded) => {
                        self.send_encoded(encoded)?;
                        rejection
                    }
                    Err(EncodeError::Mismatch { topic, reason }) => {
                        Some(crate::function::Rejection {
                            reason: "output_schema_mismatch",
                            message: format!(
                                "output for topic {topic} does not fit its Avro schema: {reason}"
                            ),
                        })
                    }
                    Err(EncodeError::Registry(e)) => return Err(JobError::Registry(e.to_string())),
                };
                if let Some(r) = rejection {
                    self.dead_letter(msg, &source, r.reason, &r.message)?;
                    self.count_dead_letter(topic, partition, r.reason);
                }
            }
            // The registry is away: the record is not consumed, and the epoch is aborted
            // and replayed from the last checkpoint once it answers again.
            Err(err) if err.is_transient() => return Err(JobError::Registry(err.to_string())),
            Err(err) => {
                self.dead_letter(msg, &source, err.reason(), &err.to_string())?;
                self.count_dead_letter(topic, partition, err.reason());
            }
        }
        source::advance(&mut self.offsets, topic, partition, offset + 1);
        crash_point!("mid-batch");
        Ok(())
    }

    fn count_dead_letter(&self, topic: &str, partition: i32, reason: &str) {
        self.metrics
            .records_dead_lettered
            .with_label_values(&[topic, &partition.to_string(), reason])
            .inc();
    }

    /// A control record: the runtime checks the version, the function accepts or refuses
    /// the update, and only an accepted one is put in force.
    fn handle_control(&mut self, msg: &BorrowedMessage<'_>) -> Result<(), JobError> {
        let Some(rules) = &self.rules else {
            return Ok(());
        };
        let (partition, offset) = (msg.partition(), msg.offset());
        let from = SourceRef {
            topic: msg.topic().to_string(),
            partition,
            offset,
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let outcome = match rules.prepare(msg.key(), msg.payload(), partition, offset, now_ms)? {
            Err(outcome) => outcome,
            Ok(candidate) => {
                let update = BroadcastUpdate {
                    id: &candidate.id,
                    version: candidate.version(),
                    body: candidate.body.as_ref(),
                    source: &from,
                };
                let (records, refused) = self.state.broadcast(&update)?;
                match refused {
                    Some(r) => {
                        let version = candidate.version();
                        RuleOutcome::Refused {
                            id: candidate.id,
                            version,
                            reason: r.reason,
                            message: r.message,
                        }
                    }
                    None => {
                        self.send(records)?;
                        rules.commit(candidate)?
                    }
                }
            }
        };
        let label = match &outcome {
            RuleOutcome::Applied { id, version } => {
                info!(rule = %id, version, "rule applied");
                "applied"
            }
            RuleOutcome::Deleted { id } => {
                info!(rule = %id, "rule deleted");
                "deleted"
            }
            RuleOutcome::Ignored {
                id,
                version,
                applied,
            } => {
                info!(rule = %id, version, applied, "rule update ignored: not newer than the applied version");
                "ignored"
            }
            RuleOutcome::Rejected(why) => {
                warn!(partition, offset, reason = why.reason(), error = %why, "rule rejected; the last good version stays");
                self.dead_letter(msg, &from, why.reason(), &why.to_string())?;
                "rejected"
            }
            RuleOutcome::Refused {
                id,
                version,
                reason,
                message,
            } => {
                warn!(rule = %id, version, reason, error = %message, "rule rejected; the last good version stays");
                self.dead_letter(msg, &from, reason, message)?;
                "rejected"
            }
        };
        self.metrics.rule_updates.with_label_values(&[label]).inc();
        self.metrics.rules_active.set(rules.active() as i64);
        Ok(())
    }

    /// Hop 1 of repartition mode: the original bytes, headers and timestamp go to the
    /// internal partition of the key's key group, in the epoch's transaction.
    fn forward(
        &self,
        msg: &BorrowedMessage<'_>,
        key: &str,
        source: &SourceRef,
    ) -> Result<(), JobError> {
        let Some(internal) = &self.repartition else {
            return Ok(());
        };
        let key_group = self.state.store().key_group_of(key.as_bytes());
        self.sink.send_to_partition(
            internal,
            key_group as i32,
            key.as_bytes(),
            msg.payload().unwrap_or_default(),
            repartition::forward_headers(msg.headers(), source),
            msg.timestamp().to_millis(),
        )?;
        self.counters.produced(internal);
        Ok(())
    }

    /// Timers that came due (processing time now, event time up to the watermark).
    pub(super) fn fire_timers(&mut self) -> Result<(), JobError> {
        let records = self.state.fire_timers()?;
        self.send(records)
    }

    /// Outputs not caused by an input record (timers, rule updates): one that does not
    /// fit its schema stops the job, since there is no record to dead-letter.
    fn send(&self, records: Vec<OutputRecord>) -> Result<(), JobError> {
        match self.encode(records) {
            Ok(encoded) => self.send_encoded(encoded),
            Err(EncodeError::Registry(e)) => Err(JobError::Registry(e.to_string())),
            Err(e) => Err(JobError::OutputFormat(e.to_string())),
        }
    }

    /// Where a record goes: its own topic, or `[kafka] output_topic`.
    fn topic_of<'a>(&'a self, r: &'a OutputRecord) -> &'a str {
        r.topic
            .as_deref()
            .unwrap_or(&self.config.kafka.output_topic)
    }

    /// The records with their values in the output format (JSON as they are; Avro
    /// encoded with their topic's schema).
    fn encode(&self, records: Vec<OutputRecord>) -> Result<Vec<OutputRecord>, EncodeError> {
        let Some(e) = &self.encoder else {
            return Ok(records);
        };
        records
            .into_iter()
            .map(|mut r| {
                r.value = e.encode(self.topic_of(&r), &r.value)?;
                Ok(r)
            })
            .collect()
    }

    fn send_encoded(&self, records: Vec<OutputRecord>) -> Result<(), JobError> {
        for r in &records {
            let topic = self.topic_of(r);
            self.sink.send(topic, r.key.as_deref(), &r.value, None)?;
            self.counters.produced(topic);
        }
        Ok(())
    }

    /// `[job] function = "passthrough"`: the record's key and value, unchanged, to the
    /// output topic in the current transaction (see [`crate::functions::passthrough`]).
    fn pass_through(&self, msg: &BorrowedMessage<'_>) -> Result<(), JobError> {
        let topic = &self.config.kafka.output_topic;
        self.sink
            .send(topic, msg.key(), msg.payload().unwrap_or_default(), None)?;
        self.counters.produced(topic);
        Ok(())
    }

    /// The original bytes go to the dead-letter topic unchanged, with why and where from
    /// in headers, inside the current transaction: exactly once, like any output.
    /// `source` is where the record was first written (for a forwarded one, not the
    /// internal topic).
    fn dead_letter(
        &self,
        msg: &BorrowedMessage<'_>,
        source: &SourceRef,
        reason: &str,
        detail: &str,
    ) -> Result<(), JobError> {
        let (partition, offset) = (source.partition.to_string(), source.offset.to_string());
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "streamstate.error.reason",
                value: Some(reason),
            })
            .insert(Header {
                key: "streamstate.error.message",
                value: Some(detail),
            })
            .insert(Header {
                key: "streamstate.source.topic",
                value: Some(source.topic.as_str()),
            })
            .insert(Header {
                key: "streamstate.source.partition",
                value: Some(partition.as_str()),
            })
            .insert(Header {
                key: "streamstate.source.offset",
                value: Some(offset.as_str()),
            });
        // An over-size record is cut to the limit so the dead-letter write itself cannot
        // fail; the whole record stays in the input topic at the offset in the headers.
        let payload = msg.payload().unwrap_or_default();
        let size = payload.len().to_string();
        let headers = headers.insert(Header {
            key: "streamstate.source.size",
            value: Some(size.as_str()),
        });
        let payload = &payload[..payload.len().min(self.config.dead_letter_max_bytes())];
        self.sink.send(
            &self.config.kafka.dead_letter_topic,
            msg.key(),
            payload,
            Some(headers),
        )?;
        Ok(())
    }
}
