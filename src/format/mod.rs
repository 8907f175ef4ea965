//! Record formats: JSON (the default), and Avro and Protobuf in the Confluent wire format
//! with schemas from a Schema Registry. Decoding ends in the same JSON value whatever the
//! format, so keys, event time, rules, functions and `GET /state` do not know it.
//!
//! - [`config`]: `[job] format`/`output_format`, `[schema_registry]`, `[avro]`, `[protobuf]`.
//! - [`registry`]: the registry client (retries; an outage is the job's to rewind).
//! - [`cache`]: decoded schemas by id, bounded.
//! - [`wire`]: the magic byte, the schema id, Protobuf's message indexes.
//! - [`avro`]: input decoding (with an optional reader schema) and output encoding.
//! - [`protobuf`]: input decoding.

pub mod avro;
pub mod cache;
pub mod config;
pub mod metrics;
pub mod protobuf;
pub mod registry;
pub mod wire;

use std::sync::Arc;

pub use config::{AvroConfig, InputFormat, OutputFormat, ProtobufConfig, RegistryConfig, validate};
pub use metrics::FormatMetrics;

use crate::config::{Config, ConfigError};
use crate::decode::DecodeError;

/// Turns a record's bytes into a JSON value: the first step of decoding.
pub enum ValueReader {
    Json,
    Avro(avro::AvroDecoder),
    Protobuf(protobuf::ProtobufDecoder),
}

impl std::fmt::Debug for ValueReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Json => "Json",
            Self::Avro(_) => "Avro",
            Self::Protobuf(_) => "Protobuf",
        })
    }
}

impl ValueReader {
    /// `payload` is non-empty and within `job.max_record_bytes` already.
    pub fn read(&self, payload: &[u8], max_bytes: usize) -> Result<serde_json::Value, DecodeError> {
        match self {
            Self::Json => crate::decode::parse_json(Some(payload), max_bytes),
            Self::Avro(d) => d.decode(payload),
            Self::Protobuf(d) => d.decode(payload),
        }
    }
}

/// What the job builds from the config: the input reader and, for Avro output, the
/// encoder (its schemas registered already).
pub struct Formats {
    pub reader: ValueReader,
    pub encoder: Option<avro::AvroEncoder>,
}

impl Formats {
    pub fn from_config(config: &Config, metrics: &FormatMetrics) -> Result<Self, FormatError> {
        let registry = match &config.schema_registry {
            Some(r)
                if config.job.format != InputFormat::Json
                    || config.job.output_format != OutputFormat::Json =>
            {
                Some(Arc::new(registry::RegistryClient::new(r, metrics.clone())?))
            }
            _ => None,
        };
        let cache = config
            .schema_registry
            .as_ref()
            .map_or(1000, |r| r.cache_schemas);
        let needs = |key| {
            registry.clone().ok_or(ConfigError::Invalid {
                key,
                reason: "needs [schema_registry]".into(),
            })
        };
        let reader = match config.job.format {
            InputFormat::Json => ValueReader::Json,
            InputFormat::Avro => ValueReader::Avro(avro::AvroDecoder::new(
                &config.avro,
                needs("job.format")?,
                cache,
                metrics.clone(),
            )?),
            InputFormat::Protobuf => ValueReader::Protobuf(protobuf::ProtobufDecoder::new(
                &config.protobuf,
                needs("job.format")?,
                cache,
                metrics.clone(),
            )),
        };
        let encoder = match config.job.output_format {
            OutputFormat::Json => None,
            OutputFormat::Avro => {
                let e = avro::AvroEncoder::new(&config.avro, needs("job.output_format")?)?;
                let topics: Vec<String> = std::iter::once(config.kafka.output_topic.clone())
                    .chain(e.topics().map(str::to_string))
                    .collect();
                for t in topics {
                    e.prepare(&t)?;
                }
                Some(e)
            }
        };
        Ok(Self { reader, encoder })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot start the output format: {0}")]
    Encode(#[from] avro::EncodeError),
}
