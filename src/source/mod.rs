//! The Kafka source: manual assignment of every input partition, offsets kept by the
//! service (as the source's operator state in checkpoints, [`offset_state`], and in the
//! epoch's transaction), never by auto-commit.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use crate::checkpoint::{CheckpointRef, offset_metadata, parse_offset_metadata};
use crate::config::{Config, StartOffsets};
use crate::kafka_client::{self, Role};
use crate::kafka_log::LogContext;

pub mod offset_state;

/// `(topic, partition)`; ordered so offsets print and snapshot deterministically.
pub type Partition = (String, i32);
/// Next offset to read, per partition.
pub type Offsets = BTreeMap<Partition, i64>;

/// Sets the next offset to read from `topic`'s `partition`. Called for every record:
/// a partition already present is found by a scan of the few assigned ones, without
/// allocating the map's owned key.
pub fn advance(offsets: &mut Offsets, topic: &str, partition: i32, next: i64) {
    match offsets
        .iter_mut()
        .find(|((t, p), _)| *p == partition && t == topic)
    {
        Some((_, at)) => *at = next,
        None => {
            offsets.insert((topic.to_string(), partition), next);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("kafka.bootstrap_servers: cannot reach the cluster at {servers} within {timeout:?}")]
    Unreachable {
        servers: String,
        timeout: Duration,
        source: KafkaError,
    },
    #[error("{key}: topic `{topic}` does not exist")]
    MissingTopic { key: &'static str, topic: String },
    #[error("kafka consumer: {0}")]
    Kafka(#[from] KafkaError),
    /// Says which request: a start that fails here and one that fails listing watermarks
    /// have different causes (a coordinator, a partition leader).
    #[error(
        "the committed offsets of group `{group}` could not be read: {source} (transient broker answers are retried for kafka.connect_timeout, {timeout:?})"
    )]
    CommittedOffsets {
        group: String,
        timeout: Duration,
        source: KafkaError,
    },
    #[error(
        "the offsets of `{topic}` [{partition}] could not be read: {source} (transient broker answers are retried for kafka.connect_timeout, {timeout:?})"
    )]
    Watermarks {
        topic: String,
        partition: i32,
        timeout: Duration,
        source: KafkaError,
    },
    #[error(
        "committed offsets of group `{group}` name different checkpoints ({ids:?}); refusing to guess which state is true"
    )]
    InconsistentCommit { group: String, ids: Vec<String> },
}

pub struct Source {
    consumer: BaseConsumer<LogContext>,
    group: String,
    timeout: Duration,
}

/// What the consumer group says about where this instance stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub checkpoint: CheckpointRef,
    pub offsets: Offsets,
}

impl Source {
    pub fn new(config: &Config) -> Result<Self, SourceError> {
        let mut cc = kafka_client::client_config(config, Role::Consumer, &[]);
        cc.set("group.id", &config.kafka.app_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "false")
            .set(
                "auto.offset.reset",
                match config.kafka.start_offsets {
                    StartOffsets::Earliest => "earliest",
                    StartOffsets::Latest => "latest",
                },
            );
        Ok(Self {
            consumer: cc.create_with_context(LogContext::default())?,
            group: config.kafka.app_id.clone(),
            timeout: config.kafka.connect_timeout,
        })
    }

