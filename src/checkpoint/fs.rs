//! `file://` checkpoint storage: a local or shared volume.
//!
//! Layout under `<base>/<app_id>/instance-<n>/`:
//! - `chk-<id>-<run>/manifest.json`, `COMPLETED`, and the checkpoint's private files;
//! - `shared/<sha256>`: immutable SST files, stored once, referenced by many checkpoints.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{
    CheckpointError, CheckpointInfo, CheckpointRef, CheckpointStorage, Manifest, WriteStats,
    is_shared,
};

const MANIFEST: &str = "manifest.json";
const COMPLETED: &str = "COMPLETED";
const SHARED: &str = "shared";

#[derive(Debug, Clone)]
pub struct FsStorage {
    root: PathBuf,
}

impl FsStorage {
    pub fn open(base: &Path, app_id: &str, instance: u32) -> Result<Self, CheckpointError> {
        let root = base.join(app_id).join(format!("instance-{instance}"));
        let shared = root.join(SHARED);
        fs::create_dir_all(&shared).map_err(|e| CheckpointError::io(&shared, e))?;
        Ok(Self { root })
    }

    pub fn dir(&self, c: &CheckpointRef) -> PathBuf {
        self.root.join(c.to_string())
    }

    fn shared_path(&self, sha256: &str) -> PathBuf {
        self.root.join(SHARED).join(sha256)
    }

    /// Where a manifest's file lives in this storage.
    fn stored_path(&self, c: &CheckpointRef, path: &str, sha256: &str) -> PathBuf {
        if is_shared(path) {
            self.shared_path(sha256)
        } else {
            self.dir(c).join(path)
        }
    }
}

impl CheckpointStorage for FsStorage {
    fn write(&self, manifest: &Manifest, src: &Path) -> Result<WriteStats, CheckpointError> {
        let c = &manifest.checkpoint;
        let final_dir = self.dir(c);
        let tmp = self.root.join(format!("{c}.tmp"));
        remove_dir_if_exists(&tmp)?;
        fs::create_dir_all(&tmp).map_err(|e| CheckpointError::io(&tmp, e))?;
        let mut stats = WriteStats::default();
        let mut new_shared = false;
        for file in &manifest.state.files {
            stats.bytes_total += file.size;
            let from = src.join(&file.path);
            if is_shared(&file.path) {
                let to = self.shared_path(&file.sha256);
                if to.metadata().is_ok_and(|m| m.len() == file.size) {
                    continue;
                }
                // Copy beside the final name, then rename, so a crash never leaves a
                // truncated file under a content-addressed name.
                let partial = self
                    .root
                    .join(SHARED)
                    .join(format!("{}.{}.partial", file.sha256, c.run));
                stats.bytes_written += store_immutable(&from, &partial)?;
                fs::rename(&partial, &to).map_err(|e| CheckpointError::io(&to, e))?;
                new_shared = true;
            } else {
                let to = tmp.join(&file.path);
                if let Some(parent) = to.parent() {
                    fs::create_dir_all(parent).map_err(|e| CheckpointError::io(parent, e))?;
                }
                stats.bytes_written += store_staged(&from, &to)?;
            }
        }
        if new_shared {
            sync_dir(&self.root.join(SHARED))?;
        }
        let manifest_path = tmp.join(MANIFEST);
        let json =
            serde_json::to_vec_pretty(manifest).map_err(|e| CheckpointError::BadManifest {
                name: c.to_string(),
                path: manifest_path.clone(),
                reason: e.to_string(),
            })?;
        write_synced(&manifest_path, &json)?;
        stats.bytes_written += json.len() as u64;
        for dir in dirs_below(&tmp)? {
            sync_dir(&dir)?;
        }
        // rename(2) refuses to replace a non-empty directory: a name is published once.
        fs::rename(&tmp, &final_dir).map_err(|e| CheckpointError::io(&final_dir, e))?;
        sync_dir(&self.root)?;
        Ok(stats)
    }

