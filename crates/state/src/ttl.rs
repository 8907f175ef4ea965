//! State time-to-live, as in Flink: processing time, per value or per
//! list/map entry. Expired values are always removed when read (Flink's
//! behaviour); the cleanup strategies add the ways to remove values nobody
//! reads again.
//!
//! A TTL'd value is stored as `[last-access ms: u64 little-endian][payload]`.
//!
//! Every expiry decision is made here: what a read sees and writes back
//! ([`TtlConfig::on_read`]), and what cleanup (incremental, full snapshot, the RocksDB
//! compaction filter) does with a stored value ([`expire`]). The store, the snapshot
//! writer, the inspector and the backend only carry out the answer.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StateError};
use crate::layout;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum UpdateType {
    /// The timestamp moves on every write (Flink's default).
    #[default]
    OnCreateAndWrite,
    /// Reads refresh the timestamp too.
    OnReadAndWrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum StateVisibility {
    /// An expired value is never returned (Flink's default).
    #[default]
    NeverReturnExpired,
    /// An expired value that no cleanup has removed yet is returned (once:
    /// the read that returns it also removes it).
    ReturnExpiredIfNotCleanedUp,
}

/// Cleanup beyond cleanup-on-read, which is always on.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CleanupStrategies {
    /// Full snapshots (hashmap snapshots, savepoints) leave expired entries out.
    pub full_snapshot: bool,
    /// Visit this many stored entries per record and drop the expired ones.
    pub incremental: Option<u32>,
    /// RocksDB drops expired values when it compacts (no effect on hashmap).
    pub compaction_filter: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtlConfig {
    pub ttl_ms: u64,
    pub update_type: UpdateType,
    pub visibility: StateVisibility,
    pub cleanup: CleanupStrategies,
}

impl TtlConfig {
    pub fn new(ttl: std::time::Duration) -> Self {
        Self {
            ttl_ms: ttl.as_millis() as u64,
            update_type: UpdateType::default(),
            visibility: StateVisibility::default(),
            cleanup: CleanupStrategies::default(),
        }
    }
    pub fn update_type(mut self, u: UpdateType) -> Self {
        self.update_type = u;
        self
    }
    pub fn visibility(mut self, v: StateVisibility) -> Self {
        self.visibility = v;
        self
    }
    pub fn cleanup_full_snapshot(mut self) -> Self {
        self.cleanup.full_snapshot = true;
        self
    }
    pub fn cleanup_incrementally(mut self, entries_per_record: u32) -> Self {
        self.cleanup.incremental = Some(entries_per_record.max(1));
        self
    }
    pub fn cleanup_in_rocksdb_compaction_filter(mut self) -> Self {
        self.cleanup.compaction_filter = true;
        self
    }

    /// Flink's rule: expired once `last_access + ttl <= now`.
    #[inline]
    pub fn is_expired(&self, last_access_ms: u64, now_ms: u64) -> bool {
        last_access_ms.saturating_add(self.ttl_ms) <= now_ms
    }

    /// What a read of a value last accessed at `last_access_ms` does. A read `for_update`
    /// (the read half of a reduce or aggregate) never sees an expired value, whatever the
    /// visibility, and does not refresh: its write will.
    #[inline]
    pub fn on_read(&self, last_access_ms: u64, now_ms: u64, for_update: bool) -> OnRead {
        if self.is_expired(last_access_ms, now_ms) {
            OnRead::Expired {
                visible: !for_update
                    && self.visibility == StateVisibility::ReturnExpiredIfNotCleanedUp,
            }
        } else {
            OnRead::Live {
                refresh: !for_update && self.update_type == UpdateType::OnReadAndWrite,
            }
        }
    }
}

/// The outcome of reading one TTL'd value (or list element).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRead {
    /// Returned; `refresh`: its timestamp moves to now.
    Live { refresh: bool },
    /// Removed by this read (cleanup on read); `visible`: returned once all the same.
    Expired { visible: bool },
}

/// TTL settings by state id, shared with the RocksDB compaction filter, which runs on
/// RocksDB's background threads and so cannot borrow the store.
pub(crate) type TtlRegistry = Arc<RwLock<HashMap<u16, (Framing, TtlConfig)>>>;

/// How a state's stored value holds timestamps: one for the value, or one per element
/// (list state, whose elements expire one by one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Single,
    List,
}

/// What cleanup does with one stored value.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Expiry {
    Keep,
    Remove,
    /// A list with some elements expired: the live ones.
    Rewrite(Vec<u8>),
}

