//! Aggregate accumulators: one small struct serves every fn, so windows, sessions and
//! running values share the code. `distinct_count` keeps its values in a map state next
//! to the accumulator (see the engine); the accumulator only counts them.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use streamstate_state::MapState;

use super::output::{Field, WindowRef, record};
use super::spec::{AggFn, AggregateSpec, Emit, Rule, WindowSpec};
use super::window::{self, namespace};
use super::{Env, States};
use crate::function::{Event, FunctionError, Output};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Acc {
    pub count: u64,
    pub sum: f64,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub distinct: u64,
    /// `on_match`: windowed — already emitted for this window; running — `having` held
    /// after the previous event (edge trigger).
    pub matched: bool,
}

impl Acc {
    /// Adds one event; `x` is the field's number (`None` for count and distinct_count).
    pub fn add(&mut self, x: Option<f64>, new_distinct: bool) {
        self.count += 1;
        if let Some(x) = x {
            self.sum += x;
            self.min = Some(self.min.map_or(x, |m| m.min(x)));
            self.max = Some(self.max.map_or(x, |m| m.max(x)));
        }
        if new_distinct {
            self.distinct += 1;
        }
    }

    /// Folds `other` in (session merge); the caller fixes `distinct` from the merged map.
    pub fn merge(&mut self, other: &Acc) {
        self.count += other.count;
        self.sum += other.sum;
        self.min = match (self.min, other.min) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.max = match (self.max, other.max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.matched |= other.matched;
    }

    /// The aggregate value as JSON: integers for count and distinct_count.
    pub fn value(&self, f: AggFn) -> Value {
        let num = |x: f64| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number);
        match f {
            AggFn::Count => Value::from(self.count),
            AggFn::DistinctCount => Value::from(self.distinct),
            AggFn::Sum => num(self.sum),
            AggFn::Min => self.min.map_or(Value::Null, num),
            AggFn::Max => self.max.map_or(Value::Null, num),
            AggFn::Avg if self.count == 0 => Value::Null,
            AggFn::Avg => num(self.sum / self.count as f64),
        }
    }
}

/// What an event contributes to fn `f`: a number (sum, min, max, avg), a distinct key
/// (distinct_count: the field's JSON text), or nothing (count). `Err` names why the
/// event cannot count (the evaluation-error label).
pub enum Input {
    Nothing,
    Number(f64),
    Distinct(String),
}

pub fn input(f: AggFn, field: Option<&Value>) -> Result<Input, &'static str> {
    match f {
        AggFn::Count => Ok(Input::Nothing),
        AggFn::DistinctCount => match field {
            Some(v) => Ok(Input::Distinct(v.to_string())),
            None => Err("field_missing"),
        },
        _ => match field {
            None => Err("field_missing"),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Input::Number)
                .ok_or("not_a_number"),
        },
    }
}

impl Input {
    fn number(&self) -> Option<f64> {
        match self {
            Self::Number(x) => Some(*x),
            _ => None,
        }
    }
}

/// Adds a distinct_count value to `map` (current namespace); true when it is new.
/// A grouped rule's values are `<group JSON text> NUL <value JSON text>` (JSON text
/// never holds a raw NUL), so one map serves every group of the window.
fn add_distinct(
    map: &MapState<String, bool>,
    input: &Input,
    group: Option<&Group<'_>>,
) -> Result<bool, FunctionError> {
    let Input::Distinct(k) = input else {
        return Ok(false);
    };
    let composite;
    let k = match group {
        None => k,
        Some(g) => {
            composite = format!("{}\0{k}", g.text);
            &composite
        }
    };
    if map.contains(k)? {
        return Ok(false);
    }
    map.put(k, &true)?;
    Ok(true)
}

