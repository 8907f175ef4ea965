//! Checkpoint storage and the manifest that makes a checkpoint verifiable.
//!
//! A checkpoint directory becomes visible under its final name only after every file and
//! the manifest are fsynced, so a crash mid-write leaves a `.tmp` directory that recovery
//! deletes, never a half checkpoint. The `COMPLETED` marker is written after the Kafka
//! transaction commits; recovery never relies on it (the committed offsets name the
//! checkpoint) but pruning and listing do.

mod manifest;
mod storage;

pub use manifest::{FORMAT_VERSION, FileEntry, Manifest, PartitionOffset, StateManifest, hash_file};
pub use storage::{CheckpointInfo, FsStorage};

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint I/O on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("checkpoint chk-{id} is missing at {path}")]
    Missing { id: u64, path: PathBuf },
    #[error("checkpoint chk-{id}: manifest {path} is unreadable: {reason}")]
    BadManifest { id: u64, path: PathBuf, reason: String },
    #[error("checkpoint chk-{id}: file {path} is corrupt: {reason}")]
    Corrupt { id: u64, path: PathBuf, reason: String },
}

impl CheckpointError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io { path: path.to_path_buf(), source }
    }
}

/// Offset metadata written with the transaction's offsets: names the checkpoint that
/// holds the state matching these offsets.
pub fn offset_metadata(id: u64) -> String {
    format!("streamstate:chk-{id}")
}

/// Inverse of [`offset_metadata`]; `None` for offsets committed by something else.
pub fn parse_offset_metadata(meta: &str) -> Option<u64> {
    meta.strip_prefix("streamstate:chk-")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_metadata_round_trips() {
        assert_eq!(parse_offset_metadata(&offset_metadata(42)), Some(42));
        assert_eq!(parse_offset_metadata(""), None);
        assert_eq!(parse_offset_metadata("streamstate:chk-x"), None);
    }
}
