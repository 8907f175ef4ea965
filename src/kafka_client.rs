//! The librdkafka configuration every Kafka client of an instance starts from.
//!
//! Why one place: the consumer, the transactional producers, the at-least-once offset
//! committer, the control-topic publisher and the admin clients must all see the user's
//! `[kafka.properties]` (security, SASL, timeouts) the same way, or one client connects
//! where another cannot. Each role then layers its own table on top and sets what the
//! protocol needs after it, so those settings cannot be overridden.

use rdkafka::ClientConfig;

use crate::config::Config;

/// Which of the user's property tables apply besides `[kafka.properties]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `[kafka.consumer_properties]`: the source and the offset committer.
    Consumer,
    /// `[kafka.producer_properties]`: the job's output producers.
    Producer,
    /// Connection and security settings only: admin clients, and one-record publishers
    /// that the job's producer tuning does not fit.
    Shared,
}

/// `defaults` (the user may override them), then `[kafka.properties]`, then the role's own
/// table, then `bootstrap.servers` from `[kafka]`.
pub fn client_config(config: &Config, role: Role, defaults: &[(&str, &str)]) -> ClientConfig {
    let kafka = &config.kafka;
    let mut cc = ClientConfig::new();
    for (k, v) in defaults {
        cc.set(*k, *v);
    }
    let own = match role {
        Role::Consumer => Some(&kafka.consumer_properties),
        Role::Producer => Some(&kafka.producer_properties),
        Role::Shared => None,
    };
    for (k, v) in kafka.properties.iter().chain(own.into_iter().flatten()) {
        cc.set(k, v);
    }
    cc.set("bootstrap.servers", &kafka.bootstrap_servers);
    cc
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal valid config with `extra` TOML appended.
    pub(crate) fn config(extra: &str) -> Config {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        let body = format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\napp_id = \"app\"\n\
             input_topics = [\"in\"]\noutput_topic = \"out\"\ndead_letter_topic = \"dlq\"\n\
             [job]\nkey = \"/user\"\n{extra}"
        );
        std::fs::write(&path, body).expect("write config");
        Config::load(&path).expect("load")
    }

    #[test]
    fn each_role_sees_the_shared_properties_and_only_its_own_table() {
        let c = config(
            "[kafka.properties]\n\"security.protocol\" = \"SASL_SSL\"\n\"client.id\" = \"shared\"\n\
             [kafka.consumer_properties]\n\"client.id\" = \"consumer\"\n\"fetch.wait.max.ms\" = \"50\"\n\
             [kafka.producer_properties]\n\"client.id\" = \"producer\"\n\"batch.size\" = \"65536\"\n",
        );
        let consumer = client_config(&c, Role::Consumer, &[]);
        let producer = client_config(&c, Role::Producer, &[]);
        let shared = client_config(&c, Role::Shared, &[]);
        for cc in [&consumer, &producer, &shared] {
            assert_eq!(cc.get("security.protocol"), Some("SASL_SSL"));
            assert_eq!(cc.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        }
        assert_eq!(
            consumer.get("client.id"),
            Some("consumer"),
            "the role's table wins"
        );
        assert_eq!(consumer.get("fetch.wait.max.ms"), Some("50"));
        assert_eq!(consumer.get("batch.size"), None);
        assert_eq!(producer.get("client.id"), Some("producer"));
        assert_eq!(producer.get("batch.size"), Some("65536"));
        assert_eq!(producer.get("fetch.wait.max.ms"), None);
        assert_eq!(shared.get("client.id"), Some("shared"));
        assert_eq!(shared.get("batch.size"), None);
    }

    #[test]
    fn defaults_yield_to_the_user_but_bootstrap_comes_from_kafka_section() {
        let c = config(
            "[kafka.properties]\n\"bootstrap.servers\" = \"elsewhere:9092\"\n\
             [kafka.producer_properties]\n\"linger.ms\" = \"50\"\n",
        );
        let cc = client_config(&c, Role::Producer, &[("linger.ms", "5"), ("acks", "all")]);
        assert_eq!(cc.get("linger.ms"), Some("50"));
        assert_eq!(cc.get("acks"), Some("all"));
        assert_eq!(cc.get("bootstrap.servers"), Some("127.0.0.1:9092"));
    }
}
