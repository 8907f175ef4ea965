//! What the admin API shows about checkpoints and savepoints: a bounded in-memory
//! history that the job loop publishes after each attempt (the loop is the only writer;
//! the admin server only reads). It covers this process run plus the checkpoint it
//! restored; older runs' checkpoints are in checkpoint storage, whose manifests hold
//! the offsets and sizes but not the trigger or timing.

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

use serde::Serialize;

use crate::checkpoint::{Manifest, PartitionOffset, WriteStats};

/// Records kept per kind; older ones drop off the front.
const KEEP: usize = 200;

/// Why a checkpoint was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// `checkpoint.interval` elapsed.
    Periodic,
    /// `POST /checkpoints`.
    Manual,
    /// The first step of a savepoint (`POST /savepoints`, `POST /stop`).
    Savepoint,
    /// SIGTERM/SIGINT or `POST /stop`: the last checkpoint of this run.
    Shutdown,
    /// Right after restoring a savepoint, so recovery never needs the savepoint again.
    AfterSavepointRestore,
    /// Restored at start (taken by an earlier run).
    Restored,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Durable and its transaction committed.
    Completed,
    /// The attempt failed; its transaction was aborted (or the instance stopped).
    Failed,
}

/// One checkpoint attempt, as `GET /checkpoints` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointRecord {
    /// Numeric id (monotonic per instance).
    pub id: u64,
    /// Storage name `chk-<id>-<run>`.
    pub name: String,
    pub status: Status,
    pub trigger: Trigger,
    pub start_time_ms: u64,
    pub end_time_ms: u64,
    pub duration_ms: u64,
    /// Bytes the checkpoint references in storage (written now or shared with earlier ones).
    pub size_bytes: u64,
    /// Bytes this checkpoint added to storage (new SST files, metadata).
    pub incremental_size_bytes: u64,
    /// Next input offset per partition: where a restore resumes.
    pub offsets: Vec<PartitionOffset>,
    pub control_offsets: Vec<PartitionOffset>,
    /// Where the time went, for a checkpoint this process completed (none for the one
    /// it restored, whose timing an earlier run knew).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<Phases>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A checkpoint's duration by phase, as Flink's checkpoint tab splits it into the
/// synchronous and asynchronous parts. `snapshot_ms + flush_ms` is what the job thread
/// paused for; upload and commit ran in the background while the next epoch went on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Phases {
    /// The state's local snapshot at the barrier (job thread).
    pub snapshot_ms: u64,
    /// The epoch producer's flush at the barrier (job thread).
    pub flush_ms: u64,
    /// Finishing the local snapshot and writing it to checkpoint storage (background).
    pub upload_ms: u64,
    /// The part of `upload_ms` before the write: RocksDB's flush of the barrier's
    /// memtables, its hard links, the new files' hashes.
    pub materialize_ms: u64,
    /// Committing the epoch's transaction with its offsets (background).
    pub commit_ms: u64,
}

impl CheckpointRecord {
    pub fn completed(
        trigger: Trigger,
        start_ms: u64,
        end_ms: u64,
        m: &Manifest,
        written: Option<WriteStats>,
        phases: Option<Phases>,
    ) -> Self {
        Self {
            id: m.checkpoint.id,
            name: m.checkpoint.to_string(),
            status: Status::Completed,
            trigger,
            start_time_ms: start_ms,
            end_time_ms: end_ms,
            duration_ms: end_ms.saturating_sub(start_ms),
            size_bytes: m.state.total_size(),
            incremental_size_bytes: written.map_or(0, |w| w.bytes_written),
            offsets: m.offsets.clone(),
            control_offsets: m.control_offsets.clone(),
            phases,
            error: None,
        }
    }

    pub fn failed(
        id: u64,
        name: String,
        trigger: Trigger,
        start_ms: u64,
        end_ms: u64,
        error: String,
    ) -> Self {
        Self {
            id,
            name,
            status: Status::Failed,
            trigger,
            start_time_ms: start_ms,
            end_time_ms: end_ms,
            duration_ms: end_ms.saturating_sub(start_ms),
            size_bytes: 0,
            incremental_size_bytes: 0,
            offsets: Vec::new(),
            control_offsets: Vec::new(),
            phases: None,
            error: Some(error),
        }
    }
}

/// One savepoint, as `GET /savepoints` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SavepointRecord {
    /// `sp-<id>-<run>`: the name `run --from-savepoint` takes.
    pub id: String,
    /// The checkpoint it was taken with: same offsets, same state.
    pub checkpoint: String,
    /// Base location (`file://` or `s3://`); pass to `--savepoint-location` when it is
    /// not the default.
    pub location: String,
    pub created_at_ms: u64,
    pub size_bytes: u64,
    pub offsets: Vec<PartitionOffset>,
    pub control_offsets: Vec<PartitionOffset>,
    pub completed: bool,
}

#[derive(Default)]
struct Inner {
    checkpoints: VecDeque<CheckpointRecord>,
    savepoints: VecDeque<SavepointRecord>,
}

/// Shared between the job loop (writer) and the admin server (reader).
#[derive(Clone, Default)]
pub struct History(Arc<RwLock<Inner>>);

impl History {
    pub fn record_checkpoint(&self, r: CheckpointRecord) {
        if let Ok(mut h) = self.0.write() {
            if h.checkpoints.len() == KEEP {
                h.checkpoints.pop_front();
            }
            h.checkpoints.push_back(r);
        }
    }

    pub fn record_savepoint(&self, r: SavepointRecord) {
        if let Ok(mut h) = self.0.write() {
            if h.savepoints.len() == KEEP {
                h.savepoints.pop_front();
            }
            h.savepoints.push_back(r);
        }
    }

    /// Newest first.
    pub fn checkpoints(&self) -> Vec<CheckpointRecord> {
        self.0
            .read()
            .map(|h| h.checkpoints.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    /// The latest attempt with this numeric id or name.
    pub fn checkpoint(&self, id: u64) -> Option<CheckpointRecord> {
        self.0
            .read()
            .ok()?
            .checkpoints
            .iter()
            .rev()
            .find(|r| r.id == id)
            .cloned()
    }

    /// Savepoints written by this process (any location), newest first.
    pub fn savepoints(&self) -> Vec<SavepointRecord> {
        self.0
            .read()
            .map(|h| h.savepoints.iter().rev().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_bounded_history_newest_first() {
        let h = History::default();
        for id in 0..(KEEP as u64 + 5) {
            h.record_checkpoint(CheckpointRecord::failed(
                id,
                format!("chk-{id}-00000000"),
                Trigger::Manual,
                0,
                1,
                "x".into(),
            ));
        }
        let all = h.checkpoints();
        assert_eq!(all.len(), KEEP);
        assert_eq!(all[0].id, KEEP as u64 + 4);
        assert!(h.checkpoint(2).is_none());
        assert_eq!(h.checkpoint(10).map(|r| r.duration_ms), Some(1));
    }
}
