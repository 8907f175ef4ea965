//! The commit protocol: pipelined epochs over a pool of transactional producers.
//!
//! Epoch `e` produces into transaction `T_e` on one producer of the pool. At its barrier
//! the job thread takes only the synchronous part of the checkpoint (a local snapshot by
//! hard links, the offsets), [`Epochs::seal`]s the epoch and hands it to the committer
//! thread, [`Epochs::begin`]s `T_{e+1}` on the next free producer and goes on polling.
//! The committer, strictly in epoch order, makes `chk-e` durable (upload), sends epoch
//! `e`'s offsets into `T_e` and commits it, then marks `chk-e` complete and prunes. So
//! `T_e` commits only after `chk-e` is durable and after `T_{e-1}` committed, and the
//! commit stays the one atomic decision point of `../shared/DESIGN.md`.
//!
//! When anything fails for epoch `e` (upload, offsets, commit), the committer aborts `T_e`
//! and every later epoch it was handed, and [`Epochs::abort`] aborts the open one: the job
//! then rewinds to [`Epochs::last_committed`]. A fenced or timed-out producer is
//! [`EpochError::Fatal`]: the instance ends and its restart settles the transactions.
//! When every producer is busy, `begin` waits for the committer (back-pressure); it never
//! reorders or skips an epoch.
//!
//! This is Flink's asynchronous RocksDB snapshot together with its KafkaSink, which opens
//! a new transaction per checkpoint on a pooled producer and commits it once the
//! checkpoint is complete. The module knows Kafka and checkpoint storage only through the
//! [`Slot`] and [`CheckpointStorage`] traits, so its orderings are unit-tested with fakes.

mod committer;
mod handover;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use streamstate_state::DeferredSnapshot;

use crate::checkpoint::{CheckpointError, CheckpointRef, CheckpointStorage, Manifest, WriteStats};
use crate::sink::SinkError;
use crate::source::Offsets;

pub use handover::Handover;

/// One transactional producer of the pool, as the protocol uses it. The job thread
/// begins and fills a slot's transaction; once sealed, only the committer touches it.
pub trait Slot: Send + Sync + 'static {
    fn begin(&self, checkpoint: &CheckpointRef) -> Result<(), SinkError>;
    /// Waits until every record queued in the open transaction reached the broker.
    fn flush(&self) -> Result<(), SinkError>;
    /// Records queued and not yet acknowledged by the broker.
    fn queued(&self) -> usize;
    fn send_offsets(&self, offsets: &Offsets, checkpoint: &CheckpointRef) -> Result<(), SinkError>;
    fn commit(&self) -> Result<(), SinkError>;
    fn abort(&self) -> Result<(), SinkError>;
}

impl Slot for crate::sink::Producer {
    fn begin(&self, checkpoint: &CheckpointRef) -> Result<(), SinkError> {
        crate::sink::Producer::begin(self, checkpoint)
    }
    fn flush(&self) -> Result<(), SinkError> {
        crate::sink::Producer::flush(self)
    }
    fn queued(&self) -> usize {
        crate::sink::Producer::queued(self)
    }
    fn send_offsets(&self, offsets: &Offsets, checkpoint: &CheckpointRef) -> Result<(), SinkError> {
        crate::sink::Producer::send_offsets(self, offsets, checkpoint)
    }
    fn commit(&self) -> Result<(), SinkError> {
        crate::sink::Producer::commit(self)
    }
    fn abort(&self) -> Result<(), SinkError> {
        crate::sink::Producer::abort(self)
    }
}

/// An epoch at its barrier: the local snapshot and what its commit will declare.
pub struct Sealed {
    /// The manifest as it will be stored; the files the snapshot deferred are added by
    /// the committer (`rest`).
    pub manifest: Manifest,
    /// The local snapshot (hard links), removed once uploaded.
    pub staging: PathBuf,
    /// The rest of the state snapshot (RocksDB's flush and links, new SSTs' hashes);
    /// `None` when it was whole at the barrier.
    pub rest: Option<DeferredSnapshot>,
    /// Input offsets the commit sends into the epoch's transaction.
    pub offsets: Offsets,
    /// When the barrier began, for the end-to-end checkpoint duration.
    pub barrier_at: Instant,
}

