//! Snapshots without a running job, for the offline checkpoint tools: read
//! and verify a snapshot directory, decode every stored entry into its parts
//! (state, key, namespace, map user key, TTL timestamps, payload bytes), and
//! build a new canonical savepoint from such entries.
//!
//! Nothing here knows value types: payloads stay postcard bytes. The model is
//! in memory ([`RawSnapshot`]), which suits surgery on one instance's part.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::backend::rocks::scan_checkpoint;
use crate::backend::{BackendKind, KvBackend};
use crate::clock::ManualClock;
use crate::error::{IoContext, Result, StateError};
use crate::files::verify_file;
use crate::kind::StateKind;
use crate::layout::{self, FIRST_RESERVED_ID, TIMER_EVENT, TIMER_PROCESSING};
use crate::operator::{OperatorList, OperatorStates};
use crate::snapshot::{
    KEYED_FILE, KeyedFormat, META_FILE, MetaFile, PartMeta, SnapshotResult, read_canonical,
    read_meta,
};
use crate::store::{StateMeta, StateStore};
use crate::timers::TimeDomain;
use crate::ttl::{join_value, split_value};

/// One stored entry, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    State {
        key_group: u32,
        /// The state's name (ids are local to one store).
        state: String,
        kind: StateKind,
        key: Vec<u8>,
        namespace: Vec<u8>,
        /// Map state: the postcard bytes of the user key.
        user_key: Option<Vec<u8>>,
        /// One element (list state: one per list element): the TTL
        /// last-access timestamp when the state has TTL, and the payload.
        values: Vec<(Option<u64>, Vec<u8>)>,
    },
    Timer {
        key_group: u32,
        domain: TimeDomain,
        timestamp: u64,
        key: Vec<u8>,
        namespace: Vec<u8>,
    },
}

impl Entry {
    pub fn key(&self) -> &[u8] {
        match self {
            Entry::State { key, .. } | Entry::Timer { key, .. } => key,
        }
    }
    pub fn key_group_mut(&mut self) -> &mut u32 {
        match self {
            Entry::State { key_group, .. } | Entry::Timer { key_group, .. } => key_group,
        }
    }
}

/// Verifies every file a snapshot lists (presence, size, SHA-256); returns
/// every failure, each naming its file.
pub fn verify_snapshot(dir: &Path, result: &SnapshotResult) -> Vec<StateError> {
    result
        .files
        .iter()
        .filter_map(|f| verify_file(dir, f).err())
        .collect()
}

