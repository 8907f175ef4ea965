//! The benchmark's events in Avro, Confluent wire format: byte 0, the schema id (4 bytes,
//! big-endian), then the Avro binary datum of [`SCHEMA`]. Written by hand (the spec's
//! binary encoding: `long` as a zig-zag varint, `string` as its length then its UTF-8
//! bytes, `double` as 8 little-endian bytes, a record as its fields in order), so the
//! generator shares no code with the Avro decoder it feeds.
//!
//! The schema maps every JSON field to the type its JSON value decodes back to: strings
//! to `string`, `ts` (an integer) to `long`, `amount` (a number with two decimals) to
//! `double`. No field is ever null, so there are no unions. A decoder that turns the
//! datum into JSON therefore gives an object equal, field for field and type for type, to
//! the JSON record of the same event.

use crate::Event;

/// The Avro schema of one event, registered under `<avro topic>-value`.
pub const SCHEMA: &str = r#"{"type":"record","name":"Event","namespace":"streamstate.bench","fields":[{"name":"event_id","type":"string"},{"name":"user_id","type":"string"},{"name":"type","type":"string"},{"name":"amount","type":"double"},{"name":"ts","type":"long"},{"name":"country","type":"string"},{"name":"device","type":"string"},{"name":"page","type":"string"},{"name":"payload","type":"string"}]}"#;

/// `event` as `0 | schema_id | datum`.
pub fn encode(event: &Event, schema_id: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + event.payload.len() + 96);
    out.push(0);
    out.extend_from_slice(&schema_id.to_be_bytes());
    string(&mut out, &event.event_id);
    string(&mut out, &event.user_id);
    string(&mut out, event.kind);
    out.extend_from_slice(&event.amount().to_le_bytes());
    long(&mut out, i64::try_from(event.ts).unwrap_or(i64::MAX));
    string(&mut out, event.country);
    string(&mut out, event.device);
    string(&mut out, &event.page);
    string(&mut out, &event.payload);
    out
}

/// Avro `long`: zig-zag, then a little-endian base-128 varint.
fn long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Avro `string`: its byte length as a `long`, then the UTF-8 bytes.
fn string(out: &mut Vec<u8>, s: &str) {
    long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dist, Generator, Spec};

    fn zigzag(n: i64) -> Vec<u8> {
        let mut v = Vec::new();
        long(&mut v, n);
        v
    }

    #[test]
    fn longs_are_zigzag_varints_as_in_the_avro_spec() {
        // The spec's table, plus both ends of the range.
        assert_eq!(zigzag(0), [0x00]);
        assert_eq!(zigzag(-1), [0x01]);
        assert_eq!(zigzag(1), [0x02]);
        assert_eq!(zigzag(-2), [0x03]);
        assert_eq!(zigzag(2), [0x04]);
        assert_eq!(zigzag(-64), [0x7f]);
        assert_eq!(zigzag(64), [0x80, 0x01]);
        assert_eq!(
            zigzag(i64::MAX),
            [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        assert_eq!(
            zigzag(i64::MIN),
            [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
    }

    /// A reader of exactly this schema, to check the writer against the JSON records.
    struct Reader<'a>(&'a [u8]);

    impl Reader<'_> {
        fn long(&mut self) -> i64 {
            let (mut z, mut shift) = (0u64, 0);
            loop {
                let b = self.0[0];
                self.0 = &self.0[1..];
                z |= u64::from(b & 0x7f) << shift;
                shift += 7;
                if b < 0x80 {
                    return (z >> 1) as i64 ^ -((z & 1) as i64);
                }
            }
        }
        fn string(&mut self) -> String {
            let n = self.long() as usize;
            let s = std::str::from_utf8(&self.0[..n])
                .expect("utf-8")
                .to_string();
            self.0 = &self.0[n..];
            s
        }
        fn double(&mut self) -> f64 {
            let (b, rest) = self.0.split_at(8);
            self.0 = rest;
            f64::from_le_bytes(b.try_into().expect("8 bytes"))
        }
    }

    #[test]
    fn every_record_decodes_to_its_json_event_field_for_field() {
        let schema: serde_json::Value = serde_json::from_str(SCHEMA).expect("schema is JSON");
        let spec = Spec {
            events: 3000,
            keys: 1000,
            dist: Dist::Uniform,
            seed: 11,
            duplicate_rate: 0.01,
            event_bytes: 250,
            start_ms: 1_700_000_000_000,
        };
        for r in Generator::new(spec) {
            let bytes = encode(&r.event, 258);
            assert_eq!(bytes[..5], [0, 0, 0, 1, 2]);
            let json: serde_json::Value = serde_json::from_slice(&r.value).expect("json");
            let json = json.as_object().expect("object");
            let mut rd = Reader(&bytes[5..]);
            let fields = schema["fields"].as_array().expect("fields");
            assert_eq!(
                fields.len(),
                json.len(),
                "the schema names every JSON field"
            );
            for f in fields {
                let name = f["name"].as_str().expect("name");
                let decoded = match f["type"].as_str().expect("a primitive type") {
                    "string" => serde_json::Value::from(rd.string()),
                    "long" => serde_json::Value::from(rd.long()),
                    "double" => serde_json::Value::from(rd.double()),
                    other => panic!("type {other}"),
                };
                let want = &json[name];
                // Python's json (the checker) and serde_json read `12.05` as the nearest
                // double; the double must be that one, and integers stay integers.
                assert_eq!(
                    decoded.is_f64(),
                    want.is_f64(),
                    "{name}: {decoded} vs {want}"
                );
                match name {
                    "amount" => {
                        let text = std::str::from_utf8(&r.value).expect("utf-8");
                        let lit = text
                            .split("\"amount\":")
                            .nth(1)
                            .expect("amount")
                            .split(',')
                            .next()
                            .expect("number");
                        assert_eq!(
                            decoded.as_f64(),
                            Some(lit.parse::<f64>().expect("number")),
                            "{lit}"
                        );
                    }
                    _ => assert_eq!(&decoded, want, "{name}"),
                }
            }
            assert!(rd.0.is_empty(), "nothing after the datum");
        }
    }
}
