//! The job loop's edges: admin requests served between polls, savepoints,
//! stop-with-savepoint, the final checkpoint, and periodic observation for metrics.
//!
//! Everything here runs on the loop's thread, between records, so a request sees state
//! exactly as the last processed record left it and never races the commit protocol.

use std::sync::atomic::Ordering;
use std::sync::mpsc::TryRecvError;

use rdkafka::consumer::Consumer;
use tracing::{info, warn};

use super::{Job, JobError, manifest_offsets, remove_dir, restore_into, unix_ms};
use crate::checkpoint::Manifest;
use crate::config::{Config, parse_storage_url};
use crate::history::{SavepointRecord, Trigger};
use crate::requests::{Request, StateAnswer};
use crate::savepoint::{self, SavepointTarget};
use crate::source::Committed;
use streamstate_state::StateStore;

impl Job {
    /// Serves every request waiting in the channel (a handful at most: it is bounded).
    pub(super) fn serve_requests(&mut self) -> Result<(), JobError> {
        loop {
            let Some(rx) = &self.requests else {
                return Ok(());
            };
            let request = match rx.try_recv() {
                Ok(r) => r,
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => {
                    self.requests = None;
                    return Ok(());
                }
            };
            match request {
                Request::State { key, reply } => {
                    let _ = reply.send(self.key_state(&key).map_err(|e| e.to_string()));
                }
                Request::Checkpoint { reply } => {
                    fail::fail_point!("admin-checkpoint");
                    let result = self.checkpoint_and_wait(Trigger::Manual);
                    let answer = match &result {
                        Ok(m) => self
                            .control
                            .history
                            .checkpoint(m.checkpoint.id)
                            .ok_or_else(|| "not recorded".to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    let _ = reply.send(answer);
                    self.after_checkpoint(result.map(drop))?;
                }
                Request::Savepoint { target, reply } => {
                    fail::fail_point!("admin-checkpoint");
                    let result = self.savepoint(target);
                    let _ = reply.send(
                        result
                            .as_ref()
                            .map(Clone::clone)
                            .map_err(ToString::to_string),
                    );
                    self.after_checkpoint(result.map(drop))?;
                }
                Request::Stop {
                    savepoint: false,
                    reply,
                } => {
                    self.stopping = Some((None, reply));
                    self.control.shutdown.store(true, Ordering::SeqCst);
                }
                Request::Stop {
                    savepoint: true,
                    reply,
                } => {
                    let result = self.savepoint(None);
                    match &result {
                        Ok(record) => {
                            info!(savepoint = %record.id, "stop with savepoint: savepoint written, taking the final checkpoint");
                            self.stopping = Some((Some(record.clone()), reply));
                            self.control.shutdown.store(true, Ordering::SeqCst);
                        }
                        Err(e) => {
                            warn!(error = %e, "stop with savepoint: the savepoint failed; the job keeps running");
                            let _ = reply.send(Err(e.to_string()));
                        }
                    }
                    self.after_checkpoint(result.map(drop))?;
                }
            }
        }
    }

    /// After a checkpoint the loop took for a request: a new epoch, or (when it must be
    /// aborted) the usual rewind to the last committed checkpoint.
    fn after_checkpoint(&mut self, result: Result<(), JobError>) -> Result<(), JobError> {
        match result {
            Ok(()) => self.begin(),
            Err(e) => self.recover(e),
        }
    }

    fn key_state(&self, key: &str) -> Result<StateAnswer, JobError> {
        let store = self.pipeline.state.store();
        let key_groups = store.key_groups();
        let key_group = key_groups.of(key.as_bytes());
        if !store.key_group_range().contains(key_group) {
            let (_, instances) = store.instance();
            let owner = (0..instances)
                .find(|i| {
                    key_groups
                        .range_for_instance(instances, *i)
                        .contains(key_group)
                })
                .unwrap_or(0);
            return Ok(StateAnswer::NotOwned { key_group, owner });
        }
        Ok(match store.key_state_json(key.as_bytes())? {
            Some(v) => StateAnswer::Found(v),
            None => StateAnswer::NotFound,
        })
    }

    /// Commits a checkpoint, then writes the same state with the same offsets as a
    /// savepoint in the canonical format. The caller begins the next transaction.
    fn savepoint(&mut self, target: Option<SavepointTarget>) -> Result<SavepointRecord, JobError> {
        let checkpoint = self.checkpoint_and_wait(Trigger::Savepoint)?;
        let config = &self.pipeline.config;
        let location = match target {
            Some(t) => t.location,
            None => savepoint::default_location(config)?,
        };
        let storage = savepoint::open(config, &location)?;
        let staging = config
            .state
            .dir
            .join(format!("savepoint-{}", config.job.instance));
        remove_dir(&staging)?;
        let state = self
            .pipeline
            .state
            .store()
            .write_savepoint(checkpoint.checkpoint.id, &staging)?;
        let manifest = Manifest {
            created_at_ms: unix_ms(),
            state,
            ..checkpoint
        };
        storage.write(&manifest, &staging)?;
        remove_dir(&staging)?;
        storage.mark_complete(&manifest.checkpoint)?;
        let record = SavepointRecord {
            id: savepoint::savepoint_id(&manifest.checkpoint),
            checkpoint: manifest.checkpoint.to_string(),
            location: savepoint::location_url(&location),
            created_at_ms: manifest.created_at_ms,
            size_bytes: manifest.state.total_size(),
            offsets: manifest.offsets,
            control_offsets: manifest.control_offsets,
            completed: true,
        };
        info!(savepoint = %record.id, location = %record.location, bytes = record.size_bytes, "savepoint written");
        self.control.history.record_savepoint(record.clone());
        Ok(record)
    }

    /// The end of the run: stop polling, commit the final checkpoint, answer `POST /stop`.
    pub(super) fn shut_down(mut self) -> Result<(), JobError> {
        self.control.ready.store(false, Ordering::SeqCst);
        let stopping = self.stopping.take();
        let result = match self.checkpoint_and_wait(Trigger::Shutdown) {
            Ok(_) => {
                info!("final checkpoint committed; shutting down");
                Ok(())
            }
            Err(e) if super::is_rewindable(&e) => {
                warn!(error = %e, "final checkpoint aborted; its records are processed again at the next start");
                let aborted = self.epochs.abort().map_err(JobError::from);
                self.record_aborted(&e);
                aborted
            }
            Err(e) => Err(e),
        };
        if let Some((savepoint, reply)) = stopping {
            let _ = reply.send(match &result {
                Ok(()) => Ok(savepoint),
                Err(e) => Err(e.to_string()),
            });
        }
        result
    }

    /// Gauges the loop owns: consumer lag, state size, TTL expirations.
    pub(super) fn observe(&mut self) {
        let p = &self.pipeline;
        let consumer = self.source.consumer();
        for ((topic, partition), next) in &p.offsets {
            // librdkafka's cached high watermark (updated by fetches): no broker call.
            if let Some(high) = cached_high_watermark(consumer, topic, *partition) {
                p.metrics
                    .consumer_lag
                    .with_label_values(&[topic, &partition.to_string()])
                    .set((high - next).max(0));
            }
        }
        let store = p.state.store();
        if let Ok(n) = store.approximate_entries() {
            p.metrics.state_keys.set(n as i64);
        }
        if let Ok(n) = store.approximate_size_bytes() {
            p.metrics.state_size.set(n as i64);
        }
        let expired = store.ttl_expired_total();
        let counted = p.metrics.ttl_expired.get();
        if expired > counted {
            p.metrics.ttl_expired.inc_by(expired - counted);
        }
        p.metrics.observe_state_cache(&store.cache_stats());
    }
}

/// librdkafka's last known high watermark of a partition, updated by every fetch
/// response: no broker round trip (unlike `fetch_watermarks`). `None` before the first
/// fetch. rust-rdkafka does not wrap `rd_kafka_get_watermark_offsets`.
fn cached_high_watermark<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid while `consumer` is borrowed; the topic is a
    // NUL-terminated string that outlives the call; low/high are valid out-pointers.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(high)
}

/// `run --from-savepoint`: reads the savepoint, checks it against the group's committed
/// offsets, and restores its state into a new store.
pub(super) fn restore_savepoint(
    config: &Config,
    options: &super::StartOptions,
    id: &str,
    committed: Option<&Committed>,
) -> Result<(StateStore, Manifest), JobError> {
    let fail = |reason: String| JobError::Savepoint {
        id: id.to_string(),
        reason,
    };
    let name = savepoint::parse_savepoint_id(id)
        .ok_or_else(|| fail("not a savepoint id (sp-<n>-<run>)".into()))?;
    let location = match &options.savepoint_location {
        Some(url) => {
            parse_storage_url("--savepoint-location", url).map_err(|e| fail(e.to_string()))?
        }
        None => savepoint::default_location(config)?,
    };
    let storage = savepoint::open(config, &location)?;
    let manifest = storage.read_manifest(&name)?;
    let same_offsets = committed.is_some_and(|c| c.offsets == manifest_offsets(&manifest.offsets));
    if !same_offsets {
        let detail = match committed {
            Some(c) => format!(
                "the group's committed offsets (checkpoint {}) differ from the savepoint's",
                c.checkpoint
            ),
            None => "the group has no committed offsets".to_string(),
        };
        if !options.ignore_committed_offsets {
            return Err(fail(format!(
                "{detail}: records were processed after it was taken, so restoring it would repeat their effects. \
                 Start without --from-savepoint, or pass --ignore-committed-offsets to restore it anyway"
            )));
        }
        warn!(savepoint = %id, "{detail}; restoring anyway (--ignore-committed-offsets): NOT exactly-once across this restart");
    }
    let store = super::fresh_store(config, manifest.state.identity.key_groups()?)?;
    restore_into(config, storage.as_ref(), &manifest, |from| {
        Ok(store.restore(&[from])?)
    })?;
    info!(savepoint = %id, location = %savepoint::location_url(&location), "restored state from savepoint");
    Ok((store, manifest))
}