/// Drops a closed window's distinct values (current namespace). Only `distinct_count`
/// writes any, and clearing a map is a prefix scan (a RocksDB iterator seek): at every
/// window close of every other function it was half the CPU of the W benchmark, for
/// nothing.
fn clear_distinct(st: &States, a: &AggregateSpec) -> Result<(), FunctionError> {
    if a.func == AggFn::DistinctCount {
        st.win_distinct.clear()?;
    }
    Ok(())
}

/// The `group_by` value of the event at hand.
pub(crate) struct Group<'a> {
    /// Its JSON text: the key in the groups map.
    text: String,
    value: &'a Value,
}

/// The output's `group` field: `{"field": <group_by>, "value": <the group's value>}`.
fn group_field(a: &AggregateSpec, value: Value) -> (&'static str, Field<'static>) {
    let field = a.group_by.as_ref().map_or("", |p| p.as_str());
    (
        "group",
        Field::Value(json!({"field": field, "value": value})),
    )
}

/// The accumulator of `group` in `groups` (current namespace); `None` when the group is
/// new and the key already has `max_groups` groups (the event is then skipped, counted).
fn group_acc(
    env: &Env<'_, '_>,
    groups: &MapState<String, Acc>,
    a: &AggregateSpec,
    group: &Group<'_>,
) -> Result<Option<Acc>, FunctionError> {
    if let Some(acc) = groups.get(&group.text)? {
        return Ok(Some(acc));
    }
    if groups.keys()?.len() >= a.max_groups as usize {
        env.metrics.group_overflow.inc();
        return Ok(None);
    }
    Ok(Some(Acc::default()))
}

/// Whether an event-driven output is due after the event updated `acc` (value `value`).
/// `on_match`: windows and sessions emit once (the first event after which `having`
/// holds); a running aggregate emits when `having` starts to hold (edge trigger).
fn per_event(a: &AggregateSpec, acc: &mut Acc, value: &Value, windowed: bool) -> bool {
    let holds = a.having.as_ref().is_none_or(|h| h.eval(value));
    match a.emit {
        Emit::EveryEvent => holds,
        Emit::OnWindowClose => false,
        Emit::OnMatch if windowed => {
            let fire = holds && !acc.matched;
            acc.matched |= holds;
            fire
        }
        Emit::OnMatch => {
            let fire = holds && !acc.matched;
            acc.matched = holds;
            fire
        }
    }
}

fn extra(
    a: &AggregateSpec,
    acc: &Acc,
    trigger: &'static str,
) -> Vec<(&'static str, Field<'static>)> {
    vec![
        ("fn", Field::Str(a.func.name())),
        ("count", Field::U64(acc.count)),
        ("trigger", Field::Str(trigger)),
    ]
}

pub(crate) fn on_event(
    env: &Env<'_, '_>,
    st: &mut States,
    rule: &Rule,
    a: &AggregateSpec,
    ev: &Event<'_>,
    out: &mut Output,
) -> Result<(), FunctionError> {
    let field = a.field.as_ref().and_then(|p| p.resolve(ev.value));
    let input = match input(a.func, field) {
        Ok(i) => i,
        Err(reason) => {
            env.eval_error(reason);
            return Ok(());
        }
    };
    let group = match &a.group_by {
        None => None,
        Some(p) => match p.resolve(ev.value) {
            Some(v) => Some(Group {
                text: v.to_string(),
                value: v,
            }),
            None => {
                env.eval_error("group_missing");
                return Ok(());
            }
        },
    };
    let ts = ev.timestamp_ms as i64;
    if let (Some(g), WindowSpec::Running) = (&group, a.window) {
        return add_to_running_group(env, st, rule, a, ev, &input, g, out);
    }
    let group = group.as_ref();
    match a.window {
        WindowSpec::Running => {
            let new = match input {
                Input::Distinct(_) => {
                    env.set_namespace(&namespace(&rule.id, rule.version, window::RUNNING, None));
                    add_distinct(&st.run_distinct, &input, None)?
                }
                _ => false,
            };
            // Written back once per event, with the key's other running rules.
            let acc = st.running.acc(rule)?;
            acc.add(input.number(), new);
            let value = acc.value(a.func);
            let fire = per_event(a, acc, &value, false);
            if fire {
                let r = record(
                    rule,
                    ev.key,
                    value,
                    None,
                    Some(ev.source),
                    ev.timestamp_ms,
                    extra(a, acc, "event"),
                );
                env.emit(out, rule, ev.key, &r)?;
            }
            Ok(())
        }
        WindowSpec::Tumbling { size } => add_to_window(
            env,
            st,
            rule,
            a,
            ev,
            &input,
            group,
            window::tumbling_start(ts, size),
            size,
            out,
        ),
        WindowSpec::Sliding { size, slide } => {
            for start in window::sliding_starts(ts, size, slide) {
                add_to_window(env, st, rule, a, ev, &input, group, start, size, out)?;
            }
            Ok(())
        }
        WindowSpec::Session { gap } => add_to_session(env, st, rule, a, ev, &input, gap, out),
    }
}

