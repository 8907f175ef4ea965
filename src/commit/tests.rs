//! The protocol's orderings against in-memory fakes of checkpoint storage and of the
//! transactional producers: no Kafka, no disk beyond a temp dir.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::*;
use crate::checkpoint::{CheckpointInfo, FORMAT_VERSION};

/// Everything the fakes saw, in order: `write 1`, `offsets 1`, `commit 1`, `abort 2`, ...
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, s: String) {
        self.0.lock().expect("log").push(s);
    }
    fn lines(&self) -> Vec<String> {
        self.0.lock().expect("log").clone()
    }
    fn position(&self, line: &str) -> usize {
        self.lines()
            .iter()
            .position(|l| l == line)
            .unwrap_or_else(|| panic!("{line:?} not in {:?}", self.lines()))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Failure {
    Abortable,
    Fenced,
}

struct FakeSlot {
    name: usize,
    log: Log,
    open: Mutex<Option<u64>>,
    /// Commit of these checkpoint ids fails this way.
    fail_commit: Mutex<BTreeMap<u64, Failure>>,
    /// The next flush fails this way.
    fail_flush: Mutex<Option<Failure>>,
}

impl FakeSlot {
    fn open_id(&self) -> u64 {
        self.open.lock().expect("open").unwrap_or(0)
    }
}

fn failure(f: Failure) -> SinkError {
    match f {
        Failure::Abortable => {
            SinkError::Abortable(KafkaError::MessageProduction(RDKafkaErrorCode::State))
        }
        Failure::Fenced => SinkError::Fenced("app-0-1".into()),
    }
}

impl Slot for FakeSlot {
    fn begin(&self, checkpoint: &CheckpointRef) -> Result<(), SinkError> {
        *self.open.lock().expect("open") = Some(checkpoint.id);
        self.log
            .push(format!("begin {} on {}", checkpoint.id, self.name));
        Ok(())
    }
    fn flush(&self) -> Result<(), SinkError> {
        if let Some(f) = self.fail_flush.lock().expect("fail").take() {
            self.log.push(format!("flush {} failed", self.open_id()));
            return Err(failure(f));
        }
        self.log.push(format!("flush {}", self.open_id()));
        Ok(())
    }
    fn queued(&self) -> usize {
        0
    }
    fn send_offsets(&self, _: &Offsets, checkpoint: &CheckpointRef) -> Result<(), SinkError> {
        assert_eq!(
            self.open_id(),
            checkpoint.id,
            "offsets go to the epoch's own transaction"
        );
        self.log.push(format!("offsets {}", checkpoint.id));
        Ok(())
    }
    fn commit(&self) -> Result<(), SinkError> {
        let id = self.open_id();
        if let Some(f) = self.fail_commit.lock().expect("fail").get(&id) {
            self.log.push(format!("commit {id} failed"));
            return Err(failure(*f));
        }
        self.log.push(format!("commit {id}"));
        *self.open.lock().expect("open") = None;
        Ok(())
    }
    fn abort(&self) -> Result<(), SinkError> {
        self.log.push(format!("abort {}", self.open_id()));
        *self.open.lock().expect("open") = None;
        Ok(())
    }
}

/// Checkpoint storage in memory; a write can be made to fail, or to wait for a gate.
#[derive(Default)]
struct FakeStorage {
    log: Log,
    published: Mutex<HashSet<u64>>,
    fail_write: Mutex<HashSet<u64>>,
    /// While set, a write announces itself on `.0` and waits for a message on `.1`.
    gate: Mutex<Option<(mpsc::Sender<u64>, mpsc::Receiver<()>)>>,
    /// The state files each written checkpoint listed.
    written_files: Mutex<BTreeMap<u64, Vec<String>>>,
}

impl CheckpointStorage for FakeStorage {
    fn write(&self, manifest: &Manifest, src: &Path) -> Result<WriteStats, CheckpointError> {
        let id = manifest.checkpoint.id;
        assert!(
            src.exists(),
            "the local snapshot is still there during the upload"
        );
        if let Some((started, release)) = self.gate.lock().expect("gate").as_ref() {
            let _ = started.send(id);
            let _ = release.recv();
        }
        if self.fail_write.lock().expect("fail").contains(&id) {
            self.log.push(format!("write {id} failed"));
            return Err(CheckpointError::ObjectStore {
                key: format!("s3://b/chk-{id}"),
                reason: "connection refused".into(),
            });
        }
        self.published.lock().expect("published").insert(id);
        self.written_files.lock().expect("files").insert(
            id,
            manifest
                .state
                .files
                .iter()
                .map(|f| f.path.clone())
                .collect(),
        );
        self.log.push(format!("write {id}"));
        Ok(WriteStats::default())
    }
    fn mark_complete(&self, checkpoint: &CheckpointRef) -> Result<(), CheckpointError> {
        assert!(
            self.published
                .lock()
                .expect("published")
                .contains(&checkpoint.id),
            "only a written checkpoint is marked complete"
        );
        self.log.push(format!("complete {}", checkpoint.id));
        Ok(())
    }
    fn read_manifest(&self, c: &CheckpointRef) -> Result<Manifest, CheckpointError> {
        Err(CheckpointError::Missing {
            name: c.to_string(),
            path: "mem".into(),
        })
    }
    fn fetch(&self, _: &Manifest, _: &Path) -> Result<(), CheckpointError> {
        Ok(())
    }
    fn list(&self) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        Ok(Vec::new())
    }
    fn discard_uncommitted(
        &self,
        _: Option<&CheckpointRef>,
    ) -> Result<Vec<CheckpointRef>, CheckpointError> {
        Ok(Vec::new())
    }
    fn prune(&self, _: usize, _: &CheckpointRef) -> Result<(), CheckpointError> {
        Ok(())
    }
    fn describe(&self) -> String {
        "mem".into()
    }
    fn put_document(&self, _: &str, _: &[u8]) -> Result<(), CheckpointError> {
        Ok(())
    }
    fn get_document(&self, _: &str) -> Result<Option<Vec<u8>>, CheckpointError> {
        Ok(None)
    }
}

