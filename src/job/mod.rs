//! The job loop: source → decode → process (state) → sink → checkpoint, in epochs.
//!
//! One thread runs the whole loop for all of this instance's partitions, so a checkpoint
//! barrier is aligned by construction: when the loop stops polling to checkpoint, every
//! record before the barrier has been processed and produced into the open transaction,
//! and none after it has. The barrier itself is short ([`barrier`]): the upload and the
//! commit run on the committer thread of [`crate::commit`], and the loop goes on with the
//! next epoch.
//!
//! - [`start`]: connect, fence, restore;
//! - [`pipeline`]: what happens to each record;
//! - [`counters`]: the per-record counters' handles, fetched once;
//! - [`barrier`]: the synchronous part of a checkpoint, and what a completed one records;
//! - [`serve`]: admin requests, savepoints, shutdown, observation.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::{error, info, warn};

use crate::checkpoint::{CheckpointError, CheckpointRef, CheckpointStorage, PartitionOffset};
use crate::commit::{EpochError, Epochs};
use crate::control::{Rules, RulesView};
use crate::function::FunctionError;
use crate::history::{History, Trigger};
use crate::requests::{Reply, Request, Requests};
use crate::sink::{Producer, SinkError};
use crate::source::{Offsets, Source, SourceError, offset_state};
use crate::{repartition, rescale};
use streamstate_state::{KeyGroupRange, KeyGroups};

mod barrier;
mod counters;
mod pipeline;
mod serve;
mod start;