#[allow(clippy::too_many_arguments)]
fn add_to_window(
    env: &Env<'_, '_>,
    st: &mut States,
    rule: &Rule,
    a: &AggregateSpec,
    ev: &Event<'_>,
    input: &Input,
    group: Option<&Group<'_>>,
    start: i64,
    size: u64,
    out: &mut Output,
) -> Result<(), FunctionError> {
    let end = start + size as i64;
    let fires_at = (end - 1) as u64;
    // Flink's rule: a window whose end - 1 the watermark has reached is closed (its timer
    // is due), whether or not the timer has run yet.
    if env.watermark().is_some_and(|w| fires_at <= w) {
        env.metrics.late_windows.inc();
        return Ok(());
    }
    let rule_ns = || namespace(&rule.id, rule.version, window::WINDOW, Some(start));
    let Some(g) = group else {
        // The distinct values stay in the rule's window namespace; the accumulator joins
        // the key's other windows ending at `end`, written back once per event.
        let new = match input {
            Input::Distinct(_) => {
                env.set_namespace(&rule_ns());
                add_distinct(&st.win_distinct, input, None)?
            }
            _ => false,
        };
        let acc = st.windows.acc(env, rule, start, end)?;
        acc.add(input.number(), new);
        let value = acc.value(a.func);
        if per_event(a, acc, &value, true) {
            emit_window_event(env, rule, a, ev, acc, value, None, start, end, out)?;
        }
        return Ok(());
    };
    env.set_namespace(&rule_ns());
    let Some(mut acc) = group_acc(env, &st.win_groups, a, g)? else {
        return Ok(());
    };
    if acc.count == 0 {
        env.register_timer(fires_at)?;
    }
    let new = add_distinct(&st.win_distinct, input, group)?;
    acc.add(input.number(), new);
    let value = acc.value(a.func);
    let fire = per_event(a, &mut acc, &value, true);
    st.win_groups.put(&g.text, &acc)?;
    if fire {
        emit_window_event(env, rule, a, ev, &acc, value, Some(g), start, end, out)?;
    }
    Ok(())
}

/// The output an event triggers in window `[start, end)` (`every_event`, `on_match`).
#[allow(clippy::too_many_arguments)]
fn emit_window_event(
    env: &Env<'_, '_>,
    rule: &Rule,
    a: &AggregateSpec,
    ev: &Event<'_>,
    acc: &Acc,
    value: Value,
    group: Option<&Group<'_>>,
    start: i64,
    end: i64,
    out: &mut Output,
) -> Result<(), FunctionError> {
    let mut more = extra(a, acc, "event");
    if let Some(g) = group {
        more.push(group_field(a, g.value.clone()));
    }
    let w = Some(WindowRef { start, end });
    let r = record(
        rule,
        ev.key,
        value,
        w,
        Some(ev.source),
        ev.timestamp_ms,
        more,
    );
    env.emit(out, rule, ev.key, &r)
}