struct Rig {
    epochs: Epochs<FakeSlot>,
    slots: Vec<Arc<FakeSlot>>,
    storage: Arc<FakeStorage>,
    log: Log,
    dir: tempfile::TempDir,
}

fn rig(pool: usize) -> Rig {
    let log = Log::default();
    let slots: Vec<Arc<FakeSlot>> = (0..pool)
        .map(|name| {
            Arc::new(FakeSlot {
                name,
                log: log.clone(),
                open: Mutex::new(None),
                fail_commit: Mutex::new(BTreeMap::new()),
                fail_flush: Mutex::new(None),
            })
        })
        .collect();
    let storage = Arc::new(FakeStorage {
        log: log.clone(),
        ..FakeStorage::default()
    });
    let epochs = Epochs::new(
        slots.clone(),
        storage.clone(),
        Housekeeping { retained: 2 },
        None,
    );
    Rig {
        epochs,
        slots,
        storage,
        log,
        dir: tempfile::tempdir().expect("tempdir"),
    }
}

fn chk(id: u64) -> CheckpointRef {
    CheckpointRef::new(id, "0000abcd")
}

impl Rig {
    fn sealed(&self, id: u64) -> Sealed {
        let staging = self.dir.path().join(format!("staging-{id}"));
        std::fs::create_dir_all(&staging).expect("staging");
        let offsets: Offsets = [(("in".to_string(), 0), id as i64 * 10)]
            .into_iter()
            .collect();
        Sealed {
            manifest: Manifest {
                format_version: FORMAT_VERSION,
                checkpoint: chk(id),
                app_id: "app".into(),
                instance: 0,
                created_at_ms: 0,
                offsets: Vec::new(),
                control_offsets: Vec::new(),
                producer_pool_size: Some(self.slots.len() as u32),
                state: crate::checkpoint::suite::manifest(&chk(id), &staging, &[]).state,
            },
            staging,
            rest: None,
            offsets,
            barrier_at: Instant::now(),
        }
    }

    /// One epoch from begin to seal whose state is a `hashmap` store's: its full snapshot
    /// is left for the committer to write.
    fn full_epoch(&mut self, id: u64) {
        use streamstate_state::{BackendKind, StateStore, StoreConfig};
        self.epochs.begin(chk(id)).expect("begin");
        let mut sealed = self.sealed(id);
        let work = self.dir.path().join(format!("store-{id}"));
        let store =
            StateStore::open(StoreConfig::new(BackendKind::Hashmap, &work, 4)).expect("store");
        let (state, rest) = store
            .snapshot_deferred(id, &sealed.staging)
            .expect("snapshot");
        assert!(
            rest.as_ref().is_some_and(|r| r.is_full()),
            "a full snapshot"
        );
        sealed.manifest.state = state;
        sealed.rest = rest;
        self.epochs.seal(sealed).expect("seal");
    }

    /// One epoch from begin to seal.
    fn epoch(&mut self, id: u64) {
        self.epochs.begin(chk(id)).expect("begin");
        let sealed = self.sealed(id);
        self.epochs.seal(sealed).expect("seal");
    }

    fn fail_commit(&self, id: u64, slot: usize, how: Failure) {
        self.slots[slot]
            .fail_commit
            .lock()
            .expect("fail")
            .insert(id, how);
    }

    fn before(&self, a: &str, b: &str) {
        assert!(
            self.log.position(a) < self.log.position(b),
            "{a:?} must come before {b:?}: {:?}",
            self.log.lines()
        );
    }

