//! Avro in the Confluent wire format: input records decoded with their writer schema
//! (fetched by id, cached) and, when `[avro] reader_schema_file` is set, resolved to
//! that reader schema; outputs encoded with a registered schema per topic.
//!
//! Decoded values are the JSON the rest of the job sees: records and maps become
//! objects, unions their branch's value, enums their symbol, `bytes`/`fixed` arrays of
//! byte values, logical types their underlying number (so a `timestamp-millis` field
//! is event time in ms as `[job] timestamp` expects).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use apache_avro::Schema;
use apache_avro::schema_compatibility::SchemaCompatibility;

use super::cache::SchemaCache;
use super::config::AvroConfig;
use super::metrics::FormatMetrics;
use super::registry::{RegisteredSchema, RegistryClient, RegistryError};
use super::wire;
use crate::config::ConfigError;
use crate::decode::DecodeError;

pub struct AvroDecoder {
    registry: Arc<RegistryClient>,
    reader: Option<Schema>,
    writers: SchemaCache<Result<Schema, DecodeError>>,
}

impl AvroDecoder {
    pub fn new(
        config: &AvroConfig,
        registry: Arc<RegistryClient>,
        cache_schemas: usize,
        metrics: FormatMetrics,
    ) -> Result<Self, ConfigError> {
        let reader = config
            .reader_schema_file
            .as_deref()
            .map(|p| read_schema("avro.reader_schema_file", p).map(|(s, _)| s))
            .transpose()?;
        Ok(Self {
            registry,
            reader,
            writers: SchemaCache::new(cache_schemas, metrics),
        })
    }

    pub fn decode(&self, payload: &[u8]) -> Result<serde_json::Value, DecodeError> {
        let (id, body) = wire::split(payload)?;
        let writer = self
            .writers
            .get_or_fetch(id, || {
                Ok(self.registry.schema_by_id(id)?.map(|s| self.prepare(id, s)))
            })
            .map_err(|e| DecodeError::RegistryUnavailable(e.to_string()))?
            .ok_or(DecodeError::UnknownSchemaId(id))?;
        let schema = writer.as_ref().as_ref().map_err(Clone::clone)?;
        decode_datum(id, schema, self.reader.as_ref(), body)
    }

    /// A fetched writer schema, checked once: its verdict is cached with it.
    fn prepare(&self, id: u32, s: RegisteredSchema) -> Result<Schema, DecodeError> {
        let schema = Schema::parse_str(s.source_of(id, "AVRO", "avro")?).map_err(|e| {
            DecodeError::UnsupportedSchema(format!("schema id {id} does not parse: {e}"))
        })?;
        if let Some(reader) = &self.reader {
            SchemaCompatibility::can_read(&schema, reader).map_err(|e| {
                DecodeError::SchemaMismatch(format!(
                    "avro.reader_schema_file cannot read schema id {id}: {e}"
                ))
            })?;
        }
        Ok(schema)
    }
}

/// One datum of `writer` (resolved to `reader`) as JSON; the whole body must be used.
fn decode_datum(
    id: u32,
    writer: &Schema,
    reader: Option<&Schema>,
    body: &[u8],
) -> Result<serde_json::Value, DecodeError> {
    let mut rest = body;
    let value = apache_avro::reader::datum::GenericDatumReader::builder(writer)
        .maybe_reader_schema(reader)
        .build()
        .and_then(|r| r.read_value(&mut rest))
        .map_err(|e| classify(&e))?;
    if !rest.is_empty() {
        return Err(DecodeError::InvalidAvro(format!(
            "{} bytes left after the datum of schema id {id}",
            rest.len()
        )));
    }
    serde_json::Value::try_from(value).map_err(|e| DecodeError::InvalidAvro(e.to_string()))
}