    fn put_document(&self, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let path = self.root.join(name);
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io(&dir, e))?;
        let tmp = dir.join(format!(
            ".{}.tmp-{}",
            name.replace('/', "_"),
            std::process::id()
        ));
        write_synced(&tmp, bytes)?;
        // A hard link fails if `path` exists: publish once, atomically.
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        linked.map_err(|e| CheckpointError::io(&path, e))?;
        sync_dir(&dir)
    }

    fn get_document(&self, name: &str) -> Result<Option<Vec<u8>>, CheckpointError> {
        let path = self.root.join(name);
        match fs::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CheckpointError::io(&path, e)),
        }
    }

    fn mark_complete(&self, c: &CheckpointRef) -> Result<(), CheckpointError> {
        write_synced(&self.dir(c).join(COMPLETED), b"")
    }

    fn read_manifest(&self, c: &CheckpointRef) -> Result<Manifest, CheckpointError> {
        let dir = self.dir(c);
        if !dir.is_dir() {
            return Err(CheckpointError::Missing {
                name: c.to_string(),
                path: dir,
            });
        }
        let path = dir.join(MANIFEST);
        let bad = |reason: String| CheckpointError::BadManifest {
            name: c.to_string(),
            path: path.clone(),
            reason,
        };
        let bytes = fs::read(&path).map_err(|e| bad(e.to_string()))?;
        Manifest::parse(&bytes, c).map_err(bad)
    }

    fn fetch(&self, manifest: &Manifest, into: &Path) -> Result<(), CheckpointError> {
        let c = &manifest.checkpoint;
        remove_dir_if_exists(into)?;
        for file in &manifest.state.files {
            let from = self.stored_path(c, &file.path, &file.sha256);
            let to = into.join(&file.path);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent).map_err(|e| CheckpointError::io(parent, e))?;
            }
            if !from.is_file() {
                return Err(CheckpointError::Corrupt {
                    name: c.to_string(),
                    path: from,
                    reason: format!("missing (listed in the manifest as {})", file.path),
                });
            }
            // Hard links cost nothing and the files are immutable; copy across devices.
            if fs::hard_link(&from, &to).is_err() {
                fs::copy(&from, &to).map_err(|e| CheckpointError::io(&from, e))?;
            }
        }
        Ok(())
    }

    fn list(&self) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.root).map_err(|e| CheckpointError::io(&self.root, e))? {
            let entry = entry.map_err(|e| CheckpointError::io(&self.root, e))?;
            let Some(checkpoint) = entry.file_name().to_str().and_then(CheckpointRef::parse) else {
                continue;
            };
            out.push(CheckpointInfo {
                completed: entry.path().join(COMPLETED).exists(),
                checkpoint,
            });
        }
        out.sort_by(|a, b| a.checkpoint.cmp(&b.checkpoint));
        Ok(out)
    }

    fn discard_uncommitted(
        &self,
        committed: Option<&CheckpointRef>,
    ) -> Result<Vec<CheckpointRef>, CheckpointError> {
        // Unfinished `.tmp` writes are left to `prune`: one may belong to a paused zombie
        // that should find out it is fenced at its commit, not by a vanished directory.
        let mut removed = Vec::new();
        for info in self.list()? {
            let c = info.checkpoint;
            let uncommitted = committed.is_none_or(|k| c.id > k.id || (c.id == k.id && c != *k));
            if uncommitted {
                remove_dir_if_exists(&self.dir(&c))?;
                removed.push(c);
            }
        }
        Ok(removed)
    }

    fn prune(&self, retained: usize, keep: &CheckpointRef) -> Result<(), CheckpointError> {
        let all = self.list()?;
        let completed: Vec<&CheckpointRef> = all
            .iter()
            .filter(|i| i.completed)
            .map(|i| &i.checkpoint)
            .collect();
        let cut = completed.len().saturating_sub(retained);
        let mut doomed: Vec<&CheckpointRef> = completed
            .into_iter()
            .take(cut)
            .filter(|c| *c != keep)
            .collect();
        // Incomplete and older than the committed one: abandoned by a crash or a zombie.
        doomed.extend(
            all.iter()
                .filter(|i| !i.completed && i.checkpoint.id < keep.id)
                .map(|i| &i.checkpoint),
        );
        for c in doomed {
            remove_dir_if_exists(&self.dir(c))?;
        }
        for entry in fs::read_dir(&self.root).map_err(|e| CheckpointError::io(&self.root, e))? {
            let entry = entry.map_err(|e| CheckpointError::io(&self.root, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let unfinished = name.strip_suffix(".tmp").and_then(CheckpointRef::parse);
            if unfinished.is_some_and(|c| c.id < keep.id) {
                remove_dir_if_exists(&entry.path())?;
            }
        }
        let mut referenced = HashSet::new();
        for info in self.list()? {
            // A checkpoint being written by someone else has no manifest yet; its shared
            // files can only belong to an uncommitted epoch.
            if let Ok(m) = self.read_manifest(&info.checkpoint) {
                referenced.extend(
                    m.state
                        .files
                        .into_iter()
                        .filter(|f| is_shared(&f.path))
                        .map(|f| f.sha256),
                );
            }
        }
        let shared = self.root.join(SHARED);
        for entry in fs::read_dir(&shared).map_err(|e| CheckpointError::io(&shared, e))? {
            let entry = entry.map_err(|e| CheckpointError::io(&shared, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // `<sha>.<run>.partial`: an upload cut short; ours are never in flight here.
            let abandoned_partial = name
                .strip_suffix(".partial")
                .is_some_and(|n| !n.ends_with(&format!(".{}", keep.run)));
            let unreferenced = !name.ends_with(".partial") && !referenced.contains(&name);
            if abandoned_partial || unreferenced {
                fs::remove_file(entry.path()).map_err(|e| CheckpointError::io(&entry.path(), e))?;
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }
}

fn remove_dir_if_exists(path: &Path) -> Result<(), CheckpointError> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CheckpointError::io(path, e)),
        _ => Ok(()),
    }
}

/// Puts an immutable SST at `to`: a hard link where `from` is on the same filesystem,
/// else a synced copy. RocksDB syncs an SST before it becomes part of the database and
/// never writes it again, so the link is as durable as a copy and costs no I/O: storage
/// on the state's own volume then stores a checkpoint's new SSTs (5-7 MB a second in the
/// benchmark's S workload, 60-110 MB after a compaction) without reading them back.
fn store_immutable(from: &Path, to: &Path) -> Result<u64, CheckpointError> {
    // A partial file left by a crashed upload of the same content.
    let _ = fs::remove_file(to);
    link_or_copy(from, to, false)
}

/// Puts a file staged for this checkpoint alone at `to`, durably: a hard link and an
/// fsync of its data where `from` is on the same filesystem, else a synced copy. Nothing
/// writes a staged file again (RocksDB's checkpoint copies its mutable files, the heap
/// backend and the operator state write theirs once) and the staging directory is removed
/// after the upload, so the link is the copy without reading and writing every byte
/// again: a full heap snapshot, rewritten every interval, was a quarter of the committer's
/// CPU as a copy (kernel memcpy in `copy_file_range`, S-EO-heap profile).
fn store_staged(from: &Path, to: &Path) -> Result<u64, CheckpointError> {
    link_or_copy(from, to, true)
}

/// A hard link (its data fsynced when `sync`), or a synced copy across filesystems.
fn link_or_copy(from: &Path, to: &Path, sync: bool) -> Result<u64, CheckpointError> {
    match fs::hard_link(from, to) {
        Ok(()) => {
            let f = fs::File::open(to).map_err(|e| CheckpointError::io(to, e))?;
            if sync {
                f.sync_all().map_err(|e| CheckpointError::io(to, e))?;
            }
            f.metadata()
                .map(|m| m.len())
                .map_err(|e| CheckpointError::io(to, e))
        }
        // Another filesystem (EXDEV), or one without hard links.
        Err(_) => copy_synced(from, to),
    }
}

fn copy_synced(from: &Path, to: &Path) -> Result<u64, CheckpointError> {
    let n = fs::copy(from, to).map_err(|e| CheckpointError::io(from, e))?;
    fs::File::open(to)
        .and_then(|f| f.sync_all())
        .map_err(|e| CheckpointError::io(to, e))?;
    Ok(n)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut f = fs::File::create(path).map_err(|e| CheckpointError::io(path, e))?;
    f.write_all(bytes)
        .map_err(|e| CheckpointError::io(path, e))?;
    f.sync_all().map_err(|e| CheckpointError::io(path, e))
}

fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| CheckpointError::io(path, e))
}

