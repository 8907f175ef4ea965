//! The output record every rule emits.
//!
//! It is serialized straight from borrowed parts instead of being built as a
//! `serde_json::Map` first: the S-EO profile (bench/README.md) had building, encoding
//! and dropping that map, with a clone of the whole event for every dedup output, at
//! about a seventh of the process's CPU. The bytes are the same as the map's would be:
//! keys in sorted order, as `serde_json::Map` (a `BTreeMap` here) writes them.
//! [`RuleOutput::write_json`] writes them; the `Serialize` impls, in tests only, are the
//! reference it is checked against.

#[cfg(test)]
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use crate::function::SourceRef;

use super::spec::Rule;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WindowRef {
    pub start: i64,
    pub end: i64,
}

/// One field of an output record: owned where a rule computed it, borrowed where it
/// comes from the rule or the event.
#[derive(Debug)]
pub enum Field<'a> {
    Str(&'a str),
    U64(u64),
    Value(Value),
    Borrowed(&'a Value),
    Window(Option<WindowRef>),
    Source(Option<&'a SourceRef>),
    /// A dedup rule's `{"field", "ttl_ms"}`, on each first sighting.
    Dedup {
        field: &'a str,
        ttl_ms: u64,
    },
}

impl From<Value> for Field<'_> {
    fn from(v: Value) -> Self {
        Field::Value(v)
    }
}

impl<'a> From<&'a Value> for Field<'a> {
    fn from(v: &'a Value) -> Self {
        Field::Borrowed(v)
    }
}

#[cfg(test)]
impl Serialize for Field<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Field::Str(v) => s.serialize_str(v),
            Field::U64(v) => s.serialize_u64(*v),
            Field::Value(v) => v.serialize(s),
            Field::Borrowed(v) => v.serialize(s),
            // Nested objects in sorted key order too, as their `Value` form wrote them.
            Field::Window(None) | Field::Source(None) => s.serialize_none(),
            Field::Window(Some(w)) => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("end", &w.end)?;
                m.serialize_entry("start", &w.start)?;
                m.end()
            }
            Field::Source(Some(r)) => {
                let mut m = s.serialize_map(Some(3))?;
                m.serialize_entry("offset", &r.offset)?;
                m.serialize_entry("partition", &r.partition)?;
                m.serialize_entry("topic", &r.topic)?;
                m.end()
            }
            Field::Dedup { field, ttl_ms } => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("field", field)?;
                m.serialize_entry("ttl_ms", ttl_ms)?;
                m.end()
            }
        }
    }
}

/// `{"rule_id","rule_version","key","kind","value","window","source","timestamp", ...extra}`.
/// `window` is null for unwindowed rules; `source` is null for outputs caused by a timer
/// (window close); `timestamp` is the event's time or the timer's.
#[derive(Debug)]
pub struct RuleOutput<'a> {
    /// Sorted by name, names unique.
    fields: Vec<(&'static str, Field<'a>)>,
}

pub fn record<'a>(
    rule: &'a Rule,
    key: &'a str,
    value: impl Into<Field<'a>>,
    window: Option<WindowRef>,
    source: Option<&'a SourceRef>,
    timestamp_ms: u64,
    extra: impl IntoIterator<Item = (&'static str, Field<'a>)>,
) -> RuleOutput<'a> {
    let mut fields = Vec::with_capacity(12);
    // Already in name order; the extras are put in place one by one, a later field of a
    // name replacing an earlier one, as a map insert does.
    fields.extend([
        ("key", Field::Str(key)),
        ("kind", Field::Str(rule.kind.name())),
        ("rule_id", Field::Str(&rule.id)),
        ("rule_version", Field::U64(rule.version)),
        ("source", Field::Source(source)),
        ("timestamp", Field::U64(timestamp_ms)),
        ("value", value.into()),
        ("window", Field::Window(window)),
    ]);
    for (name, field) in extra {
        match fields.binary_search_by_key(&name, |(n, _)| *n) {
            Ok(i) => fields[i].1 = field,
            Err(i) => fields.insert(i, (name, field)),
        }
    }
    RuleOutput { fields }
}

impl RuleOutput<'_> {
    /// Appends the record's JSON to `out`: the same bytes as `serde_json::to_writer`
    /// (`Serialize` below, the tests' reference), written by hand because serde_json
    /// tests every byte of every string for an escape one at a time, and a dedup output
    /// carries the whole event.
    /// That loop was about 4% of S-EO's CPU (bench/README.md, "JSON out").
    pub fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.push(b'{');
        for (i, (name, field)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_str(out, name)?;
            out.push(b':');
            field.write_json(out)?;
        }
        out.push(b'}');
        Ok(())
    }
}