/// A running aggregate per group (namespace: the rule version's running namespace).
#[allow(clippy::too_many_arguments)]
fn add_to_running_group(
    env: &Env<'_, '_>,
    st: &States,
    rule: &Rule,
    a: &AggregateSpec,
    ev: &Event<'_>,
    input: &Input,
    group: &Group<'_>,
    out: &mut Output,
) -> Result<(), FunctionError> {
    env.set_namespace(&namespace(&rule.id, rule.version, window::RUNNING, None));
    let Some(mut acc) = group_acc(env, &st.run_groups, a, group)? else {
        return Ok(());
    };
    let new = add_distinct(&st.run_distinct, input, Some(group))?;
    acc.add(input.number(), new);
    let value = acc.value(a.func);
    let fire = per_event(a, &mut acc, &value, false);
    st.run_groups.put(&group.text, &acc)?;
    if fire {
        let mut more = extra(a, &acc, "event");
        more.push(group_field(a, group.value.clone()));
        let r = record(
            rule,
            ev.key,
            value,
            None,
            Some(ev.source),
            ev.timestamp_ms,
            more,
        );
        env.emit(out, rule, ev.key, &r)?;
    }
    Ok(())
}

/// A rule's own window timer fired (timer at `end - 1`, the rule window's namespace
/// set): a `group_by` window closes, or an un-grouped one written before
/// [`super::windowed`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn on_window_timer(
    env: &Env<'_, '_>,
    st: &States,
    rule: &Rule,
    a: &AggregateSpec,
    key: &str,
    start: i64,
    timer_ms: u64,
    out: &mut Output,
) -> Result<(), FunctionError> {
    if a.group_by.is_none() {
        let acc = st.win_acc.value()?;
        if acc.is_some() {
            st.win_acc.clear()?;
        }
        return close_window(env, st, rule, a, key, start, acc, timer_ms, out);
    }
    clear_distinct(st, a)?;
    let size = match a.window {
        WindowSpec::Tumbling { size } | WindowSpec::Sliding { size, .. } => size,
        _ => return Ok(()),
    };
    let mut groups = st.win_groups.entries()?;
    st.win_groups.clear()?;
    if a.emit != Emit::OnWindowClose {
        return Ok(());
    }
    // One output per group, in the order of the groups' JSON text.
    groups.sort_by(|x, y| x.0.cmp(&y.0));
    let w = Some(WindowRef {
        start,
        end: start + size as i64,
    });
    for (text, acc) in groups {
        let value = acc.value(a.func);
        if a.having.as_ref().is_none_or(|h| h.eval(&value)) {
            let group: Value = serde_json::from_str(&text)?;
            let mut more = extra(a, &acc, "window_close");
            more.push(group_field(a, group));
            let r = record(rule, key, value, w, None, timer_ms, more);
            env.emit(out, rule, key, &r)?;
        }
    }
    Ok(())
}

