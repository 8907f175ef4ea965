//! `[job] format` / `output_format` and the `[schema_registry]`, `[avro]` and `[protobuf]`
//! sections: what the decoders and the output encoder are built from.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, Secret};

/// `[job] format`: how input record values are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    #[default]
    Json,
    /// Confluent wire format: byte 0, a 4-byte big-endian schema id, an Avro datum.
    Avro,
    /// Confluent wire format: byte 0, the schema id, the message indexes, a Protobuf message.
    Protobuf,
}

/// `[job] output_format`: how the function's outputs are written (dead letters always
/// keep the input's original bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    #[default]
    Json,
    /// Confluent wire format with the schema of `[avro] output_schema_file`, registered
    /// (or required to exist) under the subject `<topic>-value`.
    Avro,
}

/// `[schema_registry]`: a Confluent-compatible Schema Registry API (Confluent, Apicurio's
/// `/apis/ccompat/v7`, Redpanda, Karapace).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Base URLs, tried in order on every request (failover), e.g.
    /// `["http://registry:8081"]` or `["http://apicurio:8080/apis/ccompat/v7"]`.
    pub urls: Vec<String>,
    /// Basic auth user; the password comes from `password` or `password_file`.
    #[serde(default)]
    pub username: Option<String>,
    /// Prefer `STREAMSTATE__SCHEMA_REGISTRY__PASSWORD` or `password_file`; never logged.
    #[serde(default, skip_serializing)]
    pub password: Option<Secret>,
    /// File holding the password (a mounted Secret); surrounding whitespace is ignored.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Bearer token instead of basic auth; never logged.
    #[serde(default, skip_serializing)]
    pub bearer_token: Option<Secret>,
    /// File holding the bearer token (a mounted Secret).
    #[serde(default)]
    pub bearer_token_file: Option<PathBuf>,
    /// PEM bundle of CAs trusted for `https://` URLs besides the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// One HTTP request's limit.
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long a schema fetch is retried while the registry is unreachable (or answers
    /// 5xx) before the open epochs are aborted and replayed from the last checkpoint. A
    /// registry outage never dead-letters a record.
    #[serde(default = "default_retry_for", with = "humantime_serde")]
    pub retry_for: Duration,
    /// Most schemas kept decoded per process (ids are immutable, so each is fetched once
    /// while it stays cached).
    #[serde(default = "default_cache_schemas")]
    pub cache_schemas: usize,
}

/// `[avro]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AvroConfig {
    /// Reader schema (`.avsc`) for input: each writer schema is resolved to it (Avro's
    /// schema resolution: defaults filled, fields projected, types promoted); a writer
    /// schema it cannot read dead-letters its records as `schema_mismatch`. Unset: events
    /// are read with their writer schema.
    #[serde(default)]
    pub reader_schema_file: Option<PathBuf>,
    /// Schema (`.avsc`) of output values with `output_format = "avro"`, for every output
    /// topic not in `output_schema_files`.
    #[serde(default)]
    pub output_schema_file: Option<PathBuf>,
    /// Per output topic (rules may name their own), a schema file for that topic.
    #[serde(default)]
    pub output_schema_files: BTreeMap<String, PathBuf>,
    /// Register the output schema under `<topic>-value` at start (default). Off: the
    /// subject must already hold it (a registry managed by CI), or the start stops.
    #[serde(default = "default_true")]
    pub register_output_schema: bool,
}

/// `[protobuf]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtobufConfig {
    /// Fully qualified message the job reads (e.g. `shop.v1.Event`): a record whose
    /// schema id and message indexes name another message is dead-lettered as
    /// `schema_mismatch`. Unset: any message.
    #[serde(default)]
    pub message: Option<String>,
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_retry_for() -> Duration {
    Duration::from_secs(30)
}
fn default_cache_schemas() -> usize {
    1000
}
fn default_true() -> bool {
    true
}

/// Credentials resolved from the config (files read once at start).
#[derive(Clone, Debug, Default)]
pub enum Auth {
    #[default]
    None,
    Basic {
        username: String,
        password: Secret,
    },
    Bearer(Secret),
}

