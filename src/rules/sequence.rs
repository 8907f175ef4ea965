//! `kind: "sequence"`: the steps occur in order for a key, the last within `within` of
//! the first.
//!
//! **Order.** In event-time mode (`[job] timestamp` set) events are matched in timestamp
//! order, as Flink CEP does: each event is put in a per-key buffer (keyed state in the
//! rule version's namespace, so it is checkpointed and restored like any state) and an
//! event-time timer at `ts + 1` evaluates the events stamped `ts` once the watermark has
//! passed them (the driver dead-letters events below the watermark, so none stamped
//! `ts` can arrive after that timer). Timers fire in time order, so a key's events are
//! evaluated in timestamp order, ties in arrival order, and the result is what the rule
//! gives on the same events sorted by time. In processing-time mode events are matched
//! in arrival order (their time is the processing time, which only grows).
//!
//! **Partials.** State is a list of partial matches with at most one per progress level:
//! for the same number of steps matched, the partial that started later dominates (it
//! has more time left, and in time order every later event is at or after it), so
//! keeping only it loses no match (of two with the same start, the one already kept
//! stays: ties go to arrival order, as in the sort) — the per-key bound on partials is the number of
//! steps. An event that matches no step, or that lies outside a partial's bound, leaves
//! the partial as it was: only a timer at `start + within + 1` drops partials, and only
//! those no later event can complete. An event may advance several partials and start
//! a new one. A completed match is emitted and clears every partial (matches do not
//! overlap: Flink's skip-past-last-event).
//!
//! **Bound on the buffer.** At most [`MAX_BUFFERED_PER_KEY`] events wait per key and
//! rule version (a stalled partition holds the watermark back). Beyond that the oldest
//! stamped events are evaluated before the watermark passes them, counted in
//! `streamstate_rule_sequence_early_evaluations_total`; nothing is dropped, but an event
//! stamped earlier that arrives later is then matched after them.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::output::{Field, record};
use super::spec::{Rule, SequenceSpec};
use super::window::{self, namespace};
use super::{Env, States};
use crate::function::{Event, FunctionError, Output, SourceRef};

/// Most events buffered per key and sequence rule version in event-time mode.
pub const MAX_BUFFERED_PER_KEY: u64 = 10_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Partial {
    pub start: u64,
    /// Steps matched so far (the next step to match).
    pub next: usize,
    /// The matched events, as JSON text (the state encoding has no JSON value type).
    pub events: Vec<String>,
    pub sources: Vec<(String, i32, i64)>,
}

/// An event waiting for the watermark (state `rules.sequence.buffer`, one entry per
/// timestamp holding that timestamp's events in arrival order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffered {
    /// The event as JSON text.
    pub event: String,
    pub source: (String, i32, i64),
}

fn keep_best(partials: &mut Vec<Partial>, p: Partial) {
    match partials.iter_mut().find(|q| q.next == p.next) {
        Some(q) if q.start < p.start => *q = p,
        Some(_) => {}
        None => partials.push(p),
    }
}

/// What one event did to a key's partials.
#[derive(Debug, Default)]
pub struct Step {
    /// The completed match (every partial is then cleared).
    pub matched: Option<Partial>,
    /// The event started a partial that needs a timeout timer at `ts + within + 1`.
    pub new_start: bool,
}

/// The matcher alone: advances `partials` by one event at `ts` (pure, no state).
pub fn advance(
    s: &SequenceSpec,
    partials: &mut Vec<Partial>,
    ts: u64,
    value: &Value,
    text: &str,
    src: &(String, i32, i64),
) -> Step {
    let old = std::mem::take(partials);
    // Outside the bound for this event (stamped before the partial started, or too
    // late for it): the partial is kept unchanged; this event just cannot advance it.
    let in_bound = |p: &Partial| ts >= p.start && ts - p.start <= s.within_ms;
    let mut step = Step::default();
    let advanced = |p: Partial, next: &mut Vec<Partial>, done: &mut Option<Partial>| {
        if p.next == s.steps.len() {
            if done.as_ref().is_none_or(|d| d.start > p.start) {
                *done = Some(p);
            }
        } else {
            keep_best(next, p);
        }
    };
    for p in old {
        if in_bound(&p) && s.steps[p.next].eval(value) {
            let mut q = p;
            q.next += 1;
            q.events.push(text.to_string());
            q.sources.push(src.clone());
            advanced(q, &mut *partials, &mut step.matched);
        } else {
            keep_best(partials, p);
        }
    }
    if s.steps[0].eval(value) {
        let fresh = Partial {
            start: ts,
            next: 1,
            events: vec![text.to_string()],
            sources: vec![src.clone()],
        };
        step.new_start =
            s.steps.len() > 1 && !partials.iter().any(|q| q.next == 1 && q.start >= ts);
        advanced(fresh, &mut *partials, &mut step.matched);
    }
    if step.matched.is_some() {
        partials.clear();
    }
    step
}

