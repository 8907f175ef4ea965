//! Start-up: connect, fence every producer an earlier run may have used, find the
//! committed checkpoint and restore it (or a savepoint, or a savepoint set's share).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::counters::RecordCounters;
use super::pipeline::Pipeline;
use super::{Control, Job, JobError, StartOptions, manifest_offsets, remove_dir, serve, unix_ms};
use crate::checkpoint::{
    CheckpointError, CheckpointRef, CheckpointStorage, Manifest, open_storage,
};
use crate::commit::{Epochs, Housekeeping};
use crate::config::{Config, FunctionKind, MAX_PRODUCER_POOL_SIZE, StartOffsets};
use crate::control::Rules;
use crate::decode::Decoder;
use crate::driver::{Driver, EventTime};
use crate::function::{FunctionError, ProcessFunction};
use crate::functions::Count;
use crate::history::{CheckpointRecord, Trigger};
use crate::metrics::Metrics;
use crate::sink::Sink;
use crate::source::offset_state::{self, Positions};
use crate::source::{Offsets, Source, SourceError};
use crate::{cluster, repartition, rescale};
use streamstate_state::{KeyGroups, SnapshotResult, StateStore, StoreConfig};

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
        // A rescaled start adopts the set's numbering of keys into key groups; any other
        // start numbers them for its input (a restored checkpoint's is checked below).
        let set = options
            .from_savepoint_set
            .as_ref()
            .map(|name| rescale::read(&config, name).map(|set| (name, set)))
            .transpose()?;
        if let Some((name, set)) = &set
            && set.max_parallelism != max_parallelism
        {
            return Err(JobError::MaxParallelism {
                what: format!("savepoint set {name}"),
                found: set.max_parallelism,
                expected: max_parallelism,
            });
        }
        let key_groups = match &set {
            Some((_, set)) => set.key_groups()?,
            None => cluster::key_groups_for_input(&all_parts, max_parallelism, internal.is_some()),
        };
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
            None => cluster::ownership(&all_parts, key_groups, instances, instance)?,
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
        let sink = Sink::new(
            &config,
            control.transactions.clone(),
            source.group_metadata(),
        )?;
        let storage: Arc<dyn CheckpointStorage> = Arc::from(open_storage(&config)?);
        fence_earlier_pools(&config, storage.as_ref())?;
        remove_staging(&config)?;
        // A rescaled start: the set's offsets are committed for these partitions (each by
        // the old instance that owned it) until this instance commits its first checkpoint.
        let from_set = match set {
            Some((name, set)) => {
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
            (_, Some(set)) => Some(restore_set(&config, &set, key_groups)?),
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
                (fresh_store(&config, key_groups)?, None)
            }
            (None, Some(c)) => {
                let restored = read_and_restore(&config, storage.as_ref(), &c.checkpoint).and_then(
                    |(state, m)| {
                        if offset_state::restored(&state, &m)?.input != c.offsets {
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
                        None,
                    ));
                (state, Some(manifest))
            }
        };
        // One instance may keep a checkpoint's key-group count after partitions were added;
        // several instances, an explicit setting, or the internal topic need exactly theirs.
        if let Some(m) = &manifest
            && (instances > 1 || config.state.max_parallelism.is_some() || internal.is_some())
            && m.state.identity.max_parallelism != max_parallelism
        {
            return Err(JobError::MaxParallelism {
                what: format!("checkpoint {}", m.checkpoint),
                found: m.state.identity.max_parallelism,
                expected: max_parallelism,
            });
        }
        // Several instances own partitions by the numbering computed above; one instance
        // owns every key group and keeps the numbering of the state it restored.
        if let Some(m) = &manifest
            && store.key_groups() != key_groups
        {
            if instances > 1 {
                return Err(JobError::KeyGroups {
                    what: format!("checkpoint {}", m.checkpoint),
                    found: store.key_groups(),
                    expected: key_groups,
                });
            }
            info!(checkpoint = %m.checkpoint, key_groups = %store.key_groups(), "keeping the restored state's numbering of key groups");
        }
        if let Ok(mut published) = control.key_groups.lock() {
            *published = Some((store.key_group_range(), store.key_groups()));
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
        let restored = match &manifest {
            Some(m) => {
                if m.format_version < offset_state::SINCE_FORMAT {
                    info!(checkpoint = %m.checkpoint, format = m.format_version, "the checkpoint predates offsets in operator state: resuming at its manifest's offsets");
                }
                Some(offset_state::restored(&store, m)?)
            }
            None => None,
        };
        let state = Driver::new(store, function, event_time)?;
        let (offsets, control_offsets) = start.positions(restored.as_ref());
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
        let format_metrics = crate::format::FormatMetrics::new(metrics.registry())
            .map_err(|e| JobError::OutputFormat(format!("format metrics: {e}")))?;
        let formats = crate::format::Formats::from_config(&config, &format_metrics)?;
        let decoder = Decoder::new(
            &config.job.key,
            config.job.max_record_bytes,
            config.job.max_key_bytes,
        )
        .with_timestamp(config.job.timestamp.as_deref())
        .with_max_skew(config.job.max_event_time_skew)
        .with_reader(formats.reader);
        info!(
            partitions = offsets.len(),
            control_partitions = control_offsets.len(),
            state_backend = %config.state.backend,
            transactional_ids = %format!("{}-0..{}", config.legacy_transactional_id(), config.checkpoint.producer_pool_size - 1),
            "assigned partitions"
        );
        let epochs = Epochs::new(
            sink.slots().to_vec(),
            storage.clone(),
            Housekeeping {
                retained: config.checkpoint.retained,
            },
            manifest.as_ref().map(|m| m.checkpoint.clone()),
        );
        let pipeline = Pipeline {
            config,
            counters: RecordCounters::new(metrics.clone()),
            metrics,
            decoder,
            encoder: formats.encoder,
            sink,
            state,
            offsets,
            rules,
            control_offsets,
            repartition: internal,
            handled: 0,
        };
        Ok(Self {
            source,
            storage,
            epochs,
            run: CheckpointRef::new_run(),
            next_checkpoint_id,
            unchanged_since: None,
            pending: std::collections::VecDeque::new(),
            start,
            pipeline,
            requests: control.requests.take_receiver(),
            stopping: None,
            restored_from_savepoint,
            disk_full: false,
            control,
        })
    }
}

