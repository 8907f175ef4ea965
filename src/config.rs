//! Configuration: one TOML file, overridden by `STREAMSTATE__SECTION__KEY` environment variables.
//!
//! Every struct refuses unknown keys so that a typo stops the start instead of silently
//! falling back to a default. Durations are humantime strings (`"500ms"`, `"10s"`) so the
//! unit is always in the value.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
pub use streamstate_state::BackendKind;

pub use crate::format::{AvroConfig, InputFormat, OutputFormat, ProtobufConfig, RegistryConfig};

/// Environment variables with this prefix override file keys; `__` separates levels.
pub const ENV_PREFIX: &str = "STREAMSTATE__";

/// Most producers one instance keeps for its epochs (`checkpoint.producer_pool_size`).
pub const MAX_PRODUCER_POOL_SIZE: u32 = 16;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// figment's message already names the key and the source (file or environment).
    #[error("config: {0}")]
    Load(String),
    #[error("config key `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub kafka: KafkaConfig,
    pub job: JobConfig,
    #[serde(default)]
    pub state: StateConfig,
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    /// The Schema Registry that Avro and Protobuf records name by schema id; required
    /// when `job.format` or `job.output_format` is not `json`.
    #[serde(default)]
    pub schema_registry: Option<RegistryConfig>,
    #[serde(default)]
    pub avro: AvroConfig,
    #[serde(default)]
    pub protobuf: ProtobufConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list, as librdkafka's `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Names the job: the consumer group, the transactional-id prefix and the checkpoint prefix.
    pub app_id: String,
    /// Topics whose partitions this instance consumes.
    pub input_topics: Vec<String>,
    /// Where results go, inside the epoch's transaction.
    pub output_topic: String,
    /// Rules arrive here (read by every instance).
    #[serde(default)]
    pub control_topic: Option<String>,
    /// Undecodable records go here, with the reason in headers, inside the same transaction.
    pub dead_letter_topic: String,
    /// Where to start when the group has no committed offsets (first start only).
    #[serde(default)]
    pub start_offsets: StartOffsets,
    /// Upper bound of one transaction; must exceed checkpoint interval + timeout.
    #[serde(default = "default_transaction_timeout", with = "humantime_serde")]
    pub transaction_timeout: Duration,
    /// How long start-up waits for the cluster to answer before giving up.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// librdkafka properties for every client (e.g. `security.protocol`, `sasl.mechanism`).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// librdkafka properties for the consumers only.
    #[serde(default)]
    pub consumer_properties: BTreeMap<String, String>,
    /// librdkafka properties for the producer only.
    #[serde(default)]
    pub producer_properties: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartOffsets {
    #[default]
    Earliest,
    Latest,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// JSON pointer (RFC 6901) to the state key inside each event, e.g. `/user_id`.
    pub key: String,
    /// Records larger than this go to the dead-letter topic instead of being parsed.
    #[serde(default = "default_max_record_bytes")]
    pub max_record_bytes: usize,
    /// Keys longer than this go to the dead-letter topic.
    #[serde(default = "default_max_key_bytes")]
    pub max_key_bytes: usize,
    /// This instance's ordinal; names its transactional id and checkpoint prefix.
    #[serde(default)]
    pub instance: u32,
    /// How many instances share the input. Instance `i` owns Flink's `i`-th share of the
    /// input partitions and their key groups (`src/cluster.rs`); changing it is a rescale
    /// (stop with savepoints, restart from the set).
    #[serde(default = "default_instances")]
    pub instances: u32,
    /// Input not partitioned by the state key: every instance reads its share of the input
    /// partitions and forwards each event to the internal topic `<app_id>-repartition`
    /// (one partition per key group, created at start), whose partitions are then owned
    /// like keyed input. Both hops commit in the same transaction as the checkpoint; see
    /// `docs/repartition.md`. Off: input must be partitioned by the state key.
    #[serde(default)]
    pub repartition: bool,
    /// The process function: `rules` (the built-in rule engine, driven by the control
    /// topic), `count` (a running count per key), or the benchmark baselines `json`
    /// (decode and re-encode, no state) and `passthrough` (bytes in, bytes out).
    #[serde(default)]
    pub function: FunctionKind,
    /// JSON pointer to the event time (ms since the epoch as a number, or an RFC 3339
    /// string). Set: windows and sequences run on event time and close on the watermark;
    /// events older than the watermark go to the dead-letter topic. Unset: processing time.
    #[serde(default)]
    pub timestamp: Option<String>,
    /// How far behind the newest event time of a partition its events may arrive.
    #[serde(default = "default_max_out_of_orderness", with = "humantime_serde")]
    pub max_out_of_orderness: Duration,
    /// With `timestamp` set: an event whose time is further than this from the wall clock
    /// (ahead or behind) goes to the dead-letter topic as `event_time_out_of_range`, so one
    /// event from the year 3000 cannot push the watermark past every later event. Unset:
    /// no bound (the watermark trusts every event time).
    #[serde(default, with = "humantime_serde")]
    pub max_event_time_skew: Option<Duration>,
    /// An input partition without events for this long stops holding the event-time
    /// watermark back until it delivers again. Unset: an idle partition stalls windows.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// Per-key state of running (unwindowed) aggregates and sequences expires after this
    /// long without an update. Unset: kept until the rule is deleted.
    #[serde(default, with = "humantime_serde")]
    pub state_ttl: Option<Duration>,
    /// `exactly_once` (default): outputs and offsets commit in one Kafka transaction per
    /// checkpoint. `at_least_once`: an idempotent, non-transactional producer; at each
    /// checkpoint the outputs are flushed, then the offsets (naming the checkpoint) are
    /// committed, so a crash in between replays the epoch and duplicates its outputs.
    /// Readers see outputs as soon as they are written; no zombie fencing.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// How input values are written: `json` (default), `avro` or `protobuf` (both in the
    /// Confluent wire format, schemas from `[schema_registry]`). Decoded records are the
    /// same JSON value for `key`, `timestamp`, rules and functions whatever the format.
    #[serde(default)]
    pub format: InputFormat,
    /// How outputs are written: `json` (default) or `avro` (`[avro] output_schema_file`).
    #[serde(default)]
    pub output_format: OutputFormat,
}

