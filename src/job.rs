//! The job loop: source → decode → process (state) → sink → checkpoint, in epochs.
//!
//! One thread runs the whole loop for all of this instance's partitions, so a checkpoint
//! barrier is aligned by construction: when the loop stops polling to checkpoint, every
//! record before the barrier has been processed and produced into the open transaction,
//! and none after it has.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use streamstate_state::{SnapshotResult, StateStore, StoreConfig};
use tracing::{error, info, warn};

use crate::checkpoint::{
    CheckpointError, CheckpointRef, CheckpointStorage, FORMAT_VERSION, Manifest, PartitionOffset,
    open_storage,
};
use crate::config::FunctionKind;
use crate::config::{Config, StartOffsets};
use crate::control::{RuleOutcome, Rules, RulesView};
use crate::decode::Decoder;
use crate::driver::{Driver, EventTime};
use crate::function::{BroadcastUpdate, FunctionError, OutputRecord, ProcessFunction, SourceRef};
use crate::functions::Count;
use crate::history::{CheckpointRecord, History, Trigger};
use crate::metrics::Metrics;
use crate::requests::{Reply, Request, Requests};
use crate::sink::{Sink, SinkError};
use crate::source::{Offsets, Source, SourceError, offsets_for_commit};
use crate::{cluster, repartition, rescale};