/// Reads `checkpoint`'s manifest and restores it into a new store sized by it.
fn read_and_restore(
    config: &Config,
    storage: &dyn CheckpointStorage,
    checkpoint: &CheckpointRef,
) -> Result<(StateStore, Manifest), JobError> {
    let manifest = storage.read_manifest(checkpoint)?;
    let store = fresh_store(config, manifest.state.identity.key_groups()?)?;
    restore_into(config, storage, &manifest, |from| {
        Ok(store.restore(&[from])?)
    })?;
    Ok((store, manifest))
}

/// Empty state numbered by `key_groups` (this instance's range of them), in this
/// instance's state directory.
pub(super) fn fresh_store(config: &Config, key_groups: KeyGroups) -> Result<StateStore, JobError> {
    let work_dir = config
        .state
        .dir
        .join(format!("instance-{}", config.job.instance));
    let store_config =
        StoreConfig::new(config.state.backend, work_dir, key_groups.max_parallelism())
            .with_key_groups(key_groups)
            .for_instance(config.job.instance, config.job.instances)
            .with_cache_bytes(config.state.effective_cache_bytes());
    Ok(StateStore::open(store_config)?)
}

/// Restores this instance's share of a savepoint set: keyed state of its key-group
/// range from every part (the state layer filters, and redistributes operator state,
/// the source offsets among it). The manifest returned stands for the whole set: the
/// oldest format of its parts, and every part's offsets (for parts of format 1, which
/// have them nowhere else).
fn restore_set(
    config: &Config,
    set: &rescale::SavepointSet,
    key_groups: KeyGroups,
) -> Result<(StateStore, Manifest), JobError> {
    let store = fresh_store(config, key_groups)?;
    let mut fetched = Vec::new();
    let mut template: Option<Manifest> = None;
    let (mut offsets, mut control_offsets) = (Vec::new(), Vec::new());
    for (old, manifest) in rescale::manifests(config, set)? {
        let dir = config
            .state
            .dir
            .join(format!("restore-{}-from-{old}", config.job.instance));
        remove_dir(&dir)?;
        rescale::part_storage(config, old)?.fetch(&manifest, &dir)?;
        fetched.push((dir, manifest.state.clone()));
        offsets.extend(manifest.offsets.iter().cloned());
        control_offsets.extend(manifest.control_offsets.iter().cloned());
        match &mut template {
            Some(t) => t.format_version = t.format_version.min(manifest.format_version),
            None => template = Some(manifest),
        }
    }
    store.restore(&fetched)?;
    for (dir, _) in &fetched {
        remove_dir(dir)?;
    }
    let template = template
        .ok_or_else(|| JobError::Rescale(rescale::RescaleError::Missing(set.name.clone())))?;
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
            control_offsets,
            ..template
        },
    ))
}

