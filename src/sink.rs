//! The transactional Kafka producers: a pool, one transaction per checkpoint epoch.
//!
//! [`Sink`] is the pool as the job thread sees it (records go to the open epoch's
//! producer, behind the previous epoch's: [`Handover`]); [`Producer`] is one member, whose begin, offsets, commit and abort the
//! commit protocol ([`crate::commit`]) drives.
//!
//! Errors are sorted the way librdkafka's transactional API asks: retriable ones (a
//! broker briefly away) are retried until the checkpoint timeout; abortable ones abort
//! the transaction and the job rewinds to its last checkpoint; fencing and fatal ones
//! end the process. Retrying a failed *transaction* in place is how duplicates are
//! born, so nothing here does that.
//!
//! With `[job] guarantee = "at_least_once"` the same calls run without a transaction:
//! `begin` and `abort` do nothing, `send_offsets` keeps the offsets, and `commit` flushes
//! every output first and then commits the offsets through a consumer of the group — the
//! checkpoint protocol unchanged, minus atomicity (a crash between the two replays the
//! epoch). A record the producer gave up on ends the instance instead of being skipped.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{BaseRecord, Producer as _, ThreadedProducer};
use rdkafka::{ClientConfig, TopicPartitionList};
use tracing::warn;

use crate::checkpoint::CheckpointRef;
use crate::commit::Handover;
use crate::config::{Config, Guarantee};
use crate::kafka_client::{self, Role};
use crate::kafka_log::LogContext;
use crate::source::{Offsets, offsets_for_commit};
use crate::transactions::Transactions;

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("kafka producer: {0}")]
    Kafka(KafkaError),
    #[error("transaction must be aborted: {0}")]
    Abortable(KafkaError),
    #[error("this instance was fenced by a newer one with transactional.id `{0}`: exiting")]
    Fenced(String),
    #[error(
        "kafka producer: {what} did not succeed within {timeout:?} ({setting}): {last}; \
         exiting so that the restart resumes from the last committed checkpoint"
    )]
    TimedOut {
        what: &'static str,
        /// The setting that bounded the call.
        setting: &'static str,
        timeout: Duration,
        /// Boxed: the error travels up every `Result` of the job loop.
        last: Box<KafkaError>,
    },
    #[error(
        "{0} output records could not be delivered (at least once): exiting so the restart replays them"
    )]
    Undelivered(u64),
    #[error("consumer has no group metadata; cannot commit offsets in a transaction")]
    NoGroupMetadata,
}

/// The epoch's producers: a pool of transactional producers, one per epoch in flight
/// (see [`crate::commit`]). Records go to the producer of the open epoch.
pub struct Sink {
    slots: Vec<Arc<Producer>>,
    current: usize,
    /// The open epoch's records that wait for the previous epoch's producer.
    handover: RefCell<Handover<Producer, Outgoing>>,
}

/// A record held back by the [`Handover`], owned until it is sent.
pub struct Outgoing {
    topic: String,
    partition: Option<i32>,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    headers: Option<OwnedHeaders>,
    timestamp_ms: Option<i64>,
}

impl Sink {
    /// Creates the pool and fences every older holder of its transactional ids.
    pub fn new(
        config: &Config,
        tracker: Arc<Transactions>,
        group: Option<ConsumerGroupMetadata>,
    ) -> Result<Self, SinkError> {
        let group = group.map(Arc::new);
        let committer = match config.job.guarantee {
            Guarantee::ExactlyOnce => None,
            Guarantee::AtLeastOnce => Some(Arc::new(committer(config)?)),
        };
        let slots = (0..config.checkpoint.producer_pool_size)
            .map(|slot| {
                let p = Producer::unfenced(
                    config,
                    config.transactional_id(slot),
                    tracker.clone(),
                    group.clone(),
                    committer.clone(),
                )?;
                p.fence(config)?;
                Ok(Arc::new(p))
            })
            .collect::<Result<Vec<_>, SinkError>>()?;
        Ok(Self {
            slots,
            current: 0,
            handover: RefCell::default(),
        })
    }

