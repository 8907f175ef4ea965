//! The rule engine's metrics, on the job's private registry. Labels are bounded:
//! `kind` (4 values) and `reason` (a fixed set) — never rule ids or keys.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct RuleMetrics {
    /// Events that passed a rule's filter.
    pub matches: IntCounterVec,
    /// Output records.
    pub outputs: IntCounterVec,
    pub dedup_dropped: IntCounter,
    /// Events a rule could not use (`field_missing`, `not_a_number`).
    pub evaluation_errors: IntCounterVec,
    /// Event-time windows an event could not join because the watermark had closed them.
    pub late_windows: IntCounter,
}

impl RuleMetrics {
    fn build() -> Result<Self, prometheus::Error> {
        Ok(Self {
            matches: IntCounterVec::new(
                Opts::new(
                    "streamstate_rule_matches_total",
                    "Events that passed a rule's filter, by rule kind.",
                ),
                &["kind"],
            )?,
            outputs: IntCounterVec::new(
                Opts::new(
                    "streamstate_rule_outputs_total",
                    "Rule output records, by rule kind.",
                ),
                &["kind"],
            )?,
            dedup_dropped: IntCounter::new(
                "streamstate_rule_dedup_dropped_total",
                "Duplicate events dropped by dedup rules.",
            )?,
            evaluation_errors: IntCounterVec::new(
                Opts::new(
                    "streamstate_rule_evaluation_errors_total",
                    "Events a rule could not evaluate, by reason.",
                ),
                &["reason"],
            )?,
            late_windows: IntCounter::new(
                "streamstate_rule_late_window_events_total",
                "Event-time windows an event missed because the watermark had already closed them.",
            )?,
        })
    }

    /// Registers on `registry`. If the names are taken (a second engine in one process),
    /// the metrics work but are not exported.
    pub fn new(registry: &Registry) -> Self {
        let m = Self::build().expect("static metric definitions are valid");
        let all: [Box<dyn prometheus::core::Collector>; 5] = [
            Box::new(m.matches.clone()),
            Box::new(m.outputs.clone()),
            Box::new(m.dedup_dropped.clone()),
            Box::new(m.evaluation_errors.clone()),
            Box::new(m.late_windows.clone()),
        ];
        for c in all {
            if let Err(e) = registry.register(c) {
                tracing::warn!(error = %e, "rule metric not registered");
            }
        }
        m
    }
}
