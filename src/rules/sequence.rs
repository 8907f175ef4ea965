//! `kind: "sequence"`: the steps occur in order for a key, the last within `within` of
//! the first.
//!
//! Order is the order in which the key's events reach the engine (partition order);
//! the bound is measured on event timestamps (processing time by default). State is a
//! list of partial matches with at most one per progress level: for the same number of
//! steps matched, the partial that started later dominates (it has more time left), so
//! keeping only it loses no match. An event may advance several partials and start a
//! new one. A completed match is emitted and clears every partial (matches do not
//! overlap). A timer at `start + within + 1` drops partials that can no longer complete.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::output::{Field, record};
use super::spec::{Rule, SequenceSpec};
use super::window::{self, namespace};
use super::{Env, States};
use crate::function::{Event, FunctionError, Output};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Partial {
    pub start: u64,
    /// Steps matched so far (the next step to match).
    pub next: usize,
    /// The matched events, as JSON text (the state encoding has no JSON value type).
    pub events: Vec<String>,
    pub sources: Vec<(String, i32, i64)>,
}

fn keep_best(partials: &mut Vec<Partial>, p: Partial) {
    match partials.iter_mut().find(|q| q.next == p.next) {
        Some(q) if q.start < p.start => *q = p,
        Some(_) => {}
        None => partials.push(p),
    }
}

pub(crate) fn on_event(
    env: &Env<'_, '_>,
    st: &mut States,
    rule: &Rule,
    s: &SequenceSpec,
    ev: &Event<'_>,
    out: &mut Output,
) -> Result<(), FunctionError> {
    let ts = ev.timestamp_ms;
    env.set_namespace(&namespace(&rule.id, rule.version, window::SEQUENCE, None));
    let old: Vec<Partial> = st.sequence.value()?.unwrap_or_default();
    let text = ev.value.to_string();
    let src = (
        ev.source.topic.clone(),
        ev.source.partition,
        ev.source.offset,
    );
    let in_bound = |p: &Partial| ts >= p.start && ts - p.start <= s.within_ms;
    let mut next: Vec<Partial> = Vec::new();
    let mut done: Option<Partial> = None;
    let mut advance = |p: Partial, next: &mut Vec<Partial>| {
        if p.next == s.steps.len() {
            if done.as_ref().is_none_or(|d| d.start > p.start) {
                done = Some(p);
            }
        } else {
            keep_best(next, p);
        }
    };
    for p in old.into_iter().filter(|p| in_bound(p)) {
        if s.steps[p.next].eval(ev.value) {
            let mut q = p.clone();
            q.next += 1;
            q.events.push(text.clone());
            q.sources.push(src.clone());
            advance(q, &mut next);
        } else {
            keep_best(&mut next, p);
        }
    }
    if s.steps[0].eval(ev.value) {
        let fresh = Partial {
            start: ts,
            next: 1,
            events: vec![text.clone()],
            sources: vec![src.clone()],
        };
        let new_start = !next.iter().any(|q| q.next == 1 && q.start >= ts);
        advance(fresh, &mut next);
        if new_start && s.steps.len() > 1 {
            env.register_timer(ts.saturating_add(s.within_ms).saturating_add(1))?;
        }
    }
    if let Some(m) = done {
        st.sequence.clear()?;
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
        let r = record(
            rule,
            ev.key,
            Value::Array(events),
            None,
            Some(ev.source),
            ts,
            extra,
        );
        return env.emit(out, rule, ev.key, &r);
    }
    if next.is_empty() {
        st.sequence.clear()?
    } else {
        st.sequence.update(&next)?
    }
    Ok(())
}

/// Timeout: drop partials that can no longer complete.
pub(crate) fn on_timer(
    env: &Env<'_, '_>,
    st: &States,
    _rule: &Rule,
    s: &SequenceSpec,
    timer_ms: u64,
) -> Result<(), FunctionError> {
    let _ = env;
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
