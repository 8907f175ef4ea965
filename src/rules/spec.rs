//! Rule language v1: the serde shape of a rule and its validation into a [`Rule`].
//!
//! Parsing is two-staged so every refusal gets a precise reason: serde (with
//! `deny_unknown_fields` everywhere) checks the shape; [`compile`] then checks names
//! (kind, fn, model, window type, emit), durations, pointers and limits. A rule is
//! compiled completely before the engine swaps it in, so a refused rule is never
//! half-applied.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::predicate::{Budget, Pointer, Predicate, Subject};

/// The fixed reason labels of a refused rule (dead-letter header and metric label).
pub mod reason {
    /// Wrong JSON type, a missing or conflicting field, a value out of range.
    pub const INVALID: &str = "rule_invalid";
    pub const UNKNOWN_FIELD: &str = "rule_unknown_field";
    pub const UNKNOWN_KIND: &str = "rule_unknown_kind";
    pub const UNKNOWN_FN: &str = "rule_unknown_fn";
    pub const UNKNOWN_MODEL: &str = "rule_unknown_model";
    pub const UNKNOWN_OP: &str = "rule_unknown_op";
    pub const BAD_POINTER: &str = "rule_bad_pointer";
    pub const BAD_WINDOW: &str = "rule_bad_window";
    pub const BAD_DURATION: &str = "rule_bad_duration";
    pub const BAD_STATUS: &str = "rule_bad_status";
    pub const TOO_COMPLEX: &str = "rule_too_complex";
}

/// Most steps in a sequence.
pub const MAX_SEQUENCE_STEPS: usize = 32;
/// Most windows one event can fall into (sliding `size / slide`).
pub const MAX_WINDOWS_PER_EVENT: u64 = 100;
/// Most closed windows kept per key for `compare`.
pub const MAX_WINDOWS_BACK: u32 = 1000;
/// Default and largest bound on the groups one key keeps for a `group_by` aggregate.
pub const DEFAULT_MAX_GROUPS: u32 = 100;
pub const MAX_GROUPS: u32 = 10_000;
/// Longest duration accepted anywhere (400 days).
pub const MAX_DURATION: Duration = Duration::from_secs(400 * 24 * 3600);

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct RuleError {
    pub reason: &'static str,
    pub message: String,
}

