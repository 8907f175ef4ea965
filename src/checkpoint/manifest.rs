//! The manifest: what a checkpoint holds, with enough to verify every byte before restoring.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::CheckpointError;

/// Bumped on any incompatible change; restore refuses versions it does not know.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub checkpoint_id: u64,
    pub app_id: String,
    pub instance: u32,
    pub created_at_ms: u64,
    /// Next offset to read per input partition: the source's operator list state.
    pub offsets: Vec<PartitionOffset>,
    pub state: StateManifest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateManifest {
    pub backend: String,
    pub max_parallelism: u32,
    pub key_group_start: u32,
    pub key_group_end: u32,
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative to the checkpoint directory; never absolute, never `..`.
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

impl FileEntry {
    /// Hashes `root/rel`; used when writing and again when verifying.
    pub fn of(root: &Path, rel: &str) -> Result<Self, CheckpointError> {
        let path = root.join(rel);
        let (size, sha256) = hash_file(&path)?;
        Ok(Self { path: rel.to_string(), size, sha256 })
    }

    /// Rejects paths that could escape the checkpoint directory.
    pub fn is_safe(&self) -> bool {
        let p = Path::new(&self.path);
        !self.path.is_empty()
            && p.components().all(|c| matches!(c, std::path::Component::Normal(_)))
    }
}

pub fn hash_file(path: &Path) -> Result<(u64, String), CheckpointError> {
    let mut file = std::fs::File::open(path).map_err(|e| CheckpointError::io(path, e))?;
    let mut hasher = Sha256::new();
    let size = std::io::copy(&mut file, &mut hasher).map_err(|e| CheckpointError::io(path, e))?;
    Ok((size, hex::encode(hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_that_escape_the_checkpoint() {
        let e = |p: &str| FileEntry { path: p.into(), size: 0, sha256: String::new() };
        assert!(e("db/000012.sst").is_safe());
        assert!(!e("../etc/passwd").is_safe());
        assert!(!e("/etc/passwd").is_safe());
        assert!(!e("").is_safe());
    }
}
