//! The manifest: what a checkpoint holds and where each file lives in storage.

use std::fmt;

use serde::{Deserialize, Serialize};
use streamstate_state::SnapshotResult;

/// The format this version writes; bumped on any incompatible change. Restore refuses
/// versions it does not know. 1: the offsets lived only in the manifest; 2: they are the
/// source's operator state (`crate::source::offset_state`), the manifest keeps a copy.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format restore still reads (migrated on restore).
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// Names one checkpoint: a monotonic id plus the id of the process run that wrote it.
///
/// The run part keeps a fenced zombie (paused, then resumed) from overwriting a
/// checkpoint of its successor that happens to get the same id: every process writes
/// only names of its own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CheckpointRef {
    pub id: u64,
    pub run: String,
}

impl CheckpointRef {
    pub fn new(id: u64, run: &str) -> Self {
        Self {
            id,
            run: run.to_string(),
        }
    }

    /// A fresh run id: 8 hex digits from the OS's randomness.
    pub fn new_run() -> String {
        format!("{:08x}", rand::random::<u32>())
    }

    pub fn parse(name: &str) -> Option<Self> {
        let (id, run) = name.strip_prefix("chk-")?.split_once('-')?;
        let valid_run = run.len() == 8 && run.bytes().all(|b| b.is_ascii_hexdigit());
        valid_run.then_some(())?;
        Some(Self {
            id: id.parse().ok()?,
            run: run.to_string(),
        })
    }
}

impl fmt::Display for CheckpointRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chk-{}-{}", self.id, self.run)
    }
}

impl TryFrom<String> for CheckpointRef {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Self::parse(&s).ok_or_else(|| format!("{s:?} is not a checkpoint name"))
    }
}

impl From<CheckpointRef> for String {
    fn from(c: CheckpointRef) -> String {
        c.to_string()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub checkpoint: CheckpointRef,
    pub app_id: String,
    pub instance: u32,
    pub created_at_ms: u64,
    /// Next offset to read per input partition. From format 2 a copy of the source's
    /// union list state, for what reads manifests without loading state (listings, the
    /// committed-offset checks, savepoint sets); restore reads the state.
    pub offsets: Vec<PartitionOffset>,
    /// Next offset to read per control-topic partition (a copy, as `offsets`); the rules
    /// they produced are in the state's broadcast state.
    #[serde(default)]
    pub control_offsets: Vec<PartitionOffset>,
    /// Producers in the pool of the run that wrote this checkpoint, so that a start with
    /// a smaller pool still fences every transactional id that may hold a transaction.
    /// `None`: written before pools, by the single id `<app_id>-<instance>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_pool_size: Option<u32>,
    /// The state layer's own description of its files (sizes, SHA-256, key groups).
    pub state: SnapshotResult,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl Manifest {
    /// Parses and checks a stored manifest for `expected`; the error is the reason only,
    /// each storage adds where the manifest lives.
    pub fn parse(bytes: &[u8], expected: &CheckpointRef) -> Result<Self, String> {
        let manifest: Manifest = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&manifest.format_version) {
            return Err(format!(
                "format version {} is not one of {OLDEST_FORMAT_VERSION}..={FORMAT_VERSION}",
                manifest.format_version
            ));
        }
        if manifest.checkpoint != *expected {
            return Err(format!("names checkpoint {}", manifest.checkpoint));
        }
        if let Some(f) = manifest.state.files.iter().find(|f| !is_safe_path(&f.path)) {
            return Err(format!("file path {:?} escapes the checkpoint", f.path));
        }
        Ok(manifest)
    }
}

/// Immutable RocksDB SST files are stored once under `shared/<sha256>` and referenced by
/// every checkpoint that contains them: that is what makes checkpoints incremental.
pub fn is_shared(path: &str) -> bool {
    path.ends_with(".sst")
}

/// Rejects paths that could escape the checkpoint directory.
pub fn is_safe_path(path: &str) -> bool {
    let p = std::path::Path::new(path);
    !path.is_empty()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_names_round_trip_and_reject_junk() {
        let c = CheckpointRef::new(42, "0badcafe");
        assert_eq!(CheckpointRef::parse(&c.to_string()), Some(c));
        for junk in [
            "chk-1",
            "chk-x-0badcafe",
            "chk-1-../../x",
            "chk-1-0badcafe.tmp",
            "manifest",
        ] {
            assert_eq!(CheckpointRef::parse(junk), None, "{junk}");
        }
    }

    #[test]
    fn refuses_paths_that_escape_the_checkpoint() {
        assert!(is_safe_path("db/000012.sst"));
        assert!(!is_safe_path("../etc/passwd"));
        assert!(!is_safe_path("/etc/passwd"));
        assert!(!is_safe_path(""));
    }
}
