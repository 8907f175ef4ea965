//! Hashing RocksDB's SST files as they are installed, so the checkpoint that first lists
//! one finds its SHA-256 known.
//!
//! A checkpoint hashes every SST it has not seen before, between its barrier and its
//! commit. After a flush that is one epoch's few MB; after an L0 -> L1 compaction it is the
//! whole rewritten level, tens of MB, and that hash was most of the slowest checkpoints'
//! upload (bench/README.md). Files are immutable once RocksDB installs them, so a thread
//! that looks at the live files every [`EVERY`] hashes each new compaction output while
//! the epoch is still running, off the path from barrier to commit. It is best effort: a
//! file it has not reached, or could not read, the checkpoint hashes itself as before.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use rocksdb::DB;

use crate::files::FileHashes;

/// How often the live files are listed: a few times per checkpoint interval, so a
/// compaction's output is usually hashed before the next barrier.
const EVERY: Duration = Duration::from_millis(50);

/// The running thread; dropping it stops and joins the thread (and with it lets go of
/// the database).
pub(super) struct HashAhead {
    /// Dropped to stop the thread: its receiver then reports the channel disconnected.
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HashAhead {
    /// Starts hashing the SSTs of `db` (opened at `dir`) into `hashes`, under the names
    /// a checkpoint lists them by (`db/<file>`).
    pub(super) fn start(db: Arc<DB>, dir: PathBuf, hashes: FileHashes) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("rocksdb-hash-ahead".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
                    hash_new_files(&db, &dir, &hashes, &stopped);
                }
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for HashAhead {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Hashes the live SSTs the cache does not know, and forgets the files RocksDB deleted
/// (a checkpoint links only live files, so their hashes are never asked for again).
fn hash_new_files(db: &DB, dir: &Path, hashes: &FileHashes, stopped: &Receiver<()>) {
    let Ok(files) = db.live_files() else {
        return;
    };
    let live: Vec<(String, u64, i32)> = files
        .into_iter()
        .filter(|f| f.name.ends_with(".sst"))
        .map(|f| {
            let file = f.name.trim_start_matches('/').to_string();
            (file, f.size as u64, f.level)
        })
        .collect();
    hashes.retain(|name| {
        name.strip_prefix("db/")
            .is_some_and(|file| live.iter().any(|(l, _, _)| l == file))
    });
    for (file, size, level) in live {
        if let Err(TryRecvError::Disconnected) = stopped.try_recv() {
            return;
        }
        // A level-0 file is a flush's, which the checkpoint that flushed it hashes a few
        // ms later: hashing it here too would mostly do the same work twice.
        if level == 0 {
            continue;
        }
        let name = format!("db/{file}");
        if !hashes.knows(&name, size) {
            // A file compacted away meanwhile cannot be read: the checkpoint never
            // lists it either.
            let _ = hashes.hash(name, &dir.join(&file));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::backend::KvBackend;
    use crate::backend::rocks::RocksBackend;
    use crate::clock::SystemClock;
    use crate::files::{FileHashes, sha256_file};

    /// The live SSTs of `db` as a checkpoint names them, with their true hashes.
    fn live(db: &RocksBackend) -> Vec<(String, String)> {
        let mut out: Vec<_> = db
            .db
            .live_files()
            .unwrap()
            .into_iter()
            .map(|f| {
                let file = f.name.trim_start_matches('/').to_string();
                let (_, sha) = sha256_file(&db.path().join(&file)).unwrap();
                (format!("db/{file}"), sha)
            })
            .collect();
        out.sort();
        out
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_compactions_output_is_hashed_before_a_checkpoint_asks_and_deleted_files_are_forgotten() {
        let tmp = tempfile::tempdir().unwrap();
        let mut db = RocksBackend::open(
            &tmp.path().join("live"),
            Arc::default(),
            Arc::new(SystemClock),
        )
        .unwrap();
        let hashes = FileHashes::default();
        db.hash_ahead(&hashes).unwrap();
        // Three flushed files, then one compaction that replaces them.
        for round in 0..3u32 {
            for i in 0..2_000u32 {
                db.put(format!("k{i:05}").as_bytes(), &round.to_be_bytes())
                    .unwrap();
            }
            db.flush().unwrap();
        }
        let flushed = live(&db);
        assert_eq!(flushed.len(), 3, "one SST per flush: {flushed:?}");
        // A flush's files are the checkpoint's to hash (as the one that flushed them does).
        for (name, _) in &flushed {
            let file = name.trim_start_matches("db/");
            hashes.hash(name.clone(), &db.path().join(file)).unwrap();
        }
        db.compact().unwrap();
        let compacted = live(&db);
        assert!(
            compacted.iter().all(|f| !flushed.contains(f)),
            "compaction wrote new files: {compacted:?}"
        );
        wait_for(
            "the compaction output's hash, and the old files forgotten",
            || {
                compacted
                    .iter()
                    .all(|(n, sha)| hashes.get(n).as_deref() == Some(sha))
                    && flushed.iter().all(|(n, _)| hashes.get(n).is_none())
            },
        );
    }

    #[test]
    fn dropping_the_backend_stops_hashing_and_closes_the_database() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("live");
        let mut db = RocksBackend::open(&path, Arc::default(), Arc::new(SystemClock)).unwrap();
        db.hash_ahead(&FileHashes::default()).unwrap();
        db.put(b"k", b"v").unwrap();
        db.flush().unwrap();
        drop(db);
        // RocksDB holds a lock file while open: reopening fails if the thread kept it.
        RocksBackend::open(&path, Arc::default(), Arc::new(SystemClock))
            .expect("the database was closed when its backend was dropped");
    }
}
