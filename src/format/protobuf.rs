//! Protobuf in the Confluent wire format: after the schema id, the message indexes (a
//! zig-zag varint count, then that many indexes; a single 0 means the file's first
//! message), then the message. The registry keeps `.proto` source; it is compiled here
//! with `protox` (Google's well-known imports included) and decoded with
//! `prost-reflect`, then turned into JSON with the proto field names and 64-bit
//! integers as numbers, so `[job] key`, sums and `timestamp` read them as they would
//! read JSON input.

use std::sync::Arc;

use prost_reflect::{DynamicMessage, MessageDescriptor, SerializeOptions};

use super::cache::SchemaCache;
use super::config::ProtobufConfig;
use super::metrics::FormatMetrics;
use super::registry::{RegisteredSchema, RegistryClient};
use super::wire;
use crate::decode::DecodeError;

/// The name the registry's source compiles under; imports resolve beside it.
const FILE: &str = "registry-schema.proto";

pub struct ProtobufDecoder {
    registry: Arc<RegistryClient>,
    message: Option<String>,
    files: SchemaCache<Result<prost_reflect::FileDescriptor, DecodeError>>,
}

impl ProtobufDecoder {
    pub fn new(
        config: &ProtobufConfig,
        registry: Arc<RegistryClient>,
        cache_schemas: usize,
        metrics: FormatMetrics,
    ) -> Self {
        Self {
            registry,
            message: config.message.clone(),
            files: SchemaCache::new(cache_schemas, metrics),
        }
    }

    pub fn decode(&self, payload: &[u8]) -> Result<serde_json::Value, DecodeError> {
        let (id, mut body) = wire::split(payload)?;
        let file = self
            .files
            .get_or_fetch(id, || {
                Ok(self.registry.schema_by_id(id)?.map(|s| compile(id, s)))
            })
            .map_err(|e| DecodeError::RegistryUnavailable(e.to_string()))?
            .ok_or(DecodeError::UnknownSchemaId(id))?;
        let file = file.as_ref().as_ref().map_err(Clone::clone)?;
        let desc = message_at(file, id, &mut body)?;
        if let Some(want) = &self.message
            && desc.full_name() != want
        {
            return Err(DecodeError::SchemaMismatch(format!(
                "schema id {id} names message {}, protobuf.message is {want}",
                desc.full_name()
            )));
        }
        let message = DynamicMessage::decode(desc, body).map_err(|e| {
            let text = e.to_string();
            if text.contains("buffer underflow") || text.contains("unexpected end") {
                DecodeError::Truncated(format!("the Protobuf message ends early: {text}"))
            } else {
                DecodeError::InvalidProtobuf(text)
            }
        })?;
        let options = SerializeOptions::new()
            .stringify_64_bit_integers(false)
            .use_proto_field_name(true)
            .skip_default_fields(false);
        message
            .serialize_with_options(serde_json::value::Serializer, &options)
            .map_err(|e| DecodeError::InvalidProtobuf(e.to_string()))
    }
}

/// The message the indexes name: the first index into the file's messages, each next
/// one into the previous message's nested messages.
fn message_at(
    file: &prost_reflect::FileDescriptor,
    id: u32,
    body: &mut &[u8],
) -> Result<MessageDescriptor, DecodeError> {
    let count = wire::read_zigzag(body)?;
    let indexes = if count == 0 {
        vec![0]
    } else {
        if !(1..=64).contains(&count) {
            return Err(DecodeError::InvalidProtobuf(format!(
                "{count} message indexes in the header"
            )));
        }
        (0..count)
            .map(|_| wire::read_zigzag(body))
            .collect::<Result<Vec<_>, _>>()?
    };
    let missing = || {
        DecodeError::SchemaMismatch(format!(
            "message indexes {indexes:?} name no message of schema id {id}"
        ))
    };
    let at = |i: i64| usize::try_from(i).map_err(|_| missing());
    let mut desc = file.messages().nth(at(indexes[0])?).ok_or_else(missing)?;
    for &i in &indexes[1..] {
        let child = desc.child_messages().nth(at(i)?);
        desc = child.ok_or_else(missing)?;
    }
    Ok(desc)
}

