//! Checkpoint storage and the manifest that makes a checkpoint verifiable.
//!
//! A checkpoint becomes visible under its final name only after every file and the
//! manifest are durable, so a crash mid-write leaves debris that recovery deletes, never
//! a half checkpoint. The `COMPLETED` marker is written after the Kafka transaction
//! commits; recovery never relies on it (the committed offsets name the checkpoint) but
//! listing and pruning do.

mod fs;
mod manifest;
mod s3;

pub use fs::FsStorage;
pub use manifest::{
    CheckpointRef, FORMAT_VERSION, Manifest, PartitionOffset, is_safe_path, is_shared,
};
pub use s3::S3Storage;

use std::path::{Path, PathBuf};

use crate::config::{Config, StorageLocation};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint storage I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint {name} is missing at {path}")]
    Missing { name: String, path: PathBuf },
    #[error("checkpoint {name}: manifest {path} is unreadable: {reason}")]
    BadManifest {
        name: String,
        path: PathBuf,
        reason: String,
    },
    #[error("checkpoint {name}: file {path} is missing or damaged: {reason}")]
    Corrupt {
        name: String,
        path: PathBuf,
        reason: String,
    },
    #[error("checkpoint.storage: {0}")]
    Unsupported(String),
    /// A request to an object store failed (after the client's retries), or the client
    /// could not be set up; `key` is the full `s3://bucket/key` address.
    #[error("checkpoint storage {key}: {reason}")]
    ObjectStore { key: String, reason: String },
    /// A second write of a checkpoint name that already has a manifest.
    #[error("checkpoint {name} already exists at {key}: a checkpoint name is published once")]
    AlreadyPublished { name: String, key: String },
}

impl CheckpointError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub checkpoint: CheckpointRef,
    pub completed: bool,
}

/// Bytes a checkpoint added to storage versus the bytes it references.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    pub bytes_written: u64,
    pub bytes_total: u64,
}

/// Where checkpoints of one instance live. Knows nothing of Kafka or of the state
/// backend: it stores the files a manifest lists and hands them back.
pub trait CheckpointStorage: Send + Sync {
    /// Stores the manifest's files from `src` (shared files only when not yet stored),
    /// then the manifest. Everything is durable when this returns, because the caller
    /// commits the Kafka transaction next and that commit declares this the state.
    fn write(&self, manifest: &Manifest, src: &Path) -> Result<WriteStats, CheckpointError>;
    fn mark_complete(&self, checkpoint: &CheckpointRef) -> Result<(), CheckpointError>;
    fn read_manifest(&self, checkpoint: &CheckpointRef) -> Result<Manifest, CheckpointError>;
    /// Makes the checkpoint's files available under the local directory `into` (hard
    /// links or downloads); the state layer verifies their checksums when it restores.
    fn fetch(&self, manifest: &Manifest, into: &Path) -> Result<(), CheckpointError>;
    fn list(&self) -> Result<Vec<CheckpointInfo>, CheckpointError>;
    /// Deletes published checkpoints that were never committed: newer than `committed`
    /// or written by another run with the same id. Unfinished writes are `prune`'s.
    fn discard_uncommitted(
        &self,
        committed: Option<&CheckpointRef>,
    ) -> Result<Vec<CheckpointRef>, CheckpointError>;
    /// Keeps the newest `retained` completed checkpoints and always `keep`; removes
    /// abandoned checkpoints and unfinished writes older than `keep`, and shared files
    /// that no remaining checkpoint references.
    fn prune(&self, retained: usize, keep: &CheckpointRef) -> Result<(), CheckpointError>;
    /// Where a person finds this storage (for log lines).
    fn describe(&self) -> String;
    /// Publishes a small document at `name` below this storage's root, atomically and
    /// only once: an existing `name` is an error (records such as savepoint sets are
    /// written once and never changed).
    fn put_document(&self, name: &str, bytes: &[u8]) -> Result<(), CheckpointError>;
    /// Reads a document written by [`CheckpointStorage::put_document`]; `None` if absent.
    fn get_document(&self, name: &str) -> Result<Option<Vec<u8>>, CheckpointError>;
}

/// Opens the storage `checkpoint.storage` names, for this app and instance.
pub fn open_storage(config: &Config) -> Result<Box<dyn CheckpointStorage>, CheckpointError> {
    let (app, instance) = (&config.kafka.app_id, config.job.instance);
    match config
        .checkpoint_location()
        .map_err(|e| CheckpointError::Unsupported(e.to_string()))?
    {
        StorageLocation::File(dir) => Ok(Box::new(FsStorage::open(&dir, app, instance)?)),
        StorageLocation::S3 { bucket, prefix } => Ok(Box::new(S3Storage::open(
            &bucket,
            &prefix,
            app,
            instance,
            config.checkpoint.timeout,
        )?)),
    }
}

/// Offset metadata written with the transaction's offsets: names the checkpoint that
/// holds the state matching these offsets.
pub fn offset_metadata(checkpoint: &CheckpointRef) -> String {
    format!("streamstate:{checkpoint}")
}