/// Fetches the files and loads them; the state layer checks every checksum before it
/// replaces live state, so a broken checkpoint is named and never half-restored.
pub(super) fn restore_into(
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
pub(super) struct Start {
    input: Offsets,
    control: Offsets,
}

impl Start {
    /// Input and control positions: the restored checkpoint's for the partitions this
    /// instance owns (after a rescale it received every old instance's), plus partitions
    /// added since it was taken at their start position.
    pub(super) fn positions(&self, restored: Option<&Positions>) -> (Offsets, Offsets) {
        let merge = |from: Option<&Offsets>, start: &Offsets| {
            let mut offsets = from.cloned().unwrap_or_default();
            for (p, o) in start {
                offsets.entry(p.clone()).or_insert(*o);
            }
            // Partitions of other instances, and a control topic dropped from the config
            // since the checkpoint, are not read.
            offsets.retain(|p, _| start.contains_key(p));
            offsets
        };
        (
            merge(restored.map(|r| &r.input), &self.input),
            merge(restored.map(|r| &r.control), &self.control),
        )
    }
}

/// Fences the transactional ids outside this run's pool that an earlier run may have left
/// a transaction open on: a larger pool (every checkpoint records its run's pool size), or
/// the single id of the versions before pools. With no checkpoint to tell (a first start,
/// or runs that never uploaded one), every id a pool can have. Done before the committed
/// offsets are read, so no older producer can commit after that.
fn fence_earlier_pools(config: &Config, storage: &dyn CheckpointStorage) -> Result<(), JobError> {
    let pool = config.checkpoint.producer_pool_size;
    let mut recorded = Vec::new();
    for info in storage.list()? {
        // A manifest that cannot be read is named by the restore, if it matters.
        if let Ok(m) = storage.read_manifest(&info.checkpoint) {
            recorded.push(m.producer_pool_size);
        }
    }
    let legacy = recorded.is_empty() || recorded.iter().any(Option::is_none);
    let up_to = if recorded.is_empty() {
        MAX_PRODUCER_POOL_SIZE
    } else {
        recorded.iter().flatten().copied().fold(pool, u32::max)
    };
    let mut ids: Vec<String> = (pool..up_to)
        .map(|slot| config.transactional_id(slot))
        .collect();
    if legacy {
        ids.push(config.legacy_transactional_id());
    }
    if !ids.is_empty() {
        info!(ids = ?ids, "fencing transactional ids of earlier runs");
    }
    Sink::fence_other_ids(config, ids)?;
    Ok(())
}

/// Local snapshots a killed run left behind (each epoch in flight has its own).
pub(super) fn remove_staging(config: &Config) -> Result<(), JobError> {
    let prefix = format!("staging-{}", config.job.instance);
    let Ok(entries) = std::fs::read_dir(&config.state.dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == prefix || name.starts_with(&format!("{prefix}-")) {
            remove_dir(&entry.path())?;
        }
    }
    Ok(())
}
