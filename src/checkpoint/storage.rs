//! `file://` checkpoint storage: a local or shared volume.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{CheckpointError, FORMAT_VERSION, Manifest, hash_file};

const MANIFEST: &str = "manifest.json";
const COMPLETED: &str = "COMPLETED";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub id: u64,
    pub completed: bool,
}

/// Checkpoints of one instance of one app: `<base>/<app_id>/instance-<n>/chk-<id>/`.
#[derive(Debug, Clone)]
pub struct FsStorage {
    root: PathBuf,
}

impl FsStorage {
    pub fn open(base: &Path, app_id: &str, instance: u32) -> Result<Self, CheckpointError> {
        let root = base.join(app_id).join(format!("instance-{instance}"));
        fs::create_dir_all(&root).map_err(|e| CheckpointError::io(&root, e))?;
        Ok(Self { root })
    }

    pub fn dir(&self, id: u64) -> PathBuf {
        self.root.join(format!("chk-{id}"))
    }

    /// Copies the manifest's files from `src` and publishes `chk-<id>` atomically.
    /// Returns the bytes written. Everything is fsynced before this returns, because the
    /// caller commits the Kafka transaction next and that commit declares this checkpoint
    /// to be the state.
    pub fn write(&self, manifest: &Manifest, src: &Path) -> Result<u64, CheckpointError> {
        let final_dir = self.dir(manifest.checkpoint_id);
        let tmp = self.root.join(format!("chk-{}.tmp", manifest.checkpoint_id));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| CheckpointError::io(&tmp, e))?;
        }
        fs::create_dir_all(&tmp).map_err(|e| CheckpointError::io(&tmp, e))?;
        let mut bytes = 0;
        for entry in &manifest.state.files {
            let from = src.join(&entry.path);
            let to = tmp.join(&entry.path);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent).map_err(|e| CheckpointError::io(parent, e))?;
            }
            bytes += fs::copy(&from, &to).map_err(|e| CheckpointError::io(&from, e))?;
            sync_file(&to)?;
        }
        let manifest_path = tmp.join(MANIFEST);
        let json = serde_json::to_vec_pretty(manifest).map_err(|e| CheckpointError::BadManifest {
            id: manifest.checkpoint_id,
            path: manifest_path.clone(),
            reason: e.to_string(),
        })?;
        write_synced(&manifest_path, &json)?;
        bytes += json.len() as u64;
        for dir in dirs_below(&tmp)? {
            sync_dir(&dir)?;
        }
        if final_dir.exists() {
            // A leftover of an epoch that never committed (its id was not named by offsets).
            fs::remove_dir_all(&final_dir).map_err(|e| CheckpointError::io(&final_dir, e))?;
        }
        fs::rename(&tmp, &final_dir).map_err(|e| CheckpointError::io(&final_dir, e))?;
        sync_dir(&self.root)?;
        Ok(bytes)
    }

    pub fn mark_complete(&self, id: u64) -> Result<(), CheckpointError> {
        write_synced(&self.dir(id).join(COMPLETED), b"")
    }

    pub fn read_manifest(&self, id: u64) -> Result<Manifest, CheckpointError> {
        let dir = self.dir(id);
        if !dir.is_dir() {
            return Err(CheckpointError::Missing { id, path: dir });
        }
        let path = dir.join(MANIFEST);
        let bad = |reason: String| CheckpointError::BadManifest { id, path: path.clone(), reason };
        let bytes = fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(bad(format!("format version {} is not {FORMAT_VERSION}", manifest.format_version)));
        }
        if manifest.checkpoint_id != id {
            return Err(bad(format!("names checkpoint {}", manifest.checkpoint_id)));
        }
        if let Some(f) = manifest.state.files.iter().find(|f| !f.is_safe()) {
            return Err(bad(format!("file path {:?} escapes the checkpoint", f.path)));
        }
        Ok(manifest)
    }

    /// Verifies every file of `chk-<id>` against the manifest before anything is restored,
    /// so a broken checkpoint is reported by file name and never half-applied.
    pub fn verify(&self, id: u64) -> Result<Manifest, CheckpointError> {
        let manifest = self.read_manifest(id)?;
        let dir = self.dir(id);
        for entry in &manifest.state.files {
            let path = dir.join(&entry.path);
            let corrupt = |reason: String| CheckpointError::Corrupt { id, path: path.clone(), reason };
            let (size, sha) = hash_file(&path).map_err(|e| corrupt(e.to_string()))?;
            if size != entry.size {
                return Err(corrupt(format!("size {size} != {} in manifest", entry.size)));
            }
            if sha != entry.sha256 {
                return Err(corrupt("SHA-256 differs from manifest".into()));
            }
        }
        Ok(manifest)
    }

    pub fn list(&self) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.root).map_err(|e| CheckpointError::io(&self.root, e))? {
            let entry = entry.map_err(|e| CheckpointError::io(&self.root, e))?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_prefix("chk-")).and_then(|n| n.parse().ok()) else {
                continue;
            };
            out.push(CheckpointInfo { id, completed: entry.path().join(COMPLETED).exists() });
        }
        out.sort_by_key(|c| c.id);
        Ok(out)
    }

    /// The highest id ever published, so new ids never reuse one a zombie may hold.
    pub fn max_id(&self) -> Result<u64, CheckpointError> {
        Ok(self.list()?.last().map_or(0, |c| c.id))
    }

    /// Deletes checkpoints newer than the committed one (never committed, so never the
    /// state) and unfinished `.tmp` directories.
    pub fn discard_uncommitted(&self, committed: Option<u64>) -> Result<Vec<u64>, CheckpointError> {
        let mut removed = Vec::new();
        for entry in fs::read_dir(&self.root).map_err(|e| CheckpointError::io(&self.root, e))? {
            let entry = entry.map_err(|e| CheckpointError::io(&self.root, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("chk-") && name.ends_with(".tmp") {
                fs::remove_dir_all(entry.path()).map_err(|e| CheckpointError::io(&entry.path(), e))?;
            }
        }
        for c in self.list()? {
            if committed.is_none_or(|k| c.id > k) {
                fs::remove_dir_all(self.dir(c.id)).map_err(|e| CheckpointError::io(&self.dir(c.id), e))?;
                removed.push(c.id);
            }
        }
        Ok(removed)
    }

    /// Keeps the newest `retained` completed checkpoints and never deletes `keep`.
    pub fn prune(&self, retained: usize, keep: u64) -> Result<(), CheckpointError> {
        let completed: Vec<u64> = self.list()?.into_iter().filter(|c| c.completed).map(|c| c.id).collect();
        let cut = completed.len().saturating_sub(retained);
        for id in completed.into_iter().take(cut).filter(|id| *id != keep) {
            fs::remove_dir_all(self.dir(id)).map_err(|e| CheckpointError::io(&self.dir(id), e))?;
        }
        Ok(())
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut f = fs::File::create(path).map_err(|e| CheckpointError::io(path, e))?;
    f.write_all(bytes).map_err(|e| CheckpointError::io(path, e))?;
    f.sync_all().map_err(|e| CheckpointError::io(path, e))
}

fn sync_file(path: &Path) -> Result<(), CheckpointError> {
    fs::File::open(path).and_then(|f| f.sync_all()).map_err(|e| CheckpointError::io(path, e))
}

fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    fs::File::open(path).and_then(|f| f.sync_all()).map_err(|e| CheckpointError::io(path, e))
}

fn dirs_below(root: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let dir = out[i].clone();
        for entry in fs::read_dir(&dir).map_err(|e| CheckpointError::io(&dir, e))? {
            let entry = entry.map_err(|e| CheckpointError::io(&dir, e))?;
            if entry.file_type().map_err(|e| CheckpointError::io(&entry.path(), e))?.is_dir() {
                out.push(entry.path());
            }
        }
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::{FileEntry, StateManifest};
    use super::*;

    fn manifest(id: u64, src: &Path) -> Manifest {
        fs::write(src.join("state.bin"), b"hello").expect("write");
        Manifest {
            format_version: FORMAT_VERSION,
            checkpoint_id: id,
            app_id: "a".into(),
            instance: 0,
            created_at_ms: 0,
            offsets: vec![],
            state: StateManifest {
                backend: "test".into(),
                max_parallelism: 4,
                key_group_start: 0,
                key_group_end: 3,
                files: vec![FileEntry::of(src, "state.bin").expect("hash")],
            },
        }
    }

    #[test]
    fn written_checkpoint_verifies_and_flipped_byte_is_named() {
        let (base, src) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let s = FsStorage::open(base.path(), "a", 0).expect("open");
        let m = manifest(7, src.path());
        s.write(&m, src.path()).expect("write");
        assert_eq!(s.verify(7).expect("verify"), m);
        fs::write(s.dir(7).join("state.bin"), b"hellO").expect("corrupt");
        let err = s.verify(7).expect_err("corruption must be detected").to_string();
        assert!(err.contains("chk-7") && err.contains("state.bin"), "{err}");
    }

    #[test]
    fn missing_checkpoint_is_named() {
        let base = tempfile::tempdir().expect("dir");
        let s = FsStorage::open(base.path(), "a", 0).expect("open");
        let err = s.verify(3).expect_err("missing").to_string();
        assert!(err.contains("chk-3") && err.contains("missing"), "{err}");
    }

    #[test]
    fn discards_uncommitted_and_prunes_old_but_keeps_committed() {
        let (base, src) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let s = FsStorage::open(base.path(), "a", 0).expect("open");
        for id in 1..=5 {
            s.write(&manifest(id, src.path()), src.path()).expect("write");
            if id <= 4 {
                s.mark_complete(id).expect("complete");
            }
        }
        assert_eq!(s.discard_uncommitted(Some(4)).expect("discard"), vec![5]);
        s.prune(2, 4).expect("prune");
        let ids: Vec<u64> = s.list().expect("list").iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![3, 4]);
        assert_eq!(s.max_id().expect("max"), 4);
    }
}
