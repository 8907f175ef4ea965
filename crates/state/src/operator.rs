//! Operator state: not keyed, small, held in memory and written whole into
//! every snapshot (as Flink does). List state is split evenly across
//! instances on rescale, union state goes whole to everyone, broadcast state
//! is a map that every instance holds identically.
//!
//! Broadcast state is writable only through [`BroadcastState`], which only
//! the broadcast side's context hands out; the keyed side gets
//! [`ReadOnlyBroadcastState`], which has no mutating methods.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use parking_lot::Mutex;

use serde::{Deserialize, Serialize};

use crate::codec::{StateValue, de, ser_append};
use crate::descriptor::MapStateDescriptor;
use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Redistribution {
    /// Flink's ListState: entries are split evenly over the new instances.
    EvenSplit,
    /// Flink's UnionListState: every instance receives every entry.
    Union,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OperatorList {
    pub mode: Redistribution,
    pub entries: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OperatorStates {
    pub lists: BTreeMap<String, OperatorList>,
    pub broadcast: BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>,
}

/// A store's operator and broadcast state, shared with the handles it gives out. It has
/// a lock of its own: operator state is never on the keyed hot path, and the store takes
/// this lock only while holding its own (snapshot, restore), never the other way round.
pub(crate) type SharedOperatorStates = Arc<Mutex<OperatorStates>>;

/// Whether operator list `name` exists, restored or registered (the handle methods
/// create it, so they cannot tell an empty list from a missing one).
pub(crate) fn has_list(ops: &SharedOperatorStates, name: &str) -> bool {
    ops.lock().lists.contains_key(name)
}

/// The handle of list `name`, created empty with `mode`; an error if it exists with
/// the other mode.
pub(crate) fn list_handle<T: StateValue>(
    ops: &SharedOperatorStates,
    name: &str,
    mode: Redistribution,
) -> Result<OperatorListState<T>> {
    let mut g = ops.lock();
    let entry = g.lists.entry(name.to_string()).or_insert(OperatorList {
        mode,
        entries: Vec::new(),
    });
    if entry.mode != mode {
        return Err(crate::StateError::KindMismatch {
            name: name.into(),
            existing: format!("{:?}", entry.mode),
            requested: format!("{mode:?}"),
        });
    }
    Ok(OperatorListState {
        ops: ops.clone(),
        name: name.to_string(),
        _t: PhantomData,
    })
}

/// The writable handle of broadcast map `d` (the broadcast side's).
pub(crate) fn broadcast_handle<K: StateValue, V: StateValue>(
    ops: &SharedOperatorStates,
    d: &MapStateDescriptor<K, V>,
) -> BroadcastState<K, V> {
    ops.lock().broadcast.entry(d.name.clone()).or_default();
    BroadcastState {
        read: read_only_broadcast_handle(ops, d),
    }
}

/// The read-only handle of broadcast map `d` (the keyed side's).
pub(crate) fn read_only_broadcast_handle<K: StateValue, V: StateValue>(
    ops: &SharedOperatorStates,
    d: &MapStateDescriptor<K, V>,
) -> ReadOnlyBroadcastState<K, V> {
    ReadOnlyBroadcastState {
        ops: ops.clone(),
        name: d.name.clone(),
        _t: PhantomData,
    }
}

/// Handle to an operator list (even-split or union).
#[derive(Clone)]
pub struct OperatorListState<T> {
    ops: SharedOperatorStates,
    name: String,
    _t: PhantomData<fn() -> T>,
}

impl<T: StateValue> OperatorListState<T> {
    fn with<R>(&self, f: impl FnOnce(&mut OperatorList) -> R) -> R {
        let mut g = self.ops.lock();
        let l = g.lists.entry(self.name.clone()).or_insert(OperatorList {
            mode: Redistribution::EvenSplit,
            entries: Vec::new(),
        });
        f(l)
    }
    pub fn get(&self) -> Result<Vec<T>> {
        self.with(|l| l.entries.iter().map(|b| de(b, &self.name)).collect())
    }
    pub fn add(&self, value: &T) -> Result<()> {
        let mut buf = Vec::new();
        ser_append(&mut buf, value, &self.name)?;
        self.with(|l| l.entries.push(buf));
        Ok(())
    }
    pub fn update(&self, values: &[T]) -> Result<()> {
        let mut bufs = Vec::with_capacity(values.len());
        for v in values {
            let mut buf = Vec::new();
            ser_append(&mut buf, v, &self.name)?;
            bufs.push(buf);
        }
        self.with(|l| l.entries = bufs);
        Ok(())
    }
    pub fn clear(&self) {
        self.with(|l| l.entries.clear())
    }
}

/// Read-only access to a broadcast map: all the keyed side may do (the runtime's keyed
/// context hands out only this type). Reading compiles:
///
/// ```
/// # use streamstate_state::*;
/// fn keyed_side(store: &StateStore) -> Result<Option<String>> {
///     let rules = store.read_only_broadcast_state(&MapStateDescriptor::<String, String>::new("rules"));
///     rules.get(&"k".into())
/// }
/// ```
///
/// It has no mutating methods, so the same code writing does not compile:
///
/// ```compile_fail
/// # use streamstate_state::*;
/// fn keyed_side(store: &StateStore) -> Result<()> {
///     let rules = store.read_only_broadcast_state(&MapStateDescriptor::<String, String>::new("rules"));
///     rules.put(&"k".into(), &"v".into())
/// }
/// ```
#[derive(Clone)]
pub struct ReadOnlyBroadcastState<K, V> {
    ops: SharedOperatorStates,
    name: String,
    _t: PhantomData<fn() -> (K, V)>,
}

impl<K: StateValue, V: StateValue> ReadOnlyBroadcastState<K, V> {
    pub fn get(&self, key: &K) -> Result<Option<V>> {
        let mut kb = Vec::new();
        ser_append(&mut kb, key, &self.name)?;
        let g = self.ops.lock();
        match g.broadcast.get(&self.name).and_then(|m| m.get(&kb)) {
            Some(v) => Ok(Some(de(v, &self.name)?)),
            None => Ok(None),
        }
    }
    pub fn contains(&self, key: &K) -> Result<bool> {
        Ok(self.get(key)?.is_some())
    }
    pub fn entries(&self) -> Result<Vec<(K, V)>> {
        let g = self.ops.lock();
        let Some(m) = g.broadcast.get(&self.name) else {
            return Ok(Vec::new());
        };
        m.iter()
            .map(|(k, v)| Ok((de(k, &self.name)?, de(v, &self.name)?)))
            .collect()
    }
}

/// Writable broadcast map: only the broadcast side gets one.
#[derive(Clone)]
pub struct BroadcastState<K, V> {
    read: ReadOnlyBroadcastState<K, V>,
}

impl<K: StateValue, V: StateValue> std::ops::Deref for BroadcastState<K, V> {
    type Target = ReadOnlyBroadcastState<K, V>;
    fn deref(&self) -> &Self::Target {
        &self.read
    }
}

impl<K: StateValue, V: StateValue> BroadcastState<K, V> {
    pub fn put(&self, key: &K, value: &V) -> Result<()> {
        let name = &self.read.name;
        let mut kb = Vec::new();
        ser_append(&mut kb, key, name)?;
        let mut vb = Vec::new();
        ser_append(&mut vb, value, name)?;
        self.read
            .ops
            .lock()
            .broadcast
            .entry(name.clone())
            .or_default()
            .insert(kb, vb);
        Ok(())
    }
    pub fn remove(&self, key: &K) -> Result<()> {
        let name = &self.read.name;
        let mut kb = Vec::new();
        ser_append(&mut kb, key, name)?;
        if let Some(m) = self.read.ops.lock().broadcast.get_mut(name) {
            m.remove(&kb);
        }
        Ok(())
    }
    pub fn clear(&self) {
        if let Some(m) = self.read.ops.lock().broadcast.get_mut(&self.read.name) {
            m.clear();
        }
    }
}
