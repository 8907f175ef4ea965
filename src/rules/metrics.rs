//! The rule engine's metrics, on the job's private registry. Labels are bounded:
//! `kind` (4 values), `reason` (a fixed set) and, on the three per-rule counters, `rule`:
//! rule ids are few and written by operators (a control-topic publish each), unlike keys,
//! which never become labels.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use super::spec::{Rule, Status};

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
    /// Event-time sequence events evaluated before the watermark passed them because
    /// their key's buffer was full.
    pub sequence_early: IntCounter,
    /// Events a `group_by` aggregate skipped because their key had `max_groups` groups.
    pub group_overflow: IntCounter,
    /// Events that passed a rule's filter, by rule id: what `GET /rules` shows as
    /// `matches`, and how a shadow rule is judged before it may emit.
    pub rule_matches: IntCounterVec,
    /// Output records, by rule id: what `GET /rules` shows as `outputs`.
    pub rule_outputs: IntCounterVec,
    /// Outputs a shadow rule computed and dropped, by rule id.
    pub shadow_suppressed: IntCounterVec,
}

/// One rule's series, fetched once when the rule is compiled: `with_label_values`
/// hashes the labels and takes a lock, and the per-event path would otherwise do that
/// three times per rule per event.
#[derive(Clone)]
pub struct RuleCounters {
    pub matches: IntCounter,
    pub rule_matches: IntCounter,
    pub outputs: IntCounter,
    pub rule_outputs: IntCounter,
    /// Only for a shadow rule: its outputs are counted here instead of emitted.
    pub shadow_suppressed: Option<IntCounter>,
}

/// Name of [`RuleMetrics::rule_matches`], which the admin server reads back per rule.
pub const RULE_MATCHES: &str = "streamstate_rule_matches_by_rule_total";
/// Name of [`RuleMetrics::rule_outputs`], which the admin server reads back per rule.
pub const RULE_OUTPUTS: &str = "streamstate_rule_outputs_by_rule_total";

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
            sequence_early: IntCounter::new(
                "streamstate_rule_sequence_early_evaluations_total",
                "Event-time sequence events evaluated before the watermark passed them (the key's buffer was full).",
            )?,
            group_overflow: IntCounter::new(
                "streamstate_rule_group_overflow_events_total",
                "Events a group_by aggregate skipped because their key already had max_groups groups.",
            )?,
            rule_matches: IntCounterVec::new(
                Opts::new(
                    RULE_MATCHES,
                    "Events that passed a rule's filter, by rule id (shadow rules included).",
                ),
                &["rule"],
            )?,
            rule_outputs: IntCounterVec::new(
                Opts::new(
                    RULE_OUTPUTS,
                    "Rule output records, by rule id (a shadow rule's suppressed ones are not outputs).",
                ),
                &["rule"],
            )?,
            shadow_suppressed: IntCounterVec::new(
                Opts::new(
                    "streamstate_rule_shadow_suppressed_outputs_total",
                    "Output records a shadow rule computed and did not emit, by rule id.",
                ),
                &["rule"],
            )?,
        })
    }

    pub fn for_rule(&self, rule: &Rule) -> RuleCounters {
        let kind = [rule.kind.name()];
        RuleCounters {
            matches: self.matches.with_label_values(&kind),
            rule_matches: self.rule_matches.with_label_values(&[&rule.id]),
            outputs: self.outputs.with_label_values(&kind),
            rule_outputs: self.rule_outputs.with_label_values(&[&rule.id]),
            shadow_suppressed: (rule.status == Status::Shadow)
                .then(|| self.shadow_suppressed.with_label_values(&[&rule.id])),
        }
    }

    /// Registers on `registry`. If the names are taken (a second engine in one process),
    /// the metrics work but are not exported.
    pub fn new(registry: &Registry) -> Self {
        let m = Self::build().expect("static metric definitions are valid");
        let all: [Box<dyn prometheus::core::Collector>; 10] = [
            Box::new(m.matches.clone()),
            Box::new(m.outputs.clone()),
            Box::new(m.dedup_dropped.clone()),
            Box::new(m.evaluation_errors.clone()),
            Box::new(m.late_windows.clone()),
            Box::new(m.sequence_early.clone()),
            Box::new(m.group_overflow.clone()),
            Box::new(m.rule_matches.clone()),
            Box::new(m.rule_outputs.clone()),
            Box::new(m.shadow_suppressed.clone()),
        ];
        for c in all {
            if let Err(e) = registry.register(c) {
                tracing::warn!(error = %e, "rule metric not registered");
            }
        }
        m
    }
}