impl Field<'_> {
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        match self {
            Field::Str(v) => write_str(out, v)?,
            Field::U64(v) => write_int(out, *v),
            Field::Value(v) => write_value(out, v)?,
            Field::Borrowed(v) => write_value(out, v)?,
            Field::Window(None) | Field::Source(None) => out.extend_from_slice(b"null"),
            Field::Window(Some(w)) => {
                out.extend_from_slice(b"{\"end\":");
                write_int(out, w.end);
                out.extend_from_slice(b",\"start\":");
                write_int(out, w.start);
                out.push(b'}');
            }
            Field::Source(Some(r)) => {
                out.extend_from_slice(b"{\"offset\":");
                write_int(out, r.offset);
                out.extend_from_slice(b",\"partition\":");
                write_int(out, r.partition);
                out.extend_from_slice(b",\"topic\":");
                write_str(out, &r.topic)?;
                out.push(b'}');
            }
            Field::Dedup { field, ttl_ms } => {
                out.extend_from_slice(b"{\"field\":");
                write_str(out, field)?;
                out.extend_from_slice(b",\"ttl_ms\":");
                write_int(out, *ttl_ms);
                out.push(b'}');
            }
        }
        Ok(())
    }
}

/// `v` as serde_json writes a `Value`: objects in the map's (sorted) order, compact.
fn write_value(out: &mut Vec<u8>, v: &Value) -> Result<(), serde_json::Error> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // serde_json's own formatting (itoa, ryu), so that floats match to the byte.
        Value::Number(n) => serde_json::to_writer(&mut *out, n)?,
        Value::String(s) => write_str(out, s)?,
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, k)?;
                out.push(b':');
                write_value(out, item)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

