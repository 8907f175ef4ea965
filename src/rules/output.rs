//! The output record every rule emits.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::function::SourceRef;

use super::spec::Rule;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WindowRef {
    pub start: i64,
    pub end: i64,
}

/// `{"rule_id","rule_version","key","kind","value","window","source","timestamp", ...extra}`.
/// `window` is null for unwindowed rules; `source` is null for outputs caused by a timer
/// (window close); `timestamp` is the event's time or the timer's.
pub fn record(
    rule: &Rule,
    key: &str,
    value: Value,
    window: Option<WindowRef>,
    source: Option<&SourceRef>,
    timestamp_ms: u64,
    extra: Vec<(&'static str, Value)>,
) -> Value {
    let mut m = Map::new();
    m.insert("rule_id".into(), Value::from(rule.id.as_str()));
    m.insert("rule_version".into(), Value::from(rule.version));
    m.insert("key".into(), Value::from(key));
    m.insert("kind".into(), Value::from(rule.kind.name()));
    m.insert("value".into(), value);
    m.insert(
        "window".into(),
        serde_json::to_value(window).unwrap_or(Value::Null),
    );
    m.insert(
        "source".into(),
        serde_json::to_value(source).unwrap_or(Value::Null),
    );
    m.insert("timestamp".into(), Value::from(timestamp_ms));
    for (k, v) in extra {
        m.insert(k.into(), v);
    }
    Value::Object(m)
}