/// An un-grouped tumbling or sliding window of `rule` closed with `acc`: its output (and
/// `compare`'s history), and its distinct values dropped.
#[allow(clippy::too_many_arguments)]
pub(crate) fn close_window(
    env: &Env<'_, '_>,
    st: &States,
    rule: &Rule,
    a: &AggregateSpec,
    key: &str,
    start: i64,
    acc: Option<Acc>,
    timer_ms: u64,
    out: &mut Output,
) -> Result<(), FunctionError> {
    if a.func == AggFn::DistinctCount {
        env.set_namespace(&namespace(
            &rule.id,
            rule.version,
            window::WINDOW,
            Some(start),
        ));
        clear_distinct(st, a)?;
    }
    let (size, step) = match a.window {
        WindowSpec::Tumbling { size } => (size, size),
        WindowSpec::Sliding { size, slide } => (size, slide),
        _ => return Ok(()),
    };
    let Some(acc) = acc else { return Ok(()) };
    if a.emit != Emit::OnWindowClose {
        return Ok(());
    }
    let value = acc.value(a.func);
    let mut fire = a.having.as_ref().is_none_or(|h| h.eval(&value));
    let mut more = extra(a, &acc, "window_close");
    if let Some(c) = a.compare {
        env.set_namespace(&namespace(&rule.id, rule.version, window::HISTORY, None));
        let mut history = st.history.value()?.unwrap_or_default();
        let back = start - c.windows_back as i64 * step as i64;
        let previous = history.iter().find(|(s, _)| *s == back).map(|(_, v)| *v);
        if let Some(v) = value.as_f64() {
            history.push((start, v));
        }
        // The next window looks `windows_back` windows behind itself: keep only those.
        history.retain(|(s, _)| *s >= back + step as i64);
        st.history.update(&history)?;
        let ratio = match (previous, value.as_f64()) {
            (Some(p), Some(v)) if p > 0.0 => Some(v / p),
            _ => None,
        };
        fire &= ratio.is_some_and(|r| r > c.ratio_gt);
        more.push((
            "compare",
            Field::Value(json!({"windows_back": c.windows_back, "ratio_gt": c.ratio_gt, "previous": previous, "previous_start": back, "ratio": ratio})),
        ));
    }
    if fire {
        let w = Some(WindowRef {
            start,
            end: start + size as i64,
        });
        let r = record(rule, key, value, w, None, timer_ms, more);
        env.emit(out, rule, key, &r)?;
    }
    Ok(())
}

/// The open sessions of one key for one rule version.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sessions {
    pub next_id: i64,
    pub open: Vec<Session>,
}

/// `[start, end)` with `end` = last event + gap; `id` names its distinct-values namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub id: i64,
    pub start: i64,
    pub end: i64,
    pub acc: Acc,
}

#[allow(clippy::too_many_arguments)]
fn add_to_session(
    env: &Env<'_, '_>,
    st: &States,
    rule: &Rule,
    a: &AggregateSpec,
    ev: &Event<'_>,
    input: &Input,
    gap: u64,
    out: &mut Output,
) -> Result<(), FunctionError> {
    let ts = ev.timestamp_ms as i64;
    let (lo, hi) = (ts, ts + gap as i64);
    let sessions_ns = namespace(&rule.id, rule.version, window::SESSIONS, None);
    let distinct_ns =
        |id: i64| namespace(&rule.id, rule.version, window::SESSION_DISTINCT, Some(id));
    env.set_namespace(&sessions_ns);
    let mut all = st.sessions.value()?.unwrap_or_default();
    let wm = env.watermark();
    // Sessions the watermark has closed wait for their timer; an event never joins them.
    let closed = |s: &Session| wm.is_some_and(|w| ((s.end - 1) as u64) <= w);
    let (mut merging, mut keep): (Vec<Session>, Vec<Session>) = all
        .open
        .drain(..)
        .partition(|s| !closed(s) && s.start < hi && lo < s.end);
    for s in &merging {
        env.delete_timer((s.end - 1) as u64)?;
    }
    merging.sort_by_key(|s| s.id);
    let merged = merging.len() > 1;
    let mut target = if merging.is_empty() {
        let id = all.next_id;
        all.next_id += 1;
        Session {
            id,
            start: lo,
            end: hi,
            acc: Acc::default(),
        }
    } else {
        let mut t = merging.remove(0);
        for other in merging {
            t.start = t.start.min(other.start);
            t.end = t.end.max(other.end);
            t.acc.merge(&other.acc);
            if matches!(input, Input::Distinct(_)) {
                env.set_namespace(&distinct_ns(other.id));
                let values = st.win_distinct.keys()?;
                st.win_distinct.clear()?;
                env.set_namespace(&distinct_ns(t.id));
                for v in values {
                    st.win_distinct.put(&v, &true)?;
                }
            }
        }
        t
    };
    target.start = target.start.min(lo);
    target.end = target.end.max(hi);
    env.set_namespace(&distinct_ns(target.id));
    if merged && matches!(input, Input::Distinct(_)) {
        target.acc.distinct = st.win_distinct.keys()?.len() as u64;
    }
    let new = add_distinct(&st.win_distinct, input, None)?;
    target.acc.add(input.number(), new);
    let value = target.acc.value(a.func);
    if per_event(a, &mut target.acc, &value, true) {
        let (start, end) = (target.start, target.end);
        emit_window_event(env, rule, a, ev, &target.acc, value, None, start, end, out)?;
    }
    env.set_namespace(&sessions_ns);
    env.register_timer((target.end - 1) as u64)?;
    keep.push(target);
    all.open = keep;
    st.sessions.update(&all)?;
    Ok(())
}