/// A whole snapshot part in memory: its meta and raw storage entries.
#[derive(Debug, Clone)]
pub struct RawSnapshot {
    pub part: PartMeta,
    /// Storage key → stored value, in key order.
    pub entries: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl RawSnapshot {
    /// Reads `state-meta.json` only.
    pub fn read_meta(dir: &Path) -> Result<MetaFile> {
        read_meta(dir)
    }

    /// Verifies every file, then loads the snapshot. `scratch` receives
    /// RocksDB's logs when the keyed state is a RocksDB checkpoint.
    pub fn read(dir: &Path, result: &SnapshotResult, scratch: &Path) -> Result<Self> {
        if let Some(e) = verify_snapshot(dir, result).into_iter().next() {
            return Err(e);
        }
        let meta = read_meta(dir)?;
        let range = meta.part.identity.key_group_range;
        let mut entries = BTreeMap::new();
        let mut put = |k: &[u8], v: &[u8]| -> Result<()> {
            entries.insert(k.to_vec(), v.to_vec());
            Ok(())
        };
        match result.keyed_format {
            KeyedFormat::Canonical => read_canonical(&dir.join(KEYED_FILE), &mut put)?,
            KeyedFormat::RocksdbCheckpoint => {
                let (start, end) = layout::key_group_bounds(range.start, range.end);
                std::fs::create_dir_all(scratch).at(scratch)?;
                scan_checkpoint(&dir.join("db"), scratch, &start, &end, &mut put)?
            }
        }
        Ok(Self {
            part: meta.part,
            entries,
        })
    }

    pub fn state(&self, name: &str) -> Option<&StateMeta> {
        self.part.states.iter().find(|s| s.name == name)
    }

    /// Decodes one stored entry.
    pub fn decode(&self, k: &[u8], v: &[u8]) -> Result<Entry> {
        let parts = layout::decode_key(k)?;
        if parts.state == TIMER_EVENT || parts.state == TIMER_PROCESSING {
            return Ok(Entry::Timer {
                key_group: parts.kg,
                domain: if parts.state == TIMER_EVENT {
                    TimeDomain::EventTime
                } else {
                    TimeDomain::ProcessingTime
                },
                timestamp: parts.ts.unwrap_or(0),
                key: parts.key.to_vec(),
                namespace: parts.ns.to_vec(),
            });
        }
        if parts.state >= FIRST_RESERVED_ID {
            return Err(StateError::Invalid(format!(
                "reserved state id {:#x} in storage key {}",
                parts.state,
                hex::encode(k)
            )));
        }
        let meta = self
            .part
            .states
            .iter()
            .find(|s| s.id == parts.state)
            .ok_or_else(|| {
                StateError::Invalid(format!(
                    "state id {} not registered in the snapshot",
                    parts.state
                ))
            })?;
        let user_key = (meta.kind == StateKind::Map).then(|| parts.rest.to_vec());
        if meta.kind != StateKind::Map && !parts.rest.is_empty() {
            return Err(StateError::Invalid(format!(
                "state '{}': trailing bytes in storage key {}",
                meta.name,
                hex::encode(k)
            )));
        }
        let values = split_value(meta.kind.into(), meta.ttl.is_some(), v)
            .map_err(|e| StateError::Invalid(format!("state '{}': {e}", meta.name)))?
            .into_iter()
            .map(|(ts, p)| (ts, p.to_vec()))
            .collect();
        Ok(Entry::State {
            key_group: parts.kg,
            state: meta.name.clone(),
            kind: meta.kind,
            key: parts.key.to_vec(),
            namespace: parts.ns.to_vec(),
            user_key,
            values,
        })
    }

    /// Every entry, decoded, in storage order.
    pub fn decoded(&self) -> Result<Vec<Entry>> {
        self.entries
            .iter()
            .map(|(k, v)| self.decode(k, v))
            .collect()
    }

    /// Encodes `entry` for this snapshot's state registry.
    pub fn encode(&self, entry: &Entry) -> Result<(Vec<u8>, Vec<u8>)> {
        let mut k = Vec::new();
        match entry {
            Entry::Timer {
                key_group,
                domain,
                timestamp,
                key,
                namespace,
            } => {
                let d = match domain {
                    TimeDomain::EventTime => TIMER_EVENT,
                    TimeDomain::ProcessingTime => TIMER_PROCESSING,
                };
                layout::encode_timer(&mut k, *key_group, d, *timestamp, key, namespace);
                Ok((k, Vec::new()))
            }
            Entry::State {
                key_group,
                state,
                kind,
                key,
                namespace,
                user_key,
                values,
            } => {
                let meta = self.state(state).ok_or_else(|| {
                    StateError::Invalid(format!("state '{state}' is not declared"))
                })?;
                if meta.kind != *kind {
                    return Err(StateError::KindMismatch {
                        name: state.clone(),
                        existing: meta.kind.to_string(),
                        requested: kind.to_string(),
                    });
                }
                if values
                    .iter()
                    .any(|(ts, _)| ts.is_some() != meta.ttl.is_some())
                {
                    return Err(StateError::Invalid(format!(
                        "state '{state}': TTL timestamps must be given exactly when the state has TTL"
                    )));
                }
                if *kind != StateKind::List && values.len() != 1 {
                    return Err(StateError::Invalid(format!(
                        "state '{state}': a {kind} entry has exactly one value"
                    )));
                }
                if (*kind == StateKind::Map) != user_key.is_some() {
                    return Err(StateError::Invalid(format!(
                        "state '{state}': a user key is given exactly for map state"
                    )));
                }
                layout::encode_prefix(&mut k, *key_group, meta.id, key, namespace);
                if let Some(uk) = user_key {
                    k.extend_from_slice(uk);
                }
                Ok((k, join_value((*kind).into(), values)))
            }
        }
    }

    /// Replaces every entry with `entries` (encoded against this registry).
    pub fn set_entries(&mut self, entries: &[Entry]) -> Result<()> {
        let mut out = BTreeMap::new();
        for e in entries {
            let (k, v) = self.encode(e)?;
            if out.insert(k.clone(), v).is_some() {
                return Err(StateError::Invalid(format!(
                    "duplicate entry for storage key {}",
                    hex::encode(k)
                )));
            }
        }
        self.entries = out;
        Ok(())
    }

    /// Writes this snapshot as a canonical savepoint into `out_dir` (with
    /// `savepoint.json`), via a hashmap store opened in `work_dir`. Every
    /// entry is written as it is: no TTL cleanup happens on the way.
    pub fn write_savepoint(
        &self,
        savepoint_id: u64,
        work_dir: &Path,
        out_dir: &Path,
    ) -> Result<SnapshotResult> {
        for k in self.entries.keys() {
            let kg = u16::from_be_bytes([k[0], k[1]]) as u32;
            let id = &self.part.identity;
            if !id.key_group_range.contains(kg) || kg >= id.max_parallelism {
                return Err(StateError::Invalid(format!(
                    "entry {} is in key group {kg}, outside the range {} of max_parallelism {}",
                    hex::encode(k),
                    id.key_group_range,
                    id.max_parallelism
                )));
            }
        }
        // A one-shot bulk load: nothing is read twice, so no cache.
        let config = self
            .part
            .identity
            .store_config(BackendKind::Hashmap, work_dir, 0);
        // Time 0: nothing counts as expired, so full-snapshot TTL cleanup keeps every entry.
        let store = StateStore::open_with_clock(config, Arc::new(ManualClock::new(0)))?;
        {
            let mut g = store.lock();
            for s in &self.part.states {
                g.install(Arc::new(s.clone()));
            }
            let entries: Vec<(Vec<u8>, Vec<u8>)> = self
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            g.backend.put_many(&entries)?;
            let bad = |e: hex::FromHexError| StateError::Invalid(format!("operator state: {e}"));
            let mut lists = BTreeMap::new();
            for (name, l) in &self.part.operator_lists {
                let entries = l
                    .entries
                    .iter()
                    .map(|e| hex::decode(e).map_err(bad))
                    .collect::<Result<Vec<_>>>()?;
                lists.insert(
                    name.clone(),
                    OperatorList {
                        mode: l.mode,
                        entries,
                    },
                );
            }
            let mut broadcast = BTreeMap::new();
            for (name, m) in &self.part.broadcast {
                let mut map = BTreeMap::new();
                for (k, v) in m {
                    map.insert(hex::decode(k).map_err(bad)?, hex::decode(v).map_err(bad)?);
                }
                broadcast.insert(name.clone(), map);
            }
            *g.operator.lock() = OperatorStates { lists, broadcast };
            g.rebuild_timer_index()?;
        }
        if out_dir.join(META_FILE).exists() {
            return Err(StateError::Invalid(format!(
                "{} already holds a snapshot",
                out_dir.display()
            )));
        }
        store.write_savepoint(savepoint_id, out_dir)
    }
}