// Admin requests, savepoints, shutdown and observation: the job's edges, kept out of
// the commit protocol below.
mod serve;

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
    #[error("checkpoint {name}: offsets in its manifest differ from the group's committed offsets")]
    OffsetMismatch { name: String },
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
    #[error("checkpoint file {file} (stored at {stored}) is damaged: {reason}")]
    CorruptFile {
        file: String,
        stored: String,
        reason: String,
    },
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error(transparent)]
    Rescale(#[from] rescale::RescaleError),
    #[error(transparent)]
    Repartition(#[from] repartition::RepartitionError),
    #[error("consumer has no group metadata; cannot commit offsets in a transaction")]
    NoGroupMetadata,
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
    storage: Box<dyn CheckpointStorage>,
    /// This process run's id, part of every checkpoint name it writes.
    run: String,
    next_checkpoint_id: u64,
    /// What an aborted epoch rewinds to: the last committed checkpoint, or the start.
    last_committed: Option<CheckpointRef>,
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
    /// Set while local state or checkpoint storage is full: not ready until a checkpoint
    /// commits again.
    disk_full: bool,
}

/// Everything downstream of the consumer; split from [`Job`] so a message borrowed from
/// the consumer can be handled without copying it.
struct Pipeline {
    config: Config,
    metrics: Metrics,
    decoder: Decoder,
    sink: Sink,
    state: Driver,
    offsets: Offsets,
    /// Present when `kafka.control_topic` is set.
    rules: Option<Rules>,
    control_offsets: Offsets,
    /// Repartition mode: the internal topic (hop 2 reads it; every other input is hop 1).
    repartition: Option<String>,
}

impl Job {
    /// [`Job::start_with`] the built-in function `[job] function` names.
    pub fn start(
        config: Config,
        metrics: Metrics,
        control: Arc<Control>,
        options: StartOptions,
    ) -> Result<Self, JobError> {
        let function: Box<dyn ProcessFunction> = match config.job.function {
            FunctionKind::Count => Box::new(Count::default()),
            FunctionKind::Json => Box::new(crate::functions::Json),
            FunctionKind::Passthrough => Box::new(crate::functions::Passthrough),
            FunctionKind::Rules => {
                Box::new(crate::rules::RuleEngine::new(&config, metrics.clone()))
            }
        };
        Self::start_with(config, metrics, control, options, function)
    }

    /// Connects, fences the previous incarnation, restores the committed checkpoint, and
    /// opens `function` on the restored state.
    pub fn start_with(
        config: Config,
        metrics: Metrics,
        control: Arc<Control>,
        options: StartOptions,
        function: Box<dyn ProcessFunction>,
    ) -> Result<Self, JobError> {
        let source = Source::new(&config)?;
        let servers = &config.kafka.bootstrap_servers;
        let all_parts =
            source.partitions(servers, "kafka.input_topics", &config.kafka.input_topics)?;
        let (instance, instances) = (config.job.instance, config.job.instances);
        let internal = config.job.repartition.then(|| config.repartition_topic());
        // Key groups: fixed at the first start. Several instances need key group =
        // partition, so their default is one topic's partition count; in repartition mode
        // the internal topic has one partition per key group, whatever the input has.
        let max_parallelism =
            config
                .state
                .max_parallelism
                .unwrap_or(if instances > 1 && internal.is_none() {
                    all_parts
                        .iter()
                        .filter(|(t, _)| *t == all_parts[0].0)
                        .count() as u32
                } else {
                    all_parts.len() as u32
                });
        let ownership = match &internal {
            Some(topic) => {
                repartition::create_topic(&config, max_parallelism)?;
                // Created moments ago here or by another instance: brokers learn of a new
                // topic asynchronously, so "does not exist" is waited out for a while.
                let deadline = Instant::now() + config.kafka.connect_timeout;
                let found = loop {
                    match source.partitions(servers, "job.repartition", std::slice::from_ref(topic))
                    {
                        Err(SourceError::MissingTopic { .. }) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(100))
                        }
                        other => break other?,
                    }
                };
                repartition::check_partition_count(topic, found.len(), max_parallelism)?;
                cluster::repartition_ownership(
                    &all_parts,
                    topic,
                    max_parallelism,
                    instances,
                    instance,
                )?
            }
            None => cluster::ownership(&all_parts, max_parallelism, instances, instance)?,
        };
        let parts = ownership.partitions.clone();
        // Hop 2 reads everything forwarded to its partitions, whatever kafka.start_offsets
        // says about the input: those records are input already accepted.
        let (internal_parts, input_parts): (Vec<_>, Vec<_>) = parts
            .iter()
            .cloned()
            .partition(|(t, _)| Some(t) == internal.as_ref());
        let control_parts = match &config.kafka.control_topic {
            Some(topic) => {
                source.partitions(servers, "kafka.control_topic", std::slice::from_ref(topic))?
            }
            None => Vec::new(),
        };
        // Fence first: once init_transactions returns, no older producer with our id can
        // commit, so the committed offsets read next cannot move under us.
        let sink = Sink::new(&config, control.transactions.clone())?;
        let storage = open_storage(&config)?;
        // A rescaled start: the set's offsets are committed for these partitions (each by
        // the old instance that owned it) until this instance commits its first checkpoint.
        let from_set = match &options.from_savepoint_set {
            Some(name) => {
                let set = rescale::read(&config, name)?;
                if set.max_parallelism != max_parallelism {
                    return Err(JobError::MaxParallelism {
                        what: format!("savepoint set {name}"),
                        found: set.max_parallelism,
                        expected: max_parallelism,
                    });
                }
                let set_offsets: Offsets = manifest_offsets(&set.offsets())
                    .into_iter()
                    .filter(|(p, _)| parts.contains(p))
                    .collect();
                let committed_now = source.committed_offsets(&parts)?;
                if committed_now == set_offsets {
                    Some(set)
                } else {
                    info!(set = %name, "the committed offsets moved past the savepoint set: restoring this instance's own checkpoint");
                    None
                }
            }
            None => None,
        };
        let committed = if from_set.is_some() {
            None
        } else {
            source.committed(&parts)?
        };
        let discarded = storage.discard_uncommitted(committed.as_ref().map(|c| &c.checkpoint))?;
        if !discarded.is_empty() {
            let names: Vec<String> = discarded.iter().map(ToString::to_string).collect();
            info!(checkpoints = ?names, "discarded checkpoints that never committed");
        }
        let started = Instant::now();
        // Rules are read from the beginning: every instance must know all of them.
        let mut input_start = source.start_offsets(&input_parts, config.kafka.start_offsets)?;
        input_start.extend(source.start_offsets(&internal_parts, StartOffsets::Earliest)?);
        let start = Start {
            input: input_start,
            control: source.start_offsets(&control_parts, StartOffsets::Earliest)?,
        };
        let from_savepoint = match (&options.from_savepoint, from_set) {
            (_, Some(set)) => Some(restore_set(&config, &set, &parts, max_parallelism)?),
            (Some(id), None) => Some(serve::restore_savepoint(
                &config,
                &options,
                id,
                committed.as_ref(),
            )?),
            (None, None) => None,
        };
        let restored_from_savepoint = from_savepoint.is_some();
        let (store, manifest) = match (from_savepoint, committed) {
            (Some((store, manifest)), _) => (store, Some(manifest)),
            (None, None) => {
                info!("no committed checkpoint: first start with empty state");
                (fresh_store(&config, max_parallelism)?, None)
            }
            (None, Some(c)) => {
                let restored = read_and_restore(&config, storage.as_ref(), &c.checkpoint).and_then(
                    |(state, m)| {
                        if manifest_offsets(&m.offsets) != c.offsets {
                            return Err(JobError::OffsetMismatch {
                                name: c.checkpoint.to_string(),
                            });
                        }
                        Ok((state, m))
                    },
                );
                let (state, manifest) = match restored {
                    Ok(r) => r,
                    Err(e) if options.allow_older_checkpoint => {
                        error!(checkpoint = %c.checkpoint, error = %e, "committed checkpoint cannot be restored");
                        restore_older(&config, storage.as_ref(), &c.checkpoint)?
                    }
                    Err(e) => {
                        return Err(JobError::Restore {
                            name: c.checkpoint.to_string(),
                            source: Box::new(e),
                        });
                    }
                };
                storage.mark_complete(&manifest.checkpoint)?;
                info!(checkpoint = %manifest.checkpoint, seconds = started.elapsed().as_secs_f64(), "restored state from checkpoint");
                let now = unix_ms();
                control
                    .history
                    .record_checkpoint(CheckpointRecord::completed(
                        Trigger::Restored,
                        manifest.created_at_ms,
                        now,
                        &manifest,
                        None,
                    ));
                (state, Some(manifest))
            }
        };
        // One instance may keep a checkpoint's key-group count after partitions were added;
        // several instances, an explicit setting, or the internal topic need exactly theirs.
        if let Some(m) = &manifest
            && (instances > 1 || config.state.max_parallelism.is_some() || internal.is_some())
            && m.state.max_parallelism != max_parallelism
        {
            return Err(JobError::MaxParallelism {
                what: format!("checkpoint {}", m.checkpoint),
                found: m.state.max_parallelism,
                expected: max_parallelism,
            });
        }
        metrics
            .restore_duration
            .observe(started.elapsed().as_secs_f64());
        metrics
            .restore_bytes
            .set(manifest.as_ref().map_or(0, |m| m.state.total_size() as i64));
        let event_time = EventTime {
            enabled: config.job.timestamp.is_some(),
            max_out_of_orderness: config.job.max_out_of_orderness,
            idle_timeout: config.job.idle_timeout,
        };
        let state = Driver::new(store, function, event_time)?;
        let (offsets, control_offsets) = start.positions(manifest.as_ref());
        let mut state = state;
        // The partitions that feed process_element make the watermark: in repartition
        // mode the internal ones (hop 1 only forwards).
        state.set_partitions(
            offsets
                .keys()
                .filter(|(t, _)| internal.is_none() || Some(t) == internal.as_ref())
                .cloned(),
        );
        source.assign(offsets.iter().chain(&control_offsets))?;
        let rules = config
            .kafka
            .control_topic
            .as_ref()
            .map(|_| Rules::new(state.store(), control.rules.clone()));
        if let Some(rules) = &rules {
            rules.refresh_view()?;
            metrics.rules_active.set(rules.active() as i64);
        }
        let next_checkpoint_id = storage
            .list()?
            .iter()
            .map(|i| i.checkpoint.id)
            .max()
            .unwrap_or(0)
            + 1;
        let decoder = Decoder::new(
            &config.job.key,
            config.job.max_record_bytes,
            config.job.max_key_bytes,
        )
        .with_timestamp(config.job.timestamp.as_deref())
        .with_max_skew(config.job.max_event_time_skew);
        info!(
            partitions = offsets.len(),
            control_partitions = control_offsets.len(),
            transactional_id = %config.transactional_id(),
            "assigned partitions"
        );
        let pipeline = Pipeline {
            config,
            metrics,
            decoder,
            sink,
            state,
            offsets,
            rules,
            control_offsets,
            repartition: internal,
        };
        Ok(Self {
            source,
            storage,
            run: CheckpointRef::new_run(),
            next_checkpoint_id,
            last_committed: manifest.map(|m| m.checkpoint),
            start,
            pipeline,
            requests: control.requests.take_receiver(),
            stopping: None,
            restored_from_savepoint,
            disk_full: false,
            control,
        })
    }

    /// Runs epochs until shutdown is requested; the last epoch ends with a checkpoint.
    pub fn run(mut self) -> Result<(), JobError> {
        self.begin()?;
        if self.restored_from_savepoint {
            // Recovery must never need the savepoint again: make its state a checkpoint
            // before any record. A failure here ends the run (a restart retries it).
            self.checkpoint(Trigger::AfterSavepointRestore)?;
            self.begin()?;
        }
        self.recover_abortable(|job| job.catch_up_control())?;
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
            if observed.elapsed() >= Duration::from_secs(1) {
                self.observe();
                observed = Instant::now();
            }
            if self.control.shutdown.load(Ordering::SeqCst) {
                return self.shut_down();
            }
            let now = Instant::now();
            if now >= due
                || self
                    .control
                    .checkpoint_requested
                    .swap(false, Ordering::SeqCst)
            {
                match self.recover_abortable(|job| job.checkpoint(Trigger::Periodic).map(drop)) {
                    Err(e) if is_disk_full(&e) => self.wait_for_space(e)?,
                    Err(e) => return Err(e),
                    Ok(()) if self.disk_full => {
                        self.disk_full = false;
                        self.control.ready.store(true, Ordering::SeqCst);
                        info!("disk space is back and a checkpoint committed: ready again");
                    }
                    Ok(()) => {}
                }
                self.begin()?;
                due = (now + interval).max(Instant::now() + min_pause);
                continue;
            }
            let wait = (due - now).min(Duration::from_millis(100));
            let handled = match self.source.consumer().poll(wait) {
                None => self.pipeline.fire_timers(),
                Some(Ok(msg)) => {
                    let started = Instant::now();
                    let handled = self
                        .pipeline
                        .handle(&msg)
                        .and_then(|()| self.pipeline.fire_timers());
                    self.pipeline
                        .metrics
                        .processing_duration
                        .observe(started.elapsed().as_secs_f64());
                    handled
                }
                Some(Err(e)) => {
                    warn!(error = %e, "consumer error (librdkafka retries by itself)");
                    Ok(())
                }
            };
            if let Err(e) = handled {
                match self.recover_abortable(|_| Err(e)) {
                    Err(e) if is_disk_full(&e) => self.wait_for_space(e)?,
                    other => other?,
                }
                self.begin()?;
            }
        }
    }

    /// Opens the next epoch's transaction, named after the checkpoint that will end it.
    fn begin(&mut self) -> Result<(), JobError> {
        let next = CheckpointRef::new(self.next_checkpoint_id, &self.run);
        Ok(self.pipeline.sink.begin(&next)?)
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

    /// Runs `step`; if the transaction must be aborted, aborts it and rewinds state and
    /// offsets to the last committed checkpoint, so the epoch is redone from scratch.
    ///
    /// Every other error ends the run, a timed-out transactional call too: its outcome is
    /// unknown here, and the restart settles it the one way that is tested end to end
    /// (`init_transactions` fences this producer and the coordinator finishes or aborts
    /// the transaction; the group's committed offsets then name the checkpoint to restore).
    fn recover_abortable(
        &mut self,
        step: impl FnOnce(&mut Self) -> Result<(), JobError>,
    ) -> Result<(), JobError> {
        match step(self) {
            Err(JobError::Sink(SinkError::Abortable(e))) => {
                warn!(error = %e, "aborting the epoch's transaction and rewinding to the last checkpoint");
                self.pipeline.sink.abort()?;
                self.pipeline
                    .metrics
                    .transactions
                    .with_label_values(&["aborted"])
                    .inc();
                // The aborted attempt may have published its checkpoint already; a name is
                // published once, so the redone epoch takes the next one.
                self.next_checkpoint_id += 1;
                self.rewind()
            }
            other => other,
        }
    }

    /// Local state or checkpoint storage ran out of space before the epoch committed: the
    /// epoch's transaction is aborted (nothing is committed past the last durable
    /// checkpoint), the instance reports not ready, and it retries the rewind to the last
    /// committed checkpoint with backoff until space returns; readiness comes back with the
    /// next committed checkpoint.
    fn wait_for_space(&mut self, cause: JobError) -> Result<(), JobError> {
        self.control.ready.store(false, Ordering::SeqCst);
        self.disk_full = true;
        error!(error = %cause, "disk full: aborting the epoch's transaction; not ready until space returns");
        self.pipeline
            .metrics
            .transactions
            .with_label_values(&["aborted"])
            .inc();
        self.pipeline.sink.abort()?;
        // A half-written attempt never lends its name to the next one.
        self.next_checkpoint_id += 1;
        let staging = self
            .pipeline
            .config
            .state
            .dir
            .join(format!("staging-{}", self.pipeline.config.job.instance));
        let _ = std::fs::remove_dir_all(staging);
        let mut backoff = Duration::from_millis(500);
        loop {
            let until = Instant::now() + backoff;
            while Instant::now() < until {
                self.control.alive.store(true, Ordering::Relaxed);
                if self.control.shutdown.load(Ordering::SeqCst) {
                    return Err(cause);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            match self.rewind() {
                Ok(()) => return Ok(()),
                Err(e) if is_disk_full(&e) => {
                    warn!(error = %e, retry_in = ?backoff, "disk still full; cannot rewind yet")
                }
                Err(e) => return Err(e),
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    fn rewind(&mut self) -> Result<(), JobError> {
        let p = &mut self.pipeline;
        let manifest = match &self.last_committed {
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
        (p.offsets, p.control_offsets) = self.start.positions(manifest.as_ref());
        self.source
            .assign(p.offsets.iter().chain(&p.control_offsets))?;
        if let Some(rules) = &p.rules {
            rules.refresh_view()?;
            p.metrics.rules_active.set(rules.active() as i64);
        }
        info!(checkpoint = ?self.last_committed.as_ref().map(ToString::to_string), "rewound to the last committed checkpoint");
        Ok(())
    }

    /// A checkpoint, recorded in the history and the metrics whatever its outcome;
    /// returns the committed manifest.
    fn checkpoint(&mut self, trigger: Trigger) -> Result<Manifest, JobError> {
        let (start_ms, name) = (
            unix_ms(),
            CheckpointRef::new(self.next_checkpoint_id, &self.run),
        );
        let result = self.take_checkpoint();
        let end_ms = unix_ms();
        let record = match &result {
            Ok((manifest, written, _)) => {
                CheckpointRecord::completed(trigger, start_ms, end_ms, manifest, Some(*written))
            }
            Err(e) => {
                self.pipeline.metrics.checkpoints_failed.inc();
                warn!(checkpoint = %name, ?trigger, error = %e, "checkpoint failed");
                CheckpointRecord::failed(
                    name.id,
                    name.to_string(),
                    trigger,
                    start_ms,
                    end_ms,
                    e.to_string(),
                )
            }
        };
        if let Ok((_, _, phases)) = &result {
            info!(
                checkpoint = %record.name,
                ?trigger,
                bytes = record.size_bytes,
                bytes_written = record.incremental_size_bytes,
                ms = record.duration_ms,
                snapshot_ms = phases.snapshot.as_millis() as u64,
                upload_ms = phases.upload.as_millis() as u64,
                commit_ms = phases.commit.as_millis() as u64,
                "checkpoint completed"
            );
        }
        self.control.history.record_checkpoint(record);
        result.map(|(manifest, _, _)| manifest)
    }

    /// Steps 2–4 of the protocol: durable snapshot, offsets into the transaction, commit,
    /// then mark complete and prune.
    fn take_checkpoint(
        &mut self,
    ) -> Result<(Manifest, crate::checkpoint::WriteStats, Phases), JobError> {
        crash_point!("before-snapshot");
        let started = Instant::now();
        let checkpoint = CheckpointRef::new(self.next_checkpoint_id, &self.run);
        let p = &mut self.pipeline;
        let staging = p
            .config
            .state
            .dir
            .join(format!("staging-{}", p.config.job.instance));
        remove_dir(&staging)?;
        let state = p.state.snapshot(checkpoint.id, &staging)?;
        let snapshotted = Instant::now();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            checkpoint: checkpoint.clone(),
            app_id: p.config.kafka.app_id.clone(),
            instance: p.config.job.instance,
            created_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            offsets: partition_offsets(&p.offsets),
            control_offsets: partition_offsets(&p.control_offsets),
            state,
        };
        let written = self.storage.write(&manifest, &staging)?;
        remove_dir(&staging)?;
        let uploaded = Instant::now();
        crash_point!("after-snapshot");
        let group = self
            .source
            .group_metadata()
            .ok_or(JobError::NoGroupMetadata)?;
        let tpl = offsets_for_commit(&p.offsets, &checkpoint).map_err(SinkError::Kafka)?;
        p.sink.send_offsets(&tpl, &group)?;
        crash_point!("before-commit");
        if let Err(e) = p.sink.commit() {
            p.metrics.transactions.with_label_values(&["failed"]).inc();
            return Err(e.into());
        }
        p.metrics
            .transactions
            .with_label_values(&["committed"])
            .inc();
        let phases = Phases {
            snapshot: snapshotted - started,
            upload: uploaded - snapshotted,
            commit: uploaded.elapsed(),
        };
        for (phase, took) in [
            ("snapshot", phases.snapshot),
            ("upload", phases.upload),
            ("commit", phases.commit),
        ] {
            p.metrics
                .checkpoint_phase_duration
                .with_label_values(&[phase])
                .observe(took.as_secs_f64());
        }
        self.last_committed = Some(checkpoint.clone());
        crash_point!("after-commit");
        // After the commit the checkpoint is the state whatever happens here; a full disk
        // only delays marking and pruning (restore marks the committed one complete).
        match self.storage.mark_complete(&checkpoint).and_then(|()| {
            self.storage
                .prune(p.config.checkpoint.retained, &checkpoint)
        }) {
            Err(e) if is_disk_full(&e) => {
                warn!(checkpoint = %checkpoint, error = %e, "disk full: checkpoint committed but not marked complete or pruned")
            }
            other => other?,
        }
        self.next_checkpoint_id = checkpoint.id + 1;
        let secs = started.elapsed().as_secs_f64();
        p.metrics.checkpoints_completed.inc();
        p.metrics.checkpoint_duration.observe(secs);
        p.metrics
            .last_checkpoint_incremental_bytes
            .set(written.bytes_written as i64);
        p.metrics
            .last_checkpoint_bytes
            .set(written.bytes_total as i64);
        p.metrics.last_checkpoint_completed_timestamp.set(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        );
        for ((t, part), o) in &p.offsets {
            p.metrics
                .partition_offset
                .with_label_values(&[t, &part.to_string()])
                .set(*o);
        }
        Ok((manifest, written, phases))
    }
}

/// Where one checkpoint's time went (the processing pause, since checkpoints are taken
/// on the job thread): local snapshot, upload to checkpoint storage, Kafka commit.
struct Phases {
    snapshot: Duration,
    upload: Duration,
    commit: Duration,
}

impl Pipeline {
    fn handle(&mut self, msg: &BorrowedMessage<'_>) -> Result<(), JobError> {
        let (topic, partition, offset) = (msg.topic(), msg.partition(), msg.offset());
        if self.config.kafka.control_topic.as_deref() == Some(topic) {
            self.handle_control(msg)?;
            self.control_offsets
                .insert((topic.to_string(), partition), offset + 1);
            return Ok(());
        }
        let partition_label = partition.to_string();
        self.metrics
            .records_consumed
            .with_label_values(&[topic, &partition_label])
            .inc();
        if self.config.job.function == FunctionKind::Passthrough {
            self.pass_through(msg)?;
            self.offsets
                .insert((topic.to_string(), partition), offset + 1);
            return Ok(());
        }
        let read_from = (topic.to_string(), partition);
        let hop2 = self.repartition.as_deref() == Some(topic);
        // A forwarded record names its original input, so functions and dead letters see
        // where it was first written, not the internal topic.
        let source = hop2
            .then(|| repartition::origin(msg.headers()))
            .flatten()
            .unwrap_or_else(|| SourceRef {
                topic: topic.to_string(),
                partition,
                offset,
            });
        match self.decoder.decode(msg.payload()) {
            Ok(event) if self.repartition.is_some() && !hop2 => {
                self.forward(msg, &event.key, &source)?;
            }
            Ok(event) => {
                let (records, rejection) = self.state.element_from(
                    &read_from,
                    &event.key,
                    &event.value,
                    event.timestamp_ms,
                    &source,
                )?;
                self.send(records)?;
                if let Some(r) = rejection {
                    self.dead_letter(msg, &source, r.reason, &r.message)?;
                    self.metrics
                        .records_dead_lettered
                        .with_label_values(&[topic, &partition_label, r.reason])
                        .inc();
                }
            }
            Err(err) => {
                self.dead_letter(msg, &source, err.reason(), &err.to_string())?;
                self.metrics
                    .records_dead_lettered
                    .with_label_values(&[topic, &partition_label, err.reason()])
                    .inc();
            }
        }
        self.offsets
            .insert((topic.to_string(), partition), offset + 1);
        crash_point!("mid-batch");
        Ok(())
    }

    /// A control record: the runtime checks the version, the function accepts or refuses
    /// the update, and only an accepted one is put in force.
    fn handle_control(&mut self, msg: &BorrowedMessage<'_>) -> Result<(), JobError> {
        let Some(rules) = &self.rules else {
            return Ok(());
        };
        let (partition, offset) = (msg.partition(), msg.offset());
        let from = SourceRef {
            topic: msg.topic().to_string(),
            partition,
            offset,
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let outcome = match rules.prepare(msg.key(), msg.payload(), partition, offset, now_ms)? {
            Err(outcome) => outcome,
            Ok(candidate) => {
                let update = BroadcastUpdate {
                    id: &candidate.id,
                    version: candidate.version(),
                    body: candidate.body.as_ref(),
                    source: &from,
                };
                let (records, refused) = self.state.broadcast(&update)?;
                match refused {
                    Some(r) => {
                        let version = candidate.version();
                        RuleOutcome::Refused {
                            id: candidate.id,
                            version,
                            reason: r.reason,
                            message: r.message,
                        }
                    }
                    None => {
                        self.send(records)?;
                        rules.commit(candidate)?
                    }
                }
            }
        };
        let label = match &outcome {
            RuleOutcome::Applied { id, version } => {
                info!(rule = %id, version, "rule applied");
                "applied"
            }
            RuleOutcome::Deleted { id } => {
                info!(rule = %id, "rule deleted");
                "deleted"
            }
            RuleOutcome::Ignored {
                id,
                version,
                applied,
            } => {
                info!(rule = %id, version, applied, "rule update ignored: not newer than the applied version");
                "ignored"
            }
            RuleOutcome::Rejected(why) => {
                warn!(partition, offset, reason = why.reason(), error = %why, "rule rejected; the last good version stays");
                self.dead_letter(msg, &from, why.reason(), &why.to_string())?;
                "rejected"
            }
            RuleOutcome::Refused {
                id,
                version,
                reason,
                message,
            } => {
                warn!(rule = %id, version, reason, error = %message, "rule rejected; the last good version stays");
                self.dead_letter(msg, &from, reason, message)?;
                "rejected"
            }
        };
        self.metrics.rule_updates.with_label_values(&[label]).inc();
        self.metrics.rules_active.set(rules.active() as i64);
        Ok(())
    }

    /// Hop 1 of repartition mode: the original bytes, headers and timestamp go to the
    /// internal partition of the key's key group, in the epoch's transaction.
    fn forward(
        &self,
        msg: &BorrowedMessage<'_>,
        key: &str,
        source: &SourceRef,
    ) -> Result<(), JobError> {
        let Some(internal) = &self.repartition else {
            return Ok(());
        };
        let key_group =
            streamstate_state::key_group_for(key.as_bytes(), self.state.store().max_parallelism());
        self.sink.send_to_partition(
            internal,
            key_group as i32,
            key.as_bytes(),
            msg.payload().unwrap_or_default(),
            repartition::forward_headers(msg.headers(), source),
            msg.timestamp().to_millis(),
        )?;
        self.metrics
            .records_produced
            .with_label_values(&[internal])
            .inc();
        Ok(())
    }

    /// Timers that came due (processing time now, event time up to the watermark).
    fn fire_timers(&mut self) -> Result<(), JobError> {
        let records = self.state.fire_timers()?;
        self.send(records)
    }

    fn send(&self, records: Vec<OutputRecord>) -> Result<(), JobError> {
        for r in records {
            let topic = r
                .topic
                .as_deref()
                .unwrap_or(&self.config.kafka.output_topic);
            self.sink.send(topic, r.key.as_deref(), &r.value, None)?;
            self.metrics
                .records_produced
                .with_label_values(&[topic])
                .inc();
        }
        Ok(())
    }

    /// `[job] function = "passthrough"`: the record's key and value, unchanged, to the
    /// output topic in the current transaction (see [`crate::functions::passthrough`]).
    fn pass_through(&self, msg: &BorrowedMessage<'_>) -> Result<(), JobError> {
        let topic = &self.config.kafka.output_topic;
        self.sink
            .send(topic, msg.key(), msg.payload().unwrap_or_default(), None)?;
        self.metrics
            .records_produced
            .with_label_values(&[topic])
            .inc();
        Ok(())
    }

    /// The original bytes go to the dead-letter topic unchanged, with why and where from
    /// in headers, inside the current transaction: exactly once, like any output.
    /// `source` is where the record was first written (for a forwarded one, not the
    /// internal topic).
    fn dead_letter(
        &self,
        msg: &BorrowedMessage<'_>,
        source: &SourceRef,
        reason: &str,
        detail: &str,
    ) -> Result<(), JobError> {
        let (partition, offset) = (source.partition.to_string(), source.offset.to_string());
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "streamstate.error.reason",
                value: Some(reason),
            })
            .insert(Header {
                key: "streamstate.error.message",
                value: Some(detail),
            })
            .insert(Header {
                key: "streamstate.source.topic",
                value: Some(source.topic.as_str()),
            })
            .insert(Header {
                key: "streamstate.source.partition",
                value: Some(partition.as_str()),
            })
            .insert(Header {
                key: "streamstate.source.offset",
                value: Some(offset.as_str()),
            });
        // An over-size record is cut to the limit so the dead-letter write itself cannot
        // fail; the whole record stays in the input topic at the offset in the headers.
        let payload = msg.payload().unwrap_or_default();
        let size = payload.len().to_string();
        let headers = headers.insert(Header {
            key: "streamstate.source.size",
            value: Some(size.as_str()),
        });
        let payload = &payload[..payload.len().min(self.config.dead_letter_max_bytes())];
        self.sink.send(
            &self.config.kafka.dead_letter_topic,
            msg.key(),
            payload,
            Some(headers),
        )?;
        Ok(())
    }
}

/// Reads `checkpoint`'s manifest and restores it into a new store sized by it.
fn read_and_restore(
    config: &Config,
    storage: &dyn CheckpointStorage,
    checkpoint: &CheckpointRef,
) -> Result<(StateStore, Manifest), JobError> {
    let manifest = storage.read_manifest(checkpoint)?;
    let store = fresh_store(config, manifest.state.max_parallelism)?;
    restore_into(config, storage, &manifest, |from| {
        Ok(store.restore(&[from])?)
    })?;
    Ok((store, manifest))
}

/// Empty state with `max_parallelism` key groups (this instance's range of them), in
/// this instance's state directory.
fn fresh_store(config: &Config, max_parallelism: u32) -> Result<StateStore, JobError> {
    let work_dir = config
        .state
        .dir
        .join(format!("instance-{}", config.job.instance));
    let store_config = StoreConfig::new(config.state.backend, work_dir, max_parallelism)
        .for_instance(config.job.instance, config.job.instances);
    Ok(StateStore::open(store_config)?)
}

/// Restores this instance's share of a savepoint set: keyed state of its key-group
/// range from every part (the state layer filters, and redistributes operator state),
/// input offsets of its partitions, the lowest control offsets of any part.
fn restore_set(
    config: &Config,
    set: &rescale::SavepointSet,
    parts: &[crate::source::Partition],
    max_parallelism: u32,
) -> Result<(StateStore, Manifest), JobError> {
    let store = fresh_store(config, max_parallelism)?;
    let mut fetched = Vec::new();
    let mut template = None;
    for (old, manifest) in rescale::manifests(config, set)? {
        let dir = config
            .state
            .dir
            .join(format!("restore-{}-from-{old}", config.job.instance));
        remove_dir(&dir)?;
        rescale::part_storage(config, old)?.fetch(&manifest, &dir)?;
        fetched.push((dir, manifest.state.clone()));
        template.get_or_insert(manifest);
    }
    store.restore(&fetched)?;
    for (dir, _) in &fetched {
        remove_dir(dir)?;
    }
    let template = template
        .ok_or_else(|| JobError::Rescale(rescale::RescaleError::Missing(set.name.clone())))?;
    let offsets = set
        .offsets()
        .into_iter()
        .filter(|o| parts.contains(&(o.topic.clone(), o.partition)))
        .collect();
    info!(
        set = %set.name,
        from_instances = set.instances,
        key_groups = %store.key_group_range(),
        "restored this instance's share of the savepoint set"
    );
    Ok((
        store,
        Manifest {
            offsets,
            control_offsets: set.control_offsets(),
            ..template
        },
    ))
}

/// Fetches the files and loads them; the state layer checks every checksum before it
/// replaces live state, so a broken checkpoint is named and never half-restored.
fn restore_into(
    config: &Config,
    storage: &dyn CheckpointStorage,
    manifest: &Manifest,
    load: impl FnOnce((PathBuf, SnapshotResult)) -> Result<(), JobError>,
) -> Result<(), JobError> {
    let started = Instant::now();
    let fetched = config
        .state
        .dir
        .join(format!("restore-{}", config.job.instance));
    storage.fetch(manifest, &fetched)?;
    crash_point!("during-restore");
    load((fetched.clone(), manifest.state.clone()))
        .map_err(|e| name_stored_file(e, &fetched, manifest, storage))?;
    remove_dir(&fetched)?;
    info!(
        checkpoint = %manifest.checkpoint,
        storage = %storage.describe(),
        files = manifest.state.files.len(),
        bytes = manifest.state.total_size(),
        seconds = started.elapsed().as_secs_f64(),
        "restore loaded checkpoint files"
    );
    Ok(())
}

/// A damaged file found while loading names the local copy; say where it is stored too
/// (`shared/<sha256>` for RocksDB SSTs), which is what an operator must repair.
fn name_stored_file(
    e: JobError,
    fetched: &std::path::Path,
    manifest: &Manifest,
    storage: &dyn CheckpointStorage,
) -> JobError {
    let corrupt = match &e {
        JobError::State(streamstate_state::StateError::Corrupt { path, reason })
        | JobError::Function(FunctionError::State(streamstate_state::StateError::Corrupt {
            path,
            reason,
        })) => Some((path, reason)),
        _ => None,
    };
    let Some((path, reason)) = corrupt else {
        return e;
    };
    let Some(file) = path.strip_prefix(fetched).ok().and_then(|rel| {
        manifest
            .state
            .files
            .iter()
            .find(|f| std::path::Path::new(&f.path) == rel)
    }) else {
        return e;
    };
    let stored = if crate::checkpoint::is_shared(&file.path) {
        format!("{}/shared/{}", storage.describe(), file.sha256)
    } else {
        format!(
            "{}/{}/{}",
            storage.describe(),
            manifest.checkpoint,
            file.path
        )
    };
    JobError::CorruptFile {
        file: file.path.clone(),
        stored,
        reason: reason.clone(),
    }
}

/// The operator's explicit fallback: the newest intact completed checkpoint older than
/// `broken`. Logged loudly, because this run reprocesses records: at-least-once.
fn restore_older(
    config: &Config,
    storage: &dyn CheckpointStorage,
    broken: &CheckpointRef,
) -> Result<(StateStore, Manifest), JobError> {
    let mut older: Vec<CheckpointRef> = storage
        .list()?
        .into_iter()
        .filter(|i| i.completed && i.checkpoint.id < broken.id)
        .map(|i| i.checkpoint)
        .collect();
    older.sort();
    while let Some(candidate) = older.pop() {
        match read_and_restore(config, storage, &candidate) {
            Ok((state, manifest)) => {
                error!(
                    restored = %candidate,
                    instead_of = %broken,
                    "--allow-older-checkpoint: restored an OLDER checkpoint; records after its offsets are \
                     processed again, so this run is AT-LEAST-ONCE"
                );
                return Ok((state, manifest));
            }
            Err(e) => {
                warn!(checkpoint = %candidate, error = %e, "older checkpoint cannot be restored either")
            }
        }
    }
    Err(JobError::Restore {
        name: broken.to_string(),
        source: Box::new(JobError::Checkpoint(CheckpointError::Missing {
            name: "any older intact checkpoint".into(),
            path: PathBuf::from(storage.describe()),
        })),
    })
}

/// Where each partition starts when no checkpoint says otherwise, fixed at process start
/// so a rewind before the first commit goes back to the same place.
struct Start {
    input: Offsets,
    control: Offsets,
}

impl Start {
    /// Input and control positions: the checkpoint's, plus partitions added since it was
    /// taken at their start position.
    fn positions(&self, manifest: Option<&Manifest>) -> (Offsets, Offsets) {
        let merge = |from: Option<&Vec<PartitionOffset>>, start: &Offsets| {
            let mut offsets = from.map(|o| manifest_offsets(o)).unwrap_or_default();
            for (p, o) in start {
                offsets.entry(p.clone()).or_insert(*o);
            }
            // A control topic dropped from the config since the checkpoint is not read.
            offsets.retain(|p, _| start.contains_key(p));
            offsets
        };
        (
            merge(manifest.map(|m| &m.offsets), &self.input),
            merge(manifest.map(|m| &m.control_offsets), &self.control),
        )
    }
}

fn partition_offsets(offsets: &Offsets) -> Vec<PartitionOffset> {
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

fn remove_dir(path: &std::path::Path) -> Result<(), JobError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(JobError::StateDir {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn manifest_offsets(offsets: &[PartitionOffset]) -> Offsets {
    offsets
        .iter()
        .map(|o| ((o.topic.clone(), o.partition), o.offset))
        .collect()
}
