//! The files of a snapshot as its manifest lists them (path, size, SHA-256), how they are
//! hashed and verified, and the cache that spares re-hashing an SST an earlier checkpoint
//! already listed. Snapshots write these; restore and the offline tools verify them.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{IoContext, Result, StateError};

/// One file of a snapshot, as the checkpoint manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFile {
    /// Relative to the snapshot directory, `/`-separated.
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

pub(crate) fn sha256_file(path: &Path) -> Result<(u64, String)> {
    let mut f = File::open(path).at(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).at(path)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex::encode(h.finalize())))
}

fn is_sst(name: &str) -> bool {
    name.ends_with(".sst")
}

/// SHA-256 of snapshot files, remembered for SSTs (immutable once written, so a name and
/// size seen before need no second read). Shared: the job thread snapshots, the uploader
/// completes deferred hashes, the RocksDB backend hashes new SSTs ahead of them, and all
/// feed the same cache.
#[derive(Clone, Default)]
pub struct FileHashes(Arc<Mutex<HashMap<String, (u64, String)>>>);

impl FileHashes {
    pub(crate) fn cached(&self, name: &str, full: &Path) -> Result<Option<SnapshotFile>> {
        if !is_sst(name) {
            return Ok(None);
        }
        let size = std::fs::metadata(full).at(full)?.len();
        let hit = self.0.lock().get(name).filter(|c| c.0 == size).cloned();
        Ok(hit.map(|(size, sha256)| SnapshotFile {
            path: name.to_string(),
            size,
            sha256,
        }))
    }

    pub(crate) fn hash(&self, name: String, full: &Path) -> Result<SnapshotFile> {
        let (size, sha256) = sha256_file(full)?;
        if is_sst(&name) {
            self.0.lock().insert(name.clone(), (size, sha256.clone()));
        }
        Ok(SnapshotFile {
            path: name,
            size,
            sha256,
        })
    }

    /// Takes a verified file's hash (an SST's; others are not remembered).
    pub(crate) fn remember(&self, f: &SnapshotFile) {
        if is_sst(&f.path) {
            self.0
                .lock()
                .insert(f.path.clone(), (f.size, f.sha256.clone()));
        }
    }

    /// Whether the hash of `name` at `size` is known.
    pub(crate) fn knows(&self, name: &str, size: u64) -> bool {
        self.0.lock().get(name).is_some_and(|c| c.0 == size)
    }

    /// Forgets the files `keep` says no: deleted ones, whose names no snapshot lists again.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        self.0.lock().retain(|name, _| keep(name));
    }

    #[cfg(test)]
    pub(crate) fn get(&self, name: &str) -> Option<String> {
        self.0.lock().get(name).map(|c| c.1.clone())
    }

    pub fn clear(&self) {
        self.0.lock().clear();
    }
}

/// Checks that `f` is in `dir` with its listed size and SHA-256; the error names the file.
pub(crate) fn verify_file(dir: &Path, f: &SnapshotFile) -> Result<()> {
    let path = dir.join(&f.path);
    if !path.is_file() {
        return Err(StateError::Corrupt {
            path,
            reason: "file is missing".into(),
        });
    }
    let (size, sha) = sha256_file(&path)?;
    if size != f.size {
        return Err(StateError::Corrupt {
            path,
            reason: format!("size {size} != expected {}", f.size),
        });
    }
    if sha != f.sha256 {
        return Err(StateError::Corrupt {
            path,
            reason: format!("SHA-256 {sha} != expected {}", f.sha256),
        });
    }
    Ok(())
}