/// What cleanup (incremental, full snapshot, compaction filter) does with the stored
/// value `v` at `now`: a value goes when expired, a list loses its
/// expired elements and goes when none is left.
pub(crate) fn expire(framing: Framing, ttl: &TtlConfig, v: &[u8], now: u64) -> Result<Expiry> {
    let expired = |b: &[u8]| read_ts(b).is_some_and(|ts| ttl.is_expired(ts, now));
    if framing == Framing::List {
        let elems = layout::list_elements(v)?;
        let live: Vec<&[u8]> = elems.iter().copied().filter(|e| !expired(e)).collect();
        return Ok(if live.is_empty() {
            Expiry::Remove
        } else if live.len() == elems.len() {
            Expiry::Keep
        } else {
            let mut out = Vec::new();
            for e in live {
                layout::append_list_element(&mut out, e);
            }
            Expiry::Rewrite(out)
        });
    }
    Ok(if expired(v) {
        Expiry::Remove
    } else {
        Expiry::Keep
    })
}

pub(crate) const TS_LEN: usize = 8;

#[inline]
pub(crate) fn read_ts(bytes: &[u8]) -> Option<u64> {
    bytes.get(..TS_LEN).map(|b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    })
}

/// Splits a stored value into (TTL timestamp, payload) parts: one part, or
/// one per element for list state.
pub fn split_value(framing: Framing, has_ttl: bool, v: &[u8]) -> Result<Vec<(Option<u64>, &[u8])>> {
    fn one(b: &[u8], has_ttl: bool) -> Result<(Option<u64>, &[u8])> {
        if has_ttl {
            let ts = read_ts(b)
                .ok_or_else(|| StateError::Invalid("value without TTL timestamp".into()))?;
            Ok((Some(ts), &b[TS_LEN..]))
        } else {
            Ok((None, b))
        }
    }
    if framing == Framing::List {
        layout::list_elements(v)?
            .into_iter()
            .map(|e| one(e, has_ttl))
            .collect()
    } else {
        Ok(vec![one(v, has_ttl)?])
    }
}

/// Inverse of [`split_value`].
pub fn join_value(framing: Framing, parts: &[(Option<u64>, Vec<u8>)]) -> Vec<u8> {
    let frame = |(ts, p): &(Option<u64>, Vec<u8>)| {
        let mut b = Vec::with_capacity(p.len() + TS_LEN);
        if let Some(ts) = ts {
            b.extend_from_slice(&ts.to_le_bytes());
        }
        b.extend_from_slice(p);
        b
    };
    if framing == Framing::List {
        let mut out = Vec::new();
        for p in parts {
            layout::append_list_element(&mut out, &frame(p));
        }
        out
    } else {
        parts.first().map(frame).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(ts: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = ts.to_le_bytes().to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn a_read_sees_refreshes_or_drops_as_flink_configures_it() {
        let ttl = TtlConfig::new(std::time::Duration::from_millis(100));
        let refreshing = ttl.clone().update_type(UpdateType::OnReadAndWrite);
        let lenient = ttl
            .clone()
            .visibility(StateVisibility::ReturnExpiredIfNotCleanedUp);
        // (config, now, for_update) for a value last accessed at 0; expiry is exactly
        // at last access + ttl, and the read half of an update neither refreshes nor
        // sees an expired value.
        let cases = [
            (&ttl, 99, false, OnRead::Live { refresh: false }),
            (&ttl, 100, false, OnRead::Expired { visible: false }),
            (&refreshing, 50, false, OnRead::Live { refresh: true }),
            (&refreshing, 50, true, OnRead::Live { refresh: false }),
            (&lenient, 100, false, OnRead::Expired { visible: true }),
            (&lenient, 100, true, OnRead::Expired { visible: false }),
        ];
        for (config, now, for_update, expected) in cases {
            assert_eq!(
                config.on_read(0, now, for_update),
                expected,
                "{config:?} at {now}"
            );
        }
    }

    #[test]
    fn cleanup_drops_expired_values_and_list_elements_and_keeps_the_rest() {
        let ttl = TtlConfig::new(std::time::Duration::from_millis(100));
        let clean = |framing, v: &[u8], now| expire(framing, &ttl, v, now).expect("framed");
        let live = stamped(50, b"a");
        assert_eq!(clean(Framing::Single, &live, 149), Expiry::Keep);
        assert_eq!(clean(Framing::Single, &live, 150), Expiry::Remove);
        let mut list = Vec::new();
        layout::append_list_element(&mut list, &stamped(0, b"old"));
        layout::append_list_element(&mut list, &stamped(80, b"new"));
        let mut rest = Vec::new();
        layout::append_list_element(&mut rest, &stamped(80, b"new"));
        assert_eq!(clean(Framing::List, &list, 99), Expiry::Keep);
        assert_eq!(clean(Framing::List, &list, 100), Expiry::Rewrite(rest));
        assert_eq!(clean(Framing::List, &list, 180), Expiry::Remove);
    }
}
