//! The output record every rule emits.
//!
//! It is serialized straight from borrowed parts instead of being built as a
//! `serde_json::Map` first: the S-EO profile (bench/README.md) had building, encoding
//! and dropping that map, with a clone of the whole event for every dedup output, at
//! about a seventh of the process's CPU. The bytes are the same as the map's would be:
//! keys in sorted order, as `serde_json::Map` (a `BTreeMap` here) writes them.

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
    fields.extend([
        ("rule_id", Field::Str(&rule.id)),
        ("rule_version", Field::U64(rule.version)),
        ("key", Field::Str(key)),
        ("kind", Field::Str(rule.kind.name())),
        ("value", value.into()),
        ("window", Field::Window(window)),
        ("source", Field::Source(source)),
        ("timestamp", Field::U64(timestamp_ms)),
    ]);
    fields.extend(extra);
    // Stable, so that of two fields with one name the later wins, as in a map insert.
    fields.sort_by_key(|(name, _)| *name);
    let mut i = 0;
    while i + 1 < fields.len() {
        if fields[i].0 == fields[i + 1].0 {
            fields.remove(i);
        } else {
            i += 1;
        }
    }
    RuleOutput { fields }
}

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

        let got = serde_json::to_vec(&record(&rule, "k", json!(1.5), None, None, 0, []))
            .expect("serialize");
        let want = as_map(&rule, "k", json!(1.5), None, None, 0, vec![]);
        assert_eq!(got, want);
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