/// A datum that ends early is `truncated`; anything else that fails to decode is
/// `invalid_avro`.
fn classify(e: &apache_avro::Error) -> DecodeError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::UnexpectedEof
        {
            return DecodeError::Truncated(format!("the Avro datum ends early: {e}"));
        }
        source = s.source();
    }
    DecodeError::InvalidAvro(e.to_string())
}

fn read_schema(key: &'static str, path: &Path) -> Result<(Schema, String), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
        key,
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    let schema = Schema::parse_str(&text).map_err(|e| ConfigError::Invalid {
        key,
        reason: format!("{} is not an Avro schema: {e}", path.display()),
    })?;
    Ok((schema, text))
}

/// Why an output could not be written as Avro.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("output for topic {topic} does not fit its Avro schema: {reason}")]
    Mismatch { topic: String, reason: String },
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

struct OutputSchema {
    schema: Schema,
    /// As written in the file: what is registered, so the registry's id is for these bytes.
    text: String,
}

/// Outputs as Avro: each topic's schema registered (or looked up) under `<topic>-value`
/// once, then every value encoded with its id.
pub struct AvroEncoder {
    registry: Arc<RegistryClient>,
    default: Option<Arc<OutputSchema>>,
    per_topic: BTreeMap<String, Arc<OutputSchema>>,
    register: bool,
    ids: Mutex<HashMap<String, (u32, Arc<OutputSchema>)>>,
}

impl AvroEncoder {
    pub fn new(config: &AvroConfig, registry: Arc<RegistryClient>) -> Result<Self, ConfigError> {
        let default = config
            .output_schema_file
            .as_deref()
            .map(|p| read_schema("avro.output_schema_file", p))
            .transpose()?
            .map(|(schema, text)| Arc::new(OutputSchema { schema, text }));
        let mut per_topic = BTreeMap::new();
        for (topic, path) in &config.output_schema_files {
            let (schema, text) = read_schema("avro.output_schema_files", path)?;
            per_topic.insert(topic.clone(), Arc::new(OutputSchema { schema, text }));
        }
        Ok(Self {
            registry,
            default,
            per_topic,
            register: config.register_output_schema,
            ids: Mutex::new(HashMap::new()),
        })
    }

    /// Registers (or finds) the schema of `topic` now, so a registry problem stops the
    /// start instead of the first epoch.
    pub fn prepare(&self, topic: &str) -> Result<u32, EncodeError> {
        self.id_for(topic).map(|(id, _)| id)
    }

    /// The topics with a schema of their own.
    pub fn topics(&self) -> impl Iterator<Item = &str> {
        self.per_topic.keys().map(String::as_str)
    }

    fn id_for(&self, topic: &str) -> Result<(u32, Arc<OutputSchema>), EncodeError> {
        if let Some(found) = self
            .ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(topic)
        {
            return Ok(found.clone());
        }
        let schema = self
            .per_topic
            .get(topic)
            .or(self.default.as_ref())
            .cloned()
            .ok_or_else(|| EncodeError::Mismatch {
                topic: topic.to_string(),
                reason: "no Avro schema for this topic (avro.output_schema_file or avro.output_schema_files)".into(),
            })?;
        let subject = format!("{topic}-value");
        let id = if self.register {
            self.registry.register(&subject, &schema.text, "AVRO")?
        } else {
            self.registry
                .lookup(&subject, &schema.text, "AVRO")?
                .ok_or_else(|| EncodeError::Mismatch {
                    topic: topic.to_string(),
                    reason: format!(
                        "subject {subject} does not hold the output schema and avro.register_output_schema is false"
                    ),
                })?
        };
        let entry = (id, schema);
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(topic.to_string(), entry.clone());
        Ok(entry)
    }

    /// A function's JSON output → the wire format with `topic`'s schema.
    pub fn encode(&self, topic: &str, json: &[u8]) -> Result<Vec<u8>, EncodeError> {
        let (id, out) = self.id_for(topic)?;
        to_wire(id, &out.schema, json).map_err(|reason| EncodeError::Mismatch {
            topic: topic.to_string(),
            reason,
        })
    }
}