pub(crate) fn on_event(
    env: &Env<'_, '_>,
    st: &mut States,
    rule: &Rule,
    s: &SequenceSpec,
    ev: &Event<'_>,
    out: &mut Output,
) -> Result<(), FunctionError> {
    env.set_namespace(&namespace(&rule.id, rule.version, window::SEQUENCE, None));
    let text = ev.value.to_string();
    let src = (
        ev.source.topic.clone(),
        ev.source.partition,
        ev.source.offset,
    );
    if !env.event_time {
        return evaluate(env, st, rule, s, ev.key, ev.timestamp_ms, &text, &src, out);
    }
    let ts = ev.timestamp_ms;
    let mut waiting = st.seq_buffer.get(&ts)?.unwrap_or_default();
    waiting.push(Buffered {
        event: text,
        source: src,
    });
    st.seq_buffer.put(&ts, &waiting)?;
    env.register_timer(ts.saturating_add(1))?;
    let mut count = st.seq_buffered.value()?.unwrap_or(0) + 1;
    while count > MAX_BUFFERED_PER_KEY {
        // Full: evaluate the oldest timestamp now rather than drop anything.
        let Some(oldest) = st.seq_buffer.keys()?.into_iter().min() else {
            break;
        };
        let n = flush(env, st, rule, s, ev.key, oldest, out)?;
        env.metrics.sequence_early.inc_by(n);
        count = count.saturating_sub(n);
    }
    st.seq_buffered.update(&count)?;
    Ok(())
}

/// Evaluates the buffered events stamped `ts` (arrival order) and removes them;
/// returns how many there were. Namespace: the rule version's sequence namespace.
fn flush(
    env: &Env<'_, '_>,
    st: &mut States,
    rule: &Rule,
    s: &SequenceSpec,
    key: &str,
    ts: u64,
    out: &mut Output,
) -> Result<u64, FunctionError> {
    let Some(waiting) = st.seq_buffer.get(&ts)? else {
        return Ok(0);
    };
    st.seq_buffer.remove(&ts)?;
    for b in &waiting {
        evaluate(env, st, rule, s, key, ts, &b.event, &b.source, out)?;
    }
    Ok(waiting.len() as u64)
}

/// Matches one event against the key's partials and emits a completed match.
#[allow(clippy::too_many_arguments)]
fn evaluate(
    env: &Env<'_, '_>,
    st: &mut States,
    rule: &Rule,
    s: &SequenceSpec,
    key: &str,
    ts: u64,
    text: &str,
    src: &(String, i32, i64),
    out: &mut Output,
) -> Result<(), FunctionError> {
    // Evaluation only ever sees JSON the engine wrote itself (or the event at hand).
    let value: Value = serde_json::from_str(text)?;
    let mut partials: Vec<Partial> = st.sequence.value()?.unwrap_or_default();
    let step = advance(s, &mut partials, ts, &value, text, src);
    if step.new_start {
        env.register_timer(ts.saturating_add(s.within_ms).saturating_add(1))?;
    }
    if partials.is_empty() {
        st.sequence.clear()?
    } else {
        st.sequence.update(&partials)?
    }
    let Some(m) = step.matched else {
        return Ok(());
    };
    let events: Vec<Value> = m
        .events
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or(Value::Null))
        .collect();
    let sources: Vec<Value> = m
        .sources
        .iter()
        .map(|(t, p, o)| json!({"topic": t, "partition": p, "offset": o}))
        .collect();
    let extra = [(
        "sequence",
        Field::Value(
            json!({"started": m.start, "ended": ts, "within_ms": s.within_ms, "sources": sources}),
        ),
    )];
    let source = SourceRef {
        topic: src.0.clone(),
        partition: src.1,
        offset: src.2,
    };
    let r = record(
        rule,
        key,
        Value::Array(events),
        None,
        Some(&source),
        ts,
        extra,
    );
    env.emit(out, rule, key, &r)
}

/// A timer of the rule in force: in event time, first evaluate the events stamped
/// `timer_ms - 1` (the watermark has passed them); then drop partials that no later
/// event can complete (every event still to come is at or after `timer_ms`).
pub(crate) fn on_timer(
    env: &Env<'_, '_>,
    st: &mut States,
    rule: &Rule,
    s: &SequenceSpec,
    key: &str,
    timer_ms: u64,
    out: &mut Output,
) -> Result<(), FunctionError> {
    if env.event_time && timer_ms > 0 {
        let n = flush(env, st, rule, s, key, timer_ms - 1, out)?;
        if n > 0 {
            let left = st.seq_buffered.value()?.unwrap_or(0).saturating_sub(n);
            if left == 0 {
                st.seq_buffered.clear()?
            } else {
                st.seq_buffered.update(&left)?
            }
        }
    }
    let Some(mut partials) = st.sequence.value()? else {
        return Ok(());
    };
    partials.retain(|p| p.start.saturating_add(s.within_ms) >= timer_ms);
    if partials.is_empty() {
        st.sequence.clear()?
    } else {
        st.sequence.update(&partials)?
    }
    Ok(())
}

/// The rule behind a sequence timer is gone: drop what its version kept for the key.
pub(crate) fn drop_state(st: &States) -> Result<(), FunctionError> {
    st.sequence.clear()?;
    st.seq_buffer.clear()?;
    Ok(st.seq_buffered.clear()?)
}
