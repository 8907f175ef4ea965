//! A RocksDB checkpoint in two parts, so the barrier costs the job thread a memtable
//! switch and not a flush.
//!
//! Writes skip the WAL, so what a checkpoint holds is what is in SST files. At the
//! barrier [`begin`] switches the memtable without waiting (everything up to the
//! barrier is now in immutable memtables, everything after it goes to the new active
//! one) and a background thread waits for those memtables to reach SST files, then
//! hard-links the live files into the checkpoint directory without flushing again.
//! Flink's RocksDB backend flushes on the task thread instead; the flush, with its
//! fsync, was most of this service's checkpoint pause.
//!
//! What makes the checkpoint exact is that no memtable holding writes after the barrier
//! may reach an SST before the links are made. Only three things switch a memtable
//! here: a barrier, a manual flush or compaction, and the active memtable filling up.
//! The [`Gate`] is closed from [`begin`] until the links exist: the next barrier, a
//! flush and a compaction wait for it, and [`Gate::guard`] makes writes wait before the
//! active memtable passes half of [`WRITE_BUFFER_BYTES`], so RocksDB never fills it
//! meanwhile. Both waits are rare: a flush of one epoch's writes takes far less than a
//! checkpoint interval.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rocksdb::checkpoint::Checkpoint;
use rocksdb::{DB, FlushOptions, WriteBatch, WriteOptions};

use crate::backend::PendingSnapshot;
use crate::error::{IoContext, Result, StateError};

/// The memtable size RocksDB flushes at (its default, set explicitly because the
/// [`Gate`] depends on it).
pub(crate) const WRITE_BUFFER_BYTES: usize = 64 << 20;

/// Bytes written between two looks at the active memtable's size while the gate is
/// closed: small next to the half of [`WRITE_BUFFER_BYTES`] kept free.
const GUARD_EVERY_BYTES: usize = 64 << 10;

/// How often the background part looks whether the barrier's memtables are flushed.
const POLL: Duration = Duration::from_millis(1);

/// How long a flush that RocksDB retries after an error that did not stop writes may take
/// before the checkpoint fails.
const FLUSH_RETRY_FOR: Duration = Duration::from_secs(30);

/// Closed while a checkpoint's background part has not linked its files yet.
#[derive(Default)]
pub(crate) struct Gate {
    closed: AtomicBool,
    lock: Mutex<()>,
    opened: Condvar,
    /// Bytes written since the guard last read the memtable size.
    unchecked: AtomicUsize,
    /// Holds the background part back, so a test can write while it is pending.
    #[cfg(test)]
    link_delay: Mutex<Duration>,
}

impl Gate {
    fn close(&self) {
        let _l = self.lock.lock();
        self.closed.store(true, Ordering::Release);
    }

    fn open(&self) {
        let _l = self.lock.lock();
        self.closed.store(false, Ordering::Release);
        self.opened.notify_all();
    }

    /// Waits until no checkpoint is between its memtable switch and its links.
    pub(crate) fn wait_open(&self) {
        let mut l = self.lock.lock();
        while self.closed.load(Ordering::Acquire) {
            self.opened.wait(&mut l);
        }
    }

    /// Called before writing `bytes`: while the gate is closed, waits for it to open if
    /// these bytes could take the active memtable near the size RocksDB switches at.
    pub(crate) fn guard(&self, db: &DB, bytes: usize) -> Result<()> {
        if !self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        let pending = self.unchecked.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if pending < GUARD_EVERY_BYTES {
            return Ok(());
        }
        self.unchecked.store(0, Ordering::Relaxed);
        let active = db
            .property_int_value("rocksdb.cur-size-active-mem-table")?
            .unwrap_or(0) as usize;
        if active + pending > WRITE_BUFFER_BYTES / 2 {
            self.wait_open();
        }
        Ok(())
    }
}

/// The synchronous part, on the caller's thread: waits for the previous checkpoint's
/// links, switches the memtable, and starts the thread that makes this one's links in
/// `dir/db`.
pub(crate) fn begin(
    db: &Arc<DB>,
    gate: &Arc<Gate>,
    dir: &Path,
) -> Result<Box<dyn PendingSnapshot>> {
    gate.wait_open();
    let target = dir.join("db");
    if target.exists() {
        std::fs::remove_dir_all(&target).at(&target)?;
    }
    let mut flush = FlushOptions::default();
    flush.set_wait(false);
    db.flush_opt(&flush)?;
    gate.close();
    let (db, opened) = (db.clone(), gate.clone());
    let spawned = std::thread::Builder::new()
        .name("rocksdb-checkpoint".into())
        .spawn(move || {
            // Opens the gate however this thread ends, a panic included: a gate left
            // closed would hold the job thread at its next barrier for ever.
            let opens = OpenOnDrop(opened);
            #[cfg(test)]
            std::thread::sleep(*opens.0.link_delay.lock());
            let linked = link(&db, &target);
            // Let go of the database first: whoever waits for the gate may then close
            // it and remove its directory.
            drop(db);
            drop(opens);
            linked
        });
    match spawned {
        Ok(thread) => Ok(Box::new(Linking(Some(thread)))),
        Err(e) => {
            gate.open();
            Err(StateError::Io {
                path: dir.to_path_buf(),
                source: e,
            })
        }
    }
}

struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// Waits for the barrier's memtables to be flushed, then links the live files.
fn link(db: &DB, target: &Path) -> Result<Vec<PathBuf>> {
    let int = |name: &str| -> Result<u64> { Ok(db.property_int_value(name)?.unwrap_or(0)) };
    // The count is cumulative: only errors after this point are this flush's.
    let errors_before = int("rocksdb.background-errors")?;
    let mut failing_since: Option<Instant> = None;
    while int("rocksdb.num-immutable-mem-table")? > 0 {
        let errors = int("rocksdb.background-errors")?;
        if errors > 0 {
            // A database that stopped writes after a failed flush (a full disk, say) gives
            // its cause to the next write: an empty batch adds nothing and returns it, so
            // the runtime sees "No space left on device" and not a generic failure.
            let mut no_wal = WriteOptions::default();
            no_wal.disable_wal(true);
            db.write_opt(WriteBatch::default(), &no_wal)?;
        }
        if errors > errors_before {
            let since = *failing_since.get_or_insert_with(Instant::now);
            if since.elapsed() > FLUSH_RETRY_FOR {
                return Err(StateError::Invalid(format!(
                    "RocksDB's flush for a checkpoint kept failing for {FLUSH_RETRY_FOR:?} (see its LOG)"
                )));
            }
        }
        std::thread::sleep(POLL);
    }
    // u64::MAX: never flush, the barrier did. The WAL files it copies are empty.
    Checkpoint::new(db)?.create_checkpoint_with_log_size(target, u64::MAX)?;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(target).at(target)? {
        let entry = entry.at(target)?;
        if entry.file_type().at(entry.path())?.is_file() {
            files.push(PathBuf::from("db").join(entry.file_name()));
        }
    }
    files.sort();
    Ok(files)
}

/// The background part of one checkpoint.
struct Linking(Option<std::thread::JoinHandle<Result<Vec<PathBuf>>>>);

impl PendingSnapshot for Linking {
    fn finish(mut self: Box<Self>) -> Result<Vec<PathBuf>> {
        match self.0.take().map(|t| t.join()) {
            Some(Ok(linked)) => linked,
            _ => Err(StateError::Invalid(
                "the RocksDB checkpoint thread panicked".into(),
            )),
        }
    }
}

impl Drop for Linking {
    /// An abandoned checkpoint still ends its links before its directory is removed.
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::KvBackend;
    use crate::backend::rocks::{RocksBackend, scan_checkpoint};
    use crate::clock::SystemClock;

    fn open(tmp: &tempfile::TempDir) -> RocksBackend {
        RocksBackend::open(
            &tmp.path().join("live"),
            Arc::default(),
            Arc::new(SystemClock),
        )
        .unwrap()
    }

    /// The barrier's part of a checkpoint into `tmp/chk`.
    fn barrier(db: &mut RocksBackend, tmp: &tempfile::TempDir) -> Box<dyn PendingSnapshot> {
        std::fs::create_dir_all(tmp.path().join("chk")).unwrap();
        db.native_snapshot(&tmp.path().join("chk"))
            .unwrap()
            .unwrap()
    }

    /// RocksDB builds the new memtable, its Bloom filter included, inside the barrier's
    /// switch on the job thread; a filter sized for a full write buffer (6.7 MB at a
    /// ratio of 0.1) was most of the checkpoint pause.
    #[test]
    fn the_barriers_memtable_switch_allocates_under_a_mebibyte() {
        let tmp = tempfile::tempdir().unwrap();
        let mut db = open(&tmp);
        db.put(b"k", b"v").unwrap();
        let pending = barrier(&mut db, &tmp);
        // RocksDB updates the active memtable's size (its arena's blocks, the filter's
        // included) on a write.
        db.put(b"after", b"v").unwrap();
        let allocated = db
            .db
            .property_int_value("rocksdb.cur-size-active-mem-table")
            .unwrap()
            .unwrap();
        pending.finish().unwrap();
        assert!(allocated > 0, "the memtable's arena is counted");
        assert!(
            allocated < 1 << 20,
            "the memtable the switch made holds {allocated} bytes after one write"
        );
    }

    /// Without the guard, RocksDB would switch and flush the memtable of these writes
    /// while the links are held back, and their SSTs would be in the checkpoint.
    #[test]
    fn writes_that_would_fill_the_memtable_wait_for_the_links() {
        let tmp = tempfile::tempdir().unwrap();
        let mut db = open(&tmp);
        for i in 0..100 {
            db.put(format!("a{i:04}").as_bytes(), b"before").unwrap();
        }
        *db.gate.link_delay.lock() = Duration::from_millis(300);
        let pending = barrier(&mut db, &tmp);
        let big = vec![7u8; 64 << 10];
        for i in 0..2 * WRITE_BUFFER_BYTES / big.len() {
            db.put(format!("b{i:05}").as_bytes(), &big).unwrap();
        }
        let files = pending.finish().unwrap();
        assert!(
            files
                .iter()
                .any(|f| f.extension().is_some_and(|e| e == "sst"))
        );
        let mut seen = Vec::new();
        scan_checkpoint(
            &tmp.path().join("chk/db"),
            tmp.path(),
            b"",
            &[0xff],
            &mut |k, v| {
                seen.push((k.to_vec(), v.to_vec()));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen.len(), 100, "only the writes before the barrier");
        assert!(seen.iter().all(|(k, v)| k[0] == b'a' && v == b"before"));
    }
}
