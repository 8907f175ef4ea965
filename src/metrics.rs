//! Prometheus metrics in a private registry, named `streamstate_<what>_<unit>`.
//!
//! Labels are bounded sets (topic, partition, reason, outcome) — never keys — so cardinality
//! stays fixed however many keys the job sees.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub records_consumed: IntCounterVec,
    pub records_produced: IntCounterVec,
    pub records_dead_lettered: IntCounterVec,
    pub checkpoints_completed: IntCounter,
    pub checkpoint_duration: Histogram,
    pub last_checkpoint_bytes: IntGauge,
    pub last_checkpoint_full_bytes: IntGauge,
    pub last_checkpoint_completed_timestamp: IntGauge,
    pub transactions: IntCounterVec,
    pub restore_duration: Histogram,
    pub partition_offset: IntGaugeVec,
    pub rules_active: IntGauge,
    pub rule_updates: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let tp = &["topic", "partition"];
        let m = Self {
            records_consumed: IntCounterVec::new(
                Opts::new("streamstate_records_consumed_total", "Records read from input topics."),
                tp,
            )?,
            records_produced: IntCounterVec::new(
                Opts::new("streamstate_records_produced_total", "Records sent to output topics (committed or not)."),
                &["topic"],
            )?,
            records_dead_lettered: IntCounterVec::new(
                Opts::new("streamstate_records_dead_lettered_total", "Input records sent to the dead-letter topic."),
                &["reason"],
            )?,
            checkpoints_completed: IntCounter::new(
                "streamstate_checkpoints_completed_total",
                "Checkpoints whose transaction committed.",
            )?,
            checkpoint_duration: Histogram::with_opts(
                HistogramOpts::new("streamstate_checkpoint_duration_seconds", "Snapshot to commit, per checkpoint.")
                    .buckets(prometheus::exponential_buckets(0.001, 2.0, 16)?),
            )?,
            last_checkpoint_bytes: IntGauge::new(
                "streamstate_last_checkpoint_size_bytes",
                "Bytes written to checkpoint storage by the last checkpoint.",
            )?,
            last_checkpoint_full_bytes: IntGauge::new(
                "streamstate_last_checkpoint_full_size_bytes",
                "Bytes the last checkpoint references in storage (written now or shared with earlier ones).",
            )?,
            last_checkpoint_completed_timestamp: IntGauge::new(
                "streamstate_last_checkpoint_completed_timestamp_seconds",
                "Unix time of the last completed checkpoint.",
            )?,
            transactions: IntCounterVec::new(
                Opts::new("streamstate_transactions_total", "Kafka transactions by outcome."),
                &["outcome"],
            )?,
            restore_duration: Histogram::with_opts(
                HistogramOpts::new("streamstate_restore_duration_seconds", "Time to restore state at start.")
                    .buckets(prometheus::exponential_buckets(0.001, 2.0, 18)?),
            )?,
            partition_offset: IntGaugeVec::new(
                Opts::new("streamstate_input_offset", "Next input offset to process, per partition."),
                tp,
            )?,
            rules_active: IntGauge::new("streamstate_rules_active", "Rules in force from the control topic.")?,
            rule_updates: IntCounterVec::new(
                Opts::new("streamstate_rule_updates_total", "Control-topic records by outcome."),
                &["outcome"],
            )?,
            registry,
        };
        m.registry.register(Box::new(m.records_consumed.clone()))?;
        m.registry.register(Box::new(m.records_produced.clone()))?;
        m.registry.register(Box::new(m.records_dead_lettered.clone()))?;
        m.registry.register(Box::new(m.checkpoints_completed.clone()))?;
        m.registry.register(Box::new(m.checkpoint_duration.clone()))?;
        m.registry.register(Box::new(m.last_checkpoint_bytes.clone()))?;
        m.registry.register(Box::new(m.last_checkpoint_full_bytes.clone()))?;
        m.registry.register(Box::new(m.last_checkpoint_completed_timestamp.clone()))?;
        m.registry.register(Box::new(m.transactions.clone()))?;
        m.registry.register(Box::new(m.restore_duration.clone()))?;
        m.registry.register(Box::new(m.partition_offset.clone()))?;
        m.registry.register(Box::new(m.rules_active.clone()))?;
        m.registry.register(Box::new(m.rule_updates.clone()))?;
        let build = IntGaugeVec::new(Opts::new("streamstate_build_info", "Build of this binary."), &["version"])?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        m.registry.register(Box::new(build))?;
        Ok(m)
    }

    /// The private registry, for components that register their own metrics (the rule engine).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Sum over all label values; for progress lines, not for hot paths.
    pub fn total(v: &IntCounterVec) -> f64 {
        use prometheus::core::Collector;
        v.collect().iter().flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().get_value())).sum()
    }

    /// The text exposition format served on `/metrics`.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        if TextEncoder::new().encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_with_streamstate_prefix() {
        let m = Metrics::new().expect("metrics");
        m.records_consumed.with_label_values(&["in", "0"]).inc_by(3);
        let text = m.render();
        assert!(text.contains("streamstate_records_consumed_total{partition=\"0\",topic=\"in\"} 3"), "{text}");
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            assert!(line.starts_with("# TYPE streamstate_"), "{line}");
        }
    }
}