/// `[job] guarantee`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    #[default]
    ExactlyOnce,
    AtLeastOnce,
}

/// `[job] function`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FunctionKind {
    #[default]
    Rules,
    Count,
    Json,
    Passthrough,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// `rocksdb` (bytes on local disk, incremental snapshots) or `hashmap` (heap, full snapshots).
    #[serde(default = "default_backend")]
    pub backend: BackendKind,
    /// Local working directory for live state; rebuilt from checkpoints after a restart.
    #[serde(default = "default_state_dir")]
    pub dir: PathBuf,
    /// Number of key groups, fixed at the first start; defaults to the input partition
    /// count. A multiple of it aligns the key groups to the partitions, so that any
    /// number of instances up to the partition count can share them.
    #[serde(default)]
    pub max_parallelism: Option<u32>,
    /// Capacity of the write-back state cache in front of the backend (estimated bytes of
    /// cached keys and values), written into the backend at every checkpoint barrier and
    /// when full; 0 turns it off. Unset: off (see `streamstate_state::default_cache_bytes_for`
    /// for the measurements behind that).
    #[serde(default)]
    pub cache_bytes: Option<u64>,
}

impl StateConfig {
    /// `cache_bytes`, or the backend's default when unset.
    pub fn effective_cache_bytes(&self) -> u64 {
        self.cache_bytes
            .unwrap_or_else(|| streamstate_state::default_cache_bytes_for(self.backend))
    }
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            backend: default_backend(),
            dir: default_state_dir(),
            max_parallelism: None,
            cache_bytes: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Time between checkpoints; also the floor of output latency for read_committed readers.
    #[serde(default = "default_checkpoint_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// Checkpoint storage URL: `file:///path` (a local or shared volume).
    #[serde(default = "default_checkpoint_storage")]
    pub storage: String,
    /// Completed checkpoints kept; older ones are pruned.
    #[serde(default = "default_retained")]
    pub retained: usize,
    /// Least time between the end of one checkpoint and the start of the next, so slow
    /// storage cannot turn the job into back-to-back checkpoints.
    #[serde(default, with = "humantime_serde")]
    pub min_pause: Duration,
    /// Upper bound for one checkpoint's Kafka calls (offsets, commit), retries included.
    #[serde(default = "default_checkpoint_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Transactional producers in the pool, which is also the most epochs in flight: one
    /// open epoch taking records, the others uploading and committing in the background.
    /// When every producer is busy the job waits (back-pressure). 1 turns pipelining off:
    /// each checkpoint then commits before the next epoch starts.
    #[serde(default = "default_producer_pool_size")]
    pub producer_pool_size: u32,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            interval: default_checkpoint_interval(),
            storage: default_checkpoint_storage(),
            retained: default_retained(),
            min_pause: Duration::ZERO,
            timeout: default_checkpoint_timeout(),
            producer_pool_size: default_producer_pool_size(),
        }
    }
}

