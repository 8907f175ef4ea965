//! State time-to-live, as in Flink: processing time, per value or per
//! list/map entry. Expired values are always removed when read (Flink's
//! behaviour); the cleanup strategies add the ways to remove values nobody
//! reads again.
//!
//! A TTL'd value is stored as `[last-access ms: u64 little-endian][payload]`.

use serde::{Deserialize, Serialize};

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