fn dirs_below(root: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let dir = out[i].clone();
        for entry in fs::read_dir(&dir).map_err(|e| CheckpointError::io(&dir, e))? {
            let entry = entry.map_err(|e| CheckpointError::io(&dir, e))?;
            if entry
                .file_type()
                .map_err(|e| CheckpointError::io(&entry.path(), e))?
                .is_dir()
            {
                out.push(entry.path());
            }
        }
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::suite;
    use super::*;

    fn storage() -> (tempfile::TempDir, FsStorage) {
        let dir = tempfile::tempdir().expect("dir");
        let s = FsStorage::open(dir.path(), "app", 0).expect("open");
        (dir, s)
    }

    #[test]
    fn round_trips_and_shares_sst_files() {
        suite::round_trips_and_shares_sst_files(&storage().1);
    }

    #[test]
    fn discards_what_never_committed() {
        suite::discards_what_never_committed(&storage().1);
    }

    #[test]
    fn documents_are_published_once() {
        let (_dir, s) = storage();
        suite::documents_are_published_once(&s);
    }

    #[test]
    fn names_missing_checkpoints_and_files() {
        let (_dir, s) = storage();
        suite::names_missing_checkpoints_and_files(&s);
        let src = tempfile::tempdir().expect("dir");
        let c = CheckpointRef::new(1, "dddddddd");
        let m = suite::manifest(&c, src.path(), &[("db/000001.sst", b"sst")]);
        s.write(&m, src.path()).expect("write");
        let sha = &m.state.files[0].sha256;
        fs::remove_file(s.shared_path(sha)).expect("delete shared file");
        let out = tempfile::tempdir().expect("dir");
        let err = s
            .fetch(&m, &out.path().join("r"))
            .expect_err("missing file")
            .to_string();
        assert!(
            err.contains("chk-1-dddddddd") && err.contains(sha.as_str()),
            "{err}"
        );
    }

    #[test]
    fn staged_files_on_the_same_filesystem_are_linked_and_elsewhere_copied() {
        use std::os::unix::fs::MetadataExt;
        let (dir, s) = storage();
        // The source beside the storage, as the state directory usually is.
        let src = dir.path().join("state");
        let c = CheckpointRef::new(1, "ffffffff");
        let m = suite::manifest(
            &c,
            &src,
            &[("db/000007.sst", b"immutable"), ("meta.json", b"{}")],
        );
        s.write(&m, &src).expect("write");
        let local = fs::metadata(src.join("db/000007.sst")).expect("source");
        let stored = fs::metadata(s.shared_path(&m.state.files[0].sha256)).expect("stored");
        assert_eq!(
            (stored.dev(), stored.ino()),
            (local.dev(), local.ino()),
            "the SST is linked"
        );
        // A file of this checkpoint alone (a heap snapshot, the operator state) too.
        let meta = fs::metadata(s.dir(&c).join("meta.json")).expect("private file");
        let staged = fs::metadata(src.join("meta.json")).expect("src");
        assert_eq!(
            (meta.dev(), meta.ino()),
            (staged.dev(), staged.ino()),
            "the staged file is linked"
        );
        assert_eq!(fs::read(s.dir(&c).join("meta.json")).expect("read"), b"{}");
        // /proc is another filesystem: no link, a copy with the same bytes.
        for (i, store) in [store_immutable, store_staged].into_iter().enumerate() {
            let to = dir.path().join(format!("copied-{i}"));
            let n = store(Path::new("/proc/version"), &to).expect("copy");
            let content = fs::read(&to).expect("read");
            assert!(n > 0 && n == content.len() as u64);
            assert_eq!(content, fs::read("/proc/version").expect("proc"));
        }
    }

    #[test]
    fn a_name_is_published_once() {
        let (_dir, s) = storage();
        let src = tempfile::tempdir().expect("dir");
        let c = CheckpointRef::new(3, "eeeeeeee");
        s.write(&suite::manifest(&c, src.path(), &[("a", b"1")]), src.path())
            .expect("first write");
        // Staged afresh, as every checkpoint is (barrier.rs removes its staging directory
        // first): the first write's file is linked, never written again.
        let src = tempfile::tempdir().expect("dir");
        let again = s.write(&suite::manifest(&c, src.path(), &[("a", b"2")]), src.path());
        assert!(
            again.is_err(),
            "a second writer of the same name must fail, not replace it"
        );
        assert_eq!(fs::read(s.dir(&c).join("a")).expect("read"), b"1");
    }
}