    /// Fences transactional ids that are not in the pool (an earlier run's larger pool, or
    /// the single id used before pools): `init_transactions` with a short-lived producer
    /// makes the coordinator abort whatever such an id left open.
    pub fn fence_other_ids(
        config: &Config,
        ids: impl IntoIterator<Item = String>,
    ) -> Result<(), SinkError> {
        if config.job.guarantee == Guarantee::AtLeastOnce {
            return Ok(());
        }
        let tracker = Arc::new(Transactions::default());
        // One broker round trip each, so all at once: a first start fences every id a
        // pool can have.
        std::thread::scope(|scope| {
            let fenced: Vec<_> = ids
                .into_iter()
                .map(|id| {
                    let tracker = tracker.clone();
                    scope.spawn(move || {
                        Producer::unfenced(config, id, tracker, None, None)?.fence(config)
                    })
                })
                .collect();
            fenced.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or(Err(SinkError::Kafka(KafkaError::Canceled)))
            })
        })
    }

    pub fn slots(&self) -> &[Arc<Producer>] {
        &self.slots
    }

    /// Records from now on go to `slot`'s producer (the open epoch's), after whatever the
    /// previous epoch's producer still has queued.
    pub fn use_slot(&mut self, slot: usize) {
        if slot != self.current {
            let previous = self.slots[self.current].clone();
            self.handover.get_mut().follow(previous);
        }
        self.current = slot;
    }

    /// The open epoch's producer, which every record of the epoch goes to.
    pub fn producer(&self) -> &Producer {
        &self.slots[self.current]
    }

    /// Queues one record in the open epoch's transaction; see [`Producer::send`].
    pub fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        headers: Option<OwnedHeaders>,
    ) -> Result<(), SinkError> {
        if self.ready()? {
            return self.producer().send(topic, key, payload, headers);
        }
        self.handover.borrow_mut().hold(Outgoing {
            topic: topic.to_owned(),
            partition: None,
            key: key.map(<[u8]>::to_vec),
            payload: payload.to_vec(),
            headers,
            timestamp_ms: None,
        });
        Ok(())
    }

    /// Queues one record for an explicit partition; see [`Producer::send_to_partition`].
    pub fn send_to_partition(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        payload: &[u8],
        headers: OwnedHeaders,
        timestamp_ms: Option<i64>,
    ) -> Result<(), SinkError> {
        if self.ready()? {
            return self.producer().send_to_partition(
                topic,
                partition,
                key,
                payload,
                headers,
                timestamp_ms,
            );
        }
        self.handover.borrow_mut().hold(Outgoing {
            topic: topic.to_owned(),
            partition: Some(partition),
            key: Some(key.to_vec()),
            payload: payload.to_vec(),
            headers: Some(headers),
            timestamp_ms,
        });
        Ok(())
    }

    /// Sends the held records once the producer ahead has delivered; the job loop calls
    /// it between polls so held records do not wait for the next output.
    pub fn pump(&self) -> Result<(), SinkError> {
        self.ready().map(drop)
    }

    /// Records held behind the previous epoch's producer.
    pub fn held(&self) -> usize {
        self.handover.borrow().held()
    }

    /// Before the open epoch is sealed: every one of its records goes to its producer,
    /// waiting for the previous epoch's producer only if that still has records queued.
    pub fn release(&self) -> Result<(), SinkError> {
        let producer = self.producer();
        self.handover
            .borrow_mut()
            .release(|r| producer.send_outgoing(r))
    }

    /// The open epoch was aborted: what it held is dropped with it.
    pub fn discard_held(&mut self) {
        self.handover.get_mut().discard();
    }

    fn ready(&self) -> Result<bool, SinkError> {
        let producer = self.producer();
        self.handover
            .borrow_mut()
            .ready(|r| producer.send_outgoing(r))
    }
}

/// One transactional producer of the pool: begin, send, offsets, commit, abort.
pub struct Producer {
    /// Threaded: librdkafka's commit and abort wait for delivery reports, which only a
    /// thread polling the producer can serve while the job thread is inside that call.
    producer: ThreadedProducer<LogContext>,
    transactional_id: String,
    /// Upper bound for one transactional call, retries included (`checkpoint.timeout`).
    timeout: Duration,
    /// Told of every begin, commit and abort, for `GET /transactions` and the metrics.
    tracker: Arc<Transactions>,
    /// The source's group, named by the offsets sent into each transaction.
    group: Option<Arc<ConsumerGroupMetadata>>,
    /// The checkpoint whose commit ends the open transaction.
    open: Mutex<Option<CheckpointRef>>,
    /// Set for `guarantee = "at_least_once"`: no transactions.
    at_least_once: Option<AtLeastOnce>,
}

/// What the at-least-once sink needs besides the producer.
struct AtLeastOnce {
    /// Commits the offsets into the job's consumer group (manual assignment, like the
    /// source, so it joins no group and moves no partition); shared by the pool.
    committer: Arc<BaseConsumer<LogContext>>,
    /// The offsets `send_offsets` was given, committed by the next `commit`.
    pending: Mutex<Option<TopicPartitionList>>,
}

