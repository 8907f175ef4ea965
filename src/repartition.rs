//! Repartition mode (`job.repartition`): input not partitioned by the state key goes
//! through an internal topic keyed by it, as Kafka Streams does with its repartition
//! topics, inside streamstate's epoch transactions.
//!
//! - **Hop 1**: each instance reads its share of the input partitions, decodes every event
//!   and forwards the original bytes, headers and timestamp to the internal topic
//!   `<app_id>-repartition`, partition = key group of the state key (the murmur2 function
//!   the state layer uses), with the record's origin in `streamstate.repartition.*`
//!   headers. Undecodable records go to the dead-letter topic here.
//! - **Hop 2**: each instance reads the internal partitions of its key-group range
//!   (read_committed) and processes them exactly like keyed input; functions and dead
//!   letters see the original topic, partition and offset.
//!
//! # Why this is exactly-once
//!
//! Both hops run in the same loop and the same epoch transaction `T_e`: the records
//! forwarded to the internal topic, the outputs and dead letters, and the offsets of the
//! input partitions *and* of the internal partitions (metadata naming `chk-e`) commit
//! together with the checkpoint, or not at all.
//! - Hop 1: an input record's offset is committed exactly when its forwarded copy is; an
//!   aborted or crashed epoch leaves neither, and the rewind re-reads the input from the
//!   checkpoint's offsets, forwarding it again in a later transaction.
//! - Hop 2: the internal offsets, the outputs and the state (the checkpoint the offsets
//!   name) commit together, as for keyed input.
//! - Between the hops: hop 2 reads read_committed, so copies forwarded in an aborted
//!   epoch are never seen, and a committed copy stays in the topic until the owner of its
//!   partition commits past it, whichever instance forwarded it and whenever it crashes.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders};

use crate::config::Config;
use crate::function::SourceRef;
use crate::kafka_client::{self, Role};

const ORIGIN_TOPIC: &str = "streamstate.repartition.topic";
const ORIGIN_PARTITION: &str = "streamstate.repartition.partition";
const ORIGIN_OFFSET: &str = "streamstate.repartition.offset";

#[derive(Debug, thiserror::Error)]
pub enum RepartitionError {
    #[error("job.repartition: cannot create the internal topic `{topic}`: {source}")]
    Create { topic: String, source: KafkaError },
    #[error(
        "job.repartition: the internal topic `{topic}` has {found} partitions but state.max_parallelism is \
         {expected}; its partitions are the key groups. Delete the topic (when no job uses it) or set \
         state.max_parallelism = {found}"
    )]
    PartitionCount {
        topic: String,
        found: u32,
        expected: u32,
    },
}

/// Creates the internal topic with `partitions` partitions (replication: the broker's
/// default) unless it exists. Another instance creating it at the same time is fine; the
/// caller then checks the partition count of whatever exists.
pub fn create_topic(config: &Config, partitions: u32) -> Result<(), RepartitionError> {
    let topic = config.repartition_topic();
    let err = |source| RepartitionError::Create {
        topic: topic.clone(),
        source,
    };
    let admin: AdminClient<DefaultClientContext> =
        kafka_client::client_config(config, Role::Shared, &[])
            .create()
            .map_err(err)?;
    let new = NewTopic::new(&topic, partitions as i32, TopicReplication::Fixed(-1));
    let timeout: Duration = config.kafka.connect_timeout;
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let results =
        futures::executor::block_on(admin.create_topics([&new], &options)).map_err(err)?;
    for result in results {
        match result {
            Ok(_) => tracing::info!(topic = %topic, partitions, "created the repartition topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(err(KafkaError::AdminOp(code))),
        }
    }
    Ok(())
}

/// Refuses an internal topic whose partitions are not the key groups.
pub fn check_partition_count(
    topic: &str,
    found: usize,
    max_parallelism: u32,
) -> Result<(), RepartitionError> {
    if found as u32 != max_parallelism {
        return Err(RepartitionError::PartitionCount {
            topic: topic.to_string(),
            found: found as u32,
            expected: max_parallelism,
        });
    }
    Ok(())
}

/// The forwarded record's headers: the original ones, then where it came from.
pub fn forward_headers(original: Option<&impl Headers>, origin: &SourceRef) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new();
    if let Some(h) = original {
        for header in h.iter() {
            headers = headers.insert(header);
        }
    }
    let (partition, offset) = (origin.partition.to_string(), origin.offset.to_string());
    headers
        .insert(Header {
            key: ORIGIN_TOPIC,
            value: Some(origin.topic.as_str()),
        })
        .insert(Header {
            key: ORIGIN_PARTITION,
            value: Some(partition.as_str()),
        })
        .insert(Header {
            key: ORIGIN_OFFSET,
            value: Some(offset.as_str()),
        })
}

/// Where a forwarded record came from; `None` for a record without (all of) the origin
/// headers hop 1 writes. The last occurrence wins: hop 1 appends after the original ones.
pub fn origin(headers: Option<&impl Headers>) -> Option<SourceRef> {
    let headers = headers?;
    let last = |name: &str| {
        headers
            .iter()
            .filter(|h| h.key == name)
            .last()
            .and_then(|h| std::str::from_utf8(h.value?).ok())
            .map(str::to_string)
    };
    Some(SourceRef {
        topic: last(ORIGIN_TOPIC)?,
        partition: last(ORIGIN_PARTITION)?.parse().ok()?,
        offset: last(ORIGIN_OFFSET)?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_survives_the_hop_after_the_original_headers() {
        let original = OwnedHeaders::new()
            .insert(Header {
                key: "trace",
                value: Some("abc"),
            })
            .insert(Header {
                key: ORIGIN_TOPIC,
                value: Some("spoofed"),
            });
        let from = SourceRef {
            topic: "in".into(),
            partition: 3,
            offset: 42,
        };
        let forwarded = forward_headers(Some(&original), &from);
        assert_eq!(origin(Some(&forwarded)), Some(from));
        assert_eq!(forwarded.get(0).key, "trace");
        assert_eq!(origin(Some(&original)), None, "incomplete origin headers");
    }

    #[test]
    fn an_internal_topic_with_other_partitions_is_refused() {
        assert!(check_partition_count("t", 8, 8).is_ok());
        let e = check_partition_count("t", 4, 8).expect_err("mismatch");
        assert!(
            e.to_string()
                .contains("has 4 partitions but state.max_parallelism is 8")
        );
    }
}