impl RuleError {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

// ---- serde shape -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: String,
    version: u64,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    filter: Option<Value>,
    kind: String,
    #[serde(default)]
    aggregate: Option<RawAggregate>,
    #[serde(default)]
    dedup: Option<RawDedup>,
    #[serde(default)]
    sequence: Option<RawSequence>,
    #[serde(default)]
    anomaly: Option<RawAnomaly>,
    #[serde(default)]
    output_topic: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAggregate {
    #[serde(rename = "fn")]
    func: String,
    #[serde(default)]
    field: Option<String>,
    #[serde(default)]
    window: Option<RawWindow>,
    #[serde(default)]
    having: Option<Value>,
    #[serde(default)]
    emit: Option<String>,
    #[serde(default)]
    compare: Option<RawCompare>,
    #[serde(default)]
    group_by: Option<String>,
    #[serde(default)]
    max_groups: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    size: Option<String>,
    #[serde(default)]
    slide: Option<String>,
    #[serde(default)]
    gap: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompare {
    windows_back: u32,
    ratio_gt: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDedup {
    field: String,
    ttl: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSequence {
    steps: Vec<Value>,
    within: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnomaly {
    field: String,
    model: String,
    #[serde(default)]
    alpha: Option<f64>,
    z_gt: f64,
    #[serde(default)]
    min_samples: Option<u64>,
}

// ---- compiled form -----------------------------------------------------------------

/// `status`. `deleted` never reaches the engine (the runtime turns it into a deletion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Active,
    /// Evaluated in full (state, timers, match counts) but never emits: a new rule can be
    /// watched on live traffic before it may produce anything.
    Shadow,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub id: String,
    pub version: u64,
    pub status: Status,
    pub filter: Option<Predicate>,
    pub output_topic: Option<String>,
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Aggregate(AggregateSpec),
    Dedup(DedupSpec),
    Sequence(SequenceSpec),
    Anomaly(AnomalySpec),
}

impl Kind {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Aggregate(_) => "aggregate",
            Self::Dedup(_) => "dedup",
            Self::Sequence(_) => "sequence",
            Self::Anomaly(_) => "anomaly",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggFn {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    DistinctCount,
}

impl AggFn {
    pub fn name(self) -> &'static str {
        match self {
            Self::Count => "count",
            Self::Sum => "sum",
            Self::Min => "min",
            Self::Max => "max",
            Self::Avg => "avg",
            Self::DistinctCount => "distinct_count",
        }
    }
}

/// Window sizes in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSpec {
    /// No window: one running value per key.
    Running,
    Tumbling {
        size: u64,
    },
    /// `size` is a multiple of `slide`.
    Sliding {
        size: u64,
        slide: u64,
    },
    Session {
        gap: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    EveryEvent,
    OnMatch,
    OnWindowClose,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompareSpec {
    pub windows_back: u32,
    pub ratio_gt: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AggregateSpec {
    pub func: AggFn,
    pub field: Option<Pointer>,
    pub window: WindowSpec,
    pub having: Option<Predicate>,
    pub emit: Emit,
    pub compare: Option<CompareSpec>,
    /// `group_by`: one aggregate per distinct value of this field inside the key.
    pub group_by: Option<Pointer>,
    /// Most groups per key (and window); an event of a further group is skipped.
    pub max_groups: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DedupSpec {
    pub field: Pointer,
    pub ttl_ms: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SequenceSpec {
    pub steps: Vec<Predicate>,
    pub within_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    Ewma,
    Welford,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AnomalySpec {
    pub field: Pointer,
    pub model: Model,
    /// EWMA smoothing factor (ewma only).
    pub alpha: f64,
    pub z_gt: f64,
    pub min_samples: u64,
}

/// Parses and validates rule JSON. `Ok` means the rule can be put in force as is.
pub fn compile(body: &Value) -> Result<Rule, RuleError> {
    let raw: RawRule = serde_json::from_value(body.clone()).map_err(|e| {
        let msg = e.to_string();
        let reason = if msg.contains("unknown field") {
            reason::UNKNOWN_FIELD
        } else {
            reason::INVALID
        };
        RuleError::new(reason, format!("rule: {msg}"))
    })?;
    if raw.id.is_empty() || raw.id.len() > 256 || raw.id.contains('\0') {
        return Err(RuleError::new(
            reason::INVALID,
            "id: 1 to 256 bytes, no NUL",
        ));
    }
    let status = match raw.status.as_deref() {
        None | Some("active") => Status::Active,
        Some("shadow") => Status::Shadow,
        Some(other) => {
            return Err(RuleError::new(
                reason::BAD_STATUS,
                format!("status: `{other}` is not supported (active, shadow or deleted)"),
            ));
        }
    };
    if let Some(topic) = &raw.output_topic {
        let ok = !topic.is_empty()
            && topic.len() <= 249
            && topic != "."
            && topic != ".."
            && topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !ok {
            return Err(RuleError::new(
                reason::INVALID,
                format!("output_topic: `{topic}` is not a valid Kafka topic name"),
            ));
        }
    }
    let mut budget = Budget::default();
    let filter = raw
        .filter
        .as_ref()
        .map(|f| Predicate::compile(f, "filter", Subject::Field, &mut budget))
        .transpose()?;

    let sections = [
        ("aggregate", raw.aggregate.is_some()),
        ("dedup", raw.dedup.is_some()),
        ("sequence", raw.sequence.is_some()),
        ("anomaly", raw.anomaly.is_some()),
    ];
    if !sections.iter().any(|(name, _)| *name == raw.kind) {
        return Err(RuleError::new(
            reason::UNKNOWN_KIND,
            format!(
                "kind: unknown kind `{}` (aggregate, dedup, sequence or anomaly)",
                raw.kind
            ),
        ));
    }
    for (name, present) in sections {
        if present && name != raw.kind {
            return Err(RuleError::new(
                reason::INVALID,
                format!(
                    "{name}: only allowed with kind `{name}` (kind is `{}`)",
                    raw.kind
                ),
            ));
        }
        if !present && name == raw.kind {
            return Err(RuleError::new(
                reason::INVALID,
                format!("{name}: required with kind `{name}`"),
            ));
        }
    }
    let kind = match raw.kind.as_str() {
        "aggregate" => Kind::Aggregate(aggregate(raw.aggregate.expect("checked"), &mut budget)?),
        "dedup" => {
            let d = raw.dedup.expect("checked");
            Kind::Dedup(DedupSpec {
                field: Pointer::parse(&d.field, "dedup.field")?,
                ttl_ms: duration(&d.ttl, "dedup.ttl")?,
            })
        }
        "sequence" => {
            let s = raw.sequence.expect("checked");
            if s.steps.is_empty() {
                return Err(RuleError::new(
                    reason::INVALID,
                    "sequence.steps: at least one step",
                ));
            }
            if s.steps.len() > MAX_SEQUENCE_STEPS {
                return Err(RuleError::new(
                    reason::TOO_COMPLEX,
                    format!("sequence.steps: more than {MAX_SEQUENCE_STEPS} steps"),
                ));
            }
            let steps = s
                .steps
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    Predicate::compile(
                        p,
                        &format!("sequence.steps[{i}]"),
                        Subject::Field,
                        &mut budget,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            Kind::Sequence(SequenceSpec {
                steps,
                within_ms: duration(&s.within, "sequence.within")?,
            })
        }
        _ => Kind::Anomaly(anomaly(raw.anomaly.expect("checked"))?),
    };
    Ok(Rule {
        id: raw.id,
        version: raw.version,
        status,
        filter,
        output_topic: raw.output_topic,
        kind,
    })
}

fn aggregate(a: RawAggregate, budget: &mut Budget) -> Result<AggregateSpec, RuleError> {
    let func = match a.func.as_str() {
        "count" => AggFn::Count,
        "sum" => AggFn::Sum,
        "min" => AggFn::Min,
        "max" => AggFn::Max,
        "avg" => AggFn::Avg,
        "distinct_count" => AggFn::DistinctCount,
        other => {
            return Err(RuleError::new(
                reason::UNKNOWN_FN,
                format!(
                    "aggregate.fn: unknown fn `{other}` (count, sum, min, max, avg, distinct_count)"
                ),
            ));
        }
    };
    let field = match (&a.field, func) {
        (Some(f), _) => Some(Pointer::parse(f, "aggregate.field")?),
        (None, AggFn::Count) => None,
        (None, f) => {
            return Err(RuleError::new(
                reason::INVALID,
                format!("aggregate.field: required for fn `{}`", f.name()),
            ));
        }
    };
    let window = match &a.window {
        None => WindowSpec::Running,
        Some(w) => window(w)?,
    };
    let having = a
        .having
        .as_ref()
        .map(|h| Predicate::compile(h, "aggregate.having", Subject::Value, budget))
        .transpose()?;
    let emit = match a.emit.as_deref() {
        Some("every_event") => Emit::EveryEvent,
        Some("on_match") => Emit::OnMatch,
        Some("on_window_close") => Emit::OnWindowClose,
        Some(other) => {
            return Err(RuleError::new(
                reason::INVALID,
                format!(
                    "aggregate.emit: unknown mode `{other}` (every_event, on_match, on_window_close)"
                ),
            ));
        }
        None if having.is_some() && a.compare.is_none() => Emit::OnMatch,
        None if window == WindowSpec::Running => Emit::EveryEvent,
        None => Emit::OnWindowClose,
    };
    if emit == Emit::OnMatch && having.is_none() {
        return Err(RuleError::new(
            reason::INVALID,
            "aggregate.emit: `on_match` needs `having`",
        ));
    }
    if emit == Emit::OnWindowClose && window == WindowSpec::Running {
        return Err(RuleError::new(
            reason::BAD_WINDOW,
            "aggregate.emit: `on_window_close` needs a window",
        ));
    }
    let compare = match a.compare {
        None => None,
        Some(c) => {
            if !matches!(
                window,
                WindowSpec::Tumbling { .. } | WindowSpec::Sliding { .. }
            ) {
                return Err(RuleError::new(
                    reason::BAD_WINDOW,
                    "aggregate.compare: needs a tumbling or sliding window",
                ));
            }
            if emit != Emit::OnWindowClose {
                return Err(RuleError::new(
                    reason::INVALID,
                    "aggregate.compare: compares closed windows; emit must be `on_window_close`",
                ));
            }
            if c.windows_back == 0 || c.windows_back > MAX_WINDOWS_BACK {
                return Err(RuleError::new(
                    reason::INVALID,
                    format!("aggregate.compare.windows_back: 1 to {MAX_WINDOWS_BACK}"),
                ));
            }
            if !c.ratio_gt.is_finite() || c.ratio_gt < 0.0 {
                return Err(RuleError::new(
                    reason::INVALID,
                    "aggregate.compare.ratio_gt: a finite number >= 0",
                ));
            }
            Some(CompareSpec {
                windows_back: c.windows_back,
                ratio_gt: c.ratio_gt,
            })
        }
    };
    let group_by = a
        .group_by
        .as_deref()
        .map(|g| Pointer::parse(g, "aggregate.group_by"))
        .transpose()?;
    if group_by.is_some() {
        if matches!(window, WindowSpec::Session { .. }) {
            return Err(RuleError::new(
                reason::BAD_WINDOW,
                "aggregate.group_by: not supported with session windows",
            ));
        }
        if compare.is_some() {
            return Err(RuleError::new(
                reason::INVALID,
                "aggregate.group_by: not supported with compare",
            ));
        }
    }
    let max_groups = match (a.max_groups, &group_by) {
        (None, _) => DEFAULT_MAX_GROUPS,
        (Some(_), None) => {
            return Err(RuleError::new(
                reason::INVALID,
                "aggregate.max_groups: only with group_by",
            ));
        }
        (Some(n), Some(_)) if n == 0 || n > MAX_GROUPS => {
            return Err(RuleError::new(
                reason::TOO_COMPLEX,
                format!("aggregate.max_groups: 1 to {MAX_GROUPS}"),
            ));
        }
        (Some(n), Some(_)) => n,
    };
    Ok(AggregateSpec {
        func,
        field,
        window,
        having,
        emit,
        compare,
        group_by,
        max_groups,
    })
}

fn window(w: &RawWindow) -> Result<WindowSpec, RuleError> {
    let need = |v: &Option<String>, name: &str| -> Result<u64, RuleError> {
        match v {
            Some(s) => duration(s, &format!("aggregate.window.{name}")),
            None => Err(RuleError::new(
                reason::BAD_WINDOW,
                format!("aggregate.window.{name}: required for a {} window", w.kind),
            )),
        }
    };
    let forbid = |v: &Option<String>, name: &str| -> Result<(), RuleError> {
        match v {
            Some(_) => Err(RuleError::new(
                reason::BAD_WINDOW,
                format!("aggregate.window.{name}: not used by a {} window", w.kind),
            )),
            None => Ok(()),
        }
    };
    match w.kind.as_str() {
        "tumbling" => {
            forbid(&w.slide, "slide")?;
            forbid(&w.gap, "gap")?;
            Ok(WindowSpec::Tumbling {
                size: need(&w.size, "size")?,
            })
        }
        "sliding" => {
            forbid(&w.gap, "gap")?;
            let size = need(&w.size, "size")?;
            let slide = need(&w.slide, "slide")?;
            if slide > size || size % slide != 0 {
                return Err(RuleError::new(
                    reason::BAD_WINDOW,
                    "aggregate.window: sliding `size` must be a multiple of `slide`",
                ));
            }
            if size / slide > MAX_WINDOWS_PER_EVENT {
                return Err(RuleError::new(
                    reason::TOO_COMPLEX,
                    format!(
                        "aggregate.window: size/slide above {MAX_WINDOWS_PER_EVENT} windows per event"
                    ),
                ));
            }
            Ok(WindowSpec::Sliding { size, slide })
        }
        "session" => {
            forbid(&w.size, "size")?;
            forbid(&w.slide, "slide")?;
            Ok(WindowSpec::Session {
                gap: need(&w.gap, "gap")?,
            })
        }
        other => Err(RuleError::new(
            reason::BAD_WINDOW,
            format!("aggregate.window.type: unknown window `{other}` (tumbling, sliding, session)"),
        )),
    }
}

fn anomaly(a: RawAnomaly) -> Result<AnomalySpec, RuleError> {
    let model = match a.model.as_str() {
        "ewma" => Model::Ewma,
        "welford" => Model::Welford,
        other => {
            return Err(RuleError::new(
                reason::UNKNOWN_MODEL,
                format!("anomaly.model: unknown model `{other}` (ewma, welford)"),
            ));
        }
    };
    let alpha = match (model, a.alpha) {
        (Model::Ewma, None) => 0.1,
        (Model::Ewma, Some(x)) if x > 0.0 && x <= 1.0 => x,
        (Model::Ewma, Some(_)) => {
            return Err(RuleError::new(reason::INVALID, "anomaly.alpha: in (0, 1]"));
        }
        (Model::Welford, Some(_)) => {
            return Err(RuleError::new(
                reason::INVALID,
                "anomaly.alpha: only for model `ewma`",
            ));
        }
        (Model::Welford, None) => 0.0,
    };
    if !a.z_gt.is_finite() || a.z_gt <= 0.0 {
        return Err(RuleError::new(
            reason::INVALID,
            "anomaly.z_gt: a finite number > 0",
        ));
    }
    let min_samples = a.min_samples.unwrap_or(20);
    if min_samples < 2 {
        return Err(RuleError::new(
            reason::INVALID,
            "anomaly.min_samples: at least 2",
        ));
    }
    Ok(AnomalySpec {
        field: Pointer::parse(&a.field, "anomaly.field")?,
        model,
        alpha,
        z_gt: a.z_gt,
        min_samples,
    })
}

/// A humantime duration in whole ms, > 0 and at most [`MAX_DURATION`].
pub fn duration(s: &str, field: &str) -> Result<u64, RuleError> {
    let d = humantime::parse_duration(s).map_err(|e| {
        RuleError::new(
            reason::BAD_DURATION,
            format!("{field}: `{s}` is not a duration like \"5m\" ({e})"),
        )
    })?;
    if d.is_zero() || d.as_millis() == 0 {
        return Err(RuleError::new(
            reason::BAD_DURATION,
            format!("{field}: must be at least 1ms"),
        ));
    }
    if d > MAX_DURATION {
        return Err(RuleError::new(
            reason::BAD_DURATION,
            format!("{field}: at most 400 days"),
        ));
    }
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(RuleError::new(
            reason::BAD_DURATION,
            format!("{field}: whole milliseconds only"),
        ));
    }
    Ok(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refused(v: Value) -> &'static str {
        compile(&v).expect_err("refused").reason
    }

    fn base() -> Value {
        json!({"id": "r", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count"}})
    }

    fn with(path: &str, v: Value) -> Value {
        let mut b = base();
        let (parent, last) = path.rsplit_once('/').expect("path");
        b.pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .expect("parent")
            .insert(last.into(), v);
        b
    }

    #[test]
    fn the_issue_example_compiles() {
        let r = compile(
            &json!({"id": "large-spend", "version": 3, "status": "active",
         "filter": {"and": [{"field": "/type", "eq": "payment"}, {"field": "/amount", "gt": 0}]},
         "kind": "aggregate",
         "aggregate": {"fn": "sum", "field": "/amount",
                       "window": {"type": "tumbling", "size": "1m"},
                       "having": {"gt": 1000},
                       "emit": "on_match"},
         "output_topic": "alerts"}),
        )
        .expect("compiles");
        let Kind::Aggregate(a) = &r.kind else {
            panic!("aggregate")
        };
        assert_eq!(a.window, WindowSpec::Tumbling { size: 60_000 });
        assert_eq!(a.emit, Emit::OnMatch);
        assert_eq!(r.output_topic.as_deref(), Some("alerts"));
    }

    #[test]
    fn emit_defaults() {
        let emit = |v: Value| match compile(&v).expect("ok").kind {
            Kind::Aggregate(a) => a.emit,
            _ => panic!(),
        };
        assert_eq!(emit(base()), Emit::EveryEvent);
        assert_eq!(
            emit(with(
                "/aggregate/window",
                json!({"type": "tumbling", "size": "1s"})
            )),
            Emit::OnWindowClose
        );
        assert_eq!(
            emit(with("/aggregate/having", json!({"gt": 1}))),
            Emit::OnMatch
        );
    }

    #[test]
    fn refusals_name_a_reason() {
        assert_eq!(
            refused(with("/aggregate/fn", json!("median"))),
            reason::UNKNOWN_FN
        );
        assert_eq!(refused(with("/kind", json!("join"))), reason::UNKNOWN_KIND);
        assert_eq!(refused(with("/extra", json!(1))), reason::UNKNOWN_FIELD);
        assert_eq!(
            refused(with("/aggregate/extra", json!(1))),
            reason::UNKNOWN_FIELD
        );
        assert_eq!(
            refused(with(
                "/aggregate/window",
                json!({"type": "tumbling", "size": "1m", "x": 1})
            )),
            reason::UNKNOWN_FIELD
        );
        assert_eq!(
            refused(with("/status", json!("paused"))),
            reason::BAD_STATUS
        );
        assert_eq!(refused(with("/version", json!("1"))), reason::INVALID);
        assert_eq!(
            refused(with("/aggregate/fn", json!("sum"))),
            reason::INVALID,
            "sum needs a field"
        );
        assert_eq!(
            refused(with("/aggregate/field", json!("amount"))),
            reason::BAD_POINTER
        );
        assert_eq!(
            refused(with(
                "/aggregate/window",
                json!({"type": "tumbling", "size": "soon"})
            )),
            reason::BAD_DURATION
        );
        assert_eq!(
            refused(with(
                "/aggregate/window",
                json!({"type": "tumbling", "size": "0s"})
            )),
            reason::BAD_DURATION
        );
        assert_eq!(
            refused(with("/aggregate/window", json!({"type": "tumbling"}))),
            reason::BAD_WINDOW
        );
        assert_eq!(
            refused(with(
                "/aggregate/window",
                json!({"type": "hopping", "size": "1m"})
            )),
            reason::BAD_WINDOW
        );
        assert_eq!(
            refused(with(
                "/aggregate/window",
                json!({"type": "sliding", "size": "1m", "slide": "7s"})
            )),
            reason::BAD_WINDOW
        );
        assert_eq!(
            refused(with(
                "/aggregate/window",
                json!({"type": "sliding", "size": "1m", "slide": "2m"})
            )),
            reason::BAD_WINDOW
        );
        assert_eq!(
            refused(with(
                "/aggregate/window",
                json!({"type": "sliding", "size": "1000s", "slide": "1s"})
            )),
            reason::TOO_COMPLEX
        );
        assert_eq!(
            refused(with("/aggregate/emit", json!("on_window_close"))),
            reason::BAD_WINDOW
        );
        assert_eq!(
            refused(with("/aggregate/emit", json!("on_match"))),
            reason::INVALID,
            "on_match without having"
        );
        assert_eq!(
            refused(with(
                "/aggregate/compare",
                json!({"windows_back": 1, "ratio_gt": 2.0})
            )),
            reason::BAD_WINDOW
        );
        assert_eq!(
            refused(with("/output_topic", json!("bad topic"))),
            reason::INVALID
        );
        assert_eq!(
            refused(with("/filter", json!({"field": "/a", "regex": "x"}))),
            reason::UNKNOWN_OP
        );
        assert_eq!(
            refused(
                json!({"id": "r", "version": 1, "kind": "dedup", "aggregate": {"fn": "count"}})
            ),
            reason::INVALID,
            "section of another kind"
        );
        assert_eq!(
            refused(
                json!({"id": "r", "version": 1, "kind": "anomaly", "anomaly": {"field": "/x", "model": "arima", "z_gt": 3}})
            ),
            reason::UNKNOWN_MODEL
        );
        assert_eq!(
            refused(
                json!({"id": "r", "version": 1, "kind": "anomaly", "anomaly": {"field": "/x", "model": "welford", "alpha": 0.5, "z_gt": 3}})
            ),
            reason::INVALID
        );
        let steps: Vec<Value> = (0..=MAX_SEQUENCE_STEPS)
            .map(|_| json!({"field": "/a", "exists": true}))
            .collect();
        assert_eq!(
            refused(
                json!({"id": "r", "version": 1, "kind": "sequence", "sequence": {"steps": steps, "within": "1m"}})
            ),
            reason::TOO_COMPLEX
        );
        assert_eq!(
            refused(
                json!({"id": "r", "version": 1, "kind": "dedup", "dedup": {"field": "/id", "ttl": "-5m"}})
            ),
            reason::BAD_DURATION
        );
    }
}
