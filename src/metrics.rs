//! Prometheus metrics in a private registry, named `streamstate_<what>_<unit>`.
//!
//! Labels are bounded sets (topic, partition, reason, outcome) — never keys — so cardinality
//! stays fixed however many keys the job sees.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub records_consumed: IntCounterVec,
    pub records_produced: IntCounterVec,
    pub records_dead_lettered: IntCounterVec,
    pub checkpoints_completed: IntCounter,
    pub checkpoint_duration: Histogram,
    /// Where a checkpoint's time goes: `snapshot` (RocksDB's memtable switch and the
    /// operator state, on the job thread), `upload` (the memtable flush and hard links,
    /// the part that grows with the write rate, then new files into checkpoint storage,
    /// synced), `commit` (offsets into the transaction and its commit).
    pub checkpoint_phase_duration: prometheus::HistogramVec,
    pub last_checkpoint_bytes: IntGauge,
    pub last_checkpoint_completed_timestamp: IntGauge,
    pub transactions: IntCounterVec,
    pub restore_duration: Histogram,
    pub partition_offset: IntGaugeVec,
    pub rules_active: IntGauge,
    pub rule_updates: IntCounterVec,
    pub processing_duration: Histogram,
    pub consumer_lag: IntGaugeVec,
    /// Processing time minus the watermark. Registered now and left at 0: the event-time
    /// driver (timers and watermarks) sets it.
    pub watermark_lag: Gauge,
    pub last_checkpoint_incremental_bytes: IntGauge,
    pub checkpoints_failed: IntCounter,
    /// Set at every scrape from the completed timestamp, so it grows even when the loop
    /// is stuck.
    time_since_last_checkpoint: Gauge,
    pub restore_bytes: IntGauge,
    /// `checkpoint.interval`, so alerts can say "no checkpoint for 3 intervals".
    pub checkpoint_interval: Gauge,
    pub state_size: IntGauge,
    pub state_keys: IntGauge,
    pub ttl_expired: IntCounter,
    /// The state cache (`state.cache_bytes`): reads it answered, reads that went to the
    /// backend, entries evicted (dirty ones written back), bytes held. Set from
    /// `StateStore::cache_stats` by [`Metrics::observe_state_cache`].
    pub state_cache_hits: IntCounter,
    pub state_cache_misses: IntCounter,
    pub state_cache_evictions: IntCounter,
    pub state_cache_bytes: IntGauge,
    pub http_requests: IntCounterVec,
    pub http_duration: prometheus::HistogramVec,
    /// Set at every scrape from the transaction tracker, so it grows while the loop is
    /// stuck inside a checkpoint (when a transaction hangs).
    pub transaction_open_age: Gauge,
    /// `kafka.transaction_timeout`, so alerts can compare the age with it.
    pub transaction_timeout: Gauge,
    pub transactions_near_timeout: IntCounter,
    /// The job thread's pause at each checkpoint barrier (the synchronous snapshot);
    /// upload and commit run on the committer thread.
    pub checkpoint_pause: Histogram,
    /// Periodic checkpoints skipped because nothing changed since the previous one.
    pub checkpoints_skipped: IntCounter,
    /// Unix time of the last skipped checkpoint with nothing in flight: the state was as
    /// durable then as a checkpoint would have made it.
    pub last_checkpoint_skipped_timestamp: IntGauge,
    /// Open epochs: the one taking records plus those uploading or committing.
    pub epochs_in_flight: IntGauge,
    /// Barriers whose next epoch waited for a free producer (back-pressure).
    pub producer_pool_waits: IntCounter,
    pub producer_pool_wait_seconds: prometheus::Counter,
    /// Admin connections closed at accept because `admin::MAX_CONNECTIONS` were open.
    pub http_connections_refused: IntCounter,
    started_at: u64,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let tp = &["topic", "partition"];
        let m = Self {
            records_consumed: IntCounterVec::new(
                Opts::new(
                    "streamstate_records_consumed_total",
                    "Records read from input topics.",
                ),
                tp,
            )?,
            records_produced: IntCounterVec::new(
                Opts::new(
                    "streamstate_records_produced_total",
                    "Records sent to output topics (committed or not).",
                ),
                &["topic"],
            )?,
            records_dead_lettered: IntCounterVec::new(
                Opts::new(
                    "streamstate_records_dead_lettered_total",
                    "Input records sent to the dead-letter topic.",
                ),
                &["topic", "partition", "reason"],
            )?,
            checkpoints_completed: IntCounter::new(
                "streamstate_checkpoints_completed_total",
                "Checkpoints whose transaction committed.",
            )?,
            checkpoint_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "streamstate_checkpoint_duration_seconds",
                    "Snapshot to commit, per checkpoint.",
                )
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 16)?),
            )?,
            checkpoint_phase_duration: prometheus::HistogramVec::new(
                HistogramOpts::new(
                    "streamstate_checkpoint_phase_duration_seconds",
                    "Time of each checkpoint phase: snapshot and flush (the job-thread pause), upload and commit (the committer).",
                )
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 16)?),
                &["phase"],
            )?,
            last_checkpoint_bytes: IntGauge::new(
                "streamstate_last_checkpoint_size_bytes",
                "Bytes the last checkpoint references in storage (written now or shared with earlier ones).",
            )?,
            last_checkpoint_incremental_bytes: IntGauge::new(
                "streamstate_last_checkpoint_incremental_size_bytes",
                "Bytes the last checkpoint added to checkpoint storage.",
            )?,
            last_checkpoint_completed_timestamp: IntGauge::new(
                "streamstate_last_checkpoint_completed_timestamp_seconds",
                "Unix time of the last completed checkpoint.",
            )?,
            transactions: IntCounterVec::new(
                Opts::new(
                    "streamstate_transactions_total",
                    "Kafka transactions by outcome.",
                ),
                &["outcome"],
            )?,
            restore_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "streamstate_restore_duration_seconds",
                    "Time to restore state at start.",
                )
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 18)?),
            )?,
            partition_offset: IntGaugeVec::new(
                Opts::new(
                    "streamstate_input_offset",
                    "Next input offset to process, per partition.",
                ),
                tp,
            )?,
            rules_active: IntGauge::new(
                "streamstate_rules_active",
                "Rules in force from the control topic.",
            )?,
            rule_updates: IntCounterVec::new(
                Opts::new(
                    "streamstate_rule_updates_total",
                    "Control-topic records by outcome.",
                ),
                &["outcome"],
            )?,
            processing_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "streamstate_processing_duration_seconds",
                    "Time to process one input record (decode, state, produce): a polled batch's time divided by its records, once per record.",
                )
                .buckets(prometheus::exponential_buckets(0.000_005, 2.0, 18)?),
            )?,
            consumer_lag: IntGaugeVec::new(
                Opts::new(
                    "streamstate_consumer_lag_records",
                    "High watermark minus the next offset to process, per input partition.",
                ),
                tp,
            )?,
            watermark_lag: Gauge::new(
                "streamstate_watermark_lag_seconds",
                "Processing time minus the current watermark (set by the event-time driver; 0 until then).",
            )?,
            checkpoints_failed: IntCounter::new(
                "streamstate_checkpoints_failed_total",
                "Checkpoint attempts that failed (their transaction was aborted).",
            )?,
            time_since_last_checkpoint: Gauge::new(
                "streamstate_time_since_last_checkpoint_seconds",
                "Seconds since the last completed checkpoint, or the last one skipped with everything committed (since process start before either).",
            )?,
            checkpoint_interval: Gauge::new(
                "streamstate_checkpoint_interval_seconds",
                "The configured checkpoint.interval.",
            )?,
            restore_bytes: IntGauge::new(
                "streamstate_restore_size_bytes",
                "Bytes of the checkpoint or savepoint restored at start.",
            )?,
            state_size: IntGauge::new(
                "streamstate_state_size_bytes",
                "Estimated bytes of live state (RocksDB SST files and memtables).",
            )?,
            state_keys: IntGauge::new(
                "streamstate_state_keys",
                "Estimated keys in the state backend (RocksDB estimate-num-keys: one per value, list, map entry).",
            )?,
            ttl_expired: IntCounter::new(
                "streamstate_state_ttl_expired_total",
                "State entries removed because their TTL expired.",
            )?,
            state_cache_hits: IntCounter::new(
                "streamstate_state_cache_hits_total",
                "State reads answered by the write-back state cache.",
            )?,
            state_cache_misses: IntCounter::new(
                "streamstate_state_cache_misses_total",
                "State reads that went to the state backend (cache off: every read).",
            )?,
            state_cache_evictions: IntCounter::new(
                "streamstate_state_cache_evictions_total",
                "State cache entries evicted because it was full (dirty ones written back first).",
            )?,
            state_cache_bytes: IntGauge::new(
                "streamstate_state_cache_bytes",
                "Estimated bytes the state cache holds (bounded by state.cache_bytes).",
            )?,
            http_requests: IntCounterVec::new(
                Opts::new(
                    "streamstate_http_requests_total",
                    "Admin HTTP requests by route and status.",
                ),
                &["route", "status"],
            )?,
            http_duration: prometheus::HistogramVec::new(
                HistogramOpts::new(
                    "streamstate_http_request_duration_seconds",
                    "Admin HTTP request latency by route.",
                )
                .buckets(prometheus::exponential_buckets(0.0005, 4.0, 10)?),
                &["route"],
            )?,
            transaction_open_age: Gauge::new(
                "streamstate_transaction_open_age_seconds",
                "Age of the open Kafka transaction (0 when none is open).",
            )?,
            transaction_timeout: Gauge::new(
                "streamstate_transaction_timeout_seconds",
                "The configured kafka.transaction_timeout (transaction.timeout.ms).",
            )?,
            transactions_near_timeout: IntCounter::new(
                "streamstate_transaction_near_timeout_total",
                "Transactions whose age passed 80% of transaction.timeout.ms while open.",
            )?,
            http_connections_refused: IntCounter::new(
                "streamstate_http_connections_refused_total",
                "Admin connections closed at once because the connection cap was reached.",
            )?,
            checkpoint_pause: Histogram::with_opts(
                HistogramOpts::new(
                    "streamstate_checkpoint_pause_seconds",
                    "Time the job thread stopped processing at each checkpoint barrier (local snapshot).",
                )
                .buckets(vec![
                    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ]),
            )?,
            checkpoints_skipped: IntCounter::new(
                "streamstate_checkpoints_skipped_total",
                "Periodic checkpoints skipped because nothing changed since the previous one (no upload, no transaction).",
            )?,
            last_checkpoint_skipped_timestamp: IntGauge::new(
                "streamstate_last_checkpoint_skipped_timestamp_seconds",
                "Unix time of the last checkpoint skipped with everything committed.",
            )?,
            epochs_in_flight: IntGauge::new(
                "streamstate_epochs_in_flight",
                "Open epochs: the one taking records plus those uploading or committing.",
            )?,
            producer_pool_waits: IntCounter::new(
                "streamstate_producer_pool_waits_total",
                "Checkpoint barriers after which the next epoch waited for a free transactional producer.",
            )?,
            producer_pool_wait_seconds: prometheus::Counter::new(
                "streamstate_producer_pool_wait_seconds_total",
                "Time the job thread waited for a free transactional producer.",
            )?,
            started_at: now_secs(),
            registry,
        };
        m.registry.register(Box::new(m.records_consumed.clone()))?;
        m.registry.register(Box::new(m.records_produced.clone()))?;
        m.registry
            .register(Box::new(m.records_dead_lettered.clone()))?;
        m.registry
            .register(Box::new(m.checkpoints_completed.clone()))?;
        m.registry
            .register(Box::new(m.checkpoint_duration.clone()))?;
        m.registry
            .register(Box::new(m.checkpoint_phase_duration.clone()))?;
        m.registry
            .register(Box::new(m.last_checkpoint_bytes.clone()))?;
        m.registry
            .register(Box::new(m.last_checkpoint_incremental_bytes.clone()))?;
        m.registry
            .register(Box::new(m.last_checkpoint_completed_timestamp.clone()))?;
        m.registry.register(Box::new(m.transactions.clone()))?;
        m.registry.register(Box::new(m.restore_duration.clone()))?;
        m.registry.register(Box::new(m.partition_offset.clone()))?;
        m.registry.register(Box::new(m.rules_active.clone()))?;
        m.registry.register(Box::new(m.rule_updates.clone()))?;
        m.registry
            .register(Box::new(m.processing_duration.clone()))?;
        m.registry.register(Box::new(m.consumer_lag.clone()))?;
        m.registry.register(Box::new(m.watermark_lag.clone()))?;
        m.registry
            .register(Box::new(m.checkpoints_failed.clone()))?;
        m.registry
            .register(Box::new(m.time_since_last_checkpoint.clone()))?;
        m.registry.register(Box::new(m.restore_bytes.clone()))?;
        m.registry
            .register(Box::new(m.checkpoint_interval.clone()))?;
        m.registry.register(Box::new(m.state_size.clone()))?;
        m.registry.register(Box::new(m.state_keys.clone()))?;
        m.registry.register(Box::new(m.ttl_expired.clone()))?;
        m.registry.register(Box::new(m.state_cache_hits.clone()))?;
        m.registry
            .register(Box::new(m.state_cache_misses.clone()))?;
        m.registry
            .register(Box::new(m.state_cache_evictions.clone()))?;
        m.registry.register(Box::new(m.state_cache_bytes.clone()))?;
        m.registry.register(Box::new(m.http_requests.clone()))?;
        m.registry.register(Box::new(m.http_duration.clone()))?;
        m.registry
            .register(Box::new(m.transaction_open_age.clone()))?;
        m.registry
            .register(Box::new(m.transaction_timeout.clone()))?;
        m.registry
            .register(Box::new(m.transactions_near_timeout.clone()))?;
        m.registry
            .register(Box::new(m.http_connections_refused.clone()))?;
        m.registry.register(Box::new(m.checkpoint_pause.clone()))?;
        m.registry
            .register(Box::new(m.checkpoints_skipped.clone()))?;
        m.registry
            .register(Box::new(m.last_checkpoint_skipped_timestamp.clone()))?;
        m.registry.register(Box::new(m.epochs_in_flight.clone()))?;
        m.registry
            .register(Box::new(m.producer_pool_waits.clone()))?;
        m.registry
            .register(Box::new(m.producer_pool_wait_seconds.clone()))?;
        let build = IntGaugeVec::new(
            Opts::new("streamstate_build_info", "Build of this binary (value 1)."),
            &["version"],
        )?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        m.registry.register(Box::new(build))?;
        Ok(m)
    }

    /// The private registry, for components that register their own metrics (the rule engine).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Brings the state-cache metrics up to `stats` (the store's counters since it was
    /// opened). A store opened afresh (a restore into a new store) starts its counters
    /// at zero again; the counters then wait until it has counted past them, so they
    /// never go down.
    pub fn observe_state_cache(&self, stats: &crate::state::CacheStats) {
        for (counter, now) in [
            (&self.state_cache_hits, stats.hits),
            (&self.state_cache_misses, stats.misses),
            (&self.state_cache_evictions, stats.evictions),
        ] {
            let seen = counter.get();
            if now > seen {
                counter.inc_by(now - seen);
            }
        }
        self.state_cache_bytes.set(stats.bytes as i64);
    }

    /// Sum over all label values; for progress lines, not for hot paths.
    pub fn total(v: &IntCounterVec) -> f64 {
        use prometheus::core::Collector;
        v.collect()
            .iter()
            .flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().get_value()))
            .sum()
    }

    /// The text exposition format served on `/metrics`.
    pub fn render(&self) -> String {
        let last = self
            .last_checkpoint_completed_timestamp
            .get()
            .max(self.last_checkpoint_skipped_timestamp.get())
            .max(0) as u64;
        self.time_since_last_checkpoint
            .set(now_secs().saturating_sub(if last > 0 { last } else { self.started_at }) as f64);
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_with_streamstate_prefix() {
        let m = Metrics::new().expect("metrics");
        m.records_consumed.with_label_values(&["in", "0"]).inc_by(3);
        let text = m.render();
        assert!(
            text.contains("streamstate_records_consumed_total{partition=\"0\",topic=\"in\"} 3"),
            "{text}"
        );
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            assert!(line.starts_with("# TYPE streamstate_"), "{line}");
        }
    }

    #[test]
    fn state_cache_metrics_follow_the_store_counters_and_never_go_down() {
        let m = Metrics::new().expect("metrics");
        let stats = |hits, misses, evictions, bytes| crate::state::CacheStats {
            hits,
            misses,
            evictions,
            bytes,
            ..Default::default()
        };
        m.observe_state_cache(&stats(10, 4, 1, 4096));
        m.observe_state_cache(&stats(25, 5, 1, 2048));
        let text = m.render();
        for line in [
            "streamstate_state_cache_hits_total 25",
            "streamstate_state_cache_misses_total 5",
            "streamstate_state_cache_evictions_total 1",
            "streamstate_state_cache_bytes 2048",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        // A fresh store counts from zero: the counters hold until it passes them.
        m.observe_state_cache(&stats(3, 1, 0, 100));
        assert_eq!(m.state_cache_hits.get(), 25);
        m.observe_state_cache(&stats(30, 6, 2, 100));
        assert_eq!(m.state_cache_hits.get(), 30);
        assert_eq!(m.state_cache_evictions.get(), 2);
    }
}
