//! `checkpoints inspect`: what a checkpoint or savepoint holds, as JSON.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::json;
use streamstate_state::offline::{Entry, RawSnapshot};
use streamstate_state::snapshot::HexList;

use super::{Origin, fetch};
use crate::config::Config;
use crate::source::offset_state;

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
pub struct StateStats {
    pub kind: String,
    pub ttl: bool,
    pub schema: Option<streamstate_state::SchemaMeta>,
    /// Stored entries (map: one per user key; list: one per key and namespace).
    pub entries: u64,
    /// List elements (list state only).
    pub elements: u64,
    pub distinct_keys: u64,
    pub key_bytes: u64,
    pub value_bytes: u64,
}

/// Per-state statistics of a loaded snapshot; timers under `"<timers>"`.
pub fn stats(raw: &RawSnapshot) -> anyhow::Result<BTreeMap<String, StateStats>> {
    let mut out: BTreeMap<String, StateStats> = BTreeMap::new();
    let mut keys: BTreeMap<String, std::collections::BTreeSet<Vec<u8>>> = BTreeMap::new();
    for s in &raw.part.states {
        out.insert(
            s.name.clone(),
            StateStats {
                kind: s.kind.to_string(),
                ttl: s.ttl.is_some(),
                schema: s.schema.clone(),
                ..Default::default()
            },
        );
    }
    for (k, v) in &raw.entries {
        let e = raw.decode(k, v)?;
        let name = match &e {
            Entry::State { state, .. } => state.clone(),
            Entry::Timer { .. } => "<timers>".to_string(),
        };
        let st = out.entry(name.clone()).or_insert_with(|| StateStats {
            kind: "timers".into(),
            ..Default::default()
        });
        st.entries += 1;
        if let Entry::State {
            kind: streamstate_state::StateKind::List,
            values,
            ..
        } = &e
        {
            st.elements += values.len() as u64;
        }
        st.key_bytes += k.len() as u64;
        st.value_bytes += v.len() as u64;
        keys.entry(name).or_default().insert(e.key().to_vec());
    }
    for (name, ks) in keys {
        if let Some(st) = out.get_mut(&name) {
            st.distinct_keys = ks.len() as u64;
        }
    }
    Ok(out)
}

pub fn report(
    origin: &Origin,
    state: &streamstate_state::SnapshotResult,
    raw: &RawSnapshot,
) -> anyhow::Result<serde_json::Value> {
    Ok(json!({
        "source": origin.source,
        "app_id": origin.app_id,
        "instance": origin.instance,
        "created_at_ms": origin.created_at_ms,
        "offsets": origin.offsets,
        "control_offsets": origin.control_offsets,
        "snapshot": {
            "checkpoint_id": state.identity.checkpoint_id,
            "backend": state.backend,
            "keyed_format": state.keyed_format,
            "max_parallelism": state.identity.max_parallelism,
            "key_group_range": state.identity.key_group_range,
            "instance_index": state.identity.instance_index,
            "instance_count": state.identity.instance_count,
            "files": state.files.len(),
            "size_bytes": state.total_size(),
        },
        "states": stats(raw)?,
        "operator_lists": raw.part.operator_lists.iter().map(|(n, l)| (n.clone(), operator_list(n, l))).collect::<BTreeMap<_, _>>(),
        "broadcast": raw.part.broadcast.iter().map(|(n, m)| (n.clone(), m.len())).collect::<BTreeMap<_, _>>(),
    }))
}

/// An operator list's mode and size; the source's offsets decoded too.
fn operator_list(name: &str, list: &HexList) -> serde_json::Value {
    let mut v = json!({"mode": list.mode, "entries": list.entries.len()});
    match offset_state::decode_stored(name, &list.entries) {
        Some(Ok(offsets)) => v["offsets"] = json!(offsets),
        Some(Err(e)) => v["error"] = json!(e),
        None => {}
    }
    v
}

pub fn run(config: &Config, from: &str) -> anyhow::Result<()> {
    let f = fetch(config, from, false)?;
    let raw = f.load()?;
    println!(
        "{}",
        serde_json::to_string_pretty(&report(&f.origin, &f.state, &raw)?)?
    );
    Ok(())
}