    /// Every partition of `topics` (named by config key `key`), checking that the
    /// cluster answers at all.
    pub fn partitions(
        &self,
        servers: &str,
        key: &'static str,
        topics: &[String],
    ) -> Result<Vec<Partition>, SourceError> {
        let mut out = Vec::new();
        for topic in topics {
            // A topic created moments ago answers "leader not available" until its
            // partitions have leaders: that is not a missing topic, so ask again.
            let found = self
                .retrying(|remaining| {
                    let md = self.consumer.fetch_metadata(Some(topic), remaining)?;
                    let t = md.topics().iter().find(|t| t.name() == topic);
                    let ids = match t {
                        Some(t) => match t.error() {
                            None => Some(t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>()),
                            Some(e) => {
                                let code = RDKafkaErrorCode::from(e);
                                if is_transient(code)
                                    && code != RDKafkaErrorCode::UnknownTopicOrPartition
                                {
                                    return Err(KafkaError::MetadataFetch(code));
                                }
                                None
                            }
                        },
                        None => None,
                    };
                    Ok(ids)
                })
                .map_err(|source| match source.rdkafka_error_code() {
                    Some(
                        RDKafkaErrorCode::OperationTimedOut
                        | RDKafkaErrorCode::RequestTimedOut
                        | RDKafkaErrorCode::BrokerTransportFailure
                        | RDKafkaErrorCode::AllBrokersDown
                        | RDKafkaErrorCode::NetworkException,
                    )
                    | None => SourceError::Unreachable {
                        servers: servers.to_string(),
                        timeout: self.timeout,
                        source,
                    },
                    Some(_) => SourceError::Kafka(source),
                })?;
            match found {
                Some(ids) if !ids.is_empty() => {
                    out.extend(ids.into_iter().map(|p| (topic.clone(), p)))
                }
                _ => {
                    return Err(SourceError::MissingTopic {
                        key,
                        topic: topic.clone(),
                    });
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The group's committed offsets and metadata of `parts`, as the broker returns them.
    fn group_offsets(&self, parts: &[Partition]) -> Result<TopicPartitionList, SourceError> {
        let mut tpl = TopicPartitionList::new();
        for (t, p) in parts {
            tpl.add_partition(t, *p);
        }
        self.retrying(|remaining| self.consumer.committed_offsets(tpl.clone(), remaining))
            .map_err(|source| SourceError::CommittedOffsets {
                group: self.group.clone(),
                timeout: self.timeout,
                source,
            })
    }

    /// The group's committed offsets of `parts`, whatever checkpoint their metadata names
    /// (after a rescale, several old instances' checkpoints).
    pub fn committed_offsets(&self, parts: &[Partition]) -> Result<Offsets, SourceError> {
        let got = self.group_offsets(parts)?;
        Ok(got
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                _ => None,
            })
            .collect())
    }

    /// Reads the group's committed offsets; `None` when this app never committed.
    pub fn committed(&self, parts: &[Partition]) -> Result<Option<Committed>, SourceError> {
        let got = self.group_offsets(parts)?;
        let mut ids = Vec::new();
        let mut offsets = Offsets::new();
        for e in got.elements() {
            if let (Offset::Offset(o), Some(c)) = (e.offset(), parse_offset_metadata(e.metadata()))
            {
                offsets.insert((e.topic().to_string(), e.partition()), o);
                ids.push(c);
            }
        }
        ids.sort();
        ids.dedup();
        match ids.as_slice() {
            [] => Ok(None),
            [c] => Ok(Some(Committed {
                checkpoint: c.clone(),
                offsets,
            })),
            _ => Err(SourceError::InconsistentCommit {
                group: self.group.clone(),
                ids: ids.iter().map(ToString::to_string).collect(),
            }),
        }
    }

    /// Concrete start offsets for a first start, so every checkpoint names an offset for
    /// every partition even before it has seen a record.
    pub fn start_offsets(
        &self,
        parts: &[Partition],
        start: StartOffsets,
    ) -> Result<Offsets, SourceError> {
        let mut out = Offsets::new();
        for (t, p) in parts {
            let (low, high) = self.watermarks(t, *p)?;
            out.insert(
                (t.clone(), *p),
                if start == StartOffsets::Earliest {
                    low
                } else {
                    high
                },
            );
        }
        Ok(out)
    }

    /// High watermarks of these partitions (read_committed stops at the last stable
    /// offset, so compare with [`Source::positions`], which skips transaction markers).
    pub fn end_offsets<'a>(
        &self,
        parts: impl IntoIterator<Item = &'a Partition>,
    ) -> Result<Offsets, SourceError> {
        let mut out = Offsets::new();
        for (t, p) in parts {
            let (_, high) = self.watermarks(t, *p)?;
            out.insert((t.clone(), *p), high);
        }
        Ok(out)
    }

    /// The consumer's fetch position per assigned partition (past any transaction
    /// markers); partitions with no position yet are left out.
    pub fn positions(&self) -> Result<Offsets, SourceError> {
        let tpl = self.consumer.position()?;
        Ok(tpl
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                _ => None,
            })
            .collect())
    }

    /// Assigns exactly these partitions (input and control) at these offsets.
    pub fn assign<'a>(
        &self,
        offsets: impl IntoIterator<Item = (&'a Partition, &'a i64)>,
    ) -> Result<(), SourceError> {
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))?;
        }
        self.consumer.assign(&tpl)?;
        Ok(())
    }

    /// Low and high watermark of one partition. librdkafka answers "unknown partition"
    /// from its metadata cache while that lacks the partition (seen for seconds after a
    /// broker restart), so such an answer refreshes the topic's metadata before the retry.
    fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), SourceError> {
        self.retrying(|remaining| {
            let got = self.consumer.fetch_watermarks(topic, partition, remaining);
            if let Err(e) = &got
                && e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownPartition)
            {
                // Only to refresh the cache; the retry reports what is still wrong.
                let _ = self.consumer.fetch_metadata(Some(topic), remaining);
            }
            got
        })
        .map_err(|source| SourceError::Watermarks {
            topic: topic.to_string(),
            partition,
            timeout: self.timeout,
            source,
        })
    }

    fn retrying<T>(
        &self,
        call: impl FnMut(Duration) -> Result<T, KafkaError>,
    ) -> Result<T, KafkaError> {
        retry_transient(self.timeout, call)
    }

    pub fn consumer(&self) -> &BaseConsumer<LogContext> {
        &self.consumer
    }

    pub fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        self.consumer.group_metadata()
    }
}