fn write_int(out: &mut Vec<u8>, v: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// A string with nothing to escape (the common case) is copied whole; any other goes
/// through serde_json, so escapes are written exactly as it writes them.
fn write_str(out: &mut Vec<u8>, s: &str) -> Result<(), serde_json::Error> {
    if needs_escape(s.as_bytes()) {
        return serde_json::to_writer(&mut *out, s);
    }
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
    Ok(())
}

/// What serde_json escapes: `"`, `\` and the control bytes below 0x20. The chunks are
/// tested without an early exit inside, so the compiler vectorizes them.
fn needs_escape(bytes: &[u8]) -> bool {
    let escapes = |b: u8| (b < 0x20) | (b == b'"') | (b == b'\\');
    let mut chunks = bytes.chunks_exact(16);
    for chunk in &mut chunks {
        if chunk.iter().fold(false, |any, &b| any | escapes(b)) {
            return true;
        }
    }
    chunks.remainder().iter().any(|&b| escapes(b))
}

#[cfg(test)]
impl Serialize for RuleOutput<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.fields.len()))?;
        for (name, field) in &self.fields {
            m.serialize_entry(name, field)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Map, json};

    use super::*;
    use crate::rules::spec;

    /// The record as the engine wrote it before: a `serde_json::Map` built field by field.
    fn as_map(
        rule: &Rule,
        key: &str,
        value: Value,
        window: Option<WindowRef>,
        source: Option<&SourceRef>,
        ts: u64,
        extra: Vec<(&str, Value)>,
    ) -> Vec<u8> {
        let mut m = Map::new();
        m.insert("rule_id".into(), json!(rule.id));
        m.insert("rule_version".into(), json!(rule.version));
        m.insert("key".into(), json!(key));
        m.insert("kind".into(), json!(rule.kind.name()));
        m.insert("value".into(), value);
        m.insert("window".into(), json!(window));
        m.insert("source".into(), json!(source));
        m.insert("timestamp".into(), json!(ts));
        for (k, v) in extra {
            m.insert(k.into(), v);
        }
        serde_json::to_vec(&Value::Object(m)).expect("serialize map")
    }

    #[test]
    fn output_bytes_are_those_of_the_sorted_map() {
        let rule = spec::compile(&json!({"id": "r\"1", "version": 3, "kind": "aggregate",
            "aggregate": {"fn": "count", "emit": "every_event"}}))
        .expect("rule");
        let src = SourceRef {
            topic: "in".into(),
            partition: 2,
            offset: 41,
        };
        let w = Some(WindowRef { start: -5, end: 5 });
        let event = json!({"a": [1, {"b": null}], "é": "x\ny"});
        let got = serde_json::to_vec(&record(
            &rule,
            "k\u{1}",
            &event,
            w,
            Some(&src),
            7,
            [
                ("fn", Field::Str("count")),
                ("count", Field::U64(9)),
                (
                    "dedup",
                    Field::Dedup {
                        field: "/a",
                        ttl_ms: 1,
                    },
                ),
            ],
        ))
        .expect("serialize");
        let want = as_map(
            &rule,
            "k\u{1}",
            event.clone(),
            w,
            Some(&src),
            7,
            vec![
                ("fn", json!("count")),
                ("count", json!(9)),
                ("dedup", json!({"field": "/a", "ttl_ms": 1})),
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
        assert_eq!(
            written(&record(&rule, "k\u{1}", &event, w, Some(&src), 7, [])),
            { as_map(&rule, "k\u{1}", event.clone(), w, Some(&src), 7, vec![]) }
        );

        let got = serde_json::to_vec(&record(&rule, "k", json!(1.5), None, None, 0, []))
            .expect("serialize");
        let want = as_map(&rule, "k", json!(1.5), None, None, 0, vec![]);
        assert_eq!(got, want);
    }

    fn written(r: &RuleOutput<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        r.write_json(&mut out).expect("write");
        out
    }

    /// Strings of every kind: escapes at each place around the 16-byte chunks, control
    /// bytes, DEL, non-ASCII, and long runs with nothing to escape.
    fn any_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("\u{7f}".to_string()),
            Just("é€😀".to_string()),
            (0u8..0x20).prop_map(|b| char::from(b).to_string()),
            "[a-z/ ]{0,20}",
            any::<String>(),
        ];
        proptest::collection::vec(piece, 0..6).prop_map(|p| p.concat())
    }

    fn any_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any_text().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::btree_map(any_text(), inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The hand-written JSON is byte for byte what serde_json writes.
        #[test]
        fn written_json_is_serde_jsons(
            id in any_text(),
            key in any_text(),
            topic in any_text(),
            field in any_text(),
            value in any_value(),
            start in any::<i64>(),
            end in any::<i64>(),
            offset in any::<i64>(),
            partition in any::<i32>(),
            n in any::<u64>(),
        ) {
            let mut rule = spec::compile(&json!({"id": "r", "version": 1, "kind": "aggregate",
                "aggregate": {"fn": "count", "emit": "every_event"}}))
            .expect("rule");
            // Any text, even what `compile` refuses: this is about the bytes.
            (rule.id, rule.version) = (id, n);
            let src = SourceRef { topic, partition, offset };
            let extra = [
                ("dedup", Field::Dedup { field: &field, ttl_ms: n }),
                ("fn", Field::Str(&field)),
                ("count", Field::Value(value.clone())),
                ("fn", Field::U64(n)),
                ("kind", Field::Str(&key)),
            ];
            let window = Some(WindowRef { start, end });
            let r = record(&rule, &key, &value, window, Some(&src), n, extra);
            let want = serde_json::to_vec(&r).expect("serialize");
            let got = written(&r);
            prop_assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&want));
            // And the fields are those of a map the extras were inserted into, in order.
            let model = as_map(&rule, &key, value.clone(), window, Some(&src), n, vec![
                ("dedup", json!({"field": field, "ttl_ms": n})),
                ("fn", json!(field)),
                ("count", value.clone()),
                ("fn", json!(n)),
                ("kind", json!(key)),
            ]);
            prop_assert_eq!(got, model);
            let r = record(&rule, &key, &value, None, None, n, []);
            let want = serde_json::to_vec(&r).expect("serialize");
            prop_assert_eq!(written(&r), want);
        }
    }

    #[test]
    fn a_later_field_replaces_an_earlier_one_of_the_same_name() {
        let rule = spec::compile(&json!({"id": "r", "version": 1, "kind": "aggregate",
            "aggregate": {"fn": "count", "emit": "every_event"}}))
        .expect("rule");
        let r = record(
            &rule,
            "k",
            json!(1),
            None,
            None,
            0,
            [("value", Field::U64(2))],
        );
        let v: Value = serde_json::to_value(&r).expect("serialize");
        assert_eq!(v["value"], json!(2));
        assert_eq!(v.as_object().map(|m| m.len()), Some(8));
    }
}