/// A producer's librdkafka settings, whatever its guarantee: defaults, then the user's
/// properties, then what the protocol cannot do without.
fn producer_config(config: &Config) -> ClientConfig {
    // `linger.ms` is a default only: `[kafka.producer_properties]` may trade latency for
    // larger batches (Kafka Streams defaults to 100 ms under exactly-once).
    // `delivery.report.only.error`: `LogContext::delivery` acts on failures alone, and a
    // report per delivered record kept the polling thread at about 4% of the process's CPU.
    let mut cc = kafka_client::client_config(
        config,
        Role::Producer,
        &[("linger.ms", "5"), ("delivery.report.only.error", "true")],
    );
    cc.set("enable.idempotence", "true");
    cc
}

impl Producer {
    /// The producer, not yet registered with the transaction coordinator (no broker call).
    fn unfenced(
        config: &Config,
        transactional_id: String,
        tracker: Arc<Transactions>,
        group: Option<Arc<ConsumerGroupMetadata>>,
        committer: Option<Arc<BaseConsumer<LogContext>>>,
    ) -> Result<Self, SinkError> {
        let mut cc = producer_config(config);
        let at_least_once = match committer {
            None => {
                cc.set("transactional.id", &transactional_id).set(
                    "transaction.timeout.ms",
                    config.kafka.transaction_timeout.as_millis().to_string(),
                );
                None
            }
            Some(committer) => Some(AtLeastOnce {
                committer,
                pending: Mutex::new(None),
            }),
        };
        let producer: ThreadedProducer<LogContext> = cc
            .create_with_context(LogContext::default())
            .map_err(SinkError::Kafka)?;
        Ok(Self {
            producer,
            transactional_id,
            timeout: config.checkpoint.timeout,
            tracker,
            group,
            open: Mutex::new(None),
            at_least_once,
        })
    }

    /// `init_transactions`: fences older producers with our transactional id, and makes the
    /// coordinator finish or abort their open transaction. Part of start-up, so it waits
    /// for the broker as long as start-up does (`kafka.connect_timeout`, at least
    /// `checkpoint.timeout`): a broker that was just restarted loads its coordinator first.
    fn fence(&self, config: &Config) -> Result<(), SinkError> {
        if self.at_least_once.is_none() {
            let bound = if config.kafka.connect_timeout >= self.timeout {
                ("kafka.connect_timeout", config.kafka.connect_timeout)
            } else {
                ("checkpoint.timeout", self.timeout)
            };
            self.retrying("init_transactions", bound, |p, t| p.init_transactions(t))?;
            self.tracker
                .initialized(&self.transactional_id, config.kafka.transaction_timeout);
        }
        Ok(())
    }

    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    fn open_checkpoint(&self) -> Option<CheckpointRef> {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_open(&self, checkpoint: Option<CheckpointRef>) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = checkpoint;
    }

    /// Opens the transaction that `checkpoint`'s commit will end.
    pub fn begin(&self, checkpoint: &CheckpointRef) -> Result<(), SinkError> {
        self.set_open(Some(checkpoint.clone()));
        if self.at_least_once.is_some() {
            return Ok(());
        }
        self.producer
            .begin_transaction()
            .map_err(|e| self.classify(e))?;
        self.tracker.begun(&self.transactional_id, checkpoint);
        Ok(())
    }