/// A credential: deserializes from a plain string, never prints.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: &str) -> Self {
        Self(value.to_string())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// Parsed `checkpoint.storage`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageLocation {
    File(PathBuf),
    S3 { bucket: String, prefix: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin HTTP server (health, metrics, checkpoints).
    #[serde(default = "default_admin_listen")]
    pub listen: SocketAddr,
    /// Bearer token that mutating endpoints require. Prefer
    /// `STREAMSTATE__ADMIN__TOKEN` or `token_file` to writing it here; never logged.
    #[serde(default, skip_serializing)]
    pub token: Option<Secret>,
    /// File holding the token (a mounted Secret); surrounding whitespace is ignored.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Serve a non-loopback `listen` address without a token. Off by default: anyone who
    /// reaches the port could trigger checkpoints or stop the job.
    #[serde(default)]
    pub allow_unauthenticated: bool,
    /// Directories besides the checkpoint storage's own under which `POST /savepoints`
    /// may write a savepoint with a `file://` target. Absolute paths.
    #[serde(default)]
    pub savepoint_roots: Vec<PathBuf>,
    /// Admin URL of instance `{instance}`, e.g.
    /// `"http://streamstate-{instance}.streamstate-headless.prod.svc:9464"` (the Helm chart
    /// sets it). With it, `GET /state/{key}` for a key another instance owns redirects
    /// there (307), so one address serves every key; without it the answer is 421 naming
    /// the owner.
    #[serde(default)]
    pub peer_url: Option<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: default_admin_listen(),
            token: None,
            token_file: None,
            allow_unauthenticated: false,
            savepoint_roots: Vec::new(),
            peer_url: None,
        }
    }
}

fn default_backend() -> BackendKind {
    BackendKind::Rocksdb
}
fn default_transaction_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_record_bytes() -> usize {
    1024 * 1024
}
fn default_instances() -> u32 {
    1
}
fn default_max_out_of_orderness() -> Duration {
    Duration::from_secs(5)
}
fn default_max_key_bytes() -> usize {
    4096
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/streamstate/state")
}
fn default_checkpoint_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_checkpoint_storage() -> String {
    "file:///var/lib/streamstate/checkpoints".to_string()
}
fn default_checkpoint_timeout() -> Duration {
    Duration::from_secs(30)
}
/// Three, as Flink's KafkaSink needs at most: the open epoch, one uploading and one
/// committing. More only helps when uploads are slower than the checkpoint interval.
fn default_producer_pool_size() -> u32 {
    3
}

fn default_retained() -> usize {
    3
}
fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9464))
}

