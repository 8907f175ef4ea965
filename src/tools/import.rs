//! `checkpoints import <jsonl> --savepoint-dir <dir>`: an export (possibly edited) back
//! into a NEW savepoint. Key groups are recomputed from each key and the header's
//! `max_parallelism`; `value_hex` wins over a typed `value`, which is encoded with the
//! job's codec when there is no hex.

use std::io::BufRead;
use std::path::Path;

use anyhow::{Context, anyhow, bail};
use streamstate_state::StateKind;
use streamstate_state::offline::{Entry, RawSnapshot};

use super::decoders::{Registry, for_function};
use super::export::{Element, FORMAT, Header, Line, VERSION};
use super::{Origin, savepoint_out};
use crate::config::Config;

/// Parses an export into a snapshot model and the origin it names.
pub fn parse(reader: impl BufRead, codecs: &Registry) -> anyhow::Result<(RawSnapshot, Origin)> {
    let mut lines = reader
        .lines()
        .enumerate()
        .filter(|(_, l)| l.as_ref().map_or(true, |l| !l.trim().is_empty()));
    let (_, first) = lines
        .next()
        .ok_or_else(|| anyhow!("empty export: the first line must be the header"))?;
    let header: Header = match serde_json::from_str(&first?).context("line 1")? {
        Line::Header(h) => h,
        _ => bail!("line 1: the first line must be the header"),
    };
    if header.format != FORMAT || header.version != VERSION {
        bail!(
            "line 1: unknown format {} v{}",
            header.format,
            header.version
        );
    }
    let key_groups = header.part.identity.key_groups()?;
    let mut raw = RawSnapshot {
        part: header.part,
        entries: Default::default(),
    };
    let mut entries = Vec::new();
    for (i, line) in lines {
        let n = i + 1;
        let line: Line = serde_json::from_str(&line?).with_context(|| format!("line {n}"))?;
        let entry = match line {
            Line::Header(_) => bail!("line {n}: a second header"),
            Line::Timer(t) => {
                let key = hex::decode(&t.key_hex).with_context(|| format!("line {n}: key_hex"))?;
                Entry::Timer {
                    key_group: key_groups.of(&key),
                    domain: t.domain,
                    timestamp: t.timestamp_ms,
                    namespace: hex::decode(&t.namespace_hex)
                        .with_context(|| format!("line {n}: namespace_hex"))?,
                    key,
                }
            }
            Line::Entry(e) => {
                let meta = raw
                    .state(&e.state)
                    .ok_or_else(|| anyhow!("line {n}: state '{}' is not in the header", e.state))?
                    .clone();
                if meta.kind != e.kind {
                    bail!(
                        "line {n}: state '{}' is {} in the header, the line says {}",
                        e.state,
                        meta.kind,
                        e.kind
                    );
                }
                let codec = codecs.get(&e.state, meta.schema.as_ref());
                let ttl_ms = meta.ttl.as_ref().map(|t| t.ttl_ms);
                let value = |el: &Element| -> anyhow::Result<(Option<u64>, Vec<u8>)> {
                    let bytes = match (&el.value_hex, &el.value, codec) {
                        (Some(h), _, _) => {
                            hex::decode(h).with_context(|| format!("line {n}: value_hex"))?
                        }
                        (None, Some(v), Some(c)) => {
                            (c.encode)(v).map_err(|m| anyhow!("line {n}: value: {m}"))?
                        }
                        (None, Some(_), None) => bail!(
                            "line {n}: state '{}' has no known type: give value_hex",
                            e.state
                        ),
                        (None, None, _) => bail!("line {n}: no value"),
                    };
                    let ts = match ttl_ms {
                        None => None,
                        Some(d) => Some(
                            el.ttl_last_access_ms
                                .or_else(|| el.ttl_expires_at_ms.map(|x| x.saturating_sub(d)))
                                .ok_or_else(|| {
                                    anyhow!(
                                        "line {n}: state '{}' has TTL: give ttl_last_access_ms",
                                        e.state
                                    )
                                })?,
                        ),
                    };
                    Ok((ts, bytes))
                };
                let values = if meta.kind == StateKind::List {
                    e.elements
                        .as_deref()
                        .ok_or_else(|| anyhow!("line {n}: list state needs elements"))?
                        .iter()
                        .map(value)
                        .collect::<anyhow::Result<Vec<_>>>()?
                } else {
                    vec![value(
                        e.value
                            .as_ref()
                            .ok_or_else(|| anyhow!("line {n}: no value"))?,
                    )?]
                };
                let key = hex::decode(&e.key_hex).with_context(|| format!("line {n}: key_hex"))?;
                Entry::State {
                    key_group: key_groups.of(&key),
                    state: e.state,
                    kind: e.kind,
                    namespace: hex::decode(&e.namespace_hex)
                        .with_context(|| format!("line {n}: namespace_hex"))?,
                    user_key: e
                        .user_key_hex
                        .map(|h| hex::decode(h).with_context(|| format!("line {n}: user_key_hex")))
                        .transpose()?,
                    values,
                    key,
                }
            }
        };
        entries.push(entry);
    }
    raw.set_entries(&entries)?;
    Ok((raw, header.origin))
}

pub fn run(config: &Config, jsonl: &Path, savepoint_dir: &Path) -> anyhow::Result<()> {
    let file =
        std::fs::File::open(jsonl).with_context(|| format!("opening {}", jsonl.display()))?;
    let (raw, origin) = parse(
        std::io::BufReader::new(file),
        &for_function(config.job.function),
    )?;
    let m = savepoint_out::write(
        &raw,
        &origin,
        &format!("import {}", jsonl.display()),
        savepoint_dir,
    )?;
    println!(
        "{}",
        serde_json::json!({"savepoint": savepoint_dir, "entries": raw.entries.len(), "states": raw.part.states.len(), "size_bytes": m.state.total_size(), "origin": origin.source})
    );
    Ok(())
}