use barrier::Pending;
use pipeline::Pipeline;
use start::{Start, fresh_store, restore_into};

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("process function: {0}")]
    Function(#[from] FunctionError),
    #[error("state: {0}")]
    State(#[from] streamstate_state::StateError),
    #[error("checkpoint {name}: its source offsets differ from the group's committed offsets")]
    OffsetMismatch { name: String },
    #[error(transparent)]
    SourceOffsets(#[from] crate::source::offset_state::OffsetStateError),
    #[error(
        "cannot restore checkpoint {name}, which the committed offsets name: {source}. Fix or restore the \
         checkpoint storage, or start with --allow-older-checkpoint to fall back to an older one (at-least-once)"
    )]
    Restore { name: String, source: Box<JobError> },
    #[error(
        "{what} was taken with state.max_parallelism = {found}, but this start needs {expected}: key groups are \
         fixed at the first start. Keep state.max_parallelism at {found}, or re-key-group a savepoint offline \
         (docs/checkpoint-tools.md)"
    )]
    MaxParallelism {
        what: String,
        found: u32,
        expected: u32,
    },
    #[error(
        "{what} numbers keys as {found}, but job.instances > 1 with this input needs {expected}: instances own \
         input partitions, and the key groups must follow them. Rekey a savepoint offline (streamstate checkpoints \
         surgery <savepoint> --savepoint-dir <dir> rekey --max-parallelism {max} --aligned-partitions <input \
         partitions>) and start from it, or run one instance",
        max = found.max_parallelism()
    )]
    KeyGroups {
        what: String,
        found: KeyGroups,
        expected: KeyGroups,
    },
    #[error("checkpoint file {file} (stored at {stored}) is damaged: {reason}")]
    CorruptFile {
        file: String,
        stored: String,
        reason: String,
    },
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// The schema registry did not answer within `schema_registry.retry_for`: the open
    /// epochs are aborted and replayed, never dead-lettered.
    #[error("{0}")]
    Registry(String),
    #[error("{0}")]
    OutputFormat(String),
    #[error(transparent)]
    Format(#[from] crate::format::FormatError),
    #[error(transparent)]
    Rescale(#[from] rescale::RescaleError),
    #[error(transparent)]
    Repartition(#[from] repartition::RepartitionError),
    #[error(transparent)]
    Epoch(#[from] EpochError),
    #[error("local state directory {path}: {source}")]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("savepoint {id}: {reason}")]
    Savepoint { id: String, reason: String },
}

/// Flags shared with the admin server and signal handlers; the loop only reads them.
#[derive(Default)]
pub struct Control {
    pub shutdown: AtomicBool,
    /// `POST /stop` with `"hold": true`: after the final checkpoint the process stays up
    /// (live, not ready) until SIGTERM, so a supervisor does not restart it into
    /// processing before a rescale.
    pub hold_after_stop: AtomicBool,
    /// SIGTERM or SIGINT arrived.
    pub signalled: AtomicBool,
    pub checkpoint_requested: AtomicBool,
    pub ready: AtomicBool,
    pub alive: AtomicBool,
    /// The rules in force, as the job loop last applied them.
    pub rules: RulesView,
    /// Admin requests the loop serves between polls.
    pub requests: Requests,
    /// Checkpoints and savepoints this run took, for the admin API.
    pub history: History,
    /// The open Kafka transaction, for `GET /transactions` and its metrics.
    pub transactions: Arc<crate::transactions::Transactions>,
    /// Unix ms of the loop's last turn (0 while starting); `/livez` checks it.
    pub heartbeat_ms: AtomicU64,
    /// The key groups this instance owns and how keys are numbered into them, set once
    /// its state is open (`GET /instance`).
    pub key_groups: std::sync::Mutex<Option<(KeyGroupRange, KeyGroups)>>,
}

/// Choices made at start by the operator, not by the config file.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// When the committed checkpoint is missing or broken, restore the newest older one
    /// that is intact. Its offsets are older, so records in between are processed again.
    pub allow_older_checkpoint: bool,
    /// Rescaled start: restore this instance's share of the named savepoint set, unless
    /// a checkpoint of this instance was committed since (then that one).
    pub from_savepoint_set: Option<String>,
    /// Restore this savepoint (`sp-<n>-<run>`) instead of the committed checkpoint.
    pub from_savepoint: Option<String>,
    /// Base URL of the savepoint; default `<checkpoint.storage>/savepoints`.
    pub savepoint_location: Option<String>,
    /// Restore the savepoint even though the group's committed offsets differ from its
    /// offsets (records after them may be processed twice, or skipped).
    pub ignore_committed_offsets: bool,
}

pub struct Job {
    control: Arc<Control>,
    source: Source,
    storage: Arc<dyn CheckpointStorage>,
    /// The commit protocol: which producer holds which epoch, and the committer thread.
    /// What an aborted epoch rewinds to is its last committed checkpoint.
    epochs: Epochs<Producer>,
    /// This process run's id, part of every checkpoint name it writes.
    run: String,
    /// The id the next epoch's checkpoint gets; never reused, so an aborted attempt
    /// that published its checkpoint never lends its name to another.
    next_checkpoint_id: u64,
    /// Records handled and timers fired at the last barrier or rewind: while they stay
    /// the same nothing changed, and a periodic checkpoint has nothing to commit.
    unchanged_since: Option<(u64, u64)>,
    /// Sealed epochs, oldest first: what their history records need once they resolve.
    pending: std::collections::VecDeque<Pending>,
    start: Start,
    pipeline: Pipeline,
    requests: Option<std::sync::mpsc::Receiver<Request>>,
    /// `POST /stop`'s reply, answered once the final checkpoint is committed.
    stopping: Option<(
        Option<crate::history::SavepointRecord>,
        Reply<Option<crate::history::SavepointRecord>>,
    )>,
    /// State came from a savepoint: checkpoint it before processing anything.
    restored_from_savepoint: bool,
    /// Set while local state or checkpoint storage is full or unreachable: not ready
    /// until a checkpoint commits again.
    disk_full: bool,
}

impl Job {
    /// Runs epochs until shutdown is requested; the last epoch ends with a checkpoint.
    pub fn run(mut self) -> Result<(), JobError> {
        self.begin()?;
        if self.restored_from_savepoint {
            // Recovery must never need the savepoint again: make its state a checkpoint
            // before any record. A failure here ends the run (a restart retries it).
            self.checkpoint_and_wait(Trigger::AfterSavepointRestore)?;
            self.begin()?;
        }
        if let Err(e) = self.catch_up_control() {
            self.recover(e)?;
        }
        self.control.ready.store(true, Ordering::SeqCst);
        let (interval, min_pause) = (
            self.pipeline.config.checkpoint.interval,
            self.pipeline.config.checkpoint.min_pause,
        );
        let mut due = Instant::now() + interval;
        let mut observed = Instant::now();
        loop {
            self.control.alive.store(true, Ordering::Relaxed);
            self.control
                .heartbeat_ms
                .store(unix_ms(), Ordering::Relaxed);
            self.serve_requests()?;
            if let Err(e) = self.poll_commits() {
                self.recover(e)?;
            }
            if let Err(e) = self.pipeline.sink.pump() {
                self.recover(e.into())?;
            }
            if observed.elapsed() >= Duration::from_secs(1) {
                self.observe();
                observed = Instant::now();
            }
            if self.control.shutdown.load(Ordering::SeqCst) {
                return self.shut_down();
            }
            let now = Instant::now();
            // A due barrier waits while a full snapshot is still being written
            // (`Epochs::writing_full_snapshot`); one asked for (admin, savepoint) does not.
            let postponed = now >= due && self.epochs.writing_full_snapshot();
            if (now >= due && !postponed)
                || self
                    .control
                    .checkpoint_requested
                    .swap(false, Ordering::SeqCst)
            {
                match self.barrier(Trigger::Periodic) {
                    Ok(true) => {
                        if let Err(e) = self.begin() {
                            self.recover(e)?;
                        }
                    }
                    // Nothing changed: the open epoch goes on.
                    Ok(false) => {}
                    Err(e) => self.recover(e)?,
                }
                due = (now + interval).max(Instant::now() + min_pause);
                continue;
            }
            // Records held behind the previous epoch's producer go out soon after it
            // delivered, even when no input arrives.
            let poll_at_most = if self.pipeline.sink.held() > 0 || postponed {
                Duration::from_millis(2)
            } else {
                Duration::from_millis(100)
            };
            let wait = if postponed {
                poll_at_most
            } else {
                due.saturating_duration_since(now).min(poll_at_most)
            };
            let consumer = self.source.consumer();
            let handled = match consumer.poll(wait) {
                None => self.pipeline.fire_timers(),
                Some(Ok(msg)) => {
                    let started = Instant::now();
                    // What else librdkafka already holds joins the batch, up to its bound.
                    let mut batch = Vec::with_capacity(pipeline::MAX_BATCH_RECORDS);
                    batch.push(msg);
                    while batch.len() < pipeline::MAX_BATCH_RECORDS {
                        match consumer.poll(Duration::ZERO) {
                            Some(Ok(msg)) => batch.push(msg),
                            Some(Err(e)) => {
                                warn!(error = %e, "consumer error (librdkafka retries by itself)");
                                break;
                            }
                            None => break,
                        }
                    }
                    let handled = self.pipeline.handle_batch(&batch);
                    let per_record = started.elapsed().as_secs_f64() / batch.len() as f64;
                    for _ in 0..batch.len() {
                        self.pipeline
                            .metrics
                            .processing_duration
                            .observe(per_record);
                    }
                    handled
                }
                Some(Err(e)) => {
                    warn!(error = %e, "consumer error (librdkafka retries by itself)");
                    Ok(())
                }
            };
            if let Err(e) = handled {
                self.recover(e)?;
            }
        }
    }

    /// Opens the next epoch's transaction, named after the checkpoint that will end it,
    /// on a free producer of the pool (waiting for one: back-pressure).
    fn begin(&mut self) -> Result<(), JobError> {
        let next = CheckpointRef::new(self.next_checkpoint_id, &self.run);
        self.next_checkpoint_id += 1;
        let waits = self.epochs.pool_waits();
        let slot = self.epochs.begin(next);
        self.count_pool_waits(waits);
        self.pipeline.sink.use_slot(slot?);
        self.record_completed();
        Ok(())
    }

    /// Reads the control topic up to its end before any input, so the rules in force
    /// when processing starts are all the rules published before it. Bounded by
    /// `kafka.connect_timeout` (an open transaction on the control topic would otherwise
    /// hold it forever); input then starts with what was read.
    fn catch_up_control(&mut self) -> Result<(), JobError> {
        let p = &mut self.pipeline;
        if p.control_offsets.is_empty() {
            return Ok(());
        }
        let ends = self.source.end_offsets(p.control_offsets.keys())?;
        let behind = |positions: &crate::source::Offsets| {
            ends.iter()
                .any(|(part, end)| positions.get(part).copied().unwrap_or(0) < *end)
        };
        if behind(&p.control_offsets) {
            self.source.assign(p.control_offsets.iter())?;
            let deadline = Instant::now() + p.config.kafka.connect_timeout;
            let mut read = 0usize;
            while Instant::now() < deadline {
                match self.source.consumer().poll(Duration::from_millis(100)) {
                    Some(Ok(msg)) => {
                        let started = Instant::now();
                        p.handle(&msg)?;
                        p.metrics
                            .processing_duration
                            .observe(started.elapsed().as_secs_f64());
                        read += 1;
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "consumer error while reading the control topic")
                    }
                    None => {}
                }
                if !behind(&self.source.positions()?) {
                    break;
                }
            }
            if behind(&self.source.positions()?) {
                warn!(
                    read,
                    "control topic not read to its end within kafka.connect_timeout; starting input anyway"
                );
            } else {
                info!(
                    read,
                    rules = p.rules.as_ref().map_or(0, Rules::active),
                    "control topic read to its end"
                );
            }
        }
        self.source
            .assign(p.offsets.iter().chain(&p.control_offsets))?;
        Ok(())
    }

    /// A failure that a rewind cures (an abortable transaction, an epoch that did not
    /// commit, checkpoint storage or local disk full or away): every open epoch is
    /// settled — sealed ones before the failure still commit, the rest are aborted — and
    /// state and offsets go back to the last committed checkpoint, so the aborted epochs
    /// are redone from scratch. A new epoch is open when this returns.
    ///
    /// Every other error ends the run, a timed-out transactional call too: its outcome is
    /// unknown here, and the restart settles it the one way that is tested end to end
    /// (`init_transactions` fences this producer and the coordinator finishes or aborts
    /// the transaction; the group's committed offsets then name the checkpoint to restore).
    fn recover(&mut self, cause: JobError) -> Result<(), JobError> {
        if !is_rewindable(&cause) {
            return Err(cause);
        }
        let disk_full = is_disk_full(&cause);
        if disk_full {
            self.control.ready.store(false, Ordering::SeqCst);
            self.disk_full = true;
            error!(error = %cause, "disk full: aborting the epoch's transaction; not ready until space returns");
        } else {
            warn!(error = %cause, "aborting the open epochs and rewinding to the last committed checkpoint");
        }
        self.epochs.abort()?;
        self.pipeline.sink.discard_held();
        self.record_completed();
        self.record_aborted(&cause);
        start::remove_staging(&self.pipeline.config)?;
        self.rewind_until_done(cause, disk_full)?;
        self.begin()
    }

    /// Rewinds, retrying with backoff while local disk or checkpoint storage fails
    /// (not ready meanwhile; readiness returns with the next committed checkpoint).
    fn rewind_until_done(&mut self, cause: JobError, wait_first: bool) -> Result<(), JobError> {
        let mut backoff = Duration::from_millis(500);
        let mut wait = wait_first;
        loop {
            if wait {
                let until = Instant::now() + backoff;
                while Instant::now() < until {
                    self.control.alive.store(true, Ordering::Relaxed);
                    if self.control.shutdown.load(Ordering::SeqCst) {
                        return Err(cause);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            match self.rewind() {
                Ok(()) => return Ok(()),
                Err(e) if is_disk_full(&e) => {
                    warn!(error = %e, retry_in = ?backoff, "disk still full; cannot rewind yet")
                }
                Err(JobError::Checkpoint(e)) => {
                    self.control.ready.store(false, Ordering::SeqCst);
                    self.disk_full = true;
                    warn!(error = %e, retry_in = ?backoff, "checkpoint storage failed; cannot rewind yet, not ready")
                }
                Err(e) => return Err(e),
            }
            wait = true;
        }
    }

    fn rewind(&mut self) -> Result<(), JobError> {
        let p = &mut self.pipeline;
        let last = self.epochs.last_committed().cloned();
        let manifest = match &last {
            Some(c) => {
                let manifest = self.storage.read_manifest(c)?;
                let state = &mut p.state;
                restore_into(&p.config, self.storage.as_ref(), &manifest, |from| {
                    Ok(state.reset(Some(from))?)
                })?;
                Some(manifest)
            }
            None => {
                p.state.reset(None)?;
                None
            }
        };
        let restored = match &manifest {
            Some(m) => Some(offset_state::restored(p.state.store(), m)?),
            None => None,
        };
        (p.offsets, p.control_offsets) = self.start.positions(restored.as_ref());
        self.source
            .assign(p.offsets.iter().chain(&p.control_offsets))?;
        if let Some(rules) = &p.rules {
            rules.refresh_view()?;
            p.metrics.rules_active.set(rules.active() as i64);
        }
        // The state is the committed checkpoint's again: nothing new to commit yet.
        self.unchanged_since = Some(self.change_mark());
        info!(checkpoint = ?last.as_ref().map(ToString::to_string), "rewound to the last committed checkpoint");
        Ok(())
    }
}

/// Whether [`Job::recover`] can cure `e` by a rewind.
fn is_rewindable(e: &JobError) -> bool {
    match e {
        JobError::Sink(SinkError::Abortable(_)) => true,
        JobError::Registry(_) => true,
        JobError::Epoch(e) => e.is_rewindable(),
        e => is_disk_full(e),
    }
}

pub(super) fn partition_offsets(offsets: &Offsets) -> Vec<PartitionOffset> {
    offsets
        .iter()
        .map(|((topic, partition), offset)| PartitionOffset {
            topic: topic.clone(),
            partition: *partition,
            offset: *offset,
        })
        .collect()
}

/// Out of space (ENOSPC) or quota (EDQUOT) anywhere in the error's chain, including
/// RocksDB's own I/O errors, which reach us only as text.
pub fn is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && (matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ) || matches!(io.raw_os_error(), Some(28 | 122)))
        {
            return true;
        }
        let text = err.to_string();
        if text.contains("No space left on device") || text.contains("Disk quota exceeded") {
            return true;
        }
        next = err.source();
    }
    false
}

pub(super) fn remove_dir(path: &std::path::Path) -> Result<(), JobError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(JobError::StateDir {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

pub(super) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(super) fn manifest_offsets(offsets: &[PartitionOffset]) -> Offsets {
    offsets
        .iter()
        .map(|o| ((o.topic.clone(), o.partition), o.offset))
        .collect()
}