impl Config {
    /// Reads the file, applies environment overrides, then checks values that serde cannot.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        if !path.is_file() {
            return Err(ConfigError::Load(format!(
                "file {} does not exist",
                path.display()
            )));
        }
        Self::from_figment(
            Figment::new()
                .merge(Toml::file(path))
                .merge(env_overrides()),
        )
    }

    /// Builds a config from defaults in code plus environment overrides (used by `demo`).
    pub fn from_defaults(base: &Config) -> Result<Self, ConfigError> {
        Self::from_figment(
            Figment::new()
                .merge(Serialized::defaults(base))
                .merge(env_overrides()),
        )
    }

    fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        let config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Load(one_line(&e)))?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.to_string(),
            })
        };
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return invalid("kafka.bootstrap_servers", "must not be empty");
        }
        if self.kafka.app_id.is_empty()
            || !self
                .kafka
                .app_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return invalid(
                "kafka.app_id",
                "must be non-empty and use only [A-Za-z0-9._-]",
            );
        }
        if self.kafka.input_topics.is_empty() {
            return invalid("kafka.input_topics", "must name at least one topic");
        }
        if !self.job.key.is_empty() && !self.job.key.starts_with('/') {
            return invalid(
                "job.key",
                "must be a JSON pointer starting with '/', e.g. \"/user_id\"",
            );
        }
        if self.job.instances == 0 || self.job.instance >= self.job.instances {
            return invalid(
                "job.instance",
                "must be below job.instances (instances are numbered 0..instances)",
            );
        }
        if self.job.repartition && self.job.function == FunctionKind::Passthrough {
            return invalid(
                "job.repartition",
                "needs a state key, which function = \"passthrough\" never reads; use it with another function",
            );
        }
        if self.job.repartition {
            let internal = self.repartition_topic();
            let named = |t: &String| *t == internal;
            if self.kafka.input_topics.iter().any(named)
                || named(&self.kafka.output_topic)
                || named(&self.kafka.dead_letter_topic)
                || self.kafka.control_topic.as_ref().is_some_and(named)
            {
                return invalid(
                    "job.repartition",
                    "the internal topic <kafka.app_id>-repartition must not be an input, output, dead-letter or control topic",
                );
            }
        }
        if let Some(p) = &self.job.timestamp
            && !p.starts_with('/')
        {
            return invalid(
                "job.timestamp",
                "must be a JSON pointer starting with '/', e.g. \"/ts\"",
            );
        }
        if self.checkpoint.interval < Duration::from_millis(10) {
            return invalid("checkpoint.interval", "must be at least 10ms");
        }
        if !(1..=MAX_PRODUCER_POOL_SIZE).contains(&self.checkpoint.producer_pool_size) {
            return invalid(
                "checkpoint.producer_pool_size",
                &format!("must be between 1 and {MAX_PRODUCER_POOL_SIZE}"),
            );
        }
        if self.checkpoint.retained == 0 {
            return invalid("checkpoint.retained", "must be at least 1");
        }
        if self.kafka.transaction_timeout <= self.checkpoint.interval + self.checkpoint.timeout {
            return invalid(
                "kafka.transaction_timeout",
                "must exceed checkpoint.interval + checkpoint.timeout, or the broker aborts open transactions between checkpoints",
            );
        }
        if let Some(n) = self.state.max_parallelism
            && !(1..=32768).contains(&n)
        {
            return invalid("state.max_parallelism", "must be between 1 and 32768");
        }
        self.checkpoint_location()?;
        if self.admin.token.is_some() && self.admin.token_file.is_some() {
            return invalid(
                "admin.token_file",
                "set either admin.token or admin.token_file, not both",
            );
        }
        if !self.admin.listen.ip().is_loopback()
            && self.admin.token.is_none()
            && self.admin.token_file.is_none()
            && !self.admin.allow_unauthenticated
        {
            return invalid(
                "admin.listen",
                "is not a loopback address but no admin.token or admin.token_file is set; set one, or \
                 admin.allow_unauthenticated = true if the network is trusted",
            );
        }
        if self.admin.savepoint_roots.iter().any(|r| !r.is_absolute()) {
            return invalid(
                "admin.savepoint_roots",
                "every entry must be an absolute path",
            );
        }
        if let Some(url) = &self.admin.peer_url
            && (!(url.starts_with("http://") || url.starts_with("https://"))
                || !url.contains("{instance}"))
        {
            return invalid(
                "admin.peer_url",
                "must be an http:// or https:// URL containing {instance}, e.g. \
                 \"http://streamstate-{instance}.streamstate-headless:9464\"",
            );
        }
        self.admin_token()?;
        crate::format::validate(self)?;
        Ok(())
    }

    /// The admin base URL of `instance` (no trailing slash), when `admin.peer_url` is set.
    pub fn peer_admin_url(&self, instance: u32) -> Option<String> {
        self.admin.peer_url.as_ref().map(|t| {
            t.replace("{instance}", &instance.to_string())
                .trim_end_matches('/')
                .to_string()
        })
    }

    /// Largest dead-letter payload: `job.max_record_bytes`, but never more than the
    /// producer may send (`message.max.bytes`, librdkafka's default 1,000,000) less room
    /// for headers and key, so writing a dead letter cannot itself fail on size.
    pub fn dead_letter_max_bytes(&self) -> usize {
        let producer_max = self
            .kafka
            .producer_properties
            .get("message.max.bytes")
            .or_else(|| self.kafka.properties.get("message.max.bytes"))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1_000_000);
        let room = self.job.max_key_bytes + 64 * 1024;
        self.job
            .max_record_bytes
            .min(producer_max.saturating_sub(room))
    }

    /// The admin bearer token, read from `admin.token_file` when that is set.
    pub fn admin_token(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(path) = &self.admin.token_file {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
                key: "admin.token_file",
                reason: format!("cannot read {}: {e}", path.display()),
            })?;
            return match text.trim() {
                "" => Err(ConfigError::Invalid {
                    key: "admin.token_file",
                    reason: format!("{} is empty", path.display()),
                }),
                t => Ok(Some(Secret(t.to_string()))),
            };
        }
        match &self.admin.token {
            Some(t) if t.0.trim().is_empty() => Err(ConfigError::Invalid {
                key: "admin.token",
                reason: "must not be empty".into(),
            }),
            other => Ok(other.clone()),
        }
    }

    /// Where `checkpoint.storage` points.
    pub fn checkpoint_location(&self) -> Result<StorageLocation, ConfigError> {
        parse_storage_url("checkpoint.storage", &self.checkpoint.storage)
    }

    /// The internal topic of `job.repartition`: `<app_id>-repartition`, like Kafka Streams'
    /// `<application.id>-…-repartition`, so two jobs never share one.
    pub fn repartition_topic(&self) -> String {
        format!("{}-repartition", self.kafka.app_id)
    }

    /// `<app_id>-<instance>`: fences zombies of this same instance and nobody else.
    /// The transactional id this instance used before producer pools: fenced at start
    /// when no checkpoint records a pool, so an upgrade leaves no transaction behind.
    pub fn legacy_transactional_id(&self) -> String {
        format!("{}-{}", self.kafka.app_id, self.job.instance)
    }

    /// `<app_id>-<instance>-<slot>`: one id per producer of the pool.
    pub fn transactional_id(&self, slot: u32) -> String {
        format!("{}-{}-{slot}", self.kafka.app_id, self.job.instance)
    }
}