/// Runs a metadata or offset request again while the broker answers with an error that
/// clears by itself (a leader election after a topic is created or a broker restarts, a
/// coordinator loading), within `timeout` overall; `call` gets the time left. Giving up on
/// the first such answer turned a routine election into a failed start.
fn retry_transient<T>(
    timeout: Duration,
    mut call: impl FnMut(Duration) -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(50);
    loop {
        let remaining = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        match call(remaining) {
            Err(e)
                if e.rdkafka_error_code().is_some_and(is_transient)
                    && Instant::now() + pause < deadline =>
            {
                tracing::debug!(error = %e, "transient broker answer; asking again");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// Broker answers that a later attempt of the same request can succeed.
fn is_transient(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        code,
        NotLeaderForPartition
            | LeaderNotAvailable
            | UnknownTopicOrPartition
            | NotCoordinator
            | CoordinatorNotAvailable
            | CoordinatorLoadInProgress
            | RequestTimedOut
            | NetworkException
            | OperationTimedOut
            | BrokerTransportFailure
            | AllBrokersDown
            | FencedLeaderEpoch
            | UnknownLeaderEpoch
            | OffsetNotAvailable
            | PreferredLeaderNotAvailable
            // librdkafka's own "unknown partition": its metadata cache does not list the
            // partition yet, as seen right after a broker restart.
            | UnknownPartition
    )
}

/// The offsets to commit with an epoch's transaction, each naming the checkpoint.
pub fn offsets_for_commit(
    offsets: &Offsets,
    checkpoint: &CheckpointRef,
) -> Result<TopicPartitionList, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    let meta = offset_metadata(checkpoint);
    for ((t, p), o) in offsets {
        let mut e = tpl.add_partition(t, *p);
        e.set_offset(Offset::Offset(*o))?;
        e.set_metadata(meta.as_str());
    }
    Ok(tpl)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(code: RDKafkaErrorCode) -> KafkaError {
        KafkaError::MetadataFetch(code)
    }

    #[test]
    fn advance_moves_a_known_partition_and_adds_a_new_one() {
        let mut offsets = Offsets::new();
        advance(&mut offsets, "in", 0, 5);
        advance(&mut offsets, "in", 1, 7);
        advance(&mut offsets, "in", 0, 6);
        advance(&mut offsets, "other", 0, 1);
        let got: Vec<_> = offsets.into_iter().collect();
        assert_eq!(
            got,
            [
                (("in".to_string(), 0), 6),
                (("in".to_string(), 1), 7),
                (("other".to_string(), 0), 1),
            ]
        );
    }

    #[test]
    fn a_leader_election_is_waited_out() {
        let mut calls = 0;
        let got = retry_transient(Duration::from_secs(10), |_| {
            calls += 1;
            if calls < 3 {
                Err(error(RDKafkaErrorCode::NotLeaderForPartition))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(got.ok(), Some(3));
    }

    #[test]
    fn a_partition_missing_from_a_restarted_brokers_metadata_is_waited_out() {
        let mut calls = 0;
        let got = retry_transient(Duration::from_secs(10), |_| {
            calls += 1;
            if calls < 2 {
                Err(error(RDKafkaErrorCode::UnknownPartition))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(got.ok(), Some(2));
    }

    #[test]
    fn a_lasting_error_is_returned_at_once() {
        let mut calls = 0;
        let got: Result<(), _> = retry_transient(Duration::from_secs(10), |_| {
            calls += 1;
            Err(error(RDKafkaErrorCode::TopicAuthorizationFailed))
        });
        assert_eq!(
            got.err().and_then(|e| e.rdkafka_error_code()),
            Some(RDKafkaErrorCode::TopicAuthorizationFailed)
        );
        assert_eq!(calls, 1);
    }

    #[test]
    fn a_transient_error_that_does_not_clear_is_returned_by_the_deadline() {
        let started = Instant::now();
        let mut calls = 0;
        let got: Result<(), _> = retry_transient(Duration::from_millis(400), |remaining| {
            calls += 1;
            assert!(remaining <= Duration::from_millis(400));
            Err(error(RDKafkaErrorCode::LeaderNotAvailable))
        });
        assert_eq!(
            got.err().and_then(|e| e.rdkafka_error_code()),
            Some(RDKafkaErrorCode::LeaderNotAvailable)
        );
        assert!(calls > 1, "asked {calls} times");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "gave up after {:?}",
            started.elapsed()
        );
    }
}