    fn absent(&self, line: &str) {
        assert!(
            !self.log.lines().iter().any(|l| l == line),
            "{line:?} must not happen: {:?}",
            self.log.lines()
        );
    }
}

#[test]
fn each_epoch_commits_after_its_upload_and_after_the_previous_commit() {
    let mut r = rig(3);
    for id in 1..=5 {
        r.epoch(id);
    }
    r.epochs.drain().expect("drain");
    for id in 1..=5 {
        r.before(&format!("write {id}"), &format!("offsets {id}"));
        r.before(&format!("offsets {id}"), &format!("commit {id}"));
        r.before(&format!("commit {id}"), &format!("complete {id}"));
        if id > 1 {
            r.before(&format!("commit {}", id - 1), &format!("commit {id}"));
        }
    }
    assert_eq!(r.epochs.last_committed(), Some(&chk(5)));
    let completed: Vec<u64> = r
        .epochs
        .take_completed()
        .iter()
        .map(|c| c.manifest.checkpoint.id)
        .collect();
    assert_eq!(completed, vec![1, 2, 3, 4, 5]);
    assert!(
        !r.dir.path().join("staging-3").exists(),
        "an uploaded snapshot is removed"
    );
}

#[test]
fn an_epoch_is_flushed_by_the_committer_after_its_seal_and_before_its_offsets() {
    let mut r = rig(3);
    for id in 1..=3 {
        r.epoch(id);
    }
    r.epochs.drain().expect("drain");
    for id in 1..=3 {
        // The job thread does not wait for the broker at the seal: the next epoch's
        // records wait behind this one's in the sink's Handover instead.
        r.before(&format!("write {id}"), &format!("flush {id}"));
        r.before(&format!("flush {id}"), &format!("offsets {id}"));
    }
}

#[test]
fn a_delivery_that_fails_aborts_that_epoch_and_every_later_one() {
    let mut r = rig(3);
    *r.slots[1].fail_flush.lock().expect("fail") = Some(Failure::Abortable);
    r.epoch(1);
    r.epoch(2);
    r.epoch(3);
    match r.epochs.drain() {
        Err(EpochError::Failed { checkpoint, .. }) => assert_eq!(checkpoint, chk(2)),
        other => panic!("expected epoch 2 to fail, got {other:?}"),
    }
    r.epochs.abort().expect("abort");
    r.before("commit 1", "flush 2 failed");
    for id in [2, 3] {
        r.log.position(&format!("abort {id}"));
        r.absent(&format!("commit {id}"));
    }
    assert_eq!(r.epochs.last_committed(), Some(&chk(1)));
}

#[test]
fn a_full_pool_makes_begin_wait_for_a_commit() {
    let mut r = rig(2);
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    *r.storage.gate.lock().expect("gate") = Some((started_tx, release_rx));
    r.epoch(1);
    assert_eq!(started_rx.recv().expect("upload 1 started"), 1);
    r.epoch(2);
    // Both producers are busy (epoch 1 uploading, epoch 2 sealed behind it): begin(3)
    // can only return once epoch 1 committed and freed its producer.
    let releaser = std::thread::spawn(move || {
        release_tx.send(()).expect("release 1");
        let _ = started_rx.recv();
        release_tx.send(()).expect("release 2");
    });
    let slot = r.epochs.begin(chk(3)).expect("begin 3");
    releaser.join().expect("releaser");
    r.before("commit 1", "begin 3 on 0");
    assert_eq!(slot, 0, "the producer epoch 1 freed");
    assert_eq!(r.epochs.pool_waits().0, 1);
}

/// The next periodic barrier waits for an earlier full (hashmap) snapshot to be written,
/// never for an upload or commit, and never for a RocksDB-like epoch.
#[test]
fn a_full_snapshot_is_being_written_until_the_committer_wrote_it_not_until_its_upload() {
    let mut r = rig(4);
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    *r.storage.gate.lock().expect("gate") = Some((started_tx, release_rx));
    let upload = |started: &mpsc::Receiver<u64>| started.recv_timeout(Duration::from_secs(30));
    assert!(!r.epochs.writing_full_snapshot(), "nothing sealed yet");
    r.full_epoch(1);
    assert_eq!(upload(&started), Ok(1), "epoch 1's upload began");
    assert!(
        !r.epochs.writing_full_snapshot(),
        "epoch 1's snapshot is written; only its upload is waiting"
    );
    r.epoch(2);
    assert!(
        !r.epochs.writing_full_snapshot(),
        "an epoch without a full snapshot (RocksDB's links) never holds the barrier"
    );
    r.full_epoch(3);
    assert!(
        r.epochs.writing_full_snapshot(),
        "epoch 3's full snapshot waits behind epoch 1's upload"
    );
    for id in [1, 2] {
        release.send(()).expect("release");
        assert_eq!(upload(&started), Ok(id + 1));
    }
    assert!(
        !r.epochs.writing_full_snapshot(),
        "epoch 3's snapshot is written"
    );
    release.send(()).expect("release 3");
    r.epochs.drain().expect("drain");
    r.before("commit 2", "commit 3");
    assert!(
        r.storage
            .written_files
            .lock()
            .expect("files")
            .get(&3)
            .is_some_and(|f| f.iter().any(|p| p == "keyed.bin")),
        "the committer wrote the full snapshot before the upload"
    );
}

