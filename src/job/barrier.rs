//! The checkpoint barrier on the job thread, and what a resolved checkpoint records.
//!
//! At the barrier the loop takes only the synchronous part of a checkpoint: the function's
//! snapshot hook and the store's local snapshot (for RocksDB a memtable switch; its flush,
//! the hard links and the hashes of new SST files are left to the committer), with the
//! source offsets written into it as operator state first.
//! [`crate::commit`] uploads and commits it in the background. What the job thread paused
//! for is `streamstate_checkpoint_pause_seconds`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{Job, JobError, partition_offsets, remove_dir, unix_ms};
use crate::checkpoint::{FORMAT_VERSION, Manifest};
use crate::commit::{Committed, Sealed};
use crate::history::{CheckpointRecord, Phases, Trigger};
use crate::source::offset_state;

/// A sealed epoch waiting for its outcome, for its history record.
pub(super) struct Pending {
    id: u64,
    name: String,
    trigger: Trigger,
    started_ms: u64,
    pause: Duration,
    /// The state snapshot's part of the pause (the rest is the wait for the previous
    /// epoch's producer, when the seal has to: [`crate::commit::Handover`]).
    snapshot: Duration,
}

impl Job {
    /// Seals the open epoch at a barrier; `false` when a periodic barrier found nothing
    /// changed since the last one (no record, no control record, no timer), so there is
    /// nothing to upload or commit and the open epoch goes on.
    pub(super) fn barrier(&mut self, trigger: Trigger) -> Result<bool, JobError> {
        let mark = self.change_mark();
        let p = &mut self.pipeline;
        if trigger == Trigger::Periodic && !self.disk_full && self.unchanged_since == Some(mark) {
            p.metrics.checkpoints_skipped.inc();
            if self.epochs.in_flight() == 0 {
                // Everything is committed: the state is as durable as a new checkpoint
                // would make it, which is what "time since the last checkpoint" tells.
                p.metrics.last_checkpoint_skipped_timestamp.set(unix_s());
            }
            if let Some((open, _)) = self.epochs.open() {
                // Its transaction holds no record, so it has not started on the broker.
                self.control.transactions.renewed(open);
            }
            return Ok(false);
        }
        crash_point!("before-snapshot");
        let (started, started_ms) = (Instant::now(), unix_ms());
        let checkpoint = self
            .epochs
            .open()
            .map(|(c, _)| c.clone())
            .ok_or(JobError::Epoch(crate::commit::EpochError::CommitterGone))?;
        let staging = p.config.state.dir.join(format!(
            "staging-{}-{}",
            p.config.job.instance, checkpoint.id
        ));
        remove_dir(&staging)?;
        let (offsets, control_offsets) = (
            partition_offsets(&p.offsets),
            partition_offsets(&p.control_offsets),
        );
        offset_state::snapshot(p.state.store(), &offsets, &control_offsets)?;
        let (state, rest) = p.state.snapshot_deferred(checkpoint.id, &staging)?;
        let snapshot = started.elapsed();
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            checkpoint: checkpoint.clone(),
            app_id: p.config.kafka.app_id.clone(),
            instance: p.config.job.instance,
            created_at_ms: unix_ms(),
            offsets,
            control_offsets,
            producer_pool_size: Some(p.config.checkpoint.producer_pool_size),
            state,
        };
        // Records held behind the previous epoch's producer join their own transaction.
        p.sink.release()?;
        self.epochs.seal(Sealed {
            manifest,
            staging,
            rest,
            offsets: p.offsets.clone(),
            barrier_at: started,
        })?;
        let pause = started.elapsed();
        p.metrics.checkpoint_pause.observe(pause.as_secs_f64());
        // The pause is the state snapshot plus, rarely, the wait for the previous epoch's
        // producer in `release` (phase "flush").
        for (phase, took) in [
            ("snapshot", snapshot),
            ("flush", pause.saturating_sub(snapshot)),
        ] {
            p.metrics
                .checkpoint_phase_duration
                .with_label_values(&[phase])
                .observe(took.as_secs_f64());
        }
        self.pending.push_back(Pending {
            id: checkpoint.id,
            name: checkpoint.to_string(),
            trigger,
            started_ms,
            pause,
            snapshot,
        });
        self.unchanged_since = Some(mark);
        self.observe_in_flight();
        Ok(true)
    }

    /// A checkpoint that has committed when this returns (admin requests, savepoints, the
    /// final one): the barrier, then every epoch in flight drained. No epoch is open
    /// afterwards; the caller begins the next one.
    pub(super) fn checkpoint_and_wait(&mut self, trigger: Trigger) -> Result<Manifest, JobError> {
        self.barrier(trigger)?;
        self.epochs.drain()?;
        self.record_completed()
            .ok_or(JobError::Epoch(crate::commit::EpochError::CommitterGone))
    }

    /// Takes in what the committer finished since the last turn.
    pub(super) fn poll_commits(&mut self) -> Result<(), JobError> {
        let polled = self.epochs.poll();
        self.record_completed();
        Ok(polled?)
    }

    /// Records, metrics and logs of every epoch that committed since the last call;
    /// returns the newest one's manifest.
    pub(super) fn record_completed(&mut self) -> Option<Manifest> {
        let mut newest = None;
        for c in self.epochs.take_completed() {
            self.completed(&c);
            newest = Some(c.manifest);
        }
        if newest.is_some() && self.disk_full {
            self.disk_full = false;
            self.control.ready.store(true, Ordering::SeqCst);
            info!("disk space is back and a checkpoint committed: ready again");
        }
        self.observe_in_flight();
        newest
    }

    fn completed(&mut self, c: &Committed) {
        let pending = self.take_pending(c.manifest.checkpoint.id);
        let p = &self.pipeline;
        let (trigger, started_ms, pause, snapshot) = pending
            .map(|x| (x.trigger, x.started_ms, x.pause, x.snapshot))
            .unwrap_or((
                Trigger::Periodic,
                c.manifest.created_at_ms,
                Duration::ZERO,
                Duration::ZERO,
            ));
        let phases = Phases {
            snapshot_ms: snapshot.as_millis() as u64,
            flush_ms: pause.saturating_sub(snapshot).as_millis() as u64,
            upload_ms: c.upload.as_millis() as u64,
            materialize_ms: c.materialize.as_millis() as u64,
            commit_ms: c.commit.as_millis() as u64,
        };
        let record = CheckpointRecord::completed(
            trigger,
            started_ms,
            unix_ms(),
            &c.manifest,
            Some(c.written),
            Some(phases),
        );
        let total = c.barrier_at.elapsed();
        info!(
            checkpoint = %record.name,
            ?trigger,
            bytes = record.size_bytes,
            bytes_written = record.incremental_size_bytes,
            ms = total.as_millis() as u64,
            pause_ms = pause.as_millis() as u64,
            snapshot_ms = phases.snapshot_ms,
            flush_ms = phases.flush_ms,
            upload_ms = phases.upload_ms,
            commit_ms = phases.commit_ms,
            materialize_ms = phases.materialize_ms,
            "checkpoint completed"
        );
        self.control.history.record_checkpoint(record);
        let m = &p.metrics;
        m.transactions.with_label_values(&["committed"]).inc();
        for (phase, took) in [("upload", c.upload), ("commit", c.commit)] {
            m.checkpoint_phase_duration
                .with_label_values(&[phase])
                .observe(took.as_secs_f64());
        }
        m.checkpoints_completed.inc();
        m.checkpoint_duration.observe(total.as_secs_f64());
        m.last_checkpoint_incremental_bytes
            .set(c.written.bytes_written as i64);
        m.last_checkpoint_bytes.set(c.written.bytes_total as i64);
        m.last_checkpoint_completed_timestamp.set(unix_s());
        for o in &c.manifest.offsets {
            m.partition_offset
                .with_label_values(&[&o.topic, &o.partition.to_string()])
                .set(o.offset);
        }
    }

    /// The sealed epochs that did not commit: failed checkpoints in the history.
    pub(super) fn record_aborted(&mut self, cause: &JobError) {
        let m = &self.pipeline.metrics;
        m.transactions.with_label_values(&["aborted"]).inc();
        for p in std::mem::take(&mut self.pending) {
            m.checkpoints_failed.inc();
            warn!(checkpoint = %p.name, trigger = ?p.trigger, error = %cause, "checkpoint failed");
            self.control
                .history
                .record_checkpoint(CheckpointRecord::failed(
                    p.id,
                    p.name,
                    p.trigger,
                    p.started_ms,
                    unix_ms(),
                    cause.to_string(),
                ));
        }
        self.observe_in_flight();
    }

    fn take_pending(&mut self, id: u64) -> Option<Pending> {
        let at = self.pending.iter().position(|p| p.id == id)?;
        self.pending.remove(at)
    }

    /// Records handled and timers fired so far.
    pub(super) fn change_mark(&self) -> (u64, u64) {
        (self.pipeline.handled, self.pipeline.state.timers_fired())
    }

    /// Counts the `begin` that waited for a free producer, if it did.
    pub(super) fn count_pool_waits(&self, before: (u64, Duration)) {
        let (waits, waited) = self.epochs.pool_waits();
        let m = &self.pipeline.metrics;
        if waits > before.0 {
            m.producer_pool_waits.inc_by(waits - before.0);
            m.producer_pool_wait_seconds
                .inc_by((waited - before.1).as_secs_f64());
        }
    }

    fn observe_in_flight(&self) {
        let open = usize::from(self.epochs.open().is_some());
        self.pipeline
            .metrics
            .epochs_in_flight
            .set((self.epochs.in_flight() + open) as i64);
    }
}

fn unix_s() -> i64 {
    (unix_ms() / 1000) as i64
}
