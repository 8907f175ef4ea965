//! `checkpoints export --format jsonl`: one JSON object per line. The first line is the
//! header (everything but keyed state: states with kinds, TTL and schemas, key groups,
//! operator and broadcast state, the offsets), then one line per stored entry (list state:
//! one line per key and namespace with its elements) and one per timer, in storage order.
//! Bytes are hex; a typed `value` is added where [`super::decoders`] knows the state.
//! `import` reads the same format back (see docs/checkpoint-tools.md).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use streamstate_state::offline::{Entry, RawSnapshot};
use streamstate_state::{PartMeta, StateKind, TimeDomain};

use super::decoders::{Registry, for_function};
use super::{Origin, fetch};
use crate::config::Config;

pub const FORMAT: &str = "streamstate-export";
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line {
    Header(Header),
    Entry(EntryLine),
    Timer(TimerLine),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub version: u32,
    /// Where the state came from and the offsets that belong to it.
    pub origin: Origin,
    /// The exported part's identity, registry and operator state, as its meta file has them.
    #[serde(flatten)]
    pub part: PartMeta,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryLine {
    pub state: String,
    pub kind: StateKind,
    /// Informational: import recomputes it from the key and `max_parallelism`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_group: Option<u32>,
    /// The key as text when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub key_hex: String,
    #[serde(default)]
    pub namespace_hex: String,
    /// Map state: the user key's postcard bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_key_hex: Option<String>,
    /// Value, reducing, aggregating and map state: the one value.
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub value: Option<Element>,
    /// List state: the elements in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements: Option<Vec<Element>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Element {
    /// postcard bytes of the value; wins over `value` on import.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_hex: Option<String>,
    /// Typed JSON, only where the binary knows the state's type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// TTL states: last access (ms since the epoch) that the TTL counts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_last_access_ms: Option<u64>,
    /// TTL states: when the entry expires (`last access + ttl`); informational.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_expires_at_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimerLine {
    pub domain: TimeDomain,
    pub timestamp_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_group: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub key_hex: String,
    #[serde(default)]
    pub namespace_hex: String,
}

pub fn header(raw: &RawSnapshot, origin: &Origin) -> Header {
    Header {
        format: FORMAT.into(),
        version: VERSION,
        origin: origin.clone(),
        part: raw.part.clone(),
    }
}

fn element(
    raw: &RawSnapshot,
    state: &str,
    ts: Option<u64>,
    payload: &[u8],
    codecs: &Registry,
) -> Element {
    let meta = raw.state(state);
    let ttl_ms = meta.and_then(|m| m.ttl.as_ref()).map(|t| t.ttl_ms);
    let value = codecs
        .get(state, meta.and_then(|m| m.schema.as_ref()))
        .and_then(|c| (c.decode)(payload).ok());
    Element {
        value_hex: Some(hex::encode(payload)),
        value,
        ttl_last_access_ms: ts,
        ttl_expires_at_ms: ts.zip(ttl_ms).map(|(t, d)| t.saturating_add(d)),
    }
}

/// One line per entry of `raw`, in storage order.
pub fn entry_lines(raw: &RawSnapshot, codecs: &Registry) -> anyhow::Result<Vec<Line>> {
    let text = |b: &[u8]| std::str::from_utf8(b).ok().map(str::to_string);
    let mut out = Vec::with_capacity(raw.entries.len());
    for (k, v) in &raw.entries {
        out.push(match raw.decode(k, v)? {
            Entry::Timer {
                key_group,
                domain,
                timestamp,
                key,
                namespace,
            } => Line::Timer(TimerLine {
                domain,
                timestamp_ms: timestamp,
                key_group: Some(key_group),
                key: text(&key),
                key_hex: hex::encode(&key),
                namespace_hex: hex::encode(&namespace),
            }),
            Entry::State {
                key_group,
                state,
                kind,
                key,
                namespace,
                user_key,
                values,
            } => {
                let elems: Vec<Element> = values
                    .iter()
                    .map(|(ts, p)| element(raw, &state, *ts, p, codecs))
                    .collect();
                let (value, elements) = if kind == StateKind::List {
                    (None, Some(elems))
                } else {
                    (elems.into_iter().next(), None)
                };
                Line::Entry(EntryLine {
                    key_group: Some(key_group),
                    key: text(&key),
                    key_hex: hex::encode(&key),
                    namespace_hex: hex::encode(&namespace),
                    user_key_hex: user_key.map(hex::encode),
                    state,
                    kind,
                    value,
                    elements,
                })
            }
        });
    }
    Ok(out)
}

/// Writes the whole export of `raw` to `w`.
pub fn write(
    raw: &RawSnapshot,
    origin: &Origin,
    codecs: &Registry,
    w: &mut dyn Write,
) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *w, &Line::Header(header(raw, origin)))?;
    w.write_all(b"\n")?;
    for line in entry_lines(raw, codecs)? {
        serde_json::to_writer(&mut *w, &line)?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    Ok(())
}

pub fn run(config: &Config, from: &str, out: Option<&Path>) -> anyhow::Result<()> {
    let f = fetch(config, from, false)?;
    let raw = f.load()?;
    let codecs = for_function(config.job.function);
    match out {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?;
            let mut w = std::io::BufWriter::new(file);
            write(&raw, &f.origin, &codecs, &mut w)?;
            eprintln!(
                "exported {} entries of {} to {}",
                raw.entries.len(),
                f.origin.source,
                path.display()
            );
        }
        None => {
            let stdout = std::io::stdout();
            let mut w = std::io::BufWriter::new(stdout.lock());
            write(&raw, &f.origin, &codecs, &mut w)?;
        }
    }
    Ok(())
}