#[test]
fn a_failed_upload_aborts_that_epoch_and_every_later_one_then_a_new_generation_commits() {
    let mut r = rig(4);
    r.storage.fail_write.lock().expect("fail").insert(2);
    r.epoch(1);
    r.full_epoch(2);
    r.full_epoch(3);
    r.epochs.begin(chk(4)).expect("begin 4");
    let err = r.epochs.drain().expect_err("epoch 2 fails");
    assert!(err.is_rewindable(), "{err}");
    assert!(matches!(&err, EpochError::Failed { checkpoint, .. } if checkpoint.id == 2));
    r.epochs.abort().expect("abort");
    r.before("commit 1", "write 2 failed");
    for id in [2, 3, 4] {
        r.log.position(&format!("abort {id}"));
        r.absent(&format!("offsets {id}"));
        r.absent(&format!("commit {id}"));
    }
    r.absent("write 3");
    assert_eq!(
        r.epochs.last_committed(),
        Some(&chk(1)),
        "the rewind target"
    );
    assert_eq!((r.epochs.in_flight(), r.epochs.open().is_none()), (0, true));
    assert!(
        !r.epochs.writing_full_snapshot(),
        "a failed or aborted epoch never holds the next barrier back"
    );
    r.epoch(5);
    r.epochs.drain().expect("the next generation commits");
    r.log.position("commit 5");
    assert_eq!(r.epochs.last_committed(), Some(&chk(5)));
}

#[test]
fn a_failed_commit_aborts_it_and_every_later_epoch() {
    let mut r = rig(3);
    r.fail_commit(2, 1, Failure::Abortable);
    r.epoch(1);
    r.epoch(2);
    r.epoch(3);
    let err = r.epochs.drain().expect_err("commit 2 fails");
    assert!(err.is_rewindable(), "{err}");
    r.epochs.abort().expect("abort");
    r.before("commit 1", "commit 2 failed");
    r.before("commit 2 failed", "abort 2");
    r.log.position("abort 3");
    r.absent("write 3");
    assert_eq!(r.epochs.last_committed(), Some(&chk(1)));
}

#[test]
fn a_fenced_producer_ends_the_instance() {
    let mut r = rig(3);
    r.fail_commit(1, 0, Failure::Fenced);
    r.epoch(1);
    r.epochs.begin(chk(2)).expect("begin 2");
    let sealed = r.sealed(2);
    // The committer may end (fenced) before epoch 2 is sealed or after: the seal or the
    // drain reports the fencing, never a committer merely "gone".
    let err = match r.epochs.seal(sealed) {
        Err(e) => e,
        Ok(()) => r.epochs.drain().expect_err("fenced"),
    };
    assert!(
        matches!(
            err,
            EpochError::Fatal(CommitError::Sink(SinkError::Fenced(_)))
        ),
        "{err}"
    );
    assert!(!err.is_rewindable());
    r.absent("commit 2");
    r.absent("offsets 2");
    assert_eq!(r.epochs.last_committed(), None);
}

#[test]
fn an_error_in_the_open_epoch_lets_sealed_epochs_commit_and_aborts_the_open_one() {
    let mut r = rig(3);
    r.epoch(1);
    r.epoch(2);
    r.epochs.begin(chk(3)).expect("begin 3");
    r.epochs.abort().expect("abort");
    r.log.position("commit 1");
    r.log.position("commit 2");
    r.before("commit 2", "abort 3");
    assert_eq!(r.epochs.last_committed(), Some(&chk(2)));
}

#[test]
fn shutdown_mid_upload_finishes_that_epoch_before_the_committer_ends() {
    let mut r = rig(2);
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    *r.storage.gate.lock().expect("gate") = Some((started_tx, release_rx));
    r.epoch(1);
    assert_eq!(started_rx.recv().expect("upload started"), 1);
    let log = r.log.clone();
    release_tx.send(()).expect("release");
    drop(r.epochs);
    let lines = log.lines();
    let commit = lines.iter().position(|l| l == "commit 1");
    let complete = lines.iter().position(|l| l == "complete 1");
    assert!(
        commit.is_some() && complete > commit,
        "the epoch under upload commits once, in order: {lines:?}"
    );
}