fn read_secret(key: &'static str, path: &PathBuf) -> Result<Secret, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
        key,
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    match text.trim() {
        "" => Err(ConfigError::Invalid {
            key,
            reason: format!("{} is empty", path.display()),
        }),
        t => Ok(Secret::new(t)),
    }
}

impl RegistryConfig {
    /// The credentials, with `*_file` read now so a missing Secret stops the start.
    pub fn auth(&self) -> Result<Auth, ConfigError> {
        let invalid = |key, reason: &str| ConfigError::Invalid {
            key,
            reason: reason.to_string(),
        };
        let password = match (&self.password, &self.password_file) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "schema_registry.password_file",
                    "set either password or password_file, not both",
                ));
            }
            (Some(p), None) => Some(p.clone()),
            (None, Some(f)) => Some(read_secret("schema_registry.password_file", f)?),
            (None, None) => None,
        };
        let token = match (&self.bearer_token, &self.bearer_token_file) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "schema_registry.bearer_token_file",
                    "set either bearer_token or bearer_token_file, not both",
                ));
            }
            (Some(t), None) => Some(t.clone()),
            (None, Some(f)) => Some(read_secret("schema_registry.bearer_token_file", f)?),
            (None, None) => None,
        };
        match (&self.username, password, token) {
            (Some(_), _, Some(_)) => Err(invalid(
                "schema_registry.bearer_token",
                "set either username (basic auth) or a bearer token, not both",
            )),
            (Some(u), Some(p), None) => Ok(Auth::Basic {
                username: u.clone(),
                password: p,
            }),
            (Some(_), None, None) => Err(invalid(
                "schema_registry.password",
                "username is set but no password or password_file",
            )),
            (None, Some(_), _) => Err(invalid(
                "schema_registry.username",
                "a password is set but no username",
            )),
            (None, None, Some(t)) => Ok(Auth::Bearer(t)),
            (None, None, None) => Ok(Auth::None),
        }
    }
}

/// Checks that `[job] format`/`output_format` have what they need; run by
/// [`crate::config::Config::load`].
pub fn validate(config: &crate::config::Config) -> Result<(), ConfigError> {
    let invalid = |key, reason: String| Err(ConfigError::Invalid { key, reason });
    let needs_registry =
        config.job.format != InputFormat::Json || config.job.output_format != OutputFormat::Json;
    match &config.schema_registry {
        None if needs_registry => {
            return invalid(
                "schema_registry.urls",
                "job.format or job.output_format is not json, so a [schema_registry] with urls is required".into(),
            );
        }
        None => {}
        Some(r) => {
            if r.urls.is_empty() {
                return invalid("schema_registry.urls", "must name at least one URL".into());
            }
            for u in &r.urls {
                match url::Url::parse(u) {
                    Ok(p) if matches!(p.scheme(), "http" | "https") => {}
                    _ => {
                        return invalid(
                            "schema_registry.urls",
                            format!("{u:?} is not an http:// or https:// URL"),
                        );
                    }
                }
            }
            if r.cache_schemas == 0 {
                return invalid("schema_registry.cache_schemas", "must be at least 1".into());
            }
            if r.request_timeout.is_zero() {
                return invalid(
                    "schema_registry.request_timeout",
                    "must be more than 0".into(),
                );
            }
            r.auth()?;
        }
    }
    if config.job.output_format == OutputFormat::Avro && config.avro.output_schema_file.is_none() {
        return invalid(
            "avro.output_schema_file",
            "job.output_format = \"avro\" needs the schema of the output values".into(),
        );
    }
    if config.job.function == crate::config::FunctionKind::Passthrough
        && (config.job.format != InputFormat::Json
            || config.job.output_format != OutputFormat::Json)
    {
        return invalid(
            "job.format",
            "function = \"passthrough\" copies bytes and decodes nothing: leave format and output_format at json".into(),
        );
    }
    Ok(())
}