/// A session gap timer (namespace = the key's sessions of this rule version).
pub(crate) fn on_session_timer(
    env: &Env<'_, '_>,
    st: &States,
    rule: &Rule,
    a: &AggregateSpec,
    key: &str,
    timer_ms: u64,
    out: &mut Output,
) -> Result<(), FunctionError> {
    let sessions_ns = namespace(&rule.id, rule.version, window::SESSIONS, None);
    let Some(mut all) = st.sessions.value()? else {
        return Ok(());
    };
    let (due, keep): (Vec<Session>, Vec<Session>) = all
        .open
        .drain(..)
        .partition(|s| ((s.end - 1) as u64) <= timer_ms);
    all.open = keep;
    if all.open.is_empty() {
        st.sessions.clear()?;
    } else {
        st.sessions.update(&all)?;
    }
    for s in due {
        env.set_namespace(&namespace(
            &rule.id,
            rule.version,
            window::SESSION_DISTINCT,
            Some(s.id),
        ));
        clear_distinct(st, a)?;
        let value = s.acc.value(a.func);
        if a.emit == Emit::OnWindowClose && a.having.as_ref().is_none_or(|h| h.eval(&value)) {
            let r = record(
                rule,
                key,
                value,
                Some(WindowRef {
                    start: s.start,
                    end: s.end,
                }),
                None,
                timer_ms,
                extra(a, &s.acc, "window_close"),
            );
            env.emit(out, rule, key, &r)?;
        }
    }
    env.set_namespace(&sessions_ns);
    Ok(())
}

/// The rule behind a session timer is gone: drop the key's sessions of that version.
pub(crate) fn drop_sessions(
    env: &Env<'_, '_>,
    st: &States,
    sessions_ns: &[u8],
) -> Result<(), FunctionError> {
    let Some(p) = window::parse(sessions_ns) else {
        return Ok(());
    };
    let (id, version) = (p.id.to_string(), p.version);
    let Some(all) = st.sessions.value()? else {
        return Ok(());
    };
    st.sessions.clear()?;
    for s in all.open {
        env.set_namespace(&namespace(
            &id,
            version,
            window::SESSION_DISTINCT,
            Some(s.id),
        ));
        st.win_distinct.clear()?;
    }
    env.set_namespace(sessions_ns);
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_fn_by_hand() {
        let mut a = Acc::default();
        for x in [4.0, -1.0, 7.5] {
            a.add(Some(x), false);
        }
        assert_eq!(a.value(AggFn::Count), json!(3));
        assert_eq!(a.value(AggFn::Sum), json!(10.5));
        assert_eq!(a.value(AggFn::Min), json!(-1.0));
        assert_eq!(a.value(AggFn::Max), json!(7.5));
        assert_eq!(a.value(AggFn::Avg), json!(3.5));
        let mut b = Acc::default();
        b.add(Some(10.0), true);
        a.merge(&b);
        assert_eq!(a.value(AggFn::Max), json!(10.0));
        assert_eq!(a.value(AggFn::Count), json!(4));
        assert_eq!(Acc::default().value(AggFn::Avg), Value::Null);
        assert!(matches!(
            input(AggFn::Sum, Some(&json!("x"))),
            Err("not_a_number")
        ));
        assert!(matches!(input(AggFn::Sum, None), Err("field_missing")));
    }
}