/// Inverse of [`offset_metadata`]; `None` for offsets committed by something else.
pub fn parse_offset_metadata(meta: &str) -> Option<CheckpointRef> {
    CheckpointRef::parse(meta.strip_prefix("streamstate:")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_metadata_round_trips() {
        let c = CheckpointRef::new(42, "00c0ffee");
        assert_eq!(parse_offset_metadata(&offset_metadata(&c)), Some(c));
        assert_eq!(parse_offset_metadata(""), None);
        assert_eq!(parse_offset_metadata("streamstate:chk-x"), None);
    }
}

/// One behaviour suite for every [`CheckpointStorage`]; each backend's tests call it.
#[cfg(test)]
pub(crate) mod suite {
    use super::*;
    use sha2::{Digest, Sha256};
    use streamstate_state::{
        BackendKind, KeyGroupRange, KeyedFormat, SnapshotFile, SnapshotIdentity, SnapshotResult,
    };

    /// Writes `files` (path, content) under `src` and returns a manifest listing them.
    pub fn manifest(c: &CheckpointRef, src: &Path, files: &[(&str, &[u8])]) -> Manifest {
        let mut listed = Vec::new();
        for (path, content) in files {
            let p = src.join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, content).expect("write");
            listed.push(SnapshotFile {
                path: path.to_string(),
                size: content.len() as u64,
                sha256: hex::encode(Sha256::digest(content)),
            });
        }
        Manifest {
            format_version: FORMAT_VERSION,
            checkpoint: c.clone(),
            app_id: "a".into(),
            instance: 0,
            created_at_ms: 0,
            offsets: vec![PartitionOffset {
                topic: "t".into(),
                partition: 0,
                offset: 7,
            }],
            control_offsets: vec![],
            producer_pool_size: Some(3),
            state: SnapshotResult {
                format_version: 1,
                backend: BackendKind::Rocksdb,
                keyed_format: KeyedFormat::RocksdbCheckpoint,
                identity: SnapshotIdentity {
                    checkpoint_id: c.id,
                    max_parallelism: 4,
                    aligned_partitions: None,
                    key_group_range: KeyGroupRange::new(0, 3),
                    instance_index: 0,
                    instance_count: 1,
                },
                files: listed,
            },
        }
    }

    pub fn round_trips_and_shares_sst_files(s: &dyn CheckpointStorage) {
        let src = tempfile::tempdir().expect("dir");
        let (c1, c2) = (
            CheckpointRef::new(1, "00000001"),
            CheckpointRef::new(2, "00000001"),
        );
        let big = vec![7u8; 100_000];
        let m1 = manifest(
            &c1,
            src.path(),
            &[
                ("db/000010.sst", &big),
                ("db/MANIFEST-1", b"m1"),
                ("meta.json", b"{}"),
            ],
        );
        let w1 = s.write(&m1, src.path()).expect("write 1");
        assert!(w1.bytes_written >= 100_000);
        s.mark_complete(&c1).expect("complete");
        assert_eq!(s.read_manifest(&c1).expect("read"), m1);

        let m2 = manifest(
            &c2,
            src.path(),
            &[
                ("db/000010.sst", &big),
                ("db/000011.sst", b"new"),
                ("meta.json", b"{1}"),
            ],
        );
        let w2 = s.write(&m2, src.path()).expect("write 2");
        assert!(
            w2.bytes_written < 10_000,
            "the unchanged SST must not be stored again: {w2:?}"
        );
        assert!(w2.bytes_total > 100_000);
        s.mark_complete(&c2).expect("complete");

        s.prune(1, &c2).expect("prune");
        let names: Vec<_> = s
            .list()
            .expect("list")
            .into_iter()
            .map(|i| i.checkpoint)
            .collect();
        assert_eq!(names, vec![c2.clone()]);
        let out = tempfile::tempdir().expect("dir");
        let into = out.path().join("restore");
        s.fetch(&s.read_manifest(&c2).expect("read"), &into)
            .expect("fetch after prune");
        assert_eq!(std::fs::read(into.join("db/000010.sst")).expect("sst"), big);
        assert_eq!(std::fs::read(into.join("meta.json")).expect("meta"), b"{1}");
    }

    pub fn discards_what_never_committed(s: &dyn CheckpointStorage) {
        let src = tempfile::tempdir().expect("dir");
        let committed = CheckpointRef::new(5, "aaaaaaaa");
        for c in [
            CheckpointRef::new(4, "aaaaaaaa"),
            committed.clone(),
            CheckpointRef::new(5, "bbbbbbbb"),
            CheckpointRef::new(6, "aaaaaaaa"),
        ] {
            s.write(&manifest(&c, src.path(), &[("x", b"x")]), src.path())
                .expect("write");
        }
        let mut removed = s.discard_uncommitted(Some(&committed)).expect("discard");
        removed.sort();
        assert_eq!(
            removed,
            vec![
                CheckpointRef::new(5, "bbbbbbbb"),
                CheckpointRef::new(6, "aaaaaaaa")
            ]
        );
        assert_eq!(s.discard_uncommitted(None).expect("discard all").len(), 2);
    }

    pub fn documents_are_published_once(s: &dyn CheckpointStorage) {
        assert_eq!(s.get_document("sets/a.json").expect("get"), None);
        s.put_document("sets/a.json", b"{\"v\":1}")
            .expect("first put");
        assert!(
            s.put_document("sets/a.json", b"{\"v\":2}").is_err(),
            "a document is written once"
        );
        assert_eq!(
            s.get_document("sets/a.json").expect("get").as_deref(),
            Some(&b"{\"v\":1}"[..])
        );
    }

    pub fn names_missing_checkpoints_and_files(s: &dyn CheckpointStorage) {
        let c = CheckpointRef::new(9, "cccccccc");
        let err = s.read_manifest(&c).expect_err("missing").to_string();
        assert!(
            err.contains("chk-9-cccccccc") && err.contains("missing"),
            "{err}"
        );
    }
}