/// One registered `.proto` source compiled to a descriptor.
fn compile(id: u32, s: RegisteredSchema) -> Result<prost_reflect::FileDescriptor, DecodeError> {
    let source = s.source_of(id, "PROTOBUF", "protobuf")?.to_string();
    let unsupported = |e: protox::Error| {
        DecodeError::UnsupportedSchema(format!("schema id {id} does not compile: {e}"))
    };
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(Source(source));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.open_file(FILE).map_err(unsupported)?;
    compiler
        .descriptor_pool()
        .get_file_by_name(FILE)
        .ok_or_else(|| {
            DecodeError::UnsupportedSchema(format!("schema id {id} compiled to no file"))
        })
}

/// The registry's source as the one file [`FILE`].
struct Source(String);

impl protox::file::FileResolver for Source {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        if name == FILE {
            protox::file::File::from_source(name, &self.0)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROTO: &str = "syntax = \"proto3\";\npackage t.v1;\nimport \"google/protobuf/timestamp.proto\";\nmessage A { string x = 1; message Inner { int64 n = 1; } }\nmessage Event { string user_id = 1; int64 seq = 2; google.protobuf.Timestamp at = 3; }\n";

    fn file() -> prost_reflect::FileDescriptor {
        compile(
            3,
            RegisteredSchema {
                schema: PROTO.into(),
                schema_type: "PROTOBUF".into(),
                references: vec![],
            },
        )
        .expect("compiles, with a well-known import")
    }

    #[test]
    fn message_indexes_name_top_level_and_nested_messages() {
        let f = file();
        let name = |b: &[u8]| {
            let mut b = b;
            message_at(&f, 3, &mut b)
                .map(|d| d.full_name().to_string())
                .map_err(|e| e.reason())
        };
        assert_eq!(
            name(&[0]),
            Ok("t.v1.A".into()),
            "a single 0 is the first message"
        );
        assert_eq!(name(&[2, 2]), Ok("t.v1.Event".into()));
        assert_eq!(name(&[4, 0, 0]), Ok("t.v1.A.Inner".into()));
        assert_eq!(name(&[2, 8]), Err("schema_mismatch"));
        assert_eq!(name(&[2]), Err("truncated"));
    }

    #[test]
    fn decodes_to_json_with_proto_names_and_numeric_64_bit_integers() {
        let desc = file().messages().nth(1).expect("Event");
        let mut body = vec![0x0a, 2, b'u', b'1', 0x10];
        body.push(0x96);
        body.push(0x01); // 150
        let m = DynamicMessage::decode(desc, &body[..]).expect("decode");
        let options = SerializeOptions::new()
            .stringify_64_bit_integers(false)
            .use_proto_field_name(true)
            .skip_default_fields(false);
        let v = m
            .serialize_with_options(serde_json::value::Serializer, &options)
            .expect("json");
        assert_eq!(v["user_id"], "u1");
        assert_eq!(v["seq"], 150);
    }

    #[test]
    fn an_avro_schema_id_is_a_mismatch_and_bad_source_is_unsupported() {
        let avro = RegisteredSchema {
            schema: "\"string\"".into(),
            schema_type: "AVRO".into(),
            references: vec![],
        };
        assert_eq!(
            compile(1, avro).map(|_| ()).map_err(|e| e.reason()),
            Err("schema_mismatch")
        );
        let broken = RegisteredSchema {
            schema: "message {".into(),
            schema_type: "PROTOBUF".into(),
            references: vec![],
        };
        assert_eq!(
            compile(1, broken).map(|_| ()).map_err(|e| e.reason()),
            Err("unsupported_schema")
        );
    }
}