    /// Queues one record; waits for queue space rather than dropping anything.
    pub fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        headers: Option<OwnedHeaders>,
    ) -> Result<(), SinkError> {
        self.enqueue(record(topic, None, key, payload, headers, None))
    }

    /// Queues one record for an explicit partition with an explicit timestamp: repartition
    /// mode's forwarded copy (partition = key group, timestamp = the original record's).
    pub fn send_to_partition(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        payload: &[u8],
        headers: OwnedHeaders,
        timestamp_ms: Option<i64>,
    ) -> Result<(), SinkError> {
        self.enqueue(record(
            topic,
            Some(partition),
            Some(key),
            payload,
            Some(headers),
            timestamp_ms,
        ))
    }

    fn send_outgoing(&self, r: Outgoing) -> Result<(), SinkError> {
        self.enqueue(record(
            &r.topic,
            r.partition,
            r.key.as_deref(),
            &r.payload,
            r.headers,
            r.timestamp_ms,
        ))
    }

    /// Records queued in librdkafka and not yet acknowledged (or failed).
    pub fn queued(&self) -> usize {
        usize::try_from(self.producer.in_flight_count()).unwrap_or(0)
    }

    fn enqueue(&self, mut record: BaseRecord<'_, [u8], [u8]>) -> Result<(), SinkError> {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    // The producer's own thread drains the queue; wait for room.
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(self.classify(e)),
            }
        }
    }

    /// Waits until every queued record was delivered (or failed), within
    /// `checkpoint.timeout`. A delivery that failed is left to the commit, which then
    /// fails (exactly once) or reports it (at least once).
    ///
    /// Not rust-rdkafka's `flush`: it asks librdkafka without waiting, then polls the
    /// event queue for up to 100 ms against the producer's own polling thread; when that
    /// thread takes the last delivery report, the flush sleeps out its poll, up to 100 ms
    /// after the delivery. With delivery reports as events, served by that thread,
    /// `rd_kafka_flush` waits on the count of undelivered records itself, and lingers for
    /// no batch meanwhile.
    pub fn flush(&self) -> Result<(), SinkError> {
        let (setting, timeout) = self.bound();
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the client pointer is valid while `self.producer` is borrowed, and
        // librdkafka's flush is thread-safe.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_flush(self.producer.client().native_ptr(), timeout_ms)
        };
        match RDKafkaErrorCode::from(err) {
            RDKafkaErrorCode::NoError => Ok(()),
            code => Err(SinkError::TimedOut {
                what: "flush",
                setting,
                timeout,
                last: Box::new(KafkaError::Flush(code)),
            }),
        }
    }

    /// Makes the source offsets, with metadata naming `checkpoint`, part of the open
    /// transaction.
    pub fn send_offsets(
        &self,
        offsets: &Offsets,
        checkpoint: &CheckpointRef,
    ) -> Result<(), SinkError> {
        let offsets = offsets_for_commit(offsets, checkpoint).map_err(SinkError::Kafka)?;
        if let Some(alo) = &self.at_least_once {
            *alo.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(offsets);
            return Ok(());
        }
        let group = self.group.as_ref().ok_or(SinkError::NoGroupMetadata)?;
        self.retrying("send_offsets_to_transaction", self.bound(), |p, t| {
            p.send_offsets_to_transaction(&offsets, group, t)
        })
    }

    /// The one atomic decision point: outputs, offsets and the named checkpoint become
    /// true together.
    pub fn commit(&self) -> Result<(), SinkError> {
        match &self.at_least_once {
            None => {
                self.retrying("commit_transaction", self.bound(), |p, t| {
                    p.commit_transaction(t)
                })?;
                if let Some(c) = self.open_checkpoint() {
                    self.tracker.committed(&c);
                }
                self.set_open(None);
                Ok(())
            }
            Some(alo) => self.flush_then_commit_offsets(alo),
        }
    }

    /// At least once: every output of the epoch is acknowledged before the offsets that
    /// would skip its inputs are committed.
    fn flush_then_commit_offsets(&self, alo: &AtLeastOnce) -> Result<(), SinkError> {
        self.flush()?;
        let failed = self.producer.context().delivery_failures();
        if failed > 0 {
            return Err(SinkError::Undelivered(failed));
        }
        let pending = alo.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(offsets) = pending else {
            return Ok(());
        };
        // A coordinator that moves or a broker that is briefly away is waited out, as the
        // transactional calls are (`retrying`), within the checkpoint timeout.
        let deadline = Instant::now() + self.timeout;
        loop {
            match alo.committer.commit(&offsets, CommitMode::Sync) {
                Ok(()) => return Ok(()),
                Err(KafkaError::ConsumerCommit(code))
                    if is_retriable_commit(code) && Instant::now() < deadline =>
                {
                    warn!(error = %code, "offset commit failed; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(SinkError::Kafka(e)),
            }
        }
    }

    /// At least once there is nothing to abort: what was sent stays, and the rewind
    /// replays it (duplicates, as the guarantee allows).
    pub fn abort(&self) -> Result<(), SinkError> {
        if self.at_least_once.is_some() {
            return Ok(());
        }
        self.retrying("abort_transaction", self.bound(), |p, t| {
            p.abort_transaction(t)
        })?;
        if let Some(c) = self.open_checkpoint() {
            self.tracker.aborted(&c);
        }
        self.set_open(None);
        Ok(())
    }

    /// Calls `op` again while librdkafka says the error is retriable (e.g. the broker is
    /// restarting), within `timeout` overall (`setting` names where it came from).
    fn retrying(
        &self,
        what: &'static str,
        (setting, timeout): (&'static str, Duration),
        op: impl Fn(&ThreadedProducer<LogContext>, Duration) -> Result<(), KafkaError>,
    ) -> Result<(), SinkError> {
        // The watcher ends the process if librdkafka holds the call far past `timeout`.
        self.tracker.call_started(what, setting, timeout);
        let deadline = Instant::now() + timeout;
        // At least one retry even past the deadline: a process paused during the call
        // (a zombie) must hear from the broker, e.g. that it was fenced, before it gives up.
        let mut attempts = 0u32;
        let result = loop {
            attempts = attempts.saturating_add(1);
            let left = deadline.saturating_duration_since(Instant::now());
            match op(&self.producer, left.max(Duration::from_secs(1))) {
                Ok(()) => break Ok(()),
                Err(KafkaError::Transaction(e)) if e.is_retriable() && !e.is_fatal() => {
                    if attempts > 1 && Instant::now() >= deadline {
                        let last = Box::new(KafkaError::Transaction(e));
                        break Err(SinkError::TimedOut {
                            what,
                            setting,
                            timeout,
                            last,
                        });
                    }
                    warn!(operation = what, error = %e, "retriable transaction error; retrying");
                }
                Err(e) => break Err(self.classify(e)),
            }
        };
        self.tracker.call_ended();
        result
    }

    /// What bounds a checkpoint's transactional calls.
    fn bound(&self) -> (&'static str, Duration) {
        ("checkpoint.timeout", self.timeout)
    }

    fn classify(&self, e: KafkaError) -> SinkError {
        let is_fencing = |c| {
            matches!(
                c,
                RDKafkaErrorCode::Fenced
                    | RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::InvalidProducerEpoch
            )
        };
        // A fatal error may surface as a generic code on whichever call comes next; the
        // client keeps the original cause.
        let fatal_cause = self.producer.client().fatal_error().map(|(code, _)| code);
        let fenced =
            e.rdkafka_error_code().is_some_and(is_fencing) || fatal_cause.is_some_and(is_fencing);
        match &e {
            _ if fenced => SinkError::Fenced(self.transactional_id.clone()),
            KafkaError::Transaction(t) if t.txn_requires_abort() && !t.is_fatal() => {
                SinkError::Abortable(e)
            }
            // produce() refuses records while the transaction is in an abortable error
            // state (e.g. a record timed out); the abort then tells whether we were fenced.
            KafkaError::MessageProduction(RDKafkaErrorCode::State) if fatal_cause.is_none() => {
                SinkError::Abortable(e)
            }
            _ => SinkError::Kafka(e),
        }
    }
}

/// The at-least-once sink's offset committer: the source's group, no subscription.
fn committer(config: &Config) -> Result<BaseConsumer<LogContext>, SinkError> {
    kafka_client::client_config(config, Role::Consumer, &[])
        .set("group.id", &config.kafka.app_id)
        .set("enable.auto.commit", "false")
        .create_with_context(LogContext::default())
        .map_err(SinkError::Kafka)
}

/// Offset-commit errors that a retry can cure (coordinator moving or loading, timeouts,
/// connections down).
fn is_retriable_commit(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::NotCoordinator
            | RDKafkaErrorCode::CoordinatorNotAvailable
            | RDKafkaErrorCode::CoordinatorLoadInProgress
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::NetworkException
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::RebalanceInProgress
    )
}

/// The one place a record for librdkafka is put together; `None` leaves a field to the
/// producer (partitioner, no key, no headers, the current time).
fn record<'a>(
    topic: &'a str,
    partition: Option<i32>,
    key: Option<&'a [u8]>,
    payload: &'a [u8],
    headers: Option<OwnedHeaders>,
    timestamp_ms: Option<i64>,
) -> BaseRecord<'a, [u8], [u8]> {
    let mut record = BaseRecord::<[u8], [u8]>::to(topic).payload(payload);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    if let Some(k) = key {
        record = record.key(k);
    }
    if let Some(h) = headers {
        record = record.headers(h);
    }
    if let Some(ts) = timestamp_ms {
        record = record.timestamp(ts);
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka_client::tests::config;

    #[test]
    fn producer_properties_may_set_linger_but_not_turn_idempotence_off() {
        let defaults = producer_config(&config(""));
        assert_eq!(defaults.get("linger.ms"), Some("5"));
        assert_eq!(defaults.get("delivery.report.only.error"), Some("true"));
        let set = producer_config(&config(
            "[kafka.producer_properties]\n\"linger.ms\" = \"50\"\n\"enable.idempotence\" = \"false\"\n",
        ));
        assert_eq!(set.get("linger.ms"), Some("50"), "the user's value wins");
        assert_eq!(set.get("enable.idempotence"), Some("true"), "never off");
        assert_eq!(set.get("bootstrap.servers"), Some("127.0.0.1:9092"));
    }
}