/// Parses a storage URL (`file:///abs/path` or `s3://bucket/prefix`); `key` names the
/// setting in errors.
pub fn parse_storage_url(key: &'static str, url: &str) -> Result<StorageLocation, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { key, reason };
    let url = url::Url::parse(url).map_err(|e| invalid(format!("not a URL: {e}")))?;
    match url.scheme() {
        "file" => url
            .to_file_path()
            .map(StorageLocation::File)
            .map_err(|()| invalid("file:// URL must hold an absolute path".into())),
        "s3" => {
            let bucket = url
                .host_str()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| invalid("s3:// URL needs a bucket".into()))?;
            Ok(StorageLocation::S3 {
                bucket: bucket.to_string(),
                prefix: url.path().trim_matches('/').to_string(),
            })
        }
        other => Err(invalid(format!(
            "scheme `{other}` is not supported; use file:///path or s3://bucket/prefix"
        ))),
    }
}

fn env_overrides() -> EnvOverrides {
    EnvOverrides::from_process()
}

/// `STREAMSTATE__SECTION__KEY` overrides. Like figment's `Env::prefixed(..).split("__")`,
/// except that only `__` separates levels and a dot stays part of the key: librdkafka
/// property names have dots, so `STREAMSTATE__KAFKA__PROPERTIES__SASL.PASSWORD` sets the
/// property `sasl.password` (figment's `Env` would nest it as `sasl` → `password`, which a
/// string map refuses). Names are lowercased; values are parsed as figment's `Env` does,
/// except librdkafka property values, which stay strings.
struct EnvOverrides {
    /// `(name without the prefix, value)`, e.g. `("kafka__properties__sasl.password", "x")`.
    vars: Vec<(String, String)>,
}

