//! State surgery: each operation reads a checkpoint or savepoint, changes the in-memory
//! model, and writes a NEW savepoint (offsets copied from the source); the source is
//! never modified. Every operation prints a JSON report of what it changed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, ensure};
use clap::Subcommand;
use serde_json::{Value, json};
use streamstate_state::offline::{Entry, RawSnapshot};
use streamstate_state::{KeyGroupRange, KeyGroups, TtlConfig};

use super::{fetch, now_ms, savepoint_out};
use crate::config::Config;

#[derive(Debug, Clone, Subcommand)]
pub enum Op {
    /// Change max_parallelism (the number of key groups) and how keys are numbered
    /// into them: every key moves to its key group under the new numbering; the
    /// savepoint covers all of them.
    Rekey {
        #[arg(long)]
        max_parallelism: u32,
        /// Align the key groups to this many input partitions (a divisor of
        /// max_parallelism), so that several instances can share a topic with fewer
        /// partitions than key groups. Without it keys are numbered modulo.
        #[arg(long)]
        aligned_partitions: Option<u32>,
    },
    /// Remove a state and all its entries.
    DropState { name: String },
    /// Give a state a new name (entries unchanged).
    RenameState { from: String, to: String },
    /// Turn TTL on for a state that has none: every existing entry (list: element) gets
    /// the last-access time `--last-access-ms` (default: now), so it expires `--ttl` later.
    AddTtl {
        name: String,
        #[arg(long)]
        ttl: humantime::Duration,
        #[arg(long)]
        last_access_ms: Option<u64>,
    },
    /// Right to be forgotten: remove one key from every keyed state (every namespace,
    /// map entry and list) and its timers. Operator and broadcast state are not keyed.
    DeleteKey {
        key: String,
        /// `key` is hex (for keys that are not UTF-8).
        #[arg(long)]
        hex: bool,
    },
}

impl Op {
    pub fn describe(&self) -> String {
        match self {
            Op::Rekey {
                max_parallelism,
                aligned_partitions: None,
            } => format!("surgery rekey -> {max_parallelism}"),
            Op::Rekey {
                max_parallelism,
                aligned_partitions: Some(p),
            } => format!("surgery rekey -> {max_parallelism} aligned to {p} partitions"),
            Op::DropState { name } => format!("surgery drop-state {name}"),
            Op::RenameState { from, to } => format!("surgery rename-state {from} -> {to}"),
            Op::AddTtl { name, ttl, .. } => format!("surgery add-ttl {name} {ttl}"),
            Op::DeleteKey { .. } => "surgery delete-key".to_string(),
        }
    }
}

/// Applies `op` to `raw`; returns the report.
pub fn apply(raw: &mut RawSnapshot, op: &Op) -> anyhow::Result<Value> {
    let mut entries = raw.decoded()?;
    let report = match op {
        Op::Rekey {
            max_parallelism: n,
            aligned_partitions,
        } => {
            let n = *n;
            let numbering = KeyGroups::aligned(n, aligned_partitions.unwrap_or(1))?;
            let old = raw.part.identity.key_groups()?;
            for e in &mut entries {
                let kg = numbering.of(e.key());
                *e.key_group_mut() = kg;
            }
            raw.part.identity.max_parallelism = n;
            raw.part.identity.aligned_partitions = numbering.aligned_partitions();
            raw.part.identity.key_group_range = KeyGroupRange::all(n);
            json!({
                "operation": "rekey",
                "max_parallelism": {"from": old.max_parallelism(), "to": n},
                "aligned_partitions": {"from": old.aligned_partitions(), "to": numbering.aligned_partitions()},
                "key_group_range": raw.part.identity.key_group_range,
                "entries": entries.len(),
            })
        }
        Op::DropState { name } => {
            ensure!(
                raw.state(name).is_some(),
                "no state '{name}' in the snapshot"
            );
            raw.part.states.retain(|s| &s.name != name);
            let before = entries.len();
            entries.retain(|e| !matches!(e, Entry::State { state, .. } if state == name));
            json!({"operation": "drop-state", "state": name, "entries_removed": before - entries.len()})
        }
        Op::RenameState { from, to } => {
            ensure!(
                raw.state(from).is_some(),
                "no state '{from}' in the snapshot"
            );
            ensure!(raw.state(to).is_none(), "state '{to}' already exists");
            ensure!(!to.is_empty(), "the new name is empty");
            for s in &mut raw.part.states {
                if &s.name == from {
                    s.name = to.clone();
                }
            }
            let mut n = 0;
            for e in &mut entries {
                if let Entry::State { state, .. } = e
                    && state == from
                {
                    *state = to.clone();
                    n += 1;
                }
            }
            json!({"operation": "rename-state", "from": from, "to": to, "entries": n})
        }
        Op::AddTtl {
            name,
            ttl,
            last_access_ms,
        } => {
            let meta = raw
                .part
                .states
                .iter_mut()
                .find(|s| &s.name == name)
                .ok_or_else(|| anyhow::anyhow!("no state '{name}' in the snapshot"))?;
            if meta.ttl.is_some() {
                bail!("state '{name}' already has a TTL");
            }
            let d: std::time::Duration = (*ttl).into();
            ensure!(!d.is_zero(), "--ttl must be positive");
            meta.ttl = Some(TtlConfig::new(d));
            let ts = last_access_ms.unwrap_or_else(now_ms);
            let mut n = 0;
            for e in &mut entries {
                if let Entry::State { state, values, .. } = e
                    && state == name
                {
                    for v in values.iter_mut() {
                        v.0 = Some(ts);
                    }
                    n += 1;
                }
            }
            json!({"operation": "add-ttl", "state": name, "ttl_ms": d.as_millis() as u64, "last_access_ms": ts, "expires_at_ms": ts.saturating_add(d.as_millis() as u64), "entries": n})
        }
        Op::DeleteKey { key, hex: is_hex } => {
            let k = if *is_hex {
                hex::decode(key)?
            } else {
                key.as_bytes().to_vec()
            };
            let mut removed: BTreeMap<(String, String), u64> = BTreeMap::new();
            let mut timers = 0u64;
            entries.retain(|e| {
                if e.key() != k.as_slice() {
                    return true;
                }
                match e {
                    Entry::State {
                        state, namespace, ..
                    } => {
                        *removed
                            .entry((state.clone(), hex::encode(namespace)))
                            .or_default() += 1
                    }
                    Entry::Timer { .. } => timers += 1,
                }
                false
            });
            let by_state: Vec<Value> = removed
                .iter()
                .map(|((s, ns), n)| json!({"state": s, "namespace_hex": ns, "entries": n}))
                .collect();
            let total: u64 = removed.values().sum::<u64>() + timers;
            json!({
                "operation": "delete-key",
                "key": String::from_utf8(k.clone()).ok(),
                "key_hex": hex::encode(&k),
                "key_group": raw.part.identity.key_groups()?.of(&k),
                "removed": by_state,
                "timers_removed": timers,
                "total_removed": total,
            })
        }
    };
    raw.set_entries(&entries)?;
    Ok(report)
}

pub fn run(config: &Config, from: &str, savepoint_dir: &Path, op: Op) -> anyhow::Result<()> {
    let f = fetch(config, from, false)?;
    let mut raw = f.load()?;
    let mut report = apply(&mut raw, &op)?;
    let m = savepoint_out::write(&raw, &f.origin, &op.describe(), savepoint_dir)?;
    report["source"] = json!(f.origin.source);
    report["savepoint"] = json!(savepoint_dir);
    report["savepoint_size_bytes"] = json!(m.state.total_size());
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
