//! The operator verbs' connection to the cluster (`topics …`, `rules …`): metadata,
//! topic configs, topic creation, bounded by `kafka.connect_timeout`.
//!
//! The first call asks for the cluster's metadata, so an unreachable broker is one error
//! naming `kafka.bootstrap_servers` after at most `connect_timeout`, the same words the
//! service uses at start, instead of every later call timing out on its own.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier};
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::Config;
use crate::kafka_client::{Role, client_config};
use crate::kafka_log::LogContext;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kafka.bootstrap_servers: cannot reach the cluster at {servers} within {timeout:?}")]
    Unreachable {
        servers: String,
        timeout: Duration,
        source: KafkaError,
    },
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("{what} topic `{topic}`: {code}")]
    Topic {
        what: &'static str,
        topic: String,
        code: RDKafkaErrorCode,
    },
}

/// One topic as the cluster's metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub partitions: usize,
}

pub struct ClusterClient {
    admin: AdminClient<LogContext>,
    /// For metadata (the admin client has none of its own in rdkafka).
    probe: BaseConsumer<LogContext>,
    pub timeout: Duration,
    pub servers: String,
}

impl ClusterClient {
    /// Connects and checks that the cluster answers within `kafka.connect_timeout`.
    pub fn connect(config: &Config) -> Result<Self, ClientError> {
        let timeout = config.kafka.connect_timeout;
        // Connection and security properties only, never the job's producer/consumer tuning.
        let mut probe = client_config(config, Role::Shared, &[]);
        probe
            .set("group.id", format!("{}-tools", config.kafka.app_id))
            .set("enable.auto.commit", "false");
        let client = Self {
            admin: client_config(config, Role::Shared, &[])
                .create_with_context(LogContext::default())?,
            probe: probe.create_with_context(LogContext::default())?,
            timeout,
            servers: config.kafka.bootstrap_servers.clone(),
        };
        client.topics()?;
        Ok(client)
    }

    /// Every topic in the cluster with its partition count.
    pub fn topics(&self) -> Result<BTreeMap<String, TopicInfo>, ClientError> {
        use rdkafka::consumer::Consumer;
        let md = self
            .probe
            .fetch_metadata(None, self.timeout)
            .map_err(|source| ClientError::Unreachable {
                servers: self.servers.clone(),
                timeout: self.timeout,
                source,
            })?;
        Ok(md
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| {
                (
                    t.name().to_string(),
                    TopicInfo {
                        partitions: t.partitions().len(),
                    },
                )
            })
            .collect())
    }

    /// Each topic's effective configuration (defaults included).
    pub fn configs(
        &self,
        topics: &[&str],
    ) -> Result<BTreeMap<String, BTreeMap<String, String>>, ClientError> {
        if topics.is_empty() {
            return Ok(BTreeMap::new());
        }
        let specs: Vec<ResourceSpecifier> =
            topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let options = self.options();
        let results =
            futures::executor::block_on(self.admin.describe_configs(specs.iter(), &options))?;
        let mut out = BTreeMap::new();
        for (topic, result) in topics.iter().zip(results) {
            let resource = result.map_err(|code| ClientError::Topic {
                what: "describing",
                topic: topic.to_string(),
                code,
            })?;
            let entries = resource
                .entries
                .into_iter()
                .filter_map(|e| Some((e.name, e.value?)))
                .collect();
            out.insert(topic.to_string(), entries);
        }
        Ok(out)
    }

    /// Creates `topics`; one that exists by now (created meanwhile) is not an error.
    pub fn create(&self, topics: &[NewTopic<'_>]) -> Result<(), ClientError> {
        let options = self.options().operation_timeout(Some(self.timeout));
        let results = futures::executor::block_on(self.admin.create_topics(topics, &options))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(ClientError::Topic {
                        what: "creating",
                        topic,
                        code,
                    });
                }
            }
        }
        Ok(())
    }

    /// Waits (up to the timeout) until the metadata shows every `(topic, partitions)`:
    /// brokers learn of a new topic asynchronously.
    pub fn wait_for(&self, topics: &[(String, usize)]) -> Result<(), ClientError> {
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            let now = self.topics()?;
            let missing = topics
                .iter()
                .find(|(t, n)| now.get(t).is_none_or(|i| i.partitions != *n));
            match missing {
                None => return Ok(()),
                Some((t, _)) if std::time::Instant::now() >= deadline => {
                    return Err(ClientError::Topic {
                        what: "waiting for the new",
                        topic: t.clone(),
                        code: RDKafkaErrorCode::OperationTimedOut,
                    });
                }
                Some(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    fn options(&self) -> AdminOptions {
        AdminOptions::new().request_timeout(Some(self.timeout))
    }
}