impl EnvOverrides {
    fn from_process() -> Self {
        Self {
            vars: Env::prefixed(ENV_PREFIX)
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v))
                .collect(),
        }
    }
}

impl figment::Provider for EnvOverrides {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named(format!("`{ENV_PREFIX}` environment variable(s)")).interpolater(
            |_, keys| {
                keys.iter()
                    .map(|k| k.to_ascii_uppercase())
                    .collect::<Vec<_>>()
                    .join(".")
            },
        )
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        use figment::value::{Dict, Value};
        fn insert(dict: &mut Dict, path: &[&str], value: Value) {
            match path {
                [] => {}
                [leaf] => {
                    dict.insert(leaf.to_string(), value);
                }
                [head, rest @ ..] => {
                    let entry = dict
                        .entry(head.to_string())
                        .or_insert_with(|| Dict::new().into());
                    if entry.as_dict().is_none() {
                        *entry = Dict::new().into();
                    }
                    if let Value::Dict(_, inner) = entry {
                        insert(inner, rest, value);
                    }
                }
            }
        }
        let mut root = Dict::new();
        let mut vars = self.vars.clone();
        vars.sort();
        for (name, value) in vars {
            let name = name.to_ascii_lowercase();
            let path: Vec<&str> = name.split("__").collect();
            // As figment's `Env`: a name with an empty level is not an override.
            if path.iter().any(|s| s.is_empty()) {
                continue;
            }
            // librdkafka properties are strings, whatever they look like (`linger.ms=5`, a
            // password of digits); everything else is typed as figment's `Env` types it.
            let value = match path.as_slice() {
                [
                    "kafka",
                    "properties" | "consumer_properties" | "producer_properties",
                    _,
                ] => Value::from(value),
                // Credentials too: a password of digits stays a string.
                ["admin", "token"]
                | ["schema_registry", "password" | "bearer_token" | "username"] => {
                    Value::from(value)
                }
                _ => value
                    .parse()
                    .expect("parsing a figment value is infallible"),
            };
            insert(&mut root, &path, value);
        }
        Ok(figment::Profile::Default.collect(root))
    }
}

/// figment (and the TOML parser under it) may print several lines with a source excerpt;
/// an operator's log wants one.
fn one_line(e: &figment::Error) -> String {
    let text = e
        .clone()
        .into_iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ");
    text.split_whitespace()
        .filter(|w| *w != "|" && *w != "^")
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, body: &str) -> PathBuf {
        let path = dir.path().join("c.toml");
        std::fs::write(&path, body).expect("write config");
        path
    }

    const MINIMAL: &str = r#"