/// An epoch whose transaction committed.
#[derive(Debug)]
pub struct Committed {
    pub manifest: Manifest,
    pub written: WriteStats,
    pub barrier_at: Instant,
    /// The part of `upload` that finished the local snapshot: RocksDB's flush of the
    /// barrier's memtables, its hard links, the new files' hashes. The rest is the copy
    /// into checkpoint storage with its syncs; the split says which one a slow upload
    /// waited for.
    pub materialize: Duration,
    /// The local snapshot finished and written to checkpoint storage.
    pub upload: Duration,
    /// Offsets into the transaction and its commit.
    pub commit: Duration,
}

/// Why an epoch did not commit.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("state snapshot: {0}")]
    State(#[from] streamstate_state::StateError),
    #[error("local snapshot {path}: {source}")]
    Staging {
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    /// `checkpoint` did not commit, and neither will any later epoch handed over before
    /// it failed: the job rewinds to the last committed checkpoint.
    #[error("checkpoint {checkpoint} did not commit: {cause}")]
    Failed {
        checkpoint: CheckpointRef,
        cause: CommitError,
    },
    /// The instance must end: a fenced, timed-out or failing producer.
    #[error(transparent)]
    Fatal(CommitError),
    #[error("the checkpoint committer thread ended unexpectedly")]
    CommitterGone,
}

impl EpochError {
    /// Whether a rewind to the last committed checkpoint cures this.
    pub fn is_rewindable(&self) -> bool {
        matches!(self, Self::Failed { .. })
    }
}

/// Work for the committer, in epoch order.
struct Work<S> {
    /// Bumped by every [`Epochs::abort`]: after a failure the committer aborts the rest
    /// of the failed generation instead of committing it.
    generation: u64,
    checkpoint: CheckpointRef,
    slot: Arc<S>,
    sealed: Sealed,
}

impl<S> Work<S> {
    /// Counted by [`Epochs::writing_full_snapshot`] (until the committer takes `rest`).
    fn full_snapshot(&self) -> bool {
        self.sealed
            .rest
            .as_ref()
            .is_some_and(DeferredSnapshot::is_full)
    }
}

enum Outcome {
    Committed(Committed),
    Failed {
        checkpoint: CheckpointRef,
        cause: CommitError,
    },
    /// A later epoch of a failed generation, aborted unseen.
    Aborted,
    Fatal(CommitError),
}

/// The job thread's side of the protocol: which producer holds which epoch.
pub struct Epochs<S: Slot> {
    slots: Vec<Arc<S>>,
    free: VecDeque<usize>,
    /// The epoch taking records, and its slot.
    open: Option<(CheckpointRef, usize)>,
    /// Sealed epochs the committer has not reported on, oldest first.
    in_flight: VecDeque<(CheckpointRef, usize)>,
    generation: u64,
    last_committed: Option<CheckpointRef>,
    completed: Vec<Committed>,
    work: Option<Sender<Work<S>>>,
    outcomes: Receiver<Outcome>,
    committer: Option<JoinHandle<()>>,
    /// `begin`s that had to wait for a free producer, and the time they waited.
    pool_waits: u64,
    pool_wait: Duration,
    /// Epochs sealed so far with a full snapshot to write, and of those, how many the
    /// committer has written (or given up on): see [`Epochs::writing_full_snapshot`].
    full_sealed: u64,
    written: Arc<AtomicU64>,
}

/// What the committer does after a commit besides reporting it.
pub struct Housekeeping {
    /// Completed checkpoints kept (`checkpoint.retained`).
    pub retained: usize,
}

impl<S: Slot> Epochs<S> {
    /// Starts the committer thread. `last_committed` is what a rewind goes back to until
    /// this run commits (`None`: the start positions and empty state).
    pub fn new(
        slots: Vec<Arc<S>>,
        storage: Arc<dyn CheckpointStorage>,
        housekeeping: Housekeeping,
        last_committed: Option<CheckpointRef>,
    ) -> Self {
        let (work_tx, work_rx) = mpsc::channel();
        let (out_tx, out_rx) = mpsc::channel();
        let written = Arc::new(AtomicU64::new(0));
        let counter = written.clone();
        let committer = std::thread::Builder::new()
            .name("checkpoint-committer".into())
            .spawn(move || committer::run(storage, housekeeping, work_rx, out_tx, &counter))
            .ok();
        Self {
            free: (0..slots.len()).collect(),
            slots,
            open: None,
            in_flight: VecDeque::new(),
            generation: 0,
            last_committed,
            completed: Vec::new(),
            work: Some(work_tx),
            outcomes: out_rx,
            committer,
            pool_waits: 0,
            pool_wait: Duration::ZERO,
            full_sealed: 0,
            written,
        }
    }

    /// A full snapshot (the `hashmap` backend's) sealed earlier is not written yet. A
    /// periodic barrier waits for it, as Flink triggers no checkpoint while one is in
    /// progress: each barrier taken meanwhile would queue one more O(state) write behind
    /// it, and the committer writing them back to back took the CPU from processing.
    /// RocksDB's snapshots (links, then new SSTs) never count: their epochs stay pipelined
    /// up to the producer pool.
    pub fn writing_full_snapshot(&self) -> bool {
        self.written.load(Ordering::Acquire) < self.full_sealed
    }

    pub fn last_committed(&self) -> Option<&CheckpointRef> {
        self.last_committed.as_ref()
    }

    /// The open epoch's checkpoint and slot.
    pub fn open(&self) -> Option<(&CheckpointRef, usize)> {
        self.open.as_ref().map(|(c, s)| (c, *s))
    }

    /// Epochs sealed and not yet committed or aborted.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// `begin`s that waited for a free producer, and the total time they waited.
    pub fn pool_waits(&self) -> (u64, Duration) {
        (self.pool_waits, self.pool_wait)
    }

    /// Opens `checkpoint`'s transaction on a free producer, waiting for the committer
    /// while none is free; returns the slot records now go to.
    pub fn begin(&mut self, checkpoint: CheckpointRef) -> Result<usize, EpochError> {
        debug_assert!(self.open.is_none(), "one open epoch at a time");
        if self.free.is_empty() {
            let started = Instant::now();
            self.pool_waits += 1;
            while self.free.is_empty() {
                let outcome = self.next_outcome()?;
                self.apply(outcome)?;
            }
            self.pool_wait += started.elapsed();
        }
        let slot = self.free.pop_front().ok_or(EpochError::CommitterGone)?;
        if let Err(e) = self.slots[slot].begin(&checkpoint) {
            self.free.push_front(slot);
            return Err(classify(checkpoint, CommitError::Sink(e)));
        }
        self.open = Some((checkpoint, slot));
        Ok(slot)
    }

    /// Hands the open epoch to the committer. Its transaction takes no more records.
    ///
    /// Its records may still be on their way to the broker: the committer flushes them
    /// before it commits, and the next epoch's records wait behind them in the sink's
    /// [`Handover`], so a key keeps its order across the barrier without the job thread
    /// waiting here.
    pub fn seal(&mut self, sealed: Sealed) -> Result<(), EpochError> {
        let (checkpoint, slot) = self.open.take().ok_or(EpochError::CommitterGone)?;
        let work = Work {
            generation: self.generation,
            checkpoint: checkpoint.clone(),
            slot: self.slots[slot].clone(),
            sealed,
        };
        self.in_flight.push_back((checkpoint, slot));
        self.full_sealed += u64::from(work.full_snapshot());
        let sender = self.work.as_ref().ok_or(EpochError::CommitterGone)?;
        if sender.send(work).is_err() {
            // The committer ends after a fatal outcome (a fenced producer), which it
            // reported first: that is the cause to return, not "gone".
            self.drain()?;
            return Err(EpochError::CommitterGone);
        }
        Ok(())
    }

    /// What the committer reported since the last call, without waiting. A failure is
    /// returned once; the caller then calls [`Epochs::abort`] and rewinds.
    pub fn poll(&mut self) -> Result<(), EpochError> {
        loop {
            match self.outcomes.try_recv() {
                Ok(outcome) => self.apply(outcome)?,
                Err(mpsc::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::TryRecvError::Disconnected) if self.in_flight.is_empty() => {
                    return Ok(());
                }
                Err(mpsc::TryRecvError::Disconnected) => return Err(EpochError::CommitterGone),
            }
        }
    }

    /// Waits until every sealed epoch committed (or the first failure).
    pub fn drain(&mut self) -> Result<(), EpochError> {
        while !self.in_flight.is_empty() {
            let outcome = self.next_outcome()?;
            self.apply(outcome)?;
        }
        Ok(())
    }

    /// Epochs committed since the last call, in order.
    pub fn take_completed(&mut self) -> Vec<Committed> {
        std::mem::take(&mut self.completed)
    }

    /// Leaves nothing open or in flight: epochs sealed before the failure still commit
    /// (or are aborted by the committer if an earlier one failed), then the open epoch's
    /// transaction is aborted. The caller rewinds to [`Epochs::last_committed`]; the
    /// epochs it begins next are a new generation.
    pub fn abort(&mut self) -> Result<(), EpochError> {
        while !self.in_flight.is_empty() {
            let outcome = self.next_outcome()?;
            match self.apply(outcome) {
                Ok(()) | Err(EpochError::Failed { .. }) => {}
                Err(fatal) => return Err(fatal),
            }
        }
        self.generation += 1;
        if let Some((checkpoint, slot)) = self.open.take() {
            self.free.push_back(slot);
            self.slots[slot]
                .abort()
                .map_err(|e| classify(checkpoint, CommitError::Sink(e)))
                .map_err(|e| match e {
                    // An abort that fails leaves the transaction's fate to the restart.
                    EpochError::Failed { cause, .. } => EpochError::Fatal(cause),
                    other => other,
                })?;
        }
        Ok(())
    }

    fn next_outcome(&mut self) -> Result<Outcome, EpochError> {
        self.outcomes.recv().map_err(|_| EpochError::CommitterGone)
    }

    fn apply(&mut self, outcome: Outcome) -> Result<(), EpochError> {
        let mut resolved = || {
            let (checkpoint, slot) = self
                .in_flight
                .pop_front()
                .ok_or(EpochError::CommitterGone)?;
            self.free.push_back(slot);
            Ok::<_, EpochError>(checkpoint)
        };
        match outcome {
            Outcome::Committed(c) => {
                let checkpoint = resolved()?;
                debug_assert_eq!(checkpoint, c.manifest.checkpoint, "commits in epoch order");
                self.last_committed = Some(checkpoint);
                self.completed.push(c);
                Ok(())
            }
            Outcome::Aborted => resolved().map(drop),
            Outcome::Failed { checkpoint, cause } => {
                resolved()?;
                Err(EpochError::Failed { checkpoint, cause })
            }
            Outcome::Fatal(cause) => Err(EpochError::Fatal(cause)),
        }
    }
}

impl<S: Slot> Drop for Epochs<S> {
    fn drop(&mut self) {
        // Closing the channel ends the committer once it finished the epoch it holds.
        self.work = None;
        if let Some(handle) = self.committer.take() {
            let _ = handle.join();
        }
    }
}

/// Which failures a rewind cures: an abortable transaction, or checkpoint storage that
/// failed (a rewind re-reads the last committed checkpoint, retried while storage is
/// away). Fencing, timeouts and other producer errors end the instance.
fn classify(checkpoint: CheckpointRef, cause: CommitError) -> EpochError {
    match &cause {
        CommitError::Sink(SinkError::Abortable(_))
        | CommitError::Checkpoint(_)
        | CommitError::State(_)
        | CommitError::Staging { .. } => EpochError::Failed { checkpoint, cause },
        CommitError::Sink(_) => EpochError::Fatal(cause),
    }
}