/// JSON bytes → the wire format of schema `id`: the JSON is resolved to the schema
/// (objects to records, fields the schema lacks left out, defaults filled in, numbers
/// promoted, union branches chosen by value).
fn to_wire(id: u32, schema: &Schema, json: &[u8]) -> Result<Vec<u8>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
    let avro = apache_avro::types::Value::try_from(value)
        .and_then(|v| v.resolve(schema))
        .map_err(|e| e.to_string())?;
    let datum = apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(avro))
        .map_err(|e| e.to_string())?;
    let mut bytes = Vec::with_capacity(wire::HEADER_BYTES + datum.len());
    bytes.extend_from_slice(&wire::header(id));
    bytes.extend_from_slice(&datum);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const V1: &str = r#"{"type":"record","name":"E","fields":[{"name":"user","type":"string"},{"name":"n","type":"long"},{"name":"tag","type":["null","string"],"default":null},{"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;

    fn schema(text: &str) -> Schema {
        Schema::parse_str(text).expect("schema")
    }

    #[test]
    fn round_trips_json_through_the_wire_format() {
        let s = schema(V1);
        let bytes = to_wire(
            7,
            &s,
            br#"{"user":"u1","n":3,"tag":"x","at":1700000000123,"extra":1}"#,
        )
        .expect("encode");
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 7]);
        let (id, body) = wire::split(&bytes).expect("header");
        assert_eq!(
            decode_datum(id, &s, None, body).expect("decode"),
            json!({"user": "u1", "n": 3, "tag": "x", "at": 1_700_000_000_123u64}),
            "unions are their value, timestamp-millis is ms, fields not in the schema are left out"
        );
        let without_tag = to_wire(7, &s, br#"{"user":"u1","n":3,"at":0}"#).expect("default");
        assert_eq!(
            decode_datum(7, &s, None, &without_tag[5..]).expect("decode")["tag"],
            json!(null)
        );
    }

    #[test]
    fn names_a_cut_datum_trailing_bytes_and_an_output_that_does_not_fit() {
        let s = schema(V1);
        let bytes = to_wire(1, &s, br#"{"user":"u1","n":3,"at":5}"#).expect("encode");
        let reason = |b: &[u8]| decode_datum(1, &s, None, b).map_err(|e| e.reason());
        assert_eq!(reason(&bytes[5..bytes.len() - 1]), Err("truncated"));
        assert_eq!(reason(&bytes[5..7]), Err("truncated"));
        let mut long = bytes[5..].to_vec();
        long.push(0);
        assert_eq!(reason(&long), Err("invalid_avro"));
        assert!(
            to_wire(1, &s, br#"{"user":"u1"}"#).is_err(),
            "a required field is missing"
        );
        assert!(
            to_wire(1, &s, br#"{"user":5,"n":1,"at":1}"#).is_err(),
            "a number is not a string"
        );
    }

    #[test]
    fn resolves_a_newer_writer_to_the_reader_schema() {
        let reader = schema(
            r#"{"type":"record","name":"E","fields":[{"name":"user","type":"string"},{"name":"n","type":"long"},{"name":"region","type":"string","default":"eu"}]}"#,
        );
        let writer = schema(V1);
        assert!(SchemaCompatibility::can_read(&writer, &reader).is_ok());
        let bytes = to_wire(1, &writer, br#"{"user":"u1","n":3,"at":5}"#).expect("encode");
        assert_eq!(
            decode_datum(1, &writer, Some(&reader), &bytes[5..]).expect("decode"),
            json!({"user": "u1", "n": 3, "region": "eu"})
        );
        let incompatible =
            schema(r#"{"type":"record","name":"E","fields":[{"name":"user","type":"long"}]}"#);
        assert!(SchemaCompatibility::can_read(&incompatible, &reader).is_err());
    }
}