[kafka]
bootstrap_servers = "127.0.0.1:9092"
app_id = "app"
input_topics = ["in"]
output_topic = "out"
dead_letter_topic = "dlq"
[job]
key = "/user"
"#;

    #[test]
    fn loads_minimal_file_with_defaults() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Config::load(&write(&dir, MINIMAL)).expect("load");
        assert_eq!(c.checkpoint.interval, Duration::from_secs(1));
        assert_eq!(c.state.backend, BackendKind::Rocksdb);
        assert_eq!(c.transactional_id(2), "app-0-2");
        assert_eq!(c.legacy_transactional_id(), "app-0");
    }

    #[test]
    fn state_cache_is_off_unless_set() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Config::load(&write(&dir, MINIMAL)).expect("load");
        assert_eq!(c.state.effective_cache_bytes(), 0, "off unless set");
        let c = Config::load(&write(
            &dir,
            &format!("{MINIMAL}\n[state]\nbackend = \"hashmap\"\n"),
        ))
        .expect("load");
        assert_eq!(c.state.effective_cache_bytes(), 0);
        let c = Config::load(&write(
            &dir,
            &format!("{MINIMAL}\n[state]\nbackend = \"hashmap\"\ncache_bytes = 1048576\n"),
        ))
        .expect("load");
        assert_eq!(c.state.effective_cache_bytes(), 1 << 20);
    }

    #[test]
    fn refuses_unknown_key_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Config::load(&write(
            &dir,
            &format!("{MINIMAL}\n[state]\nbakend = \"rocksdb\"\n"),
        ))
        .expect_err("unknown key must fail");
        assert!(err.to_string().contains("bakend"), "{err}");
    }

    #[test]
    fn refuses_bad_duration_naming_the_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Config::load(&write(
            &dir,
            &format!("{MINIMAL}\n[checkpoint]\ninterval = \"soon\"\n"),
        ))
        .expect_err("bad duration must fail");
        assert!(err.to_string().contains("interval"), "{err}");
    }

    #[test]
    fn refuses_unsupported_storage_scheme() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Config::load(&write(
            &dir,
            &format!("{MINIMAL}\n[checkpoint]\nstorage = \"ftp://x/y\"\n"),
        ))
        .expect_err("ftp must fail");
        assert!(err.to_string().contains("checkpoint.storage"), "{err}");
        let c = Config::load(&write(
            &dir,
            &format!("{MINIMAL}\n[checkpoint]\nstorage = \"s3://bkt/a/b/\"\n"),
        ))
        .expect("s3 parses");
        let expected = StorageLocation::S3 {
            bucket: "bkt".into(),
            prefix: "a/b".into(),
        };
        assert_eq!(c.checkpoint_location().expect("location"), expected);
    }

    #[test]
    fn refuses_transaction_timeout_shorter_than_interval_plus_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let body = format!("{MINIMAL}\n[checkpoint]\ninterval = \"40s\"\n");
        let err = Config::load(&write(&dir, &body)).expect_err("must fail");
        assert!(
            err.to_string().contains("kafka.transaction_timeout"),
            "{err}"
        );
    }

    #[test]
    fn dead_letters_fit_what_the_producer_may_send() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Config::load(&write(&dir, MINIMAL)).expect("load");
        assert_eq!(
            c.dead_letter_max_bytes(),
            1_000_000 - 4096 - 65_536,
            "1 MiB records are cut below librdkafka's 1,000,000"
        );
        let body = format!(
            "{MINIMAL}max_record_bytes = 1000\n[kafka.producer_properties]\n\"message.max.bytes\" = \"20000000\"\n"
        );
        let c = Config::load(&write(&dir, &body)).expect("load");
        assert_eq!(c.dead_letter_max_bytes(), 1000);
    }

    #[test]
    fn refuses_public_admin_listener_without_a_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open = format!("{MINIMAL}\n[admin]\nlisten = \"0.0.0.0:9464\"\n");
        let err = Config::load(&write(&dir, &open)).expect_err("must fail");
        assert!(err.to_string().contains("admin.listen"), "{err}");
        Config::load(&write(
            &dir,
            &format!("{open}allow_unauthenticated = true\n"),
        ))
        .expect("explicitly allowed");
        let c =
            Config::load(&write(&dir, &format!("{open}token = \"s3cr3t\"\n"))).expect("token set");
        assert_eq!(
            c.admin_token().expect("token").as_ref().map(Secret::expose),
            Some("s3cr3t")
        );
        assert!(
            !format!("{c:?}").contains("s3cr3t"),
            "the token must never print"
        );
    }

    #[test]
    fn reads_the_admin_token_from_a_file_and_refuses_an_empty_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "abc\n").expect("write");
        let body = format!("{MINIMAL}\n[admin]\ntoken_file = \"{}\"\n", token.display());
        let c = Config::load(&write(&dir, &body)).expect("load");
        assert_eq!(
            c.admin_token().expect("token").as_ref().map(Secret::expose),
            Some("abc")
        );
        std::fs::write(&token, " \n").expect("write");
        let err = Config::load(&write(&dir, &body)).expect_err("empty token file");
        assert!(err.to_string().contains("admin.token_file"), "{err}");
    }

    #[test]
    fn environment_keeps_dots_in_librdkafka_property_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = format!(
            "{MINIMAL}\n[kafka.properties]\n\"sasl.password\" = \"from-file\"\n\"sasl.username\" = \"u\"\n"
        );
        let env = EnvOverrides {
            vars: vec![
                ("KAFKA__PROPERTIES__SASL.PASSWORD".into(), "from-env".into()),
                ("kafka__producer_properties__linger.ms".into(), "5".into()),
                (
                    "KAFKA__CONSUMER_PROPERTIES__SASL.PASSWORD".into(),
                    "0123".into(),
                ),
                ("JOB__INSTANCE".into(), "2".into()),
                ("JOB__INSTANCES".into(), "3".into()),
            ],
        };
        let c = Config::from_figment(
            Figment::new()
                .merge(Toml::file(write(&dir, &file)))
                .merge(env),
        )
        .expect("load");
        assert_eq!(
            c.kafka.properties.get("sasl.password").map(String::as_str),
            Some("from-env")
        );
        assert_eq!(
            c.kafka.properties.get("sasl.username").map(String::as_str),
            Some("u")
        );
        assert_eq!(
            c.kafka
                .producer_properties
                .get("linger.ms")
                .map(String::as_str),
            Some("5")
        );
        assert_eq!(
            c.kafka
                .consumer_properties
                .get("sasl.password")
                .map(String::as_str),
            Some("0123")
        );
        assert_eq!(c.job.instance, 2);
        let bad = EnvOverrides {
            vars: vec![("JOB__INSTANCE".into(), "x".into())],
        };
        let err = Config::from_figment(
            Figment::new()
                .merge(Toml::file(write(&dir, MINIMAL)))
                .merge(bad),
        )
        .expect_err("a non-number instance must fail");
        assert!(
            err.to_string().contains("JOB.INSTANCE") && err.to_string().contains("STREAMSTATE__"),
            "{err}"
        );
    }

    #[test]
    fn formats_that_need_a_registry_or_a_schema_name_the_missing_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let load = |extra: &str| {
            // MINIMAL ends in [job]: job keys first, then any sections.
            let body = format!("{MINIMAL}{extra}\n");
            Config::load(&write(&dir, &body)).map_err(|e| e.to_string())
        };
        let err = load("format = \"avro\"").expect_err("no registry");
        assert!(err.contains("schema_registry.urls"), "{err}");
        let err = load("output_format = \"avro\"\n[schema_registry]\nurls = [\"http://r:8081\"]")
            .expect_err("no output schema");
        assert!(err.contains("avro.output_schema_file"), "{err}");
        let err = load("format = \"protobuf\"\n[schema_registry]\nurls = [\"r:8081\"]")
            .expect_err("not a URL");
        assert!(err.contains("schema_registry.urls"), "{err}");
        let err =
            load("format = \"avro\"\n[schema_registry]\nurls = [\"http://r\"]\nusername = \"u\"")
                .expect_err("user without password");
        assert!(err.contains("schema_registry.password"), "{err}");
        let err = load("format = \"avro\"\n[schema_registry]\nurl = \"http://r\"")
            .expect_err("unknown key");
        assert!(err.contains("url"), "{err}");
        let err = load("format = \"xml\"").expect_err("unknown format");
        assert!(err.contains("format"), "{err}");
        let ok = load("format = \"protobuf\"\n[schema_registry]\nurls = [\"https://r:8081\"]\nbearer_token = \"t\"")
            .expect("protobuf with a token");
        assert_eq!(ok.job.format, InputFormat::Protobuf);
        assert!(
            !format!("{ok:?}").contains("\"t\""),
            "the token never prints"
        );
    }

    #[test]
    fn every_shipped_example_in_config_dir_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let mut loaded = 0;
        // The container's token file is a mounted Secret; stand in a real one for the test.
        let tmp = tempfile::tempdir().expect("tempdir");
        let token = tmp.path().join("admin-token");
        std::fs::write(&token, "t0ken").expect("write token");
        for entry in std::fs::read_dir(&dir).expect("config dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).expect("read");
                let text = text
                    .replace(
                        "/etc/streamstate/secrets/admin-token",
                        &token.display().to_string(),
                    )
                    .replace(
                        "/etc/streamstate/secrets/schema-registry-password",
                        &token.display().to_string(),
                    );
                Config::load(&write(&tmp, &text))
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                loaded += 1;
            }
        }
        assert!(loaded >= 2, "expected the shipped examples, found {loaded}");
    }
}
